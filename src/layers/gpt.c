/* GPT forward and backward, whole or one pipeline stage, over the blocks;
 * activation slots and shared scratch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "layers/gpt.h"
#include "tensor_parallel/linear.h"
#include "tensor_parallel/mappings.h"
#include "tensor_parallel/vocab_parallel.h"

loom_status loom_gpt_init_stage(loom_gpt *m, const loom_gpt_config *cfg, const loom_ops *ops, uint64_t seed,
                                const loom_tp *tp, const loom_stage_range *range, bool recompute) {
  memset(m, 0, sizeof *m);
  m->ops = ops;
  m->seed = seed;
  m->recompute = recompute;
  m->tp = tp ? *tp : (loom_tp){.group = NULL, .rank = 0, .size = 1, .sequence_parallel = false};
  const loom_gpt_config c = m->tp.size > 1 ? loom_gpt_config_for_tp(cfg, m->tp.size) : *cfg;
  loom_status st = loom_gpt_params_init(&m->p, &c, m->tp.rank, m->tp.size, range, ops->mem);
  if (st != LOOM_OK) return st;
  loom_gpt_params_randomize(&m->p, seed);
  return LOOM_OK;
}

loom_status loom_gpt_init(loom_gpt *m, const loom_gpt_config *cfg, const loom_ops *ops, uint64_t seed,
                          const loom_tp *tp) {
  return loom_gpt_init_stage(m, cfg, ops, seed, tp, NULL, false);
}

static void slots_free(loom_gpt *m) {
  for (int i = 0; i < m->nslots; i++) {
    loom_buffer_free(&m->slots[i].mem);
    free(m->slots[i].blocks);
    if (m->slots[i].tokens) m->ops->mem->release(m->slots[i].tokens);
    if (m->slots[i].targets) m->ops->mem->release(m->slots[i].targets);
    if (m->slots[i].pred) m->ops->mem->release(m->slots[i].pred);
  }
  free(m->slots);
  loom_buffer_free(&m->w.mem);
  m->slots = m->a = NULL;
  m->nslots = m->T = m->B = 0;
  memset(&m->w, 0, sizeof m->w);
}

void loom_gpt_free(loom_gpt *m) {
  slots_free(m);
  loom_gpt_params_free(&m->p);
}

/* Builder for activation tables: specs are appended, then pointers bound. */
typedef struct {
  loom_tensor specs[48];
  float **slots[48];
  int count;
} act_list;

static void want(act_list *l, float **slot, const char *name, int64_t numel) {
  LOOM_CHECK(l->count < 48, "too many activation views");
  l->specs[l->count] = loom_tensor_spec(name, LOOM_DTYPE_F32, 1, &numel);
  l->slots[l->count++] = slot;
}

/* Shapes every table below is cut from. */
typedef struct {
  int64_t N, n, h, f, w, att, V;
  int L;
  bool first, last, recompute;
} dims;

static dims dims_of(const loom_gpt_config *c, int T, int B, int tp, bool sp, const loom_stage_range *r, bool recompute) {
  const int64_t N = (int64_t)T * B;
  return (dims){.N = N, .n = sp ? N / tp : N, .h = c->hidden, .f = c->ffn / tp, .w = c->hidden / tp,
                .att = (int64_t)B * (c->heads / tp) * T * T, .V = c->padded_vocab / tp,
                .L = r->layer_end - r->layer_begin, .first = r->first, .last = r->last, .recompute = recompute};
}

/* Per-layer activation kinds: one view each, [L * per-layer size]. */
typedef struct {
  float *ln1m, *ln1r, *ln1, *qkv, *att, *atty, *resa, *ln2m, *ln2r, *ln2, *fc, *fcg, *out;
} layer_views;

static void want_layers(act_list *l, layer_views *v, const dims *d, int L) {
  want(l, &v->ln1m, "ln_1_mean", L * d->n);
  want(l, &v->ln1r, "ln_1_rstd", L * d->n);
  want(l, &v->ln1, "ln_1", L * d->N * d->h);
  want(l, &v->qkv, "qkv", L * d->N * 3 * d->w);
  want(l, &v->att, "att", L * d->att);
  want(l, &v->atty, "atty", L * d->N * d->w);
  want(l, &v->resa, "res_attn", L * d->n * d->h);
  want(l, &v->ln2m, "ln_2_mean", L * d->n);
  want(l, &v->ln2r, "ln_2_rstd", L * d->n);
  want(l, &v->ln2, "ln_2", L * d->N * d->h);
  want(l, &v->fc, "fc", L * d->N * d->f);
  want(l, &v->fcg, "fc_gelu", L * d->N * d->f);
  want(l, &v->out, "out", L * d->n * d->h);
}

static void bind_layers(loom_block_acts *b, const layer_views *v, const dims *d, int L) {
  for (int i = 0; i < L; i++) {
    b[i] = (loom_block_acts){
        .ln_1_mean = v->ln1m + i * d->n, .ln_1_rstd = v->ln1r + i * d->n, .ln_1 = v->ln1 + i * d->N * d->h,
        .qkv = v->qkv + i * d->N * 3 * d->w, .att = v->att + i * d->att, .atty = v->atty + i * d->N * d->w,
        .res_attn = v->resa + i * d->n * d->h, .ln_2_mean = v->ln2m + i * d->n, .ln_2_rstd = v->ln2r + i * d->n,
        .ln_2 = v->ln2 + i * d->N * d->h, .fc = v->fc + i * d->N * d->f, .fc_gelu = v->fcg + i * d->N * d->f,
        .out = v->out + i * d->n * d->h};
  }
}

/* What one micro-batch keeps until its backward. */
static void list_slot(act_list *l, loom_gpt_slot *s, layer_views *v, const dims *d) {
  l->count = 0;
  want(l, &s->x0, "x0", d->n * d->h);
  want(l, &s->dx0, "dx0", d->n * d->h);
  if (d->recompute) {
    want(l, &s->inputs, "inputs", d->L * d->n * d->h);
    want(l, &s->out, "out", d->n * d->h);
  } else if (d->L > 0) {
    want_layers(l, v, d, d->L);
  }
  if (d->last) {
    want(l, &s->ln_f_mean, "ln_f_mean", d->n);
    want(l, &s->ln_f_rstd, "ln_f_rstd", d->n);
    want(l, &s->ln_f, "ln_f", d->N * d->h);
    want(l, &s->logits, "logits", d->N * d->V);
    want(l, &s->losses, "losses", d->N);
    want(l, &s->lse, "lse", d->N);
    want(l, &s->picked, "picked", d->N);
  }
}

/* Scratch every slot shares. */
static void list_work(act_list *l, loom_gpt_work *w, layer_views *v, const dims *d) {
  loom_block_scratch *s = &w->block;
  l->count = 0;
  want(l, &s->local, "local", d->n * d->h);
  want(l, &s->local2, "local2", d->n * d->h);
  want(l, &s->full, "full", d->N * d->h);
  want(l, &s->d_ln, "d_ln", d->N * d->h);
  want(l, &s->d_atty, "d_atty", d->N * d->w);
  want(l, &s->d_qkv, "d_qkv", d->N * 3 * d->w);
  want(l, &s->d_att, "d_att", d->att);
  want(l, &s->d_fc, "d_fc", d->N * d->f);
  want(l, &s->d_fc2, "d_fc2", d->N * d->f);
  want(l, &w->embed_full, "embed_full", d->N * d->h);
  want(l, &w->dres, "dres", d->n * d->h);
  want(l, &w->d_ln_f, "d_ln_f", d->N * d->h);
  want(l, &w->lse_scratch, "lse_scratch", d->N);
  if (d->recompute) want_layers(l, v, d, 1);
}

static size_t list_bytes(const act_list *l) {
  size_t bytes = 0;
  for (int i = 0; i < l->count; i++) bytes += loom_tensor_bytes(&l->specs[i]);
  return bytes;
}

size_t loom_gpt_activation_bytes(const loom_gpt_config *cfg, int T, int B, int tp, bool sequence_parallel,
                                 const loom_stage_range *range, bool recompute, int slots) {
  const loom_gpt_config c = tp > 1 ? loom_gpt_config_for_tp(cfg, tp) : *cfg;
  const loom_stage_range r = range ? *range : loom_stage_whole(cfg);
  const dims d = dims_of(&c, T, B, tp, sequence_parallel && tp > 1, &r, recompute);
  act_list l;
  loom_gpt_slot s;
  loom_gpt_work w;
  layer_views v;
  list_slot(&l, &s, &v, &d);
  const size_t slot_bytes = list_bytes(&l);
  list_work(&l, &w, &v, &d);
  return slot_bytes * (size_t)slots + list_bytes(&l);
}

/* Allocates a table and points its slots at the views. */
static loom_status place(loom_buffer *mem, act_list *l, const loom_allocator *backend) {
  loom_status st = loom_buffer_init(mem, l->specs, l->count, backend);
  if (st != LOOM_OK) return st;
  for (int i = 0; i < l->count; i++) *l->slots[i] = mem->views[i].data;
  return LOOM_OK;
}

loom_status loom_gpt_set_slots(loom_gpt *m, int T, int B, int slots) {
  const loom_gpt_config *c = &m->p.cfg;
  LOOM_CHECK(T >= 1 && T <= c->seq && B >= 1 && slots >= 1, "micro-batch shape out of range");
  LOOM_CHECK(!m->tp.sequence_parallel || T % m->tp.size == 0, "sequence parallelism needs T divisible by tp");
  if (m->T == T && m->B == B && m->nslots == slots) return LOOM_OK;
  slots_free(m);
  const dims d = dims_of(c, T, B, m->tp.size, m->tp.sequence_parallel, &m->p.range, m->recompute);
  act_list l;
  layer_views v;
  m->slots = loom_xcalloc((size_t)slots, sizeof *m->slots, "activation slots");
  m->nslots = slots;
  loom_status st = LOOM_OK;
  for (int i = 0; i < slots && st == LOOM_OK; i++) {
    loom_gpt_slot *s = &m->slots[i];
    s->tokens = m->ops->mem->zalloc((size_t)d.N * sizeof(int));
    s->targets = m->ops->mem->zalloc((size_t)d.N * sizeof(int));
    s->pred = m->ops->mem->zalloc((size_t)d.N * sizeof(int));
    LOOM_CHECK(s->tokens && s->targets && s->pred, "out of memory for a micro-batch's tokens");
    list_slot(&l, s, &v, &d);
    st = place(&s->mem, &l, m->ops->mem);
    if (st == LOOM_OK && !m->recompute && d.L > 0) {
      s->blocks = loom_xcalloc((size_t)d.L, sizeof *s->blocks, "block activations");
      bind_layers(s->blocks, &v, &d, d.L);
    }
  }
  if (st == LOOM_OK) {
    list_work(&l, &m->w, &v, &d);
    st = place(&m->w.mem, &l, m->ops->mem);
    if (st == LOOM_OK && m->recompute) bind_layers(&m->w.redo, &v, &d, 1);
  }
  if (st != LOOM_OK) {
    slots_free(m);
    return st;
  }
  m->T = T;
  m->B = B;
  m->a = &m->slots[0];
  return LOOM_OK;
}

loom_status loom_gpt_set_batch_shape(loom_gpt *m, int T, int B) { return loom_gpt_set_slots(m, T, B, 1); }

static loom_block_shape block_shape(const loom_gpt *m) {
  const loom_gpt_config *c = &m->p.cfg;
  const int heads = c->heads / m->tp.size;
  return (loom_block_shape){.T = m->T, .B = m->B, .hidden = c->hidden, .heads = heads,
                            .head_dim = c->hidden / c->heads, .head_offset = m->tp.rank * heads,
                            .total_heads = c->heads, .ffn = c->ffn / m->tp.size, .norm_eps = c->norm_eps};
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

/* Layer l's input in a slot: the stage input for layer 0, else the previous
 * layer's output (or its saved copy under recompute). */
static float *layer_input(const loom_gpt *m, const loom_gpt_slot *s, int l) {
  if (l == 0) return s->x0;
  return m->recompute ? s->inputs + (size_t)l * local_rows(m) * m->p.cfg.hidden : s->blocks[l - 1].out;
}

const float *loom_gpt_stage_output(const loom_gpt *m, int slot) {
  const loom_gpt_slot *s = &m->slots[slot];
  if (m->p.layers == 0) return s->x0;
  return m->recompute ? s->out : s->blocks[m->p.layers - 1].out;
}

/* Vocab-parallel embedding onto this rank's rows, plus positions and dropout. */
static void embed_forward(loom_gpt *m, loom_gpt_slot *s, const loom_gpt_batch *batch) {
  const int T = m->T, B = m->B, h = m->p.cfg.hidden, local_T = loom_tp_local_rows(&m->tp, T);
  float *full = m->tp.size > 1 ? m->w.embed_full : s->x0;
  loom_vocab_parallel_embedding_forward(&m->tp, m->ops, s->x0, full, s->tokens, m->p.w.wte, vocab_range(m), T, B, h);
  const int pos_offset = local_T == T ? 0 : m->tp.rank * local_T;
  m->ops->position_forward(s->x0, m->p.w.wpe, local_T, B, h, pos_offset);
  const loom_block_dropout d0 = block_dropout(m, batch, -1);
  const loom_dropout d_embed = loom_dropout_for(&d0, LOOM_SITE_EMBED, T, &m->tp);
  m->ops->dropout_forward(s->x0, local_T, B, h, &d_embed);
}

static void embed_backward(loom_gpt *m, loom_gpt_slot *s, const loom_gpt_batch *batch) {
  const int T = m->T, B = m->B, h = m->p.cfg.hidden, local_T = loom_tp_local_rows(&m->tp, T);
  float *dres = m->w.dres;
  const loom_block_dropout d0 = block_dropout(m, batch, -1);
  const loom_dropout d_embed = loom_dropout_for(&d0, LOOM_SITE_EMBED, T, &m->tp);
  m->ops->dropout_backward(dres, local_T, B, h, &d_embed);
  const int pos_offset = local_T == T ? 0 : m->tp.rank * local_T;
  m->ops->position_backward(m->p.g.wpe, dres, local_T, B, h, pos_offset);
  float *dfull = m->tp.sequence_parallel ? m->w.embed_full : dres;
  loom_vocab_parallel_embedding_backward(&m->tp, m->ops, m->p.g.wte, dres, dfull, s->tokens, vocab_range(m), T, B, h);
}

/* Final norm, then the tied LM head: a column-parallel linear over this
 * rank's vocab rows, whose logits stay split into the vocab-parallel loss. */
static float head_forward(loom_gpt *m, loom_gpt_slot *s, const float *x) {
  const loom_gpt_config *c = &m->p.cfg;
  const int N = m->T * m->B, n = local_rows(m), h = c->hidden;
  const loom_vocab_range v = vocab_range(m);
  float *normed = m->tp.sequence_parallel ? m->w.block.local : s->ln_f;
  m->ops->layernorm_forward(normed, s->ln_f_mean, s->ln_f_rstd, x, m->p.w.ln_f_w, m->p.w.ln_f_b, n, h, c->norm_eps);
  loom_column_parallel_forward(&m->tp, m->ops, s->logits, s->ln_f, normed, m->p.w.wte, NULL, N, n, h, v.rows);
  return loom_vocab_parallel_cross_entropy(&m->tp, m->ops, s->losses, s->lse, s->picked, m->w.lse_scratch, s->logits,
                                           s->targets, v, N);
}

/* Starts backward from the loss: leaves the grad of the head's input in w.dres. */
static void head_backward(loom_gpt *m, loom_gpt_slot *s, const float *x, float dloss) {
  const int N = m->T * m->B, n = local_rows(m), h = m->p.cfg.hidden;
  const loom_vocab_range v = vocab_range(m);
  loom_vocab_parallel_cross_entropy_backward(m->ops, s->logits, s->logits, s->lse, s->targets, v, dloss, N);
  float *d_local = m->tp.sequence_parallel ? m->w.block.local : m->w.d_ln_f;
  loom_column_parallel_backward(&m->tp, m->ops, d_local, m->w.d_ln_f, m->p.g.wte, NULL, s->logits, s->ln_f, m->p.w.wte,
                                N, n, h, v.rows);
  loom_mem_zero(m->ops->mem, m->w.dres, (size_t)n * h);
  m->ops->layernorm_backward(m->w.dres, m->p.g.ln_f_w, m->p.g.ln_f_b, d_local, x, m->p.w.ln_f_w, s->ln_f_mean,
                             s->ln_f_rstd, n, h);
}

float loom_gpt_stage_forward(loom_gpt *m, int slot, const loom_gpt_batch *batch, const float *input) {
  LOOM_CHECK(slot >= 0 && slot < m->nslots, "slot out of range (set the slots first)");
  loom_gpt_slot *s = &m->slots[slot];
  const int N = m->T * m->B, n = local_rows(m), h = m->p.cfg.hidden, L = m->p.layers;
  const size_t nh = (size_t)n * h;
  const loom_allocator *mem = m->ops->mem;
  if (batch->tokens) mem->from_host(s->tokens, batch->tokens, (size_t)N * sizeof(int));
  else mem->fill32(s->tokens, 0, (size_t)N);
  if (batch->targets) mem->from_host(s->targets, batch->targets, (size_t)N * sizeof(int));
  else mem->fill32(s->targets, (uint32_t)-1, (size_t)N); /* -1: no target */
  if (m->p.range.first) embed_forward(m, s, batch);
  else if (input != s->x0) mem->copy(s->x0, input, nh * sizeof(float));
  const loom_block_shape shape = block_shape(m);
  for (int l = 0; l < L; l++) {
    const loom_block_dropout d = block_dropout(m, batch, m->p.range.layer_begin + l);
    const float *x = layer_input(m, s, l);
    if (!m->recompute) {
      loom_block_forward(&s->blocks[l], &m->w.block, x, &m->p.w.h[l], &shape, &d, &m->tp, m->ops);
      continue;
    }
    /* Recompute keeps only each layer's input: the next input is a copy of this output. */
    loom_block_forward(&m->w.redo, &m->w.block, x, &m->p.w.h[l], &shape, &d, &m->tp, m->ops);
    mem->copy(l + 1 < L ? layer_input(m, s, l + 1) : s->out, m->w.redo.out, nh * sizeof(float));
  }
  return m->p.range.last ? head_forward(m, s, loom_gpt_stage_output(m, slot)) : 0.0f;
}

void loom_gpt_stage_backward(loom_gpt *m, int slot, const loom_gpt_batch *batch, const float *dout, float dloss) {
  loom_gpt_slot *s = &m->slots[slot];
  const int n = local_rows(m), h = m->p.cfg.hidden, L = m->p.layers;
  const size_t nh = (size_t)n * h;
  if (m->p.range.last) head_backward(m, s, loom_gpt_stage_output(m, slot), dloss);
  else m->ops->mem->copy(m->w.dres, dout, nh * sizeof(float));
  const loom_block_shape shape = block_shape(m);
  for (int l = L - 1; l >= 0; l--) {
    const loom_block_dropout d = block_dropout(m, batch, m->p.range.layer_begin + l);
    const float *x = layer_input(m, s, l);
    /* Recompute keeps no activations per slot: the same ops and keyed masks redo them bit for bit. */
    if (m->recompute) loom_block_forward(&m->w.redo, &m->w.block, x, &m->p.w.h[l], &shape, &d, &m->tp, m->ops);
    const loom_block_acts *acts = m->recompute ? &m->w.redo : &s->blocks[l];
    loom_block_backward(m->w.dres, &m->p.g.h[l], &m->w.block, acts, x, &m->p.w.h[l], &shape, &d, &m->tp, m->ops);
    if (m->layer_done) m->layer_done(m->layer_done_ctx, m, l);
  }
  if (m->p.range.first) embed_backward(m, s, batch);
  else m->ops->mem->copy(s->dx0, m->w.dres, nh * sizeof(float));
}

float loom_gpt_forward(loom_gpt *m, const loom_gpt_batch *batch) {
  LOOM_CHECK(m->p.range.first && m->p.range.last, "loom_gpt_forward runs the whole model; stages use stage_forward");
  return loom_gpt_stage_forward(m, 0, batch, NULL);
}

void loom_gpt_backward(loom_gpt *m, const loom_gpt_batch *batch, float dloss) {
  loom_gpt_stage_backward(m, 0, batch, NULL, dloss);
}

void loom_gpt_sync_replicated_grads(loom_gpt *m) {
  if (!m->tp.sequence_parallel) return;
  for (int k = 0; k < m->p.grads.count; k++) {
    if (!m->p.meta[k].tp_replicated) continue;
    loom_comm_allreduce(m->tp.group, m->p.grads.views[k].data, loom_tensor_numel(&m->p.grads.views[k]),
                        LOOM_REDUCE_SUM);
  }
}

void loom_gpt_zero_grad(loom_gpt *m) {
  loom_mem_zero(m->ops->mem, m->p.grads.base, m->p.grads.numel);
}

void loom_gpt_predict(loom_gpt *m, int *out) {
  loom_gpt_slot *s = m->a;
  const int N = m->T * m->B;
  const loom_vocab_range v = vocab_range(m);
  m->ops->argmax(s->picked, s->pred, s->logits, N, v.valid, v.rows);
  float *val = loom_xmalloc(2 * (size_t)N * sizeof(float), "predictions");
  m->ops->mem->to_host(out, s->pred, (size_t)N * sizeof(int));
  m->ops->mem->to_host(val, s->picked, (size_t)N * sizeof(float));
  for (int i = 0; i < N; i++)
    if (out[i] >= 0) out[i] += v.start;
  loom_tp_combine_argmax(&m->tp, val, out, val + N, N);
  free(val);
}
