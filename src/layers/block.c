/* Transformer block forward and hand-written backward over the op table. */
#include <string.h>
#include "layers/block.h"
#include "core/rng.h"

loom_dropout loom_dropout_for(const loom_block_dropout *d, int site) {
  uint64_t stream = loom_hash_u64(loom_hash_u64(loom_hash_u64(0x100Du, (uint64_t)d->step),
                                                (uint64_t)d->layer), (uint64_t)site);
  return (loom_dropout){.p = d->p, .seed = d->seed, .stream = stream, .sample_offset = d->sample_offset};
}

static loom_attn_shape attn_shape(const loom_block_shape *s) {
  return (loom_attn_shape){.T = s->T, .B = s->B, .heads = s->heads, .head_dim = s->head_dim,
                           .head_offset = 0, .total_heads = s->heads};
}

void loom_block_forward(loom_block_acts *a, loom_block_scratch *s, const float *x,
                        const loom_block_weights *w, const loom_block_shape *shape,
                        const loom_block_dropout *drop, const loom_ops *ops) {
  const int T = shape->T, B = shape->B, N = T * B, h = shape->hidden, f = shape->ffn;
  const int qkv_width = 3 * shape->heads * shape->head_dim, attn_width = shape->heads * shape->head_dim;
  const loom_attn_shape as = attn_shape(shape);
  const loom_dropout d_probs = loom_dropout_for(drop, LOOM_SITE_ATTN_PROBS);
  const loom_dropout d_attn = loom_dropout_for(drop, LOOM_SITE_ATTN_OUT);
  const loom_dropout d_mlp = loom_dropout_for(drop, LOOM_SITE_MLP_OUT);

  ops->layernorm_forward(a->ln_1, a->ln_1_mean, a->ln_1_rstd, x, w->ln_1_w, w->ln_1_b, N, h, shape->norm_eps);
  ops->matmul_forward(a->qkv, a->ln_1, w->c_attn_w, w->c_attn_b, N, h, qkv_width);
  ops->attention_forward(a->atty, a->att, a->qkv, &as, &d_probs);
  ops->matmul_forward(s->branch, a->atty, w->attn_proj_w, w->attn_proj_b, N, attn_width, h);
  ops->dropout_forward(s->branch, T, B, h, &d_attn);
  ops->add(a->res_attn, x, s->branch, (size_t)N * h);

  ops->layernorm_forward(a->ln_2, a->ln_2_mean, a->ln_2_rstd, a->res_attn, w->ln_2_w, w->ln_2_b, N, h, shape->norm_eps);
  ops->matmul_forward(a->fc, a->ln_2, w->c_fc_w, w->c_fc_b, N, h, f);
  ops->gelu_forward(a->fc_gelu, a->fc, (size_t)N * f);
  ops->matmul_forward(s->branch, a->fc_gelu, w->mlp_proj_w, w->mlp_proj_b, N, f, h);
  ops->dropout_forward(s->branch, T, B, h, &d_mlp);
  ops->add(a->out, a->res_attn, s->branch, (size_t)N * h);
}

/* Grad flowing into a residual branch: dres itself, or a masked copy under dropout. */
static const float *branch_grad(float *copy, const float *dres, int T, int B, int h,
                                const loom_dropout *d, const loom_ops *ops) {
  if (d->p <= 0.0f) return dres;
  memcpy(copy, dres, (size_t)T * B * h * sizeof(float));
  ops->dropout_backward(copy, T, B, h, d);
  return copy;
}

void loom_block_backward(float *dres, loom_block_weights *g, loom_block_scratch *s,
                         const loom_block_acts *a, const float *x, const loom_block_weights *w,
                         const loom_block_shape *shape, const loom_block_dropout *drop,
                         const loom_ops *ops) {
  const int T = shape->T, B = shape->B, N = T * B, h = shape->hidden, f = shape->ffn;
  const int qkv_width = 3 * shape->heads * shape->head_dim, attn_width = shape->heads * shape->head_dim;
  const size_t nh = (size_t)N * h, nf = (size_t)N * f;
  const loom_attn_shape as = attn_shape(shape);
  const loom_dropout d_probs = loom_dropout_for(drop, LOOM_SITE_ATTN_PROBS);
  const loom_dropout d_attn = loom_dropout_for(drop, LOOM_SITE_ATTN_OUT);
  const loom_dropout d_mlp = loom_dropout_for(drop, LOOM_SITE_MLP_OUT);

  /* MLP branch; dres becomes the grad of res_attn. */
  const float *d_mlp_out = branch_grad(s->branch, dres, T, B, h, &d_mlp, ops);
  memset(s->d_fc2, 0, nf * sizeof(float));
  ops->matmul_backward(s->d_fc2, g->mlp_proj_w, g->mlp_proj_b, d_mlp_out, a->fc_gelu, w->mlp_proj_w, N, f, h);
  memset(s->d_fc, 0, nf * sizeof(float));
  ops->gelu_backward(s->d_fc, s->d_fc2, a->fc, nf);
  memset(s->d_ln, 0, nh * sizeof(float));
  ops->matmul_backward(s->d_ln, g->c_fc_w, g->c_fc_b, s->d_fc, a->ln_2, w->c_fc_w, N, h, f);
  ops->layernorm_backward(dres, g->ln_2_w, g->ln_2_b, s->d_ln, a->res_attn, w->ln_2_w,
                          a->ln_2_mean, a->ln_2_rstd, N, h);

  /* Attention branch; dres becomes the grad of x. */
  const float *d_attn_out = branch_grad(s->branch, dres, T, B, h, &d_attn, ops);
  memset(s->d_atty, 0, (size_t)N * attn_width * sizeof(float));
  ops->matmul_backward(s->d_atty, g->attn_proj_w, g->attn_proj_b, d_attn_out, a->atty, w->attn_proj_w, N, attn_width, h);
  memset(s->d_qkv, 0, (size_t)N * qkv_width * sizeof(float));
  ops->attention_backward(s->d_qkv, s->d_att, s->d_atty, a->qkv, a->att, &as, &d_probs);
  memset(s->d_ln, 0, nh * sizeof(float));
  ops->matmul_backward(s->d_ln, g->c_attn_w, g->c_attn_b, s->d_qkv, a->ln_1, w->c_attn_w, N, h, qkv_width);
  ops->layernorm_backward(dres, g->ln_1_w, g->ln_1_b, s->d_ln, x, w->ln_1_w, a->ln_1_mean,
                          a->ln_1_rstd, N, h);
}
