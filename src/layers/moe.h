/* A Mixture-of-Experts MLP on one rank, as Megatron-Core's MoELayer runs
 * it: the router's logits in fp32 (x times its [E, h] weight), each token's
 * top-k experts and weights (moe_router.h, with its load-balancing and z
 * losses), the rows each expert receives (moe_dispatch.h), the tokens
 * gathered into those rows (rows_gather), each expert's MLP over its rows
 * (grouped GEMMs, GELU or SwiGLU between them), and the rows weighted back
 * into token order (rows_combine).
 *
 * Under expert parallelism each rank of the EP group holds E / ep of the
 * experts and routes its own tokens: each expert's rows go to the rank
 * holding it in an all-to-all-v (the counts per expert gathered first), are
 * sorted there by expert (each expert's rows from every peer together, peer
 * by peer), computed, put back in arrival order and returned the same way.
 * In bf16 runs the rows travel as bf16 (they hold bf16 values: nothing is
 * lost).
 *
 * Under expert tensor parallelism the tp group splits each expert's MLP as
 * it splits the dense one (gate and up by rows, down by columns), and each
 * of its ranks computes every rank's rows through its slice: the rows its
 * experts took are all-gathered over the group (a block per rank, padded to
 * the largest), and the down projection's partial sums reduce-scattered
 * back, as Megatron-Core's all-to-all dispatcher gathers them over its
 * expert-tensor-parallel group; backward the same the other way.
 *
 * Under sequence parallelism each rank routes its own n of the micro-batch's
 * tokens, and everything that reads the whole micro-batch sums over the
 * group: the load-balancing loss's counts (as Megatron does) and, with a
 * capacity factor, the choices an expert keeps (planned over the whole
 * micro-batch, so the same tokens drop as in the serial run). Routing is a
 * function of the logits alone (ties go to the lower expert), so a
 * recompute routes again exactly. */
#ifndef LOOM_MOE_H
#define LOOM_MOE_H

#include <stdbool.h>
#include <stdint.h>
#include "backend/ops.h"
#include "comm/comm.h"
#include "layers/gpt_config.h"
#include "layers/moe_dispatch.h"
#include "layers/moe_router.h"
#include "tensor_parallel/linear.h"

/* Shapes of a call on this rank. */
typedef struct {
  int n;             /* tokens this rank routes (rows of x) */
  int hidden, ffn;   /* ffn: each expert's width on this rank (its slice under expert tensor parallelism) */
  loom_mlp_kind mlp;
  loom_glu glu;  /* SwiGLU's gated unit */
  loom_moe_router router;
  loom_moe_dispatch_config dispatch;
  bool bf16;         /* round every activation and activation grad to bf16 values; the experts' GEMMs run in bf16 */
  int ep, ep_rank;   /* the expert-parallel group's size (1: every expert here) and this rank's place in it */
  int local_experts; /* E / ep, experts [ep_rank x local_experts, ...) */
  int64_t recv_rows; /* the most rows this rank's experts take (loom_moe_recv_rows) */
  int etp;           /* the group splitting each expert (1: whole) */
  int etp_rank;      /* this rank's place in it: rank 0 adds the down projection's bias and takes its grad */
} loom_moe_shape;

/* The most rows one rank's experts take in a micro-batch of cfg's model
 * (placed by loom_gpt_config_for_ep) whose ranks each route n tokens, seq
 * of them sharing a micro-batch along the sequence: every choice's (n k)
 * without expert parallelism; with it, every peer's tokens routed here,
 * ep n min(k, E / ep), or with a capacity factor ep (E / ep) min(n,
 * capacity), whichever is less. The memory model's bound, and the buffers'. */
int64_t loom_moe_recv_rows(const loom_gpt_config *cfg, int64_t n, int seq);
/* The shape of a layer of cfg's model routing n tokens per rank. */
loom_moe_shape loom_moe_shape_of(const loom_gpt_config *cfg, int n, int seq);
/* The most rows the experts compute over on one rank of that model: the
 * rows they take (loom_moe_recv_rows), from every rank of the group
 * splitting them under expert tensor parallelism, a block of them each. The
 * buffers' and the memory model's size. */
int64_t loom_moe_expert_rows(const loom_gpt_config *cfg, int64_t n, int seq);
/* Floats in one row of the experts' first GEMM's output (SwiGLU: gate|up). */
static inline int loom_moe_fc_width(const loom_moe_shape *s) { return loom_mlp_fc_factor(s->mlp) * s->ffn; }
/* Rows a rank dispatches: every choice's, n k (dropless, the most). */
static inline int64_t loom_moe_rows(const loom_moe_shape *s) { return (int64_t)s->n * s->router.topk; }

/* One micro-batch's routing in one layer, in host memory: the router's
 * reference and the dispatch plan run there. */
typedef struct {
  loom_moe_routing routing;
  loom_moe_dispatch dispatch;
  int *counts;    /* [local experts] each of this rank's experts' rows, as the grouped GEMMs take them */
  float *logits;  /* [n, E] the router's logits */
  /* Expert parallelism: rows sent to and received from each peer, and every
   * peer's rows per expert ([ep, E], row q: peer q's dispatch counts). */
  size_t *send_rows, *recv_rows;
  int64_t *peer_counts;
  int64_t received;  /* rows this rank's experts took (without expert parallelism: every choice kept) */
  /* Expert tensor parallelism: every rank's rows per local expert ([etp, local experts], row q: rank q's
   * counts), and the rows of a block (the most any rank took; the gathered buffers hold a block per rank). */
  int *block_counts;
  int64_t block_rows;
  float *gate;       /* [n] the shared expert's gates, as the forward left them (backward reads them) */
  float *gate_grad;  /* [n] their logits' grads */
  int *identity;     /* [n] 0, 1, ..., n - 1: each token's own row (the gate's rows_combine) */
} loom_moe_host;

/* Allocates (and frees) one: for n tokens routed to their top-k of E
 * experts over an expert-parallel group of ep, each expert split over etp. */
loom_moe_host *loom_moe_host_new(int n, int experts, int topk, int ep, int etp);
void loom_moe_host_free(loom_moe_host *h);

/* What backward reads, in the backend's memory (M = loom_moe_rows rows
 * dispatched, R = recv_rows rows taken, X = loom_moe_expert_rows the experts
 * compute over: R but under expert tensor parallelism). */
typedef struct {
  float *x;        /* [n, h] the layer's input */
  float *logits;   /* [n, E] */
  float *weights;  /* [n, k] each choice's combine weight */
  int *slots;      /* [n, k] each choice's row, -1 where dropped */
  int *rows;       /* [M] each dispatched row's token */
  int *sort;       /* [R] expert parallelism: the received row each of this rank's experts' rows is */
  int *unsort;     /* [R] and back: the expert row each received row is */
  float *perm;     /* [X, h] this rank's experts' inputs, expert by expert (block by block) */
  float *fc;       /* [X, fc width] before the activation */
  float *act;      /* [X, ffn] after it */
  float *y;        /* [M, h] the experts' outputs, in dispatch order */
  float *shared;   /* [n, h] a gated shared expert's output before its gate (else NULL) */
  float *gate;     /* [n] its gates, sigmoid(x . w) */
  loom_moe_host *host;
} loom_moe_acts;

/* Scratch; contents never outlive a call. */
typedef struct {
  float *d_y;           /* [M, h] */
  float *d_perm;        /* [X, h] */
  float *d_act;         /* [X, ffn] */
  float *d_fc;          /* [X, fc width] */
  float *mine;          /* [R, h] expert tensor parallelism: this rank's block of rows, before a gather or after a
                         * reduce-scatter */
  float *part;          /* [X, h] expert tensor parallelism: the experts' partial outputs, then the grads' */
  float *recv, *recv2;  /* [R, h] expert parallelism: rows as they arrive, and as they leave */
  float *send;          /* [M, h] expert parallelism: rows as they are sent */
  uint16_t *wire, *wire2; /* [max(M, R), h] bf16 runs with expert parallelism: the rows in transit */
  float *d_weights;     /* [n, k] */
  float *d_logits;      /* [n, E] */
  float *d_x;           /* [n, h] */
  float *host;          /* host memory: [n k] weight grads, then [n E] logit grads */
  float *gate_d;        /* [n] a gated shared expert's: its gate logits, then their grads */
  int *gate_rows;       /* [n] the identity rows (loom_moe_host.identity) */
} loom_moe_scratch;

/* The weights a layer computes with: the router's fp32 values (in bf16 runs
 * the bf16 copy's, widened: the router runs in fp32), its expert bias, the experts'
 * [E][fc width, h] and [E][h, ffn] matrices and their biases (fp32 values, as the router's). */
typedef struct {
  const float *router;
  const float *router_b;    /* [E] a learned bias on the router's logits (GPT-OSS's; NULL: none) */
  const float *expert_bias; /* [E] host memory: the sigmoid router's bias for choosing (NULL: none) */
  loom_linear_weight fc, proj;
  const float *fc_b, *proj_b; /* [E][fc width], [E][h] the experts' biases (GPT-OSS's; NULL: none) */
} loom_moe_weights;

/* A layer's weight grads, the weights' views' shapes (router_b, fc_b, proj_b NULL: none). */
typedef struct {
  float *router, *router_b, *fc, *proj, *fc_b, *proj_b;
} loom_moe_grads;

/* The groups a call talks to (NULL: none): the ranks sharing the
 * micro-batch along the sequence, the expert-parallel group, and the group
 * splitting each expert (expert tensor parallelism). */
typedef struct {
  loom_comm *seq, *ep, *etp;
} loom_moe_groups;

/* out[n, h] = the layer's output for x[n, h] (x saved in a); what the
 * routing came to (its losses, this rank's shares; loads; drops) stays in
 * a->host. */
void loom_moe_forward(loom_moe_acts *a, const loom_moe_scratch *s, float *out, const float *x, const loom_moe_weights *w,
                      const loom_moe_shape *shape, loom_moe_groups g, const loom_ops *ops);
/* What the weight GEMMs of a split backward read besides the activations:
 * the grads of the experts' two GEMMs' outputs (this rank's experts' rows,
 * expert by expert) and of the router's logits. */
typedef struct {
  float *d_fc;     /* [X, fc width] */
  float *d_y;      /* [X, h] */
  float *d_logits; /* [n, E] */
} loom_moe_wgrad;

/* dx[n, h] += the grad of x, from dout[n, h] and the router losses weighted
 * by loss_weight (their share of the step's loss). The weight grads (dw)
 * are added to now, or with ws not NULL (a split backward) left in ws for
 * loom_moe_backward_weight (dw unused). */
void loom_moe_backward(float *dx, const loom_moe_grads *dw, const float *dout, const loom_moe_acts *a,
                       const loom_moe_scratch *s, const loom_moe_weights *w, const loom_moe_shape *shape,
                       float loss_weight, loom_moe_groups g, const loom_moe_wgrad *ws, const loom_ops *ops);
/* The weight half: the router's and the experts' weight grads from ws and
 * a's activations (zero-bubble schedules' W work); fp8_fc, fp8_proj: the
 * experts' FP8 state (NULL: bf16 GEMMs). */
void loom_moe_backward_weight(const loom_moe_grads *dw, const loom_moe_acts *a, const loom_moe_wgrad *ws,
                              const loom_moe_shape *shape, loom_fp8_site *fp8_fc, loom_fp8_site *fp8_proj,
                              const loom_ops *ops);

/* The shared expert's gate (Qwen2-MoE's shared_expert_gate, Megatron-Core's
 * moe_shared_expert_gate): shared[n, h], the shared expert's output on this
 * rank's n tokens, times sigmoid(x . w) per token, x the layer's input as
 * loom_moe_forward kept it (so after it) and w [1, h] in fp32. What backward
 * reads is kept in a. */
void loom_moe_gate_forward(loom_moe_acts *a, const loom_moe_scratch *s, float *shared, const float *w,
                           const loom_moe_shape *shape, const loom_ops *ops);
/* d_shared[n, h] = the grad of the ungated output from dout[n, h]; the
 * gate logits' grads stay in s for loom_moe_gate_backward_weights. */
void loom_moe_gate_backward(float *d_shared, const float *dout, const loom_moe_acts *a, const loom_moe_scratch *s,
                            const loom_moe_shape *shape, const loom_ops *ops);
/* dx[n, h] and dw[1, h] += the gate's grads of its input and weight, once
 * the input's grad is under way (the shared expert's backward writes it). */
void loom_moe_gate_backward_weights(float *dx, float *dw, const loom_moe_acts *a, const loom_moe_scratch *s, const float *w,
                                    const loom_moe_shape *shape, const loom_ops *ops);

#endif
