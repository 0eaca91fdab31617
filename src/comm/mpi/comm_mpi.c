/* Communicator interface over MPI. Collectives map one to one (onto MPI's
 * non-blocking ones under the watchdog); MPI counts are ints, so a message
 * is at most INT_MAX floats. MPI reads and writes host memory: a buffer of a
 * compute backend the host cannot address is staged through a host copy,
 * and one it can address is used in place (as a CUDA-aware MPI would take a
 * device pointer). */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm/mpi/comm_mpi.h"
#include "comm/mpi/watchdog.h"
#include "backend/op_math.h"
#include "core/check.h"

struct loom_request {
  MPI_Request req;
  char what[80]; /* for the watchdog: "send to rank 3 of the pp group" */
  const loom_comm *c;
  void *dev, *host; /* the caller's buffer and what MPI works on (the same unless staged) */
  size_t bytes;
  bool copy_back;   /* a receive: the staged result goes back to dev on completion */
  const void *send_dev; /* a collective's separate send buffer, and its host copy (NULL: none) */
  void *send_host;
  size_t send_bytes;
};

static MPI_Comm mpi_of(const loom_comm *c) { return *(MPI_Comm *)c->impl; }

/* Host memory MPI may use for `buf`: buf itself, or a staging copy (filled
 * from buf when `fill`) when buf is backend memory the host cannot address. */
static void *stage(const loom_comm *c, const void *buf, size_t bytes, bool fill) {
  const loom_allocator *mem = c->mem;
  if (!mem || mem->host_addressable || !mem->owns(mem, buf)) return (void *)buf;
  void *host = loom_xmalloc(bytes ? bytes : 1, "MPI staging buffer");
  if (fill) mem->to_host(mem, host, buf, bytes);
  return host;
}

/* Ends a staging: copies the result back to dev when `copy_back`. */
static void unstage(const loom_comm *c, const void *dev, void *host, size_t bytes, bool copy_back) {
  if (host == dev) return;
  if (copy_back) c->mem->from_host(c->mem, (void *)dev, host, bytes);
  free(host);
}

/* bf16 sums, which MPI does not know: each partial sum is formed in fp32 and
 * rounded to bf16, as a bf16 reduction on a GPU rounds. */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type) {
  (void)type;
  const uint16_t *a = in;
  uint16_t *b = inout;
  for (int i = 0; i < *len; i++) b[i] = loom_bf16_round(loom_bf16_value(a[i]) + loom_bf16_value(b[i]));
}

static MPI_Op g_bf16_sum = MPI_OP_NULL; /* made with the world communicator */

static MPI_Op op_of(loom_dtype t, loom_reduce_op op) {
  if (t == LOOM_DTYPE_BF16) return g_bf16_sum;
  return op == LOOM_REDUCE_MAX ? MPI_MAX : MPI_SUM;
}

static MPI_Datatype type_of(loom_dtype t) {
  switch (t) {
  case LOOM_DTYPE_F32: return MPI_FLOAT;
  case LOOM_DTYPE_F64: return MPI_DOUBLE;
  case LOOM_DTYPE_I32: return MPI_INT32_T;
  case LOOM_DTYPE_I64: return MPI_INT64_T;
  case LOOM_DTYPE_BF16: return MPI_UINT16_T; /* summed by bf16_sum */
  case LOOM_DTYPE_BYTE: return MPI_BYTE;
  }
  LOOM_CHECK(0, "unknown element type");
  return MPI_BYTE;
}

static int count_of(size_t n) {
  LOOM_CHECK(n <= INT_MAX, "message larger than INT_MAX floats; split it");
  return (int)n;
}

/* Under the watchdog every blocking call is a non-blocking one, polled
 * against the clock; without it MPI's blocking collectives, which Open MPI
 * tunes better than its non-blocking ones (measured in the README), run as they are. */
static bool watched(void) { return loom_watchdog_timeout() > 0; }

static void complete(MPI_Request *req, const char *op, const loom_comm *c) {
  char what[80];
  snprintf(what, sizeof what, "%s on the %s group", op, c->name);
  loom_watchdog_complete(req, what);
}

static void mpi_allreduce(loom_comm *c, void *buf, size_t n, loom_dtype type, loom_reduce_op op) {
  const MPI_Op mop = op_of(type, op);
  const size_t bytes = n * loom_dtype_size(type);
  void *h = stage(c, buf, bytes, true);
  if (!watched()) {
    MPI_Allreduce(MPI_IN_PLACE, h, count_of(n), type_of(type), mop, mpi_of(c));
  } else {
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, h, count_of(n), type_of(type), mop, mpi_of(c), &req);
    complete(&req, "all-reduce", c);
  }
  unstage(c, buf, h, bytes, true);
}

/* A request on buf (bytes long): staged, and copied back on completion when a receive. */
static loom_request *request(const char *op, int peer, const loom_comm *c, const void *buf, size_t bytes,
                             bool receive) {
  loom_request *r = loom_xmalloc(sizeof *r, "request");
  r->c = c;
  r->dev = (void *)buf;
  r->host = stage(c, buf, bytes, true);
  r->bytes = bytes;
  r->copy_back = receive;
  r->send_dev = r->send_host = NULL;
  r->send_bytes = 0;
  if (peer >= 0) snprintf(r->what, sizeof r->what, "%s rank %d of the %s group", op, peer, c->name);
  else snprintf(r->what, sizeof r->what, "%s on the %s group", op, c->name);
  return r;
}

static loom_request *mpi_iallreduce(loom_comm *c, void *buf, size_t n, loom_dtype type) {
  loom_request *r = request("all-reduce", -1, c, buf, n * loom_dtype_size(type), true);
  MPI_Iallreduce(MPI_IN_PLACE, r->host, count_of(n), type_of(type), op_of(type, LOOM_REDUCE_SUM), mpi_of(c), &r->req);
  return r;
}

/* A request receiving into recv from a separate send buffer, both staged when need be. */
static loom_request *request2(const char *op, const loom_comm *c, const void *send, size_t send_bytes, void *recv,
                              size_t recv_bytes) {
  loom_request *r = request(op, -1, c, recv, recv_bytes, true);
  r->send_dev = send;
  r->send_host = stage(c, send, send_bytes, true);
  r->send_bytes = send_bytes;
  return r;
}

static loom_request *mpi_iallgather(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type) {
  const size_t bytes = n * loom_dtype_size(type);
  loom_request *r = request2("all-gather", c, send, bytes, recv, bytes * (size_t)c->size);
  MPI_Iallgather(r->send_host, count_of(n), type_of(type), r->host, count_of(n), type_of(type), mpi_of(c), &r->req);
  return r;
}

static loom_request *mpi_ireduce_scatter(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type) {
  const size_t bytes = n * loom_dtype_size(type);
  loom_request *r = request2("reduce-scatter", c, send, bytes * (size_t)c->size, recv, bytes);
  MPI_Ireduce_scatter_block(r->send_host, r->host, count_of(n), type_of(type), op_of(type, LOOM_REDUCE_SUM), mpi_of(c),
                            &r->req);
  return r;
}

static void mpi_allgather(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type) {
  const MPI_Datatype t = type_of(type);
  const size_t bytes = n * loom_dtype_size(type), all = bytes * (size_t)c->size;
  void *hs = stage(c, send, bytes, true), *hr = stage(c, recv, all, false);
  if (!watched()) {
    MPI_Allgather(hs, count_of(n), t, hr, count_of(n), t, mpi_of(c));
  } else {
    MPI_Request req;
    MPI_Iallgather(hs, count_of(n), t, hr, count_of(n), t, mpi_of(c), &req);
    complete(&req, "all-gather", c);
  }
  unstage(c, send, hs, bytes, false);
  unstage(c, recv, hr, all, true);
}

/* Elements per rank of one reduce-scatter call. Open MPI's reduce-scatter
 * allocates a temporary of twice the whole send buffer (measured: 991 MB for
 * GPT-2-small's 495 MB of grads at dp 2), which would cost ZeRO more than it
 * saves; in pieces of this size it stays at 2 x size x 16 MiB. */
enum { REDUCE_SCATTER_PIECE = 1 << 22 };

static void reduce_scatter_block(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type) {
  const MPI_Datatype t = type_of(type);
  const MPI_Op op = op_of(type, LOOM_REDUCE_SUM);
  if (!watched()) {
    MPI_Reduce_scatter_block(send, recv, count_of(n), t, op, mpi_of(c));
    return;
  }
  MPI_Request req;
  MPI_Ireduce_scatter_block(send, recv, count_of(n), t, op, mpi_of(c), &req);
  complete(&req, "reduce-scatter", c);
}

static void mpi_reduce_scatter(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type) {
  const size_t size = loom_dtype_size(type), bytes = n * size, all = bytes * (size_t)c->size;
  char *hs = stage(c, send, all, true), *hr = stage(c, recv, bytes, false);
  if (n <= REDUCE_SCATTER_PIECE) {
    reduce_scatter_block(c, hs, hr, n, type);
  } else { /* each rank's block in pieces: piece j of every block, packed together */
    char *packed = loom_xmalloc((size_t)c->size * REDUCE_SCATTER_PIECE * size, "reduce-scatter piece");
    for (size_t at = 0; at < n; at += REDUCE_SCATTER_PIECE) {
      const size_t len = n - at < REDUCE_SCATTER_PIECE ? n - at : REDUCE_SCATTER_PIECE;
      for (int r = 0; r < c->size; r++) memcpy(packed + (size_t)r * len * size, hs + ((size_t)r * n + at) * size, len * size);
      reduce_scatter_block(c, packed, hr + at * size, len, type);
    }
    free(packed);
  }
  unstage(c, send, hs, all, false);
  unstage(c, recv, hr, bytes, true);
}

static void mpi_broadcast(loom_comm *c, void *buf, size_t n, loom_dtype type, int root) {
  const size_t bytes = n * loom_dtype_size(type);
  void *h = stage(c, buf, bytes, c->rank == root);
  if (!watched()) {
    MPI_Bcast(h, count_of(n), type_of(type), root, mpi_of(c));
  } else {
    MPI_Request req;
    MPI_Ibcast(h, count_of(n), type_of(type), root, mpi_of(c), &req);
    complete(&req, "broadcast", c);
  }
  unstage(c, buf, h, bytes, c->rank != root);
}

/* LOOM_P2P=rendezvous: point-to-point transfers with NCCL's semantics, so a
 * CPU run proves what a GPU run will do. Sends are synchronous (MPI_Issend:
 * complete only once the recv is posted) and every transfer carries one
 * tag, so sends meet recvs in issue order per peer and communicator, as
 * NCCL's ignore tags; each transfer is its own group, as loom's pipeline
 * hands them to NCCL (pipeline/p2p.c). */
static bool g_rendezvous;
enum { RENDEZVOUS_TAG = 0 };

static loom_request *mpi_isend(loom_comm *c, const float *buf, size_t n, int peer, int tag) {
  loom_request *r = request("send to", peer, c, buf, n * sizeof(float), false);
  if (g_rendezvous) MPI_Issend(r->host, count_of(n), MPI_FLOAT, peer, RENDEZVOUS_TAG, mpi_of(c), &r->req);
  else MPI_Isend(r->host, count_of(n), MPI_FLOAT, peer, tag, mpi_of(c), &r->req);
  return r;
}

static loom_request *mpi_irecv(loom_comm *c, float *buf, size_t n, int peer, int tag) {
  loom_request *r = request("receive from", peer, c, buf, n * sizeof(float), true);
  MPI_Irecv(r->host, count_of(n), MPI_FLOAT, peer, g_rendezvous ? RENDEZVOUS_TAG : tag, mpi_of(c), &r->req);
  return r;
}

static void finished(loom_request *r) {
  if (r->send_dev) unstage(r->c, r->send_dev, r->send_host, r->send_bytes, false);
  unstage(r->c, r->dev, r->host, r->bytes, r->copy_back);
  free(r);
}

static void mpi_wait(loom_request *r) {
  loom_watchdog_complete(&r->req, r->what);
  finished(r);
}

static int mpi_test(loom_request *r) {
  int done = 0;
  MPI_Test(&r->req, &done, MPI_STATUS_IGNORE);
  if (done) finished(r);
  return done;
}

static void mpi_barrier(loom_comm *c) {
  if (!watched()) {
    MPI_Barrier(mpi_of(c));
    return;
  }
  MPI_Request req;
  MPI_Ibarrier(mpi_of(c), &req);
  complete(&req, "barrier", c);
}

static loom_comm *wrap(MPI_Comm comm);

static loom_comm *mpi_split(loom_comm *c, int color, int key) {
  MPI_Comm sub;
  MPI_Comm_split(mpi_of(c), color == LOOM_COMM_NO_COLOR ? MPI_UNDEFINED : color, key, &sub);
  return sub == MPI_COMM_NULL ? NULL : wrap(sub);
}

static void mpi_free(loom_comm *c) {
  MPI_Comm *comm = c->impl;
  if (*comm != MPI_COMM_WORLD) MPI_Comm_free(comm);
  free(comm);
  free(c);
}

/* MPI's counts and displacements are ints: every peer's count and the
 * running total of them must fit. */
static void int_counts(const loom_comm *c, const size_t *counts, int *ints, int *displs, size_t *total) {
  *total = 0;
  for (int r = 0; r < c->size; r++) {
    displs[r] = count_of(*total);
    ints[r] = count_of(counts[r]);
    *total += counts[r];
  }
  (void)count_of(*total);
}

static void mpi_alltoallv(loom_comm *c, const void *send, const size_t *send_counts, void *recv, const size_t *recv_counts,
                          loom_dtype type) {
  int *ints = loom_xmalloc(4 * (size_t)c->size * sizeof *ints, "all-to-all counts");
  int *sc = ints, *sd = ints + c->size, *rc = ints + 2 * c->size, *rd = ints + 3 * c->size;
  size_t sent, got;
  int_counts(c, send_counts, sc, sd, &sent);
  int_counts(c, recv_counts, rc, rd, &got);
  const size_t size = loom_dtype_size(type);
  void *hs = stage(c, send, sent * size, true), *hr = stage(c, recv, got * size, false);
  const MPI_Datatype t = type_of(type);
  if (!watched()) {
    MPI_Alltoallv(hs, sc, sd, t, hr, rc, rd, t, mpi_of(c));
  } else {
    MPI_Request req;
    MPI_Ialltoallv(hs, sc, sd, t, hr, rc, rd, t, mpi_of(c), &req);
    complete(&req, "all-to-all", c);
  }
  unstage(c, send, hs, sent * size, false);
  unstage(c, recv, hr, got * size, true);
  free(ints);
}

static const loom_comm_ops MPI_OPS = {
    .name = "mpi",
    .allreduce = mpi_allreduce,
    .iallreduce = mpi_iallreduce,
    .allgather = mpi_allgather,
    .reduce_scatter = mpi_reduce_scatter,
    .iallgather = mpi_iallgather,
    .ireduce_scatter = mpi_ireduce_scatter,
    .broadcast = mpi_broadcast,
    .alltoallv = mpi_alltoallv,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .wait = mpi_wait,
    .test = mpi_test,
    .barrier = mpi_barrier,
    .split = mpi_split,
    .free = mpi_free,
};

static loom_comm *wrap(MPI_Comm comm) {
  loom_comm *c = loom_xcalloc(1, sizeof *c, "communicator");
  MPI_Comm *impl = loom_xmalloc(sizeof *impl, "communicator");
  *impl = comm;
  c->ops = &MPI_OPS;
  c->impl = impl;
  c->mem = NULL;
  MPI_Comm_rank(comm, &c->rank);
  MPI_Comm_size(comm, &c->size);
  MPI_Comm_rank(MPI_COMM_WORLD, &c->world_rank); /* a split's leader is set by loom_comm_split */
  snprintf(c->name, sizeof c->name, "%s", comm == MPI_COMM_WORLD ? "world" : "split");
  return c;
}

bool loom_mpi_launched(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE");
}

loom_comm *loom_comm_mpi_world(int *argc, char ***argv) {
  int ready;
  MPI_Initialized(&ready);
  if (!ready) MPI_Init(argc, argv);
  if (g_bf16_sum == MPI_OP_NULL) MPI_Op_create(bf16_sum, 1, &g_bf16_sum);
  loom_watchdog_init();
  loom_comm *world = wrap(MPI_COMM_WORLD);
  const char *mode = getenv("LOOM_P2P");
  if (mode && *mode && strcmp(mode, LOOM_SENDS_BUFFERED_NAME) != 0 && strcmp(mode, LOOM_SENDS_RENDEZVOUS_NAME) != 0) {
    if (world->rank == 0) fprintf(stderr, "loom: LOOM_P2P = '%s': must be %s (MPI's default) or %s\n", mode,
                            LOOM_SENDS_BUFFERED_NAME, LOOM_SENDS_RENDEZVOUS_NAME);
    MPI_Finalize();
    exit(2);
  }
  g_rendezvous = mode && strcmp(mode, LOOM_SENDS_RENDEZVOUS_NAME) == 0;
  if (g_rendezvous && world->rank == 0)
    fprintf(stderr, "loom: LOOM_P2P=rendezvous: point-to-point sends are synchronous and meet their recvs in issue order "
                    "per peer, tags ignored (NCCL's rules)\n");
  return world;
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

void loom_comm_mpi_set_watchdog(double timeout_s) { loom_watchdog_set_timeout(timeout_s); }
