/* The NCCL communicator backend (see comm_nccl.h). */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include "comm/bootstrap.h"
#include "comm/nccl/comm_nccl.h"
#include "comm/nccl/nccl_id.h"
#include "core/check.h"

typedef struct {
  ncclComm_t comm;
  loom_comm *mpi;      /* the host group it was made from: splits and bootstraps */
  bool owns_mpi;       /* made by a split, so freed with this group */
  cudaStream_t compute, comm_stream;
  float *scratch;      /* one float for barriers */
} nccl_impl;

struct loom_request {
  cudaEvent_t done;
  cudaStream_t compute;
};

static nccl_impl *impl_of(const loom_comm *c) { return (nccl_impl *)c->impl; }

/* A failed NCCL or CUDA call on one rank ends the job with its message (DESIGN.md invariant 4). */
static void check_nccl(ncclResult_t r, const char *what) {
  if (r == ncclSuccess) return;
  fprintf(stderr, "loom: NCCL %s failed: %s\n", what, ncclGetErrorString(r));
  abort();
}

static void check_cuda(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "loom: CUDA %s failed: %s\n", what, cudaGetErrorString(e));
  abort();
}

static ncclRedOp_t red_of(loom_reduce_op op) { return op == LOOM_REDUCE_MAX ? ncclMax : ncclSum; }

static ncclDataType_t type_of(loom_dtype t) {
  switch (t) {
  case LOOM_DTYPE_F32: return ncclFloat32;
  case LOOM_DTYPE_F64: return ncclFloat64;
  case LOOM_DTYPE_I32: return ncclInt32;
  case LOOM_DTYPE_I64: return ncclInt64;
  case LOOM_DTYPE_BF16: return ncclBfloat16;
  case LOOM_DTYPE_BYTE: return ncclUint8;
  }
  LOOM_CHECK(0, "unknown element type");
  return ncclUint8;
}

static void nccl_allreduce(loom_comm *c, void *buf, size_t n, loom_dtype type, loom_reduce_op op) {
  check_nccl(ncclAllReduce(buf, buf, n, type_of(type), red_of(op), impl_of(c)->comm, impl_of(c)->compute), "all-reduce");
}

/* Starts work on the comm stream after everything queued on compute so far. */
static loom_request *begin_async(nccl_impl *m) {
  loom_request *r = loom_xmalloc(sizeof *r, "NCCL request");
  r->compute = m->compute;
  check_cuda(cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming), "event");
  check_cuda(cudaEventRecord(r->done, m->compute), "event");
  check_cuda(cudaStreamWaitEvent(m->comm_stream, r->done, 0), "stream wait");
  return r;
}

static loom_request *end_async(nccl_impl *m, loom_request *r) {
  check_cuda(cudaEventRecord(r->done, m->comm_stream), "event");
  return r;
}

static loom_request *nccl_iallreduce(loom_comm *c, void *buf, size_t n, loom_dtype type) {
  nccl_impl *m = impl_of(c);
  loom_request *r = begin_async(m);
  check_nccl(ncclAllReduce(buf, buf, n, type_of(type), ncclSum, m->comm, m->comm_stream), "all-reduce");
  return end_async(m, r);
}

static void nccl_allgather(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type) {
  check_nccl(ncclAllGather(send, recv, n, type_of(type), impl_of(c)->comm, impl_of(c)->compute), "all-gather");
}

static void nccl_reduce_scatter(loom_comm *c, const float *send, float *recv, size_t n) {
  check_nccl(ncclReduceScatter(send, recv, n, ncclFloat, ncclSum, impl_of(c)->comm, impl_of(c)->compute),
             "reduce-scatter");
}

static loom_request *nccl_iallgather(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type) {
  nccl_impl *m = impl_of(c);
  loom_request *r = begin_async(m);
  check_nccl(ncclAllGather(send, recv, n, type_of(type), m->comm, m->comm_stream), "all-gather");
  return end_async(m, r);
}

static loom_request *nccl_ireduce_scatter(loom_comm *c, const float *send, float *recv, size_t n) {
  nccl_impl *m = impl_of(c);
  loom_request *r = begin_async(m);
  check_nccl(ncclReduceScatter(send, recv, n, ncclFloat, ncclSum, m->comm, m->comm_stream), "reduce-scatter");
  return end_async(m, r);
}

static void nccl_broadcast(loom_comm *c, void *buf, size_t n, loom_dtype type, int root) {
  check_nccl(ncclBroadcast(buf, buf, n, type_of(type), root, impl_of(c)->comm, impl_of(c)->compute), "broadcast");
}

/* One grouped ncclSend or ncclRecv on the comm stream. Tags order messages
 * between two ranks; NCCL orders them by issue order, which loom's schedules keep. */
static loom_request *p2p(loom_comm *c, float *buf, size_t n, int peer, bool send) {
  nccl_impl *m = impl_of(c);
  loom_request *r = begin_async(m);
  check_nccl(ncclGroupStart(), "group");
  check_nccl(send ? ncclSend(buf, n, ncclFloat, peer, m->comm, m->comm_stream)
                  : ncclRecv(buf, n, ncclFloat, peer, m->comm, m->comm_stream),
             send ? "send" : "recv");
  check_nccl(ncclGroupEnd(), "group");
  return end_async(m, r);
}

static loom_request *nccl_isend(loom_comm *c, const float *buf, size_t n, int peer, int tag) {
  (void)tag;
  return p2p(c, (float *)buf, n, peer, true);
}

static loom_request *nccl_irecv(loom_comm *c, float *buf, size_t n, int peer, int tag) {
  (void)tag;
  return p2p(c, buf, n, peer, false);
}

/* The compute stream waits for the transfer; the host does not. */
static void nccl_wait(loom_request *r) {
  check_cuda(cudaStreamWaitEvent(r->compute, r->done, 0), "stream wait");
  cudaEventDestroy(r->done);
  free(r);
}

static int nccl_test(loom_request *r) {
  const cudaError_t e = cudaEventQuery(r->done);
  if (e == cudaErrorNotReady) return 0;
  check_cuda(e, "event query");
  cudaEventDestroy(r->done);
  free(r);
  return 1;
}

static void nccl_barrier(loom_comm *c) {
  nccl_impl *m = impl_of(c);
  nccl_allreduce(c, m->scratch, 1, LOOM_DTYPE_F32, LOOM_REDUCE_SUM);
  check_cuda(cudaStreamSynchronize(m->compute), "barrier");
}

static loom_comm *make(loom_comm *mpi, bool owns_mpi, cudaStream_t compute);

static loom_comm *nccl_split(loom_comm *c, int color, int key) {
  loom_comm *sub = loom_comm_split(impl_of(c)->mpi, color, key, c->name);
  return sub ? make(sub, true, impl_of(c)->compute) : NULL;
}

static void nccl_free(loom_comm *c) {
  nccl_impl *m = impl_of(c);
  cudaStreamSynchronize(m->compute);
  cudaStreamSynchronize(m->comm_stream);
  ncclCommDestroy(m->comm);
  cudaStreamDestroy(m->comm_stream);
  cudaFree(m->scratch);
  if (m->owns_mpi) loom_comm_free(m->mpi);
  free(m);
  free(c);
}

static const loom_comm_ops NCCL_OPS = {
    .name = "nccl",
    .allreduce = nccl_allreduce,
    .iallreduce = nccl_iallreduce,
    .allgather = nccl_allgather,
    .reduce_scatter = nccl_reduce_scatter,
    .iallgather = nccl_iallgather,
    .ireduce_scatter = nccl_ireduce_scatter,
    .broadcast = nccl_broadcast,
    .isend = nccl_isend,
    .irecv = nccl_irecv,
    .wait = nccl_wait,
    .test = nccl_test,
    .barrier = nccl_barrier,
    .split = nccl_split,
    .free = nccl_free,
};

static loom_comm *make(loom_comm *mpi, bool owns_mpi, cudaStream_t compute) {
  ncclUniqueId id;
  const int size = loom_comm_size(mpi), rank = loom_comm_rank(mpi);
  const int made = loom_comm_bootstrap_id(mpi, &id, sizeof id, loom_nccl_create_id, NULL);
  ncclComm_t comm;
  const ncclResult_t r = made == 0 ? ncclCommInitRank(&comm, size, id, rank) : (ncclResult_t)made;
  if (r != ncclSuccess) {
    fprintf(stderr, "loom: NCCL communicator of %d ranks (group %s): %s\n", size, mpi ? mpi->name : "world",
            ncclGetErrorString(r));
    if (owns_mpi) loom_comm_free(mpi);
    return NULL;
  }
  nccl_impl *m = loom_xcalloc(1, sizeof *m, "NCCL communicator");
  m->comm = comm;
  m->mpi = mpi;
  m->owns_mpi = owns_mpi;
  m->compute = compute;
  check_cuda(cudaStreamCreateWithFlags(&m->comm_stream, cudaStreamNonBlocking), "stream");
  check_cuda(cudaMalloc((void **)&m->scratch, sizeof(float)), "barrier scratch");
  check_cuda(cudaMemsetAsync(m->scratch, 0, sizeof(float), compute), "barrier scratch");
  loom_comm *c = loom_xcalloc(1, sizeof *c, "NCCL communicator");
  c->ops = &NCCL_OPS;
  c->rank = rank;
  c->size = size;
  snprintf(c->name, sizeof c->name, "%s", mpi ? mpi->name : "world");
  c->impl = m;
  return c;
}

loom_comm *loom_comm_nccl_create(loom_comm *mpi_group, void *compute_stream) {
  return make(mpi_group, false, (cudaStream_t)compute_stream);
}
