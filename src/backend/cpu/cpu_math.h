/* Branch-free float math that the compiler can vectorise, for the CPU
 * backend's hot loops (GELU, softmax, cross-entropy). glibc's expf and tanhf
 * are scalar calls; these inline forms run 8 lanes at a time under AVX2.
 * Accuracy: relative error below 3e-7 against expf over [-87, 88]
 * (tests/test_ops.c checks it). */
#ifndef LOOM_CPU_MATH_H
#define LOOM_CPU_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp(x) = 2^n * exp(r), n = round(x / ln 2), |r| <= ln(2)/2, with a
 * degree-7 Taylor polynomial for exp(r). Inputs are clamped to the normal range. */
static inline float loom_fast_expf(float x) {
  const float nan_or_x = x;
  x = x < -87.0f ? -87.0f : x; /* ternaries, not fminf: they vectorise without -ffast-math */
  x = x > 88.0f ? 88.0f : x;
  x = x != x ? 0.0f : x; /* keep NaN away from the int conversion below */
  const float n = rintf(x * 1.44269504088896341f);
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f; /* ln 2 split in two */
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return nan_or_x != nan_or_x ? nan_or_x : p * scale; /* NaN stays NaN, so bad steps are seen */
}

#define LOOM_GELU_SQRT_2_OVER_PI 0.7978845608028654f

/* GELU-tanh as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), which is
 * the same function: 0.5 (1 + tanh u) = sigmoid(2u). */
static inline float loom_fast_gelu(float x) {
  const float u = LOOM_GELU_SQRT_2_OVER_PI * (x + 0.044715f * x * x * x);
  return x / (1.0f + loom_fast_expf(-2.0f * u));
}

/* d/dx of loom_fast_gelu: s + 2 x s (1 - s) u', s = sigmoid(2u). */
static inline float loom_fast_gelu_grad(float x) {
  const float u = LOOM_GELU_SQRT_2_OVER_PI * (x + 0.044715f * x * x * x);
  const float du = LOOM_GELU_SQRT_2_OVER_PI * (1.0f + 3.0f * 0.044715f * x * x);
  const float s = 1.0f / (1.0f + loom_fast_expf(-2.0f * u));
  return s + 2.0f * x * s * (1.0f - s) * du;
}

#endif
