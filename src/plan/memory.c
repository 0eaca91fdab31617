/* The memory model: every buffer a rank allocates for a plan. */
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "layers/gpt.h"
#include "plan/memory.h"

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

/* The plan's shape's peaks, counted once; NULL if the schedule cannot be built. */
static const shape_memo *shape_peaks(const loom_plan *p) {
  const int pp = p->parallel->pp, vpp = p->parallel->virtual_chunks, m = loom_plan_micro_batches(p);
  const int kind = (int)p->schedule;
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
  if (loom_schedule_shape_peaks(p->schedule, pp, vpp, m, x.live, x.slots, x.deferred, x.sends, &err) != LOOM_OK) {
    free(all);
    return NULL;
  }
  *e = x;
  g_memo_shapes++, g_memo_counts += counts;
  return e;
}

int loom_plan_rank_buffers(const loom_plan *p, int pp_rank, int *slots, int *deferred, int *sends) {
  const int vpp = p->parallel->virtual_chunks;
  const shape_memo *e = shape_peaks(p);
  for (int c = 0; c < vpp; c++) {
    slots[c] = e && e->slots[pp_rank * vpp + c] > 0 ? e->slots[pp_rank * vpp + c] : 1;
    deferred[c] = e ? e->deferred[pp_rank * vpp + c] : 0;
  }
  *sends = e ? e->sends[pp_rank] : 0;
  return e ? e->live[pp_rank] : 0;
}

/* ---- ZeRO's cut ---- */

loom_zero_cut loom_plan_zero_cut(const loom_plan *p, const loom_stage_range *range) {
  loom_gpt_config cfg;
  loom_plan_rank_config(p, &cfg);
  return loom_gpt_zero_cut(&cfg, range, p->parallel->tp, loom_plan_grad_replicas(p), p->parallel->zero_stage);
}

/* ---- a chunk's buffers ---- */

/* Bytes of n elements of `size` where a zero-length buffer still takes one (as the runtime allocates it). */
static double at_least_one(size_t n, size_t size) { return (double)(n ? n : 1) * (double)size; }

/* Parameters, grads, Adam and ZeRO's buffers: as the layers keep them
 * (loom_gpt_params_stored_bytes), and as the optimizers (optim/adamw.c,
 * optim/zero.c) and ZeRO-2/3's runtime (pipeline/zero_runtime.c) allocate
 * them by ZeRO's cut (loom_gpt_zero_cut). */
static void add_state(loom_memory *out, const loom_plan *p, const loom_gpt_config *cfg, const loom_stage_range *range) {
  const int zero = p->parallel->zero_stage;
  const size_t dp = (size_t)loom_plan_grad_replicas(p), n = (size_t)loom_gpt_param_count(cfg, range, p->parallel->tp);
  double *b = out->bytes;
  const loom_gpt_params_bytes kept = loom_gpt_params_stored_bytes(cfg, range, p->parallel->tp, (int)dp, zero);
  /* The fp32 weights are the master beside a bf16 copy, else what the layers compute with. */
  b[cfg->bf16 ? LOOM_MEM_MASTER : LOOM_MEM_WEIGHTS] += kept.params;
  b[LOOM_MEM_WEIGHTS] += kept.compute;
  b[LOOM_MEM_GRADS] += kept.grads;
  if (zero == 0) {
    b[LOOM_MEM_OPTIMIZER] += 2.0 * at_least_one(n, 4);
    return;
  }
  /* The optimizer's pieces. */
  const loom_zero_cut z = loom_plan_zero_cut(p, range);
  b[LOOM_MEM_OPTIMIZER] += 2.0 * at_least_one(z.shard, 4);
  b[LOOM_MEM_ZERO_TRANSIENT] += at_least_one(z.slice, 4);
  if (kept.params == 0.0) b[LOOM_MEM_MASTER] += at_least_one(z.shard, 4); /* the model keeps no fp32 weights */
  if (zero >= 2) b[LOOM_MEM_GRADS] += at_least_one(z.shard, 4);
  if (z.staging) b[LOOM_MEM_ZERO_TRANSIENT] += at_least_one(z.staging, 4);
  if (zero < 2) return;
  /* The runtime's: two layers' grads and their pieces in flight, the edges' grads and a piece; under ZeRO-3 two
   * layers' gathered weights, their sends and the edges' weights. */
  const size_t w = cfg->bf16 ? 2 : 4, layer_piece = z.layer_shard;
  b[LOOM_MEM_ZERO_TRANSIENT] += 2.0 * (at_least_one(z.layer_max, 4) + at_least_one(layer_piece, 4)) +
                                at_least_one(z.edges, 4) + at_least_one(z.edge_shard, 4);
  if (zero == 3)
    b[LOOM_MEM_ZERO_TRANSIENT] += 2.0 * (at_least_one(z.layer_max, w) + at_least_one(layer_piece, 4)) + at_least_one(z.edges, w);
  if (p->grad_reduce == LOOM__PRECISION__PRECISION_BF16 && dp > 1) /* the grads' bf16 twins as they cross, and their pieces */
    b[LOOM_MEM_ZERO_TRANSIENT] += 2.0 * (at_least_one(z.layer_max, 2) + at_least_one(layer_piece, 2)) +
                                  at_least_one(z.edges, 2) + at_least_one(z.edge_shard, 2);
}

loom_memory loom_plan_chunk_memory(const loom_plan *p, int pp_rank, int chunk, int recompute_layers) {
  loom_memory out = {0};
  const Loom__Parallel *l = p->parallel;
  loom_gpt_config cfg;
  loom_plan_rank_config(p, &cfg);
  const int stage = loom_plan_stage_index(p, pp_rank, chunk);
  const loom_stage_range range = loom_plan_stage_range(p, stage);
  const loom_recompute recompute = recompute_layers == LOOM_RECOMPUTE_PLAN ? loom_plan_stage_recompute(p, stage)
                                                                          : (loom_recompute){recompute_layers, 1};
  const int T = loom_plan_train_seq(p), B = p->batch->micro_batch, vpp = l->virtual_chunks;
  int *slots = loom_xmalloc((size_t)vpp * sizeof *slots, "schedule peaks"), *deferred = loom_xmalloc((size_t)vpp * sizeof *deferred, "schedule peaks");
  int sends;
  loom_plan_rank_buffers(p, pp_rank, slots, deferred, &sends);
  add_state(&out, p, &cfg, &range);
  out.bytes[LOOM_MEM_ACTIVATIONS] =
      (double)loom_gpt_activation_bytes(&cfg, T, B, l->tp, l->sequence_parallel, &range, recompute, slots[chunk], 0);
  out.bytes[LOOM_MEM_WEIGHT_GRAD_STATES] =
      (double)loom_gpt_weight_state_bytes(&cfg, T, B, l->tp, l->sequence_parallel, &range, recompute) * deferred[chunk];
  if (chunk == 0) { /* the rank's send buffers, the received grad (fp32), and with bf16 messages to receive their staging */
    const double message = loom_gpt_boundary_bytes(&cfg, T, B, l->tp, l->sequence_parallel);
    out.bytes[LOOM_MEM_P2P] = (double)(sends + (cfg.bf16 && l->pp > 1 ? 1 : 0)) * message +
                              4.0 * (double)loom_gpt_boundary_floats(&cfg, T, B, l->tp, l->sequence_parallel);
  }
  const size_t n = (size_t)loom_gpt_param_count(&cfg, &range, l->tp);
  const bool reduced = loom_plan_grad_replicas(p) > 1;
  if (reduced && p->grad_reduce == LOOM__PRECISION__PRECISION_BF16 && l->zero_stage < 2) /* padded as ZeRO-1 pads them;
                                                                                        * ZeRO-2/3's are transient */
    out.bytes[LOOM_MEM_GRAD_REDUCE] = loom_gpt_zero_in_place(&cfg, l->zero_stage)
                                          ? at_least_one(loom_plan_zero_cut(p, &range).shard * loom_plan_grad_replicas(p), 2)
                                          : at_least_one(n, 2);
  if (reduced && loom_plan_compression(p).kind != LOOM__COMPRESSION_KIND__COMPRESSION_NONE)
    out.bytes[LOOM_MEM_COMPRESSION] = loom_plan_compression_cost(p, &range).state_bytes;
  free(slots);
  free(deferred);
  return out;
}

loom_memory loom_plan_rank_memory(const loom_plan *p, int pp_rank) {
  loom_memory out = {0};
  for (int c = 0; c < p->parallel->virtual_chunks; c++) {
    const loom_memory one = loom_plan_chunk_memory(p, pp_rank, c, LOOM_RECOMPUTE_PLAN);
    for (int k = 0; k < LOOM_MEM_KINDS; k++) out.bytes[k] += one.bytes[k];
  }
  return out;
}

double loom_plan_rank_activations(const loom_plan *p, int pp_rank, int recompute_layers) {
  double bytes = 0.0;
  for (int c = 0; c < p->parallel->virtual_chunks; c++) {
    const loom_memory one = loom_plan_chunk_memory(p, pp_rank, c, recompute_layers);
    bytes += one.bytes[LOOM_MEM_ACTIVATIONS] + one.bytes[LOOM_MEM_WEIGHT_GRAD_STATES];
  }
  return bytes;
}
