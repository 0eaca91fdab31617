/* The ZeRO-1 distributed optimizer over flat parameter buffers. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "optim/zero1.h"

loom_status loom_zero1_init(loom_zero1 *z, const loom_gpt_params *p, int dp_rank, int dp_size,
                            const loom_adamw_config *cfg) {
  memset(z, 0, sizeof *z);
  z->cfg = *cfg;
  const size_t n = p->params.numel;
  z->shard = (n + (size_t)dp_size - 1) / (size_t)dp_size;
  z->begin = z->shard * (size_t)dp_rank < n ? z->shard * (size_t)dp_rank : n;
  z->end = z->begin + z->shard < n ? z->begin + z->shard : n;
  /* Optimizer state and staging live in the backend's memory, as the parameters do. */
  z->mem = p->params.alloc;
  z->m = z->mem->zalloc(z->mem, (z->shard ? z->shard : 1) * sizeof(float));
  z->v = z->mem->zalloc(z->mem, (z->shard ? z->shard : 1) * sizeof(float));
  z->slice = z->mem->zalloc(z->mem, (z->shard ? z->shard : 1) * sizeof(float));
  if (!loom_gpt_params_have_master(p)) z->master = z->mem->zalloc(z->mem, (z->shard ? z->shard : 1) * sizeof(float));
  if (!z->m || !z->v || !z->slice || (!loom_gpt_params_have_master(p) && !z->master)) {
    loom_zero1_free(z);
    return LOOM_ERR_NOMEM;
  }
  return LOOM_OK;
}

void loom_zero1_free(loom_zero1 *z) {
  void *const state[] = {z->m, z->v, z->master, z->slice};
  for (size_t i = 0; i < sizeof state / sizeof *state; i++)
    if (state[i]) z->mem->release(z->mem, state[i]);
  memset(z, 0, sizeof *z);
}

size_t loom_zero1_state_bytes(const loom_zero1 *z) { return (z->master ? 3 : 2) * z->shard * sizeof(float); }

/* The part of tensor k inside [begin, end): sets its flat offset, returns its length (0 if none).
 * Offsets from the grads, which share the parameters' layout and always have storage here. */
static size_t part_of(const loom_gpt_params *p, int k, size_t begin, size_t end, size_t *at) {
  const size_t lo = loom_buffer_offset(&p->grads, k), hi = lo + loom_tensor_numel(&p->grads.views[k]);
  const size_t from = lo > begin ? lo : begin, to = hi < end ? hi : end;
  *at = from;
  return to > from ? to - from : 0;
}

/* Whether buffer b can be cut into dp blocks of the shard in place. */
static bool padded_for(const loom_zero1 *z, const loom_buffer *b, size_t dp) { return b->capacity >= z->shard * dp; }

double loom_zero1_reduce(loom_zero1 *z, loom_gpt_params *p, loom_comm *dp, const loom_ops *ops, const loom_tp *tp,
                         bool skip_shared, bool summed) {
  const int size = loom_comm_size(dp);
  float *mine = (float *)p->grads.base + z->begin;
  if (size > 1 && !summed) {
    LOOM_CHECK(padded_for(z, &p->grads, (size_t)size), "ZeRO-1 needs the grads padded for its reduce-scatter");
    loom_comm_reduce_scatter(dp, p->grads.base, z->slice, z->shard); /* the padding is zero */
    z->mem->copy(z->mem, mine, z->slice, (z->end - z->begin) * sizeof(float));
  }
  /* Squared norm of the slice, each element once: shards over TP summed, replicas once. */
  double sums[2] = {0.0, 0.0};
  for (int k = 0; k < p->params.count; k++) {
    size_t at;
    const size_t len = part_of(p, k, z->begin, z->end, &at);
    if (len == 0 || (skip_shared && p->meta[k].shared)) continue;
    sums[p->meta[k].tp_replicated] += ops->sumsq(ops, (float *)p->grads.base + at, len);
  }
  if (tp) loom_comm_allreduce_typed(tp->group, &sums[0], 1, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
  double total = sums[0] + sums[1];
  loom_comm_allreduce_typed(dp, &total, 1, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
  return total;
}

/* This replica's slice of the fp32 weights: the master slice, or the model's own. */
static float *weights_of(const loom_zero1 *z, const loom_gpt_params *p) {
  return z->master ? z->master : (float *)p->params.base + z->begin;
}

void loom_zero1_step(loom_zero1 *z, loom_gpt_params *p, float lr, double grad_norm, loom_comm *dp, const loom_ops *ops) {
  float *g = p->grads.base, *w = weights_of(z, p);
  const float clip = loom_adamw_clip_scale(&z->cfg, grad_norm);
  z->step++;
  for (int k = 0; k < p->params.count; k++) {
    size_t at;
    const size_t len = part_of(p, k, z->begin, z->end, &at);
    if (len == 0) continue;
    const loom_adamw_args args = {.lr = lr, .beta1 = z->cfg.beta1, .beta2 = z->cfg.beta2, .eps = z->cfg.eps,
                                  .weight_decay = p->meta[k].weight_decay ? z->cfg.weight_decay : 0.0f,
                                  .grad_scale = clip, .step = z->step};
    const size_t i = at - z->begin;
    ops->adamw(ops, w + i, g + at, z->m + i, z->v + i, len, &args);
  }
  if (z->master) {
    loom_zero1_publish(z, p, dp, ops);
    return;
  }
  /* Every replica gets every slice back. */
  const int size = loom_comm_size(dp);
  if (size == 1) return;
  LOOM_CHECK(padded_for(z, &p->params, (size_t)size), "ZeRO-1 needs the parameters padded for its all-gather");
  loom_mem_zero(z->mem, z->slice, z->shard);
  z->mem->copy(z->mem, z->slice, w, (z->end - z->begin) * sizeof(float));
  loom_comm_allgather(dp, z->slice, p->params.base, z->shard);
}

void loom_zero1_publish(loom_zero1 *z, loom_gpt_params *p, loom_comm *dp, const loom_ops *ops) {
  if (!z->master) return;
  const size_t mine = z->end - z->begin;
  uint16_t *compute = p->compute.base;
  if (loom_comm_size(dp) == 1) {
    ops->to_bf16(ops, compute, z->master, mine);
    return;
  }
  LOOM_CHECK(padded_for(z, &p->compute, (size_t)loom_comm_size(dp)), "the distributed optimizer needs the bf16 weights padded");
  uint16_t *slice = (uint16_t *)z->slice; /* bf16 in transit: half of the fp32 slice is enough */
  z->mem->fill32(z->mem, slice, 0, (z->shard + 1) / 2);
  ops->to_bf16(ops, slice, z->master, mine);
  loom_comm_allgather_typed(dp, slice, compute, z->shard, LOOM_DTYPE_BF16);
}

void loom_zero1_gather_master(loom_zero1 *z, const loom_gpt_params *p, loom_comm *dp, float *out) {
  if (!z->master) {
    z->mem->copy(z->mem, out, p->params.base, p->params.numel * sizeof(float));
    return;
  }
  loom_mem_zero(z->mem, z->slice, z->shard);
  z->mem->copy(z->mem, z->slice, z->master, (z->end - z->begin) * sizeof(float));
  loom_comm_allgather(dp, z->slice, out, z->shard);
}
