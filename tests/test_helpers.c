/* The suite's own comparison helpers (test_util.c) can fail: a NaN or an
 * infinity anywhere is the worst difference, whichever side holds it. */
#include <check.h>
#include <math.h>
#include "test_util.h"

enum { N = 8 };

static void fill(float *x, float v) {
  for (int i = 0; i < N; i++) x[i] = v + (float)i;
}

START_TEST(equal_inputs_compare_equal) {
  float a[N], b[N];
  fill(a, 1.0f), fill(b, 1.0f);
  ck_assert_double_eq(tu_nmse(a, b, N), 0.0);
  ck_assert_double_eq(tu_max_abs_diff(a, b, N), 0.0);
  ck_assert_double_eq(tu_rel_max_diff(a, b, N), 0.0);
  b[3] += 0.5f;
  ck_assert_double_eq_tol(tu_max_abs_diff(a, b, N), 0.5, 1e-12);
  ck_assert(tu_nmse(a, b, N) > 0.0);
}
END_TEST

/* One planted NaN (or infinity) on either side, and an all-NaN output (a ring
 * attention that produced nothing): every helper says INFINITY, and the
 * tests' `diff <= tol` then fails. */
START_TEST(nan_anywhere_is_the_worst_difference) {
  const float bad[] = {NAN, INFINITY, -INFINITY};
  for (int k = 0; k < 3; k++)
    for (int side = 0; side < 2; side++)
      for (int at = 0; at < N; at += N - 1) {
        float a[N], b[N];
        fill(a, 1.0f), fill(b, 1.0f);
        (side ? b : a)[at] = bad[k];
        ck_assert_msg(isinf(tu_nmse(a, b, N)), "nmse with %g at %d of side %d", (double)bad[k], at, side);
        ck_assert_msg(isinf(tu_max_abs_diff(a, b, N)), "max abs diff with %g at %d of side %d", (double)bad[k], at, side);
        ck_assert_msg(isinf(tu_rel_max_diff(a, b, N)), "rel max diff with %g at %d of side %d", (double)bad[k], at, side);
        ck_assert(!(tu_nmse(a, b, N) <= 1e-9) && !(tu_max_abs_diff(a, b, N) <= 1e-7));
      }
  float all_nan[N], want[N];
  for (int i = 0; i < N; i++) all_nan[i] = NAN;
  fill(want, 1.0f);
  ck_assert(isinf(tu_max_abs_diff(all_nan, want, N)) && isinf(tu_rel_max_diff(all_nan, want, N)));
}
END_TEST

int main(void) {
  Suite *s = suite_create("helpers");
  TCase *tc = tcase_create("helpers");
  tcase_add_test(tc, equal_inputs_compare_equal);
  tcase_add_test(tc, nan_anywhere_is_the_worst_difference);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
