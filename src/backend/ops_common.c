/* The shared op semantics (backend/op_math.h) as functions, for the C backends. */
#include "backend/op_math.h"
#include "core/check.h"

float loom_gelu_value(float x) { return loom_gelu_value_at(x); }
float loom_gelu_grad(float x) { return loom_gelu_grad_at(x); }

int loom_dropout_keep(const loom_dropout *d, uint64_t index) {
  return loom_dropout_keep_at(d->p, d->seed, d->stream, index);
}

uint64_t loom_dropout_index(const loom_dropout *d, int t, int b, int c, int T, int C) {
  return loom_dropout_index_at(d->sample_offset, d->seq_offset, d->seq_total, d->cp, d->cp_rank, t, b, c, T, C);
}

void loom_attn_shape_check(const loom_attn_shape *s) { LOOM_CHECK(loom_attn_shape_valid(s), LOOM_ATTN_SHAPE_RULE); }

uint64_t loom_attn_dropout_index(const loom_dropout *d, const loom_attn_shape *s, int b, int h,
                                 int tq, int tk) {
  return loom_attn_dropout_index_at(d->sample_offset, s->head_offset, s->total_heads, s->T, b, h, tq, tk);
}

int loom_row_argmax(const float *z, int V) {
  int best = V > 0 ? 0 : -1;
  for (int v = 1; v < V; v++)
    if (z[v] > z[best]) best = v;
  return best;
}

void loom_host_sumsq_batch(const loom_ops *be, const float *const *x, const size_t *n, int count, double *out) {
  for (int i = 0; i < count; i++) out[i] = be->sumsq(be, x[i], n[i]);
}

void loom_host_crossentropy_losses(const loom_ops *be, float *losses, const float *lse, const float *picked, const int *targets, int N) {
  for (int i = 0; i < N; i++) losses[i] = targets[i] < 0 ? 0.0f : lse[i] - picked[i];
}

void loom_host_exp_shifted(const loom_ops *be, float *x, const float *shift, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = expf(x[i] - shift[i]); /* 0 for a rank with no vocab (-inf) */
}

void loom_host_log_shifted(const loom_ops *be, float *x, const float *shift, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = shift[i] + logf(x[i]);
}

static double column_dot(const float *x, int n, int r, int a, int b) {
  double dot = 0.0;
  for (int k = 0; k < n; k++) dot += (double)x[(size_t)k * r + a] * x[(size_t)k * r + b];
  return dot;
}

/* Two passes of projections ("twice is enough": one leaves a nearly
 * dependent column far from orthogonal). */
void loom_host_orthonormalize(const loom_ops *be, float *x, int n, int r) {
  for (int j = 0; j < r; j++) {
    const double before = column_dot(x, n, r, j, j);
    for (int pass = 0; pass < 2; pass++)
      for (int i = 0; i < j; i++) {
        const double dot = column_dot(x, n, r, i, j);
        for (int k = 0; k < n; k++) x[(size_t)k * r + j] -= (float)(dot * x[(size_t)k * r + i]);
      }
    const double scale = loom_orthonormal_scale(before, column_dot(x, n, r, j, j));
    for (int k = 0; k < n; k++) x[(size_t)k * r + j] = (float)(x[(size_t)k * r + j] * scale);
  }
}

/* Row (b, h, t) of out[T,B,H*Dv] and lse[B,H,T]. */
static float *sink_out_row(float *out, const loom_attn_shape *s, int b, int h, int t) {
  return out + ((size_t)t * s->B + b) * loom_attn_out_width(s) + (size_t)h * loom_attn_v_dim(s);
}

void loom_host_attention_sink_forward(const loom_ops *be, float *out, float *lse, const float *sinks, const loom_attn_shape *s) {
  for (int b = 0; b < s->B; b++)
    for (int h = 0; h < s->heads; h++)
      for (int t = 0; t < s->T; t++) {
        float *l = lse + ((size_t)b * s->heads + h) * s->T + t, *o = sink_out_row(out, s, b, h, t);
        const float joined = loom_sink_joined_lse(*l, sinks ? sinks[h] : 0.0f);
        const float scale = *l == -INFINITY ? 0.0f : expf(*l - joined);
        for (int d = 0; d < loom_attn_v_dim(s); d++) o[d] *= scale;
        *l = joined;
      }
}

void loom_host_attention_sink_backward(const loom_ops *be, float *dsinks, const float *dout, const float *out, const float *lse,
                                       const float *sinks, const loom_attn_shape *s) {
  for (int h = 0; h < s->heads; h++) {
    double grad = 0.0;
    for (int b = 0; b < s->B; b++)
      for (int t = 0; t < s->T; t++) {
        const float *dy = sink_out_row((float *)dout, s, b, h, t), *o = sink_out_row((float *)out, s, b, h, t);
        double dot = 0.0;
        for (int d = 0; d < loom_attn_v_dim(s); d++) dot += (double)dy[d] * o[d];
        grad -= exp((double)(sinks ? sinks[h] : 0.0f) - lse[((size_t)b * s->heads + h) * s->T + t]) * dot;
      }
    dsinks[h] += (float)grad;
  }
}
