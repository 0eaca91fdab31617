/* The collective watchdog's NCCL side (see nccl_watchdog.h). */
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "comm/mpi/watchdog.h"
#include "comm/nccl/nccl_watchdog.h"
#include "core/check.h"

typedef struct {
  ncclComm_t comm;
  const char *group; /* the group's loom_comm name, alive as long as the communicator */
} watched;

static watched *g_comms;
static int g_count, g_cap;
static char g_last[64] = "nothing yet";

static void abort_all(void) {
  for (int i = 0; i < g_count; i++) ncclCommAbort(g_comms[i].comm);
  g_count = 0;
}

void loom_nccl_watch(void *comm, const char *group) {
  if (g_count == g_cap) {
    g_cap = g_cap ? 2 * g_cap : 8;
    g_comms = realloc(g_comms, (size_t)g_cap * sizeof *g_comms);
    LOOM_CHECK(g_comms, "out of memory for the NCCL watchdog");
  }
  watched *w = &g_comms[g_count++];
  w->comm = (ncclComm_t)comm;
  w->group = group;
  loom_watchdog_on_abort(abort_all);
}

void loom_nccl_forget(void *comm) {
  for (int i = 0; i < g_count; i++)
    if (g_comms[i].comm == (ncclComm_t)comm) g_comms[i] = g_comms[--g_count];
}

void loom_nccl_issued(const char *op, const char *group) { snprintf(g_last, sizeof g_last, "%s on group %s", op, group); }

void loom_nccl_fail(const char *line) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  fprintf(stderr, "[rank %d] loom: %s\n", rank, line);
  fflush(stderr);
  abort_all();
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

/* Whether the stream is done; an NCCL or CUDA error ends the job here. */
static int stream_done(void *stream) {
  for (int i = 0; i < g_count; i++) {
    ncclResult_t r = ncclSuccess;
    if (ncclCommGetAsyncError(g_comms[i].comm, &r) == ncclSuccess && r != ncclSuccess && r != ncclInProgress) {
      char line[256];
      snprintf(line, sizeof line, "NCCL error on group %s: %s", g_comms[i].group, ncclGetErrorString(r));
      loom_nccl_fail(line);
    }
  }
  const cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
  if (e == cudaSuccess) return 1;
  if (e != cudaErrorNotReady) {
    char line[256];
    snprintf(line, sizeof line, "CUDA error while waiting for the GPU: %s", cudaGetErrorString(e));
    loom_nccl_fail(line);
  }
  const struct timespec nap = {0, 20000}; /* 20 us: the host has nothing else to do */
  nanosleep(&nap, NULL);
  return 0;
}

void loom_nccl_wait_stream(void *stream, const char *what) {
  char line[160];
  snprintf(line, sizeof line, "%s (the GPU's queue, last NCCL call: %s)", what, g_last);
  loom_watchdog_poll(stream_done, stream, line);
}
