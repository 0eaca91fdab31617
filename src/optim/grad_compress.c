/* PowerSGD and scaled sign over a model chunk's grads (see grad_compress.h). */
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "core/rng.h"
#include "layers/run_buffers.h"
#include "optim/grad_compress.h"

#define POWERSGD_RNG_STREAM 0x505347ULL /* "PSG": Q's first draw, apart from every other keyed stream */

static bool powersgd(const loom_grad_compress *s) { return s->cfg.kind == LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD; }

/* PowerSGD's first Q: uniform in [-1, 1), keyed by the tensor, the same on every replica. */
static void draw_first_q(loom_grad_compress *s, uint64_t seed) {
  for (const loom_compressed_grad *t = s->item; t < s->item + s->count; t++) {
    const size_t n = (size_t)t->cols * (size_t)s->cfg.rank;
    float *host = loom_xmalloc(n * sizeof(float), "PowerSGD's first Q");
    loom_rng_fill_uniform(host, n, seed, POWERSGD_RNG_STREAM + (uint64_t)t->tensor, 0);
    for (size_t i = 0; i < n; i++) host[i] = 2.0f * host[i] - 1.0f;
    s->mem->from_host(s->mem, s->b + t->b_at, host, n * sizeof(float));
    free(host);
  }
}

loom_status loom_grad_compress_init(loom_grad_compress *s, const loom_compression *cfg, const loom_gpt_params *p,
                                    uint64_t seed, const loom_ops *ops) {
  memset(s, 0, sizeof *s);
  s->cfg = *cfg;
  s->mem = ops->mem;
  const loom_buffer *g = &p->grads;
  s->item = loom_xcalloc((size_t)(g->count > 0 ? g->count : 1), sizeof *s->item, "compressed tensors");
  for (int k = 0; k < g->count; k++) {
    s->sent_words += loom_compression_sent_words(cfg, &g->views[k]);
    s->whole_words += (int64_t)loom_tensor_numel(&g->views[k]);
    int n, m;
    if (!loom_compression_compresses(cfg, &g->views[k], &n, &m)) continue;
    s->item[s->count++] = (loom_compressed_grad){.tensor = k, .rows = n, .cols = m, .error_at = s->error_floats,
                                                 .a_at = s->a_words, .b_at = s->b_words};
    const loom_compression_state st = loom_compression_state_of(cfg, &g->views[k]); /* the one the memory model counts */
    s->error_floats += (size_t)st.error, s->a_words += (size_t)st.a;
    s->b_words += (size_t)st.b; /* PowerSGD's Q; signs: every replica's messages, in rank order */
  }
  s->error = loom_zalloc(s->mem, (s->error_floats ? s->error_floats : 1) * sizeof(float),
                         loom_run_buffer_name(LOOM_BUF_COMPRESS_ERROR));
  s->a = s->error ? loom_zalloc(s->mem, (s->a_words ? s->a_words : 1) * sizeof(float), loom_run_buffer_name(LOOM_BUF_COMPRESS_A)) : NULL;
  s->b = s->a ? loom_zalloc(s->mem, (s->b_words ? s->b_words : 1) * sizeof(float), loom_run_buffer_name(LOOM_BUF_COMPRESS_B)) : NULL;
  if (!s->error || !s->a || !s->b) {
    loom_grad_compress_free(s);
    return LOOM_ERR_NOMEM;
  }
  if (powersgd(s)) draw_first_q(s, seed);
  return LOOM_OK;
}

void loom_grad_compress_free(loom_grad_compress *s) {
  float *const state[] = {s->error, s->a, s->b};
  for (size_t i = 0; i < sizeof state / sizeof *state; i++)
    if (state[i]) s->mem->release(s->mem, state[i]);
  free(s->item);
  memset(s, 0, sizeof *s);
}

/* All-reduces the grads that cross whole, each run of neighbouring ones in one call. */
static void sum_whole(const loom_grad_compress *s, loom_gpt_params *p, loom_comm *dp) {
  const loom_buffer *g = &p->grads;
  int next = 0; /* the next compressed tensor, in order */
  for (int k = 0; k < g->count;) {
    if (next < s->count && s->item[next].tensor == k) {
      next++, k++;
      continue;
    }
    const int first = k;
    while (k < g->count && !(next < s->count && s->item[next].tensor == k)) k++;
    const size_t lo = loom_buffer_offset(g, first), hi = loom_buffer_offset(g, k - 1) + loom_tensor_numel(&g->views[k - 1]);
    loom_comm_allreduce(dp, (float *)g->base + lo, hi - lo, LOOM_REDUCE_SUM);
  }
}

static float *grad_of(loom_gpt_params *p, const loom_compressed_grad *t) { return p->grads.views[t->tensor].data; }
static size_t numel_of(const loom_compressed_grad *t) { return (size_t)t->rows * (size_t)t->cols; }

static void reduce_powersgd(loom_grad_compress *s, loom_gpt_params *p, loom_comm *dp, const loom_ops *ops) {
  const int r = s->cfg.rank;
  const float share = 1.0f / (float)loom_comm_size(dp);
  float *P = s->a, *Q = s->b;
  for (const loom_compressed_grad *t = s->item; t < s->item + s->count; t++) /* P = A Q */
    ops->gemm(ops, false, false, t->rows, r, t->cols, 1.0f, grad_of(p, t), Q + t->b_at, 0.0f, P + t->a_at);
  loom_comm_allreduce(dp, P, s->a_words, LOOM_REDUCE_SUM);
  for (const loom_compressed_grad *t = s->item; t < s->item + s->count; t++) { /* P orthonormal; Q = A^T P */
    ops->orthonormalize(ops, P + t->a_at, t->rows, r);
    ops->gemm(ops, true, false, t->cols, r, t->rows, 1.0f, grad_of(p, t), P + t->a_at, 0.0f, Q + t->b_at);
  }
  loom_comm_allreduce(dp, Q, s->b_words, LOOM_REDUCE_SUM);
  for (const loom_compressed_grad *t = s->item; t < s->item + s->count; t++) { /* E = A - P Q^T / dp; G = P Q^T */
    float *A = grad_of(p, t), *E = s->error + t->error_at;
    s->mem->copy(s->mem, E, A, numel_of(t) * sizeof(float));
    ops->gemm(ops, false, true, t->rows, t->cols, r, -share, P + t->a_at, Q + t->b_at, 1.0f, E);
    ops->gemm(ops, false, true, t->rows, t->cols, r, 1.0f, P + t->a_at, Q + t->b_at, 0.0f, A);
  }
}

static void reduce_sign(loom_grad_compress *s, loom_gpt_params *p, loom_comm *dp, const loom_ops *ops) {
  uint32_t *mine = (uint32_t *)s->a, *all = (uint32_t *)s->b;
  const int size = loom_comm_size(dp);
  for (const loom_compressed_grad *t = s->item; t < s->item + s->count; t++)
    ops->sign_pack(ops, mine + t->a_at, grad_of(p, t), numel_of(t));
  loom_comm_allgather_typed(dp, mine, all, s->a_words, LOOM_DTYPE_I32);
  /* E = A - own message (its share of the sum); G = every message, in rank order */
  for (const loom_compressed_grad *t = s->item; t < s->item + s->count; t++) {
    float *A = grad_of(p, t), *E = s->error + t->error_at;
    const size_t n = numel_of(t);
    s->mem->copy(s->mem, E, A, n * sizeof(float));
    ops->sign_unpack_add(ops, E, mine + t->a_at, n, -1.0f);
    loom_mem_zero(s->mem, A, n);
    for (int r = 0; r < size; r++) ops->sign_unpack_add(ops, A, all + (size_t)r * s->a_words + t->a_at, n, 1.0f);
  }
}

void loom_grad_compress_reduce(loom_grad_compress *s, loom_gpt_params *p, loom_comm *dp, const loom_ops *ops) {
  for (const loom_compressed_grad *t = s->item; t < s->item + s->count; t++) /* A = G + E */
    ops->accumulate(ops, grad_of(p, t), s->error + t->error_at, numel_of(t));
  if (s->count && powersgd(s)) reduce_powersgd(s, p, dp, ops);
  else if (s->count) reduce_sign(s, p, dp, ops);
  sum_whole(s, p, dp);
}
