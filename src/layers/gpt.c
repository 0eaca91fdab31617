/* GPT forward, backward and recompute, whole or one pipeline stage, over the
 * blocks, in the slots and scratch gpt_tables.c lists. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "layers/gpt_tables.h"
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
  free(m->w.mtp_w);
  free(m->w.mtp_host);
  free(m->cp_pos);
  m->cp_pos = NULL;
  free(m->fp8_sites);
  m->fp8_sites = NULL;
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
  m->w.weights_of = (loom_gpt_weights){.h = m->w.layer_w, .mtp = m->w.mtp_w};
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

bool loom_gpt_layer_fp8(const loom_gpt_config *c, int g) {
  return c->fp8.on && c->bf16 && g >= c->fp8.bf16_first && g < c->layers - c->fp8.bf16_last;
}

/* Every local layer's FP8 state, on the workspace; delayed scaling's scales come with loom_gpt_fp8_bind. */
static void fp8_sites_init(loom_gpt *m) {
  const loom_gpt_work *w = &m->w;
  m->fp8_ws = loom_fp8_workspace_at(w->fp8_space, (size_t)w->fp8_elems, (size_t)w->fp8_dim);
  m->fp8_sites = loom_xcalloc((size_t)m->p.layers * LOOM_FP8_LINEARS, sizeof *m->fp8_sites, "FP8 linears");
  for (size_t i = 0; i < (size_t)m->p.layers * LOOM_FP8_LINEARS; i++) {
    /* An expert's GEMM runs where it has rows, which the tp x cp ranks need not share: its tensorwise amax is its
     * own (no collective a rank without rows would miss). */
    const bool expert = i % LOOM_FP8_LINEARS >= LOOM_FP8_EXPERTS_FC;
    m->fp8_sites[i] = (loom_fp8_site){.cfg = &m->p.cfg.fp8, .ws = &m->fp8_ws, .amax_group = expert ? NULL : m->tp.shard_group};
  }
}

void loom_gpt_fp8_bind(loom_gpt *m, const float *scale, float *step_amax) {
  const size_t per = LOOM_FP8_OPERANDS, first = (size_t)m->p.range.layer_begin * LOOM_FP8_LINEARS;
  for (size_t i = 0; m->fp8_sites && i < (size_t)m->p.layers * LOOM_FP8_LINEARS; i++)
    m->fp8_sites[i].scale = scale + (first + i) * per, m->fp8_sites[i].step_amax = step_amax + (first + i) * per;
}

/* Local layer l's FP8 state, NULL where its GEMMs are bf16. */
static loom_fp8_site *fp8_layer(const loom_gpt *m, int l) {
  return m->fp8_sites && loom_gpt_layer_fp8(&m->p.cfg, m->p.range.layer_begin + l) ? m->fp8_sites + (size_t)l * LOOM_FP8_LINEARS
                                                                                    : NULL;
}

loom_status loom_gpt_set_slots(loom_gpt *m, int seq, int B, int slots) {
  const loom_gpt_config *c = &m->p.cfg;
  const int cp = loom_gpt_cp(c), T = loom_gpt_local_seq(c, seq); /* this rank's rows of each sequence */
  LOOM_CHECK(seq >= 1 && seq <= c->seq && B >= 1 && slots >= 1, "micro-batch shape out of range");
  LOOM_CHECK(cp == 1 || seq % (2 * cp) == 0, "context parallelism needs T divisible by 2 cp");
  LOOM_CHECK(!m->tp.sequence_parallel || T % m->tp.size == 0, "sequence parallelism needs T / cp divisible by tp");
  if (m->T == T && m->B == B && m->nslots == slots) return LOOM_OK;
  slots_free(m);
  const dims d = loom_tables_with_weight_scratch(loom_tables_dims_of(c, T, B, m->tp.size, m->tp.sequence_parallel, &m->p.range, loom_tables_recompute_of(m)),
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
    s->tokens = loom_zalloc(m->ops->mem, (size_t)d.N * sizeof(int), tokens);
    s->targets = s->tokens ? loom_zalloc(m->ops->mem, (size_t)d.N * sizeof(int), tokens) : NULL;
    s->pred = s->targets ? loom_zalloc(m->ops->mem, (size_t)d.N * sizeof(int), tokens) : NULL;
    if (!s->tokens || !s->targets || !s->pred) {
      st = LOOM_ERR_NOMEM;
      break;
    }
    loom_tables_list_slot(&l, &l16, s, &v, &p, &d);
    st = loom_tables_place(&s->mem, &l, m->ops->mem, LOOM_BUF_SLOT);
    if (st == LOOM_OK) st = loom_tables_place(&s->mem16, &l16, m->ops->mem, LOOM_BUF_SLOT_BF16);
    if (st == LOOM_OK && d.K > 0) { /* the kept layers', blocks[l - R] for layer l */
      s->blocks = loom_xcalloc((size_t)d.K, sizeof *s->blocks, "block activations");
      loom_tables_bind_layers(s->blocks, &v, &d, (span){d.R, d.K});
    }
    if (st == LOOM_OK && d.K > 0 && d.bf16) {
      s->packed = loom_xcalloc((size_t)d.K, sizeof *s->packed, "packed activations");
      loom_tables_bind_packed(s->packed, &p, &d, (span){d.R, d.K});
    }
  }
  if (st == LOOM_OK) {
    loom_tables_list_work(&l, &l16, &m->w, &v, &d);
    st = loom_tables_place(&m->w.mem, &l, m->ops->mem, LOOM_BUF_WORK);
    if (st == LOOM_OK) st = loom_tables_place(&m->w.mem16, &l16, m->ops->mem, LOOM_BUF_WORK_BF16);
    if (st == LOOM_OK && (d.R || d.bf16)) {
      m->w.redo = loom_xcalloc((size_t)loom_tables_redo_layers(&d), sizeof *m->w.redo, "recompute scratch");
      m->w.redo_count = loom_tables_redo_layers(&d);
      loom_tables_bind_layers(m->w.redo, &v, &d, (span){-1, loom_tables_redo_layers(&d)});
    }
    if (st == LOOM_OK && d.E)
      m->w.block.moe.host = loom_xmalloc((size_t)(d.n * (d.k + d.E)) * sizeof(float), "router grads");
    if (st == LOOM_OK) m->tp.staging = m->w.tp_staging;
    if (st == LOOM_OK && d.mtp) { /* the combination's row orders, and host room for the tokens ahead */
      int *orders = loom_xmalloc(4 * (size_t)d.n * sizeof(int), "MTP row orders");
      loom_mtp_orders((int)d.n, orders, orders + 2 * d.n);
      m->ops->mem->from_host(m->ops->mem, m->w.mtp.interleave, orders, 2 * (size_t)d.n * sizeof(int));
      m->ops->mem->from_host(m->ops->mem, m->w.mtp.split, orders + 2 * d.n, 2 * (size_t)d.n * sizeof(int));
      free(orders);
      m->w.mtp_host = loom_xmalloc(2 * (size_t)d.mtp * (size_t)d.N * sizeof(int), "MTP tokens");
    }
    if (st == LOOM_OK) m->w.mtp_w = loom_xcalloc((size_t)d.mtp + 1, sizeof *m->w.mtp_w, "MTP weight views");
    if (st == LOOM_OK && cp > 1) { /* the ring's positions, host memory */
      loom_ring *r = &m->w.block.ring;
      r->group = m->tp.cp_group, r->rows = T, r->all_gather = c->cp_all_gather;
      m->cp_pos = loom_xmalloc(2 * (size_t)T * sizeof *m->cp_pos, "context-parallel positions");
      loom_cp_positions(cp, m->tp.cp_rank, seq, m->cp_pos);
      r->pos = m->cp_pos, r->peer_pos = m->cp_pos + T;
    }
    if (st == LOOM_OK && d.bf16) bind_weights(m);
    if (st == LOOM_OK && d.fp8_elems) fp8_sites_init(m);
  }
  if (st != LOOM_OK) {
    slots_free(m);
    return st;
  }
  m->T = T;
  m->B = B;
  m->a = &m->slots[0];
  m->moe = loom_moe_shape_of(c, (int)d.n, loom_gpt_seq_ranks(c, m->tp.size, m->tp.sequence_parallel));
  m->moe.etp_rank = m->tp.etp_group ? loom_comm_rank(m->tp.etp_group) : 0;
  m->mla = loom_mla_shape_of(c);
  return LOOM_OK;
}

loom_status loom_gpt_set_batch_shape(loom_gpt *m, int T, int B) { return loom_gpt_set_slots(m, T, B, 1); }

loom_status loom_gpt_set_weight_states(loom_gpt *m, int n) {
  LOOM_CHECK(m->nslots > 0 && n >= 0, "weight-grad states come after the slots");
  wstates_free(m);
  const dims d = loom_tables_dims_of(&m->p.cfg, m->T, m->B, m->tp.size, m->tp.sequence_parallel, &m->p.range, loom_tables_recompute_of(m));
  m->wstates = loom_xcalloc((size_t)(n > 0 ? n : 1), sizeof *m->wstates, "weight-grad states");
  m->nwstates = n;
  loom_status st = LOOM_OK;
  for (int i = 0; i < n && st == LOOM_OK; i++) {
    act_list l, l16;
    wgrad_views v;
    loom_tables_list_wstate(&l, &l16, &v, &d);
    st = loom_tables_place(&m->wstates[i].mem, &l, m->ops->mem, LOOM_BUF_WSTATE);
    if (st == LOOM_OK) st = loom_tables_place(&m->wstates[i].mem16, &l16, m->ops->mem, LOOM_BUF_WSTATE_BF16);
    if (st == LOOM_OK && d.L > 0) loom_tables_bind_wstate(&m->wstates[i], &v, &d, &m->w.block);
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
                            .head_dim = loom_gpt_qk_head_dim(c), .v_head_dim = loom_gpt_v_head_dim(c),
                            .softmax_scale = loom_gpt_softmax_scale(c), .mla = loom_gpt_is_mla(c) ? &m->mla : NULL,
                            .head_offset = m->tp.rank * heads,
                            .total_heads = c->heads, .kv_heads = loom_gpt_local_kv_heads(c, m->tp.size),
                            .ffn = (moe ? c->moe.shared_ffn : c->ffn) / m->tp.size, .norm_eps = c->norm_eps,
                            .norm = c->norm, .mlp = c->mlp, .glu = c->glu,
                            .rope = c->position == LOOM_POSITION_ROPE ? c->rope : (loom_rope){0}, .qk_norm = c->qk_norm, .softmax = c->softmax,
                            .window = loom_gpt_layer_window(c, m->p.range.layer_begin + l),
                            .bf16 = c->bf16, .fp8 = fp8_layer(m, l),
                            /* the micro-batch's share of the step's loss: its T rows are 1/cp of its sequence */
                            .moe = moe ? &m->moe : NULL,
                            .moe_loss_weight = dloss * (float)m->T * (float)m->B * (float)loom_gpt_cp(c)};
}

void loom_gpt_mtp_stats_reset(loom_gpt *m) { m->mtp_stats = (loom_gpt_mtp_stats){0}; }

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
                                        .mla = {.down = loom_linear_fp32(v->mla_down_w), .q_up = loom_linear_fp32(v->mla_q_up_w),
                                                .kv_up = loom_linear_fp32(v->mla_kv_up_w)},
                                        .moe = {.router = v->router_w, .router_b = v->router_b,
                                                .expert_bias = expert_bias(m, l), .fc = loom_linear_fp32(v->experts_fc_w),
                                                .proj = loom_linear_fp32(v->experts_proj_w), .fc_b = v->experts_fc_b,
                                                .proj_b = v->experts_proj_b}};
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
  loom_fp8_site *f8 = fp8_layer(m, l);
#define BITS(view) ((loom_linear_weight){.bf16 = v->view ? bits + (v->view - scratch) : NULL})
#define FP8(view, k) ((loom_linear_weight){.bf16 = BITS(view).bf16, .fp8 = f8 ? &f8[k] : NULL})
  return (loom_block_compute_weights){.v = v, .c_attn = FP8(c_attn_w, LOOM_FP8_QKV), .attn_proj = FP8(attn_proj_w, LOOM_FP8_ATTN_PROJ),
                                      .c_fc = FP8(c_fc_w, LOOM_FP8_FC), .mlp_proj = FP8(mlp_proj_w, LOOM_FP8_MLP_PROJ),
                                      .mla = {.down = FP8(mla_down_w, LOOM_FP8_MLA_DOWN), .q_up = FP8(mla_q_up_w, LOOM_FP8_MLA_Q_UP),
                                              .kv_up = FP8(mla_kv_up_w, LOOM_FP8_MLA_KV_UP)},
                                      .moe = {.router = v->router_w, .router_b = v->router_b, .expert_bias = expert_bias(m, l),
                                              .fc = FP8(experts_fc_w, LOOM_FP8_EXPERTS_FC),
                                              .proj = FP8(experts_proj_w, LOOM_FP8_EXPERTS_PROJ),
                                              .fc_b = v->experts_fc_b, .proj_b = v->experts_proj_b}};
#undef FP8
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

/* The MTP depths this stage predicts (the last stage's), and the depth whose block local layer l is (-1: none). */
static int mtp_depths(const loom_gpt *m) { return m->p.range.last ? m->p.cfg.mtp_layers : 0; }
static int mtp_depth_of(const loom_gpt *m, int l) {
  const int g = m->p.range.layer_begin + l;
  return loom_gpt_layer_is_mtp(&m->p.cfg, g) ? g - m->p.cfg.layers : -1;
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
    a.qk_raw = s->blocks[k].qk_raw, a.qk_rstd = s->blocks[k].qk_rstd;
    a.mla = s->blocks[k].mla;
    a.moe = s->blocks[k].moe;
    const loom_block_packed *p = &s->packed[k]; /* the linears' inputs: read and written in place */
    a.ln_1_bits = p->ln_1, a.atty_bits = p->atty, a.ln_2_bits = p->ln_2, a.fc_gelu_bits = p->fc_gelu;
  }
  return a;
}

/* Elements of each of local layer l's big activations in this model's slots. */
static void layer_counts(const loom_gpt *m, int l, int64_t c[BIG]) {
  const dims d = loom_tables_dims_of(&m->p.cfg, m->T, m->B, m->tp.size, m->tp.sequence_parallel, &m->p.range, loom_tables_recompute_of(m));
  loom_tables_big_counts(&d, loom_gpt_layer_is_moe(&m->p.cfg, m->p.range.layer_begin + l), c);
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
    float *wide = *loom_tables_act_field(a, i);
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
  const int k = mtp_depth_of(m, l);
  if (k >= 0) return s->mtp_x + (size_t)k * local_rows(m) * m->p.cfg.hidden; /* the depth's combination */
  if (l == 0) return s->x0;
  const int R = m->recompute_layers, G = m->recompute_group;
  const size_t nh = (size_t)local_rows(m) * m->p.cfg.hidden;
  if (l < R && !group_start(m, l)) return m->w.redo[(l - 1) % G].out; /* within a group: the previous layer's output */
  if (l < R) return s->inputs + (size_t)(l / G) * nh;
  if (l == R) return s->inputs + (size_t)loom_tables_recompute_groups(R, G) * nh;
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

/* ---- the heads: the main one (head 0) and each MTP depth's (head k + 1 after depth k's block) ---- */

/* Head j's part of the slot's head tables, its targets and its final norm's weights and grads. */
typedef struct {
  float *mean, *rstd, *ln_f, *logits, *losses, *lse, *picked;
  uint16_t *bits;
  const int *targets;
  const float *norm_w, *norm_b;
  float *dnorm_w, *dnorm_b;
} head_view;

static head_view head_at(const loom_gpt *m, const loom_gpt_slot *s, const loom_gpt_weights *w, int j) {
  const size_t N = (size_t)m->T * m->B, n = (size_t)local_rows(m), h = (size_t)m->p.cfg.hidden, V = vocab_range(m).rows;
  const loom_mtp_weights *mw = j ? &w->mtp[j - 1] : NULL, *mg = j ? &m->p.g.mtp[j - 1] : NULL;
  return (head_view){.mean = s->ln_f_mean + j * n, .rstd = s->ln_f_rstd + j * n, .ln_f = s->ln_f ? s->ln_f + j * N * h : NULL,
                     .bits = s->ln_f_bits ? s->ln_f_bits + j * N * h : NULL, .logits = s->logits + j * N * V,
                     .losses = s->losses + j * N, .lse = s->lse + j * N, .picked = s->picked + j * N,
                     .targets = j ? s->mtp_targets + (j - 1) * N : s->targets, .norm_w = j ? mw->norm_w : w->ln_f_w,
                     .norm_b = j ? mw->norm_b : w->ln_f_b, .dnorm_w = j ? mg->norm_w : m->p.g.ln_f_w,
                     .dnorm_b = j ? mg->norm_b : m->p.g.ln_f_b};
}

/* Head j's input: the output of the layer before depth j's block (the stage input where that layer is an earlier
 * stage's), the last head's the stage output. */
static const float *head_x(const loom_gpt *m, int slot, int j) {
  const loom_gpt_slot *s = &m->slots[slot];
  if (j == mtp_depths(m)) return loom_gpt_stage_output(m, slot);
  if (m->p.range.layer_begin > m->p.cfg.layers - 1 + j) return s->x0;
  return s->mtp_y + (size_t)j * local_rows(m) * m->p.cfg.hidden;
}

/* Head j's final norm, then the LM head (wte when tied): a column-parallel
 * linear over this rank's vocab rows, whose logits stay split into the
 * vocab-parallel loss. In bf16 runs the logits stay fp32, as the loss is:
 * the head's GEMM accumulates in fp32 and feeds the loss directly (as PaLM
 * and T5X keep them). Rounding them to bf16 first held the default addition
 * run at 20% exact match where fp32 reaches 100% (docs/training.md). Before
 * an MTP depth, its normed output is the depth's hidden input. */
static float head_forward(loom_gpt *m, loom_gpt_slot *s, int j, const float *x) {
  const loom_gpt_config *c = &m->p.cfg;
  const int N = m->T * m->B, n = local_rows(m), h = c->hidden;
  const loom_vocab_range v = vocab_range(m);
  const loom_gpt_weights w = edge_weights(m, false);
  const head_view hv = head_at(m, s, &w, j);
  float *normed = m->tp.sequence_parallel || c->bf16 ? m->w.block.local : hv.ln_f;
  loom_norm_forward(m->ops, c->norm, c->norm_eps, normed, hv.mean, hv.rstd, x, hv.norm_w, hv.norm_b, n, h);
  loom_column_parallel_forward(&m->tp, m->ops, hv.logits, hv.ln_f, normed, hv.bits, vocab_weight(m, &w, LOOM_ROLE_LM_HEAD),
                               NULL, N, n, h, v.rows);
  if (j < mtp_depths(m)) {
    float *hin = s->mtp_hin + (size_t)j * n * h;
    m->ops->mem->copy(m->ops->mem, hin, normed, (size_t)n * h * sizeof(float));
    to_bf16_values(m, hin, (size_t)n * h);
  }
  return loom_vocab_parallel_cross_entropy(&m->tp, m->ops, hv.losses, hv.lse, hv.picked, m->w.lse_scratch, hv.logits,
                                           hv.targets, v, N);
}

/* Head j's input to its GEMMs: its ln_f, or in bf16 runs its bits. */
static loom_bf16_operand head_input(const head_view *hv) { return loom_bf16_kept(hv->ln_f, hv->bits); }

/* Head j's share of the loss per scored target: the main head's dloss, an MTP depth's its weight of it. */
static float head_dloss(const loom_gpt *m, int j, float dloss) { return j ? dloss * loom_mtp_depth_weight(&m->p.cfg) : dloss; }

/* Head j's backward from its loss: leaves the grad of its input in w.dres,
 * and the grad of the logits in their place for head_weight_grad, or adds
 * the head's weight grad now (weight_grad: one op reads dlogits for both of
 * its GEMMs). dhin (NULL: none) is the grad its normed output gets from the
 * next MTP depth. */
static void head_backward(loom_gpt *m, loom_gpt_slot *s, int j, const float *x, float dloss, bool weight_grad,
                          const float *dhin) {
  const int N = m->T * m->B, n = local_rows(m), h = m->p.cfg.hidden;
  const loom_vocab_range v = vocab_range(m);
  const loom_gpt_weights w = edge_weights(m, false);
  const head_view hv = head_at(m, s, &w, j);
  loom_vocab_parallel_cross_entropy_backward(m->ops, hv.logits, hv.logits, hv.lse, hv.targets, v, head_dloss(m, j, dloss), N);
  to_bf16_values(m, hv.logits, (size_t)N * v.rows);
  float *d_local = m->tp.sequence_parallel ? m->w.block.local : m->w.d_ln_f;
  loom_column_parallel_backward(&m->tp, m->ops, d_local, m->w.d_ln_f, weight_grad ? m->p.g.lm_head : NULL, NULL,
                                hv.logits, NULL, head_input(&hv), vocab_weight(m, &w, LOOM_ROLE_LM_HEAD), N, n, h, v.rows);
  to_bf16_values(m, d_local, (size_t)n * h);
  if (dhin) {
    m->ops->accumulate(m->ops, d_local, dhin, (size_t)n * h);
    to_bf16_values(m, d_local, (size_t)n * h);
  }
  loom_mem_zero(m->ops->mem, m->w.dres, (size_t)n * h);
  loom_norm_backward(m->ops, m->p.cfg.norm, m->w.dres, hv.dnorm_w, hv.dnorm_b, d_local, x, hv.norm_w, hv.mean, hv.rstd, n, h);
  to_bf16_values(m, m->w.dres, (size_t)n * h);
}

/* Every head's weight grad, from its logits' grads. */
static void head_weight_grad(loom_gpt *m, loom_gpt_slot *s) {
  const loom_gpt_weights w = edge_weights(m, false);
  for (int j = 0; j <= mtp_depths(m); j++) {
    const head_view hv = head_at(m, s, &w, j);
    loom_linear_weight_grad(m->ops, m->p.g.lm_head, loom_bf16_values(hv.logits), head_input(&hv), m->T * m->B,
                            m->p.cfg.hidden, vocab_range(m).rows, m->p.cfg.bf16, NULL);
  }
}

/* ---- multi-token prediction's combination ---- */

static loom_mtp_acts mtp_acts(const loom_gpt *m, const loom_gpt_slot *s, int k) {
  const size_t n = (size_t)local_rows(m), nh = n * m->p.cfg.hidden;
  return (loom_mtp_acts){.emb = s->mtp_emb + k * nh, .hin = s->mtp_hin + k * nh, .stats = s->mtp_stats + k * 4 * n,
                         .cat = s->mtp_cat + k * 2 * nh, .x = s->mtp_x + k * nh};
}

static loom_mtp_shape mtp_shape(const loom_gpt *m) {
  const loom_gpt_config *c = &m->p.cfg;
  return (loom_mtp_shape){.norm = c->norm, .eps = c->norm_eps, .n = local_rows(m), .h = c->hidden, .bf16 = c->bf16};
}

/* Depth k's weights as it computes with them: its norms' from w (edge_weights'), eh_proj's fp32 weight or the bf16
 * copy's bits. */
static loom_mtp_compute_weights mtp_weights(const loom_gpt *m, const loom_gpt_weights *w, int k) {
  loom_mtp_compute_weights out = {.v = &w->mtp[k], .eh_proj = loom_linear_fp32(m->p.w.mtp[k].eh_proj_w)};
  if (!m->p.cfg.bf16) return out;
  const loom_buffer *c = &m->p.compute;
  for (int i = 0, seen = 0; i < c->count; i++)
    if (m->p.meta[i].role == LOOM_ROLE_MTP_EH_PROJ_W && seen++ == k) out.eh_proj = (loom_linear_weight){.bf16 = c->views[i].data};
  return out;
}

/* The tokens ahead and their targets of every depth into the slot (host
 * copies left in w.mtp_host), and this forward's main scored targets counted. */
static void mtp_prepare(loom_gpt *m, loom_gpt_slot *s, const loom_gpt_batch *batch) {
  const int D = mtp_depths(m), N = m->T * m->B;
  int *tokens = m->w.mtp_host, *targets = tokens + (size_t)D * N;
  if (batch->mtp_tokens) {
    memcpy(tokens, batch->mtp_tokens, (size_t)D * N * sizeof(int));
    memcpy(targets, batch->mtp_targets, (size_t)D * N * sizeof(int));
  } else {
    LOOM_CHECK(loom_tp_cp(&m->tp) == 1 && batch->tokens, "under context parallelism the caller shifts the tokens ahead");
    for (int k = 0; k < D; k++) loom_mtp_shift(batch->tokens, batch->targets, m->T, m->B, k, tokens + (size_t)k * N, targets + (size_t)k * N);
  }
  m->ops->mem->from_host(m->ops->mem, s->mtp_tokens, tokens, (size_t)D * N * sizeof(int));
  m->ops->mem->from_host(m->ops->mem, s->mtp_targets, targets, (size_t)D * N * sizeof(int));
  for (int i = 0; i < N; i++) m->mtp_stats.scored += batch->targets[i] >= 0;
}

/* Depth k's scored targets (host: w.mtp_host, as the last mtp_prepare left them). */
static int64_t mtp_scored(const loom_gpt *m, int k) {
  const int N = m->T * m->B;
  const int *targets = m->w.mtp_host + ((size_t)mtp_depths(m) + k) * N;
  int64_t n = 0;
  for (int i = 0; i < N; i++) n += targets[i] >= 0;
  return n;
}

/* Depth k's embedding dropout: the embedding's site, keyed by the depth's block. */
static loom_dropout mtp_dropout(const loom_gpt *m, const loom_gpt_batch *batch, int k) {
  const loom_block_dropout d = block_dropout(m, batch, m->p.cfg.layers + k);
  return loom_dropout_for(&d, LOOM_SITE_EMBED, m->T, &m->tp);
}

/* Depth k's block input from the embedding of its tokens ahead and its hidden input (head k's normed output). */
static void mtp_forward(loom_gpt *m, loom_gpt_slot *s, const loom_gpt_batch *batch, int k) {
  const int T = m->T, B = m->B, h = m->p.cfg.hidden, local_T = loom_tp_local_rows(&m->tp, T);
  const size_t nh = (size_t)local_rows(m) * h, N = (size_t)T * B;
  loom_mtp_acts a = mtp_acts(m, s, k);
  const loom_gpt_weights w = edge_weights(m, false);
  float *full = m->tp.size > 1 ? m->w.embed_full : a.emb;
  loom_vocab_parallel_embedding_forward(&m->tp, m->ops, a.emb, full, s->mtp_tokens + k * N, vocab_weight(m, &w, LOOM_ROLE_WTE),
                                        vocab_range(m), T, B, h);
  to_bf16_values(m, a.emb, nh);
  const loom_dropout drop = mtp_dropout(m, batch, k);
  m->ops->dropout_forward(m->ops, a.emb, local_T, B, h, &drop);
  if (drop.p > 0.0f) to_bf16_values(m, a.emb, nh);
  const loom_mtp_compute_weights cw = mtp_weights(m, &w, k);
  const loom_mtp_shape shape = mtp_shape(m);
  loom_mtp_combine_forward(m->ops, &a, &m->w.mtp, &cw, &shape);
}

/* Its backward from w.dres (the block input's grad): the combination's and the embedding's grads, then head k's
 * backward with the hidden input's grad, which leaves the grad of head k's input in w.dres. */
static void mtp_backward(loom_gpt *m, loom_gpt_slot *s, const loom_gpt_batch *batch, int slot, int k, float dloss,
                         bool split) {
  const int T = m->T, B = m->B, h = m->p.cfg.hidden, local_T = loom_tp_local_rows(&m->tp, T);
  const loom_mtp_acts a = mtp_acts(m, s, k);
  const loom_gpt_weights w = edge_weights(m, false);
  const loom_mtp_compute_weights cw = mtp_weights(m, &w, k);
  const loom_mtp_shape shape = mtp_shape(m);
  loom_mtp_combine_backward(m->ops, &a, &m->w.mtp, &cw, &m->p.g.mtp[k], &shape, m->w.dres, m->w.mtp_dcat, m->w.mtp_demb,
                            m->w.mtp_dhin);
  const loom_dropout drop = mtp_dropout(m, batch, k);
  m->ops->dropout_backward(m->ops, m->w.mtp_demb, local_T, B, h, &drop);
  if (drop.p > 0.0f) to_bf16_values(m, m->w.mtp_demb, (size_t)local_rows(m) * h);
  float *dfull = m->tp.sequence_parallel ? m->w.embed_full : m->w.mtp_demb;
  loom_vocab_parallel_embedding_backward(&m->tp, m->ops, m->p.g.wte, m->w.mtp_demb, dfull, s->mtp_tokens + (size_t)k * T * B,
                                         vocab_range(m), T, B, h);
  head_backward(m, s, k, head_x(m, slot, k), dloss, !split, m->w.mtp_dhin);
}

/* Calls the runtime's hook before or after a layer's (or the edges') part of a pass. */
static void hook(loom_gpt *m, bool backward, int layer, bool before) {
  void (*fn)(void *, loom_gpt *, bool, int) = before ? m->hooks.before : m->hooks.after;
  if (fn) fn(m->hooks.ctx, m, backward, layer);
}

/* Runs head j on its input and counts its loss: returns the main head's, adds an MTP depth's to the statistics. */
static float run_head(loom_gpt *m, loom_gpt_slot *s, int slot, int j) {
  const float loss = head_forward(m, s, j, head_x(m, slot, j));
  if (j) m->mtp_stats.loss_sum += (double)loss * (double)mtp_scored(m, j - 1);
  return j ? 0.0f : loss;
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
  /* Multi-token prediction where there are targets to predict; without (inference), the main head alone. */
  const bool predict = mtp_depths(m) > 0 && batch->targets;
  if (predict) mtp_prepare(m, s, batch);
  hook(m, false, LOOM_GPT_EDGES, true);
  if (m->p.range.first) embed_forward(m, s, batch);
  else if (input != s->x0) mem->copy(mem, s->x0, input, nh * sizeof(float));
  float loss = 0.0f;
  bool headed = false; /* the last head ran (inference: the main head, before the MTP blocks) */
  for (int l = 0; l < L && !headed; l++) {
    const int k = mtp_depth_of(m, l);
    if (k >= 0) { /* before depth k's block: head k, then the block's input */
      loss += run_head(m, s, slot, k);
      headed = !predict;
      if (headed) break;
      mtp_forward(m, s, batch, k);
    }
    const loom_block_shape shape = block_shape(m, l, 0.0f);
    hook(m, false, l, true);
    const loom_block_dropout d = block_dropout(m, batch, m->p.range.layer_begin + l);
    const float *x = layer_input(m, s, l, false);
    const loom_block_compute_weights w = layer_weights(m, l);
    loom_block_acts a = layer_acts(m, s, l);
    loom_block_forward(&a, &m->w.block, x, &w, &shape, &d, &m->tp, m->ops);
    if (shape.moe) moe_count(m, l, a.moe.host);
    hook(m, false, l, false);
    const int next_depth = l + 1 < L ? mtp_depth_of(m, l + 1) : -1;
    if (next_depth >= 0) /* the output is the next head's input, not the next block's */
      mem->copy(mem, s->mtp_y + (size_t)next_depth * nh, a.out, nh * sizeof(float));
    if (!redone(m, l) && !m->p.cfg.bf16) continue;
    /* A recomputed layer keeps only its output, as the next layer's input;
     * bf16 runs keep a layer packed and pass its output on in w.xin. */
    if (!redone(m, l)) pack_layer(m, s, l, &a, true, PACKED_AFTER_LAYER, PACKED_AFTER);
    if (next_depth >= 0) continue;
    if (redone(m, l) && l + 1 < m->recompute_layers && !group_start(m, l + 1)) continue; /* read from the scratch */
    float *next = l + 1 == L ? s->out : redone(m, l) ? (float *)layer_input(m, s, l + 1, false) : m->w.xin;
    mem->copy(mem, next, a.out, nh * sizeof(float));
  }
  if (m->p.range.last && !headed) loss += run_head(m, s, slot, predict ? mtp_depths(m) : 0);
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
  const int j = mtp_depths(m); /* the last head */
  if (m->p.range.last) head_backward(m, s, j, head_x(m, slot, j), dloss, !split, NULL);
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
    if (mtp_depth_of(m, l) >= 0) mtp_backward(m, s, batch, slot, mtp_depth_of(m, l), dloss, false);
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
    if (mtp_depth_of(m, l) >= 0) mtp_backward(m, s, batch, slot, mtp_depth_of(m, l), dloss, true);
    /* The weight half finds no activations in a recompute slot: keep the linears' inputs (bf16 runs: their bits),
     * and a MoE layer's router input, expert rows and activations, with its experts' row counts. */
    if (redone(m, l) && shape.moe) keep_moe_inputs(m, &ws->winputs[l].moe, &p.a.moe);
    for (int k = 0; redone(m, l) && k < WEIGHT_INPUTS; k++) {
      const int i = WEIGHT_INPUT[k];
      if (m->p.cfg.bf16)
        m->ops->mem->copy(m->ops->mem, *loom_tables_act_bits_field(&ws->winputs[l], k), *loom_tables_act_bits_field(&p.a, k),
                          (size_t)c[i] * sizeof(uint16_t));
      else
        m->ops->mem->copy(m->ops->mem, *loom_tables_act_field(&ws->winputs[l], i), *loom_tables_act_field(&p.a, i), (size_t)c[i] * sizeof(float));
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
  if (tp && tp->size > 1 && loom_param_tp_summed(&p->meta[k], tp->sequence_parallel))
    loom_comm_allreduce(tp->group, g, n, LOOM_REDUCE_SUM);
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
