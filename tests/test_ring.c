/* Ring attention over a real cp group (layers/ring_attention.h) under
 * mpirun: every rank of the world is one rank of the ring, holding its two
 * chunks of one sequence (Megatron's load-balanced split); its outputs,
 * log-sum-exps and grads (its own k and v's coming home from every rank's
 * queries) equal one-rank attention's over the whole sequence at its rows,
 * with grouped-query heads and dropout keyed by global position, and under
 * a sliding window shorter than a chunk; and the same of Megatron's
 * all-gather variant behind the same calls. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "comm/mpi/comm_mpi.h"
#include "layers/ring_attention.h"
#include "test_util.h"

static loom_comm *g_world;

enum { B = 2, D = 8, C = 5 }; /* micro-batch, head width, rows of a chunk */

static void check_ring(int heads, int kv_heads, float dropout, bool all_gather, int window) {
  const loom_ops *ops = loom_ops_cpu();
  const int cp = loom_comm_size(g_world), me = loom_comm_rank(g_world), T = 2 * cp * C, L = 2 * C;
  const loom_attn_shape s = {.T = T, .B = B, .heads = heads, .kv_heads = kv_heads, .head_dim = D, .head_offset = 0,
                             .total_heads = heads, .window = window};
  const size_t W = loom_attn_qkv_width(&s), HD = (size_t)heads * D, KV = 2 * (size_t)kv_heads * D;
  const loom_dropout drop = {.p = dropout, .seed = 5, .stream = 9, .seq_total = T};
  /* The whole sequence on every rank (the same draws), and one-rank attention over it. */
  tu_attention_case one = tu_attention_case_new(ops, &s, &drop, 21);
  const float *qkv = one.qkv, *dout = one.dout, *out = one.out, *lse = one.lse, *dqkv = one.dqkv;
  /* This rank's rows, and the ring. */
  int pos[2 * C], peer_pos[2 * C];
  loom_cp_positions(cp, me, T, pos);
  float *q = malloc((size_t)L * B * W * sizeof(float)), *dy = malloc((size_t)L * B * HD * sizeof(float));
  float *o = malloc((size_t)L * B * HD * sizeof(float)), *l = malloc((size_t)B * heads * L * sizeof(float));
  /* The two buffers of each: a block, and the all-gather's cp blocks (loom_ring_buffer_blocks). */
  const size_t block = (size_t)L * B * KV, wide = (size_t)loom_ring_buffer_blocks(cp, all_gather, 1) * block;
  const size_t third = (size_t)loom_ring_buffer_blocks(cp, all_gather, 2) * block;
  float *dq = calloc((size_t)L * B * W, sizeof(float)), *blocks = malloc((2 * (block + wide) + third) * sizeof(float));
  for (int t = 0; t < L; t++)
    for (int b = 0; b < B; b++) {
      memcpy(q + ((size_t)t * B + b) * W, qkv + ((size_t)pos[t] * B + b) * W, W * sizeof(float));
      memcpy(dy + ((size_t)t * B + b) * HD, dout + ((size_t)pos[t] * B + b) * HD, HD * sizeof(float));
    }
  const loom_ring r = {.group = g_world, .rows = L, .pos = pos, .peer_pos = peer_pos, .all_gather = all_gather,
                       .kv = {blocks, blocks + block},
                       .dkv = {blocks + block + wide, blocks + 2 * block + wide, blocks + 2 * (block + wide)}};
  /* The outputs start as NaN: the first block writes them without reading what was there (0 * NaN is NaN). */
  for (size_t i = 0; i < (size_t)L * B * HD; i++) o[i] = NAN;
  for (size_t i = 0; i < (size_t)B * heads * L; i++) l[i] = NAN;
  loom_ring_pack_kv(ops, r.kv[0], q, L, &s);
  loom_ring_attention_forward(ops, &r, o, l, q, &s, &drop);
  loom_ring_pack_kv(ops, r.kv[0], q, L, &s); /* the block travelled: this rank's again */
  loom_ring_attention_backward(ops, &r, dq, dy, o, q, l, &s, &drop);
  /* The one-rank call's at this rank's rows. */
  float *want_o = malloc((size_t)L * B * HD * sizeof(float)), *want_l = malloc((size_t)B * heads * L * sizeof(float));
  float *want_d = malloc((size_t)L * B * W * sizeof(float));
  for (int t = 0; t < L; t++)
    for (int b = 0; b < B; b++) {
      memcpy(want_o + ((size_t)t * B + b) * HD, out + ((size_t)pos[t] * B + b) * HD, HD * sizeof(float));
      memcpy(want_d + ((size_t)t * B + b) * W, dqkv + ((size_t)pos[t] * B + b) * W, W * sizeof(float));
      for (int h = 0; h < heads; h++) want_l[((size_t)b * heads + h) * L + t] = lse[((size_t)b * heads + h) * T + pos[t]];
    }
  const char *how = all_gather ? "all-gather" : "ring";
  ck_assert_msg(tu_rel_max_diff(o, want_o, (size_t)L * B * HD) <= 1e-5, "%s: rank %d of cp %d (%d/%d heads, dropout %g): outputs",
                how, me, cp, heads, kv_heads, (double)dropout);
  ck_assert_msg(tu_rel_max_diff(l, want_l, (size_t)B * heads * L) <= 1e-5, "%s: rank %d of cp %d: log-sum-exps", how, me, cp);
  ck_assert_msg(tu_rel_max_diff(dq, want_d, (size_t)L * B * W) <= 1e-5, "%s: rank %d of cp %d (%d/%d heads, dropout %g): grads",
                how, me, cp, heads, kv_heads, (double)dropout);
  tu_attention_case_free(&one);
  free(q), free(dy), free(o), free(l), free(dq), free(blocks);
  free(want_o), free(want_l), free(want_d);
}

START_TEST(ring_equals_one_rank) {
  for (int gather = 0; gather < 2; gather++) {
    check_ring(4, 2, 0.0f, gather, 0); /* grouped-query: two key/value heads travel */
    check_ring(2, 2, 0.2f, gather, 0); /* multi-head, dropout by global position */
    /* A window of 3 keys back, shorter than a chunk of 5: from cp 3 on a rank's queries see none of some ranks'
     * blocks, which it skips (and whose grads it sends on untouched); and of 6, where a block one chunk away is
     * seen by one query alone (chunk 7's first row, chunk 5's last key, at cp 4). */
    check_ring(4, 2, 0.0f, gather, 3);
    check_ring(2, 2, 0.2f, gather, 3);
    check_ring(4, 2, 0.0f, gather, 6);
  }
}
END_TEST

int main(int argc, char **argv) {
  g_world = loom_comm_mpi_world(&argc, &argv);
  Suite *s = suite_create("ring");
  TCase *tc = tcase_create("ring");
  tcase_add_test(tc, ring_equals_one_rank);
  suite_add_tcase(s, tc);
  return tu_run_mpi(s, g_world);
}
