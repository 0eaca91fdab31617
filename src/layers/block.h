/* One pre-norm transformer block, x + attn(norm_1(x)) then + mlp(norm_2(.)),
 * split across a tensor-parallel group the Megatron way: q|k|v and the MLP's
 * up (SwiGLU: gate|up) projections are column-parallel (this rank's heads
 * and MLP columns), the attention output and MLP down projections
 * row-parallel (partial sums reduced as the region ends, bias added once
 * after). The norm is LayerNorm or RMSNorm, the MLP GELU or SwiGLU, and
 * RoPE turns q and k (global positions: inside the region every rank holds
 * the whole sequence) when the config asks for it. Grouped-query attention
 * holds kv_heads / tp key/value heads per rank, or one replicated over
 * tp / kv_heads ranks, whose weight grads are then summed over those ranks
 * (tp->kv_group) so that every replica steps alike. With tp == 1 every collective is a no-op and this is
 * the serial block. Under sequence parallelism the block's input, output,
 * norms and residual adds hold only this rank's T/tp positions.
 *
 * Forward saves what backward needs in loom_block_acts; backward adds into
 * the block's parameter grads and turns dres (grad of the block output) into
 * the grad of the block input, in place. */
#ifndef LOOM_BLOCK_H
#define LOOM_BLOCK_H

#include <stdint.h>
#include "backend/ops.h"
#include "layers/gpt_params.h"
#include "layers/mla.h"
#include "layers/moe.h"
#include "layers/ring_attention.h"
#include "tensor_parallel/linear.h"
#include "tensor_parallel/parallel_state.h"

/* The FP8 linears of a layer (their state's order in loom_block_shape's fp8): the four dense linears, MLA's three
 * and the experts' two (one state for all of a layer's experts, each expert's GEMM cast on its own). The router
 * and everything outside the layers keep bf16/fp32. */
enum { LOOM_FP8_QKV, LOOM_FP8_ATTN_PROJ, LOOM_FP8_FC, LOOM_FP8_MLP_PROJ, LOOM_FP8_MLA_DOWN, LOOM_FP8_MLA_Q_UP,
       LOOM_FP8_MLA_KV_UP, LOOM_FP8_EXPERTS_FC, LOOM_FP8_EXPERTS_PROJ, LOOM_FP8_LINEARS };

/* Shapes of a block call on this rank. */
typedef struct {
  int T, B;        /* this rank's sequence length (its chunks' rows under context parallelism) and micro-batch */
  int hidden;
  int heads;       /* this rank's heads */
  int head_dim;    /* q's and k's */
  int v_head_dim;  /* v's and the attention output's (0: head_dim) */
  float softmax_scale; /* loom_attn_shape's (0: 1 / sqrt(head_dim)) */
  int head_offset; /* global index of this rank's first head */
  int total_heads;
  int kv_heads;    /* this rank's key/value heads */
  int ffn;         /* this rank's MLP columns (SwiGLU: of each of gate and up); a MoE layer's shared expert's (0: none) */
  float norm_eps;
  loom_norm_kind norm;
  loom_mlp_kind mlp;
  loom_glu glu;     /* SwiGLU's gated unit */
  loom_rope rope;   /* rotary positions (theta 0: none, the embedding added positions) */
  bool qk_norm;     /* RMSNorm over each q and k head before RoPE (its weights: q_norm_w, k_norm_w) */
  loom_softmax_kind softmax; /* attention sinks: a logit in every row's denominator (learnable: the weights' sinks) */
  int window;       /* this layer's sliding window (loom_attn_shape's; 0: none) */
  bool bf16;       /* round every activation and activation grad to bf16 values; the linears run in bf16 */
  loom_fp8_site *fp8; /* the layer's FP8 linears' state [LOOM_FP8_LINEARS] (NULL: bf16 GEMMs), what the weight-grad
                       * pass casts under (the forward's and input grads' come with the weights) */
  const loom_mla_shape *mla; /* multi-head latent attention's projections in place of q|k|v (mla.h); NULL: none */
  const loom_moe_shape *moe; /* a Mixture-of-Experts MLP (with the shared expert's, if any, beside it); NULL: dense */
  float moe_loss_weight;     /* backward: the router losses' weight in the step's loss */
} loom_block_shape;

/* The weights a block computes with: v's views for the norms and biases (in
 * fp32 runs every view), and the four linears' weights, which bf16 runs
 * read as the bf16 copy holds them. */
typedef struct {
  const loom_block_weights *v;
  loom_linear_weight c_attn, attn_proj, c_fc, mlp_proj;
  loom_mla_weights mla; /* multi-head latent attention's linears */
  loom_moe_weights moe;
} loom_block_compute_weights;

/* Saved activations. N = T*B rows in [s, b] order inside the parallel
 * regions; n = N/tp rows outside them under sequence parallelism, else N. */
typedef struct {
  float *ln_1_mean, *ln_1_rstd;        /* [n] (RMSNorm: rstd only) */
  float *ln_1;                         /* [N, h] (gathered under SP) */
  float *qkv;                          /* [N, (heads + 2 kv_heads) head_dim], q and k after RoPE */
  float *att_lse;                      /* [B, heads, T] each query row's softmax log-sum-exp (fp32 in every run) */
  float *atty;                         /* [N, heads * head_dim] */
  float *res_attn;                     /* [n, h] x + attention branch */
  float *ln_2_mean, *ln_2_rstd;        /* [n] */
  float *ln_2;                         /* [N, h] */
  float *fc;                           /* [N, ffn] before GELU (SwiGLU: [N, 2 ffn] gate|up) */
  float *fc_gelu;                      /* [N, ffn] after the activation */
  float *out;                          /* [n, h] block output */
  /* bf16 runs: the inputs of the four linears as bf16 bits, which forward
   * packs and every GEMM reads (ln_1, atty, ln_2 and fc_gelu above are then
   * scratch, and backward reads only atty of them); NULL in fp32 runs. */
  uint16_t *ln_1_bits, *atty_bits, *ln_2_bits, *fc_gelu_bits;
  /* QK-norm (fp32 in every run): q and k before it, [N H D] then [N K D]
   * (every row's heads side by side), and each head row's rstd, [N H] then [N K]. */
  float *qk_raw, *qk_rstd;
  loom_moe_acts moe;                   /* a MoE layer's (fp32 in every run) */
  loom_mla_acts mla;                   /* multi-head latent attention's */
} loom_block_acts;

/* Scratch shared by all blocks of a model; contents never outlive a call. */
typedef struct {
  float *local, *local2; /* [n, h] */
  float *full;           /* [N, h] */
  float *d_ln;           /* [N, h] */
  float *d_atty;         /* [N, heads * head_dim] */
  float *d_qkv;          /* [N, (heads + 2 kv_heads) head_dim] */
  float *d_fc;           /* [N, ffn] (SwiGLU: [N, 2 ffn]) */
  float *d_fc2;          /* [N, ffn] */
  float *d_qkv_w;        /* replicated key/value heads: this rank's q|k|v weight and bias grads, [qkv rows, h + 1] */
  float *qk_norm;        /* QK-norm: [2, N (H + K) D] its output in forward; its output's and input's grads in backward */
  float *d_attn_out, *d_mlp_out; /* [N, h] a whole backward's output grads of the two row-parallel linears */
  uint16_t *d_qkv_bits, *d_attn_bits, *d_fc_bits, *d_mlp_bits; /* bf16 runs: a whole backward's four, as bits */
  float *moe_out;                /* [n, h] a MoE layer's experts' output beside a shared expert's (else unused); in backward, a gated shared expert's output grad */
  loom_moe_scratch moe;
  loom_mla_scratch mla;
  loom_ring ring; /* context parallelism: attention's ring over the cp group (group NULL: none) */
} loom_block_scratch;

/* What a layer's weight grads need besides the inputs of its linears (the
 * saved ln_1, atty, ln_2 and fc_gelu): the grads of the four linears'
 * outputs inside the parallel region, which the input half of a split
 * backward leaves for the weight half. d_qkv [N, qkv width] and d_fc [N, fc
 * width] are the column-parallel ones; d_attn and d_mlp [N, h] the
 * row-parallel ones (gathered along the sequence under SP). */
typedef struct {
  float *d_qkv, *d_attn, *d_fc, *d_mlp;
  /* bf16 runs: the same four as bf16 bits, which the input half packs and
   * both halves' GEMMs read (the fp32 ones above are then scratch). */
  uint16_t *d_qkv_bits, *d_attn_bits, *d_fc_bits, *d_mlp_bits;
  /* A MoE layer's router and experts (NULL: their weight grads are taken
   * in the input half, as a whole backward does). */
  loom_moe_wgrad moe;
} loom_block_wgrad;

/* A LayerNorm (mean and rstd saved) or RMSNorm (rstd) over n rows of h;
 * backward adds into dx, dw and db (NULL for RMSNorm). */
void loom_norm_forward(const loom_ops *ops, loom_norm_kind kind, float eps, float *out, float *mean, float *rstd,
                       const float *x, const float *w, const float *b, int n, int h);
void loom_norm_backward(const loom_ops *ops, loom_norm_kind kind, float *dx, float *dw, float *db, const float *dout,
                        const float *x, const float *w, const float *mean, const float *rstd, int n, int h);

/* A v head's width, the attention output's row (atty's), and qkv's and fc's rows (the column-parallel outputs). */
static inline int loom_block_v_dim(const loom_block_shape *s) { return s->v_head_dim > 0 ? s->v_head_dim : s->head_dim; }
static inline int loom_block_attn_width(const loom_block_shape *s) { return s->heads * loom_block_v_dim(s); }
static inline int loom_block_qkv_width(const loom_block_shape *s) {
  return (s->heads + s->kv_heads) * s->head_dim + s->kv_heads * loom_block_v_dim(s);
}
static inline int loom_block_fc_width(const loom_block_shape *s) { return loom_mlp_fc_factor(s->mlp) * s->ffn; }

/* RoPE in place over the rows [t, b'] (b' < Bx) of x, `stride` floats each,
 * turning the first `heads` heads of D of each: each run of t at its global
 * positions (under context parallelism the rank's two chunks). */
void loom_rope_rows(const loom_tp *tp, const loom_ops *ops, float *x, int T, int Bx, int stride, int heads, int D,
                    loom_rope rope, bool backward);

/* Dropout keys of one block in one step; p == 0 disables dropout. */
typedef struct {
  float p;
  uint64_t seed;
  int64_t step;
  int layer; /* global layer index */
  int64_t sample_offset;
} loom_block_dropout;

void loom_block_forward(loom_block_acts *a, loom_block_scratch *s, const float *x,
                        const loom_block_compute_weights *w, const loom_block_shape *shape,
                        const loom_block_dropout *drop, const loom_tp *tp, const loom_ops *ops);
/* dres[n, h]: grad of the block output on entry, of the block input on exit. */
void loom_block_backward(float *dres, loom_block_weights *g, loom_block_scratch *s,
                         const loom_block_acts *a, const float *x, const loom_block_compute_weights *w,
                         const loom_block_shape *shape, const loom_block_dropout *drop,
                         const loom_tp *tp, const loom_ops *ops);
/* The same backward in two halves, as zero-bubble schedules run it. The
 * input half (B) turns dres into the input grad and adds the norm and bias
 * grads, O(rows x width) work; it leaves the linears' output grads in ws.
 * The weight half (W) adds the four linears' weight grads, the GEMMs, from
 * ws and the inputs a holds (ln_1, atty, ln_2, fc_gelu). Run back to back
 * they are loom_block_backward. */
void loom_block_backward_input(float *dres, loom_block_weights *g, loom_block_scratch *s, const loom_block_wgrad *ws,
                               const loom_block_acts *a, const float *x, const loom_block_compute_weights *w,
                               const loom_block_shape *shape, const loom_block_dropout *drop, const loom_tp *tp,
                               const loom_ops *ops);
void loom_block_backward_weight(loom_block_weights *g, loom_block_scratch *s, const loom_block_wgrad *ws,
                                const loom_block_acts *a, const loom_block_shape *shape, const loom_tp *tp,
                                const loom_ops *ops);

/* Dropout sites; part of the mask key, so never renumber them. */
enum { LOOM_SITE_EMBED = 0, LOOM_SITE_ATTN_PROBS = 1, LOOM_SITE_ATTN_OUT = 2, LOOM_SITE_MLP_OUT = 3 };
/* The mask of one site; `T` is the full sequence length, rows outside the
 * parallel regions start at this rank's sequence offset under SP. */
loom_dropout loom_dropout_for(const loom_block_dropout *d, int site, int T, const loom_tp *tp);

#endif
