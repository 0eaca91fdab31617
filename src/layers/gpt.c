/* GPT forward and backward, whole or one pipeline stage, over the blocks;
 * activation slots and shared scratch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "layers/gpt.h"
#include "layers/run_buffers.h"
#include "tensor_parallel/linear.h"
#include "tensor_parallel/mappings.h"
#include "tensor_parallel/vocab_parallel.h"

loom_status loom_gpt_init_stage(loom_gpt *m, const loom_gpt_config *cfg, const loom_ops *ops, uint64_t seed,
                                const loom_tp *tp, const loom_stage_range *range, loom_recompute recompute, int zero_dp,
                                int zero_stage) {
  memset(m, 0, sizeof *m);
  m->ops = ops;
  m->seed = seed;
  const int L = range ? range->layer_end - range->layer_begin : cfg->layers;
  m->recompute_layers = recompute.layers < 0 ? 0 : recompute.layers > L ? L : recompute.layers;
  m->recompute_group = recompute.group > 1 ? recompute.group : 1;
  m->tp = tp ? *tp : (loom_tp){.group = NULL, .rank = 0, .size = 1, .sequence_parallel = false};
  m->tp.kv_group = NULL;
  loom_gpt_config c = m->tp.size > 1 ? loom_gpt_config_for_tp(cfg, m->tp.size) : *cfg;
  if (m->tp.ep_group || m->tp.etp_group)
    c = loom_gpt_config_for_ep(&c, loom_comm_size(m->tp.etp_group), loom_comm_size(m->tp.ep_group), loom_comm_rank(m->tp.ep_group));
  LOOM_CHECK(loom_gpt_cp(cfg) == 1 || loom_gpt_cp(cfg) == loom_tp_cp(&m->tp), "the model's cp split is its cp group's");
  c.cp = loom_tp_cp(&m->tp);
  const int replicas = loom_gpt_kv_replicas(&c, m->tp.size); /* consecutive ranks holding one key/value head */
  if (replicas > 1) m->tp.kv_group = loom_comm_split(m->tp.group, m->tp.rank / replicas, m->tp.rank, "kv heads");
  loom_status st = zero_dp ? loom_gpt_params_init_for_zero(&m->p, &c, m->tp.rank, m->tp.size, range, ops->mem, zero_dp, zero_stage)
                           : loom_gpt_params_init(&m->p, &c, m->tp.rank, m->tp.size, range, ops->mem);
  if (st != LOOM_OK) {
    loom_gpt_free(m);
    return st;
  }
  if (loom_gpt_params_have_master(&m->p)) loom_gpt_params_randomize(&m->p, seed); /* else the optimizer draws its slice */
  if (loom_gpt_is_moe(&c))
    m->moe_stats.load = loom_xcalloc((size_t)m->p.layers * (size_t)c.moe.experts + 1, sizeof(int64_t), "expert load");
  return LOOM_OK;
}

loom_status loom_gpt_init(loom_gpt *m, const loom_gpt_config *cfg, const loom_ops *ops, uint64_t seed,
                          const loom_tp *tp) {
  return loom_gpt_init_stage(m, cfg, ops, seed, tp, NULL, (loom_recompute){0}, 0, 0);
}

static void wstates_free(loom_gpt *m) {
  for (int i = 0; i < m->nwstates; i++) {
    loom_buffer_free(&m->wstates[i].mem);
    loom_buffer_free(&m->wstates[i].mem16);
    free(m->wstates[i].wgrad);
    for (int l = 0; m->wstates[i].winputs && l < m->recompute_layers && l < m->p.layers; l++)
      loom_moe_host_free(m->wstates[i].winputs[l].moe.host);
    free(m->wstates[i].winputs);
  }
  free(m->wstates);
  m->wstates = NULL;
  m->nwstates = 0;
}

/* Frees the routing host state of L layers' activations. */
static void moe_hosts_free(loom_block_acts *a, int L) {
  for (int i = 0; a && i < L; i++) loom_moe_host_free(a[i].moe.host);
}

static void slots_free(loom_gpt *m) {
  const int kept = m->p.layers - m->recompute_layers;
  for (int i = 0; i < m->nslots; i++) {
    moe_hosts_free(m->slots[i].blocks, kept);
    loom_buffer_free(&m->slots[i].mem);
    loom_buffer_free(&m->slots[i].mem16);
    free(m->slots[i].blocks);
    free(m->slots[i].packed);
    if (m->slots[i].tokens) m->ops->mem->release(m->ops->mem, m->slots[i].tokens);
    if (m->slots[i].targets) m->ops->mem->release(m->ops->mem, m->slots[i].targets);
    if (m->slots[i].pred) m->ops->mem->release(m->ops->mem, m->slots[i].pred);
  }
  free(m->slots);
  moe_hosts_free(m->w.redo, m->w.redo_count);
  free(m->w.redo);
  free(m->w.block.moe.host);
  free(m->cp_pos);
  m->cp_pos = NULL;
  loom_buffer_free(&m->w.mem);
  loom_buffer_free(&m->w.mem16);
  wstates_free(m);
  m->slots = m->a = NULL;
  m->nslots = m->T = m->B = 0;
  memset(&m->w, 0, sizeof m->w);
  m->tp.staging = NULL;
}

void loom_gpt_free(loom_gpt *m) {
  slots_free(m);
  free(m->moe_stats.load);
  m->moe_stats.load = NULL;
  if (m->tp.kv_group) loom_comm_free(m->tp.kv_group);
  m->tp.kv_group = NULL;
  loom_gpt_params_free(&m->p);
}

/* Builder for activation tables of one dtype: specs are appended, then pointers bound. */
typedef struct {
  loom_tensor specs[64];
  void *slots[64]; /* float ** (F32) or uint16_t ** (BF16) */
  loom_dtype dtype;
  int count;
} act_list;

static void want_as(act_list *l, void *slot, const char *name, int64_t numel) {
  LOOM_CHECK(l->count < 64, "too many activation views");
  l->specs[l->count] = loom_tensor_spec(name, l->dtype, 1, &numel);
  l->slots[l->count++] = slot;
}

static void want(act_list *l, float **slot, const char *name, int64_t numel) { want_as(l, slot, name, numel); }
static void want16(act_list *l, uint16_t **slot, const char *name, int64_t numel) { want_as(l, slot, name, numel); }

/* Shapes every table below is cut from. */
typedef struct {
  int64_t N, n, h, f, w, V; /* f: the widest MLP of the stage's layers (the scratch's) */
  int64_t lse;            /* attention's log-sum-exps of a layer: B x local heads x T */
  int64_t qkv, fc;        /* row widths of the column-parallel outputs (fc: the widest layer's) */
  int64_t fk[LOOM_LAYER_KINDS], fck[LOOM_LAYER_KINDS]; /* a dense (0) and a MoE layer's (1) MLP width and fc row */
  const loom_gpt_config *cfg; /* whose layers [layer0, layer0 + L) the stage holds: their kinds */
  int layer0;
  int64_t d_qkv_w;        /* replicated key/value heads: the q|k|v grads computed apart */
  int64_t weight_scratch; /* bf16 runs: fp32 values of one layer's weights and the embedding's and head's */
  int64_t E, k, M, taken; /* a stage with MoE layers: experts and top-k, the rows a rank dispatches (n k) and its experts take; else 0 */
  int64_t X;              /* the rows its experts compute over: taken, or under expert tensor parallelism every rank's */
  int64_t ep, etp;        /* its expert-parallel group's size, and the expert-tensor-parallel one's */
  int64_t fe, fce;        /* an expert's width, and its first GEMM's output row's (SwiGLU: 2 fe) */
  int64_t ring;           /* context parallelism: one travelling block of keys and values (0: none) */
  int64_t cp;             /* its group's size */
  bool cp_all_gather;     /* every rank's blocks gathered, not passed round a ring */
  bool gate;              /* a MoE model's shared expert is gated */
  int L, tp;
  int R, K; /* layers recomputed in backward (the first R), and kept whole (the other K) */
  int G;    /* the recomputed layers' groups: G layers each (the last may be short), the first one's input kept */
  bool first, last, bf16;
} dims;

/* The activation shapes at this rank's sequence length T (its chunks'
 * rows under context parallelism); weight_scratch (what only allocation
 * needs, read off the parameter table) is filled by with_weight_scratch. */
/* Groups the first R layers make in groups of G, the last maybe short: the
 * slot's kept inputs before the first kept layer's. */
static int recompute_groups(int R, int G) { return (R + G - 1) / G; }

static dims dims_of(const loom_gpt_config *c, int T, int B, int tp, bool sp, const loom_stage_range *r, loom_recompute rc) {
  const int L = r->layer_end - r->layer_begin, R = rc.layers < 0 ? 0 : rc.layers > L ? L : rc.layers;
  const int moe_layers = loom_gpt_moe_layers(c, r->layer_begin, r->layer_end);
  const bool moe = moe_layers > 0, dense = moe_layers < L;
  const int64_t fk[LOOM_LAYER_KINDS] = {c->ffn / tp, loom_gpt_is_moe(c) ? c->moe.shared_ffn / tp : 0};
  const int64_t f = dense && fk[0] > (moe ? fk[1] : 0) ? fk[0] : moe ? fk[1] : 0, D = loom_gpt_head_dim(c);
  const int64_t N = (int64_t)T * B;
  const int64_t qkv = (c->heads / tp + 2 * loom_gpt_local_kv_heads(c, tp)) * D, n = sp ? N / tp : N;
  const int64_t k = moe ? c->moe.topk : 0, fe = moe ? loom_gpt_local_expert_ffn(c) : 0, wide = loom_mlp_fc_factor(c->mlp);
  const int64_t taken = moe ? loom_moe_recv_rows(c, n, sp ? tp : 1) : 0, rows = moe ? loom_moe_expert_rows(c, n, sp ? tp : 1) : 0;
  return (dims){.N = N, .n = n, .h = c->hidden, .f = L ? f : fk[0], .w = c->hidden / tp,
                .fk = {fk[0], fk[1]}, .fck = {wide * fk[0], wide * fk[1]}, .cfg = c, .layer0 = r->layer_begin,
                .E = moe ? c->moe.experts : 0, .k = k, .M = n * k, .taken = taken, .X = rows,
                .ep = c->moe.ep > 1 ? c->moe.ep : 1, .etp = loom_gpt_expert_tp(c),
                .fe = fe, .fce = loom_mlp_fc_factor(c->mlp) * fe, .gate = moe && c->moe.shared_gate,
                .lse = (int64_t)B * (c->heads / tp) * T, .V = c->padded_vocab / tp, .qkv = qkv,
                .fc = wide * (L ? f : fk[0]),
                .ring = loom_gpt_cp(c) > 1 ? N * 2 * loom_gpt_local_kv_heads(c, tp) * D : 0, .cp = loom_gpt_cp(c),
                .cp_all_gather = c->cp_all_gather,
                .d_qkv_w = loom_gpt_kv_replicas(c, tp) > 1 ? qkv * (c->hidden + 1) : 0,
                .L = L, .tp = tp, .R = R, .K = L - R, .G = rc.group > 1 ? rc.group : 1, .first = r->first, .last = r->last,
                .bf16 = c->bf16};
}

static dims with_weight_scratch(dims d, const loom_gpt_config *c, int tp) {
  if (!d.bf16) return d;
  const loom_stage_range range = {d.layer0, d.layer0 + d.L, false, false}, edges = {.first = d.first, .last = d.last};
  loom_stage_range unused, one[LOOM_LAYER_KINDS];
  int counts[LOOM_LAYER_KINDS];
  loom_stage_range_kinds(c, &range, &unused, one, counts);
  int64_t layer = 0; /* the largest layer's weights (either kind's) */
  for (int k = 0; k < LOOM_LAYER_KINDS; k++)
    if (counts[k] && (int64_t)loom_gpt_param_count(c, &one[k], tp) > layer) layer = (int64_t)loom_gpt_param_count(c, &one[k], tp);
  /* The vocabulary tables (the embedding, an untied head) are read as bits, never unpacked. */
  d.weight_scratch = layer +
                     (int64_t)loom_gpt_param_count(c, &edges, tp) - (int64_t)loom_gpt_vocab_param_count(c, &edges, tp);
  return d;
}

/* The activations a layer's weight grads read, the inputs of its four
 * linears: ln_1, atty, ln_2 and fc_gelu, by their place in BIG_NAMES below. */
enum { WEIGHT_INPUTS = 4 };
static const int WEIGHT_INPUT[WEIGHT_INPUTS] = {0, 2, 4, 6};

/* Per-layer activation kinds: one view each, [L * per-layer size]; bits:
 * the linears' inputs as bf16 bits (WEIGHT_INPUT order), where a table
 * keeps them. */
typedef struct {
  float *ln1m, *ln1r, *lse, *ln1, *qkv, *atty, *resa, *ln2m, *ln2r, *ln2, *fc, *fcg, *out;
  uint16_t *bits[WEIGHT_INPUTS];
  loom_moe_acts moe; /* a MoE model's, for every layer */
} layer_views;

/* Ints in an fp32 table: views of as many 4-byte elements. */
static void want_ints(act_list *l, int **slot, const char *name, int64_t numel) {
  _Static_assert(sizeof(int) == sizeof(float), "an int takes a float's room");
  want_as(l, slot, name, numel);
}

/* The layers a table holds: the stage's layers [first, first + L), or
 * (first < 0) L layers of scratch, each as large as the stage's largest
 * layer of each kind (a recompute group computes in it, whatever its
 * layers' kinds). */
typedef struct {
  int first, L;
} span;

/* Kind of layer j of s: 0 dense, 1 MoE; -1 for scratch (the largest of each). */
static int kind_in(const dims *d, span s, int j) {
  return s.first < 0 ? -1 : loom_gpt_layer_is_moe(d->cfg, d->layer0 + s.first + j);
}
/* MoE layers among s's first j (scratch: each of them, when the stage has any). */
static int moe_before(const dims *d, span s, int j) {
  if (s.first < 0) return d->E ? j : 0;
  return loom_gpt_moe_layers(d->cfg, d->layer0 + s.first, d->layer0 + s.first + j);
}

/* A MoE layer's activations, fp32 in every run (dims_of sizes them), for
 * the MoE layers among L. */
static void want_moe(act_list *l, loom_moe_acts *v, const dims *d, int L) {
  if (!d->E || !L) return;
  want(l, &v->x, "moe_x", L * d->n * d->h);
  want(l, &v->logits, "moe_logits", L * d->n * d->E);
  want(l, &v->weights, "moe_weights", L * d->n * d->k);
  want_ints(l, &v->slots, "moe_slots", L * d->n * d->k);
  want_ints(l, &v->rows, "moe_rows", L * d->M);
  if (d->ep > 1) {
    want_ints(l, &v->sort, "moe_sort", L * d->taken);
    want_ints(l, &v->unsort, "moe_unsort", L * d->taken);
  }
  want(l, &v->perm, "moe_perm", L * d->X * d->h);
  want(l, &v->fc, "moe_fc", L * d->X * d->fce);
  want(l, &v->act, "moe_act", L * d->X * d->fe);
  want(l, &v->y, "moe_y", L * d->M * d->h);
  if (d->gate) {
    want(l, &v->shared, "moe_shared", L * d->n * d->h);
    want(l, &v->gate, "moe_gate", L * d->n);
  }
}

/* MoE layer i's slices of the MoE views (i counting MoE layers), with its routing's host state. */
static loom_moe_acts moe_layer(const loom_moe_acts *v, const dims *d, int i) {
  if (!d->E) return (loom_moe_acts){0};
  return (loom_moe_acts){.x = v->x + i * d->n * d->h, .logits = v->logits + i * d->n * d->E,
                         .weights = v->weights + i * d->n * d->k, .slots = v->slots + i * d->n * d->k,
                         .rows = v->rows + i * d->M, .sort = v->sort ? v->sort + i * d->taken : NULL,
                         .unsort = v->unsort ? v->unsort + i * d->taken : NULL, .perm = v->perm + i * d->X * d->h,
                         .fc = v->fc + i * d->X * d->fce, .act = v->act + i * d->X * d->fe, .y = v->y + i * d->M * d->h,
                         .shared = v->shared ? v->shared + i * d->n * d->h : NULL, .gate = v->gate ? v->gate + i * d->n : NULL,
                         .host = loom_moe_host_new((int)d->n, (int)d->E, (int)d->k, (int)d->ep, (int)d->etp)};
}

/* The norm statistics, attention's log-sum-exps and the MoE layers'
 * activations of s: fp32 in every run. */
static void want_stats(act_list *l, layer_views *v, const dims *d, span s) {
  const int L = s.L;
  want(l, &v->lse, "att_lse", L * d->lse);
  want(l, &v->ln1m, "ln_1_mean", L * d->n);
  want(l, &v->ln1r, "ln_1_rstd", L * d->n);
  want(l, &v->ln2m, "ln_2_mean", L * d->n);
  want(l, &v->ln2r, "ln_2_rstd", L * d->n);
  want_moe(l, &v->moe, d, moe_before(d, s, L));
}

/* A layer's big activations, in one order for every table: names, and
 * element counts per layer (N rows inside the parallel regions, n outside). */
enum { BIG = 8 };
static const char *const BIG_NAMES[BIG] = {"ln_1", "qkv", "atty", "res_attn", "ln_2", "fc", "fc_gelu", "out"};

/* Of a layer of a kind (-1: the stage's largest, scratch's). */
static void big_counts(const dims *d, int kind, int64_t c[BIG]) {
  const int64_t fc = kind < 0 ? d->fc : d->fck[kind], f = kind < 0 ? d->f : d->fk[kind];
  const int64_t counts[BIG] = {d->N * d->h, d->N * d->qkv, d->N * d->w, d->n * d->h,
                               d->N * d->h, d->N * fc,     d->N * f,    d->n * d->h};
  memcpy(c, counts, sizeof counts);
}

/* Elements of big activation i that s's first j layers take, and all of s's. */
static int64_t big_offset(const dims *d, span s, int j, int i) {
  int64_t at = 0, c[BIG];
  for (int q = 0; q < j; q++) big_counts(d, kind_in(d, s, q), c), at += c[i];
  return at;
}

/* bf16 runs: the big activations, packed. */
static void want_packed(act_list *l, loom_block_packed *p, const dims *d, span s) {
  uint16_t **slots[BIG] = {&p->ln_1, &p->qkv, &p->atty, &p->res_attn, &p->ln_2, &p->fc, &p->fc_gelu, &p->out};
  for (int i = 0; i < BIG; i++) want16(l, slots[i], BIG_NAMES[i], big_offset(d, s, s.L, i));
}

/* fp32 views of the big activations; bf16 runs keep ln_1 and ln_2 as bits
 * alone (the norms write into block scratch, the linears pack from it). */
static void want_layers(act_list *l, layer_views *v, const dims *d, span s) {
  want_stats(l, v, d, s);
  float **slots[BIG] = {&v->ln1, &v->qkv, &v->atty, &v->resa, &v->ln2, &v->fc, &v->fcg, &v->out};
  for (int i = 0; i < BIG; i++)
    if (!d->bf16 || (slots[i] != &v->ln1 && slots[i] != &v->ln2)) want(l, slots[i], BIG_NAMES[i], big_offset(d, s, s.L, i));
}

/* Layer j's slices of the packed views. */
static void bind_packed(loom_block_packed *b, const loom_block_packed *p, const dims *d, span s) {
  for (int j = 0; j < s.L; j++) {
    int64_t o[BIG];
    for (int i = 0; i < BIG; i++) o[i] = big_offset(d, s, j, i);
    b[j] = (loom_block_packed){.ln_1 = p->ln_1 + o[0], .qkv = p->qkv + o[1], .atty = p->atty + o[2],
                               .res_attn = p->res_attn + o[3], .ln_2 = p->ln_2 + o[4], .fc = p->fc + o[5],
                               .fc_gelu = p->fc_gelu + o[6], .out = p->out + o[7]};
  }
}

/* Layer views of v; fields v does not hold (bf16 runs: all but the statistics) come out NULL. */
static float *at(float *base, int64_t offset) { return base ? base + offset : NULL; }
static uint16_t *at16(uint16_t *base, int64_t offset) { return base ? base + offset : NULL; }

/* The bits field of weight input k (WEIGHT_INPUT order) of a. */
static uint16_t **act_bits_field(loom_block_acts *a, int k) {
  uint16_t **const fields[WEIGHT_INPUTS] = {&a->ln_1_bits, &a->atty_bits, &a->ln_2_bits, &a->fc_gelu_bits};
  return fields[k];
}

static void bind_layers(loom_block_acts *b, const layer_views *v, const dims *d, span s) {
  for (int j = 0; j < s.L; j++) {
    int64_t o[BIG];
    for (int i = 0; i < BIG; i++) o[i] = big_offset(d, s, j, i);
    const bool moe = kind_in(d, s, j) != 0; /* scratch: MoE acts where the stage has MoE layers */
    b[j] = (loom_block_acts){
        .ln_1_mean = at(v->ln1m, j * d->n), .ln_1_rstd = at(v->ln1r, j * d->n), .ln_2_mean = at(v->ln2m, j * d->n),
        .ln_2_rstd = at(v->ln2r, j * d->n), .att_lse = at(v->lse, j * d->lse), .ln_1 = at(v->ln1, o[0]),
        .qkv = at(v->qkv, o[1]), .atty = at(v->atty, o[2]), .res_attn = at(v->resa, o[3]),
        .ln_2 = at(v->ln2, o[4]), .fc = at(v->fc, o[5]), .fc_gelu = at(v->fcg, o[6]),
        .out = at(v->out, o[7]), .moe = moe ? moe_layer(&v->moe, d, moe_before(d, s, j)) : (loom_moe_acts){0}};
    for (int k = 0; k < WEIGHT_INPUTS; k++) *act_bits_field(&b[j], k) = at16(v->bits[k], o[WEIGHT_INPUT[k]]);
  }
}

/* Layer activation i (BIG_NAMES order) of a. */
static float **act_field(loom_block_acts *a, int i) {
  float **const fields[BIG] = {&a->ln_1, &a->qkv, &a->atty, &a->res_attn, &a->ln_2, &a->fc, &a->fc_gelu, &a->out};
  return fields[i];
}

/* The linears' output grads a split backward keeps: names and elements per layer. */
enum { WGRADS = 4 };
static const char *const WGRAD_NAMES[WGRADS] = {"w_d_qkv", "w_d_attn", "w_d_fc", "w_d_mlp"};

/* Of a layer of a kind (-1: the largest). */
static void wgrad_counts(const dims *d, int kind, int64_t c[WGRADS]) {
  const int64_t counts[WGRADS] = {d->N * d->qkv, d->N * d->h, d->N * (kind < 0 ? d->fc : d->fck[kind]), d->N * d->h};
  memcpy(c, counts, sizeof counts);
}

/* Elements of weight grad k that s's first j layers take. */
static int64_t wgrad_offset(const dims *d, span s, int j, int k) {
  int64_t at = 0, c[WGRADS];
  for (int q = 0; q < j; q++) wgrad_counts(d, kind_in(d, s, q), c), at += c[k];
  return at;
}

/* Views of a split backward's state: the linears' output grads of every
 * layer and the inputs of the recomputed layers' (the slot keeps none of
 * theirs); fp32, or bits in bf16 runs. */
typedef struct {
  float *grads[WGRADS];
  uint16_t *grad_bits[WGRADS];
  float *inputs[WEIGHT_INPUTS];
  uint16_t *input_bits[WEIGHT_INPUTS];
  loom_moe_wgrad moe; /* every MoE layer's */
  loom_moe_acts moe_inputs; /* the recomputed MoE layers': x, perm and act, copied from the recompute scratch */
} wgrad_views;

static void list_wstate(act_list *l, act_list *l16, wgrad_views *v, const dims *d) {
  *l = (act_list){.dtype = LOOM_DTYPE_F32};
  *l16 = (act_list){.dtype = LOOM_DTYPE_BF16};
  memset(v, 0, sizeof *v);
  if (d->L == 0) return;
  const span all = {0, d->L}, redone = {0, d->R}, kept = {d->R, d->K};
  for (int k = 0; k < WGRADS; k++) {
    if (d->bf16) want16(l16, &v->grad_bits[k], WGRAD_NAMES[k], wgrad_offset(d, all, d->L, k));
    else want(l, &v->grads[k], WGRAD_NAMES[k], wgrad_offset(d, all, d->L, k));
  }
  for (int k = 0; d->R && k < WEIGHT_INPUTS; k++) {
    const int i = WEIGHT_INPUT[k];
    if (d->bf16) want16(l16, &v->input_bits[k], BIG_NAMES[i], big_offset(d, redone, d->R, i));
    else want(l, &v->inputs[k], BIG_NAMES[i], big_offset(d, redone, d->R, i));
  }
  const int moe_layers = moe_before(d, all, d->L), moe_redone = moe_before(d, redone, d->R);
  (void)kept;
  if (d->E && moe_layers) {
    want(l, &v->moe.d_fc, "w_moe_d_fc", moe_layers * d->X * d->fce);
    want(l, &v->moe.d_y, "w_moe_d_y", moe_layers * d->X * d->h);
    want(l, &v->moe.d_logits, "w_moe_d_logits", moe_layers * d->n * d->E);
  }
  if (d->E && moe_redone) { /* what the experts' and router's weight GEMMs read, which the recompute scratch does not keep */
    want(l, &v->moe_inputs.x, "w_moe_x", moe_redone * d->n * d->h);
    want(l, &v->moe_inputs.perm, "w_moe_perm", moe_redone * d->X * d->h);
    want(l, &v->moe_inputs.act, "w_moe_act", moe_redone * d->X * d->fe);
  }
}

/* bf16 runs keep the grads as bits; the fp32 views the input half computes
 * d_qkv and d_fc in are the block scratch's (the row-parallel ones come in
 * as bits alone). */
static void bind_wstate(loom_gpt_wstate *s, const wgrad_views *v, const dims *d, const loom_block_scratch *scratch) {
  s->wgrad = loom_xcalloc((size_t)d->L, sizeof *s->wgrad, "weight-grad state");
  if (d->R) s->winputs = loom_xcalloc((size_t)d->R, sizeof *s->winputs, "weight-grad inputs");
  const span all = {0, d->L}, redone = {0, d->R};
  for (int i = 0; i < d->L; i++) {
    loom_block_wgrad *w = &s->wgrad[i];
    int64_t g[WGRADS];
    for (int k = 0; k < WGRADS; k++) g[k] = wgrad_offset(d, all, i, k);
    if (d->bf16)
      *w = (loom_block_wgrad){.d_qkv = scratch->d_qkv, .d_fc = scratch->d_fc, .d_qkv_bits = v->grad_bits[0] + g[0],
                              .d_attn_bits = v->grad_bits[1] + g[1], .d_fc_bits = v->grad_bits[2] + g[2],
                              .d_mlp_bits = v->grad_bits[3] + g[3]};
    else
      *w = (loom_block_wgrad){.d_qkv = v->grads[0] + g[0], .d_attn = v->grads[1] + g[1],
                              .d_fc = v->grads[2] + g[2], .d_mlp = v->grads[3] + g[3]};
    for (int k = 0; i < d->R && k < WEIGHT_INPUTS; k++) {
      const int64_t offset = big_offset(d, (span){0, d->R}, i, WEIGHT_INPUT[k]);
      if (d->bf16) *act_bits_field(&s->winputs[i], k) = v->input_bits[k] + offset;
      else *act_field(&s->winputs[i], WEIGHT_INPUT[k]) = v->inputs[k] + offset;
    }
    if (!d->E || !loom_gpt_layer_is_moe(d->cfg, d->layer0 + i)) continue;
    const int64_t q = moe_before(d, all, i); /* its place among the MoE layers */
    w->moe = (loom_moe_wgrad){.d_fc = v->moe.d_fc + q * d->X * d->fce, .d_y = v->moe.d_y + q * d->X * d->h,
                              .d_logits = v->moe.d_logits + q * d->n * d->E};
    if (i >= d->R) continue;
    const int64_t r = moe_before(d, redone, i); /* a recomputed MoE layer: its inputs' copies, and its counts' */
    s->winputs[i].moe = (loom_moe_acts){.x = v->moe_inputs.x + r * d->n * d->h, .perm = v->moe_inputs.perm + r * d->X * d->h,
                                        .act = v->moe_inputs.act + r * d->X * d->fe,
                                        .host = loom_moe_host_new((int)d->n, (int)d->E, (int)d->k, (int)d->ep, (int)d->etp)};
  }
}

/* What one micro-batch keeps until its backward ends (with its weight
 * half, when split): fp32 views in l, bf16 ones in l16. */
static void list_slot(act_list *l, act_list *l16, loom_gpt_slot *s, layer_views *v, loom_block_packed *p,
                      const dims *d) {
  *l = (act_list){.dtype = LOOM_DTYPE_F32};
  *l16 = (act_list){.dtype = LOOM_DTYPE_BF16};
  memset(v, 0, sizeof *v);
  want(l, &s->x0, "x0", d->n * d->h);
  want(l, &s->dx0, "dx0", d->n * d->h);
  /* The input of each recomputed group's first layer (slot g for group g;
   * group 0's is x0), and the first kept layer's, which the last recomputed
   * one gives it. */
  const int groups = recompute_groups(d->R, d->G);
  if (d->R) want(l, &s->inputs, "inputs", (d->K ? groups + 1 : groups) * d->n * d->h);
  if (d->L > 0 && (d->K == 0 || d->bf16)) want(l, &s->out, "out", d->n * d->h);
  const span kept = {d->R, d->K};
  if (d->K > 0 && d->bf16) {
    want_stats(l, v, d, kept);
    want_packed(l16, p, d, kept);
  } else if (d->K > 0) {
    want_layers(l, v, d, kept);
  }
  if (d->last) {
    want(l, &s->ln_f_mean, "ln_f_mean", d->n);
    want(l, &s->ln_f_rstd, "ln_f_rstd", d->n);
    if (d->bf16) want16(l16, &s->ln_f_bits, "ln_f_bits", d->N * d->h); /* bits alone, as the layers' */
    else want(l, &s->ln_f, "ln_f", d->N * d->h);
    want(l, &s->logits, "logits", d->N * d->V);
    want(l, &s->losses, "losses", d->N);
    want(l, &s->lse, "lse", d->N);
    want(l, &s->picked, "picked", d->N);
  }
}

/* Layers the scratch computes a layer in holds: a recompute group's (at
 * most the recomputed layers), or one. */
static int redo_layers(const dims *d) { return d->R ? (d->G < d->R ? d->G : d->R) : 1; }

/* Scratch every slot shares: fp32 views in l, bf16 ones in l16. */
static void list_work(act_list *l, act_list *l16, loom_gpt_work *w, layer_views *v, const dims *d) {
  loom_block_scratch *s = &w->block;
  *l = (act_list){.dtype = LOOM_DTYPE_F32};
  *l16 = (act_list){.dtype = LOOM_DTYPE_BF16};
  memset(v, 0, sizeof *v);
  want(l, &s->local, "local", d->n * d->h);
  want(l, &s->local2, "local2", d->n * d->h);
  want(l, &s->full, "full", d->N * d->h);
  want(l, &s->d_ln, "d_ln", d->N * d->h);
  want(l, &s->d_atty, "d_atty", d->N * d->w);
  want(l, &s->d_qkv, "d_qkv", d->N * d->qkv);
  want(l, &s->d_fc, "d_fc", d->N * d->fc);
  want(l, &s->d_fc2, "d_fc2", d->N * d->f);
  if (!d->bf16) { /* bf16 runs bring these into the region as bits alone */
    want(l, &s->d_attn_out, "d_attn_out", d->N * d->h);
    want(l, &s->d_mlp_out, "d_mlp_out", d->N * d->h);
  }
  if (d->d_qkv_w) want(l, &s->d_qkv_w, "d_qkv_w", d->d_qkv_w);
  if (d->E) {
    if (d->f) want(l, &s->moe_out, "moe_out", d->n * d->h); /* beside a shared expert's output */
    want(l, &s->moe.d_x, "moe_d_x", d->n * d->h);
    want(l, &s->moe.d_y, "moe_d_y", d->M * d->h);
    want(l, &s->moe.d_perm, "moe_d_perm", d->X * d->h);
    want(l, &s->moe.d_act, "moe_d_act", d->X * d->fe);
    want(l, &s->moe.d_fc, "moe_d_fc", d->X * d->fce);
    if (d->etp > 1) {
      want(l, &s->moe.mine, "moe_mine", d->taken * d->h);
      want(l, &s->moe.part, "moe_part", d->X * d->h);
    }
    if (d->ep > 1) {
      want(l, &s->moe.send, "moe_send", d->M * d->h);
      want(l, &s->moe.recv, "moe_recv", d->taken * d->h);
      want(l, &s->moe.recv2, "moe_recv2", d->taken * d->h);
      const int64_t wire = (d->M > d->taken ? d->M : d->taken) * d->h;
      if (d->bf16) want16(l16, &s->moe.wire, "moe_wire", wire), want16(l16, &s->moe.wire2, "moe_wire2", wire);
    }
    want(l, &s->moe.d_weights, "moe_d_weights", d->n * d->k);
    want(l, &s->moe.d_logits, "moe_d_logits", d->n * d->E);
    if (d->gate) want(l, &s->moe.gate_d, "moe_gate_d", d->n), want_ints(l, &s->moe.gate_rows, "moe_gate_rows", d->n);
  }
  if (d->ring) { /* the blocks of keys and values travelling round the ring (or all gathered), and their grads */
    loom_ring *r = &s->ring;
    const int cp = (int)d->cp;
    const bool gather = d->cp_all_gather;
    want(l, &r->kv[0], "ring_kv", d->ring), want(l, &r->kv[1], "ring_kv2", loom_ring_buffer_blocks(cp, gather, 1) * d->ring);
    want(l, &r->dkv[0], "ring_dkv", d->ring), want(l, &r->dkv[1], "ring_dkv2", loom_ring_buffer_blocks(cp, gather, 1) * d->ring);
    if (loom_ring_buffer_blocks(cp, gather, 2)) want(l, &r->dkv[2], "ring_dkv3", loom_ring_buffer_blocks(cp, gather, 2) * d->ring);
  }
  want(l, &w->embed_full, "embed_full", d->N * d->h);
  want(l, &w->dres, "dres", d->n * d->h);
  want(l, &w->d_ln_f, "d_ln_f", d->N * d->h);
  want(l, &w->lse_scratch, "lse_scratch", d->N);
  if (d->R || d->bf16) want_layers(l, v, d, (span){-1, redo_layers(d)});
  if (d->bf16) {
    want(l, &w->xin, "xin", d->n * d->h);
    want(l, &w->weights, "weights", d->weight_scratch);
    uint16_t **grads[WGRADS] = {&s->d_qkv_bits, &s->d_attn_bits, &s->d_fc_bits, &s->d_mlp_bits};
    const char *const names[WGRADS] = {"d_qkv_bits", "d_attn_bits", "d_fc_bits", "d_mlp_bits"};
    int64_t g[WGRADS];
    wgrad_counts(d, -1, g);
    for (int k = 0; k < WGRADS; k++) want16(l16, grads[k], names[k], g[k]);
    for (int k = 0; d->R && k < WEIGHT_INPUTS; k++)
      want16(l16, &v->bits[k], BIG_NAMES[WEIGHT_INPUT[k]], big_offset(d, (span){-1, redo_layers(d)}, redo_layers(d), WEIGHT_INPUT[k]));
    if (d->tp > 1) want16(l16, &w->tp_staging, "tp_staging", (int64_t)loom_tp_staging_elems(d->N, d->n, d->h));
  }
}

/* Elements the allocation of a table takes (place, loom_buffer_init): none for an empty table, else at least one. */
static size_t list_elements(const act_list *l) {
  size_t n = 0;
  for (int i = 0; i < l->count; i++) n += loom_tensor_numel(&l->specs[i]);
  return l->count == 0 ? 0 : n ? n : 1;
}

loom_gpt_activation_sizes loom_gpt_activation_sizes_of(const loom_gpt_config *cfg, int T, int B, int tp,
                                                        bool sequence_parallel, const loom_stage_range *range,
                                                        loom_recompute recompute) {
  const loom_gpt_config c = tp > 1 ? loom_gpt_config_for_tp(cfg, tp) : *cfg;
  const loom_stage_range r = range ? *range : loom_stage_whole(cfg);
  const dims plain = dims_of(&c, loom_gpt_local_seq(cfg, T), B, tp, sequence_parallel && tp > 1, &r, recompute);
  const dims d = with_weight_scratch(plain, &c, tp);
  act_list l, l16;
  loom_gpt_slot s;
  loom_gpt_work w;
  layer_views v;
  loom_block_packed p;
  wgrad_views wv;
  loom_gpt_activation_sizes out = {.tokens = (size_t)d.N};
  list_slot(&l, &l16, &s, &v, &p, &d);
  out.slot = list_elements(&l), out.slot16 = list_elements(&l16);
  list_work(&l, &l16, &w, &v, &d);
  out.work = list_elements(&l), out.work16 = list_elements(&l16);
  list_wstate(&l, &l16, &wv, &plain); /* as loom_gpt_set_weight_states lists them */
  out.wstate = list_elements(&l), out.wstate16 = list_elements(&l16);
  return out;
}

size_t loom_gpt_activation_bytes(const loom_gpt_config *cfg, int T, int B, int tp, bool sequence_parallel,
                                 const loom_stage_range *range, loom_recompute recompute, int slots, int weight_states) {
  const loom_gpt_activation_sizes a = loom_gpt_activation_sizes_of(cfg, T, B, tp, sequence_parallel, range, recompute);
  const size_t slot = 4 * a.slot + 2 * a.slot16 + 3 * sizeof(int) * a.tokens; /* with its tokens, targets and predictions */
  return slot * (size_t)slots + (4 * a.wstate + 2 * a.wstate16) * (size_t)weight_states + 4 * a.work + 2 * a.work16;
}

size_t loom_gpt_boundary_floats(const loom_gpt_config *cfg, int T, int B, int tp, bool sequence_parallel) {
  const int rows = loom_gpt_local_seq(cfg, T);
  return (size_t)(sequence_parallel && tp > 1 ? rows / tp : rows) * (size_t)B * (size_t)cfg->hidden;
}

/* What the model recomputes, as its shapes take it. */
static loom_recompute recompute_of(const loom_gpt *m) {
  return (loom_recompute){.layers = m->recompute_layers, .group = m->recompute_group};
}

/* Allocates a table and points its slots at the views. */
static loom_status place(loom_buffer *mem, act_list *l, const loom_allocator *backend, loom_run_buffer name) {
  loom_status st = loom_buffer_init(mem, l->specs, l->count, backend, loom_run_buffer_name(name));
  if (st != LOOM_OK) return st;
  for (int i = 0; i < l->count; i++) {
    if (l->dtype == LOOM_DTYPE_BF16) *(uint16_t **)l->slots[i] = mem->views[i].data;
    else *(float **)l->slots[i] = mem->views[i].data;
  }
  return LOOM_OK;
}

/* ---- bf16 runs: compute weights ---- */

/* A buffer with the parameters' layout and storage, whose offsets are O(1): under the distributed
 * optimizer params is a layout alone, and the bf16 copy has the same one. */
static const loom_buffer *stored_layout(const loom_gpt *m) {
  return loom_gpt_params_have_master(&m->p) ? &m->p.params : &m->p.compute;
}

void loom_gpt_block_range(const loom_gpt *m, int l0, int l1, size_t *lo, size_t *hi) {
  const loom_buffer *b = stored_layout(m);
  *lo = loom_buffer_offset(b, m->p.layer_tensor[l0]);
  const int next = m->p.layer_tensor[l1];
  *hi = next < b->count ? loom_buffer_offset(b, next) : b->numel;
}

/* The tensors outside the blocks, [0, first) and [end, count), in table
 * order: the next one after k (k = -1: the first), or count after the last. */
static int next_edge_tensor(const loom_gpt *m, int k) {
  const int first = loom_gpt_first_block_tensor(&m->p), end = m->p.layer_tensor[m->p.layers];
  return k + 1 == first ? end : k + 1;
}

/* Points the weight scratch's views: one layer's tensors (laid out as in the
 * parameter buffer), then the embedding's and head's but the vocabulary
 * tables (whose views stay NULL), one after another in table order
 * (edge_weights unpacks them in that order). */
static void bind_weights(loom_gpt *m) {
  float *at = m->w.weights;
  const loom_buffer *b = stored_layout(m);
  const int count = b->count, first = loom_gpt_first_block_tensor(&m->p), end = m->p.layer_tensor[m->p.layers];
  float **addr = loom_xmalloc(((size_t)count + 1) * sizeof *addr, "weight views");
  m->w.weights_of = (loom_gpt_weights){.h = m->w.layer_w};
  size_t widest = 0;
  bool bound[LOOM_LAYER_KINDS] = {false, false};
  for (int l = 0; l < m->p.layers; l++) { /* the first layer of each kind lays its kind's views out */
    const int kind = loom_gpt_layer_is_moe(&m->p.cfg, m->p.range.layer_begin + l), k0 = m->p.layer_tensor[l];
    if (bound[kind]) continue;
    bound[kind] = true;
    size_t lo, hi;
    loom_gpt_block_range(m, l, l + 1, &lo, &hi);
    for (int k = k0; k < m->p.layer_tensor[l + 1]; k++) addr[k - k0] = at + (loom_buffer_offset(b, k) - lo);
    loom_gpt_weights views = {.h = &m->w.layer_w[kind]};
    loom_gpt_bind_views(&m->p, k0, m->p.layer_tensor[l + 1], addr, &views);
    widest = hi - lo > widest ? hi - lo : widest;
  }
  at += widest;
  m->w.edges = at;
  for (int k = next_edge_tensor(m, -1); k < count; k = next_edge_tensor(m, k)) {
    addr[k] = loom_param_is_vocab_table(&m->p.meta[k]) ? NULL : at;
    if (addr[k]) at += loom_tensor_numel(&b->views[k]);
  }
  loom_gpt_bind_views(&m->p, 0, first, addr, &m->w.weights_of);
  loom_gpt_bind_views(&m->p, end, count, addr + end, &m->w.weights_of);
  free(addr);
}

loom_status loom_gpt_set_slots(loom_gpt *m, int seq, int B, int slots) {
  const loom_gpt_config *c = &m->p.cfg;
  const int cp = loom_gpt_cp(c), T = loom_gpt_local_seq(c, seq); /* this rank's rows of each sequence */
  LOOM_CHECK(seq >= 1 && seq <= c->seq && B >= 1 && slots >= 1, "micro-batch shape out of range");
  LOOM_CHECK(cp == 1 || seq % (2 * cp) == 0, "context parallelism needs T divisible by 2 cp");
  LOOM_CHECK(!m->tp.sequence_parallel || T % m->tp.size == 0, "sequence parallelism needs T / cp divisible by tp");
  if (m->T == T && m->B == B && m->nslots == slots) return LOOM_OK;
  slots_free(m);
  const dims d = with_weight_scratch(dims_of(c, T, B, m->tp.size, m->tp.sequence_parallel, &m->p.range, recompute_of(m)),
                                     c, m->tp.size);
  act_list l, l16;
  layer_views v;
  loom_block_packed p;
  m->slots = loom_xcalloc((size_t)slots, sizeof *m->slots, "activation slots");
  m->nslots = slots;
  loom_status st = LOOM_OK;
  for (int i = 0; i < slots && st == LOOM_OK; i++) {
    loom_gpt_slot *s = &m->slots[i];
    const char *tokens = loom_run_buffer_name(LOOM_BUF_SLOT_TOKENS);
    s->tokens = m->ops->mem->zalloc(m->ops->mem, (size_t)d.N * sizeof(int), tokens);
    s->targets = m->ops->mem->zalloc(m->ops->mem, (size_t)d.N * sizeof(int), tokens);
    s->pred = m->ops->mem->zalloc(m->ops->mem, (size_t)d.N * sizeof(int), tokens);
    if (!s->tokens || !s->targets || !s->pred) {
      st = LOOM_ERR_NOMEM;
      break;
    }
    list_slot(&l, &l16, s, &v, &p, &d);
    st = place(&s->mem, &l, m->ops->mem, LOOM_BUF_SLOT);
    if (st == LOOM_OK) st = place(&s->mem16, &l16, m->ops->mem, LOOM_BUF_SLOT_BF16);
    if (st == LOOM_OK && d.K > 0) { /* the kept layers', blocks[l - R] for layer l */
      s->blocks = loom_xcalloc((size_t)d.K, sizeof *s->blocks, "block activations");
      bind_layers(s->blocks, &v, &d, (span){d.R, d.K});
    }
    if (st == LOOM_OK && d.K > 0 && d.bf16) {
      s->packed = loom_xcalloc((size_t)d.K, sizeof *s->packed, "packed activations");
      bind_packed(s->packed, &p, &d, (span){d.R, d.K});
    }
  }
  if (st == LOOM_OK) {
    list_work(&l, &l16, &m->w, &v, &d);
    st = place(&m->w.mem, &l, m->ops->mem, LOOM_BUF_WORK);
    if (st == LOOM_OK) st = place(&m->w.mem16, &l16, m->ops->mem, LOOM_BUF_WORK_BF16);
    if (st == LOOM_OK && (d.R || d.bf16)) {
      m->w.redo = loom_xcalloc((size_t)redo_layers(&d), sizeof *m->w.redo, "recompute scratch");
      m->w.redo_count = redo_layers(&d);
      bind_layers(m->w.redo, &v, &d, (span){-1, redo_layers(&d)});
    }
    if (st == LOOM_OK && d.E)
      m->w.block.moe.host = loom_xmalloc((size_t)(d.n * (d.k + d.E)) * sizeof(float), "router grads");
    if (st == LOOM_OK) m->tp.staging = m->w.tp_staging;
    if (st == LOOM_OK && cp > 1) { /* the ring's positions, host memory */
      loom_ring *r = &m->w.block.ring;
      r->group = m->tp.cp_group, r->rows = T, r->all_gather = c->cp_all_gather;
      m->cp_pos = loom_xmalloc(2 * (size_t)T * sizeof *m->cp_pos, "context-parallel positions");
      loom_cp_positions(cp, m->tp.cp_rank, seq, m->cp_pos);
      r->pos = m->cp_pos, r->peer_pos = m->cp_pos + T;
    }
    if (st == LOOM_OK && d.bf16) bind_weights(m);
  }
  if (st != LOOM_OK) {
    slots_free(m);
    return st;
  }
  m->T = T;
  m->B = B;
  m->a = &m->slots[0];
  m->moe = loom_moe_shape_of(c, (int)d.n, m->tp.sequence_parallel ? m->tp.size : 1);
  return LOOM_OK;
}

loom_status loom_gpt_set_batch_shape(loom_gpt *m, int T, int B) { return loom_gpt_set_slots(m, T, B, 1); }

loom_status loom_gpt_set_weight_states(loom_gpt *m, int n) {
  LOOM_CHECK(m->nslots > 0 && n >= 0, "weight-grad states come after the slots");
  wstates_free(m);
  const dims d = dims_of(&m->p.cfg, m->T, m->B, m->tp.size, m->tp.sequence_parallel, &m->p.range, recompute_of(m));
  m->wstates = loom_xcalloc((size_t)(n > 0 ? n : 1), sizeof *m->wstates, "weight-grad states");
  m->nwstates = n;
  loom_status st = LOOM_OK;
  for (int i = 0; i < n && st == LOOM_OK; i++) {
    act_list l, l16;
    wgrad_views v;
    list_wstate(&l, &l16, &v, &d);
    st = place(&m->wstates[i].mem, &l, m->ops->mem, LOOM_BUF_WSTATE);
    if (st == LOOM_OK) st = place(&m->wstates[i].mem16, &l16, m->ops->mem, LOOM_BUF_WSTATE_BF16);
    if (st == LOOM_OK && d.L > 0) bind_wstate(&m->wstates[i], &v, &d, &m->w.block);
  }
  if (st != LOOM_OK) wstates_free(m);
  return st;
}

/* The blocks' shape; backward's with the router losses' weight, dloss per
 * token times the micro-batch's tokens (with every target scored, 1 over
 * the global batch's micro-batches: each micro-batch's router losses count
 * as its mean loss does). */
static loom_block_shape block_shape(const loom_gpt *m, int l, float dloss) {
  const loom_gpt_config *c = &m->p.cfg;
  const int heads = c->heads / m->tp.size;
  const bool moe = loom_gpt_layer_is_moe(c, m->p.range.layer_begin + l);
  return (loom_block_shape){.T = m->T, .B = m->B, .hidden = c->hidden, .heads = heads,
                            .head_dim = loom_gpt_head_dim(c), .head_offset = m->tp.rank * heads,
                            .total_heads = c->heads, .kv_heads = loom_gpt_local_kv_heads(c, m->tp.size),
                            .ffn = (moe ? c->moe.shared_ffn : c->ffn) / m->tp.size, .norm_eps = c->norm_eps,
                            .norm = c->norm, .mlp = c->mlp,
                            .rope = c->position == LOOM_POSITION_ROPE ? c->rope : (loom_rope){0}, .bf16 = c->bf16,
                            .moe = moe ? &m->moe : NULL, .moe_loss_weight = dloss * (float)m->T * (float)m->B};
}

void loom_gpt_moe_stats_reset(loom_gpt *m) {
  loom_gpt_moe_stats *st = &m->moe_stats;
  if (st->load) memset(st->load, 0, (size_t)m->p.layers * (size_t)m->p.cfg.moe.experts * sizeof *st->load);
  st->aux_loss = st->z_loss = 0.0;
  st->dropped = 0;
  st->most_rows = 0;
}

/* Adds a layer's routing in one forward to the statistics. */
static void moe_count(loom_gpt *m, int l, const loom_moe_host *h) {
  loom_gpt_moe_stats *st = &m->moe_stats;
  const int E = m->p.cfg.moe.experts;
  st->aux_loss += h->routing.aux_loss;
  st->z_loss += h->routing.z_loss;
  st->dropped += h->dispatch.dropped;
  st->most_rows = h->received > st->most_rows ? h->received : st->most_rows;
  for (int e = 0; e < E; e++) st->load[(size_t)l * E + e] += h->routing.load[e];
}

static loom_block_dropout block_dropout(const loom_gpt *m, const loom_gpt_batch *batch, int layer) {
  return (loom_block_dropout){.p = batch->train ? m->p.cfg.dropout : 0.0f, .seed = m->seed,
                              .step = batch->step, .layer = layer,
                              .sample_offset = batch->sample_offset};
}

static loom_vocab_range vocab_range(const loom_gpt *m) {
  return loom_vocab_range_of(&m->tp, m->p.cfg.vocab, m->p.cfg.padded_vocab);
}

static int local_rows(const loom_gpt *m) { return loom_tp_local_rows(&m->tp, m->T) * m->B; }

/* bf16 runs: rounds x[n] to bf16 values, as a bf16 tensor holds them. */
static void to_bf16_values(const loom_gpt *m, float *x, size_t n) {
  if (m->p.cfg.bf16) m->ops->round_bf16(m->ops, x, n);
}

/* ---- bf16 runs: compute weights and packed activations ---- */

void loom_gpt_sync_compute_weights(loom_gpt *m) {
  /* Under the distributed optimizer there is no whole master here: the optimizer publishes the compute copy.
   * Right after a plain AdamW step it is current too: the step wrote it. */
  const bool fresh = m->p.compute_fresh;
  m->p.compute_fresh = false;
  if (m->p.cfg.bf16 && loom_gpt_params_have_master(&m->p) && !fresh)
    m->ops->to_bf16(m->ops, m->p.compute.base, m->p.params.base, m->p.params.numel);
}

static const float *expert_bias(const loom_gpt *m, int l) {
  return m->expert_bias ? m->expert_bias + (size_t)l * (size_t)m->p.cfg.moe.experts : NULL;
}

/* The weights layer l computes with: its fp32 parameters, or in bf16 runs
 * the bf16 copy's linears in place and its norms and biases unpacked into
 * the layer's scratch (the 1-D tensors: every 2-D one of a layer is a
 * linear's weight). The scratch is laid out as the copy is, from its first
 * tensor on, so one offset finds a view in both. */
static loom_block_compute_weights layer_weights(loom_gpt *m, int l) {
  if (!m->p.cfg.bf16) {
    const loom_block_weights *v = &m->p.w.h[l];
    return (loom_block_compute_weights){.v = v, .c_attn = loom_linear_fp32(v->c_attn_w),
                                        .attn_proj = loom_linear_fp32(v->attn_proj_w),
                                        .c_fc = loom_linear_fp32(v->c_fc_w), .mlp_proj = loom_linear_fp32(v->mlp_proj_w),
                                        .moe = {.router = v->router_w, .expert_bias = expert_bias(m, l),
                                                .fc = loom_linear_fp32(v->experts_fc_w),
                                                .proj = loom_linear_fp32(v->experts_proj_w)}};
  }
  const int first = m->p.layer_tensor[l], count = m->p.layer_tensor[l + 1] - first;
  const loom_tensor *t = &m->p.compute.views[first];
  const uint16_t *bits = t[0].data; /* the layer's tensors lie back to back */
  const loom_block_weights *v = &m->w.layer_w[loom_gpt_layer_is_moe(&m->p.cfg, m->p.range.layer_begin + l)];
  float *scratch = v->ln_1_w;
  for (int j = 0; j < count; j++) { /* the 1-D tensors, and the router and gate, which run in fp32 */
    const loom_param_role role = m->p.meta[first + j].role;
    if (t[j].ndim != 1 && role != LOOM_ROLE_ROUTER_W && role != LOOM_ROLE_SHARED_GATE_W) continue;
    const uint16_t *at = t[j].data;
    m->ops->from_bf16(m->ops, scratch + (at - bits), at, loom_tensor_numel(&t[j]));
  }
#define BITS(view) ((loom_linear_weight){.bf16 = v->view ? bits + (v->view - scratch) : NULL})
  return (loom_block_compute_weights){.v = v, .c_attn = BITS(c_attn_w), .attn_proj = BITS(attn_proj_w),
                                      .c_fc = BITS(c_fc_w), .mlp_proj = BITS(mlp_proj_w),
                                      .moe = {.router = v->router_w, .expert_bias = expert_bias(m, l),
                                              .fc = BITS(experts_fc_w), .proj = BITS(experts_proj_w)}};
#undef BITS
}

static void unpack(loom_gpt *m, float *dst, const loom_tensor *t) { m->ops->from_bf16(m->ops, dst, t->data, loom_tensor_numel(t)); }

/* The embedding's and head's weights the stage computes with, as
 * layer_weights: in bf16 runs the final norm's unpacked, and the learned
 * positions too when `positions`; the vocabulary tables are read as bits
 * (vocab_weight). */
static loom_gpt_weights edge_weights(loom_gpt *m, bool positions) {
  if (!m->p.cfg.bf16) return m->p.w;
  const loom_buffer *c = &m->p.compute;
  float *at = m->w.edges; /* where bind_weights put them */
  for (int k = next_edge_tensor(m, -1); k < c->count; k = next_edge_tensor(m, k)) {
    if (loom_param_is_vocab_table(&m->p.meta[k])) continue;
    if (positions || c->views[k].ndim == 1) unpack(m, at, &c->views[k]);
    at += loom_tensor_numel(&c->views[k]);
  }
  return m->w.weights_of;
}

/* A vocabulary table: the embedding's (role LOOM_ROLE_WTE) or the LM head's
 * (the embedding's when tied), as w's view or, in bf16 runs, as the bits of
 * the bf16 copy. */
static loom_linear_weight vocab_weight(const loom_gpt *m, const loom_gpt_weights *w, loom_param_role role) {
  if (role == LOOM_ROLE_LM_HEAD && !m->p.cfg.untied) role = LOOM_ROLE_WTE;
  if (!m->p.cfg.bf16) return loom_linear_fp32(role == LOOM_ROLE_WTE ? w->wte : w->lm_head);
  const loom_buffer *c = &m->p.compute;
  for (int k = 0; k < c->count; k++)
    if (m->p.meta[k].role == role) return (loom_linear_weight){.bf16 = c->views[k].data};
  LOOM_CHECK(false, "the stage holds its vocabulary table");
  return (loom_linear_weight){0};
}

/* Whether local layer l recomputes in backward: the first recompute_layers do. */
static bool redone(const loom_gpt *m, int l) { return l < m->recompute_layers; }
/* Whether a recomputed layer starts its group (its input kept in the slot). */
static bool group_start(const loom_gpt *m, int l) { return l % m->recompute_group == 0; }
/* The last layer of recomputed layer l's group. */
static int group_end(const loom_gpt *m, int l) {
  const int end = (l / m->recompute_group + 1) * m->recompute_group - 1;
  return end < m->recompute_layers ? end : m->recompute_layers - 1;
}

/* The fp32 activations layer l computes in: the slot's own, or (recompute,
 * bf16) the one-layer scratch, with the slot's norm statistics and
 * log-sum-exps in bf16 runs. */
static loom_block_acts layer_acts(const loom_gpt *m, const loom_gpt_slot *s, int l) {
  const int k = l - m->recompute_layers; /* a kept layer's place in the slot */
  if (!redone(m, l) && !m->p.cfg.bf16) return s->blocks[k];
  loom_block_acts a = m->w.redo[redone(m, l) ? l % m->recompute_group : 0];
  if (!redone(m, l)) {
    a.ln_1_mean = s->blocks[k].ln_1_mean, a.ln_1_rstd = s->blocks[k].ln_1_rstd;
    a.ln_2_mean = s->blocks[k].ln_2_mean, a.ln_2_rstd = s->blocks[k].ln_2_rstd;
    a.att_lse = s->blocks[k].att_lse;
    a.moe = s->blocks[k].moe;
    const loom_block_packed *p = &s->packed[k]; /* the linears' inputs: read and written in place */
    a.ln_1_bits = p->ln_1, a.atty_bits = p->atty, a.ln_2_bits = p->ln_2, a.fc_gelu_bits = p->fc_gelu;
  }
  return a;
}

/* Elements of each of local layer l's big activations in this model's slots. */
static void layer_counts(const loom_gpt *m, int l, int64_t c[BIG]) {
  const dims d = dims_of(&m->p.cfg, m->T, m->B, m->tp.size, m->tp.sequence_parallel, &m->p.range, recompute_of(m));
  big_counts(&d, loom_gpt_layer_is_moe(&m->p.cfg, m->p.range.layer_begin + l), c);
}

/* bf16 runs: the activations forward leaves in fp32 scratch and packs
 * after the layer (qkv, res_attn, fc, out: the linears' inputs it packed as
 * the linears read them), and those backward reads as fp32 (qkv, atty,
 * res_attn, fc), by their place in BIG_NAMES. */
enum { PACKED_AFTER = 4, READ_BACK = 4 };
static const int PACKED_AFTER_LAYER[PACKED_AFTER] = {1, 3, 5, 7};
static const int READ_IN_BACKWARD[READ_BACK] = {1, 2, 3, 5};

/* Moves activations `which[n]` (BIG_NAMES places) of layer l between the
 * fp32 scratch and the slot's bf16 copy (exactly: they hold bf16 values). */
static void pack_layer(loom_gpt *m, loom_gpt_slot *s, int l, loom_block_acts *a, bool pack, const int *which, int n) {
  const loom_block_packed *p = &s->packed[l - m->recompute_layers];
  uint16_t *const narrow[BIG] = {p->ln_1, p->qkv, p->atty, p->res_attn, p->ln_2, p->fc, p->fc_gelu, p->out};
  int64_t c[BIG];
  layer_counts(m, l, c);
  for (int k = 0; k < n; k++) {
    const int i = which[k];
    float *wide = *act_field(a, i);
    if (pack) m->ops->to_bf16(m->ops, narrow[i], wide, (size_t)c[i]);
    else m->ops->from_bf16(m->ops, wide, narrow[i], (size_t)c[i]);
  }
}

/* Layer l's input: the stage input for layer 0, else the previous layer's
 * output, which the slot's inputs keep for the recomputed layers and the
 * first kept one, a kept layer's activations for the next, and bf16 runs
 * in w.xin (during forward, where it was left; in backward, unpacked from
 * the slot). */
static const float *layer_input(loom_gpt *m, const loom_gpt_slot *s, int l, bool backward) {
  if (l == 0) return s->x0;
  const int R = m->recompute_layers, G = m->recompute_group;
  const size_t nh = (size_t)local_rows(m) * m->p.cfg.hidden;
  if (l < R && !group_start(m, l)) return m->w.redo[(l - 1) % G].out; /* within a group: the previous layer's output */
  if (l < R) return s->inputs + (size_t)(l / G) * nh;
  if (l == R) return s->inputs + (size_t)recompute_groups(R, G) * nh;
  if (!m->p.cfg.bf16) return s->blocks[l - 1 - R].out;
  if (backward) m->ops->from_bf16(m->ops, m->w.xin, s->packed[l - 1 - R].out, (size_t)local_rows(m) * m->p.cfg.hidden);
  return m->w.xin;
}

const float *loom_gpt_stage_output(const loom_gpt *m, int slot) {
  const loom_gpt_slot *s = &m->slots[slot];
  if (m->p.layers == 0) return s->x0;
  const int kept = m->p.layers - m->recompute_layers;
  return kept == 0 || m->p.cfg.bf16 ? s->out : s->blocks[kept - 1].out;
}

/* The learned positions of this rank's rows [n, h] (its share of the
 * sequence under sequence and context parallelism) added to x, or
 * backward their grads added into dwpe, run by run of global positions. */
static void learned_positions(loom_gpt *m, float *x, const float *wpe, float *dwpe) {
  const int T = m->T, B = m->B, h = m->p.cfg.hidden, local_T = loom_tp_local_rows(&m->tp, T), cp = loom_tp_cp(&m->tp);
  loom_cp_run runs[2];
  const int n = loom_cp_runs(cp, m->tp.cp_rank, T * cp, local_T == T ? 0 : m->tp.rank * local_T, local_T, runs);
  for (int i = 0; i < n; i++) {
    float *rows = x + (size_t)runs[i].row * B * h;
    if (dwpe) m->ops->position_backward(m->ops, dwpe, rows, runs[i].rows, B, h, runs[i].pos);
    else m->ops->position_forward(m->ops, rows, wpe, runs[i].rows, B, h, runs[i].pos);
  }
}

/* Vocab-parallel embedding onto this rank's rows, plus positions and dropout. */
static void embed_forward(loom_gpt *m, loom_gpt_slot *s, const loom_gpt_batch *batch) {
  const int T = m->T, B = m->B, h = m->p.cfg.hidden, local_T = loom_tp_local_rows(&m->tp, T);
  const size_t nh = (size_t)local_T * B * h;
  const loom_gpt_weights w = edge_weights(m, true);
  float *full = m->tp.size > 1 ? m->w.embed_full : s->x0;
  loom_vocab_parallel_embedding_forward(&m->tp, m->ops, s->x0, full, s->tokens, vocab_weight(m, &w, LOOM_ROLE_WTE),
                                        vocab_range(m), T, B, h);
  if (w.wpe) learned_positions(m, s->x0, w.wpe, NULL);
  to_bf16_values(m, s->x0, nh);
  const loom_block_dropout d0 = block_dropout(m, batch, -1);
  const loom_dropout d_embed = loom_dropout_for(&d0, LOOM_SITE_EMBED, T, &m->tp);
  m->ops->dropout_forward(m->ops, s->x0, local_T, B, h, &d_embed);
  if (d_embed.p > 0.0f) to_bf16_values(m, s->x0, nh); /* at p 0 it changed nothing */
}

/* The embedding's grads (all weight grads) from dres, the grad of its output. */
static void embed_backward(loom_gpt *m, loom_gpt_slot *s, const loom_gpt_batch *batch, float *dres) {
  const int T = m->T, B = m->B, h = m->p.cfg.hidden, local_T = loom_tp_local_rows(&m->tp, T);
  const loom_block_dropout d0 = block_dropout(m, batch, -1);
  const loom_dropout d_embed = loom_dropout_for(&d0, LOOM_SITE_EMBED, T, &m->tp);
  m->ops->dropout_backward(m->ops, dres, local_T, B, h, &d_embed);
  if (d_embed.p > 0.0f) to_bf16_values(m, dres, (size_t)local_T * B * h);
  if (m->p.g.wpe) learned_positions(m, dres, NULL, m->p.g.wpe);
  float *dfull = m->tp.sequence_parallel ? m->w.embed_full : dres;
  loom_vocab_parallel_embedding_backward(&m->tp, m->ops, m->p.g.wte, dres, dfull, s->tokens, vocab_range(m), T, B, h);
}

/* Final norm, then the LM head (wte when tied): a column-parallel linear over this
 * rank's vocab rows, whose logits stay split into the vocab-parallel loss.
 * In bf16 runs the logits stay fp32, as the loss is: the head's GEMM
 * accumulates in fp32 and feeds the loss directly (as PaLM and T5X keep
 * them). Rounding them to bf16 first held the default addition run at 20%
 * exact match where fp32 reaches 100% (docs/training.md). */
static float head_forward(loom_gpt *m, loom_gpt_slot *s, const float *x) {
  const loom_gpt_config *c = &m->p.cfg;
  const int N = m->T * m->B, n = local_rows(m), h = c->hidden;
  const loom_vocab_range v = vocab_range(m);
  const loom_gpt_weights w = edge_weights(m, false);
  float *normed = m->tp.sequence_parallel || c->bf16 ? m->w.block.local : s->ln_f;
  loom_norm_forward(m->ops, c->norm, c->norm_eps, normed, s->ln_f_mean, s->ln_f_rstd, x, w.ln_f_w, w.ln_f_b, n, h);
  loom_column_parallel_forward(&m->tp, m->ops, s->logits, s->ln_f, normed, s->ln_f_bits,
                               vocab_weight(m, &w, LOOM_ROLE_LM_HEAD), NULL, N, n, h, v.rows);
  return loom_vocab_parallel_cross_entropy(&m->tp, m->ops, s->losses, s->lse, s->picked, m->w.lse_scratch, s->logits,
                                           s->targets, v, N);
}

/* The head's input as its GEMMs read it: ln_f, or in bf16 runs its bits. */
static loom_bf16_operand head_input(const loom_gpt_slot *s) { return loom_bf16_kept(s->ln_f, s->ln_f_bits); }

/* Starts backward from the loss: leaves the grad of the head's input in
 * w.dres, and the grad of the logits in their place for head_weight_grad,
 * or adds the head's weight grad now (weight_grad: one op reads dlogits
 * for both of its GEMMs). */
static void head_backward(loom_gpt *m, loom_gpt_slot *s, const float *x, float dloss, bool weight_grad) {
  const int N = m->T * m->B, n = local_rows(m), h = m->p.cfg.hidden;
  const loom_vocab_range v = vocab_range(m);
  const loom_gpt_weights w = edge_weights(m, false);
  loom_vocab_parallel_cross_entropy_backward(m->ops, s->logits, s->logits, s->lse, s->targets, v, dloss, N);
  to_bf16_values(m, s->logits, (size_t)N * v.rows);
  float *d_local = m->tp.sequence_parallel ? m->w.block.local : m->w.d_ln_f;
  loom_column_parallel_backward(&m->tp, m->ops, d_local, m->w.d_ln_f, weight_grad ? m->p.g.lm_head : NULL, NULL,
                                s->logits, NULL, head_input(s), vocab_weight(m, &w, LOOM_ROLE_LM_HEAD), N, n, h, v.rows);
  to_bf16_values(m, d_local, (size_t)n * h);
  loom_mem_zero(m->ops->mem, m->w.dres, (size_t)n * h);
  loom_norm_backward(m->ops, m->p.cfg.norm, m->w.dres, m->p.g.ln_f_w, m->p.g.ln_f_b, d_local, x, w.ln_f_w, s->ln_f_mean,
                             s->ln_f_rstd, n, h);
  to_bf16_values(m, m->w.dres, (size_t)n * h);
}

static void head_weight_grad(loom_gpt *m, loom_gpt_slot *s) {
  loom_linear_weight_grad(m->ops, m->p.g.lm_head, loom_bf16_values(s->logits), head_input(s), m->T * m->B,
                          m->p.cfg.hidden, vocab_range(m).rows, m->p.cfg.bf16);
}

/* Calls the runtime's hook before or after a layer's (or the edges') part of a pass. */
static void hook(loom_gpt *m, bool backward, int layer, bool before) {
  void (*fn)(void *, loom_gpt *, bool, int) = before ? m->hooks.before : m->hooks.after;
  if (fn) fn(m->hooks.ctx, m, backward, layer);
}

float loom_gpt_stage_forward(loom_gpt *m, int slot, const loom_gpt_batch *batch, const float *input) {
  LOOM_CHECK(slot >= 0 && slot < m->nslots, "slot out of range (set the slots first)");
  loom_gpt_slot *s = &m->slots[slot];
  const int N = m->T * m->B, n = local_rows(m), h = m->p.cfg.hidden, L = m->p.layers;
  const size_t nh = (size_t)n * h;
  const loom_allocator *mem = m->ops->mem;
  if (batch->tokens) mem->from_host(mem, s->tokens, batch->tokens, (size_t)N * sizeof(int));
  else mem->fill32(mem, s->tokens, 0, (size_t)N);
  if (batch->targets) mem->from_host(mem, s->targets, batch->targets, (size_t)N * sizeof(int));
  else mem->fill32(mem, s->targets, (uint32_t)-1, (size_t)N); /* -1: no target */
  hook(m, false, LOOM_GPT_EDGES, true);
  if (m->p.range.first) embed_forward(m, s, batch);
  else if (input != s->x0) mem->copy(mem, s->x0, input, nh * sizeof(float));
  for (int l = 0; l < L; l++) {
    const loom_block_shape shape = block_shape(m, l, 0.0f);
    hook(m, false, l, true);
    const loom_block_dropout d = block_dropout(m, batch, m->p.range.layer_begin + l);
    const float *x = layer_input(m, s, l, false);
    const loom_block_compute_weights w = layer_weights(m, l);
    loom_block_acts a = layer_acts(m, s, l);
    loom_block_forward(&a, &m->w.block, x, &w, &shape, &d, &m->tp, m->ops);
    if (shape.moe) moe_count(m, l, a.moe.host);
    hook(m, false, l, false);
    if (!redone(m, l) && !m->p.cfg.bf16) continue;
    /* A recomputed layer keeps only its output, as the next layer's input;
     * bf16 runs keep a layer packed and pass its output on in w.xin. */
    if (!redone(m, l)) pack_layer(m, s, l, &a, true, PACKED_AFTER_LAYER, PACKED_AFTER);
    if (redone(m, l) && l + 1 < m->recompute_layers && !group_start(m, l + 1)) continue; /* read from the scratch */
    float *next = l + 1 == L ? s->out : redone(m, l) ? (float *)layer_input(m, s, l + 1, false) : m->w.xin;
    mem->copy(mem, next, a.out, nh * sizeof(float));
  }
  const float loss = m->p.range.last ? head_forward(m, s, loom_gpt_stage_output(m, slot)) : 0.0f;
  hook(m, false, LOOM_GPT_EDGES, false);
  return loss;
}

/* What layer l's backward needs: its input, its weights and its fp32
 * activations (recomputed with recompute: the same ops and keyed masks redo
 * them bit for bit). */
typedef struct {
  const float *x;
  loom_block_compute_weights w;
  loom_block_acts a;
  loom_block_dropout d;
} layer_pass;

static layer_pass layer_for_backward(loom_gpt *m, loom_gpt_slot *s, const loom_gpt_batch *batch, int l) {
  /* A recomputed group's last layer reruns the group's forward, from its
   * first layer's kept input, into the scratch its backwards then read. */
  for (int j = l - l % m->recompute_group; redone(m, l) && l == group_end(m, l) && j <= l; j++) {
    const loom_block_shape shape = block_shape(m, j, 0.0f);
    const loom_block_compute_weights w = layer_weights(m, j);
    const loom_block_dropout d = block_dropout(m, batch, m->p.range.layer_begin + j);
    loom_block_acts a = layer_acts(m, s, j);
    loom_block_forward(&a, &m->w.block, layer_input(m, s, j, true), &w, &shape, &d, &m->tp, m->ops);
  }
  layer_pass p = {.x = layer_input(m, s, l, true), .w = layer_weights(m, l), .a = layer_acts(m, s, l),
                  .d = block_dropout(m, batch, m->p.range.layer_begin + l)};
  if (!redone(m, l) && m->p.cfg.bf16) pack_layer(m, s, l, &p.a, false, READ_IN_BACKWARD, READ_BACK);
  return p;
}

/* Starts a stage's backward: from the loss on the last stage (with the
 * head's weight grad unless the backward is split), else from dout. */
static void backward_begin(loom_gpt *m, loom_gpt_slot *s, int slot, const float *dout, float dloss, bool split) {
  if (m->p.range.last) head_backward(m, s, loom_gpt_stage_output(m, slot), dloss, !split);
  else m->ops->mem->copy(m->ops->mem, m->w.dres, dout, (size_t)local_rows(m) * m->p.cfg.hidden * sizeof(float));
}

void loom_gpt_stage_backward(loom_gpt *m, int slot, const loom_gpt_batch *batch, const float *dout, float dloss) {
  loom_gpt_slot *s = &m->slots[slot];
  const size_t nh = (size_t)local_rows(m) * m->p.cfg.hidden;
  hook(m, true, LOOM_GPT_EDGES, true);
  backward_begin(m, s, slot, dout, dloss, false);
  for (int l = m->p.layers - 1; l >= 0; l--) {
    const loom_block_shape shape = block_shape(m, l, dloss);
    hook(m, true, l, true);
    const layer_pass p = layer_for_backward(m, s, batch, l);
    loom_block_backward(m->w.dres, &m->p.g.h[l], &m->w.block, &p.a, p.x, &p.w, &shape, &p.d, &m->tp, m->ops);
    hook(m, true, l, false);
  }
  if (m->p.range.first) embed_backward(m, s, batch, m->w.dres);
  else m->ops->mem->copy(m->ops->mem, s->dx0, m->w.dres, nh * sizeof(float));
  hook(m, true, LOOM_GPT_EDGES, false);
}

/* A recomputed MoE layer's inputs to its weight GEMMs, out of the recompute scratch into the weight-grad state. */
static void keep_moe_inputs(const loom_gpt *m, loom_moe_acts *kept, const loom_moe_acts *a) {
  const loom_allocator *mem = m->ops->mem;
  const loom_moe_shape *s = &m->moe;
  const size_t El = (size_t)s->local_experts; /* the rows: a block per rank under expert tensor parallelism */
  const size_t rows = s->etp > 1 ? (size_t)s->etp * (size_t)a->host->block_rows : (size_t)a->host->received;
  mem->copy(mem, kept->x, a->x, (size_t)s->n * s->hidden * sizeof(float));
  mem->copy(mem, kept->perm, a->perm, rows * s->hidden * sizeof(float));
  mem->copy(mem, kept->act, a->act, rows * s->ffn * sizeof(float));
  memcpy(kept->host->counts, a->host->counts, El * sizeof *kept->host->counts);
  memcpy(kept->host->block_counts, a->host->block_counts, (size_t)s->etp * El * sizeof *kept->host->block_counts);
  kept->host->received = a->host->received, kept->host->block_rows = a->host->block_rows;
}

void loom_gpt_stage_backward_input(loom_gpt *m, int slot, int wstate, const loom_gpt_batch *batch, const float *dout,
                                   float dloss) {
  LOOM_CHECK(wstate >= 0 && wstate < m->nwstates, "weight-grad state out of range (set them first)");
  loom_gpt_slot *s = &m->slots[slot];
  loom_gpt_wstate *ws = &m->wstates[wstate];
  const size_t nh = (size_t)local_rows(m) * m->p.cfg.hidden;
  backward_begin(m, s, slot, dout, dloss, true);
  for (int l = m->p.layers - 1; l >= 0; l--) {
    const loom_block_shape shape = block_shape(m, l, dloss);
    int64_t c[BIG];
    layer_counts(m, l, c);
    layer_pass p = layer_for_backward(m, s, batch, l);
    loom_block_backward_input(m->w.dres, &m->p.g.h[l], &m->w.block, &ws->wgrad[l], &p.a, p.x, &p.w, &shape, &p.d, &m->tp,
                              m->ops);
    /* The weight half finds no activations in a recompute slot: keep the linears' inputs (bf16 runs: their bits),
     * and a MoE layer's router input, expert rows and activations, with its experts' row counts. */
    if (redone(m, l) && shape.moe) keep_moe_inputs(m, &ws->winputs[l].moe, &p.a.moe);
    for (int k = 0; redone(m, l) && k < WEIGHT_INPUTS; k++) {
      const int i = WEIGHT_INPUT[k];
      if (m->p.cfg.bf16)
        m->ops->mem->copy(m->ops->mem, *act_bits_field(&ws->winputs[l], k), *act_bits_field(&p.a, k),
                          (size_t)c[i] * sizeof(uint16_t));
      else
        m->ops->mem->copy(m->ops->mem, *act_field(&ws->winputs[l], i), *act_field(&p.a, i), (size_t)c[i] * sizeof(float));
    }
  }
  m->ops->mem->copy(m->ops->mem, s->dx0, m->w.dres, nh * sizeof(float)); /* the stage input's grad, or the embedding's */
}

/* The linears' inputs of layer l for its weight half: the slot's (bf16
 * runs: its bits), or the kept copies (recompute). */
static loom_block_acts weight_inputs(loom_gpt *m, loom_gpt_slot *s, loom_gpt_wstate *ws, int l) {
  return redone(m, l) ? ws->winputs[l] : layer_acts(m, s, l);
}

void loom_gpt_stage_backward_weight(loom_gpt *m, int slot, int wstate, const loom_gpt_batch *batch) {
  LOOM_CHECK(wstate >= 0 && wstate < m->nwstates, "weight-grad state out of range (set them first)");
  loom_gpt_slot *s = &m->slots[slot];
  loom_gpt_wstate *ws = &m->wstates[wstate];
  hook(m, true, LOOM_GPT_EDGES, true);
  if (m->p.range.last) head_weight_grad(m, s);
  for (int l = m->p.layers - 1; l >= 0; l--) {
    const loom_block_shape shape = block_shape(m, l, 0.0f);
    hook(m, true, l, true);
    const loom_block_acts a = weight_inputs(m, s, ws, l);
    loom_block_backward_weight(&m->p.g.h[l], &m->w.block, &ws->wgrad[l], &a, &shape, &m->tp, m->ops);
    hook(m, true, l, false);
  }
  if (m->p.range.first) embed_backward(m, s, batch, s->dx0);
  hook(m, true, LOOM_GPT_EDGES, false);
}

float loom_gpt_forward(loom_gpt *m, const loom_gpt_batch *batch) {
  LOOM_CHECK(m->p.range.first && m->p.range.last, "loom_gpt_forward runs the whole model; stages use stage_forward");
  return loom_gpt_stage_forward(m, 0, batch, NULL);
}

void loom_gpt_backward(loom_gpt *m, const loom_gpt_batch *batch, float dloss) {
  loom_gpt_stage_backward(m, 0, batch, NULL, dloss);
}

void loom_gpt_sum_replicated_grad(const loom_gpt_params *p, const loom_tp *tp, int k, float *g, size_t n) {
  if (tp && tp->sequence_parallel && p->meta[k].tp_replicated) loom_comm_allreduce(tp->group, g, n, LOOM_REDUCE_SUM);
}

void loom_gpt_sync_replicated_grads(loom_gpt *m) {
  if (!m->p.grads.base) return; /* ZeRO-2/3 sum their grad pieces themselves */
  for (int k = 0; k < m->p.grads.count; k++)
    loom_gpt_sum_replicated_grad(&m->p, &m->tp, k, m->p.grads.views[k].data, loom_tensor_numel(&m->p.grads.views[k]));
}

void loom_gpt_zero_grad(loom_gpt *m) {
  if (m->p.grads.base) loom_mem_zero(m->ops->mem, m->p.grads.base, m->p.grads.numel);
}

void loom_gpt_predict(loom_gpt *m, int *out) {
  loom_gpt_slot *s = m->a;
  const int N = m->T * m->B;
  const loom_vocab_range v = vocab_range(m);
  m->ops->argmax(m->ops, s->picked, s->pred, s->logits, N, v.valid, v.rows);
  float *val = loom_xmalloc(2 * (size_t)N * sizeof(float), "predictions");
  m->ops->mem->to_host(m->ops->mem, out, s->pred, (size_t)N * sizeof(int));
  m->ops->mem->to_host(m->ops->mem, val, s->picked, (size_t)N * sizeof(float));
  for (int i = 0; i < N; i++)
    if (out[i] >= 0) out[i] += v.start;
  loom_tp_combine_argmax(&m->tp, val, out, val + N, N);
  free(val);
}
