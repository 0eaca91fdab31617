/* The communicator interface: collectives and point-to-point transfers on an
 * explicit group handle, never a global communicator. The MPI backend
 * (mpi/) implements it now; the NCCL backend slots in behind the same table.
 *
 * Every call is collective over the group unless it is send/recv. A NULL
 * group or a group of size 1 makes every collective a local no-op (or a copy),
 * so serial code runs the same functions with no communicator at all. */
#ifndef LOOM_COMM_H
#define LOOM_COMM_H

#include <stddef.h>
#include "core/tensor.h"

typedef enum { LOOM_REDUCE_SUM = 0, LOOM_REDUCE_MAX = 1 } loom_reduce_op;

/* The collectives, by kind: what the cost model prices and the calibration
 * measures. Bus-bandwidth factors (nccl-tests): what each rank sends per
 * byte of the whole buffer, 2(n-1)/n for an all-reduce, (n-1)/n for an
 * all-gather or reduce-scatter, 1 for a send/recv. */
typedef enum { LOOM_COLL_ALLREDUCE, LOOM_COLL_ALLGATHER, LOOM_COLL_REDUCE_SCATTER, LOOM_COLL_SENDRECV, LOOM_COLL_KINDS } loom_collective;
static inline double loom_collective_factor(loom_collective kind, int n) {
  const double share = (double)(n - 1) / n;
  return kind == LOOM_COLL_ALLREDUCE ? 2.0 * share : kind == LOOM_COLL_SENDRECV ? 1.0 : share;
}

/* The send semantics of point-to-point transfers by name: what LOOM_P2P
 * selects for the MPI backend and what the verifier's send models are
 * called (schedule/verify.h). */
#define LOOM_SENDS_BUFFERED_NAME "buffered"
#define LOOM_SENDS_RENDEZVOUS_NAME "rendezvous"

typedef struct loom_comm loom_comm;
typedef struct loom_request loom_request;

typedef struct {
  const char *name;
  /* Typed collectives: n elements of `type` (f32, f64, i32, i64, and bf16
   * for sums; bytes are moved but never reduced). Integers and doubles never
   * travel as floats. */
  void (*allreduce)(loom_comm *c, void *buf, size_t n, loom_dtype type, loom_reduce_op op);
  /* Non-blocking sum all-reduce in place (f32 or bf16); complete it with wait. */
  loom_request *(*iallreduce)(loom_comm *c, void *buf, size_t n, loom_dtype type);
  /* recv[size * n] = every rank's send[n], in rank order */
  void (*allgather)(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type);
  /* recv[n] = sum over ranks of send[rank * n .. rank * n + n) (f32, or bf16 summed as allreduce's) */
  void (*reduce_scatter)(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type);
  /* Non-blocking all-gather and reduce-scatter (ZeRO-2/3's per-layer
   * traffic, overlapped with compute); complete them with wait. */
  loom_request *(*iallgather)(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type);
  loom_request *(*ireduce_scatter)(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type);
  void (*broadcast)(loom_comm *c, void *buf, size_t n, loom_dtype type, int root);
  /* All-to-all with a count per peer (MoE's token dispatch and combine):
   * send_counts[r] elements of send go to rank r, recv_counts[r] from rank r
   * land in recv, each side packed in rank order. */
  void (*alltoallv)(loom_comm *c, const void *send, const size_t *send_counts, void *recv, const size_t *recv_counts,
                    loom_dtype type);
  /* Point to point. A backend may queue transfers (NCCL groups them) until
   * a wait, a test, a collective or flush; tags pick the recv under
   * buffered sends and are ignored under rendezvous ones, whose sends meet
   * recvs in issue order (schedule/verify.h's send models). */
  loom_request *(*isend)(loom_comm *c, const float *buf, size_t n, int peer, int tag);
  loom_request *(*irecv)(loom_comm *c, float *buf, size_t n, int peer, int tag);
  void (*wait)(loom_request *r); /* completes and frees r */
  int (*test)(loom_request *r);  /* 1 (and frees r) if complete, else 0 */
  void (*flush)(loom_comm *c);   /* hands what is queued to the network now, as one group (NULL: nothing queues) */
  void (*barrier)(loom_comm *c);
  /* Sub-group of the ranks passing the same color, ordered by key. */
  loom_comm *(*split)(loom_comm *c, int color, int key);
  void (*free)(loom_comm *c);
} loom_comm_ops;

struct loom_comm {
  const loom_comm_ops *ops;
  int rank, size;
  char name[16]; /* "world", "tp", "dp", "pp", "embedding": for error messages */
  /* This rank's world rank, and the lowest world rank of the group (its leader): what
   * tells two groups of one name apart (the flight recorder's names). */
  int world_rank, leader;
  /* The compute backend's memory, whose buffers the f32 calls may be
   * given (NULL: host memory only). A comm backend that cannot reach it
   * stages through the host; sub-groups inherit it. */
  const loom_allocator *mem;
  /* Bytes this rank has sent in the group's all-reduces, all-gathers and
   * reduce-scatters, as ring algorithms move them (an all-reduce of B bytes
   * sends 2 (d-1)/d B; an all-gather or reduce-scatter of B bytes per rank
   * (d-1) B): the measured side of the plan's and the sim's dp traffic. */
  double ring_bytes;
  double sent_bytes; /* bytes this rank has sent point to point (the context-parallel ring's measured side) */
  void *impl;
};

/* Tells the group (and the groups split from it later) whose memory its buffers may be in. */
void loom_comm_use_memory(loom_comm *c, const loom_allocator *mem);
int loom_comm_rank(const loom_comm *c);
int loom_comm_size(const loom_comm *c);
/* f32 data (activations, grads): the common case. */
void loom_comm_allreduce(loom_comm *c, float *buf, size_t n, loom_reduce_op op);
/* Any type: counts as i64, sums of squares as f64, CRCs as bytes. */
void loom_comm_allreduce_typed(loom_comm *c, void *buf, size_t n, loom_dtype type, loom_reduce_op op);
void loom_comm_allgather_typed(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type);
void loom_comm_broadcast_typed(loom_comm *c, void *buf, size_t n, loom_dtype type, int root);
/* What every peer will send this rank, exchanged before an all-to-all-v:
 * recv_counts[r] = rank r's send_counts[this rank]. */
void loom_comm_alltoall_counts(loom_comm *c, const size_t *send_counts, size_t *recv_counts);
/* The all-to-all-v above (counts from loom_comm_alltoall_counts); the bytes
 * this rank sends to its peers count in ring_bytes. */
void loom_comm_alltoallv_typed(loom_comm *c, const void *send, const size_t *send_counts, void *recv,
                               const size_t *recv_counts, loom_dtype type);
/* Starts a sum all-reduce of buf; NULL (nothing to wait for) on a group of one. */
loom_request *loom_comm_iallreduce(loom_comm *c, float *buf, size_t n);
/* The same for f32 or bf16 (bf16 sums round each partial sum to bf16). */
loom_request *loom_comm_iallreduce_typed(loom_comm *c, void *buf, size_t n, loom_dtype type);
void loom_comm_allgather(loom_comm *c, const float *send, float *recv, size_t n);
void loom_comm_reduce_scatter(loom_comm *c, const float *send, float *recv, size_t n);
void loom_comm_reduce_scatter_typed(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type);
/* Non-blocking forms; a group of one copies at once and returns NULL. */
loom_request *loom_comm_iallgather_typed(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type);
loom_request *loom_comm_ireduce_scatter(loom_comm *c, const float *send, float *recv, size_t n);
loom_request *loom_comm_ireduce_scatter_typed(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type);
void loom_comm_broadcast(loom_comm *c, float *buf, size_t n, int root);
void loom_comm_broadcast_bytes(loom_comm *c, void *buf, size_t bytes, int root);
void loom_comm_send(loom_comm *c, const float *buf, size_t n, int peer, int tag);
void loom_comm_recv(loom_comm *c, float *buf, size_t n, int peer, int tag);
loom_request *loom_comm_isend(loom_comm *c, const float *buf, size_t n, int peer, int tag);
loom_request *loom_comm_irecv(loom_comm *c, float *buf, size_t n, int peer, int tag);
void loom_comm_wait(loom_comm *c, loom_request *r);
int loom_comm_test(loom_comm *c, loom_request *r);
/* Waits for `root`'s go-ahead while sleeping, not spinning, so a rank that
 * waits leaves its core to the ranks that work (benchmarks). root calls it
 * when it is done. */
void loom_comm_idle_barrier(loom_comm *c, int root);
void loom_comm_barrier(loom_comm *c);
/* Sub-group of the ranks passing the same color, ordered by key, named
 * `name`; a rank passing LOOM_COMM_NO_COLOR joins none and gets NULL. */
#define LOOM_COMM_NO_COLOR (-1)
loom_comm *loom_comm_split(loom_comm *c, int color, int key, const char *name);
/* Hands the group's queued transfers to the network now (see isend). */
void loom_comm_flush(loom_comm *c);
void loom_comm_free(loom_comm *c);

#endif
