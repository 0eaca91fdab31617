/* Compressed grad sums under mpirun (np replicas of a tiny model's grads,
 * one data-parallel group), held to what each method promises:
 * - PowerSGD: grads whose sum over the replicas has rank <= r come through
 *   exactly (relative 1e-5), and the replicas' error feedback sums to ~0;
 * - scaled sign: grads of one magnitude per tensor come through exactly,
 *   with no error feedback left;
 * - both: nothing is lost, the compressed sum plus every replica's new
 *   error feedback equals the plain sum of grads plus old feedback (1e-5),
 *   step after step; tensors left whole (biases, norms) equal a plain
 *   all-reduce bit for bit; every replica ends with the same bits
 *   everywhere; and far fewer words are sent than the whole grads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm/mpi/comm_mpi.h"
#include "core/rng.h"
#include "optim/grad_compress.h"
#include "test_util.h"

enum { RANK = 2 };
static loom_comm *g_world;

static loom_compression method(int sign) {
  return (loom_compression){.kind = sign ? LOOM__COMPRESSION_KIND__COMPRESSION_SIGN : LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD,
                            .rank = sign ? 0 : RANK, .dp = g_world->size};
}

static loom_gpt_params tiny_grads(void) {
  loom_gpt_config c = {.layers = 2, .hidden = 16, .heads = 4, .vocab = 256, .seq = 8, .norm_eps = 1e-5f};
  loom_gpt_config_finish(&c);
  loom_gpt_params p;
  ck_assert_int_eq(loom_gpt_params_init(&p, &c, 0, 1, NULL, loom_allocator_host()), LOOM_OK);
  return p;
}

/* Every grad uniform in [-1, 1), different on every replica and step. */
static void random_grads(loom_gpt_params *p, int step) {
  float *g = p->grads.base;
  loom_rng_fill_uniform(g, p->grads.numel, 77, (uint64_t)(g_world->rank * 1000 + step), 0);
  for (size_t i = 0; i < p->grads.numel; i++) g[i] = 2.0f * g[i] - 1.0f;
}

/* Each matrix's grad u_i v^T: u differs per replica, v is shared, so the sum has rank 1. */
static void rank_one_grads(loom_gpt_params *p, const loom_grad_compress *s) {
  random_grads(p, 0);
  for (int c = 0; c < s->count; c++) {
    float *g = p->grads.views[s->item[c].tensor].data;
    for (int i = 0; i < s->item[c].rows; i++)
      for (int j = 0; j < s->item[c].cols; j++)
        g[(size_t)i * s->item[c].cols + j] = (float)((i % 5) - 2 + g_world->rank) * (float)(j % 3 + 1) * 0.25f;
  }
}

/* Every replica's grads summed plainly, in a new array. */
static float *plain_sum(const loom_gpt_params *p) {
  float *sum = malloc(p->grads.numel * sizeof(float));
  memcpy(sum, p->grads.base, p->grads.numel * sizeof(float));
  loom_comm_allreduce(g_world, sum, p->grads.numel, LOOM_REDUCE_SUM);
  return sum;
}

/* The compressor of method(sign) for p's grads, on the CPU backend. */
static void start(loom_grad_compress *s, int sign, const loom_gpt_params *p) {
  const loom_compression cfg = method(sign);
  ck_assert_int_eq(loom_grad_compress_init(s, &cfg, p, 9, loom_ops_cpu()), LOOM_OK);
}

static double rel_diff(const float *a, const float *b, size_t n) {
  double d = 0.0, ref = 0.0;
  for (size_t i = 0; i < n; i++) d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), ref += (double)b[i] * b[i];
  return sqrt(d / (ref > 0 ? ref : 1));
}

START_TEST(low_rank_sums_are_exact) {
  loom_gpt_params p = tiny_grads();
  loom_grad_compress s;
  start(&s, 0, &p);
  ck_assert_msg(s.count >= 8, "PowerSGD compresses the tiny model's matrices (%d)", s.count);
  rank_one_grads(&p, &s);
  float *want = plain_sum(&p);
  loom_grad_compress_reduce(&s, &p, g_world, loom_ops_cpu());
  for (int c = 0; c < s.count; c++) {
    const size_t at = loom_buffer_offset(&p.grads, s.item[c].tensor), n = (size_t)s.item[c].rows * s.item[c].cols;
    const double e = rel_diff((float *)p.grads.base + at, want + at, n);
    ck_assert_msg(e <= 1e-5, "%s: a rank-1 sum came through %g off", p.grads.views[s.item[c].tensor].name, e);
  }
  /* Each replica keeps its grad less its share of the sum; those shares add up to nothing. */
  float *left = malloc(s.error_floats * sizeof(float));
  memcpy(left, s.error, s.error_floats * sizeof(float));
  loom_comm_allreduce(g_world, left, s.error_floats, LOOM_REDUCE_SUM);
  double norm = 0.0;
  for (size_t i = 0; i < s.error_floats; i++) norm += (double)left[i] * left[i];
  ck_assert_msg(sqrt(norm) <= 1e-4, "the replicas' error feedback sums to %g after an exact sum", sqrt(norm));
  free(left);
  free(want);
  loom_grad_compress_free(&s);
  loom_gpt_params_free(&p);
}
END_TEST

/* Each matrix's grad +-c_i, with c_i per replica: its signs and mean lose nothing. */
START_TEST(equal_magnitudes_cross_signs_exactly) {
  loom_gpt_params p = tiny_grads();
  loom_grad_compress s;
  start(&s, 1, &p);
  ck_assert_msg(s.count >= 10, "the sign method compresses every matrix (%d)", s.count);
  random_grads(&p, 0);
  for (int c = 0; c < s.count; c++) {
    float *g = p.grads.views[s.item[c].tensor].data;
    for (size_t i = 0; i < (size_t)s.item[c].rows * s.item[c].cols; i++) g[i] = (g[i] >= 0 ? 0.125f : -0.125f) * (float)(g_world->rank + 1);
  }
  float *want = plain_sum(&p);
  loom_grad_compress_reduce(&s, &p, g_world, loom_ops_cpu());
  ck_assert_msg(memcmp(want, p.grads.base, p.grads.numel * sizeof(float)) == 0, "equal magnitudes did not cross exactly");
  for (size_t i = 0; i < s.error_floats; i++) ck_assert_msg(s.error[i] == 0.0f, "error feedback %g left", s.error[i]);
  free(want);
  loom_grad_compress_free(&s);
  loom_gpt_params_free(&p);
}
END_TEST

START_TEST(nothing_is_lost_and_replicas_agree) {
  loom_gpt_params p = tiny_grads();
  const loom_ops *ops = loom_ops_cpu();
  loom_grad_compress s;
  start(&s, _i, &p);
  const size_t n = p.grads.numel;
  float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float)), *first = malloc(n * sizeof(float));
  int compared = 0;
  for (int step = 1; step <= 3; step++) {
    random_grads(&p, step);
    /* want = sum over replicas of grads + old error feedback, matrices only (the rest is summed whole) */
    memcpy(want, p.grads.base, n * sizeof(float));
    for (int c = 0; c < s.count; c++) {
      float *w = want + loom_buffer_offset(&p.grads, s.item[c].tensor);
      for (size_t i = 0; i < (size_t)s.item[c].rows * s.item[c].cols; i++) w[i] += s.error[s.item[c].error_at + i];
    }
    loom_comm_allreduce(g_world, want, n, LOOM_REDUCE_SUM);
    loom_grad_compress_reduce(&s, &p, g_world, ops);
    /* got = compressed sum + every replica's new error feedback */
    memcpy(got, p.grads.base, n * sizeof(float));
    float *err = calloc(n, sizeof(float));
    for (int c = 0; c < s.count; c++)
      memcpy(err + loom_buffer_offset(&p.grads, s.item[c].tensor), s.error + s.item[c].error_at,
             (size_t)s.item[c].rows * s.item[c].cols * sizeof(float));
    loom_comm_allreduce(g_world, err, n, LOOM_REDUCE_SUM);
    for (size_t i = 0; i < n; i++) got[i] += err[i];
    free(err);
    for (int k = 0; k < p.grads.count; k++) {
      const size_t at = loom_buffer_offset(&p.grads, k), len = loom_tensor_numel(&p.grads.views[k]);
      const bool whole = !loom_compression_compresses(&s.cfg, &p.grads.views[k], NULL, NULL);
      if (whole) /* summed whole: the plain all-reduce's bits */
        ck_assert_msg(memcmp(p.grads.views[k].data, want + at, len * sizeof(float)) == 0, "%s is not the plain sum",
                      p.grads.views[k].name);
      const double e = rel_diff(got + at, want + at, len);
      ck_assert_msg(e <= 1e-5, "step %d, %s: sum plus feedback %g off the plain sum", step, p.grads.views[k].name, e);
      compared++;
    }
    /* every replica holds rank 0's bits */
    memcpy(first, p.grads.base, n * sizeof(float));
    loom_comm_broadcast(g_world, first, n, 0);
    ck_assert_msg(memcmp(first, p.grads.base, n * sizeof(float)) == 0, "rank %d's compressed sum differs from rank 0's",
                  g_world->rank);
  }
  ck_assert_int_eq(compared, 3 * p.grads.count);
  ck_assert_msg(s.sent_words * 5 < s.whole_words, "sends %lld words of %lld", (long long)s.sent_words,
                (long long)s.whole_words);
  free(want);
  free(got);
  free(first);
  loom_grad_compress_free(&s);
  loom_gpt_params_free(&p);
}
END_TEST

int main(int argc, char **argv) {
  g_world = loom_comm_mpi_world(&argc, &argv);
  Suite *s = suite_create("compress");
  TCase *tc = tcase_create("grad compression");
  tcase_add_test(tc, low_rank_sums_are_exact);
  tcase_add_test(tc, equal_magnitudes_cross_signs_exactly);
  tcase_add_loop_test(tc, nothing_is_lost_and_replicas_agree, 0, 2); /* PowerSGD, then sign */
  suite_add_tcase(s, tc);
  return tu_run_mpi(s, g_world);
}
