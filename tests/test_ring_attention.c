/* Context-parallel (ring) attention's blocks against one-rank attention,
 * on the reference backend and the CPU's: a sequence of 2 cp chunks, rank r holding
 * chunks r and 2 cp - 1 - r (Megatron's load-balanced causal split), each
 * rank's queries run against every rank's keys and values block by block
 * and merged by their log-sum-exps; the outputs, log-sum-exps and every
 * grad (each key/value block's summed back to its owner) equal the
 * one-rank call's at the same global positions, for cp 2, 3 and 4, with
 * grouped-query and multi-query heads and dropout keyed by global
 * position, whichever order the blocks come in. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/ops.h"
#include "test_util.h"

enum { B = 2, D = 8, C = 3 }; /* micro-batch, head width, rows of a chunk */

/* The global positions of rank r's 2 C rows out of cp. */
static void rank_positions(int cp, int r, int *pos) {
  for (int i = 0; i < C; i++) pos[i] = r * C + i, pos[C + i] = (2 * cp - 1 - r) * C + i;
}

static void check_ring(const loom_ops *ref, int cp, int heads, int kv_heads, float dropout, bool reversed) {
  const int T = 2 * cp * C, L = 2 * C;
  const loom_attn_shape s = {.T = T, .B = B, .heads = heads, .kv_heads = kv_heads, .head_dim = D, .head_offset = 0,
                             .total_heads = heads};
  const size_t W = loom_attn_qkv_width(&s), KV = 2 * (size_t)kv_heads * D, HD = (size_t)heads * D;
  const loom_dropout drop = {.p = dropout, .seed = 7, .stream = 3, .seq_total = T};
  tu_attention_case one = tu_attention_case_new(ref, &s, &drop, 11);
  const float *qkv = one.qkv, *dout = one.dout, *out = one.out, *lse = one.lse, *dqkv = one.dqkv;
  /* Each rank's rows: its queries (the qkv layout), its keys and values, its output grads. */
  int *pos = malloc((size_t)cp * L * sizeof(int));
  float *q = malloc((size_t)cp * L * B * W * sizeof(float)), *kv = malloc((size_t)cp * L * B * KV * sizeof(float));
  float *dy = malloc((size_t)cp * L * B * HD * sizeof(float)), *o = malloc((size_t)cp * L * B * HD * sizeof(float));
  float *l = malloc((size_t)cp * B * heads * L * sizeof(float));
  float *dq = calloc((size_t)cp * L * B * W, sizeof(float)), *dkv = calloc((size_t)cp * L * B * KV, sizeof(float));
  for (int r = 0; r < cp; r++) {
    rank_positions(cp, r, pos + r * L);
    for (int t = 0; t < L; t++)
      for (int b = 0; b < B; b++) {
        const size_t row = (size_t)pos[r * L + t] * B + b, mine = ((size_t)r * L + t) * B + b;
        memcpy(q + mine * W, qkv + row * W, W * sizeof(float));
        memcpy(kv + mine * KV, qkv + row * W + HD, KV * sizeof(float));
        memcpy(dy + mine * HD, dout + row * HD, HD * sizeof(float));
      }
  }
  /* The ring: rank r meets its own block first, then the one r - j ranks back (or the other way round). */
  for (int r = 0; r < cp; r++)
    for (int j = 0; j < cp; j++) {
      const int peer = reversed ? (r + 1 + j) % cp : (r - j + cp) % cp;
      ref->attention_block_forward(ref, o + (size_t)r * L * B * HD, l + (size_t)r * B * heads * L, q + (size_t)r * L * B * W,
                                   kv + (size_t)peer * L * B * KV, L, L, pos + r * L, pos + peer * L, &s, &drop, j == 0);
    }
  for (int r = 0; r < cp; r++)
    for (int j = 0; j < cp; j++) {
      const int peer = (r - j + cp) % cp;
      ref->attention_block_backward(ref, dq + (size_t)r * L * B * W, dkv + (size_t)peer * L * B * KV, dy + (size_t)r * L * B * HD,
                                    o + (size_t)r * L * B * HD, q + (size_t)r * L * B * W, kv + (size_t)peer * L * B * KV, L, L,
                                    pos + r * L, pos + peer * L, l + (size_t)r * B * heads * L, &s, &drop);
    }
  /* Back to global order, as the one-rank call laid them out. */
  float *got_out = malloc((size_t)T * B * HD * sizeof(float)), *got_lse = malloc((size_t)B * heads * T * sizeof(float));
  float *got_d = malloc((size_t)T * B * W * sizeof(float));
  for (int r = 0; r < cp; r++)
    for (int t = 0; t < L; t++) {
      const int g = pos[r * L + t];
      for (int b = 0; b < B; b++) {
        const size_t row = (size_t)g * B + b, mine = ((size_t)r * L + t) * B + b;
        memcpy(got_out + row * HD, o + mine * HD, HD * sizeof(float));
        memcpy(got_d + row * W, dq + mine * W, HD * sizeof(float));
        memcpy(got_d + row * W + HD, dkv + mine * KV, KV * sizeof(float));
        for (int h = 0; h < heads; h++)
          got_lse[((size_t)b * heads + h) * T + g] = l[(size_t)r * B * heads * L + ((size_t)b * heads + h) * L + t];
      }
    }
  char what[96];
  snprintf(what, sizeof what, "%s: cp %d, %d heads over %d kv heads, dropout %g%s", ref->name, cp, heads, kv_heads,
           (double)dropout, reversed ? ", blocks reversed" : "");
  ck_assert_msg(tu_rel_max_diff(got_out, out, (size_t)T * B * HD) <= 1e-5, "%s: outputs", what);
  ck_assert_msg(tu_rel_max_diff(got_lse, lse, (size_t)B * heads * T) <= 1e-5, "%s: log-sum-exps", what);
  ck_assert_msg(tu_rel_max_diff(got_d, dqkv, (size_t)T * B * W) <= 1e-5, "%s: grads", what);
  tu_attention_case_free(&one);
  free(pos), free(q), free(kv), free(dy), free(o), free(l);
  free(dq), free(dkv), free(got_out), free(got_lse), free(got_d);
}

/* On the reference backend, and on the CPU's against its own one-rank attention. */
START_TEST(ring_equals_one_rank) {
  const loom_ops *backends[] = {loom_ops_ref(), loom_ops_cpu()};
  const int cps[] = {2, 3, 4};
  for (size_t k = 0; k < sizeof backends / sizeof backends[0]; k++)
    for (size_t i = 0; i < sizeof cps / sizeof cps[0]; i++) {
      check_ring(backends[k], cps[i], 4, 2, 0.0f, false); /* grouped-query */
      check_ring(backends[k], cps[i], 4, 1, 0.0f, false); /* multi-query */
      check_ring(backends[k], cps[i], 2, 2, 0.2f, false); /* multi-head, dropout by global position */
      check_ring(backends[k], cps[i], 4, 2, 0.2f, true);  /* the blocks in another order: rows that see none of the first */
    }
}
END_TEST

int main(void) {
  Suite *s = suite_create("ring_attention");
  TCase *tc = tcase_create("ring_attention");
  tcase_add_test(tc, ring_equals_one_rank);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
