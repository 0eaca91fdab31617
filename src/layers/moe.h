/* A Mixture-of-Experts MLP on one rank, as Megatron-Core's MoELayer runs
 * it: the router's logits in fp32 (x times its [E, h] weight), each token's
 * top-k experts and weights (moe_router.h, with its load-balancing and z
 * losses), the rows each expert receives (moe_dispatch.h), the tokens
 * gathered into those rows (rows_gather), each expert's MLP over its rows
 * (grouped GEMMs, GELU or SwiGLU between them), and the rows weighted back
 * into token order (rows_combine). Every expert of the layer is on this
 * rank.
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
  int hidden, ffn;   /* ffn: each expert's width */
  loom_mlp_kind mlp;
  loom_moe_router router;
  loom_moe_dispatch_config dispatch;
  bool bf16;         /* round every activation and activation grad to bf16 values; the experts' GEMMs run in bf16 */
} loom_moe_shape;

/* The shape of a layer of cfg's model routing n tokens per rank. */
loom_moe_shape loom_moe_shape_of(const loom_gpt_config *cfg, int n);
/* Floats in one row of the experts' first GEMM's output (SwiGLU: gate|up). */
static inline int loom_moe_fc_width(const loom_moe_shape *s) { return s->mlp == LOOM_MLP_SWIGLU ? 2 * s->ffn : s->ffn; }
/* Rows the experts' buffers hold: every choice's, n k (dropless, the most). */
static inline int64_t loom_moe_rows(const loom_moe_shape *s) { return (int64_t)s->n * s->router.topk; }

/* One micro-batch's routing in one layer, in host memory: the router's
 * reference and the dispatch plan run there. */
typedef struct {
  loom_moe_routing routing;
  loom_moe_dispatch dispatch;
  int *counts;    /* [E] each expert's rows, as the grouped GEMMs take them */
  float *logits;  /* [n, E] the router's logits */
} loom_moe_host;

/* Allocates (and frees) one: for n tokens routed to their top-k of E experts. */
loom_moe_host *loom_moe_host_new(int n, int experts, int topk);
void loom_moe_host_free(loom_moe_host *h);

/* What backward reads, in the backend's memory (M = loom_moe_rows rows). */
typedef struct {
  float *x;        /* [n, h] the layer's input */
  float *logits;   /* [n, E] */
  float *weights;  /* [n, k] each choice's combine weight */
  int *slots;      /* [n, k] each choice's row, -1 where dropped */
  int *rows;       /* [M] each row's token */
  float *perm;     /* [M, h] the experts' inputs */
  float *fc;       /* [M, fc width] before the activation */
  float *act;      /* [M, ffn] after it */
  float *y;        /* [M, h] the experts' outputs */
  loom_moe_host *host;
} loom_moe_acts;

/* Scratch; contents never outlive a call. */
typedef struct {
  float *d_y, *d_perm;  /* [M, h] */
  float *d_act;         /* [M, ffn] */
  float *d_fc;          /* [M, fc width] */
  float *d_weights;     /* [n, k] */
  float *d_logits;      /* [n, E] */
  float *d_x;           /* [n, h] */
  float *host;          /* host memory: [n k] weight grads, then [n E] logit grads */
} loom_moe_scratch;

/* The weights a layer computes with: the router's fp32 values (in bf16 runs
 * the bf16 copy's, widened: the router runs in fp32), and the experts'
 * [E][fc width, h] and [E][h, ffn] matrices. */
typedef struct {
  const float *router;
  loom_linear_weight fc, proj;
} loom_moe_weights;

/* What a layer's routing came to in one micro-batch, for the log. */
typedef struct {
  double aux_loss, z_loss; /* this rank's shares of the micro-batch's */
  int64_t dropped;         /* choices dropped over capacity, of this rank's tokens */
} loom_moe_outcome;

/* out[n, h] = the layer's output for x[n, h] (x saved in a). group: the
 * ranks sharing the micro-batch along the sequence (NULL: none). */
loom_moe_outcome loom_moe_forward(loom_moe_acts *a, const loom_moe_scratch *s, float *out, const float *x,
                                  const loom_moe_weights *w, const loom_moe_shape *shape, loom_comm *group,
                                  const loom_ops *ops);
/* dx[n, h] += the grad of x, from dout[n, h] and the router losses weighted
 * by loss_weight (their share of the step's loss); the weight grads
 * (d_router [E, h], d_fc and d_proj as the experts' views) are added to. */
void loom_moe_backward(float *dx, float *d_router, float *d_fc, float *d_proj, const float *dout, const loom_moe_acts *a,
                       const loom_moe_scratch *s, const loom_moe_weights *w, const loom_moe_shape *shape,
                       float loss_weight, loom_comm *group, const loom_ops *ops);

#endif
