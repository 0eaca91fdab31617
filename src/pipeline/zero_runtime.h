/* ZeRO-2 and ZeRO-3 inside the passes of one model chunk (optim/zero.h has
 * the buckets and the optimizer).
 *
 * Grads (ZeRO-2 and 3): a layer's backward writes into a transient buffer,
 * zeroed before it; when the layer is done its buckets are reduce-scattered
 * (non-blocking), in fp32 or (grad_reduce bf16) as bf16 values through a
 * bf16 copy of the layer's buffer, and this replica's piece is added into
 * the optimizer's summed grads. Two buffers alternate, so one layer's reduce-scatter runs
 * while the next layer's backward fills the other; each micro-batch's
 * backward is reduced this way, and the full grads never exist. The edges
 * (wte, wpe, final norm), written at both ends of a stage's backward, keep
 * one buffer for the whole pass and are reduce-scattered at its end.
 *
 * Weights (ZeRO-3): before a layer's forward, and again before its
 * backward, its buckets are all-gathered (bf16 in bf16 runs) into one of two
 * buffers while the next layer's is issued into the other (prefetch), and
 * the layer's views point there until the layer is done. With recompute,
 * the one gather before the backward serves the layer's forward again too.
 * The edges are gathered for a whole stage pass (the backward's only on the
 * last stage, whose head needs them). With MPI a prefetch progresses at the
 * next MPI call (Open MPI has no progress thread); NCCL runs it on its own
 * stream. */
#ifndef LOOM_ZERO_RUNTIME_H
#define LOOM_ZERO_RUNTIME_H

#include "layers/gpt.h"
#include "optim/zero.h"

typedef struct {
  loom_zero *z;
  loom_gpt *m;
  const loom_allocator *mem; /* where the buffers below live: the model's backend memory */
  loom_dtype wtype;          /* what the weights cross dp as: bf16 in bf16 runs, else f32 */
  int nedge;
  int *edge;                 /* [nedge] the edge buckets */
  size_t *edge_at;           /* [nedge] each one's place in the edge buffers (elements) */
  int most;                  /* the most buckets a layer has (more than one where the experts are apart) */
  /* A layer's buffers hold its buckets back to back, each padded to its group's pieces; their pieces back to back. */
  /* ZeRO-3: gathered weights of two layers, and of the edges */
  void *wbuf[2], *wsend[2], *edge_w;
  float *edge_piece;         /* an edge bucket's piece: what it sends to a gather, what it gets of a reduce-scatter */
  int wlayer[2];             /* the layer whose weights buffer i holds or is gathering, or -1 */
  loom_request **wreq[2];    /* [most] its buckets' gathers under way */
  /* grads of two layers, and of the edges */
  float *gbuf[2], *grecv[2], *edge_g;
  /* bf16: the layers' and the edges' grads as they cross, and the pieces they sum to (widened into grecv, edge_piece) */
  uint16_t *gsend[2], *grecv16[2], *edge_gsend, *edge_recv16;
  int glayer[2];             /* the layer whose grads buffer i is reducing, or -1 */
  loom_request **greq[2];    /* [most] its buckets' reduce-scatters under way */
  size_t transient_bytes;    /* what the buffers above take */
  bool short_of_memory;      /* a buffer above could not be allocated (loom_zero_runtime_init fails) */
} loom_zero_runtime;

/* Buffers for ZeRO z (stage 2 or 3) of chunk m, whose hooks then call
 * loom_zero_runtime_before/after; grads_bf16: they cross dp as bf16. */
loom_status loom_zero_runtime_init(loom_zero_runtime *rt, loom_zero *z, loom_gpt *m, bool grads_bf16);
void loom_zero_runtime_free(loom_zero_runtime *rt);
/* The model hooks' halves (loom_gpt_hooks). */
void loom_zero_runtime_before(loom_zero_runtime *rt, bool backward, int layer);
void loom_zero_runtime_after(loom_zero_runtime *rt, bool backward, int layer);

#endif
