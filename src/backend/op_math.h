/* Op semantics every backend shares, inline for host C and CUDA kernels:
 * the GELU and SiLU formulas and their derivatives, RoPE's angles, and the
 * keyed dropout mask with its global element indices. One definition keeps the backends in agreement. */
#ifndef LOOM_OP_MATH_H
#define LOOM_OP_MATH_H

#include <math.h>
#include "backend/ops.h"
#include "core/rng_math.h"

#define LOOM_GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

LOOM_HD float loom_gelu_value_at(float x) {
  const float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + tanhf(LOOM_GELU_SCALE * (x + cube)));
}

LOOM_HD float loom_gelu_grad_at(float x) {
  const float cube = 0.044715f * x * x * x;
  const float tanh_out = tanhf(LOOM_GELU_SCALE * (x + cube));
  const float sech2 = 1.0f - tanh_out * tanh_out;
  return 0.5f * (1.0f + tanh_out) + 0.5f * x * sech2 * LOOM_GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

/* A gated linear unit's pieces (loom_glu): the gate and up values as the
 * clamp leaves them, the activation g sigmoid(alpha g) and its derivative
 * (with alpha 1, SiLU's, bit for bit), and whether a value passed the
 * clamp (its grad flows). */
LOOM_HD float loom_glu_gate(float g, loom_glu u) { return u.clamp > 0.0f && g > u.clamp ? u.clamp : g; }
LOOM_HD float loom_glu_up(float x, loom_glu u) {
  const float c = u.clamp > 0.0f ? fminf(fmaxf(x, -u.clamp), u.clamp) : x;
  return u.offset != 0.0f ? c + u.offset : c;
}
LOOM_HD float loom_glu_act(float g, loom_glu u) { return g / (1.0f + expf(-(u.alpha > 0.0f ? u.alpha : 1.0f) * g)); }
LOOM_HD float loom_glu_act_grad(float g, loom_glu u) {
  const float a = u.alpha > 0.0f ? u.alpha : 1.0f, s = 1.0f / (1.0f + expf(-a * g));
  return s * (1.0f + a * g * (1.0f - s));
}
LOOM_HD float loom_glu_gate_passes(float g, loom_glu u) { return u.clamp > 0.0f && g > u.clamp ? 0.0f : 1.0f; }
LOOM_HD float loom_glu_up_passes(float x, loom_glu u) { return u.clamp > 0.0f && (x > u.clamp || x < -u.clamp) ? 0.0f : 1.0f; }

/* YaRN's defaults (transformers' and Megatron-Core's): the ramp between 32 and 1 rotations. */
#define LOOM_YARN_BETA_FAST 32.0f
#define LOOM_YARN_BETA_SLOW 1.0f

/* YaRN's attention factor for a scaling factor, transformers' get_mscale:
 * 0.1 mscale ln(factor) + 1 (1 where factor <= 1). */
LOOM_HD double loom_yarn_mscale(double factor, double mscale) { return factor <= 1.0 ? 1.0 : 0.1 * mscale * log(factor) + 1.0; }

/* YaRN's correction dim: the dim of D whose frequency turns `rotations` times over `positions`. */
LOOM_HD double loom_yarn_correction_dim(double rotations, int D, double theta, double positions) {
  return (double)D * log(positions / (rotations * 2.0 * 3.14159265358979323846)) / (2.0 * log(theta));
}

/* The frequency of dims i and i + D/2 of a head: theta^(-2i/D), scaled as above. */
LOOM_HD double loom_rope_frequency(int i, int D, loom_rope r) {
  const double f = pow((double)r.theta, -2.0 * (double)i / (double)D);
  if (!(r.factor > 0.0f)) return f;
  if (r.yarn) { /* dims below low keep f, above high take f / factor, a linear ramp between */
    const double old = (double)r.original_max_position;
    double low = loom_yarn_correction_dim(r.beta_fast, D, r.theta, old), high = loom_yarn_correction_dim(r.beta_slow, D, r.theta, old);
    if (r.truncate) low = floor(low), high = ceil(high);
    low = low > 0.0 ? low : 0.0, high = high < D - 1 ? high : D - 1;
    if (low == high) high += 0.001;
    const double ramp = fmin(fmax(((double)i - low) / (high - low), 0.0), 1.0);
    return f / r.factor * ramp + f * (1.0 - ramp);
  }
  const double wavelength = 2.0 * 3.14159265358979323846 / f, old = (double)r.original_max_position;
  if (wavelength > old / r.low_freq_factor) return f / r.factor;
  if (wavelength < old / r.high_freq_factor) return f;
  const double smooth = (old / wavelength - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  return (1.0 - smooth) * f / r.factor + smooth * f;
}

/* The angle RoPE turns dims i and i + D/2 of a head at position pos by,
 * formed in double so every backend turns by the same cos and sin. */
LOOM_HD double loom_rope_angle(int pos, int i, int D, loom_rope r) { return (double)pos * loom_rope_frequency(i, D, r); }

/* The cos and sin RoPE turns dims i and i + D/2 by at position pos (sign -1: the transpose, backward), each
 * scaled by YaRN's attention factor where it has one. */
LOOM_HD void loom_rope_turn(int pos, int i, int D, loom_rope r, double sign, float *c, float *s) {
  const double a = sign * loom_rope_angle(pos, i, D, r), m = r.yarn && r.attention_factor > 0.0f ? r.attention_factor : 1.0;
  *c = (float)(m * cos(a)), *s = (float)(m * sin(a));
}

/* Whether a query at position q sees the key at position k: causally, and
 * under a window (> 0) only the keys at most `window` positions back
 * (Megatron's and Transformer Engine's left window; Hugging Face's
 * sliding_window is one more: the keys it counts include the query's own). */
LOOM_HD int loom_attn_sees(int window, int q, int k) { return k <= q && (window <= 0 || q - k <= window); }

/* Attention sinks: a row's log-sum-exp with the sink's logit joined (a row
 * that saw no key, lse -inf, has the sink's alone), formed stably. */
LOOM_HD float loom_sink_joined_lse(float lse, float sink) {
  if (lse == -INFINITY) return sink;
  const float hi = lse > sink ? lse : sink, lo = lse > sink ? sink : lse;
  return hi + log1pf(expf(lo - hi));
}

/* 1 if dropout element `index` survives. */
LOOM_HD int loom_dropout_keep_at(float p, uint64_t seed, uint64_t stream, uint64_t index) {
  return loom_rng_uniform_at(seed, stream, index) >= p;
}

/* Context parallelism's load-balanced causal split: a sequence of T is cut
 * into 2 cp chunks and rank `rank` of the cp group holds chunks rank and
 * 2 cp - 1 - rank, in that order (Megatron-Core's); the global position of
 * its local row r. */
LOOM_HD int loom_cp_position(int cp, int rank, int T, int r) {
  const int chunk = T / (2 * cp);
  return r < chunk ? rank * chunk + r : (2 * cp - 1 - rank) * chunk + (r - chunk);
}

/* Global index of element (t, b, c) of a [T, B, C] site whose row t is
 * local row seq_offset + t of a sequence of seq_total (0: T), that of
 * rank cp_rank of a cp-way split (cp 0 or 1: the whole sequence). */
LOOM_HD uint64_t loom_dropout_index_at(int64_t sample_offset, int seq_offset, int seq_total, int cp, int cp_rank, int t,
                                       int b, int c, int T, int C) {
  const uint64_t sample = (uint64_t)(sample_offset + b);
  const int total = seq_total ? seq_total : T, row = seq_offset + t;
  const int pos = cp > 1 ? loom_cp_position(cp, cp_rank, total, row) : row;
  return (sample * (uint64_t)total + (uint64_t)pos) * (uint64_t)C + (uint64_t)c;
}

/* Index of attention element (b, h, tq, tk). */
LOOM_HD uint64_t loom_attn_dropout_index_at(int64_t sample_offset, int head_offset, int total_heads, int T, int b,
                                            int h, int tq, int tk) {
  const uint64_t sample = (uint64_t)(sample_offset + b);
  const uint64_t head = (uint64_t)(head_offset + h);
  return ((sample * (uint64_t)total_heads + head) * (uint64_t)T + (uint64_t)tq) * (uint64_t)T + (uint64_t)tk;
}

/* bf16 as its 16 raw bits: fp32 rounded to nearest, ties to even (so a
 * value past the largest bf16 becomes inf); a NaN stays a quiet NaN. Every
 * backend rounds with this one function. */
LOOM_HD uint16_t loom_bf16_round(float x) {
  union {
    float f;
    uint32_t u;
  } v;
  v.f = x;
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u);
  return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

/* orthonormalize's last step: what a column is multiplied by, given its
 * squared norm before (`before`) and after (`after`) the projections. A
 * column that kept under 1e-4 of its norm lies, in fp32, in the span of the
 * ones before it: what is left is rounding, which normalising would blow up
 * into a direction far from orthogonal to them, so it becomes zero instead
 * (as a zero column does). */
LOOM_HD double loom_orthonormal_scale(double before, double after) {
  return after > 1e-8 * before && after > 0.0 ? 1.0 / sqrt(after) : 0.0;
}

LOOM_HD float loom_bf16_value(uint16_t b) {
  union {
    uint32_t u;
    float f;
  } v;
  v.u = (uint32_t)b << 16;
  return v.f;
}

/* grouped_matmul_forward and _backward as one of the backend's own
 * matmul_forward and matmul_backward calls per expert with rows: every CPU
 * backend's, and the CUDA one's where cuBLAS's grouped GEMM cannot take
 * them in one call (bf16 GEMMs, a cuBLAS before 12.5). */
static inline void loom_grouped_matmul_by_expert(const loom_ops *be, float *out, const float *inp, const float *weight,
                                                 const int *counts, int experts, int C, int OC) {
  size_t row = 0;
  for (int e = 0; e < experts; row += (size_t)counts[e], e++)
    if (counts[e] > 0)
      be->matmul_forward(be, out + row * OC, inp + row * C, weight + (size_t)e * OC * C, NULL, counts[e], C, OC);
}

static inline void loom_grouped_matmul_backward_by_expert(const loom_ops *be, float *dinp, float *dweight, const float *dout,
                                                          const float *inp, const float *weight, const int *counts,
                                                          int experts, int C, int OC) {
  size_t row = 0;
  for (int e = 0; e < experts; row += (size_t)counts[e], e++)
    if (counts[e] > 0)
      be->matmul_backward(be, dinp ? dinp + row * C : NULL, dweight ? dweight + (size_t)e * OC * C : NULL, NULL,
                          dout + row * OC, inp + row * C, weight ? weight + (size_t)e * OC * C : NULL, counts[e], C, OC);
}

#endif
