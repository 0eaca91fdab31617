/* Tensor parallelism under mpirun: each TP layer and the model split tp
 * ways (tp = world size) against their serial selves, which every rank also
 * computes locally.
 *
 * - Each layer (column- and row-parallel linear, vocab-parallel embedding and
 *   cross-entropy): output and every grad equal this rank's slice of the
 *   serial ones (NMSE <= 1e-12), with and without sequence parallelism.
 * - Layers: one forward and backward on a fixed batch. The embedding output,
 *   every block's output, the final norm and the loss equal the serial ones,
 *   and every gradient equals this rank's slice of the serial gradient
 *   (NMSE <= 1e-10: fp32 summation order only).
 * - Training: 10 steps give the serial losses (relative 1e-5) and the same
 *   final weights (NMSE <= 1e-9, every element within 1e-4 after 10 Adam
 *   steps at lr 1e-2, which amplify fp32 rounding), on the addition
 *   task and on a token file, with and without sequence parallelism, with
 *   dropout on so the keyed masks are checked too. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pipeline/trainer.h"
#include "backend/op_math.h"
#include "comm/mpi/comm_mpi.h"
#include "data/addition.h"
#include "core/rng.h"
#include "data/token_file.h"
#include "tensor_parallel/linear.h"
#include "tensor_parallel/mappings.h"
#include "tensor_parallel/vocab_parallel.h"
#include "test_util.h"

static loom_comm *g_world;

static loom_gpt_config tiny(void) {
  loom_gpt_config c = {.layers = 2, .hidden = 16, .heads = 4, .vocab = 256, .seq = 8, .dropout = 0.1f, .norm_eps = 1e-5f};
  loom_gpt_config_finish(&c);
  return c;
}

/* tiny() with its MLPs 4 experts of 16 (top 2) beside a gated shared
 * expert, the router losses on, and (capacity > 0) a capacity factor that
 * drops. */
static loom_gpt_config tiny_moe(double capacity) {
  loom_gpt_config c = tiny();
  c.no_bias = true;
  c.moe = (loom_moe_config){.experts = 4, .topk = 2, .ffn = 16, .shared_ffn = 16, .shared_gate = true, .aux_loss_coeff = 0.1f,
                            .z_loss_coeff = 0.01f, .capacity_factor = capacity};
  loom_gpt_config_finish(&c);
  return c;
}

static void expect_nmse(const float *got, const float *want, size_t n, double limit, const char *what) {
  const double e = tu_nmse(got, want, n);
  ck_assert_msg(e <= limit, "rank %d: %s NMSE %g > %g", g_world->rank, what, e, limit);
}

static void fixed_batch(int *tokens, int *targets, int N) {
  for (int i = 0; i < N; i++) {
    tokens[i] = (int)(loom_rng_u32(5, 1, (uint64_t)i) % 256u);
    targets[i] = i % 7 == 3 ? -1 : (int)(loom_rng_u32(5, 2, (uint64_t)i) % 256u);
  }
}

static void layers_match(bool sp, const loom_gpt_config cfg) {
  enum { T = 8, B = 2, N = T * B };
  loom_parallel ps;
  loom_parallel_init(&ps, g_world, g_world->size, 1, 1, 1, sp);
  const loom_tp tp = loom_tp_of(&ps);
  loom_gpt serial, split;
  ck_assert_int_eq(loom_gpt_init(&serial, &cfg, loom_ops_cpu(), 9, NULL), LOOM_OK);
  ck_assert_int_eq(loom_gpt_init(&split, &cfg, loom_ops_cpu(), 9, &tp), LOOM_OK);
  loom_gpt_set_batch_shape(&serial, T, B);
  loom_gpt_set_batch_shape(&split, T, B);
  int tokens[N], targets[N];
  fixed_batch(tokens, targets, N);
  const loom_gpt_batch batch = {.tokens = tokens, .targets = targets, .sample_offset = 6, .step = 3, .train = true};
  loom_gpt_zero_grad(&serial);
  loom_gpt_zero_grad(&split);
  const float ls = loom_gpt_forward(&serial, &batch), lt = loom_gpt_forward(&split, &batch);
  int pred_serial[N], pred_split[N];
  loom_gpt_predict(&serial, pred_serial);
  loom_gpt_predict(&split, pred_split);
  ck_assert_mem_eq(pred_split, pred_serial, sizeof pred_serial); /* greedy over the split vocab */
  loom_gpt_backward(&serial, &batch, 1.0f / N);
  loom_gpt_backward(&split, &batch, 1.0f / N);
  loom_gpt_sync_replicated_grads(&split);
  ck_assert_msg(fabs(lt - ls) <= 1e-6 * fabs(ls), "loss %g vs serial %g", (double)lt, (double)ls);
  if (loom_gpt_is_moe(&cfg)) { /* the router losses and drops: this rank's shares of the serial ones */
    double got[3] = {split.moe_stats.aux_loss, split.moe_stats.z_loss, (double)split.moe_stats.dropped};
    if (sp) loom_comm_allreduce_typed(tp.group, got, 3, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
    const double want[3] = {serial.moe_stats.aux_loss, serial.moe_stats.z_loss, (double)serial.moe_stats.dropped};
    for (int i = 0; i < 3; i++) ck_assert_msg(fabs(got[i] - want[i]) <= 1e-6 * want[i], "router %d: %g vs serial %g", i, got[i], want[i]);
    ck_assert(want[0] > 0.0 && want[1] > 0.0 && (cfg.moe.capacity_factor > 0.0) == (want[2] > 0.0));
  }
  /* Activations outside the regions: this rank's rows of the serial ones. */
  const int n = loom_tp_local_rows(&tp, T) * B, row0 = sp ? tp.rank * n : 0, h = cfg.hidden;
  expect_nmse(split.a->x0, serial.a->x0 + (size_t)row0 * h, (size_t)n * h, 1e-10, "embedding output");
  for (int l = 0; l < cfg.layers; l++)
    expect_nmse(split.a->blocks[l].out, serial.a->blocks[l].out + (size_t)row0 * h, (size_t)n * h, 1e-10, "block output");
  expect_nmse(split.a->ln_f, serial.a->ln_f, (size_t)N * h, 1e-10, "final norm");
  /* Every gradient against this rank's slice of the serial gradient. */
  float *want = malloc(split.p.grads.numel * sizeof(float));
  tu_slice_of(&split.p, &serial.p.grads, &serial.p, want);
  for (int k = 0; k < split.p.grads.count; k++) {
    const size_t off = loom_buffer_offset(&split.p.grads, k);
    expect_nmse(split.p.grads.views[k].data, want + off, loom_tensor_numel(&split.p.grads.views[k]), 1e-10,
                split.p.grads.views[k].name);
  }
  free(want);
  /* The grad norm counts each element once: shards summed, replicas once. */
  const double ns = loom_grad_norm(&serial.p, serial.ops, NULL), nt = loom_grad_norm(&split.p, split.ops, &tp);
  ck_assert_msg(fabs(nt - ns) <= 1e-6 * ns, "grad norm %g vs serial %g", nt, ns);
  /* Replicated LayerNorm grads are bit-identical on every rank of the group. */
  const int k = loom_gpt_params_find(&split.p, loom_gpt_is_moe(&cfg) ? "model.layers.1.post_attention_layernorm.weight"
                                                                      : "h.1.ln_2.weight");
  ck_assert_int_ge(k, 0);
  float *all = malloc((size_t)tp.size * h * sizeof(float));
  loom_comm_allgather(tp.group, split.p.grads.views[k].data, all, (size_t)h);
  for (int r = 1; r < tp.size; r++) ck_assert_mem_eq(all + r * h, all, (size_t)h * sizeof(float));
  free(all);
  loom_gpt_free(&serial);
  loom_gpt_free(&split);
  loom_parallel_free(&ps);
}

START_TEST(layers_match_serial) { layers_match(false, tiny()); }
END_TEST
START_TEST(layers_match_serial_sequence_parallel) { layers_match(true, tiny()); }
END_TEST
/* Mixture-of-Experts layers: every rank routes all the tokens alike, or
 * under SP its own, with the drops a capacity factor makes planned over the
 * whole micro-batch. */
START_TEST(moe_layers_match_serial) { layers_match(false, tiny_moe(0.0)); }
END_TEST
START_TEST(moe_layers_match_serial_sequence_parallel) { layers_match(true, tiny_moe(0.0)); }
END_TEST
START_TEST(moe_layers_with_capacity_match_serial_sequence_parallel) { layers_match(true, tiny_moe(1.0)); }
END_TEST

/* Expert parallelism over the whole world (tp 1, dp = ep = world): rank r
 * routes micro-batch r, sending each expert's rows to the rank holding it.
 * Against one model that runs every micro-batch alone: each rank's loss and
 * router losses are its micro-batch's, the grads of everything but the
 * experts summed over the ranks are the serial sums, and each rank's
 * experts' grads (summed over nobody: the expert-data-parallel group is one
 * rank) are the serial grads of the same experts, by name. With a capacity
 * factor the same choices drop. */
static void experts_match(double capacity, bool bf16) {
  enum { T = 8, B = 2, N = T * B };
  const int P = g_world->size;
  loom_parallel ps;
  loom_parallel_init(&ps, g_world, 1, 1, P, 1, false);
  loom_parallel_init_experts(&ps, 1, P);
  const loom_tp tp = loom_tp_of(&ps);
  ck_assert(tp.ep_group != NULL && ps.edp == 1);
  loom_gpt_config cfg = tiny_moe(capacity);
  cfg.moe.experts = 4 * P; /* four on each rank */
  cfg.bf16 = bf16;
  loom_gpt serial, split;
  ck_assert_int_eq(loom_gpt_init(&serial, &cfg, loom_ops_cpu(), 9, NULL), LOOM_OK);
  ck_assert_int_eq(loom_gpt_init(&split, &cfg, loom_ops_cpu(), 9, &tp), LOOM_OK);
  loom_gpt_set_batch_shape(&serial, T, B);
  loom_gpt_set_batch_shape(&split, T, B);
  ck_assert_int_eq(split.moe.local_experts, 4);
  loom_gpt_zero_grad(&serial);
  loom_gpt_zero_grad(&split);
  int tokens[N], targets[N];
  double mine[4] = {0}, want[4] = {0};
  for (int r = 0; r < P; r++) {
    for (int i = 0; i < N; i++) {
      tokens[i] = (int)(loom_rng_u32(5, 10 + (uint64_t)r, (uint64_t)i) % 256u);
      targets[i] = i % 7 == 3 ? -1 : (int)(loom_rng_u32(5, 20 + (uint64_t)r, (uint64_t)i) % 256u);
    }
    const loom_gpt_batch batch = {.tokens = tokens, .targets = targets, .sample_offset = 2 * r, .step = 3, .train = true};
    loom_gpt_moe_stats_reset(&serial);
    const double ls = loom_gpt_forward(&serial, &batch);
    loom_gpt_backward(&serial, &batch, 1.0f / N);
    if (r != ps.rank) continue;
    want[0] = ls, want[1] = serial.moe_stats.aux_loss, want[2] = serial.moe_stats.z_loss, want[3] = (double)serial.moe_stats.dropped;
    mine[0] = loom_gpt_forward(&split, &batch);
    loom_gpt_backward(&split, &batch, 1.0f / N);
    mine[1] = split.moe_stats.aux_loss, mine[2] = split.moe_stats.z_loss, mine[3] = (double)split.moe_stats.dropped;
  }
  const double tol = bf16 ? 1e-3 : 1e-6;
  for (int i = 0; i < 4; i++)
    ck_assert_msg(fabs(mine[i] - want[i]) <= tol * fabs(want[i]), "rank %d: %d: %g vs serial %g", ps.rank, i, mine[i], want[i]);
  ck_assert(want[1] > 0.0 && (capacity > 0.0) == (want[3] > 0.0));
  int experts = 0;
  for (int k = 0; k < split.p.grads.count; k++) {
    loom_tensor *g = &split.p.grads.views[k];
    const size_t n = loom_tensor_numel(g);
    if (!split.p.meta[k].expert) loom_comm_allreduce(ps.dp_group, g->data, n, LOOM_REDUCE_SUM);
    experts += split.p.meta[k].expert;
    const int j = loom_gpt_params_find(&serial.p, g->name);
    ck_assert_int_ge(j, 0);
    expect_nmse(g->data, serial.p.grads.views[j].data, n, bf16 ? 1e-4 : 1e-10, g->name);
  }
  ck_assert_int_eq(experts, cfg.layers * 4 * 2); /* up and down (GELU experts) of four in each layer */
  loom_gpt_free(&serial);
  loom_gpt_free(&split);
  loom_parallel_free(&ps);
}

START_TEST(experts_match_serial) { experts_match(0.0, false); }
END_TEST
START_TEST(experts_with_capacity_match_serial) { experts_match(1.0, false); }
END_TEST
START_TEST(experts_match_serial_bf16) { experts_match(0.0, true); }
END_TEST

/* Trains 10 steps; returns the losses and leaves the model in *m. */
static void train10(loom_gpt *m, const loom_tp *tp, loom_dataset *data, float *losses) {
  const loom_gpt_config cfg = tiny();
  loom_adamw opt;
  ck_assert_int_eq(loom_gpt_init(m, &cfg, loom_ops_cpu(), 21, tp), LOOM_OK);
  loom_gpt_set_batch_shape(m, cfg.seq, 2);
  const loom_adamw_config oc = loom_adamw_defaults();
  loom_adamw_init(&opt, &m->p, &oc);
  const loom_lr_schedule lr = {.max_lr = 1e-2f, .min_lr = 1e-3f, .warmup_steps = 2, .total_steps = 10};
  tu_train_serial(m, &opt, data, 4, lr, 10, losses, NULL);
  loom_adamw_free(&opt);
}

static void training_matches(bool sp, bool token_file) {
  loom_parallel ps;
  loom_parallel_init(&ps, g_world, g_world->size, 1, 1, 1, sp);
  const loom_tp tp = loom_tp_of(&ps);
  loom_dataset *data;
  if (token_file) {
    uint16_t tokens[2000];
    for (int i = 0; i < 2000; i++) tokens[i] = (uint16_t)("tensor parallel loom "[i % 21]);
    const char *path = tu_tmp_path("tp_tokens.bin");
    loom_error err = {0};
    ck_assert_int_eq(loom_token_file_write(path, tokens, 2000, &err), LOOM_OK);
    ck_assert_int_eq(loom_dataset_open_tokens(&data, path, NULL, 256, 8, LOOM_ORDER_SHUFFLED, 4, true, &err), LOOM_OK);
  } else {
    data = loom_dataset_addition(2, 4);
  }
  loom_gpt serial, split;
  float ls[10], lt[10];
  train10(&serial, NULL, data, ls);
  train10(&split, &tp, data, lt);
  for (int s = 0; s < 10; s++)
    ck_assert_msg(fabs(lt[s] - ls[s]) <= 1e-5 * fabs(ls[s]), "step %d: loss %g vs serial %g", s + 1, (double)lt[s], (double)ls[s]);
  ck_assert(ls[9] < ls[0]);
  float *want = malloc(split.p.params.numel * sizeof(float));
  tu_slice_of(&split.p, &serial.p.params, &serial.p, want);
  expect_nmse(split.p.params.base, want, split.p.params.numel, 1e-9, "final weights");
  ck_assert_double_le(tu_max_abs_diff(split.p.params.base, want, split.p.params.numel), 1e-4);
  free(want);
  loom_gpt_free(&serial);
  loom_gpt_free(&split);
  loom_dataset_free(data);
  loom_parallel_free(&ps);
}

START_TEST(training_matches_serial) { training_matches(false, false); }
END_TEST
START_TEST(training_matches_serial_sequence_parallel) { training_matches(true, false); }
END_TEST
START_TEST(training_on_a_token_file_matches_serial) { training_matches(false, true); }
END_TEST
START_TEST(training_on_a_token_file_matches_serial_sequence_parallel) { training_matches(true, true); }
END_TEST

/* ---- each TP layer against its serial self (tp 1 through the same code) ---- */

enum { LT = 4, LB = 2, LN = LT * LB, LIN = 8, LOUT = 16, LV = 30, LVP = 32 };

static float *rnd(size_t n, uint64_t stream) {
  float *p = malloc(n * sizeof(float));
  tu_fill(p, n, stream, -1.0f, 1.0f);
  return p;
}
/* Copies columns [c0, c0 + c) of every row of src[rows, width] into dst[rows, c]. */
static void cols(float *dst, const float *src, int rows, int width, int c0, int c) {
  for (int i = 0; i < rows; i++) memcpy(dst + (size_t)i * c, src + (size_t)i * width + c0, (size_t)c * sizeof(float));
}
static const loom_tp SERIAL_TP = {.group = NULL, .rank = 0, .size = 1, .sequence_parallel = false};

static void column_and_row_parallel(bool sp) {
  loom_parallel ps;
  loom_parallel_init(&ps, g_world, g_world->size, 1, 1, 1, sp);
  const loom_tp tp = loom_tp_of(&ps), *one = &SERIAL_TP;
  const loom_ops *ops = loom_ops_cpu();
  const int r = tp.rank, t = tp.size, n = loom_tp_local_rows(&tp, LT) * LB, row0 = sp ? r * n : 0;
  const int oc = LOUT / t; /* column-parallel: this rank's output features */
  float *x = rnd(LN * LIN, 1), *w = rnd(LOUT * LIN, 2), *b = rnd(LOUT, 3), *dy = rnd(LN * LOUT, 4);
  /* Serial reference. */
  float *y = malloc(LN * LOUT * sizeof(float)), *dx = malloc(LN * LIN * sizeof(float)), *xf = malloc(LN * LIN * sizeof(float));
  float *dw = calloc(LOUT * LIN, sizeof(float)), *db = calloc(LOUT, sizeof(float)), *scratch = malloc(LN * LIN * sizeof(float));
  loom_column_parallel_forward(one, ops, y, xf, x, NULL, loom_linear_fp32(w), b, LN, LN, LIN, LOUT);
  loom_column_parallel_backward(one, ops, dx, scratch, dw, db, dy, NULL, loom_bf16_values(xf), loom_linear_fp32(w), LN, LN, LIN, LOUT);
  /* ColumnParallelLinear: this rank's rows of w and b; input rows outside the region. */
  float *y_l = malloc(LN * oc * sizeof(float)), *xf_l = malloc(LN * LIN * sizeof(float)), *dx_l = malloc(LN * LIN * sizeof(float));
  float *dy_l = malloc(LN * oc * sizeof(float)), *dw_l = calloc(oc * LIN, sizeof(float)), *db_l = calloc(oc, sizeof(float));
  float *want = malloc(LN * LOUT * sizeof(float)), *full = malloc(LN * LOUT * sizeof(float)), *gs = malloc(LN * LOUT * sizeof(float));
  loom_column_parallel_forward(&tp, ops, y_l, xf_l, x + (size_t)row0 * LIN, NULL, loom_linear_fp32(w + (size_t)r * oc * LIN), b + r * oc, LN, n, LIN, oc);
  cols(want, y, LN, LOUT, r * oc, oc);
  expect_nmse(y_l, want, (size_t)LN * oc, 1e-12, "column-parallel output");
  loom_column_parallel_gather_output(&tp, ops, y_l, full, gs, LN, oc);
  expect_nmse(full, y, (size_t)LN * LOUT, 1e-12, "column-parallel gathered output");
  cols(dy_l, dy, LN, LOUT, r * oc, oc);
  loom_column_parallel_backward(&tp, ops, dx_l, scratch, dw_l, db_l, dy_l, NULL, loom_bf16_values(xf_l), loom_linear_fp32(w + (size_t)r * oc * LIN), LN, n, LIN, oc);
  expect_nmse(dx_l, dx + (size_t)row0 * LIN, (size_t)n * LIN, 1e-12, "column-parallel input grad");
  expect_nmse(dw_l, dw + (size_t)r * oc * LIN, (size_t)oc * LIN, 1e-12, "column-parallel weight grad");
  expect_nmse(db_l, db + r * oc, (size_t)oc, 1e-12, "column-parallel bias grad");
  float *split_back = malloc(LN * oc * sizeof(float));
  loom_column_parallel_gather_output_backward(&tp, ops, dy, split_back, LN, oc);
  ck_assert_mem_eq(split_back, dy_l, (size_t)LN * oc * sizeof(float));

  /* RowParallelLinear: w2[8, 16] split by columns; input already split. */
  const int ic = LOUT / t, O = LIN;
  float *w2 = rnd(O * LOUT, 5), *b2 = rnd(O, 6), *dz = rnd(LN * O, 7);
  float *z = malloc(LN * O * sizeof(float)), *part = malloc(LN * O * sizeof(float)), *dyy = calloc(LN * LOUT, sizeof(float));
  float *dw2 = calloc(O * LOUT, sizeof(float)), *db2 = calloc(O, sizeof(float)), *dzf = malloc(LN * O * sizeof(float));
  loom_row_parallel_forward(one, ops, z, part, loom_bf16_values(y), loom_linear_fp32(w2), b2, LN, LN, LOUT, O);
  loom_row_parallel_backward(one, ops, dyy, dw2, db2, dz, dzf, NULL, loom_bf16_values(y), loom_linear_fp32(w2), LN, LN, LOUT, O);
  float *w2_l = malloc(O * ic * sizeof(float)), *z_l = malloc(LN * O * sizeof(float)), *dyy_l = calloc(LN * ic, sizeof(float));
  float *dw2_l = calloc(O * ic, sizeof(float)), *db2_l = calloc(O, sizeof(float)), *want2 = malloc(LN * ic * sizeof(float));
  cols(w2_l, w2, O, LOUT, r * ic, ic);
  loom_row_parallel_forward(&tp, ops, z_l, part, loom_bf16_values(y_l), loom_linear_fp32(w2_l), b2, LN, n, ic, O);
  expect_nmse(z_l, z + (size_t)row0 * O, (size_t)n * O, 1e-12, "row-parallel output");
  loom_row_parallel_backward(&tp, ops, dyy_l, dw2_l, db2_l, dz + (size_t)row0 * O, dzf, NULL, loom_bf16_values(y_l), loom_linear_fp32(w2_l), LN, n, ic, O);
  loom_comm_allreduce(sp ? tp.group : NULL, db2_l, O, LOOM_REDUCE_SUM); /* SP: bias grads are per-rows partial */
  cols(want2, dyy, LN, LOUT, r * ic, ic);
  expect_nmse(dyy_l, want2, (size_t)LN * ic, 1e-12, "row-parallel input grad");
  cols(want2, dw2, O, LOUT, r * ic, ic);
  expect_nmse(dw2_l, want2, (size_t)O * ic, 1e-12, "row-parallel weight grad");
  expect_nmse(db2_l, db2, (size_t)O, 1e-12, "row-parallel bias grad");
  loom_parallel_free(&ps);
}

START_TEST(column_and_row_parallel_linear) { column_and_row_parallel(false); }
END_TEST
START_TEST(column_and_row_parallel_linear_sequence_parallel) { column_and_row_parallel(true); }
END_TEST

static void vocab_parallel(bool sp) {
  loom_parallel ps;
  loom_parallel_init(&ps, g_world, g_world->size, 1, 1, 1, sp);
  const loom_tp tp = loom_tp_of(&ps), *one = &SERIAL_TP;
  const loom_ops *ops = loom_ops_cpu();
  const int n = loom_tp_local_rows(&tp, LT) * LB, row0 = sp ? tp.rank * n : 0, H = 8;
  const loom_vocab_range all = loom_vocab_range_of(one, LV, LVP), mine = loom_vocab_range_of(&tp, LV, LVP);
  int tokens[LN], targets[LN];
  for (int i = 0; i < LN; i++) {
    tokens[i] = (i * 7 + 3) % LV;
    targets[i] = i == 5 ? -1 : (i * 11 + 1) % LV;
  }
  /* VocabParallelEmbedding. */
  float *wte = rnd(LVP * H, 8), *e = malloc(LN * H * sizeof(float)), *e_l = malloc(LN * H * sizeof(float));
  float *scratch = malloc(LN * H * sizeof(float)), *de = rnd(LN * H, 9);
  float *dwte = calloc(LVP * H, sizeof(float)), *dwte_l = calloc((size_t)mine.rows * H, sizeof(float));
  loom_vocab_parallel_embedding_forward(one, ops, e, scratch, tokens, loom_linear_fp32(wte), all, LT, LB, H);
  loom_vocab_parallel_embedding_forward(&tp, ops, e_l, scratch, tokens, loom_linear_fp32(wte + (size_t)mine.start * H), mine, LT, LB, H);
  expect_nmse(e_l, e + (size_t)row0 * H, (size_t)n * H, 1e-12, "vocab-parallel embedding output");
  loom_vocab_parallel_embedding_backward(one, ops, dwte, de, scratch, tokens, all, LT, LB, H);
  loom_vocab_parallel_embedding_backward(&tp, ops, dwte_l, de + (size_t)row0 * H, scratch, tokens, mine, LT, LB, H);
  expect_nmse(dwte_l, dwte + (size_t)mine.start * H, (size_t)mine.rows * H, 1e-12, "vocab-parallel embedding grad");
  /* Vocab-parallel cross-entropy: this rank's logit columns only. */
  float *z = rnd(LN * LVP, 10), *z_l = malloc(LN * (size_t)mine.rows * sizeof(float)), *want = malloc(LN * (size_t)mine.rows * sizeof(float));
  float loss[LN], lse[LN], picked[LN], tmp[LN], loss_l[LN], lse_l[LN], picked_l[LN];
  cols(z_l, z, LN, LVP, mine.start, mine.rows);
  const float mean = loom_vocab_parallel_cross_entropy(one, ops, loss, lse, picked, tmp, z, targets, all, LN);
  const float mean_l = loom_vocab_parallel_cross_entropy(&tp, ops, loss_l, lse_l, picked_l, tmp, z_l, targets, mine, LN);
  ck_assert_msg(fabs(mean_l - mean) <= 1e-6 * fabs(mean), "vocab-parallel loss %g vs %g", (double)mean_l, (double)mean);
  expect_nmse(loss_l, loss, LN, 1e-12, "vocab-parallel per-token losses");
  loom_vocab_parallel_cross_entropy_backward(ops, z, z, lse, targets, all, 0.25f, LN);
  loom_vocab_parallel_cross_entropy_backward(ops, z_l, z_l, lse_l, targets, mine, 0.25f, LN);
  cols(want, z, LN, LVP, mine.start, mine.rows);
  expect_nmse(z_l, want, LN * (size_t)mine.rows, 1e-12, "vocab-parallel logit grads");
  for (int i = 0; i < LN; i++)
    for (int c = LV; c < LVP; c++) ck_assert_float_eq(z[(size_t)i * LVP + c], 0.0f); /* padding stays out */
  loom_parallel_free(&ps);
}

START_TEST(vocab_parallel_embedding_and_loss) { vocab_parallel(false); }
END_TEST
START_TEST(vocab_parallel_embedding_and_loss_sequence_parallel) { vocab_parallel(true); }
END_TEST

/* World ranks of a group's members, in group order. */
static void members(loom_comm *group, int *out) {
  float me = (float)g_world->rank, all[64];
  loom_comm_allgather(group, &me, all, 1);
  for (int i = 0; i < loom_comm_size(group); i++) out[i] = (int)all[i];
}

/* Rank order is tp fastest, then cp, then dp, then pp; each group shares the other coordinates. */
START_TEST(groups_follow_rank_order) {
  const loom_grid_coords c = loom_parallel_coords(13, (loom_grid_coords){.tp = 2, .cp = 1, .dp = 4, .pp = 2});
  const int t = c.tp, d = c.dp, p = c.pp; /* 13 = 1 + 2 * (2 + 4 * 1) */
  /* With cp 2 between them: 29 = 1 + 2 * (0 + 2 * (3 + 4 * 1)) */
  const loom_grid_coords w = loom_parallel_coords(29, (loom_grid_coords){.tp = 2, .cp = 2, .dp = 4, .pp = 2});
  ck_assert(w.tp == 1 && w.cp == 0 && w.dp == 3 && w.pp == 1);
  /* Experts regroup the same ranks: in a stage of tp 2 x dp 4, etp 1 x ep 4 puts ranks 0-3 in one EP group and
   * 4-7 in the next (edp 2), etp 2 x ep 2 strides the EP group by 2; world rank 13 is the second stage's 5. */
  loom_expert_coords x;
  ck_assert_int_eq(loom_expert_coords_of(13, 2, 4, 1, 4, &x), 0);
  ck_assert(x.etp_rank == 0 && x.ep_rank == 1 && x.edp_rank == 1 && x.edp == 2);
  ck_assert_int_eq(loom_expert_coords_of(13, 2, 4, 2, 2, &x), 0);
  ck_assert(x.etp_rank == 1 && x.ep_rank == 0 && x.edp_rank == 1 && x.edp == 2);
  ck_assert_int_eq(loom_expert_coords_of(6, 2, 4, 1, 8, &x), 0);
  ck_assert(x.ep_rank == 6 && x.edp_rank == 0 && x.edp == 1);
  ck_assert_int_eq(loom_expert_coords_of(0, 2, 3, 4, 1, &x), -1); /* etp 4 does not divide a stage of 6 */
  ck_assert_int_eq(t, 1);
  ck_assert_int_eq(d, 2);
  ck_assert_int_eq(p, 1);
}
END_TEST

/* On four ranks (registered only there): the groups tp 2 x pp 2 and dp 4 make. */
START_TEST(groups_of_four_ranks) {
  loom_parallel ps;
  loom_parallel_init(&ps, g_world, 2, 2, 1, 1, false); /* tp 2 x pp 2 */
  int m[4];
  const int r = g_world->rank;
  members(ps.tp_group, m);
  ck_assert_int_eq(m[0], r / 2 * 2);
  ck_assert_int_eq(m[1], r / 2 * 2 + 1);
  members(ps.pp_group, m);
  ck_assert_int_eq(m[0], r % 2);
  ck_assert_int_eq(m[1], r % 2 + 2);
  ck_assert_int_eq(loom_comm_size(ps.dp_group), 1);
  ck_assert_ptr_nonnull(ps.embed_group); /* with 2 stages every rank is first or last */
  members(ps.embed_group, m);
  ck_assert_int_eq(m[0], r % 2);
  ck_assert_int_eq(m[1], r % 2 + 2);
  loom_parallel_free(&ps);
  loom_parallel_init(&ps, g_world, 1, 1, 4, 1, false); /* dp 4 */
  ck_assert_int_eq(loom_comm_size(ps.dp_group), 4);
  ck_assert_int_eq(ps.dp_rank, r);
  ck_assert_ptr_eq(ps.dp_cp_group, ps.dp_group); /* no cp: grads cross dp alone */
  ck_assert_ptr_null(ps.cp_group);
  loom_parallel_free(&ps);
  loom_parallel_init(&ps, g_world, 1, 1, 2, 2, false); /* cp 2 x dp 2: the cp group is the faster pair */
  members(ps.cp_group, m);
  ck_assert(ps.cp_rank == r % 2 && m[0] == r / 2 * 2 && m[1] == r / 2 * 2 + 1);
  members(ps.dp_group, m);
  ck_assert(ps.dp_rank == r / 2 && m[0] == r % 2 && m[1] == r % 2 + 2);
  ck_assert_int_eq(loom_comm_size(ps.dp_cp_group), 4);
  ck_assert_int_eq(ps.dp_cp_rank, r);
  loom_parallel_free(&ps);
  loom_parallel_init(&ps, g_world, 2, 1, 1, 2, false); /* tp 2 x cp 2: tp fastest */
  members(ps.cp_group, m);
  ck_assert(m[0] == r % 2 && m[1] == r % 2 + 2);
  members(ps.tp_group, m);
  ck_assert(m[0] == r / 2 * 2 && m[1] == r / 2 * 2 + 1);
  loom_parallel_free(&ps);
}
END_TEST

/* Broadcast and point-to-point transfers deliver exactly what was sent. */
START_TEST(collectives_are_exact) {
  float buf[5] = {0};
  if (g_world->rank == 0)
    for (int i = 0; i < 5; i++) buf[i] = (float)(i * 3 + 1);
  loom_comm_broadcast(g_world, buf, 5, 0);
  for (int i = 0; i < 5; i++) ck_assert_float_eq(buf[i], (float)(i * 3 + 1));
}
END_TEST

/* A ring of point-to-point transfers (registered on two ranks or more). */
START_TEST(point_to_point_is_exact) {
  const int next = (g_world->rank + 1) % g_world->size, prev = (g_world->rank + g_world->size - 1) % g_world->size;
  float out[3] = {(float)g_world->rank, 7.0f, -1.0f}, in[3];
  loom_request *r = loom_comm_irecv(g_world, in, 3, prev, 3);
  loom_comm_wait(g_world, loom_comm_isend(g_world, out, 3, next, 3));
  loom_comm_wait(g_world, r);
  ck_assert_float_eq(in[0], (float)prev);
  ck_assert_float_eq(in[1], 7.0f);
  loom_comm_barrier(g_world);
}
END_TEST

/* Integers, doubles and bytes travel exactly: values a float would round. */
START_TEST(typed_collectives_are_exact) {
  const int64_t big = ((int64_t)1 << 40) + 3 + g_world->rank; /* far past a float's 24 bits */
  int64_t sum = big;
  loom_comm_allreduce_typed(g_world, &sum, 1, LOOM_DTYPE_I64, LOOM_REDUCE_SUM);
  const int64_t n = g_world->size;
  ck_assert_int_eq(sum, n * (((int64_t)1 << 40) + 3) + n * (n - 1) / 2);
  double tiny = 1.0 + 1e-12 * (g_world->rank + 1); /* 1e-12 is below a float's resolution at 1 */
  loom_comm_allreduce_typed(g_world, &tiny, 1, LOOM_DTYPE_F64, LOOM_REDUCE_MAX);
  ck_assert(tiny == 1.0 + 1e-12 * (double)n);
  int32_t most = 16777217 * (g_world->rank == 0); /* 2^24 + 1: the first integer a float cannot hold */
  loom_comm_allreduce_typed(g_world, &most, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  ck_assert_int_eq(most, 16777217);
  uint32_t crc = 0xfedcba98u ^ (uint32_t)g_world->rank, crcs[64];
  ck_assert_int_le(g_world->size, 64);
  loom_comm_allgather_typed(g_world, &crc, crcs, sizeof crc, LOOM_DTYPE_BYTE);
  for (int r = 0; r < g_world->size; r++) ck_assert_uint_eq(crcs[r], 0xfedcba98u ^ (uint32_t)r);
  int64_t counts[2] = {0, 0};
  if (g_world->rank == 0) counts[0] = INT64_MAX, counts[1] = -((int64_t)1 << 53) - 1;
  loom_comm_broadcast_typed(g_world, counts, 2, LOOM_DTYPE_I64, 0);
  ck_assert(counts[0] == INT64_MAX && counts[1] == -((int64_t)1 << 53) - 1);
}
END_TEST

/* All-to-all-v, as MoE's dispatch moves tokens: rank s sends rank d
 * (s + 2d) % 3 rows (so some pairs move nothing, the rank itself too), each
 * value naming its sender, receiver and place; the counts exchanged first
 * are what each sender sends; the bytes sent to peers count in ring_bytes.
 * Then the same in i64, values a float would round. */
START_TEST(alltoallv_moves_each_peers_rows) {
  const int n = g_world->size, me = g_world->rank, w = 5; /* values per row */
  size_t *sc = calloc((size_t)n, sizeof *sc), *rc = calloc((size_t)n, sizeof *rc), sent = 0, to_peers = 0;
  for (int d = 0; d < n; d++) sent += sc[d] = (size_t)((me + 2 * d) % 3) * w, to_peers += d == me ? 0 : sc[d];
  loom_comm_alltoall_counts(g_world, sc, rc);
  size_t got = 0;
  for (int s = 0; s < n; s++) {
    ck_assert_uint_eq(rc[s], (size_t)((s + 2 * me) % 3) * w);
    got += rc[s];
  }
  float *send = malloc((sent + 1) * sizeof *send), *recv = malloc((got + 1) * sizeof *recv);
  int64_t *send64 = malloc((sent + 1) * sizeof *send64), *recv64 = malloc((got + 1) * sizeof *recv64);
  size_t at = 0;
  for (int d = 0; d < n; d++)
    for (size_t i = 0; i < sc[d]; i++, at++)
      send[at] = (float)(1000 * me + 100 * d + (int)i), send64[at] = ((int64_t)1 << 40) * (me + 1) + 1000 * d + (int64_t)i;
  const double before = g_world->ring_bytes;
  loom_comm_alltoallv_typed(g_world, send, sc, recv, rc, LOOM_DTYPE_F32);
  ck_assert_double_eq(g_world->ring_bytes - before, 4.0 * (double)to_peers);
  loom_comm_alltoallv_typed(g_world, send64, sc, recv64, rc, LOOM_DTYPE_I64);
  at = 0;
  for (int s = 0; s < n; s++)
    for (size_t i = 0; i < rc[s]; i++, at++) {
      ck_assert_msg(recv[at] == (float)(1000 * s + 100 * me + (int)i), "rank %d: value %zu from rank %d is %g", me, i, s,
                    (double)recv[at]);
      ck_assert(recv64[at] == ((int64_t)1 << 40) * (s + 1) + 1000 * me + (int64_t)i);
    }
  ck_assert_uint_eq(at, got);
  free(send), free(recv), free(send64), free(recv64), free(sc), free(rc);
}
END_TEST

/* A reduce-scatter past the MPI backend's piece size (2^22 elements per
 * rank, which it sends in pieces) sums every element exactly, the ragged
 * last piece included: integer values, exact in a float. */
START_TEST(large_reduce_scatter_is_exact) {
  const size_t n = ((size_t)1 << 22) + 1000 + 3, size = (size_t)g_world->size;
  float *send = malloc(size * n * sizeof(float)), *recv = malloc(n * sizeof(float));
  ck_assert(send && recv);
  for (size_t d = 0; d < size; d++)
    for (size_t i = 0; i < n; i++) send[d * n + i] = (float)((g_world->rank + 1) * (int)(i % 1000 + d));
  loom_comm_reduce_scatter(g_world, send, recv, n);
  const float ranks = (float)(size * (size + 1) / 2);
  size_t wrong = 0;
  for (size_t i = 0; i < n; i++) wrong += recv[i] != ranks * (float)(i % 1000 + (size_t)g_world->rank);
  ck_assert_msg(wrong == 0, "rank %d: %zu of %zu elements wrong", g_world->rank, wrong, n);
  free(send);
  free(recv);
}
END_TEST

/* The same in bf16, the sum a bf16 run's sequence-parallel regions use:
 * small integers, whose every partial sum bf16 holds exactly. */
START_TEST(large_bf16_reduce_scatter_is_exact) {
  const size_t n = ((size_t)1 << 22) + 1000 + 3, size = (size_t)g_world->size;
  ck_assert_uint_le(size, 8); /* sums stay below 2^8 */
  uint16_t *send = malloc(size * n * sizeof(uint16_t)), *recv = malloc(n * sizeof(uint16_t));
  ck_assert(send && recv);
  for (size_t d = 0; d < size; d++)
    for (size_t i = 0; i < n; i++) send[d * n + i] = loom_bf16_round((float)((g_world->rank + 1) * (int)(i % 4 + d)));
  loom_comm_reduce_scatter_typed(g_world, send, recv, n, LOOM_DTYPE_BF16);
  const float ranks = (float)(size * (size + 1) / 2);
  size_t wrong = 0;
  for (size_t i = 0; i < n; i++) wrong += loom_bf16_value(recv[i]) != ranks * (float)(i % 4 + (size_t)g_world->rank);
  ck_assert_msg(wrong == 0, "rank %d: %zu of %zu elements wrong", g_world->rank, wrong, n);
  free(send);
  free(recv);
}
END_TEST

/* The shard mapping: c_attn rank r owns the q, k and v rows of its heads. */
START_TEST(qkv_shards_follow_heads) {
  const loom_shard_layout l = {.partition_dim = 0, .parts = 3, .rows = 24, .cols = 8};
  int64_t row, col;
  loom_shard_locate(&l, 1, 4, 0, &row, &col);
  ck_assert_int_eq(row, 2); /* q rows 2-3 */
  loom_shard_locate(&l, 1, 4, 2, &row, &col);
  ck_assert_int_eq(row, 10); /* k rows 10-11 */
  loom_shard_locate(&l, 1, 4, 5, &row, &col);
  ck_assert_int_eq(row, 19); /* v rows 18-19 */
  const loom_shard_layout rowpar = {.partition_dim = 1, .rows = 8, .cols = 32};
  loom_shard_locate(&rowpar, 3, 4, 5, &row, &col);
  ck_assert_int_eq(row, 5);
  ck_assert_int_eq(col, 24);
}
END_TEST

int main(int argc, char **argv) {
  g_world = loom_comm_mpi_world(&argc, &argv);
  Suite *s = suite_create("tp");
  TCase *tc = tcase_create("tp");
  tcase_add_test(tc, qkv_shards_follow_heads);
  tcase_add_test(tc, collectives_are_exact);
  if (g_world->size >= 2) tcase_add_test(tc, point_to_point_is_exact);
  tcase_add_test(tc, typed_collectives_are_exact);
  tcase_add_test(tc, alltoallv_moves_each_peers_rows);
  tcase_add_test(tc, large_reduce_scatter_is_exact);
  tcase_add_test(tc, large_bf16_reduce_scatter_is_exact);
  tcase_add_test(tc, groups_follow_rank_order);
  if (g_world->size == 4) tcase_add_test(tc, groups_of_four_ranks);
  tcase_add_test(tc, column_and_row_parallel_linear);
  tcase_add_test(tc, column_and_row_parallel_linear_sequence_parallel);
  tcase_add_test(tc, vocab_parallel_embedding_and_loss);
  tcase_add_test(tc, vocab_parallel_embedding_and_loss_sequence_parallel);
  tcase_add_test(tc, layers_match_serial);
  tcase_add_test(tc, layers_match_serial_sequence_parallel);
  tcase_add_test(tc, moe_layers_match_serial);
  tcase_add_test(tc, moe_layers_match_serial_sequence_parallel);
  tcase_add_test(tc, moe_layers_with_capacity_match_serial_sequence_parallel);
  tcase_add_test(tc, experts_match_serial);
  tcase_add_test(tc, experts_with_capacity_match_serial);
  tcase_add_test(tc, experts_match_serial_bf16);
  tcase_add_test(tc, training_matches_serial);
  tcase_add_test(tc, training_matches_serial_sequence_parallel);
  tcase_add_test(tc, training_on_a_token_file_matches_serial);
  tcase_add_test(tc, training_on_a_token_file_matches_serial_sequence_parallel);
  suite_add_tcase(s, tc);
  return tu_run_mpi(s, g_world);
}
