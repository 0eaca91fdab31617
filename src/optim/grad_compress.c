/* PowerSGD and scaled sign over a model chunk's grads (see grad_compress.h). */
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "core/rng.h"
#include "optim/grad_compress.h"

#define POWERSGD_RNG_STREAM 0x505347ULL /* "PSG": Q's first draw, apart from every other keyed stream */

static bool powersgd(const loom_grad_compress *s) { return s->cfg.kind == LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD; }

/* PowerSGD's first Q: uniform in [-1, 1), keyed by the tensor, the same on every replica. */
static void draw_first_q(loom_grad_compress *s, uint64_t seed) {
  for (int c = 0; c < s->count; c++) {
    const size_t n = (size_t)s->cols[c] * (size_t)s->cfg.rank;
    float *host = loom_xmalloc(n * sizeof(float), "PowerSGD's first Q");
    loom_rng_fill_uniform(host, n, seed, POWERSGD_RNG_STREAM + (uint64_t)s->tensor[c], 0);
    for (size_t i = 0; i < n; i++) host[i] = 2.0f * host[i] - 1.0f;
    s->mem->from_host(s->mem, s->b + s->b_at[c], host, n * sizeof(float));
    free(host);
  }
}

loom_status loom_grad_compress_init(loom_grad_compress *s, const loom_compression *cfg, const loom_gpt_params *p,
                                    uint64_t seed, const loom_ops *ops) {
  memset(s, 0, sizeof *s);
  s->cfg = *cfg;
  s->mem = ops->mem;
  const loom_buffer *g = &p->grads;
  const size_t count = (size_t)(g->count > 0 ? g->count : 1);
  s->tensor = loom_xcalloc(count, sizeof *s->tensor, "compressed tensors");
  s->rows = loom_xcalloc(count, sizeof *s->rows, "compressed tensors");
  s->cols = loom_xcalloc(count, sizeof *s->cols, "compressed tensors");
  s->error_at = loom_xcalloc(count, sizeof *s->error_at, "compressed tensors");
  s->a_at = loom_xcalloc(count, sizeof *s->a_at, "compressed tensors");
  s->b_at = loom_xcalloc(count, sizeof *s->b_at, "compressed tensors");
  for (int k = 0; k < g->count; k++) {
    s->sent_words += loom_compression_sent_words(cfg, &g->views[k]);
    s->whole_words += (int64_t)loom_tensor_numel(&g->views[k]);
    int n, m;
    if (!loom_compression_compresses(cfg, &g->views[k], &n, &m)) continue;
    const int c = s->count++;
    s->tensor[c] = k, s->rows[c] = n, s->cols[c] = m;
    s->error_at[c] = s->error_floats, s->a_at[c] = s->a_words, s->b_at[c] = s->b_words;
    s->error_floats += (size_t)n * (size_t)m;
    if (powersgd(s)) {
      s->a_words += (size_t)n * (size_t)cfg->rank;
      s->b_words += (size_t)m * (size_t)cfg->rank;
    } else {
      s->a_words += loom_sign_message_words((size_t)n * (size_t)m);
    }
  }
  if (!powersgd(s)) s->b_words = (size_t)cfg->dp * s->a_words; /* every replica's messages, in rank order */
  s->error = s->mem->zalloc(s->mem, (s->error_floats ? s->error_floats : 1) * sizeof(float));
  s->a = s->mem->zalloc(s->mem, (s->a_words ? s->a_words : 1) * sizeof(float));
  s->b = s->mem->zalloc(s->mem, (s->b_words ? s->b_words : 1) * sizeof(float));
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
  free(s->tensor);
  free(s->rows);
  free(s->cols);
  free(s->error_at);
  free(s->a_at);
  free(s->b_at);
  memset(s, 0, sizeof *s);
}

/* All-reduces the grads that cross whole, each run of neighbouring ones in one call. */
static void sum_whole(const loom_grad_compress *s, loom_gpt_params *p, loom_comm *dp) {
  const loom_buffer *g = &p->grads;
  int next = 0; /* the next compressed tensor, in order */
  for (int k = 0; k < g->count;) {
    if (next < s->count && s->tensor[next] == k) {
      next++, k++;
      continue;
    }
    const int first = k;
    while (k < g->count && !(next < s->count && s->tensor[next] == k)) k++;
    const size_t lo = loom_buffer_offset(g, first), hi = loom_buffer_offset(g, k - 1) + loom_tensor_numel(&g->views[k - 1]);
    loom_comm_allreduce(dp, (float *)g->base + lo, hi - lo, LOOM_REDUCE_SUM);
  }
}

static float *grad_of(const loom_grad_compress *s, loom_gpt_params *p, int c) { return p->grads.views[s->tensor[c]].data; }
static size_t numel_of(const loom_grad_compress *s, int c) { return (size_t)s->rows[c] * (size_t)s->cols[c]; }

static void reduce_powersgd(loom_grad_compress *s, loom_gpt_params *p, loom_comm *dp, const loom_ops *ops) {
  const int r = s->cfg.rank;
  const float share = 1.0f / (float)loom_comm_size(dp);
  float *P = s->a, *Q = s->b;
  for (int c = 0; c < s->count; c++) /* P = A Q */
    ops->gemm(ops, false, false, s->rows[c], r, s->cols[c], 1.0f, grad_of(s, p, c), Q + s->b_at[c], 0.0f, P + s->a_at[c]);
  loom_comm_allreduce(dp, P, s->a_words, LOOM_REDUCE_SUM);
  for (int c = 0; c < s->count; c++) { /* P orthonormal; Q = A^T P */
    ops->orthonormalize(ops, P + s->a_at[c], s->rows[c], r);
    ops->gemm(ops, true, false, s->cols[c], r, s->rows[c], 1.0f, grad_of(s, p, c), P + s->a_at[c], 0.0f, Q + s->b_at[c]);
  }
  loom_comm_allreduce(dp, Q, s->b_words, LOOM_REDUCE_SUM);
  for (int c = 0; c < s->count; c++) { /* E = A - P Q^T / dp; G = P Q^T */
    float *A = grad_of(s, p, c), *E = s->error + s->error_at[c];
    const int n = s->rows[c], m = s->cols[c];
    s->mem->copy(s->mem, E, A, numel_of(s, c) * sizeof(float));
    ops->gemm(ops, false, true, n, m, r, -share, P + s->a_at[c], Q + s->b_at[c], 1.0f, E);
    ops->gemm(ops, false, true, n, m, r, 1.0f, P + s->a_at[c], Q + s->b_at[c], 0.0f, A);
  }
}

static void reduce_sign(loom_grad_compress *s, loom_gpt_params *p, loom_comm *dp, const loom_ops *ops) {
  uint32_t *mine = (uint32_t *)s->a, *all = (uint32_t *)s->b;
  const int size = loom_comm_size(dp);
  for (int c = 0; c < s->count; c++) ops->sign_pack(ops, mine + s->a_at[c], grad_of(s, p, c), numel_of(s, c));
  loom_comm_allgather_typed(dp, mine, all, s->a_words, LOOM_DTYPE_I32);
  for (int c = 0; c < s->count; c++) { /* E = A - own message (its share of the sum); G = every message, in rank order */
    float *A = grad_of(s, p, c), *E = s->error + s->error_at[c];
    const size_t n = numel_of(s, c);
    s->mem->copy(s->mem, E, A, n * sizeof(float));
    ops->sign_unpack_add(ops, E, mine + s->a_at[c], n, -1.0f);
    loom_mem_zero(s->mem, A, n);
    for (int r = 0; r < size; r++) ops->sign_unpack_add(ops, A, all + (size_t)r * s->a_words + s->a_at[c], n, 1.0f);
  }
}

void loom_grad_compress_reduce(loom_grad_compress *s, loom_gpt_params *p, loom_comm *dp, const loom_ops *ops) {
  for (int c = 0; c < s->count; c++) /* A = G + E */
    ops->accumulate(ops, grad_of(s, p, c), s->error + s->error_at[c], numel_of(s, c));
  if (s->count && powersgd(s)) reduce_powersgd(s, p, dp, ops);
  else if (s->count) reduce_sign(s, p, dp, ops);
  sum_whole(s, p, dp);
}
