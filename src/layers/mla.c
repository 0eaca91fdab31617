/* Multi-head latent attention's projections (see mla.h). */
#include "core/check.h"
#include "layers/block.h"
#include "layers/mla.h"
#include "tensor_parallel/linear.h"
#include "tensor_parallel/mappings.h"

/* The sizes a call works in: rows inside and outside the region, and the row widths. */
typedef struct {
  int N, n, D, KV;  /* rows; a q or k head's width; a kv up projection head's (nope + v) */
  size_t qkv, f;    /* an attention row's floats; a float's bytes */
} sizes;

static sizes sizes_of(const loom_mla_shape *m, int T, int B, int heads, const loom_tp *tp) {
  const int D = loom_mla_qk_head(m);
  return (sizes){.N = T * B, .n = loom_tp_local_rows(tp, T) * B, .D = D, .KV = m->nope + m->v,
                 .qkv = (size_t)heads * (2 * D + m->v), .f = sizeof(float)};
}

/* bf16 runs keep every activation and its grad as bf16 values (block.c's rule). */
static void round_values(const loom_mla_shape *m, const loom_ops *ops, float *x, size_t n) {
  if (m->bf16) ops->round_bf16(ops, x, n);
}

/* The rows [0, rows) of W [.., h] from row `first`: a sub-block of a weight, fp32 or bits. */
static loom_linear_weight rows_from(loom_linear_weight w, int first, int h) {
  const size_t at = (size_t)first * h;
  return w.bf16 ? (loom_linear_weight){.bf16 = w.bf16 + at, .fp8 = w.fp8} : (loom_linear_weight){.f32 = w.f32 + at};
}

/* The W_kva rows, after W_qa's q_rank: the kv latent's, then the RoPE key's. */
static int kv_row(const loom_mla_shape *m) { return m->q_rank; }
static int pe_row(const loom_mla_shape *m) { return m->q_rank + m->kv_rank; }

/* This rank's rows of x as backward reads them: x brought into the region
 * holds every rank's under SP (q's input without a latent), else its first
 * n rows hold them. */
static loom_bf16_operand local_x(loom_mla_input kept, const loom_mla_shape *m, const sizes *z, int h, const loom_tp *tp) {
  const size_t at = m->q_rank == 0 && z->n < z->N ? (size_t)tp->rank * z->n * h : 0;
  return kept.bits ? loom_bf16_bits(kept.bits + at) : loom_bf16_values(kept.full + at);
}

void loom_mla_forward(float *qkv, loom_mla_acts *a, loom_mla_scratch *s, loom_mla_input kept, const float *x,
                      const loom_block_weights *v, const loom_mla_weights *cw, const loom_mla_shape *m, int T, int B,
                      int h, int heads, float eps, loom_rope rope, const loom_tp *tp, const loom_ops *ops) {
  const sizes z = sizes_of(m, T, B, heads, tp);
  const loom_bf16_operand xv = loom_bf16_values(x);
  /* q: through its latent, or straight from x (brought into the region as a column-parallel linear's input) */
  if (m->q_rank) {
    if (kept.bits) ops->to_bf16(ops, kept.bits, x, (size_t)z.n * h);
    else if (x != kept.full) ops->mem->copy(ops->mem, kept.full, x, (size_t)z.n * h * z.f);
    loom_linear_forward(ops, a->q_raw, xv, cw->down, NULL, z.n, h, m->q_rank);
    round_values(m, ops, a->q_raw, (size_t)z.n * m->q_rank);
    ops->rmsnorm_forward(ops, s->local, a->rstd, a->q_raw, v->mla_q_norm_w, z.n, m->q_rank, eps);
    round_values(m, ops, s->local, (size_t)z.n * m->q_rank);
    loom_column_parallel_forward(tp, ops, s->q, a->q_in, s->local, NULL, cw->q_up, NULL, z.N, z.n, m->q_rank, heads * z.D);
  } else {
    loom_column_parallel_forward(tp, ops, s->q, kept.full, x, kept.bits, cw->q_up, NULL, z.N, z.n, h, heads * z.D);
  }
  round_values(m, ops, s->q, (size_t)z.N * heads * z.D);
  /* keys and values through their latent; the RoPE key beside it */
  loom_linear_forward(ops, a->kv_raw, xv, rows_from(cw->down, kv_row(m), h), NULL, z.n, h, m->kv_rank);
  round_values(m, ops, a->kv_raw, (size_t)z.n * m->kv_rank);
  ops->rmsnorm_forward(ops, s->local, a->rstd + z.n, a->kv_raw, v->mla_kv_norm_w, z.n, m->kv_rank, eps);
  round_values(m, ops, s->local, (size_t)z.n * m->kv_rank);
  loom_column_parallel_forward(tp, ops, s->kv, a->kv_in, s->local, NULL, cw->kv_up, NULL, z.N, z.n, m->kv_rank, heads * z.KV);
  round_values(m, ops, s->kv, (size_t)z.N * heads * z.KV);
  loom_linear_forward(ops, s->local, xv, rows_from(cw->down, pe_row(m), h), NULL, z.n, h, m->rope);
  round_values(m, ops, s->local, (size_t)z.n * m->rope);
  loom_tp_enter_forward(tp, ops, s->local, s->pe, (size_t)z.n * m->rope);
  /* RoPE on each q head's last rope dims (rows [t, b * heads + head]) and on the shared key */
  loom_rope_rows(tp, ops, s->q + m->nope, T, B * heads, z.D, 1, m->rope, rope, false);
  loom_rope_rows(tp, ops, s->pe, T, B, m->rope, 1, m->rope, rope, false);
  round_values(m, ops, s->q, (size_t)z.N * heads * z.D);
  round_values(m, ops, s->pe, (size_t)z.N * m->rope);
  /* the attention's rows: q | each head's k_nope beside pe | each head's v */
  const size_t f = z.f, row = z.qkv * f;
  float *k = qkv + (size_t)heads * z.D, *vs = k + (size_t)heads * z.D;
  ops->mem->copy_2d(ops->mem, qkv, row, s->q, (size_t)heads * z.D * f, (size_t)heads * z.D * f, (size_t)z.N);
  for (int j = 0; j < heads; j++) {
    const float *kv = s->kv + (size_t)j * z.KV;
    ops->mem->copy_2d(ops->mem, k + (size_t)j * z.D, row, kv, (size_t)heads * z.KV * f, (size_t)m->nope * f, (size_t)z.N);
    ops->mem->copy_2d(ops->mem, k + (size_t)j * z.D + m->nope, row, s->pe, (size_t)m->rope * f, (size_t)m->rope * f, (size_t)z.N);
    ops->mem->copy_2d(ops->mem, vs + (size_t)j * m->v, row, kv + m->nope, (size_t)heads * z.KV * f, (size_t)m->v * f, (size_t)z.N);
  }
}

void loom_mla_backward(float *dx, float *dfull, loom_block_weights *g, loom_mla_scratch *s, const loom_mla_acts *a,
                       float *dqkv, loom_mla_input kept, const loom_block_weights *v, const loom_mla_weights *cw,
                       const loom_mla_shape *m, int T, int B, int h, int heads, loom_rope rope, const loom_tp *tp,
                       const loom_ops *ops) {
  const sizes z = sizes_of(m, T, B, heads, tp);
  const size_t f = z.f, row = z.qkv * f;
  const loom_bf16_operand x = local_x(kept, m, &z, h, tp);
  round_values(m, ops, dqkv, (size_t)z.N * z.qkv);
  /* the attention rows' grads apart: q's, each head's k_nope and v into the kv up projection's, pe's summed over the heads */
  const float *dk = dqkv + (size_t)heads * z.D, *dv = dk + (size_t)heads * z.D;
  ops->mem->copy_2d(ops->mem, s->q, (size_t)heads * z.D * f, dqkv, row, (size_t)heads * z.D * f, (size_t)z.N);
  loom_mem_zero(ops->mem, s->pe, (size_t)z.N * m->rope);
  for (int j = 0; j < heads; j++) {
    float *dkv = s->kv + (size_t)j * z.KV;
    ops->mem->copy_2d(ops->mem, dkv, (size_t)heads * z.KV * f, dk + (size_t)j * z.D, row, (size_t)m->nope * f, (size_t)z.N);
    ops->mem->copy_2d(ops->mem, dkv + m->nope, (size_t)heads * z.KV * f, dv + (size_t)j * m->v, row, (size_t)m->v * f,
                      (size_t)z.N);
    ops->mem->copy_2d(ops->mem, s->pe_head, (size_t)m->rope * f, dk + (size_t)j * z.D + m->nope, row, (size_t)m->rope * f,
                      (size_t)z.N);
    ops->add(ops, s->pe, s->pe, s->pe_head, (size_t)z.N * m->rope);
  }
  round_values(m, ops, s->pe, (size_t)z.N * m->rope);
  loom_rope_rows(tp, ops, s->q + m->nope, T, B * heads, z.D, 1, m->rope, rope, true);
  loom_rope_rows(tp, ops, s->pe, T, B, m->rope, 1, m->rope, rope, true);
  round_values(m, ops, s->q, (size_t)z.N * heads * z.D);
  round_values(m, ops, s->pe, (size_t)z.N * m->rope);
  /* q's up projection, leaving the region; then its latent's norm and down projection (dx written first) */
  if (m->q_rank) {
    loom_column_parallel_backward(tp, ops, s->local, s->full, g->mla_q_up_w, NULL, s->q, NULL, loom_bf16_values(a->q_in),
                                  cw->q_up, z.N, z.n, m->q_rank, heads * z.D);
    round_values(m, ops, s->local, (size_t)z.n * m->q_rank);
    loom_mem_zero(ops->mem, s->local2, (size_t)z.n * m->q_rank);
    ops->rmsnorm_backward(ops, s->local2, g->mla_q_norm_w, s->local, a->q_raw, v->mla_q_norm_w, a->rstd, z.n, m->q_rank);
    round_values(m, ops, s->local2, (size_t)z.n * m->q_rank);
    loom_mem_zero(ops->mem, dx, (size_t)z.n * h);
    loom_linear_backward(ops, dx, g->mla_down_w, NULL, loom_bf16_values(s->local2), x, cw->down, z.n, h, m->q_rank);
  } else {
    loom_column_parallel_backward(tp, ops, dx, dfull, g->mla_q_up_w, NULL, s->q, NULL,
                                  kept.bits ? loom_bf16_bits(kept.bits) : loom_bf16_values(kept.full), cw->q_up, z.N, z.n,
                                  h, heads * z.D);
  }
  /* the kv latent's, the same way */
  loom_column_parallel_backward(tp, ops, s->local, s->full, g->mla_kv_up_w, NULL, s->kv, NULL, loom_bf16_values(a->kv_in),
                                cw->kv_up, z.N, z.n, m->kv_rank, heads * z.KV);
  round_values(m, ops, s->local, (size_t)z.n * m->kv_rank);
  loom_mem_zero(ops->mem, s->local2, (size_t)z.n * m->kv_rank);
  ops->rmsnorm_backward(ops, s->local2, g->mla_kv_norm_w, s->local, a->kv_raw, v->mla_kv_norm_w, a->rstd + z.n, z.n,
                        m->kv_rank);
  round_values(m, ops, s->local2, (size_t)z.n * m->kv_rank);
  loom_linear_backward(ops, dx, g->mla_down_w + (size_t)kv_row(m) * h, NULL, loom_bf16_values(s->local2), x,
                       rows_from(cw->down, kv_row(m), h), z.n, h, m->kv_rank);
  /* the RoPE key's: every rank's heads' parts summed, then its down projection */
  loom_tp_enter_backward(tp, ops, s->pe, s->local, (size_t)z.n * m->rope);
  round_values(m, ops, s->local, (size_t)z.n * m->rope);
  loom_linear_backward(ops, dx, g->mla_down_w + (size_t)pe_row(m) * h, NULL, loom_bf16_values(s->local), x,
                       rows_from(cw->down, pe_row(m), h), z.n, h, m->rope);
}
