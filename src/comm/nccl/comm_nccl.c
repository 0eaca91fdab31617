/* The NCCL communicator backend (see comm_nccl.h). */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm/bootstrap.h"
#include "comm/nccl/comm_nccl.h"
#include "comm/nccl/nccl_id.h"
#include "comm/nccl/nccl_watchdog.h"
#include "core/check.h"

/* A send or receive not yet handed to NCCL (see flush). */
typedef struct {
  void *buf; /* device memory: the caller's, or a staging copy */
  size_t n;
  int peer;
  bool send;
  loom_request *req;
} pending_p2p;

typedef struct {
  ncclComm_t comm;
  loom_comm *mpi;      /* the host group it was made from: splits and bootstraps */
  bool owns_mpi;       /* made by a split, so freed with this group */
  cudaStream_t compute, comm_stream;
  float *scratch;      /* one float for barriers */
  pending_p2p *pending;
  int npending, cap;
  const char *name; /* the group's (its loom_comm's, named after a split), for the watchdog */
} nccl_impl;

struct loom_request {
  nccl_impl *m;
  cudaEvent_t done;
  bool launched;     /* handed to NCCL: done is recorded after it */
  void *host, *stage; /* a host buffer and its device copy, freed on completion */
  size_t bytes;
  bool back;          /* a receive into a host buffer: stage is copied to host on completion */
};

static nccl_impl *impl_of(const loom_comm *c) { return (nccl_impl *)c->impl; }

/* A failed NCCL or CUDA call on one rank ends the job with its message
 * (DESIGN.md invariant 4), its communicators aborted so that no peer waits
 * on them. */
static void check_nccl(ncclResult_t r, const char *what) {
  if (r == ncclSuccess) return;
  char line[256];
  snprintf(line, sizeof line, "NCCL %s failed: %s", what, ncclGetErrorString(r));
  loom_nccl_fail(line);
}

static void check_cuda(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return;
  char line[256];
  snprintf(line, sizeof line, "CUDA %s failed: %s", what, cudaGetErrorString(e));
  loom_nccl_fail(line);
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

/* ---- host buffers ----
 * The runtime hands every group host values too (a loss, a norm, counts,
 * CRCs). NCCL reads device memory only, so those travel through a
 * stream-ordered device copy; the host waits for what it reads back. */

static bool on_device(const void *p) {
  struct cudaPointerAttributes a;
  const bool dev = cudaPointerGetAttributes(&a, p) == cudaSuccess &&
                   (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged);
  cudaGetLastError();
  return dev;
}

/* A device copy of host[bytes] on `stream` (filled from it when fill), or host itself when on the device already. */
static void *stage(cudaStream_t stream, const void *host, size_t bytes, bool fill) {
  if (on_device(host)) return (void *)host;
  void *dev = NULL;
  check_cuda(cudaMallocAsync(&dev, bytes ? bytes : 1, stream), "staging allocation");
  if (fill && bytes) check_cuda(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream), "staging copy");
  return dev;
}

/* Copies a staged result back (when back) and frees the copy; the host waits, as it reads the values at once. */
static void unstage(cudaStream_t stream, const void *host, void *dev, size_t bytes, bool back, const char *what) {
  if (dev == host) return;
  /* A copy into pageable memory blocks inside cudaMemcpyAsync, out of the watchdog's sight: wait through it first. */
  if (back && bytes) loom_nccl_wait_stream(stream, what);
  if (back && bytes) check_cuda(cudaMemcpyAsync((void *)host, dev, bytes, cudaMemcpyDeviceToHost, stream), "staging copy");
  check_cuda(cudaFreeAsync(dev, stream), "staging free");
  loom_nccl_wait_stream(stream, what);
}

static void flush(nccl_impl *m);

/* A blocking collective: queued on the compute stream, in order with the kernels around it. */
static void nccl_allreduce(loom_comm *c, void *buf, size_t n, loom_dtype type, loom_reduce_op op) {
  nccl_impl *m = impl_of(c);
  flush(m);
  const size_t bytes = n * loom_dtype_size(type);
  void *d = stage(m->compute, buf, bytes, true);
  loom_nccl_issued("all-reduce", c->name);
  check_nccl(ncclAllReduce(d, d, n, type_of(type), red_of(op), m->comm, m->compute), "all-reduce");
  unstage(m->compute, buf, d, bytes, true, "an all-reduce of host values");
}

static loom_request *new_request(nccl_impl *m) {
  loom_request *r = loom_xcalloc(1, sizeof *r, "NCCL request");
  r->m = m;
  check_cuda(cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming), "event");
  return r;
}

/* Work on the comm stream starts after everything queued on compute so far. */
static void comm_after_compute(nccl_impl *m) {
  cudaEvent_t ready;
  check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "event");
  check_cuda(cudaEventRecord(ready, m->compute), "event");
  check_cuda(cudaStreamWaitEvent(m->comm_stream, ready, 0), "stream wait");
  cudaEventDestroy(ready);
}

static loom_request *launched(nccl_impl *m, loom_request *r) {
  check_cuda(cudaEventRecord(r->done, m->comm_stream), "event");
  r->launched = true;
  return r;
}

/* Non-blocking collectives (the data-parallel buckets, ZeRO's traffic) run
 * on the comm stream, overlapping compute; wait() orders compute after them.
 * Their buffers are device memory (the runtime's grads and weights). */
static loom_request *nccl_iallreduce(loom_comm *c, void *buf, size_t n, loom_dtype type) {
  nccl_impl *m = impl_of(c);
  flush(m);
  comm_after_compute(m);
  loom_nccl_issued("all-reduce", c->name);
  check_nccl(ncclAllReduce(buf, buf, n, type_of(type), ncclSum, m->comm, m->comm_stream), "all-reduce");
  return launched(m, new_request(m));
}

static void nccl_allgather(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type) {
  nccl_impl *m = impl_of(c);
  flush(m);
  const size_t bytes = n * loom_dtype_size(type);
  void *s = stage(m->compute, send, bytes, true), *r = stage(m->compute, recv, bytes * (size_t)c->size, false);
  loom_nccl_issued("all-gather", c->name);
  check_nccl(ncclAllGather(s, r, n, type_of(type), m->comm, m->compute), "all-gather");
  unstage(m->compute, send, s, bytes, false, "an all-gather of host values");
  unstage(m->compute, recv, r, bytes * (size_t)c->size, true, "an all-gather of host values");
}

/* NCCL has no all-to-all-v: one group of a send and a receive per peer,
 * on the compute stream (a peer with nothing to move still posts its zero
 * counts, which NCCL skips). */
static void nccl_alltoallv(loom_comm *c, const void *send, const size_t *send_counts, void *recv, const size_t *recv_counts,
                           loom_dtype type) {
  nccl_impl *m = impl_of(c);
  flush(m);
  const size_t size = loom_dtype_size(type);
  size_t sent = 0, got = 0;
  for (int r = 0; r < c->size; r++) sent += send_counts[r], got += recv_counts[r];
  char *s = stage(m->compute, send, sent * size, true), *d = stage(m->compute, recv, got * size, false);
  loom_nccl_issued("all-to-all", c->name);
  check_nccl(ncclGroupStart(), "group");
  size_t at_s = 0, at_r = 0;
  for (int r = 0; r < c->size; r++) {
    check_nccl(ncclSend(s + at_s * size, send_counts[r], type_of(type), r, m->comm, m->compute), "all-to-all send");
    check_nccl(ncclRecv(d + at_r * size, recv_counts[r], type_of(type), r, m->comm, m->compute), "all-to-all recv");
    at_s += send_counts[r], at_r += recv_counts[r];
  }
  check_nccl(ncclGroupEnd(), "group");
  unstage(m->compute, send, s, sent * size, false, "an all-to-all of host values");
  unstage(m->compute, recv, d, got * size, true, "an all-to-all of host values");
}

static void nccl_reduce_scatter(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type) {
  nccl_impl *m = impl_of(c);
  flush(m);
  loom_nccl_issued("reduce-scatter", c->name);
  check_nccl(ncclReduceScatter(send, recv, n, type_of(type), ncclSum, m->comm, m->compute), "reduce-scatter");
}

static loom_request *nccl_iallgather(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type) {
  nccl_impl *m = impl_of(c);
  flush(m);
  comm_after_compute(m);
  loom_nccl_issued("all-gather", c->name);
  check_nccl(ncclAllGather(send, recv, n, type_of(type), m->comm, m->comm_stream), "all-gather");
  return launched(m, new_request(m));
}

static loom_request *nccl_ireduce_scatter(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type) {
  nccl_impl *m = impl_of(c);
  flush(m);
  comm_after_compute(m);
  loom_nccl_issued("reduce-scatter", c->name);
  check_nccl(ncclReduceScatter(send, recv, n, type_of(type), ncclSum, m->comm, m->comm_stream), "reduce-scatter");
  return launched(m, new_request(m));
}

static void nccl_broadcast(loom_comm *c, void *buf, size_t n, loom_dtype type, int root) {
  nccl_impl *m = impl_of(c);
  flush(m);
  const size_t bytes = n * loom_dtype_size(type);
  void *d = stage(m->compute, buf, bytes, c->rank == root);
  loom_nccl_issued("broadcast", c->name);
  check_nccl(ncclBroadcast(d, d, n, type_of(type), root, m->comm, m->compute), "broadcast");
  unstage(m->compute, buf, d, bytes, c->rank != root, "a broadcast of host values");
}

/* ---- point to point ----
 * An NCCL send waits on the GPU for its receive, and each group holds its
 * stream until all of it has matched. isend and irecv only queue; flush,
 * the first wait or test on any of this group's requests, or any
 * collective hands everything queued to NCCL as one group. Callers that
 * exchange on one group (preflight, measurements) post their receive and
 * send before waiting, and so get them as one group. The pipeline moves its
 * messages on channels of their own, one two-rank communicator (and stream)
 * per ordered pair of ranks and kind of message, and flushes each transfer
 * as it makes it (pipeline/p2p.c): the rendezvous semantics its schedules
 * are verified under (schedule/verify.h, LOOM_SENDS_RENDEZVOUS). */

static void flush(nccl_impl *m) {
  if (!m->npending) return;
  comm_after_compute(m);
  check_nccl(ncclGroupStart(), "group");
  for (int i = 0; i < m->npending; i++) {
    const pending_p2p *p = &m->pending[i];
    check_nccl(p->send ? ncclSend(p->buf, p->n, ncclFloat, p->peer, m->comm, m->comm_stream)
                       : ncclRecv(p->buf, p->n, ncclFloat, p->peer, m->comm, m->comm_stream),
               p->send ? "send" : "recv");
  }
  check_nccl(ncclGroupEnd(), "group");
  loom_nccl_issued("send/recv", m->name);
  for (int i = 0; i < m->npending; i++) launched(m, m->pending[i].req);
  m->npending = 0;
}

static loom_request *p2p(loom_comm *c, float *buf, size_t n, int peer, bool send) {
  nccl_impl *m = impl_of(c);
  loom_request *r = new_request(m);
  r->bytes = n * sizeof(float);
  void *d = stage(m->compute, buf, r->bytes, send);
  if (d != buf) r->host = buf, r->stage = d, r->back = !send;
  if (m->npending == m->cap) {
    m->cap = m->cap ? 2 * m->cap : 8;
    m->pending = realloc(m->pending, (size_t)m->cap * sizeof *m->pending);
    LOOM_CHECK(m->pending, "out of memory queueing NCCL transfers");
  }
  m->pending[m->npending++] = (pending_p2p){.buf = d, .n = n, .peer = peer, .send = send, .req = r};
  return r;
}

static loom_request *nccl_isend(loom_comm *c, const float *buf, size_t n, int peer, int tag) {
  (void)tag; /* NCCL matches transfers between two ranks in issue order: the verifier proves the pipeline's match */
  return p2p(c, (float *)buf, n, peer, true);
}

static loom_request *nccl_irecv(loom_comm *c, float *buf, size_t n, int peer, int tag) {
  (void)tag;
  return p2p(c, buf, n, peer, false);
}

static void finish(loom_request *r) {
  if (r->stage) { /* a host buffer: its received bytes go back, and the host has them on return */
    if (r->back && r->bytes) loom_nccl_wait_stream(r->m->comm_stream, "a transfer of host values"); /* as unstage */
    if (r->back && r->bytes) check_cuda(cudaMemcpyAsync(r->host, r->stage, r->bytes, cudaMemcpyDeviceToHost, r->m->comm_stream), "staging copy");
    check_cuda(cudaFreeAsync(r->stage, r->m->comm_stream), "staging free");
    loom_nccl_wait_stream(r->m->comm_stream, "a transfer of host values");
  }
  cudaEventDestroy(r->done);
  free(r);
}

/* The compute stream waits for the transfer; the host does not (unless it reads a host buffer). */
static void nccl_wait(loom_request *r) {
  if (!r->launched) flush(r->m);
  check_cuda(cudaStreamWaitEvent(r->m->compute, r->done, 0), "stream wait");
  finish(r);
}

static int nccl_test(loom_request *r) {
  if (!r->launched) flush(r->m);
  const cudaError_t e = cudaEventQuery(r->done);
  if (e == cudaErrorNotReady) return 0;
  check_cuda(e, "event query");
  finish(r);
  return 1;
}

static void nccl_flush(loom_comm *c) { flush(impl_of(c)); }

static void nccl_barrier(loom_comm *c) {
  nccl_impl *m = impl_of(c);
  nccl_allreduce(c, m->scratch, 1, LOOM_DTYPE_F32, LOOM_REDUCE_SUM);
  loom_nccl_wait_stream(m->compute, "a barrier");
}

static loom_comm *make(loom_comm *mpi, bool owns_mpi, cudaStream_t compute);

static loom_comm *nccl_split(loom_comm *c, int color, int key) {
  flush(impl_of(c));
  loom_comm *sub = loom_comm_split(impl_of(c)->mpi, color, key, c->name);
  return sub ? make(sub, true, impl_of(c)->compute) : NULL;
}

static void nccl_free(loom_comm *c) {
  nccl_impl *m = impl_of(c);
  flush(m);
  cudaStreamSynchronize(m->compute);
  cudaStreamSynchronize(m->comm_stream);
  loom_nccl_forget(m->comm);
  ncclCommDestroy(m->comm);
  cudaStreamDestroy(m->comm_stream);
  cudaFree(m->scratch);
  if (m->owns_mpi) loom_comm_free(m->mpi);
  free(m->pending);
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
    .alltoallv = nccl_alltoallv,
    .isend = nccl_isend,
    .irecv = nccl_irecv,
    .flush = nccl_flush,
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
  c->world_rank = mpi ? mpi->world_rank : rank, c->leader = mpi ? mpi->leader : 0;
  snprintf(c->name, sizeof c->name, "%s", mpi ? mpi->name : "world");
  m->name = c->name;
  c->impl = m;
  loom_nccl_watch(comm, c->name); /* named later by loom_comm_split: read when reported */
  return c;
}

loom_comm *loom_comm_nccl_create(loom_comm *mpi_group, void *compute_stream) {
  return make(mpi_group, false, (cudaStream_t)compute_stream);
}
