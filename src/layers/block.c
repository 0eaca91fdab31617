/* Transformer block forward and hand-written backward over the op table,
 * with the tensor-parallel region edges from tensor_parallel/mappings.h. */
#include <string.h>
#include "core/rng.h"
#include "layers/block.h"
#include "tensor_parallel/mappings.h"

loom_dropout loom_dropout_for(const loom_block_dropout *d, int site, int T, const loom_tp *tp) {
  uint64_t stream = loom_hash_u64(loom_hash_u64(loom_hash_u64(0x100Du, (uint64_t)d->step),
                                                (uint64_t)d->layer), (uint64_t)site);
  const int local_T = loom_tp_local_rows(tp, T);
  return (loom_dropout){.p = d->p, .seed = d->seed, .stream = stream, .sample_offset = d->sample_offset,
                        .seq_offset = local_T == T ? 0 : tp->rank * local_T, .seq_total = T};
}

static loom_attn_shape attn_shape(const loom_block_shape *s) {
  return (loom_attn_shape){.T = s->T, .B = s->B, .heads = s->heads, .head_dim = s->head_dim,
                           .head_offset = s->head_offset, .total_heads = s->total_heads};
}

/* LayerNorm on this rank's rows, then into the parallel region: full[N, h]. */
static void norm_and_enter(float *full, float *mean, float *rstd, float *local_scratch, const float *x,
                           const float *w, const float *b, int n, const loom_block_shape *shape,
                           const loom_tp *tp, const loom_ops *ops) {
  float *normed = tp->sequence_parallel ? local_scratch : full;
  ops->layernorm_forward(normed, mean, rstd, x, w, b, n, shape->hidden, shape->norm_eps);
  loom_tp_enter_forward(tp, normed, full, (size_t)n * shape->hidden);
}

/* Leaves the region: reduces the partial sums in s->full to this rank's rows,
 * adds the bias once, applies dropout, and adds the residual: out = x + branch. */
static void exit_and_add(float *out, const float *x, const float *bias, loom_block_scratch *s, int n,
                         const loom_dropout *drop, const loom_block_shape *shape, const loom_tp *tp,
                         const loom_ops *ops) {
  const int h = shape->hidden, local_T = n / shape->B;
  float *branch = tp->sequence_parallel ? s->local : s->full;
  loom_tp_exit_forward(tp, s->full, branch, (size_t)n * h);
  ops->bias_forward(branch, bias, n, h);
  ops->dropout_forward(branch, local_T, shape->B, h, drop);
  ops->add(out, x, branch, (size_t)n * h);
}

void loom_block_forward(loom_block_acts *a, loom_block_scratch *s, const float *x,
                        const loom_block_weights *w, const loom_block_shape *shape,
                        const loom_block_dropout *drop, const loom_tp *tp, const loom_ops *ops) {
  const int T = shape->T, B = shape->B, N = T * B, n = loom_tp_local_rows(tp, T) * B, h = shape->hidden;
  const int width = shape->heads * shape->head_dim, f = shape->ffn;
  const loom_attn_shape as = attn_shape(shape);
  const loom_dropout d_probs = loom_dropout_for(drop, LOOM_SITE_ATTN_PROBS, T, tp);
  const loom_dropout d_attn = loom_dropout_for(drop, LOOM_SITE_ATTN_OUT, T, tp);
  const loom_dropout d_mlp = loom_dropout_for(drop, LOOM_SITE_MLP_OUT, T, tp);

  norm_and_enter(a->ln_1, a->ln_1_mean, a->ln_1_rstd, s->local, x, w->ln_1_w, w->ln_1_b, n, shape, tp, ops);
  ops->matmul_forward(a->qkv, a->ln_1, w->c_attn_w, w->c_attn_b, N, h, 3 * width);
  ops->attention_forward(a->atty, a->att, a->qkv, &as, &d_probs);
  ops->matmul_forward(s->full, a->atty, w->attn_proj_w, NULL, N, width, h);
  exit_and_add(a->res_attn, x, w->attn_proj_b, s, n, &d_attn, shape, tp, ops);

  norm_and_enter(a->ln_2, a->ln_2_mean, a->ln_2_rstd, s->local, a->res_attn, w->ln_2_w, w->ln_2_b, n, shape, tp, ops);
  ops->matmul_forward(a->fc, a->ln_2, w->c_fc_w, w->c_fc_b, N, h, f);
  ops->gelu_forward(a->fc_gelu, a->fc, (size_t)N * f);
  ops->matmul_forward(s->full, a->fc_gelu, w->mlp_proj_w, NULL, N, f, h);
  exit_and_add(a->out, a->res_attn, w->mlp_proj_b, s, n, &d_mlp, shape, tp, ops);
}

/* Backward of exit_and_add's branch: returns the branch grad inside the
 * region, [N, h], and adds the bias grad (partial under SP). */
static const float *exit_backward(float *dbias, const float *dres, loom_block_scratch *s, int n,
                                  const loom_dropout *drop, const loom_block_shape *shape, const loom_tp *tp,
                                  const loom_ops *ops) {
  const int h = shape->hidden;
  const float *g = dres;
  if (drop->p > 0.0f) {
    memcpy(s->local2, dres, (size_t)n * h * sizeof(float));
    ops->dropout_backward(s->local2, n / shape->B, shape->B, h, drop);
    g = s->local2;
  }
  ops->bias_backward(dbias, g, n, h);
  float *full = tp->sequence_parallel ? s->full : (float *)g;
  loom_tp_exit_backward(tp, g, full, (size_t)n * h);
  return full;
}

/* Backward of norm_and_enter: s->d_ln [N, h] holds the grad of the gathered
 * norm output; adds the LayerNorm's input grad into dres [n, h]. */
static void enter_and_norm_backward(float *dres, float *dw, float *db, loom_block_scratch *s, const float *x,
                                    const float *w, const float *mean, const float *rstd, int n,
                                    const loom_block_shape *shape, const loom_tp *tp, const loom_ops *ops) {
  float *d_local = tp->sequence_parallel ? s->local : s->d_ln;
  loom_tp_enter_backward(tp, s->d_ln, d_local, (size_t)n * shape->hidden);
  ops->layernorm_backward(dres, dw, db, d_local, x, w, mean, rstd, n, shape->hidden);
}

void loom_block_backward(float *dres, loom_block_weights *g, loom_block_scratch *s,
                         const loom_block_acts *a, const float *x, const loom_block_weights *w,
                         const loom_block_shape *shape, const loom_block_dropout *drop,
                         const loom_tp *tp, const loom_ops *ops) {
  const int T = shape->T, B = shape->B, N = T * B, n = loom_tp_local_rows(tp, T) * B, h = shape->hidden;
  const int width = shape->heads * shape->head_dim, f = shape->ffn;
  const size_t Nh = (size_t)N * h, Nf = (size_t)N * f;
  const loom_attn_shape as = attn_shape(shape);
  const loom_dropout d_probs = loom_dropout_for(drop, LOOM_SITE_ATTN_PROBS, T, tp);
  const loom_dropout d_attn = loom_dropout_for(drop, LOOM_SITE_ATTN_OUT, T, tp);
  const loom_dropout d_mlp = loom_dropout_for(drop, LOOM_SITE_MLP_OUT, T, tp);

  /* MLP branch; dres becomes the grad of res_attn. */
  const float *d_out = exit_backward(g->mlp_proj_b, dres, s, n, &d_mlp, shape, tp, ops);
  memset(s->d_fc2, 0, Nf * sizeof(float));
  ops->matmul_backward(s->d_fc2, g->mlp_proj_w, NULL, d_out, a->fc_gelu, w->mlp_proj_w, N, f, h);
  memset(s->d_fc, 0, Nf * sizeof(float));
  ops->gelu_backward(s->d_fc, s->d_fc2, a->fc, Nf);
  memset(s->d_ln, 0, Nh * sizeof(float));
  ops->matmul_backward(s->d_ln, g->c_fc_w, g->c_fc_b, s->d_fc, a->ln_2, w->c_fc_w, N, h, f);
  enter_and_norm_backward(dres, g->ln_2_w, g->ln_2_b, s, a->res_attn, w->ln_2_w, a->ln_2_mean, a->ln_2_rstd, n,
                          shape, tp, ops);

  /* Attention branch; dres becomes the grad of x. */
  d_out = exit_backward(g->attn_proj_b, dres, s, n, &d_attn, shape, tp, ops);
  memset(s->d_atty, 0, (size_t)N * width * sizeof(float));
  ops->matmul_backward(s->d_atty, g->attn_proj_w, NULL, d_out, a->atty, w->attn_proj_w, N, width, h);
  memset(s->d_qkv, 0, (size_t)N * 3 * width * sizeof(float));
  ops->attention_backward(s->d_qkv, s->d_att, s->d_atty, a->qkv, a->att, &as, &d_probs);
  memset(s->d_ln, 0, Nh * sizeof(float));
  ops->matmul_backward(s->d_ln, g->c_attn_w, g->c_attn_b, s->d_qkv, a->ln_1, w->c_attn_w, N, h, 3 * width);
  enter_and_norm_backward(dres, g->ln_1_w, g->ln_1_b, s, x, w->ln_1_w, a->ln_1_mean, a->ln_1_rstd, n, shape, tp, ops);
}
