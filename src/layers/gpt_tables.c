/* The layers' buffer tables: what a slot, the shared scratch and a
 * weight-grad state hold, listed once for allocation (gpt.c) and for the
 * memory model's sizes (loom_gpt_activation_sizes_of). */
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "layers/gpt_tables.h"
#include "tensor_parallel/linear.h"


static void want_as(act_list *l, void *slot, const char *name, int64_t numel) {
  LOOM_CHECK(l->count < (int)(sizeof l->specs / sizeof l->specs[0]), "too many activation views");
  l->specs[l->count] = loom_tensor_spec(name, l->dtype, 1, &numel);
  l->slots[l->count++] = slot;
}

static void want(act_list *l, float **slot, const char *name, int64_t numel) { want_as(l, slot, name, numel); }
static void want16(act_list *l, uint16_t **slot, const char *name, int64_t numel) { want_as(l, slot, name, numel); }


/* The activation shapes at this rank's sequence length T (its chunks'
 * rows under context parallelism); weight_scratch (what only allocation
 * needs, read off the parameter table) is filled by with_weight_scratch. */
/* Groups the first R layers make in groups of G, the last maybe short: the
 * slot's kept inputs before the first kept layer's. */
int loom_tables_recompute_groups(int R, int G) { return (R + G - 1) / G; }

dims loom_tables_dims_of(const loom_gpt_config *c, int T, int B, int tp, bool sp, const loom_stage_range *r, loom_recompute rc) {
  const int L = r->layer_end - r->layer_begin, R = rc.layers < 0 ? 0 : rc.layers > L ? L : rc.layers;
  const int moe_layers = loom_gpt_moe_layers(c, r->layer_begin, r->layer_end);
  const bool moe = moe_layers > 0, dense = moe_layers < L;
  const int64_t fk[LOOM_LAYER_KINDS] = {c->ffn / tp, loom_gpt_is_moe(c) ? c->moe.shared_ffn / tp : 0};
  const int64_t f = dense && fk[0] > (moe ? fk[1] : 0) ? fk[0] : moe ? fk[1] : 0, D = loom_gpt_head_dim(c);
  const int64_t N = (int64_t)T * B, H = c->heads / tp, K = loom_gpt_local_kv_heads(c, tp);
  const int64_t Dq = loom_gpt_qk_head_dim(c), Dv = loom_gpt_v_head_dim(c);
  const int64_t qkv = (H + K) * Dq + K * Dv, n = sp ? N / tp : N;
  const loom_mla_config *mla = &c->mla;
  const loom_mla_shape ms = loom_mla_shape_of(c);
  const int64_t k = moe ? c->moe.topk : 0, fe = moe ? loom_gpt_local_expert_ffn(c) : 0, wide = loom_mlp_fc_factor(c->mlp);
  const int seq = loom_gpt_seq_ranks(c, tp, sp);
  const int64_t taken = moe ? loom_moe_recv_rows(c, n, seq) : 0, rows = moe ? loom_moe_expert_rows(c, n, seq) : 0;
  return (dims){.N = N, .n = n, .h = c->hidden, .f = L ? f : fk[0], .w = H * Dv,
                .fk = {fk[0], fk[1]}, .fck = {wide * fk[0], wide * fk[1]}, .cfg = c, .layer0 = r->layer_begin,
                .E = moe ? c->moe.experts : 0, .k = k, .M = n * k, .taken = taken, .X = rows,
                .ep = c->moe.ep > 1 ? c->moe.ep : 1, .etp = loom_gpt_expert_tp(c),
                .fe = fe, .fce = loom_mlp_fc_factor(c->mlp) * fe, .gate = moe && c->moe.shared_gate,
                .lse = (int64_t)B * (c->heads / tp) * T, .V = c->padded_vocab / tp, .qkv = qkv,
                .fc = wide * (L ? f : fk[0]),
                .ring = loom_gpt_cp(c) > 1 ? N * K * (Dq + Dv) : 0, .cp = loom_gpt_cp(c),
                .cp_all_gather = c->cp_all_gather,
                .d_qkv_w = loom_gpt_kv_replicas(c, tp) > 1 ? qkv * (c->hidden + 1) : 0,
                .qk_rows = c->qk_norm ? N * (c->heads / tp + loom_gpt_local_kv_heads(c, tp)) : 0, .D = D,
                .mla_q = mla->q_lora_rank, .mla_kv = mla->kv_lora_rank, .mla_pe = mla->qk_pos_emb_head_dim,
                .mla_q_up = H * Dq, .mla_kv_up = loom_gpt_is_mla(c) ? H * (mla->qk_head_dim + mla->v_head_dim) : 0,
                .mla_widest = loom_gpt_is_mla(c) ? loom_mla_widest(&ms) : 0,
                .L = L, .tp = tp, .mtp = r->last ? c->mtp_layers : 0, .R = R, .K = L - R, .G = rc.group > 1 ? rc.group : 1, .first = r->first, .last = r->last,
                .bf16 = c->bf16};
}

/* The FP8 casts' workspace: operands of at most N rows (the experts': X) or the widest linear's rows (its
 * weight) by the widest linear's width. */
static void fp8_workspace_of(dims *d, const loom_gpt_config *c) {
  if (!c->fp8.on || !c->bf16 || d->L == 0) return;
  const int64_t widths[] = {d->h, d->qkv, d->w, d->fc, d->f, d->mla_q_up, d->mla_kv_up, d->mla_widest,
                            d->mla_q + d->mla_kv + d->mla_pe, d->fe, d->fce};
  int64_t width = 0;
  for (size_t i = 0; i < sizeof widths / sizeof *widths; i++) width = widths[i] > width ? widths[i] : width;
  const int64_t rows = d->N > d->X ? d->N : d->X; /* an expert's rows: at most the rows the rank's experts take */
  d->fp8_dim = rows > width ? rows : width;
  d->fp8_elems = d->fp8_dim * width;
}

dims loom_tables_with_weight_scratch(dims d, const loom_gpt_config *c, int tp) {
  fp8_workspace_of(&d, c);
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



/* Ints in an fp32 table: views of as many 4-byte elements. */
static void want_ints(act_list *l, int **slot, const char *name, int64_t numel) {
  _Static_assert(sizeof(int) == sizeof(float), "an int takes a float's room");
  want_as(l, slot, name, numel);
}


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
  if (d->qk_rows) {
    want(l, &v->qk_raw, "qk_raw", L * d->qk_rows * d->D);
    want(l, &v->qk_rstd, "qk_rstd", L * d->qk_rows);
  }
  if (d->mla_kv) {
    if (d->mla_q) want(l, &v->mla.q_raw, "mla_q_raw", L * d->n * d->mla_q), want(l, &v->mla.q_in, "mla_q_in", L * d->N * d->mla_q);
    want(l, &v->mla.kv_raw, "mla_kv_raw", L * d->n * d->mla_kv);
    want(l, &v->mla.kv_in, "mla_kv_in", L * d->N * d->mla_kv);
    want(l, &v->mla.rstd, "mla_rstd", L * 2 * d->n);
  }
  want_moe(l, &v->moe, d, moe_before(d, s, L));
}


/* Of a layer of a kind (-1: the stage's largest, scratch's). */
void loom_tables_big_counts(const dims *d, int kind, int64_t c[BIG]) {
  const int64_t fc = kind < 0 ? d->fc : d->fck[kind], f = kind < 0 ? d->f : d->fk[kind];
  const int64_t counts[BIG] = {d->N * d->h, d->N * d->qkv, d->N * d->w, d->n * d->h,
                               d->N * d->h, d->N * fc,     d->N * f,    d->n * d->h};
  memcpy(c, counts, sizeof counts);
}

/* Elements of big activation i that s's first j layers take, and all of s's. */
static int64_t big_offset(const dims *d, span s, int j, int i) {
  int64_t at = 0, c[BIG];
  for (int q = 0; q < j; q++) loom_tables_big_counts(d, kind_in(d, s, q), c), at += c[i];
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
void loom_tables_bind_packed(loom_block_packed *b, const loom_block_packed *p, const dims *d, span s) {
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
uint16_t **loom_tables_act_bits_field(loom_block_acts *a, int k) {
  uint16_t **const fields[WEIGHT_INPUTS] = {&a->ln_1_bits, &a->atty_bits, &a->ln_2_bits, &a->fc_gelu_bits};
  return fields[k];
}

void loom_tables_bind_layers(loom_block_acts *b, const layer_views *v, const dims *d, span s) {
  for (int j = 0; j < s.L; j++) {
    int64_t o[BIG];
    for (int i = 0; i < BIG; i++) o[i] = big_offset(d, s, j, i);
    const bool moe = kind_in(d, s, j) != 0; /* scratch: MoE acts where the stage has MoE layers */
    b[j] = (loom_block_acts){
        .ln_1_mean = at(v->ln1m, j * d->n), .ln_1_rstd = at(v->ln1r, j * d->n), .ln_2_mean = at(v->ln2m, j * d->n),
        .ln_2_rstd = at(v->ln2r, j * d->n), .att_lse = at(v->lse, j * d->lse), .ln_1 = at(v->ln1, o[0]),
        .qkv = at(v->qkv, o[1]), .atty = at(v->atty, o[2]), .res_attn = at(v->resa, o[3]),
        .ln_2 = at(v->ln2, o[4]), .fc = at(v->fc, o[5]), .fc_gelu = at(v->fcg, o[6]),
        .out = at(v->out, o[7]), .qk_raw = at(v->qk_raw, j * d->qk_rows * d->D), .qk_rstd = at(v->qk_rstd, j * d->qk_rows),
        .mla = {.q_raw = at(v->mla.q_raw, j * d->n * d->mla_q), .q_in = at(v->mla.q_in, j * d->N * d->mla_q),
                .kv_raw = at(v->mla.kv_raw, j * d->n * d->mla_kv), .kv_in = at(v->mla.kv_in, j * d->N * d->mla_kv),
                .rstd = at(v->mla.rstd, j * 2 * d->n)},
        .moe = moe ? moe_layer(&v->moe, d, moe_before(d, s, j)) : (loom_moe_acts){0}};
    for (int k = 0; k < WEIGHT_INPUTS; k++) *loom_tables_act_bits_field(&b[j], k) = at16(v->bits[k], o[WEIGHT_INPUT[k]]);
  }
}

/* Layer activation i (BIG_NAMES order) of a. */
float **loom_tables_act_field(loom_block_acts *a, int i) {
  float **const fields[BIG] = {&a->ln_1, &a->qkv, &a->atty, &a->res_attn, &a->ln_2, &a->fc, &a->fc_gelu, &a->out};
  return fields[i];
}

/* The linears' output grads a split backward keeps: names and elements per layer. */
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


void loom_tables_list_wstate(act_list *l, act_list *l16, wgrad_views *v, const dims *d) {
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
void loom_tables_bind_wstate(loom_gpt_wstate *s, const wgrad_views *v, const dims *d, const loom_block_scratch *scratch) {
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
      if (d->bf16) *loom_tables_act_bits_field(&s->winputs[i], k) = v->input_bits[k] + offset;
      else *loom_tables_act_field(&s->winputs[i], WEIGHT_INPUT[k]) = v->inputs[k] + offset;
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
void loom_tables_list_slot(act_list *l, act_list *l16, loom_gpt_slot *s, layer_views *v, loom_block_packed *p,
                      const dims *d) {
  *l = (act_list){.dtype = LOOM_DTYPE_F32};
  *l16 = (act_list){.dtype = LOOM_DTYPE_BF16};
  memset(v, 0, sizeof *v);
  want(l, &s->x0, "x0", d->n * d->h);
  want(l, &s->dx0, "dx0", d->n * d->h);
  /* The input of each recomputed group's first layer (slot g for group g;
   * group 0's is x0), and the first kept layer's, which the last recomputed
   * one gives it. */
  const int groups = loom_tables_recompute_groups(d->R, d->G);
  if (d->R) want(l, &s->inputs, "inputs", (d->K ? groups + 1 : groups) * d->n * d->h);
  if (d->L > 0 && (d->K == 0 || d->bf16)) want(l, &s->out, "out", d->n * d->h);
  const span kept = {d->R, d->K};
  if (d->K > 0 && d->bf16) {
    want_stats(l, v, d, kept);
    want_packed(l16, p, d, kept);
  } else if (d->K > 0) {
    want_layers(l, v, d, kept);
  }
  if (d->last) { /* the main head's, then each MTP depth's */
    const int64_t heads = 1 + d->mtp;
    want(l, &s->ln_f_mean, "ln_f_mean", heads * d->n);
    want(l, &s->ln_f_rstd, "ln_f_rstd", heads * d->n);
    if (d->bf16) want16(l16, &s->ln_f_bits, "ln_f_bits", heads * d->N * d->h); /* bits alone, as the layers' */
    else want(l, &s->ln_f, "ln_f", heads * d->N * d->h);
    want(l, &s->logits, "logits", heads * d->N * d->V);
    want(l, &s->losses, "losses", heads * d->N);
    want(l, &s->lse, "lse", heads * d->N);
    want(l, &s->picked, "picked", heads * d->N);
  }
  if (d->mtp) { /* each depth's tokens ahead and targets, the combination's activations, and the blocks' outputs but
                 * the last's (the stage output) */
    want_ints(l, &s->mtp_tokens, "mtp_tokens", d->mtp * d->N);
    want_ints(l, &s->mtp_targets, "mtp_targets", d->mtp * d->N);
    want(l, &s->mtp_emb, "mtp_emb", d->mtp * d->n * d->h);
    want(l, &s->mtp_hin, "mtp_hin", d->mtp * d->n * d->h);
    want(l, &s->mtp_stats, "mtp_stats", d->mtp * 4 * d->n);
    want(l, &s->mtp_cat, "mtp_cat", d->mtp * d->n * 2 * d->h);
    want(l, &s->mtp_x, "mtp_x", d->mtp * d->n * d->h);
    want(l, &s->mtp_y, "mtp_y", d->mtp * d->n * d->h);
  }
}

/* Layers the scratch computes a layer in holds: a recompute group's (at
 * most the recomputed layers), or one. */
int loom_tables_redo_layers(const dims *d) { return d->R ? (d->G < d->R ? d->G : d->R) : 1; }

/* Scratch every slot shares: fp32 views in l, bf16 ones in l16. */
void loom_tables_list_work(act_list *l, act_list *l16, loom_gpt_work *w, layer_views *v, const dims *d) {
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
  if (d->qk_rows) want(l, &s->qk_norm, "qk_norm", 2 * d->qk_rows * d->D); /* q and k side by side, and their grads */
  if (d->mla_kv) {
    loom_mla_scratch *m = &s->mla;
    want(l, &m->q, "mla_q", d->N * d->mla_q_up);
    want(l, &m->kv, "mla_kv", d->N * d->mla_kv_up);
    want(l, &m->pe, "mla_pe", d->N * d->mla_pe);
    want(l, &m->pe_head, "mla_pe_head", d->N * d->mla_pe);
    want(l, &m->local, "mla_local", d->n * d->mla_widest);
    want(l, &m->local2, "mla_local2", d->n * d->mla_widest);
    want(l, &m->full, "mla_full", d->N * d->mla_widest);
  }
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
  if (d->fp8_elems) want(l, &w->fp8_space, "fp8", (int64_t)loom_fp8_workspace_floats((size_t)d->fp8_elems, (size_t)d->fp8_dim));
  w->fp8_elems = d->fp8_elems, w->fp8_dim = d->fp8_dim;
  if (d->mtp) { /* the combination's scratch and row orders, and its grads */
    want(l, &w->mtp.pair, "mtp_pair", 2 * d->n * d->h);
    want_ints(l, &w->mtp.interleave, "mtp_interleave", 2 * d->n);
    want_ints(l, &w->mtp.split, "mtp_split", 2 * d->n);
    want(l, &w->mtp_dcat, "mtp_dcat", 2 * d->n * d->h);
    want(l, &w->mtp_demb, "mtp_demb", d->n * d->h);
    want(l, &w->mtp_dhin, "mtp_dhin", d->n * d->h);
  }
  want(l, &w->dres, "dres", d->n * d->h);
  want(l, &w->d_ln_f, "d_ln_f", d->N * d->h);
  want(l, &w->lse_scratch, "lse_scratch", d->N);
  if (d->R || d->bf16) want_layers(l, v, d, (span){-1, loom_tables_redo_layers(d)});
  if (d->bf16) {
    want(l, &w->xin, "xin", d->n * d->h);
    want(l, &w->weights, "weights", d->weight_scratch);
    uint16_t **grads[WGRADS] = {&s->d_qkv_bits, &s->d_attn_bits, &s->d_fc_bits, &s->d_mlp_bits};
    const char *const names[WGRADS] = {"d_qkv_bits", "d_attn_bits", "d_fc_bits", "d_mlp_bits"};
    int64_t g[WGRADS];
    wgrad_counts(d, -1, g);
    for (int k = 0; k < WGRADS; k++) want16(l16, grads[k], names[k], g[k]);
    for (int k = 0; d->R && k < WEIGHT_INPUTS; k++)
      want16(l16, &v->bits[k], BIG_NAMES[WEIGHT_INPUT[k]], big_offset(d, (span){-1, loom_tables_redo_layers(d)}, loom_tables_redo_layers(d), WEIGHT_INPUT[k]));
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
  const dims plain = loom_tables_dims_of(&c, loom_gpt_local_seq(cfg, T), B, tp, sequence_parallel && tp > 1, &r, recompute);
  const dims d = loom_tables_with_weight_scratch(plain, &c, tp);
  act_list l, l16;
  loom_gpt_slot s;
  loom_gpt_work w;
  layer_views v;
  loom_block_packed p;
  wgrad_views wv;
  loom_gpt_activation_sizes out = {.tokens = (size_t)d.N};
  loom_tables_list_slot(&l, &l16, &s, &v, &p, &d);
  out.slot = list_elements(&l), out.slot16 = list_elements(&l16);
  loom_tables_list_work(&l, &l16, &w, &v, &d);
  out.work = list_elements(&l), out.work16 = list_elements(&l16);
  loom_tables_list_wstate(&l, &l16, &wv, &plain); /* as loom_gpt_set_weight_states lists them */
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
loom_recompute loom_tables_recompute_of(const loom_gpt *m) {
  return (loom_recompute){.layers = m->recompute_layers, .group = m->recompute_group};
}

/* Allocates a table and points its slots at the views. */
loom_status loom_tables_place(loom_buffer *mem, act_list *l, const loom_allocator *backend, loom_run_buffer name) {
  loom_status st = loom_buffer_init(mem, l->specs, l->count, backend, loom_run_buffer_name(name));
  if (st != LOOM_OK) return st;
  for (int i = 0; i < l->count; i++) {
    if (l->dtype == LOOM_DTYPE_BF16) *(uint16_t **)l->slots[i] = mem->views[i].data;
    else *(float **)l->slots[i] = mem->views[i].data;
  }
  return LOOM_OK;
}

