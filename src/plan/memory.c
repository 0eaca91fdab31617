/* The memory model: every buffer a rank allocates for a plan. */
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "layers/gpt.h"
#include "plan/rank_sheet.h"

const char *loom_memory_kind_name(loom_memory_kind kind) {
  static const char *const NAMES[LOOM_MEM_KINDS] = {"weights", "master weights", "grads", "Adam", "activations",
                                                    "weight-grad states", "p2p buffers", "ZeRO in transit",
                                                    "bf16 grads for dp", "grad compression"};
  return kind >= 0 && kind < LOOM_MEM_KINDS ? NAMES[kind] : "unknown";
}

double loom_memory_total(const loom_memory *m) {
  double total = 0.0;
  for (int k = 0; k < LOOM_MEM_KINDS; k++) total += m->bytes[k];
  return total;
}

/* ---- the schedule's peaks, per shape ---- */

/* A plan search asks for the same schedule shape (kind, pp, vpp,
 * micro-batches) under many tp, sp, ZeRO and recompute choices: the shapes
 * counted are kept, each counted once (a shape of 12,288 micro-batches on
 * 96 ranks is 7 million actions), in an open-addressed table emptied
 * whenever it holds more than MEMO_MAX_COUNTS counts (64 MiB). */
typedef struct {
  int kind, pp, vpp, m;                  /* pp 0: an empty slot */
  int *live, *slots, *deferred, *sends;  /* [pp], [pp * vpp], [pp * vpp], [pp] */
} shape_memo;
enum { MEMO_SLOTS = 1 << 13, MEMO_MAX_COUNTS = 1 << 24 };
static shape_memo g_memo[MEMO_SLOTS];
static int g_memo_shapes;
static int64_t g_memo_counts;

static shape_memo *memo_slot(int kind, int pp, int vpp, int m) {
  uint64_t h = ((uint64_t)(unsigned)kind * 0x9E3779B97F4A7C15u) ^ ((uint64_t)(unsigned)pp << 40) ^
               ((uint64_t)(unsigned)vpp << 32) ^ (uint64_t)(unsigned)m;
  h *= 0xBF58476D1CE4E5B9u;
  for (uint64_t i = h >> 51;; i = (i + 1) % MEMO_SLOTS) {
    shape_memo *e = &g_memo[i];
    if (!e->pp || (e->kind == kind && e->pp == pp && e->vpp == vpp && e->m == m)) return e;
  }
}

static void memo_clear(void) {
  for (int i = 0; i < MEMO_SLOTS; i++) {
    free(g_memo[i].live);
    g_memo[i] = (shape_memo){0};
  }
  g_memo_shapes = 0, g_memo_counts = 0;
}

/* The shape's peaks, counted once; NULL if the schedule cannot be built. */
static const shape_memo *shape_peaks(int kind, int pp, int vpp, int m) {
  shape_memo *e = memo_slot(kind, pp, vpp, m);
  if (e->pp) return e;
  const int64_t counts = 2 * (int64_t)pp * (1 + vpp);
  if (2 * (g_memo_shapes + 1) > MEMO_SLOTS || g_memo_counts + counts > MEMO_MAX_COUNTS) {
    memo_clear();
    e = memo_slot(kind, pp, vpp, m);
  }
  int *all = loom_xmalloc((size_t)counts * sizeof *all, "schedule memo"); /* one block: live, slots, deferred, sends */
  shape_memo x = {.kind = kind, .pp = pp, .vpp = vpp, .m = m, .live = all, .slots = all + pp,
                  .deferred = all + pp + (size_t)pp * vpp, .sends = all + pp + 2 * (size_t)pp * vpp};
  loom_error err;
  if (loom_schedule_shape_peaks((loom_schedule_kind)kind, pp, vpp, m, x.live, x.slots, x.deferred, x.sends, &err) != LOOM_OK) {
    free(all);
    return NULL;
  }
  *e = x;
  g_memo_shapes++, g_memo_counts += counts;
  return e;
}

int loom_schedule_rank_buffers(loom_schedule_kind kind, int pp, int vpp, int m, int pp_rank, int *slots, int *deferred,
                               int *sends) {
  const shape_memo *e = shape_peaks((int)kind, pp, vpp, m);
  for (int c = 0; c < vpp; c++) {
    slots[c] = e && e->slots[pp_rank * vpp + c] > 0 ? e->slots[pp_rank * vpp + c] : 1;
    deferred[c] = e ? e->deferred[pp_rank * vpp + c] : 0;
  }
  *sends = e ? e->sends[pp_rank] : 0;
  return e ? e->live[pp_rank] : 0;
}

int loom_plan_rank_buffers(const loom_plan *p, int pp_rank, int *slots, int *deferred, int *sends) {
  return loom_schedule_rank_buffers(p->schedule, p->parallel->pp, p->parallel->virtual_chunks, loom_plan_micro_batches(p),
                                    pp_rank, slots, deferred, sends);
}

void loom_sheet_count_buffers(loom_rank_sheet *s) {
  int slots[LOOM_PLAN_MAX_CHUNKS], deferred[LOOM_PLAN_MAX_CHUNKS];
  loom_schedule_rank_buffers(s->kind, s->size.pp, s->chunks, s->micro_batches, s->at.pp, slots, deferred, &s->sends);
  for (int c = 0; c < s->chunks; c++) s->chunk[c].slots = slots[c], s->chunk[c].weight_states = deferred[c];
}

/* ---- ZeRO's cut ---- */

loom_zero_cut loom_plan_zero_cut(const loom_plan *p, const loom_stage_range *range) {
  loom_gpt_config cfg;
  loom_plan_rank_config(p, &cfg);
  return loom_gpt_zero_cut(&cfg, range, p->parallel->tp, loom_plan_grad_replicas(p), p->parallel->zero_stage);
}

/* ---- a chunk's buffers ---- */

double loom_buffer_row_bytes(const loom_buffer_row *r) {
  return (double)r->count * (double)r->elements * (double)loom_dtype_size(r->dtype);
}

loom_memory loom_buffer_rows_memory(const loom_buffer_row *rows, int n) {
  loom_memory out = {0};
  for (int i = 0; i < n; i++) out.bytes[rows[i].kind] += loom_buffer_row_bytes(&rows[i]);
  return out;
}

/* The rows of one chunk as they are added. */
typedef struct {
  loom_buffer_row *rows;
  int count, chunk;
} row_list;

static void add(row_list *l, loom_memory_kind kind, loom_run_buffer name, int count, size_t elements, loom_dtype dtype,
                loom_buffer_life life) {
  LOOM_CHECK(l->count < LOOM_CHUNK_ROWS, "a chunk's buffer rows fit LOOM_CHUNK_ROWS");
  if (count > 0 && elements > 0)
    l->rows[l->count++] = (loom_buffer_row){.name = name, .kind = kind, .chunk = l->chunk,
                                            .count = count, .elements = elements, .dtype = dtype, .life = life};
}

/* A buffer held for the whole run; a zero-length one still takes one element (as the runtime allocates it). */
static void add_held(row_list *l, loom_memory_kind kind, loom_run_buffer name, int count, size_t elements, loom_dtype dtype) {
  add(l, kind, name, count, elements ? elements : 1, dtype, LOOM_LIFE_RUN);
}

/* Parameters, grads, Adam and ZeRO's buffers: as the layers keep them
 * (loom_gpt_params_stored_elements), and as the optimizers (optim/adamw.c,
 * optim/zero.c) and ZeRO-2/3's runtime (pipeline/zero_runtime.c) allocate
 * them by ZeRO's cut (loom_gpt_zero_cut). */
static void add_state(row_list *l, const loom_rank_sheet *s, const loom_stage_range *range) {
  const loom_gpt_config *cfg = &s->rank_model;
  const int zero = s->zero_stage, tp = s->size.tp, dp = s->grad_replicas;
  const size_t n = (size_t)loom_gpt_param_count(cfg, range, tp);
  const loom_dtype f32 = LOOM_DTYPE_F32, bf16 = LOOM_DTYPE_BF16;
  const loom_gpt_params_elements kept = loom_gpt_params_stored_elements(cfg, range, tp, dp, zero);
  /* The fp32 weights are the master beside a bf16 copy, else what the layers compute with. */
  add_held(l, cfg->bf16 ? LOOM_MEM_MASTER : LOOM_MEM_WEIGHTS, LOOM_BUF_PARAMS, kept.params > 0, kept.params, f32);
  add_held(l, LOOM_MEM_GRADS, LOOM_BUF_GRADS, kept.grads > 0, kept.grads, f32);
  add_held(l, LOOM_MEM_WEIGHTS, LOOM_BUF_COMPUTE, kept.compute > 0, kept.compute, bf16);
  if (zero == 0) {
    add_held(l, LOOM_MEM_OPTIMIZER, LOOM_BUF_ADAM_M, 1, n, f32);
    add_held(l, LOOM_MEM_OPTIMIZER, LOOM_BUF_ADAM_V, 1, n, f32);
    return;
  }
  /* The optimizer's pieces. */
  const loom_zero_cut z = loom_gpt_zero_cut(cfg, range, tp, dp, zero);
  add_held(l, LOOM_MEM_OPTIMIZER, LOOM_BUF_ADAM_M, 1, z.shard, f32);
  add_held(l, LOOM_MEM_OPTIMIZER, LOOM_BUF_ADAM_V, 1, z.shard, f32);
  add_held(l, LOOM_MEM_ZERO_TRANSIENT, LOOM_BUF_ZERO_SLICE, 1, z.slice, f32);
  add_held(l, LOOM_MEM_MASTER, LOOM_BUF_ZERO_MASTER, kept.params == 0, z.shard, f32); /* the model keeps no fp32 weights */
  add_held(l, LOOM_MEM_GRADS, LOOM_BUF_ZERO_GRAD, zero >= 2, z.shard, f32);
  add_held(l, LOOM_MEM_ZERO_TRANSIENT, LOOM_BUF_ZERO_STAGING, z.staging > 0, z.staging, f32);
  if (zero < 2) return;
  /* The runtime's: two layers' grads and their pieces in flight, the edges' grads and a piece; under ZeRO-3 two
   * layers' gathered weights, their sends and the edges' weights; with bf16 grad reduction the grads' bf16 twins
   * as they cross, and their pieces. */
  const loom_memory_kind t = LOOM_MEM_ZERO_TRANSIENT;
  add_held(l, t, LOOM_BUF_ZERO_LAYER_GRADS, 2, z.layer_max, f32);
  add_held(l, t, LOOM_BUF_ZERO_LAYER_PIECE, 2, z.layer_shard, f32);
  add_held(l, t, LOOM_BUF_ZERO_EDGE_GRADS, 1, z.edges, f32);
  add_held(l, t, LOOM_BUF_ZERO_EDGE_PIECE, 1, z.edge_shard, f32);
  const int twins = s->grad_dtype == LOOM_DTYPE_BF16;
  add_held(l, t, LOOM_BUF_ZERO_LAYER_GRADS_BF16, 2 * twins, z.layer_max, bf16);
  add_held(l, t, LOOM_BUF_ZERO_LAYER_PIECE_BF16, 2 * twins, z.layer_shard, bf16);
  add_held(l, t, LOOM_BUF_ZERO_EDGE_GRADS_BF16, twins, z.edges, bf16);
  add_held(l, t, LOOM_BUF_ZERO_EDGE_PIECE_BF16, twins, z.edge_shard, bf16);
  const int three = zero == 3;
  add_held(l, t, LOOM_BUF_ZERO_LAYER_WEIGHTS, 2 * three, z.layer_max, s->compute_dtype);
  add_held(l, t, LOOM_BUF_ZERO_LAYER_SEND, 2 * three, z.layer_shard, f32);
  add_held(l, t, LOOM_BUF_ZERO_EDGE_WEIGHTS, three, z.edges, s->compute_dtype);
}

/* Activation slots, weight-grad states and the chunk's scratch, as the layers list them. */
static void add_activations(row_list *l, const loom_rank_sheet *s, const loom_stage_range *range, loom_recompute recompute,
                            int slots, int deferred) {
  const loom_gpt_activation_sizes a = loom_gpt_activation_sizes_of(&s->rank_model, s->seq, s->micro_batch, s->size.tp,
                                                                   s->sequence_parallel, range, recompute);
  const loom_memory_kind act = LOOM_MEM_ACTIVATIONS, ws = LOOM_MEM_WEIGHT_GRAD_STATES;
  add(l, act, LOOM_BUF_SLOT, slots, a.slot, LOOM_DTYPE_F32, LOOM_LIFE_SLOT);
  add(l, act, LOOM_BUF_SLOT_BF16, slots, a.slot16, LOOM_DTYPE_BF16, LOOM_LIFE_SLOT);
  add(l, act, LOOM_BUF_SLOT_TOKENS, 3 * slots, a.tokens, LOOM_DTYPE_I32, LOOM_LIFE_SLOT);
  add(l, act, LOOM_BUF_WORK, 1, a.work, LOOM_DTYPE_F32, LOOM_LIFE_RUN);
  add(l, act, LOOM_BUF_WORK_BF16, 1, a.work16, LOOM_DTYPE_BF16, LOOM_LIFE_RUN);
  add(l, ws, LOOM_BUF_WSTATE, deferred, a.wstate, LOOM_DTYPE_F32, LOOM_LIFE_WEIGHT_STATE);
  add(l, ws, LOOM_BUF_WSTATE_BF16, deferred, a.wstate16, LOOM_DTYPE_BF16, LOOM_LIFE_WEIGHT_STATE);
}

/* The rank's transfers (chunk -1): its send buffers, the received grad (fp32), and with bf16 messages to receive
 * their staging. */
static void add_transfers(row_list *l, const loom_rank_sheet *s) {
  const loom_gpt_config *cfg = &s->rank_model;
  const int chunk = l->chunk, T = s->seq, B = s->micro_batch, tp = s->size.tp;
  l->chunk = -1;
  const size_t words = loom_gpt_boundary_words(cfg, T, B, tp, s->sequence_parallel);
  add(l, LOOM_MEM_P2P, LOOM_BUF_SEND, s->sends, words, LOOM_DTYPE_F32, LOOM_LIFE_SEND);
  add(l, LOOM_MEM_P2P, LOOM_BUF_RECEIVE, cfg->bf16 && s->size.pp > 1, words, LOOM_DTYPE_F32, LOOM_LIFE_RUN);
  add(l, LOOM_MEM_P2P, LOOM_BUF_DOUT, 1, loom_gpt_boundary_floats(cfg, T, B, tp, s->sequence_parallel), LOOM_DTYPE_F32,
      LOOM_LIFE_RUN);
  l->chunk = chunk;
}

/* What crosses data parallelism: the grads as bf16 (padded as ZeRO-1 pads them; ZeRO-2/3's are transient) and
 * grad compression's state. */
static void add_dp(row_list *l, const loom_rank_sheet *s, const loom_stage_range *range) {
  const loom_gpt_config *cfg = &s->rank_model;
  const int tp = s->size.tp, dp = s->grad_replicas;
  if (dp < 2) return;
  if (s->grad_dtype == LOOM_DTYPE_BF16 && s->zero_stage < 2)
    add_held(l, LOOM_MEM_GRAD_REDUCE, LOOM_BUF_GRAD_BF16, 1,
             loom_gpt_zero_in_place(cfg, s->zero_stage) ? loom_gpt_zero_cut(cfg, range, tp, dp, s->zero_stage).shard * (size_t)dp
                                                        : (size_t)loom_gpt_param_count(cfg, range, tp),
             LOOM_DTYPE_BF16);
  if (s->compression.kind == LOOM__COMPRESSION_KIND__COMPRESSION_NONE) return;
  const loom_compression_cost c = loom_range_compression_cost(&s->model, tp, s->etp, s->ep, &s->compression, range);
  add_held(l, LOOM_MEM_COMPRESSION, LOOM_BUF_COMPRESS_ERROR, 1, (size_t)c.error_words, LOOM_DTYPE_F32);
  add_held(l, LOOM_MEM_COMPRESSION, LOOM_BUF_COMPRESS_A, 1, (size_t)c.a_words, LOOM_DTYPE_F32);
  add_held(l, LOOM_MEM_COMPRESSION, LOOM_BUF_COMPRESS_B, 1, (size_t)c.b_words, LOOM_DTYPE_F32);
}

int loom_sheet_chunk_rows(const loom_rank_sheet *s, int chunk, int recompute_layers, loom_buffer_row rows[LOOM_CHUNK_ROWS]) {
  const loom_sheet_chunk *k = &s->chunk[chunk];
  const loom_recompute recompute = recompute_layers == LOOM_RECOMPUTE_PLAN ? k->recompute : (loom_recompute){recompute_layers, 1};
  row_list l = {.rows = rows, .chunk = chunk};
  add_state(&l, s, &k->range);
  add_activations(&l, s, &k->range, recompute, k->slots, k->weight_states);
  if (chunk == 0) add_transfers(&l, s);
  add_dp(&l, s, &k->range);
  return l.count;
}

double loom_sheet_activations(const loom_rank_sheet *s, int recompute_layers) {
  double bytes = 0.0;
  loom_buffer_row rows[LOOM_CHUNK_ROWS];
  for (int c = 0; c < s->chunks; c++) {
    const loom_memory one = loom_buffer_rows_memory(rows, loom_sheet_chunk_rows(s, c, recompute_layers, rows));
    bytes += one.bytes[LOOM_MEM_ACTIVATIONS] + one.bytes[LOOM_MEM_WEIGHT_GRAD_STATES];
  }
  return bytes;
}

/* Pipeline rank pp_rank's sheet, resolved and counted: no schedule, no list. */
static void stage_sheet(const loom_plan *p, int pp_rank, loom_rank_sheet *s) {
  loom_plan_resolve(p, loom_plan_pipeline_rank(p, pp_rank), s);
  loom_sheet_count_buffers(s);
}

loom_memory loom_plan_chunk_memory(const loom_plan *p, int pp_rank, int chunk, int recompute_layers) {
  loom_rank_sheet s;
  stage_sheet(p, pp_rank, &s);
  loom_buffer_row rows[LOOM_CHUNK_ROWS];
  return loom_buffer_rows_memory(rows, loom_sheet_chunk_rows(&s, chunk, recompute_layers, rows));
}

loom_memory loom_plan_rank_memory(const loom_plan *p, int pp_rank) {
  loom_rank_sheet s;
  stage_sheet(p, pp_rank, &s);
  loom_memory out = {0};
  loom_buffer_row rows[LOOM_CHUNK_ROWS];
  for (int c = 0; c < s.chunks; c++) {
    const loom_memory one = loom_buffer_rows_memory(rows, loom_sheet_chunk_rows(&s, c, LOOM_RECOMPUTE_PLAN, rows));
    for (int k = 0; k < LOOM_MEM_KINDS; k++) out.bytes[k] += one.bytes[k];
  }
  return out;
}

double loom_plan_rank_checkpoint_bytes(const loom_plan *plan, int pp_rank) {
  const loom_memory m = loom_plan_rank_memory(plan, pp_rank);
  return (m.bytes[LOOM_MEM_MASTER] > 0 ? m.bytes[LOOM_MEM_MASTER] : m.bytes[LOOM_MEM_WEIGHTS]) + m.bytes[LOOM_MEM_OPTIMIZER];
}

double loom_plan_checkpoint_shard_bytes(const loom_plan *plan) {
  double most = 0.0;
  for (int q = 0; q < plan->parallel->pp; q++) {
    const double bytes = loom_plan_rank_checkpoint_bytes(plan, q);
    most = bytes > most ? bytes : most;
  }
  return most;
}

double loom_plan_rank_activations(const loom_plan *p, int pp_rank, int recompute_layers) {
  loom_rank_sheet s;
  stage_sheet(p, pp_rank, &s);
  return loom_sheet_activations(&s, recompute_layers);
}
