/* GPT forward and backward over the blocks, plus the activation buffer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "layers/gpt.h"
#include "tensor_parallel/linear.h"
#include "tensor_parallel/mappings.h"
#include "tensor_parallel/vocab_parallel.h"

loom_status loom_gpt_init(loom_gpt *m, const loom_gpt_config *cfg, const loom_ops *ops, uint64_t seed,
                          const loom_tp *tp) {
  memset(m, 0, sizeof *m);
  m->ops = ops;
  m->seed = seed;
  m->tp = tp ? *tp : (loom_tp){.group = NULL, .rank = 0, .size = 1, .sequence_parallel = false};
  const loom_gpt_config c = m->tp.size > 1 ? loom_gpt_config_for_tp(cfg, m->tp.size) : *cfg;
  loom_status st = loom_gpt_params_init(&m->p, &c, m->tp.rank, m->tp.size);
  if (st != LOOM_OK) return st;
  loom_gpt_params_randomize(&m->p, seed);
  return LOOM_OK;
}

static void acts_free(loom_gpt_acts *a) {
  loom_buffer_free(&a->mem);
  free(a->blocks);
  free(a->tokens);
  free(a->targets);
  memset(a, 0, sizeof *a);
}

void loom_gpt_free(loom_gpt *m) {
  acts_free(&m->a);
  loom_gpt_params_free(&m->p);
}

/* Builder for the activation table: specs are appended, then pointers bound. */
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

/* Per-layer activation kinds: one view each, [L * per-layer size]. */
typedef struct {
  float *ln1, *ln1m, *ln1r, *qkv, *att, *atty, *resa, *ln2, *ln2m, *ln2r, *fc, *fcg, *out;
} layer_views;

/* Lists every activation and scratch view of a (T, B) micro-batch on one
 * rank of a tp-way split; the slots are filled once the buffer exists. */
static void list_activations(act_list *l, loom_gpt_acts *a, layer_views *v, const loom_gpt_config *c, int T, int B,
                             int tp, bool sp) {
  const int64_t N = (int64_t)T * B, n = sp ? N / tp : N, h = c->hidden, L = c->layers;
  const int64_t f = c->ffn / tp, w = h / tp, att = (int64_t)B * (c->heads / tp) * T * T;
  l->count = 0;
  want(l, &a->embed_full, "embed_full", N * h);
  want(l, &a->encoded, "encoded", n * h);
  want(l, &v->ln1, "ln_1", L * N * h);
  want(l, &v->ln1m, "ln_1_mean", L * n);
  want(l, &v->ln1r, "ln_1_rstd", L * n);
  want(l, &v->qkv, "qkv", L * N * 3 * w);
  want(l, &v->att, "att", L * att);
  want(l, &v->atty, "atty", L * N * w);
  want(l, &v->resa, "res_attn", L * n * h);
  want(l, &v->ln2, "ln_2", L * N * h);
  want(l, &v->ln2m, "ln_2_mean", L * n);
  want(l, &v->ln2r, "ln_2_rstd", L * n);
  want(l, &v->fc, "fc", L * N * f);
  want(l, &v->fcg, "fc_gelu", L * N * f);
  want(l, &v->out, "out", L * n * h);
  want(l, &a->ln_f, "ln_f", N * h);
  want(l, &a->ln_f_mean, "ln_f_mean", n);
  want(l, &a->ln_f_rstd, "ln_f_rstd", n);
  want(l, &a->logits, "logits", N * (c->padded_vocab / tp));
  want(l, &a->losses, "losses", N);
  want(l, &a->lse, "lse", N);
  want(l, &a->picked, "picked", N);
  want(l, &a->lse_scratch, "lse_scratch", N);
  want(l, &a->dres, "dres", n * h);
  want(l, &a->d_ln_f, "d_ln_f", N * h);
  loom_block_scratch *s = &a->scratch;
  want(l, &s->local, "local", n * h);
  want(l, &s->local2, "local2", n * h);
  want(l, &s->full, "full", N * h);
  want(l, &s->d_ln, "d_ln", N * h);
  want(l, &s->d_atty, "d_atty", N * w);
  want(l, &s->d_qkv, "d_qkv", N * 3 * w);
  want(l, &s->d_att, "d_att", att);
  want(l, &s->d_fc, "d_fc", N * f);
  want(l, &s->d_fc2, "d_fc2", N * f);
}

size_t loom_gpt_activation_bytes(const loom_gpt_config *cfg, int T, int B, int tp, bool sequence_parallel) {
  act_list l;
  loom_gpt_acts a;
  layer_views v;
  const loom_gpt_config c = tp > 1 ? loom_gpt_config_for_tp(cfg, tp) : *cfg;
  list_activations(&l, &a, &v, &c, T, B, tp, sequence_parallel && tp > 1);
  size_t bytes = 0;
  for (int i = 0; i < l.count; i++) bytes += loom_tensor_bytes(&l.specs[i]);
  return bytes;
}

loom_status loom_gpt_set_batch_shape(loom_gpt *m, int T, int B) {
  const loom_gpt_config *c = &m->p.cfg;
  LOOM_CHECK(T >= 1 && T <= c->seq && B >= 1, "micro-batch shape out of range");
  if (m->a.T == T && m->a.B == B) return LOOM_OK;
  acts_free(&m->a);
  loom_gpt_acts *a = &m->a;
  const int tp = m->tp.size;
  LOOM_CHECK(!m->tp.sequence_parallel || T % tp == 0, "sequence parallelism needs T divisible by tp");
  const int64_t N = (int64_t)T * B, n = (int64_t)loom_tp_local_rows(&m->tp, T) * B, h = c->hidden;
  const int64_t f = c->ffn / tp, w = h / tp, att = (int64_t)B * (c->heads / tp) * T * T;
  const int L = c->layers;
  a->blocks = loom_xcalloc((size_t)L, sizeof *a->blocks, "block activations");
  a->tokens = loom_xcalloc((size_t)N, sizeof(int), "tokens");
  a->targets = loom_xcalloc((size_t)N, sizeof(int), "targets");
  act_list l;
  layer_views v;
  list_activations(&l, a, &v, c, T, B, tp, m->tp.sequence_parallel);
  loom_status st = loom_buffer_init(&a->mem, l.specs, l.count);
  if (st != LOOM_OK) {
    acts_free(a);
    return st;
  }
  for (int i = 0; i < l.count; i++) *l.slots[i] = a->mem.views[i].data;
  for (int i = 0; i < L; i++) {
    loom_block_acts *b = &a->blocks[i];
    b->ln_1 = v.ln1 + i * N * h;
    b->ln_1_mean = v.ln1m + i * n;
    b->ln_1_rstd = v.ln1r + i * n;
    b->qkv = v.qkv + i * N * 3 * w;
    b->att = v.att + i * att;
    b->atty = v.atty + i * N * w;
    b->res_attn = v.resa + i * n * h;
    b->ln_2 = v.ln2 + i * N * h;
    b->ln_2_mean = v.ln2m + i * n;
    b->ln_2_rstd = v.ln2r + i * n;
    b->fc = v.fc + i * N * f;
    b->fc_gelu = v.fcg + i * N * f;
    b->out = v.out + i * n * h;
  }
  a->T = T;
  a->B = B;
  return LOOM_OK;
}

static loom_block_shape block_shape(const loom_gpt *m) {
  const loom_gpt_config *c = &m->p.cfg;
  const int heads = c->heads / m->tp.size;
  return (loom_block_shape){.T = m->a.T, .B = m->a.B, .hidden = c->hidden, .heads = heads,
                            .head_dim = c->hidden / c->heads, .head_offset = m->tp.rank * heads,
                            .total_heads = c->heads, .ffn = c->ffn / m->tp.size, .norm_eps = c->norm_eps};
}

static loom_block_dropout block_dropout(const loom_gpt *m, const loom_gpt_batch *batch, int layer) {
  return (loom_block_dropout){.p = batch->train ? m->p.cfg.dropout : 0.0f, .seed = m->seed,
                              .step = batch->step, .layer = layer,
                              .sample_offset = batch->sample_offset};
}

/* The block input: the embedding for layer 0, else the previous block's output. */
static const float *block_input(const loom_gpt *m, int layer) {
  return layer == 0 ? m->a.encoded : m->a.blocks[layer - 1].out;
}

static loom_vocab_range vocab_range(const loom_gpt *m) {
  return loom_vocab_range_of(&m->tp, m->p.cfg.vocab, m->p.cfg.padded_vocab);
}

/* Vocab-parallel embedding onto this rank's rows, plus positions and dropout. */
static void embed_forward(loom_gpt *m, const loom_gpt_batch *batch) {
  loom_gpt_acts *a = &m->a;
  const int T = a->T, B = a->B, h = m->p.cfg.hidden, local_T = loom_tp_local_rows(&m->tp, T);
  float *full = m->tp.size > 1 ? a->embed_full : a->encoded;
  loom_vocab_parallel_embedding_forward(&m->tp, m->ops, a->encoded, full, a->tokens, m->p.w.wte, vocab_range(m), T, B, h);
  const int pos_offset = local_T == T ? 0 : m->tp.rank * local_T;
  m->ops->position_forward(a->encoded, m->p.w.wpe, local_T, B, h, pos_offset);
  const loom_block_dropout d0 = block_dropout(m, batch, -1);
  const loom_dropout d_embed = loom_dropout_for(&d0, LOOM_SITE_EMBED, T, &m->tp);
  m->ops->dropout_forward(a->encoded, local_T, B, h, &d_embed);
}

static void embed_backward(loom_gpt *m, const loom_gpt_batch *batch) {
  loom_gpt_acts *a = &m->a;
  const int T = a->T, B = a->B, h = m->p.cfg.hidden, local_T = loom_tp_local_rows(&m->tp, T);
  const loom_block_dropout d0 = block_dropout(m, batch, -1);
  const loom_dropout d_embed = loom_dropout_for(&d0, LOOM_SITE_EMBED, T, &m->tp);
  m->ops->dropout_backward(a->dres, local_T, B, h, &d_embed);
  const int pos_offset = local_T == T ? 0 : m->tp.rank * local_T;
  m->ops->position_backward(m->p.g.wpe, a->dres, local_T, B, h, pos_offset);
  float *dfull = m->tp.sequence_parallel ? a->embed_full : a->dres;
  loom_vocab_parallel_embedding_backward(&m->tp, m->ops, m->p.g.wte, a->dres, dfull, a->tokens, vocab_range(m), T, B, h);
}

float loom_gpt_forward(loom_gpt *m, const loom_gpt_batch *batch) {
  const loom_gpt_config *c = &m->p.cfg;
  loom_gpt_acts *a = &m->a;
  const loom_ops *ops = m->ops;
  const int T = a->T, B = a->B, N = T * B, h = c->hidden, n = loom_tp_local_rows(&m->tp, T) * B;
  LOOM_CHECK(T > 0, "call loom_gpt_set_batch_shape before forward");
  memcpy(a->tokens, batch->tokens, (size_t)N * sizeof(int));
  for (int i = 0; i < N; i++) a->targets[i] = batch->targets ? batch->targets[i] : -1;

  embed_forward(m, batch);
  const loom_block_shape shape = block_shape(m);
  for (int l = 0; l < c->layers; l++) {
    const loom_block_dropout d = block_dropout(m, batch, l);
    loom_block_forward(&a->blocks[l], &a->scratch, block_input(m, l), &m->p.w.h[l], &shape, &d, &m->tp, ops);
  }
  /* Final norm, then the tied LM head: a column-parallel linear over this
   * rank's vocab rows, whose logits stay split into the vocab-parallel loss. */
  const loom_vocab_range v = vocab_range(m);
  float *normed = m->tp.sequence_parallel ? a->scratch.local : a->ln_f;
  ops->layernorm_forward(normed, a->ln_f_mean, a->ln_f_rstd, block_input(m, c->layers), m->p.w.ln_f_w,
                         m->p.w.ln_f_b, n, h, c->norm_eps);
  loom_column_parallel_forward(&m->tp, ops, a->logits, a->ln_f, normed, m->p.w.wte, NULL, N, n, h, v.rows);
  return loom_vocab_parallel_cross_entropy(&m->tp, ops, a->losses, a->lse, a->picked, a->lse_scratch, a->logits,
                                           a->targets, v, N);
}

void loom_gpt_backward(loom_gpt *m, const loom_gpt_batch *batch, float dloss) {
  const loom_gpt_config *c = &m->p.cfg;
  loom_gpt_acts *a = &m->a;
  const loom_ops *ops = m->ops;
  const int T = a->T, B = a->B, N = T * B, h = c->hidden, n = loom_tp_local_rows(&m->tp, T) * B;
  const loom_vocab_range v = vocab_range(m);
  loom_vocab_parallel_cross_entropy_backward(ops, a->logits, a->logits, a->lse, a->targets, v, dloss, N);
  float *d_local = m->tp.sequence_parallel ? a->scratch.local : a->d_ln_f;
  loom_column_parallel_backward(&m->tp, ops, d_local, a->d_ln_f, m->p.g.wte, NULL, a->logits, a->ln_f, m->p.w.wte,
                                N, n, h, v.rows);
  memset(a->dres, 0, (size_t)n * h * sizeof(float));
  ops->layernorm_backward(a->dres, m->p.g.ln_f_w, m->p.g.ln_f_b, d_local, block_input(m, c->layers),
                          m->p.w.ln_f_w, a->ln_f_mean, a->ln_f_rstd, n, h);
  const loom_block_shape shape = block_shape(m);
  for (int l = c->layers - 1; l >= 0; l--) {
    const loom_block_dropout d = block_dropout(m, batch, l);
    loom_block_backward(a->dres, &m->p.g.h[l], &a->scratch, &a->blocks[l], block_input(m, l),
                        &m->p.w.h[l], &shape, &d, &m->tp, ops);
  }
  embed_backward(m, batch);
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
  memset(m->p.grads.base, 0, m->p.grads.numel * sizeof(float));
}

void loom_gpt_predict(loom_gpt *m, int *out) {
  loom_gpt_acts *a = &m->a;
  const int N = a->T * a->B;
  const loom_vocab_range v = vocab_range(m);
  m->ops->argmax(a->picked, out, a->logits, N, v.valid, v.rows);
  for (int i = 0; i < N; i++)
    if (out[i] >= 0) out[i] += v.start;
  loom_tp_combine_argmax(&m->tp, a->picked, out, a->lse_scratch, N);
}
