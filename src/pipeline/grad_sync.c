/* Gradient synchronisation of a pipeline's chunks: the tied embedding's
 * sum over its two stages, and the data-parallel sum in buckets started
 * during backward, in fp32 or as bf16, or through compression. */
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "core/timer.h"
#include "pipeline/executor_state.h"
#include "pipeline/grad_sync.h"

/* Chunk c's wte grads: whole, or under ZeRO-2/3 this replica's piece of
 * them (the same elements on both stages: wte is a bucket of its own). */
static float *wte_grads(loom_pipeline *pipe, int c, size_t *n) {
  loom_gpt *m = &pipe->chunks[c];
  if (!pipe->zero) {
    *n = loom_tensor_numel(&m->p.grads.views[0]);
    return m->p.g.wte;
  }
  size_t lo;
  return loom_zero_tensor_grad(pipe->zero[c].z, 0, &lo, n);
}

void loom_grad_sync_tied(loom_pipeline *pipe) {
  const loom_parallel *ps = pipe->ps;
  const int first = loom_pipeline_chunk_holding(pipe, 0), last = loom_pipeline_chunk_holding(pipe, pipe->S - 1);
  size_t n;
  float *mine = wte_grads(pipe, first >= 0 ? first : last, &n);
  if (first >= 0 && last >= 0 && first != last) { /* one rank holds both ends (pp 1 with chunks, or a V) */
    float *other = wte_grads(pipe, last, &n);
    if (n == 0) return;
    pipe->chunks[0].ops->accumulate(pipe->chunks[0].ops, mine, other, n);
    pipe->mem->copy(pipe->mem, other, mine, n * sizeof(float));
    return;
  }
  loom_comm_allreduce(ps->embed_group, mine, n, LOOM_REDUCE_SUM);
}

/* Starts summing chunk c's grads [lo, hi) over the replicas: in place in
 * fp32, or (grad_reduce bf16) as bf16 values in grad16, unpacked by finish_sum. */
static loom_request *start_sum(loom_pipeline *pipe, int c, size_t lo, size_t hi) {
  loom_gpt *m = &pipe->chunks[c];
  float *g = (float *)m->p.grads.base + lo;
  if (!pipe->grad16) return loom_comm_iallreduce(pipe->ps->dp_group, g, hi - lo);
  m->ops->to_bf16(m->ops, pipe->grad16[c] + lo, g, hi - lo);
  return loom_comm_iallreduce_typed(pipe->ps->dp_group, pipe->grad16[c] + lo, hi - lo, LOOM_DTYPE_BF16);
}

static void finish_sum(loom_pipeline *pipe, int c, size_t lo, size_t hi, loom_request *req) {
  loom_comm_wait(pipe->ps->dp_group, req);
  loom_gpt *m = &pipe->chunks[c];
  if (pipe->grad16) m->ops->from_bf16(m->ops, (float *)m->p.grads.base + lo, pipe->grad16[c] + lo, hi - lo);
}

/* The same over `group`, blocking (MPI tunes its blocking all-reduce better). */
static void sum_over(loom_pipeline *pipe, loom_comm *group, int c, size_t lo, size_t hi) {
  if (hi <= lo) return;
  loom_gpt *m = &pipe->chunks[c];
  float *g = (float *)m->p.grads.base + lo;
  if (!pipe->grad16) {
    loom_comm_allreduce(group, g, hi - lo, LOOM_REDUCE_SUM);
    return;
  }
  m->ops->to_bf16(m->ops, pipe->grad16[c] + lo, g, hi - lo);
  loom_comm_allreduce_typed(group, pipe->grad16[c] + lo, hi - lo, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM);
  m->ops->from_bf16(m->ops, g, pipe->grad16[c] + lo, hi - lo);
}

/* Sums chunk c's grads [lo, hi) over the replicas: over dp, and under
 * expert parallelism each run of expert tensors over the ranks holding the
 * same experts (the expert-data-parallel group) instead. */
static void sum_now(loom_pipeline *pipe, int c, size_t lo, size_t hi) {
  if (pipe->ps->ep <= 1) {
    sum_over(pipe, pipe->ps->dp_group, c, lo, hi);
    return;
  }
  const loom_gpt_params *p = &pipe->chunks[c].p;
  for (int k = 0, run = 0; k <= p->grads.count; k++) { /* runs [run, k) of tensors alike */
    if (k < p->grads.count && p->meta[k].expert == p->meta[run].expert) continue;
    const size_t a = loom_buffer_offset(&p->grads, run), b = k < p->grads.count ? loom_buffer_offset(&p->grads, k) : p->grads.numel;
    const size_t from = a > lo ? a : lo, to = b < hi ? b : hi;
    sum_over(pipe, p->meta[run].expert ? pipe->ps->edp_group : pipe->ps->dp_group, c, from, to);
    run = k;
  }
}

void loom_grad_sync_layer_done(loom_pipeline *pipe, loom_gpt *m, int l) {
  size_t lo, hi;
  loom_gpt_block_range(m, l, l + 1, &lo, &hi);
  if (pipe->open_hi == pipe->open_lo) pipe->open_hi = hi;
  pipe->open_lo = lo;
  if ((pipe->open_hi - pipe->open_lo) * sizeof(float) < pipe->bucket_bytes && l > 0) return;
  const int c = (int)(m - pipe->chunks), k = pipe->nbucket++;
  pipe->bucket_at[3 * k] = (size_t)c, pipe->bucket_at[3 * k + 1] = pipe->open_lo, pipe->bucket_at[3 * k + 2] = pipe->open_hi;
  pipe->bucket_req[k] = start_sum(pipe, c, pipe->open_lo, pipe->open_hi);
  pipe->overlapped += pipe->open_hi - pipe->open_lo;
  pipe->open_lo = pipe->open_hi = 0;
}

void loom_pipeline_dp_words(const loom_pipeline *pipe, int64_t *sent, int64_t *whole) {
  *sent = *whole = 0;
  for (int c = 0; pipe->compress && c < pipe->v; c++)
    *sent += pipe->compress[c].sent_words, *whole += pipe->compress[c].whole_words;
}

bool loom_grad_sync_buckets(const loom_pipeline *pipe) {
  /* Under expert parallelism a layer's grads cross two groups: summed at the end. */
  return pipe->bucket_bytes > 0 && !pipe->zero_stage && !pipe->compress && loom_comm_size(pipe->ps->dp_group) > 1 &&
         pipe->ps->ep <= 1;
}

/* Sums grads over the replicas: finishes the buckets started during backward
 * and reduces what they left out (the embedding, positions and final norm).
 * Compression sums them its own way, under ZeRO-1 too; otherwise under
 * ZeRO-1 the optimizer reduce-scatters instead, and ZeRO-2/3 have during
 * backward. Returns the seconds
 * spent waiting for the buckets. */
double loom_grad_sync_dp(loom_pipeline *pipe) {
  if (pipe->compress) { /* the whole chunk at once: its messages cover every grad matrix */
    for (int c = 0; c < pipe->v; c++)
      loom_grad_compress_reduce(&pipe->compress[c], &pipe->chunks[c].p, pipe->ps->dp_group, pipe->chunks[c].ops);
    return 0.0;
  }
  if (pipe->zero_stage) return 0.0; /* ZeRO-1's optimizer reduce-scatters; ZeRO-2/3 did during backward */
  const double t0 = loom_now_s();
  for (int i = 0; i < pipe->nbucket; i++) {
    const size_t *at = &pipe->bucket_at[3 * i];
    finish_sum(pipe, (int)at[0], at[1], at[2], pipe->bucket_req[i]);
  }
  const double waited = loom_now_s() - t0;
  for (int c = 0; c < pipe->v; c++) {
    loom_gpt *m = &pipe->chunks[c];
    size_t lo = 0, hi = 0;
    if (loom_grad_sync_buckets(pipe) && m->p.layers > 0) loom_gpt_block_range(m, 0, m->p.layers, &lo, &hi);
    sum_now(pipe, c, 0, lo);
    sum_now(pipe, c, hi, m->p.grads.numel);
  }
  pipe->nbucket = 0;
  return waited;
}
