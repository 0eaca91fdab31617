/* Transformer block forward and hand-written backward: ops for the local
 * math, tensor_parallel/linear.h for the column- and row-parallel linears. */
#include "core/check.h"
#include "core/rng.h"
#include "layers/block.h"
#include "tensor_parallel/linear.h"
#include "tensor_parallel/mappings.h"

loom_dropout loom_dropout_for(const loom_block_dropout *d, int site, int T, const loom_tp *tp) {
  uint64_t stream = loom_hash_u64(loom_hash_u64(loom_hash_u64(0x100Du, (uint64_t)d->step),
                                                (uint64_t)d->layer), (uint64_t)site);
  const int local_T = loom_tp_local_rows(tp, T), cp = loom_tp_cp(tp);
  return (loom_dropout){.p = d->p, .seed = d->seed, .stream = stream, .sample_offset = d->sample_offset,
                        .seq_offset = local_T == T ? 0 : tp->rank * local_T, .seq_total = T * cp, .cp = cp,
                        .cp_rank = tp->cp_rank};
}

static loom_attn_shape attn_shape(const loom_block_shape *s) {
  return (loom_attn_shape){.T = s->T, .B = s->B, .heads = s->heads, .kv_heads = s->kv_heads, .head_dim = s->head_dim,
                           .v_head_dim = s->v_head_dim, .softmax_scale = s->softmax_scale,
                           .head_offset = s->head_offset, .total_heads = s->total_heads, .window = s->window};
}

/* bf16 runs keep every activation and activation grad as bf16 values: each
 * op's output is rounded before the next op reads it, as a bf16 tensor
 * would be. Norm statistics and weight grads stay fp32. */
static void to_bf16_values(const loom_block_shape *shape, const loom_ops *ops, float *x, size_t n) {
  if (shape->bf16) ops->round_bf16(ops, x, n);
}

/* The same after an op that may have changed nothing (RoPE without
 * rotary positions, dropout at p 0): x then holds bf16 values already. */
static void to_bf16_values_if(bool changed, const loom_block_shape *shape, const loom_ops *ops, float *x, size_t n) {
  if (changed) to_bf16_values(shape, ops, x, n);
}

void loom_norm_forward(const loom_ops *ops, loom_norm_kind kind, float eps, float *out, float *mean, float *rstd,
                       const float *x, const float *w, const float *b, int n, int h) {
  if (kind == LOOM_NORM_RMSNORM) ops->rmsnorm_forward(ops, out, rstd, x, w, n, h, eps);
  else ops->layernorm_forward(ops, out, mean, rstd, x, w, b, n, h, eps);
}

void loom_norm_backward(const loom_ops *ops, loom_norm_kind kind, float *dx, float *dw, float *db, const float *dout,
                        const float *x, const float *w, const float *mean, const float *rstd, int n, int h) {
  if (kind == LOOM_NORM_RMSNORM) ops->rmsnorm_backward(ops, dx, dw, dout, x, w, rstd, n, h);
  else ops->layernorm_backward(ops, dx, dw, db, dout, x, w, mean, rstd, n, h);
}

/* A MoE layer's groups: the ranks its micro-batch is spread over along the
 * sequence (the tensor-parallel group under sequence parallelism, the
 * context-parallel group, or both; without them every rank of the tp group
 * routes the same tokens alike), and the expert-parallel group. */
static loom_moe_groups moe_groups(const loom_tp *tp) {
  return (loom_moe_groups){.seq = tp->seq_group, .ep = tp->ep_group, .etp = tp->etp_group};
}

void loom_rope_rows(const loom_tp *tp, const loom_ops *ops, float *x, int T, int Bx, int stride, int heads, int D,
                    loom_rope rope, bool backward) {
  void (*turn)(const loom_ops *, float *, int, int, int, int, int, int, loom_rope) =
      backward ? ops->rope_backward : ops->rope_forward;
  const int cp = loom_tp_cp(tp);
  loom_cp_run runs[2];
  const int n = loom_cp_runs(cp, tp->cp_rank, T * cp, 0, T, runs);
  for (int i = 0; i < n; i++) turn(ops, x + (size_t)runs[i].row * Bx * stride, runs[i].rows, Bx, stride, heads, D, runs[i].pos, rope);
}

/* RoPE over the q and k heads of each qkv row (they lie first, side by side). */
static void rope(const loom_block_shape *s, const loom_tp *tp, const loom_ops *ops, float *qkv, bool backward) {
  if (s->rope.theta > 0.0f)
    loom_rope_rows(tp, ops, qkv, s->T, s->B, loom_block_qkv_width(s), s->heads + s->kv_heads, s->head_dim, s->rope, backward);
}

/* QK-norm: RMSNorm over each head's q and k, with the weights of each
 * (Qwen3's q_norm and k_norm, eps the model's). The heads lie in qkv's
 * rows; the norm runs over the rows of D they make once gathered side by
 * side (q's, then k's), its input and statistics kept for backward. */
typedef struct {
  size_t rows, q, k, width; /* [t, b] rows; floats of a row's q heads, k heads, and the whole qkv row */
} qk_layout;

static qk_layout qk_layout_of(const loom_block_shape *s) {
  return (qk_layout){.rows = (size_t)s->T * s->B, .q = (size_t)s->heads * s->head_dim,
                     .k = (size_t)s->kv_heads * s->head_dim, .width = (size_t)loom_block_qkv_width(s)};
}

/* Moves the q and k heads between qkv's rows and the gathered layout, either way. */
static void qk_gather(const loom_ops *ops, const qk_layout *L, float *gathered, const float *qkv) {
  const size_t f = sizeof(float);
  ops->mem->copy_2d(ops->mem, gathered, L->q * f, qkv, L->width * f, L->q * f, L->rows);
  ops->mem->copy_2d(ops->mem, gathered + L->rows * L->q, L->k * f, qkv + L->q, L->width * f, L->k * f, L->rows);
}

static void qk_scatter(const loom_ops *ops, const qk_layout *L, float *qkv, const float *gathered) {
  const size_t f = sizeof(float);
  ops->mem->copy_2d(ops->mem, qkv, L->width * f, gathered, L->q * f, L->q * f, L->rows);
  ops->mem->copy_2d(ops->mem, qkv + L->q, L->width * f, gathered + L->rows * L->q, L->k * f, L->k * f, L->rows);
}

static void qk_norm_forward(loom_block_acts *a, loom_block_scratch *s, const loom_block_weights *v,
                            const loom_block_shape *shape, const loom_ops *ops) {
  const qk_layout L = qk_layout_of(shape);
  const int D = shape->head_dim, qh = (int)L.rows * shape->heads, kh = (int)L.rows * shape->kv_heads;
  qk_gather(ops, &L, a->qk_raw, a->qkv);
  ops->rmsnorm_forward(ops, s->qk_norm, a->qk_rstd, a->qk_raw, v->q_norm_w, qh, D, shape->norm_eps);
  ops->rmsnorm_forward(ops, s->qk_norm + L.rows * L.q, a->qk_rstd + qh, a->qk_raw + L.rows * L.q, v->k_norm_w, kh, D,
                       shape->norm_eps);
  to_bf16_values(shape, ops, s->qk_norm, L.rows * (L.q + L.k));
  qk_scatter(ops, &L, a->qkv, s->qk_norm);
}

/* dqkv's q and k columns, the grads of the norm's output, become its input's; its weights' grads are added. */
static void qk_norm_backward(float *dqkv, loom_block_weights *g, loom_block_scratch *s, const loom_block_acts *a,
                             const loom_block_weights *v, const loom_block_shape *shape, const loom_ops *ops) {
  const qk_layout L = qk_layout_of(shape);
  const int D = shape->head_dim, qh = (int)L.rows * shape->heads, kh = (int)L.rows * shape->kv_heads;
  const size_t n = L.rows * (L.q + L.k), kq = L.rows * L.q;
  float *d_out = s->qk_norm, *d_in = s->qk_norm + n;
  qk_gather(ops, &L, d_out, dqkv);
  loom_mem_zero(ops->mem, d_in, n);
  ops->rmsnorm_backward(ops, d_in, g->q_norm_w, d_out, a->qk_raw, v->q_norm_w, a->qk_rstd, qh, D);
  ops->rmsnorm_backward(ops, d_in + kq, g->k_norm_w, d_out + kq, a->qk_raw + kq, v->k_norm_w, a->qk_rstd + qh, kh, D);
  qk_scatter(ops, &L, dqkv, d_in);
}

/* Attention of the rank's queries, alone or round the cp group's ring
 * (whose calls see the whole sequence's length, for dropout's keys). */
static void attention_forward(loom_block_acts *a, loom_block_scratch *s, const loom_attn_shape *as, const loom_dropout *d,
                              const loom_ops *ops) {
  if (!s->ring.group) {
    ops->attention_forward(ops, a->atty, a->att_lse, a->qkv, as, d);
    return;
  }
  loom_attn_shape whole = *as;
  whole.T = as->T * loom_comm_size(s->ring.group);
  loom_ring_pack_kv(ops, s->ring.kv[0], a->qkv, as->T, as);
  loom_ring_attention_forward(ops, &s->ring, a->atty, a->att_lse, a->qkv, &whole, d);
}

static void attention_backward(float *dqkv, const loom_block_acts *a, loom_block_scratch *s, const loom_attn_shape *as,
                               const loom_dropout *d, const loom_ops *ops) {
  if (!s->ring.group) {
    ops->attention_backward(ops, dqkv, s->d_atty, a->atty, a->qkv, a->att_lse, as, d);
    return;
  }
  loom_attn_shape whole = *as;
  whole.T = as->T * loom_comm_size(s->ring.group);
  loom_ring_pack_kv(ops, s->ring.kv[0], a->qkv, as->T, as);
  loom_ring_attention_backward(ops, &s->ring, dqkv, s->d_atty, a->atty, a->qkv, a->att_lse, &whole, d);
}

/* x[n] packed into bits (bf16 runs), where the GEMMs will read it. */
static void pack(const loom_ops *ops, uint16_t *bits, const float *x, size_t n) {
  if (bits) ops->to_bf16(ops, bits, x, n);
}

/* The grad of a residual branch: dres itself, or a masked copy under dropout. */
static const float *branch_grad(float *copy, const float *dres, int n, const loom_dropout *drop,
                                const loom_block_shape *shape, const loom_ops *ops) {
  if (drop->p <= 0.0f) return dres;
  ops->mem->copy(ops->mem, copy, dres, (size_t)n * shape->hidden * sizeof(float));
  ops->dropout_backward(ops, copy, n / shape->B, shape->B, shape->hidden, drop);
  to_bf16_values(shape, ops, copy, (size_t)n * shape->hidden);
  return copy;
}

void loom_block_forward(loom_block_acts *a, loom_block_scratch *s, const float *x,
                        const loom_block_compute_weights *w, const loom_block_shape *shape,
                        const loom_block_dropout *drop, const loom_tp *tp, const loom_ops *ops) {
  const int T = shape->T, B = shape->B, N = T * B, n = loom_tp_local_rows(tp, T) * B, h = shape->hidden;
  const int width = loom_block_attn_width(shape), qkv = loom_block_qkv_width(shape), f = shape->ffn;
  const int fc = loom_block_fc_width(shape);
  const loom_attn_shape as = attn_shape(shape);
  const loom_dropout d_probs = loom_dropout_for(drop, LOOM_SITE_ATTN_PROBS, T, tp);
  const loom_dropout d_attn = loom_dropout_for(drop, LOOM_SITE_ATTN_OUT, T, tp);
  const loom_dropout d_mlp = loom_dropout_for(drop, LOOM_SITE_MLP_OUT, T, tp);
  /* Without SP the norm writes straight into the region's saved input, and
   * the row-parallel output is reduced in place. bf16 runs save that input
   * as bits alone: the norm writes into scratch, the linear packs it. */
  float *normed = tp->sequence_parallel || shape->bf16 ? s->local : NULL;
  float *branch = tp->sequence_parallel ? s->local : s->full;

  LOOM_CHECK(!shape->bf16 || (a->ln_1_bits && a->atty_bits && a->ln_2_bits && a->fc_gelu_bits),
             "a bf16 block keeps its linears' inputs as bits");
  /* Attention: QKV column-parallel (this rank's heads), c_proj row-parallel.
   * In bf16 runs the linears' inputs are packed, not rounded: only the
   * GEMMs read them (atty, which backward reads too, is both). */
  const size_t nh = (size_t)n * h;
  loom_norm_forward(ops, shape->norm, shape->norm_eps, normed ? normed : a->ln_1, a->ln_1_mean, a->ln_1_rstd, x,
                    w->v->ln_1_w, w->v->ln_1_b, n, h);
  if (shape->mla) {
    loom_mla_forward(a->qkv, &a->mla, &s->mla, (loom_mla_input){a->ln_1, a->ln_1_bits}, normed ? normed : a->ln_1, w->v,
                     &w->mla, shape->mla, T, B, h, shape->heads, shape->norm_eps, shape->rope, tp, ops);
  } else {
    loom_column_parallel_forward(tp, ops, a->qkv, a->ln_1, normed ? normed : a->ln_1, a->ln_1_bits, w->c_attn,
                                 w->v->c_attn_b, N, n, h, qkv);
    to_bf16_values(shape, ops, a->qkv, (size_t)N * qkv);
    if (shape->qk_norm) qk_norm_forward(a, s, w->v, shape, ops);
    rope(shape, tp, ops, a->qkv, false);
    to_bf16_values_if(shape->rope.theta > 0.0f, shape, ops, a->qkv, (size_t)N * qkv);
  }
  attention_forward(a, s, &as, &d_probs, ops);
  if (shape->softmax != LOOM_SOFTMAX_VANILLA) /* once, after every block of a ring */
    ops->attention_sink_forward(ops, a->atty, a->att_lse, shape->softmax == LOOM_SOFTMAX_LEARNABLE ? w->v->sinks : NULL, &as);
  to_bf16_values(shape, ops, a->atty, (size_t)N * width);
  pack(ops, a->atty_bits, a->atty, (size_t)N * width);
  loom_row_parallel_forward(tp, ops, branch, s->full, loom_bf16_kept(a->atty, a->atty_bits), w->attn_proj, w->v->attn_proj_b,
                            N, n, width, h);
  to_bf16_values(shape, ops, branch, nh);
  ops->dropout_forward(ops, branch, n / B, B, h, &d_attn);
  to_bf16_values_if(d_attn.p > 0.0f, shape, ops, branch, nh);
  ops->add(ops, a->res_attn, x, branch, nh);
  to_bf16_values(shape, ops, a->res_attn, nh);

  /* MLP: up (SwiGLU: gate|up) column-parallel, down row-parallel. A MoE
   * layer's experts take this rank's normed rows first (the shared
   * expert's row-parallel output may land where they lie; they read a copy,
   * so without a shared expert they write the branch in their place) and
   * add their output to the shared expert's, if any. */
  loom_norm_forward(ops, shape->norm, shape->norm_eps, normed ? normed : a->ln_2, a->ln_2_mean, a->ln_2_rstd,
                    a->res_attn, w->v->ln_2_w, w->v->ln_2_b, n, h);
  if (shape->moe) loom_moe_forward(&a->moe, &s->moe, f > 0 ? s->moe_out : branch, normed ? normed : a->ln_2, &w->moe,
                                   shape->moe, moe_groups(tp), ops);
  if (f > 0) {
    loom_column_parallel_forward(tp, ops, a->fc, a->ln_2, normed ? normed : a->ln_2, a->ln_2_bits, w->c_fc, w->v->c_fc_b,
                                 N, n, h, fc);
    to_bf16_values(shape, ops, a->fc, (size_t)N * fc);
    if (shape->mlp == LOOM_MLP_SWIGLU) ops->swiglu_forward(ops, a->fc_gelu, a->fc, N, f, shape->glu);
    else ops->gelu_forward(ops, a->fc_gelu, a->fc, (size_t)N * f);
    pack(ops, a->fc_gelu_bits, a->fc_gelu, (size_t)N * f);
    loom_row_parallel_forward(tp, ops, branch, s->full, loom_bf16_kept(a->fc_gelu, a->fc_gelu_bits), w->mlp_proj,
                              w->v->mlp_proj_b, N, n, f, h);
    to_bf16_values(shape, ops, branch, nh);
    if (w->v->shared_gate_w) loom_moe_gate_forward(&a->moe, &s->moe, branch, w->v->shared_gate_w, shape->moe, ops);
  }
  if (shape->moe && f > 0) {
    ops->add(ops, branch, branch, s->moe_out, nh);
    to_bf16_values(shape, ops, branch, nh);
  }
  ops->dropout_forward(ops, branch, n / B, B, h, &d_mlp);
  to_bf16_values_if(d_mlp.p > 0.0f, shape, ops, branch, nh);
  ops->add(ops, a->out, a->res_attn, branch, nh);
  to_bf16_values(shape, ops, a->out, nh);
}

/* The q|k|v projection's backward, input half: the input grad and the bias
 * grad. Replicated key/value heads (tp->kv_group) get grads from this rank's
 * query heads only: their grads are computed apart, summed over the ranks
 * sharing the heads, then added, so every replica holds the whole grad. The
 * input grad needs no such sum: the region's exit adds every rank's part. */
static void qkv_backward_input(float *d_normed, loom_block_weights *g, loom_block_scratch *s, const loom_block_wgrad *ws,
                               const loom_block_acts *a, const loom_block_compute_weights *w, const loom_block_shape *shape,
                               const loom_tp *tp, const loom_ops *ops) {
  const int T = shape->T, B = shape->B, N = T * B, n = loom_tp_local_rows(tp, T) * B, h = shape->hidden;
  const int rows = loom_block_qkv_width(shape), q_rows = shape->heads * shape->head_dim;
  const bool apart = tp->kv_group && g->c_attn_b; /* the bias grad is computed apart, then summed */
  float *db = apart ? s->d_qkv_w + (size_t)rows * h : g->c_attn_b;
  if (apart) loom_mem_zero(ops->mem, db, (size_t)rows);
  loom_column_parallel_backward(tp, ops, d_normed, s->d_ln, NULL, db, ws->d_qkv, ws->d_qkv_bits,
                                loom_bf16_kept(a->ln_1, a->ln_1_bits), w->c_attn, N, n, h, rows);
  if (!apart) return;
  loom_comm_allreduce(tp->kv_group, db + q_rows, (size_t)(rows - q_rows), LOOM_REDUCE_SUM);
  ops->add(ops, g->c_attn_b, g->c_attn_b, db, (size_t)rows);
}

/* Linear k's FP8 state, NULL where the layer's GEMMs are bf16. */
static loom_fp8_site *fp8_of(const loom_block_shape *shape, int k) { return shape->fp8 ? &shape->fp8[k] : NULL; }

/* Its weight half, with the same sum for replicated key/value heads. */
static void qkv_backward_weight(loom_block_weights *g, loom_block_scratch *s, const loom_block_wgrad *ws,
                                const loom_block_acts *a, const loom_block_shape *shape, const loom_tp *tp,
                                const loom_ops *ops) {
  const int N = shape->T * shape->B, h = shape->hidden;
  const int rows = loom_block_qkv_width(shape), q_rows = shape->heads * shape->head_dim;
  const loom_bf16_operand dout = loom_bf16_kept(ws->d_qkv, ws->d_qkv_bits), inp = loom_bf16_kept(a->ln_1, a->ln_1_bits);
  if (!tp->kv_group) {
    loom_linear_weight_grad(ops, g->c_attn_w, dout, inp, N, h, rows, shape->bf16, fp8_of(shape, LOOM_FP8_QKV));
    return;
  }
  float *dw = s->d_qkv_w;
  loom_mem_zero(ops->mem, dw, (size_t)rows * h);
  loom_linear_weight_grad(ops, dw, dout, inp, N, h, rows, shape->bf16, fp8_of(shape, LOOM_FP8_QKV));
  loom_comm_allreduce(tp->kv_group, dw + (size_t)q_rows * h, (size_t)(rows - q_rows) * h, LOOM_REDUCE_SUM);
  ops->add(ops, g->c_attn_w, g->c_attn_w, dw, (size_t)rows * h);
}

void loom_block_backward_input(float *dres, loom_block_weights *g, loom_block_scratch *s, const loom_block_wgrad *ws,
                               const loom_block_acts *a, const float *x, const loom_block_compute_weights *w,
                               const loom_block_shape *shape, const loom_block_dropout *drop, const loom_tp *tp,
                               const loom_ops *ops) {
  const int T = shape->T, B = shape->B, N = T * B, n = loom_tp_local_rows(tp, T) * B, h = shape->hidden;
  const int width = loom_block_attn_width(shape), qkv = loom_block_qkv_width(shape), f = shape->ffn;
  const int fc = loom_block_fc_width(shape);
  const size_t Nf = (size_t)N * f;
  const loom_attn_shape as = attn_shape(shape);
  const loom_dropout d_probs = loom_dropout_for(drop, LOOM_SITE_ATTN_PROBS, T, tp);
  const loom_dropout d_attn = loom_dropout_for(drop, LOOM_SITE_ATTN_OUT, T, tp);
  const loom_dropout d_mlp = loom_dropout_for(drop, LOOM_SITE_MLP_OUT, T, tp);
  float *d_normed = tp->sequence_parallel ? s->local : s->d_ln;

  /* MLP branch; dres becomes the grad of res_attn. The down projection's
   * output grad enters the region into ws, where its weight grad finds it
   * (bf16 runs: packed there, as bits alone). The linears'
   * output grads are packed, not rounded, in bf16 runs: only GEMMs and bias
   * grads read them. */
  const size_t nh = (size_t)n * h;
  const float *d_out = branch_grad(s->local2, dres, n, &d_mlp, shape, ops);
  if (f > 0) {
    /* A gated shared expert: its output's grad through the gate, in moe_out (free in backward). */
    const float *d_shared = d_out;
    if (w->v->shared_gate_w) {
      loom_moe_gate_backward(s->moe_out, d_out, &a->moe, &s->moe, shape->moe, ops);
      d_shared = s->moe_out;
    }
    loom_mem_zero(ops->mem, s->d_fc2, Nf);
    loom_row_parallel_backward(tp, ops, s->d_fc2, NULL, g->mlp_proj_b, d_shared, ws->d_mlp, ws->d_mlp_bits,
                               loom_bf16_kept(a->fc_gelu, a->fc_gelu_bits), w->mlp_proj, N, n, f, h);
    to_bf16_values(shape, ops, s->d_fc2, Nf);
    loom_mem_zero(ops->mem, ws->d_fc, (size_t)N * fc);
    if (shape->mlp == LOOM_MLP_SWIGLU) ops->swiglu_backward(ops, ws->d_fc, s->d_fc2, a->fc, N, f, shape->glu);
    else ops->gelu_backward(ops, ws->d_fc, s->d_fc2, a->fc, Nf);
    pack(ops, ws->d_fc_bits, ws->d_fc, (size_t)N * fc);
    loom_column_parallel_backward(tp, ops, d_normed, s->d_ln, NULL, g->c_fc_b, ws->d_fc, ws->d_fc_bits,
                                  loom_bf16_kept(a->ln_2, a->ln_2_bits), w->c_fc, N, n, h, fc);
    if (w->v->shared_gate_w)
      loom_moe_gate_backward_weights(d_normed, g->shared_gate_w, &a->moe, &s->moe, w->v->shared_gate_w, shape->moe, ops);
  } else {
    loom_mem_zero(ops->mem, d_normed, nh);
  }
  /* The router's and experts' weight grads: here, or in the weight half where ws keeps what they need. */
  if (shape->moe)
    loom_moe_backward(d_normed, &(loom_moe_grads){g->router_w, g->router_b, g->experts_fc_w, g->experts_proj_w, g->experts_fc_b, g->experts_proj_b}, d_out,
                      &a->moe, &s->moe, &w->moe,
                      shape->moe, shape->moe_loss_weight, moe_groups(tp), ws->moe.d_fc ? &ws->moe : NULL, ops);
  to_bf16_values(shape, ops, d_normed, nh);
  loom_norm_backward(ops, shape->norm, dres, g->ln_2_w, g->ln_2_b, d_normed, a->res_attn, w->v->ln_2_w, a->ln_2_mean,
                     a->ln_2_rstd, n, h);
  to_bf16_values(shape, ops, dres, nh);

  /* Attention branch; dres becomes the grad of x. */
  d_out = branch_grad(s->local2, dres, n, &d_attn, shape, ops);
  loom_mem_zero(ops->mem, s->d_atty, (size_t)N * width);
  loom_row_parallel_backward(tp, ops, s->d_atty, NULL, g->attn_proj_b, d_out, ws->d_attn, ws->d_attn_bits,
                             loom_bf16_kept(a->atty, a->atty_bits), w->attn_proj, N, n, width, h);
  to_bf16_values(shape, ops, s->d_atty, (size_t)N * width);
  loom_mem_zero(ops->mem, ws->d_qkv, (size_t)N * qkv);
  if (shape->softmax == LOOM_SOFTMAX_LEARNABLE) /* the attention's own backward needs nothing else: out and lse hold the sinks */
    ops->attention_sink_backward(ops, g->sinks, s->d_atty, a->atty, a->att_lse, w->v->sinks, &as);
  attention_backward(ws->d_qkv, a, s, &as, &d_probs, ops);
  if (shape->mla) {
    loom_mla_backward(d_normed, s->d_ln, g, &s->mla, &a->mla, ws->d_qkv, (loom_mla_input){a->ln_1, a->ln_1_bits}, w->v,
                      &w->mla, shape->mla, T, B, h, shape->heads, shape->rope, tp, ops);
  } else {
    if (shape->rope.theta > 0.0f) { /* RoPE's turn reads bf16 values */
      to_bf16_values(shape, ops, ws->d_qkv, (size_t)N * qkv);
      rope(shape, tp, ops, ws->d_qkv, true);
    }
    if (shape->qk_norm) { /* and so does QK-norm's backward */
      to_bf16_values(shape, ops, ws->d_qkv, (size_t)N * qkv);
      qk_norm_backward(ws->d_qkv, g, s, a, w->v, shape, ops);
    }
    pack(ops, ws->d_qkv_bits, ws->d_qkv, (size_t)N * qkv);
    qkv_backward_input(d_normed, g, s, ws, a, w, shape, tp, ops);
  }
  to_bf16_values(shape, ops, d_normed, nh);
  loom_norm_backward(ops, shape->norm, dres, g->ln_1_w, g->ln_1_b, d_normed, x, w->v->ln_1_w, a->ln_1_mean, a->ln_1_rstd,
                     n, h);
  to_bf16_values(shape, ops, dres, nh);
}

void loom_block_backward_weight(loom_block_weights *g, loom_block_scratch *s, const loom_block_wgrad *ws,
                                const loom_block_acts *a, const loom_block_shape *shape, const loom_tp *tp,
                                const loom_ops *ops) {
  const int N = shape->T * shape->B, h = shape->hidden, width = loom_block_attn_width(shape);
  const bool bf16 = shape->bf16;
  if (shape->moe && ws->moe.d_fc)
    loom_moe_backward_weight(&(loom_moe_grads){g->router_w, g->router_b, g->experts_fc_w, g->experts_proj_w, g->experts_fc_b, g->experts_proj_b}, &a->moe,
                             &ws->moe, shape->moe, fp8_of(shape, LOOM_FP8_EXPERTS_FC), fp8_of(shape, LOOM_FP8_EXPERTS_PROJ), ops);
  if (shape->ffn > 0) {
    loom_linear_weight_grad(ops, g->mlp_proj_w, loom_bf16_kept(ws->d_mlp, ws->d_mlp_bits),
                            loom_bf16_kept(a->fc_gelu, a->fc_gelu_bits), N, shape->ffn, h, bf16,
                            fp8_of(shape, LOOM_FP8_MLP_PROJ));
    loom_linear_weight_grad(ops, g->c_fc_w, loom_bf16_kept(ws->d_fc, ws->d_fc_bits), loom_bf16_kept(a->ln_2, a->ln_2_bits),
                            N, h, loom_block_fc_width(shape), bf16, fp8_of(shape, LOOM_FP8_FC));
  }
  loom_linear_weight_grad(ops, g->attn_proj_w, loom_bf16_kept(ws->d_attn, ws->d_attn_bits), loom_bf16_kept(a->atty, a->atty_bits), N,
                          width, h, bf16, fp8_of(shape, LOOM_FP8_ATTN_PROJ));
  if (!shape->mla) qkv_backward_weight(g, s, ws, a, shape, tp, ops); /* MLA's weight grads are all the input half's */
}

void loom_block_backward(float *dres, loom_block_weights *g, loom_block_scratch *s,
                         const loom_block_acts *a, const float *x, const loom_block_compute_weights *w,
                         const loom_block_shape *shape, const loom_block_dropout *drop,
                         const loom_tp *tp, const loom_ops *ops) {
  const loom_block_wgrad ws = {.d_qkv = s->d_qkv, .d_attn = s->d_attn_out, .d_fc = s->d_fc, .d_mlp = s->d_mlp_out,
                               .d_qkv_bits = s->d_qkv_bits, .d_attn_bits = s->d_attn_bits, .d_fc_bits = s->d_fc_bits,
                               .d_mlp_bits = s->d_mlp_bits};
  loom_block_backward_input(dres, g, s, &ws, a, x, w, shape, drop, tp, ops);
  loom_block_backward_weight(g, s, &ws, a, shape, tp, ops);
}
