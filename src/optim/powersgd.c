/* PowerSGD over a model chunk's grads (see powersgd.h). */
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "core/rng.h"
#include "optim/powersgd.h"
#include "plan/grad_compression.h"

#define POWERSGD_RNG_STREAM 0x505347ULL /* "PSG": Q's first draw, apart from every other keyed stream */

loom_status loom_powersgd_init(loom_powersgd *s, const loom_gpt_params *p, int rank, uint64_t seed,
                               const loom_ops *ops) {
  memset(s, 0, sizeof *s);
  s->rank = rank;
  s->mem = ops->mem;
  const loom_buffer *g = &p->grads;
  s->tensor = loom_xcalloc((size_t)g->count, sizeof *s->tensor, "PowerSGD tensors");
  s->rows = loom_xcalloc((size_t)g->count, sizeof *s->rows, "PowerSGD tensors");
  s->cols = loom_xcalloc((size_t)g->count, sizeof *s->cols, "PowerSGD tensors");
  s->error_at = loom_xcalloc((size_t)g->count, sizeof *s->error_at, "PowerSGD tensors");
  s->p_at = loom_xcalloc((size_t)g->count, sizeof *s->p_at, "PowerSGD tensors");
  s->q_at = loom_xcalloc((size_t)g->count, sizeof *s->q_at, "PowerSGD tensors");
  for (int k = 0; k < g->count; k++) {
    s->sent_floats += loom_powersgd_sent_floats(&g->views[k], rank);
    s->whole_floats += (int64_t)loom_tensor_numel(&g->views[k]);
    const loom_powersgd_shape sh = loom_powersgd_shape_of(&g->views[k], rank);
    if (!sh.compressed) continue;
    const int c = s->count++;
    s->tensor[c] = k, s->rows[c] = sh.rows, s->cols[c] = sh.cols;
    s->error_at[c] = s->error_floats, s->p_at[c] = s->p_floats, s->q_at[c] = s->q_floats;
    s->error_floats += (size_t)sh.rows * (size_t)sh.cols;
    s->p_floats += (size_t)sh.rows * (size_t)rank;
    s->q_floats += (size_t)sh.cols * (size_t)rank;
  }
  s->error = s->mem->zalloc(s->mem, (s->error_floats ? s->error_floats : 1) * sizeof(float));
  s->p = s->mem->zalloc(s->mem, (s->p_floats ? s->p_floats : 1) * sizeof(float));
  s->q = s->mem->zalloc(s->mem, (s->q_floats ? s->q_floats : 1) * sizeof(float));
  if (!s->error || !s->p || !s->q) {
    loom_powersgd_free(s);
    return LOOM_ERR_NOMEM;
  }
  /* The warm start's first Q: uniform in [-1, 1), keyed by the tensor, the same on every replica. */
  for (int c = 0; c < s->count; c++) {
    const size_t n = (size_t)s->cols[c] * (size_t)rank;
    float *host = loom_xmalloc(n * sizeof(float), "PowerSGD's first Q");
    loom_rng_fill_uniform(host, n, seed, POWERSGD_RNG_STREAM + (uint64_t)s->tensor[c], 0);
    for (size_t i = 0; i < n; i++) host[i] = 2.0f * host[i] - 1.0f;
    s->mem->from_host(s->mem, s->q + s->q_at[c], host, n * sizeof(float));
    free(host);
  }
  return LOOM_OK;
}

void loom_powersgd_free(loom_powersgd *s) {
  float *const state[] = {s->error, s->p, s->q};
  for (size_t i = 0; i < sizeof state / sizeof *state; i++)
    if (state[i]) s->mem->release(s->mem, state[i]);
  free(s->tensor);
  free(s->rows);
  free(s->cols);
  free(s->error_at);
  free(s->p_at);
  free(s->q_at);
  memset(s, 0, sizeof *s);
}

/* All-reduces the grads PowerSGD leaves whole, each run of neighbouring ones in one call. */
static void sum_whole(const loom_powersgd *s, loom_gpt_params *p, loom_comm *dp) {
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

void loom_powersgd_reduce(loom_powersgd *s, loom_gpt_params *p, loom_comm *dp, const loom_ops *ops) {
  const int r = s->rank;
  const float share = 1.0f / (float)loom_comm_size(dp);
  for (int c = 0; c < s->count; c++) { /* A = G + E; P = A Q */
    float *A = p->grads.views[s->tensor[c]].data;
    const int n = s->rows[c], m = s->cols[c];
    ops->accumulate(ops, A, s->error + s->error_at[c], (size_t)n * (size_t)m);
    ops->gemm(ops, false, false, n, r, m, 1.0f, A, s->q + s->q_at[c], 0.0f, s->p + s->p_at[c]);
  }
  if (s->count) loom_comm_allreduce(dp, s->p, s->p_floats, LOOM_REDUCE_SUM);
  for (int c = 0; c < s->count; c++) { /* P orthonormal; Q = A^T P */
    const float *A = p->grads.views[s->tensor[c]].data;
    const int n = s->rows[c], m = s->cols[c];
    ops->orthonormalize(ops, s->p + s->p_at[c], n, r);
    ops->gemm(ops, true, false, m, r, n, 1.0f, A, s->p + s->p_at[c], 0.0f, s->q + s->q_at[c]);
  }
  if (s->count) loom_comm_allreduce(dp, s->q, s->q_floats, LOOM_REDUCE_SUM);
  for (int c = 0; c < s->count; c++) { /* E = A - P Q^T / dp; G = P Q^T */
    float *A = p->grads.views[s->tensor[c]].data, *E = s->error + s->error_at[c];
    const int n = s->rows[c], m = s->cols[c];
    const float *P = s->p + s->p_at[c], *Q = s->q + s->q_at[c];
    s->mem->copy(s->mem, E, A, (size_t)n * (size_t)m * sizeof(float));
    ops->gemm(ops, false, true, n, m, r, -share, P, Q, 1.0f, E);
    ops->gemm(ops, false, true, n, m, r, 1.0f, P, Q, 0.0f, A);
  }
  sum_whole(s, p, dp);
}
