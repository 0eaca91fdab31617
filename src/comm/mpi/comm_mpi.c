/* Communicator interface over MPI. Collectives map one to one; floats are
 * sent in chunks of at most INT_MAX elements because MPI counts are ints. */
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include "comm/mpi/comm_mpi.h"
#include "core/check.h"

struct loom_request {
  MPI_Request req;
};

static MPI_Comm mpi_of(const loom_comm *c) { return *(MPI_Comm *)c->impl; }

static int count_of(size_t n) {
  LOOM_CHECK(n <= INT_MAX, "message larger than INT_MAX floats; split it");
  return (int)n;
}

static void mpi_allreduce(loom_comm *c, float *buf, size_t n, loom_reduce_op op) {
  MPI_Allreduce(MPI_IN_PLACE, buf, count_of(n), MPI_FLOAT, op == LOOM_REDUCE_MAX ? MPI_MAX : MPI_SUM, mpi_of(c));
}

static loom_request *mpi_iallreduce(loom_comm *c, float *buf, size_t n) {
  loom_request *r = loom_xmalloc(sizeof *r, "all-reduce request");
  MPI_Iallreduce(MPI_IN_PLACE, buf, count_of(n), MPI_FLOAT, MPI_SUM, mpi_of(c), &r->req);
  return r;
}

static void mpi_allgather(loom_comm *c, const float *send, float *recv, size_t n) {
  MPI_Allgather(send, count_of(n), MPI_FLOAT, recv, count_of(n), MPI_FLOAT, mpi_of(c));
}

static void mpi_reduce_scatter(loom_comm *c, const float *send, float *recv, size_t n) {
  MPI_Reduce_scatter_block(send, recv, count_of(n), MPI_FLOAT, MPI_SUM, mpi_of(c));
}

static void mpi_broadcast(loom_comm *c, float *buf, size_t n, int root) {
  MPI_Bcast(buf, count_of(n), MPI_FLOAT, root, mpi_of(c));
}

static void mpi_broadcast_bytes(loom_comm *c, void *buf, size_t bytes, int root) {
  MPI_Bcast(buf, count_of(bytes), MPI_BYTE, root, mpi_of(c));
}

static loom_request *mpi_isend(loom_comm *c, const float *buf, size_t n, int peer, int tag) {
  loom_request *r = loom_xmalloc(sizeof *r, "send request");
  MPI_Isend(buf, count_of(n), MPI_FLOAT, peer, tag, mpi_of(c), &r->req);
  return r;
}

static loom_request *mpi_irecv(loom_comm *c, float *buf, size_t n, int peer, int tag) {
  loom_request *r = loom_xmalloc(sizeof *r, "recv request");
  MPI_Irecv(buf, count_of(n), MPI_FLOAT, peer, tag, mpi_of(c), &r->req);
  return r;
}

static void mpi_wait(loom_request *r) {
  MPI_Wait(&r->req, MPI_STATUS_IGNORE);
  free(r);
}

static int mpi_test(loom_request *r) {
  int done = 0;
  MPI_Test(&r->req, &done, MPI_STATUS_IGNORE);
  if (done) free(r);
  return done;
}

static void mpi_barrier(loom_comm *c) { MPI_Barrier(mpi_of(c)); }

static loom_comm *wrap(MPI_Comm comm);

static loom_comm *mpi_split(loom_comm *c, int color, int key) {
  MPI_Comm sub;
  MPI_Comm_split(mpi_of(c), color, key, &sub);
  return wrap(sub);
}

static void mpi_free(loom_comm *c) {
  MPI_Comm *comm = c->impl;
  if (*comm != MPI_COMM_WORLD) MPI_Comm_free(comm);
  free(comm);
  free(c);
}

static const loom_comm_ops MPI_OPS = {
    .name = "mpi",
    .allreduce = mpi_allreduce,
    .iallreduce = mpi_iallreduce,
    .allgather = mpi_allgather,
    .reduce_scatter = mpi_reduce_scatter,
    .broadcast = mpi_broadcast,
    .broadcast_bytes = mpi_broadcast_bytes,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .wait = mpi_wait,
    .test = mpi_test,
    .barrier = mpi_barrier,
    .split = mpi_split,
    .free = mpi_free,
};

static loom_comm *wrap(MPI_Comm comm) {
  loom_comm *c = loom_xmalloc(sizeof *c, "communicator");
  MPI_Comm *impl = loom_xmalloc(sizeof *impl, "communicator");
  *impl = comm;
  c->ops = &MPI_OPS;
  c->impl = impl;
  MPI_Comm_rank(comm, &c->rank);
  MPI_Comm_size(comm, &c->size);
  return c;
}

bool loom_mpi_launched(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE");
}

loom_comm *loom_comm_mpi_world(int *argc, char ***argv) {
  int ready;
  MPI_Initialized(&ready);
  if (!ready) MPI_Init(argc, argv);
  return wrap(MPI_COMM_WORLD);
}

void loom_mpi_abort(int code) {
  int ready;
  MPI_Initialized(&ready);
  if (ready) MPI_Abort(MPI_COMM_WORLD, code);
  exit(code);
}

void loom_mpi_finalize(void) {
  int ready, done;
  MPI_Initialized(&ready);
  MPI_Finalized(&done);
  if (ready && !done) MPI_Finalize();
}
