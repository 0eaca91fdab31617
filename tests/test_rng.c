/* The keyed RNG: Philox known answers, slice invariance (the groundwork of
 * partition invariance), and the shape of the distributions. */
#include <math.h>
#include <stdlib.h>
#include "core/rng.h"
#include "test_util.h"

/* Known-answer vectors of Philox-4x32-10 from Random123's kat_vectors. */
START_TEST(philox_known_answers) {
  const uint32_t cases[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
       0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
       0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1},
  };
  for (int c = 0; c < 3; c++) {
    uint32_t out[4];
    loom_philox4x32(cases[c], cases[c] + 4, out);
    for (int i = 0; i < 4; i++) ck_assert_uint_eq(out[i], cases[c][6 + i]);
  }
}
END_TEST

/* Any slice [off, off+len) equals that slice of the full generation. */
START_TEST(slices_equal_full_generation) {
  enum { N = 1000 };
  float full_n[N], full_u[N], part[N];
  const uint64_t stream = loom_hash_str("h.3.attn.c_attn.weight");
  loom_rng_fill_normal(full_n, N, 1234, stream, 0, 0.0f, 1.0f);
  loom_rng_fill_uniform(full_u, N, 1234, stream, 0);
  const int slices[][2] = {{0, 1}, {1, 3}, {3, 5}, {5, 7}, {0, 1000}, {333, 334}, {998, 2}, {4, 4}};
  for (size_t s = 0; s < sizeof slices / sizeof slices[0]; s++) {
    const int off = slices[s][0], len = slices[s][1];
    loom_rng_fill_normal(part, (size_t)len, 1234, stream, (uint64_t)off, 0.0f, 1.0f);
    for (int i = 0; i < len; i++) ck_assert_float_eq(part[i], full_n[off + i]);
    loom_rng_fill_uniform(part, (size_t)len, 1234, stream, (uint64_t)off);
    for (int i = 0; i < len; i++) ck_assert_float_eq(part[i], full_u[off + i]);
  }
  /* The pointwise draws agree with the fills too. */
  for (int i = 0; i < N; i += 97) ck_assert_float_eq(loom_rng_normal(1234, stream, (uint64_t)i), full_n[i]);
}
END_TEST

START_TEST(streams_and_seeds_differ) {
  const uint64_t a = loom_hash_str("wte.weight"), b = loom_hash_str("wpe.weight");
  ck_assert_uint_ne(a, b);
  int same_stream = 0, same_seed = 0;
  for (uint64_t i = 0; i < 256; i++) {
    same_stream += loom_rng_u32(1, a, i) == loom_rng_u32(1, b, i);
    same_seed += loom_rng_u32(1, a, i) == loom_rng_u32(2, a, i);
  }
  ck_assert_int_le(same_stream, 1);
  ck_assert_int_le(same_seed, 1);
}
END_TEST

START_TEST(distributions_have_the_right_moments) {
  enum { N = 200000 };
  float *x = malloc(N * sizeof(float));
  loom_rng_fill_normal(x, N, 7, 99, 0, 0.5f, 2.0f);
  double mean = 0.0, var = 0.0;
  for (int i = 0; i < N; i++) mean += x[i];
  mean /= N;
  for (int i = 0; i < N; i++) var += (x[i] - mean) * (x[i] - mean);
  var /= N;
  ck_assert_double_eq_tol(mean, 0.5, 0.02);
  ck_assert_double_eq_tol(sqrt(var), 2.0, 0.02);
  loom_rng_fill_uniform(x, N, 7, 99, 0);
  mean = 0.0;
  for (int i = 0; i < N; i++) {
    ck_assert(x[i] >= 0.0f && x[i] < 1.0f);
    mean += x[i];
  }
  ck_assert_double_eq_tol(mean / N, 0.5, 0.005);
  free(x);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rng");
  TCase *tc = tcase_create("rng");
  tcase_add_test(tc, philox_known_answers);
  tcase_add_test(tc, slices_equal_full_generation);
  tcase_add_test(tc, streams_and_seeds_differ);
  tcase_add_test(tc, distributions_have_the_right_moments);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
