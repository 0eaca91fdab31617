/* FP8, one definition for host C and CUDA kernels: the two formats of the
 * OCP 8-bit floating point specification (and NVIDIA's __nv_fp8 types),
 * their conversions, E8M0 block scales, and the scales each recipe derives
 * from an amax. Every backend quantises with these functions.
 *
 * E4M3 is the "fn" variant: bias 7, no infinities, S.1111.111 the only NaN,
 * 448 the largest finite. E5M2 is IEEE-like: bias 15, infinities, 57344 the
 * largest finite. Conversion from fp32 (a bf16 value is an fp32 one) rounds
 * to nearest, ties to even, and saturates: a finite value or an infinity
 * past the largest finite becomes it, signed (CUDA's __NV_SATFINITE, what
 * Transformer Engine casts with); NaN stays NaN. */
#ifndef LOOM_FP8_MATH_H
#define LOOM_FP8_MATH_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include "core/rng_math.h" /* LOOM_HD */

typedef enum { LOOM_FP8_E4M3 = 0, LOOM_FP8_E5M2 = 1 } loom_fp8_format;

#define LOOM_FP8_E4M3_MAX 448.0f
#define LOOM_FP8_E5M2_MAX 57344.0f

LOOM_HD int loom_fp8_mantissa_bits(loom_fp8_format f) { return f == LOOM_FP8_E4M3 ? 3 : 2; }
LOOM_HD int loom_fp8_bias(loom_fp8_format f) { return f == LOOM_FP8_E4M3 ? 7 : 15; }
LOOM_HD float loom_fp8_max(loom_fp8_format f) { return f == LOOM_FP8_E4M3 ? LOOM_FP8_E4M3_MAX : LOOM_FP8_E5M2_MAX; }
/* The code of the largest finite magnitude (sign clear), and the NaN code. */
LOOM_HD uint8_t loom_fp8_max_code(loom_fp8_format f) { return f == LOOM_FP8_E4M3 ? 0x7e : 0x7b; }
LOOM_HD uint8_t loom_fp8_nan_code(loom_fp8_format f) { return 0x7f; }

/* Blocks of block_k along K (a partial last one included). */
LOOM_HD int loom_fp8_k_blocks(int K, int block_k) { return block_k > 0 ? (K + block_k - 1) / block_k : 0; }

/* 2^k as an fp32, for k in [-126, 127] (its exponent field alone: no libm call). */
LOOM_HD float loom_fp8_pow2(int k) {
  union {
    uint32_t u;
    float f;
  } v;
  v.u = (uint32_t)(k + 127) << 23;
  return v.f;
}

/* The nearest code to x, ties to even, saturating. */
LOOM_HD uint8_t loom_fp8_encode(float x, loom_fp8_format f) {
  union {
    float f;
    uint32_t u;
  } v;
  v.f = x;
  const uint8_t sign = v.u >> 31 ? 0x80 : 0x00;
  if (isnan(x)) return (uint8_t)(sign | loom_fp8_nan_code(f));
  const float a = fabsf(x);
  if (!(a < loom_fp8_max(f))) return (uint8_t)(sign | loom_fp8_max_code(f)); /* saturates, infinity too */
  const int M = loom_fp8_mantissa_bits(f), emin = 1 - loom_fp8_bias(f);
  if (a == 0.0f) return sign;
  /* a = 1.m x 2^e, from the exponent field; an fp32 subnormal lies far below emin, which a subnormal code takes:
   * the quantum of the smallest normal binade */
  const int field = (int)((v.u >> 23) & 0xff), e = field - 127 > emin ? field - 127 : emin;
  /* a / quantum is exact (a power of two apart); rintf rounds it to nearest even. q <= 2^(M+1): a carry
   * into the next binade (or from the subnormals to the normals) lands on the right code by the sum below. */
  const int q = (int)rintf(a * loom_fp8_pow2(M - e));
  int code = ((e + loom_fp8_bias(f)) << M) + q - (1 << M); /* = q in the subnormals (e = emin) */
  if (code > loom_fp8_max_code(f)) code = loom_fp8_max_code(f);
  return (uint8_t)(sign | code);
}

/* The value of a code, exact in fp32. */
LOOM_HD float loom_fp8_decode(uint8_t c, loom_fp8_format f) {
  const int M = loom_fp8_mantissa_bits(f), bias = loom_fp8_bias(f);
  const int e = (c & 0x7f) >> M, m = c & ((1 << M) - 1);
  const float sign = c & 0x80 ? -1.0f : 1.0f;
  if (f == LOOM_FP8_E4M3 && (c & 0x7f) == 0x7f) return NAN;
  if (f == LOOM_FP8_E5M2 && e == 31) return m ? NAN : sign * INFINITY;
  if (e == 0) return sign * (float)m * loom_fp8_pow2(1 - bias - M);
  return sign * (float)((1 << M) + m) * loom_fp8_pow2(e - bias - M);
}

/* E8M0, the MX formats' block scale: 2^(c - 127), c = 255 NaN. */
#define LOOM_E8M0_NAN 0xff
LOOM_HD float loom_e8m0_decode(uint8_t c) { return c == LOOM_E8M0_NAN ? NAN : ldexpf(1.0f, (int)c - 127); }
/* The code of 2^x, x clamped to E8M0's range [-127, 127]. */
LOOM_HD uint8_t loom_e8m0_encode(int x) { return (uint8_t)((x < -127 ? -127 : x > 127 ? 127 : x) + 127); }

/* MXFP8's block scale from the block's amax, as Transformer Engine and
 * cuBLAS take it: the smallest power of two 2^x with amax / 2^x <= the
 * format's largest finite (so no element saturates; OCP's floor(log2 amax)
 * - emax would let the top binade saturate), in E8M0's range. A zero block
 * takes 2^-127; a NaN amax the NaN scale. */
LOOM_HD uint8_t loom_mx_scale(float amax, loom_fp8_format f) {
  if (isnan(amax)) return LOOM_E8M0_NAN;
  if (!(amax > 0.0f)) return loom_e8m0_encode(-127);
  if (isinf(amax)) return loom_e8m0_encode(127);
  int ea = 0, em = 0;
  frexpf(amax, &ea), frexpf(loom_fp8_max(f), &em);
  int x = ea - em - 1; /* amax / 2^x >= max / 2 x 2 > max is possible only above; step up until it fits */
  while (ldexpf(loom_fp8_max(f), x) < amax) x++;
  return loom_e8m0_encode(x);
}

/* A tensor's or a block's fp32 scale (what multiplies a value before its
 * cast) from its amax, as Transformer Engine computes it: (max / amax) /
 * 2^margin; an amax of 0, or one not finite, keeps `previous` (1 for a
 * first or current-scaling cast); a scale past fp32's range becomes its
 * largest finite. The GEMM multiplies by 1 / scale. */
LOOM_HD float loom_fp8_scale(float amax, loom_fp8_format f, int margin, float previous) {
  if (!(amax > 0.0f) || isinf(amax)) return previous;
  const float s = ldexpf(loom_fp8_max(f) / amax, -margin);
  return isinf(s) ? 3.40282347e+38f : s;
}

/* A block's cast from its amax (blockwise: fp32, loom_fp8_scale; MXFP8: E8M0, loom_mx_scale): *scale multiplies
 * each value before its cast, *inv dequantises the codes. */
LOOM_HD void loom_fp8_block_scale(float amax, loom_fp8_format f, bool mx, float *scale, float *inv) {
  if (mx) {
    const uint8_t e = loom_mx_scale(amax, f);
    *inv = loom_e8m0_decode(e), *scale = e == LOOM_E8M0_NAN ? NAN : loom_e8m0_decode((uint8_t)(254 - e));
  } else {
    *scale = loom_fp8_scale(amax, f, 0, 1.0f), *inv = 1.0f / *scale;
  }
}

/* A running amax joined with the next magnitude: the larger, and NaN once one was NaN (fmaxf would drop it). */
LOOM_HD float loom_fp8_amax_join(float amax, float a) { return isnan(amax) ? amax : !(a <= amax) ? a : amax; }

#endif
