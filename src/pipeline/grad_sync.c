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

/* The group a run of grads sums over: dp x cp (the ranks holding the same
 * parameters; dp alone without context parallelism), or for experts under
 * expert parallelism the ranks holding the same experts. */
static loom_comm *group_of(const loom_pipeline *pipe, bool experts) {
  return experts ? pipe->ps->edp_group : pipe->ps->dp_cp_group;
}

/* Starts summing chunk c's grads [lo, hi) over their group: in place in
 * fp32, or (grad_reduce bf16) as bf16 values in grad16, unpacked by finish_sum. */
static loom_request *start_sum(loom_pipeline *pipe, bool experts, int c, size_t lo, size_t hi) {
  loom_gpt *m = &pipe->chunks[c];
  float *g = (float *)m->p.grads.base + lo;
  if (!pipe->grad16) return loom_comm_iallreduce(group_of(pipe, experts), g, hi - lo);
  m->ops->to_bf16(m->ops, pipe->grad16[c] + lo, g, hi - lo);
  return loom_comm_iallreduce_typed(group_of(pipe, experts), pipe->grad16[c] + lo, hi - lo, LOOM_DTYPE_BF16);
}

static void finish_sum(loom_pipeline *pipe, bool experts, int c, size_t lo, size_t hi, loom_request *req) {
  loom_comm_wait(group_of(pipe, experts), req);
  loom_gpt *m = &pipe->chunks[c];
  if (pipe->grad16) m->ops->from_bf16(m->ops, (float *)m->p.grads.base + lo, pipe->grad16[c] + lo, hi - lo);
}

/* The same, blocking (MPI tunes its blocking all-reduce better). */
static void sum_over(loom_pipeline *pipe, bool experts, int c, size_t lo, size_t hi) {
  if (hi <= lo) return;
  loom_gpt *m = &pipe->chunks[c];
  float *g = (float *)m->p.grads.base + lo;
  if (!pipe->grad16) {
    loom_comm_allreduce(group_of(pipe, experts), g, hi - lo, LOOM_REDUCE_SUM);
    return;
  }
  m->ops->to_bf16(m->ops, pipe->grad16[c] + lo, g, hi - lo);
  loom_comm_allreduce_typed(group_of(pipe, experts), pipe->grad16[c] + lo, hi - lo, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM);
  m->ops->from_bf16(m->ops, g, pipe->grad16[c] + lo, hi - lo);
}

/* Calls fn on each run of chunk c's grads [lo, hi) whose tensors sum over
 * one group: the whole range, or under expert parallelism each run of
 * experts' tensors or of others'. */
typedef void (*run_fn)(loom_pipeline *pipe, bool experts, int c, size_t lo, size_t hi);
static void for_runs(loom_pipeline *pipe, int c, size_t lo, size_t hi, run_fn fn) {
  if (pipe->ps->ep <= 1) {
    if (hi > lo) fn(pipe, false, c, lo, hi);
    return;
  }
  const loom_gpt_params *p = &pipe->chunks[c].p;
  for (int k = 0, run = 0; k <= p->grads.count; k++) { /* runs [run, k) of tensors alike */
    if (k < p->grads.count && p->meta[k].expert == p->meta[run].expert) continue;
    const size_t a = loom_buffer_offset(&p->grads, run), b = k < p->grads.count ? loom_buffer_offset(&p->grads, k) : p->grads.numel;
    const size_t from = a > lo ? a : lo, to = b < hi ? b : hi;
    if (to > from) fn(pipe, p->meta[run].expert, c, from, to);
    run = k;
  }
}

/* Starts one run's sum during backward, one entry of the step's list. */
static void post(loom_pipeline *pipe, bool experts, int c, size_t lo, size_t hi) {
  const int k = pipe->nbucket++;
  size_t *at = &pipe->bucket_at[4 * k];
  at[0] = (size_t)c, at[1] = lo, at[2] = hi, at[3] = experts;
  pipe->bucket_req[k] = start_sum(pipe, experts, c, lo, hi);
}

void loom_grad_sync_layer_done(loom_pipeline *pipe, loom_gpt *m, int l) {
  size_t lo, hi;
  loom_gpt_block_range(m, l, l + 1, &lo, &hi);
  if (pipe->open_hi == pipe->open_lo) pipe->open_hi = hi;
  pipe->open_lo = lo;
  if ((pipe->open_hi - pipe->open_lo) * sizeof(float) < pipe->bucket_bytes && l > 0) return;
  for_runs(pipe, (int)(m - pipe->chunks), pipe->open_lo, pipe->open_hi, post);
  pipe->overlapped += pipe->open_hi - pipe->open_lo;
  pipe->open_lo = pipe->open_hi = 0;
}

void loom_pipeline_dp_words(const loom_pipeline *pipe, int64_t *sent, int64_t *whole) {
  *sent = *whole = 0;
  for (int c = 0; pipe->compress && c < pipe->v; c++)
    *sent += pipe->compress[c].sent_words, *whole += pipe->compress[c].whole_words;
}

bool loom_grad_sync_buckets(const loom_pipeline *pipe) {
  return pipe->bucket_bytes > 0 && !pipe->zero_stage && !pipe->compress && loom_comm_size(pipe->ps->dp_cp_group) > 1;
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
      loom_grad_compress_reduce(&pipe->compress[c], &pipe->chunks[c].p, pipe->ps->dp_cp_group, pipe->chunks[c].ops);
    return 0.0;
  }
  if (pipe->zero_stage) return 0.0; /* ZeRO-1's optimizer reduce-scatters; ZeRO-2/3 did during backward */
  const double t0 = loom_now_s();
  for (int i = 0; i < pipe->nbucket; i++) {
    const size_t *at = &pipe->bucket_at[4 * i];
    finish_sum(pipe, at[3] != 0, (int)at[0], at[1], at[2], pipe->bucket_req[i]);
  }
  const double waited = loom_now_s() - t0;
  for (int c = 0; c < pipe->v; c++) {
    loom_gpt *m = &pipe->chunks[c];
    size_t lo = 0, hi = 0;
    if (loom_grad_sync_buckets(pipe) && m->p.layers > 0) loom_gpt_block_range(m, 0, m->p.layers, &lo, &hi);
    for_runs(pipe, c, 0, lo, sum_over);
    for_runs(pipe, c, hi, m->p.grads.numel, sum_over);
  }
  pipe->nbucket = 0;
  return waited;
}
