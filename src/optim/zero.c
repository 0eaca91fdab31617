/* ZeRO stages 1-3 over flat parameter buffers: buckets, pieces and the optimizer step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "layers/gpt.h"
#include "optim/zero.h"
#include "layers/run_buffers.h"


static void add_bucket(loom_zero *z, const loom_gpt_params *p, int k0, int k1) {
  if (k1 <= k0) return;
  loom_zero_bucket *b = &z->buckets[z->nbuckets++];
  b->k0 = k0, b->k1 = k1;
  b->lo = loom_buffer_offset(&p->params, k0);
  b->hi = k1 < p->params.count ? loom_buffer_offset(&p->params, k1) : p->params.numel;
  b->group = p->meta[k0].expert && loom_gpt_zero_experts_apart(&p->cfg) ? LOOM_ZERO_EXPERTS : LOOM_ZERO_DENSE;
  const size_t size = (size_t)z->group[b->group].size;
  b->shard = (b->hi - b->lo + size - 1) / size;
}

/* The buckets of loom_gpt_zero_buckets, the cut the memory model sizes. */
static void cut_buckets(loom_zero *z, const loom_gpt_params *p) {
  const int count = p->params.count;
  z->buckets = loom_xcalloc((size_t)count + 1, sizeof *z->buckets, "ZeRO buckets");
  z->runs = loom_xcalloc((size_t)count + 1, sizeof *z->runs, "ZeRO pieces");
  int *first = loom_xmalloc(((size_t)count + 2) * sizeof *first, "ZeRO buckets");
  const int n = loom_gpt_zero_buckets(&p->cfg, &p->range, z->stage, first);
  for (int b = 0; b < n; b++) add_bucket(z, p, first[b], first[b + 1]);
  free(first);
  if (!z->in_place) { /* each layer's first bucket starts at its first tensor */
    z->layer_first = loom_xcalloc((size_t)p->layers + 1, sizeof *z->layer_first, "ZeRO layers");
    for (int l = 0, b = 0; l <= p->layers; l++) {
      while (b < z->nbuckets && z->buckets[b].k0 < p->layer_tensor[l]) b++;
      z->layer_first[l] = b;
    }
  }
  z->parts = loom_xcalloc((size_t)count + 1, sizeof *z->parts, "ZeRO parts"); /* a tensor lies in one bucket */
  for (int b = 0; b < z->nbuckets; b++) {
    loom_flat_run *r = &z->runs[b];
    loom_zero_piece(z, b, &r->lo, &r->hi);
    r->at = z->shard;
    z->shard += z->buckets[b].shard;
    if (z->buckets[b].shard > z->max_shard) z->max_shard = z->buckets[b].shard;
    size_t lo = z->buckets[b].lo; /* the bucket's tensors lie back to back */
    for (int k = z->buckets[b].k0; k < z->buckets[b].k1; k++) {
      const size_t hi = lo + loom_tensor_numel(&p->params.views[k]);
      const size_t from = lo > r->lo ? lo : r->lo, to = hi < r->hi ? hi : r->hi;
      if (to > from)
        z->parts[z->nparts++] = (loom_zero_part){.k = k, .from = from, .len = to - from, .at = r->at + (from - r->lo)};
      lo = hi;
    }
  }
}

void loom_zero_piece(const loom_zero *z, int b, size_t *lo, size_t *hi) {
  const loom_zero_bucket *k = &z->buckets[b];
  const size_t from = k->lo + k->shard * (size_t)z->group[k->group].rank;
  *lo = from < k->hi ? from : k->hi;
  *hi = from + k->shard < k->hi ? from + k->shard : k->hi;
}

loom_comm *loom_zero_comm(const loom_zero *z, int b) { return z->group[z->buckets[b].group].comm; }
int loom_zero_group_size(const loom_zero *z, int b) { return z->group[z->buckets[b].group].size; }

static void *state(loom_zero *z, size_t n, loom_run_buffer name) {
  return loom_zalloc(z->mem, (n ? n : 1) * sizeof(float), loom_run_buffer_name(name));
}

loom_status loom_zero_init(loom_zero *z, const loom_gpt_params *p, const loom_zero_group groups[LOOM_ZERO_GROUPS],
                           int stage, const loom_adamw_config *cfg) {
  LOOM_CHECK(stage >= 1 && stage <= 3, "ZeRO stage 1, 2 or 3");
  for (int g = 0; g < LOOM_ZERO_GROUPS; g++)
    LOOM_CHECK(groups[g].size >= 1 && groups[g].rank >= 0 && groups[g].rank < groups[g].size, "ZeRO replica in its group");
  LOOM_CHECK(loom_gpt_zero_experts_apart(&p->cfg) || (groups[1].size == groups[0].size && groups[1].rank == groups[0].rank),
             "the experts' group is dp unless they are apart");
  memset(z, 0, sizeof *z);
  z->cfg = *cfg;
  z->stage = stage;
  memcpy(z->group, groups, sizeof z->group);
  z->in_place = loom_gpt_zero_in_place(&p->cfg, stage);
  z->mem = p->params.alloc;
  cut_buckets(z, p);
  /* Sized by the one cut the memory model counts too; the buckets just cut must agree with it. */
  z->cut = loom_gpt_zero_cut(&p->cfg, &p->range, p->tp_size, groups[0].size, stage);
  LOOM_CHECK(z->cut.shard == z->shard && z->cut.max_shard == z->max_shard, "ZeRO's buckets are loom_gpt_zero_cut's");
  /* Optimizer state and staging live in the backend's memory, as the parameters do. */
  z->m = state(z, z->cut.shard, LOOM_BUF_ADAM_M);
  z->v = state(z, z->cut.shard, LOOM_BUF_ADAM_V);
  z->slice_len = z->cut.slice;
  z->slice = state(z, z->slice_len, LOOM_BUF_ZERO_SLICE);
  bool ok = z->m && z->v && z->slice;
  if (!loom_gpt_params_have_master(p)) ok = ok && (z->master = state(z, z->cut.shard, LOOM_BUF_ZERO_MASTER));
  if (stage >= 2) ok = ok && (z->grad = state(z, z->cut.shard, LOOM_BUF_ZERO_GRAD));
  if (z->cut.staging) ok = ok && (z->staging = state(z, z->cut.staging, LOOM_BUF_ZERO_STAGING));
  if (!ok) {
    loom_zero_free(z);
    return LOOM_ERR_NOMEM;
  }
  return LOOM_OK;
}

void loom_zero_free(loom_zero *z) {
  void *const held[] = {z->m, z->v, z->master, z->grad, z->slice, z->staging};
  for (size_t i = 0; i < sizeof held / sizeof *held; i++)
    if (held[i]) z->mem->release(z->mem, held[i]);
  free(z->buckets);
  free(z->layer_first);
  free(z->runs);
  free(z->parts);
  memset(z, 0, sizeof *z);
}

void loom_zero_randomize(loom_zero *z, const loom_gpt_params *p, uint64_t seed) {
  for (int b = 0; z->master && b < z->nbuckets; b++)
    loom_gpt_params_randomize_slice(p, seed, z->master + z->runs[b].at, z->runs[b].lo, z->runs[b].hi);
}

size_t loom_zero_state_bytes(const loom_zero *z) { return (z->master ? 3 : 2) * z->shard * sizeof(float); }
size_t loom_zero_grad_bytes(const loom_zero *z) { return z->grad ? z->shard * sizeof(float) : 0; }

size_t loom_zero_transit_bytes(const loom_zero *z) {
  return (z->slice_len + (z->staging ? z->cut.staging : 0)) * sizeof(float);
}

void loom_zero_zero_grad(loom_zero *z) {
  if (z->grad) loom_mem_zero(z->mem, z->grad, z->shard);
}

void loom_zero_add_grad(loom_zero *z, int b, const float *piece, const loom_ops *ops) {
  const loom_flat_run *r = &z->runs[b];
  if (r->hi > r->lo) ops->accumulate(ops, z->grad + r->at, piece, r->hi - r->lo);
}

/* The summed grads of a part: in the grad pieces (ZeRO-2/3), or in place in p's grads. */
static float *grads_of(const loom_zero *z, const loom_gpt_params *p, const loom_zero_part *pt) {
  return z->grad ? z->grad + pt->at : (float *)p->grads.base + pt->from;
}

/* The fp32 weights of a part: the master pieces, or the model's own. */
static float *weights_of(const loom_zero *z, const loom_gpt_params *p, const loom_zero_part *pt) {
  return z->master ? z->master + pt->at : (float *)p->params.base + pt->from;
}

float *loom_zero_tensor_grad(const loom_zero *z, int k, size_t *lo, size_t *len) {
  LOOM_CHECK(z->grad != NULL, "grad pieces are ZeRO-2/3's");
  for (int i = 0; i < z->nparts; i++) {
    if (z->parts[i].k != k) continue;
    *lo = z->parts[i].from, *len = z->parts[i].len;
    return z->grad + z->parts[i].at;
  }
  *lo = *len = 0;
  return NULL;
}

/* Whether buffer b can be cut into dp blocks of the shard in place. */
static bool padded_for(const loom_zero *z, const loom_buffer *b, size_t dp) { return b->capacity >= z->shard * dp; }

/* A round [off, off + len) of replica q's piece of bucket k: its first flat element, and how many of it lie in the bucket. */
static size_t round_at(const loom_zero_bucket *k, int q, size_t off, size_t len, size_t *valid) {
  const size_t at = k->lo + (size_t)q * k->shard + off;
  *valid = at >= k->hi ? 0 : (k->hi - at < len ? k->hi - at : len);
  return at;
}

/* Not in place, ZeRO-1 reduce-scatters p's grads bucket by bucket, in
 * rounds: round j brings elements [j R, (j + 1) R) of every replica's piece
 * together in the staging (zero past the bucket), sums them over the
 * bucket's group, and writes this replica's back in place. */
static void reduce_buckets(loom_zero *z, loom_gpt_params *p) {
  float *g = p->grads.base;
  for (int b = 0; b < z->nbuckets; b++) {
    const loom_zero_bucket *k = &z->buckets[b];
    const int size = loom_zero_group_size(z, b);
    if (size == 1) continue; /* the piece is the sum */
    for (size_t off = 0; off < k->shard; off += z->cut.round) {
      const size_t len = k->shard - off < z->cut.round ? k->shard - off : z->cut.round;
      for (int q = 0; q < size; q++) {
        size_t valid;
        const size_t at = round_at(k, q, off, len, &valid);
        float *to = z->staging + (size_t)q * len;
        z->mem->copy(z->mem, to, g + at, valid * sizeof(float));
        loom_mem_zero(z->mem, to + valid, len - valid);
      }
      loom_comm_reduce_scatter(loom_zero_comm(z, b), z->staging, z->slice, len);
      size_t mine;
      const size_t at = round_at(k, z->group[k->group].rank, off, len, &mine);
      z->mem->copy(z->mem, g + at, z->slice, mine * sizeof(float));
    }
  }
}

/* In place, ZeRO-1 reduce-scatters the padded grads as one bucket: in fp32, or as bf16 values through grad16 (the
 * padded count of them), each rank's sum widened back into its piece. */
static void reduce_in_place(loom_zero *z, loom_gpt_params *p, const loom_ops *ops, uint16_t *grad16, int size) {
  loom_comm *dp = z->group[LOOM_ZERO_DENSE].comm;
  float *g = p->grads.base;
  const size_t mine = z->runs[0].hi - z->runs[0].lo;
  LOOM_CHECK(padded_for(z, &p->grads, (size_t)size), "ZeRO-1 needs the grads padded for its reduce-scatter");
  if (!grad16) {
    loom_comm_reduce_scatter(dp, g, z->slice, z->shard); /* the padding is zero */
    z->mem->copy(z->mem, g + z->runs[0].lo, z->slice, mine * sizeof(float));
    return;
  }
  uint16_t *sum = (uint16_t *)z->slice; /* a bf16 piece takes half of the fp32 slice */
  ops->to_bf16(ops, grad16, g, z->shard * (size_t)size);
  loom_comm_reduce_scatter_typed(dp, grad16, sum, z->shard, LOOM_DTYPE_BF16);
  ops->from_bf16(ops, g + z->runs[0].lo, sum, mine);
}

double loom_zero_reduce(loom_zero *z, loom_gpt_params *p, const loom_ops *ops, const loom_tp *tp, bool skip_shared,
                        bool summed, uint16_t *grad16, double *uncounted) {
  loom_comm *dp = z->group[LOOM_ZERO_DENSE].comm;
  const int size = loom_comm_size(dp);
  LOOM_CHECK(!grad16 || (z->stage == 1 && z->in_place), "bf16 grads cross dp under ZeRO-1 in place only");
  if (z->stage == 1 && !summed && !z->in_place) reduce_buckets(z, p);
  if (z->stage == 1 && size > 1 && !summed && z->in_place) reduce_in_place(z, p, ops, grad16, size);
  for (int i = 0; z->grad && i < z->nparts; i++) /* each TP rank's pieces cover its positions only */
    loom_gpt_sum_replicated_grad(p, tp, z->parts[i].k, grads_of(z, p, &z->parts[i]), z->parts[i].len);
  /* Squared norm of the pieces, each element once (loom_norm_sum's rule). */
  loom_norm_sum s = {.skip_shared = skip_shared};
  for (int i = 0; i < z->nparts; i++) loom_norm_sum_add(&s, p, z->parts[i].k, grads_of(z, p, &z->parts[i]), z->parts[i].len, ops);
  double total = loom_norm_sum_total(&s, tp);
  *uncounted = s.uncounted;
  if (loom_gpt_zero_experts_apart(&p->cfg)) { /* the experts' pieces, summed over ep already, and over their replicas */
    double experts = s.sums[2] + s.sums[3];
    total -= experts;
    loom_comm_allreduce_typed(z->group[LOOM_ZERO_EXPERTS].comm, &experts, 1, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
    loom_comm_allreduce_typed(dp, &total, 1, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
    return total + experts;
  }
  loom_comm_allreduce_typed(dp, &total, 1, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
  return total;
}

loom_request *loom_zero_gather(loom_zero *z, const loom_gpt_params *p, int b, loom_dtype type, void *send, void *out,
                               const loom_ops *ops) {
  const loom_flat_run *r = &z->runs[b];
  const size_t len = r->hi - r->lo, shard = z->buckets[b].shard;
  const float *w = z->master ? z->master + r->at : (const float *)p->params.base + r->lo;
  LOOM_CHECK(z->master || p->params.base, "gathering weights nobody holds");
  if (type == LOOM_DTYPE_BF16) {
    z->mem->fill32(z->mem, send, 0, loom_bf16_words(shard));
    ops->to_bf16(ops, send, w, len);
  } else {
    loom_mem_zero(z->mem, send, shard);
    z->mem->copy(z->mem, send, w, len * sizeof(float));
  }
  return loom_comm_iallgather_typed(loom_zero_comm(z, b), send, out, shard, type);
}

/* Every bucket all-gathered into dst (p's params, or in bf16 runs its
 * compute copy) in rounds: round j moves elements [j R, (j + 1) R) of every
 * replica's piece through staging[R * size]. From the master pieces, or the
 * model's own weights. */
static void gather_into(loom_zero *z, const loom_gpt_params *p, loom_dtype type, void *dst, float *send, float *staging,
                        const loom_ops *ops) {
  const size_t esize = loom_dtype_size(type), R = z->cut.round;
  for (int b = 0; b < z->nbuckets; b++) {
    const loom_zero_bucket *k = &z->buckets[b];
    const loom_flat_run *r = &z->runs[b];
    const float *w = z->master ? z->master + r->at : (const float *)p->params.base + r->lo;
    for (size_t off = 0; off < k->shard; off += R) {
      const size_t len = k->shard - off < R ? k->shard - off : R;
      const size_t mine = r->hi - r->lo > off ? (r->hi - r->lo - off < len ? r->hi - r->lo - off : len) : 0;
      z->mem->fill32(z->mem, send, 0, type == LOOM_DTYPE_BF16 ? loom_bf16_words(len) : len);
      if (type == LOOM_DTYPE_BF16) ops->to_bf16(ops, (uint16_t *)send, w + off, mine);
      else z->mem->copy(z->mem, send, w + off, mine * sizeof(float));
      loom_comm_allgather_typed(loom_zero_comm(z, b), send, staging, len, type);
      for (int q = 0; q < loom_zero_group_size(z, b); q++) { /* replica q's round, clipped to the bucket */
        size_t valid;
        const size_t at = round_at(k, q, off, len, &valid);
        z->mem->copy(z->mem, (char *)dst + at * esize, (char *)staging + (size_t)q * len * esize, valid * esize);
      }
    }
  }
}

void loom_zero_step(loom_zero *z, loom_gpt_params *p, float lr, double grad_norm, const loom_ops *ops) {
  const float clip = loom_adamw_clip_scale(&z->cfg, grad_norm);
  z->step++;
  for (int i = 0; i < z->nparts; i++) {
    const loom_zero_part *pt = &z->parts[i];
    const loom_adamw_args args = {.lr = lr, .beta1 = z->cfg.beta1, .beta2 = z->cfg.beta2, .eps = z->cfg.eps,
                                  .weight_decay = p->meta[pt->k].weight_decay ? z->cfg.weight_decay : 0.0f,
                                  .grad_scale = clip, .step = z->step};
    ops->adamw(ops, weights_of(z, p, pt), grads_of(z, p, pt), z->m + pt->at, z->v + pt->at, NULL, pt->len, &args);
  }
  if (z->stage == 3) return; /* gathered before each use */
  if (z->master) {
    loom_zero_publish(z, p, ops);
    return;
  }
  if (!z->in_place) {
    gather_into(z, p, LOOM_DTYPE_F32, p->params.base, z->slice, z->staging, ops);
    return;
  }
  /* ZeRO-1 in place: every replica gets every piece back. */
  loom_comm *dp = z->group[LOOM_ZERO_DENSE].comm;
  const int size = loom_comm_size(dp);
  if (size == 1) return;
  LOOM_CHECK(padded_for(z, &p->params, (size_t)size), "ZeRO-1 needs the parameters padded for its all-gather");
  const loom_flat_run *r = &z->runs[0];
  loom_mem_zero(z->mem, z->slice, z->shard);
  z->mem->copy(z->mem, z->slice, (float *)p->params.base + r->lo, (r->hi - r->lo) * sizeof(float));
  loom_comm_allgather(dp, z->slice, p->params.base, z->shard);
}

void loom_zero_publish(loom_zero *z, loom_gpt_params *p, const loom_ops *ops) {
  if (!z->master || z->stage == 3) return;
  if (!z->in_place) {
    gather_into(z, p, LOOM_DTYPE_BF16, p->compute.base, z->slice, z->staging, ops);
    return;
  }
  loom_comm *dp = z->group[LOOM_ZERO_DENSE].comm;
  const size_t mine = z->runs[0].hi - z->runs[0].lo;
  uint16_t *compute = p->compute.base;
  if (loom_comm_size(dp) == 1) {
    ops->to_bf16(ops, compute, z->master, mine);
    return;
  }
  LOOM_CHECK(padded_for(z, &p->compute, (size_t)loom_comm_size(dp)), "the distributed optimizer needs the bf16 weights padded");
  uint16_t *slice = (uint16_t *)z->slice; /* bf16 in transit: half of the fp32 slice is enough */
  z->mem->fill32(z->mem, slice, 0, loom_bf16_words(z->shard));
  ops->to_bf16(ops, slice, z->master, mine);
  loom_comm_allgather_typed(dp, slice, compute, z->shard, LOOM_DTYPE_BF16);
}

void loom_zero_gather_master(loom_zero *z, const loom_gpt_params *p, float *out) {
  if (!z->master) {
    z->mem->copy(z->mem, out, p->params.base, p->params.numel * sizeof(float));
    return;
  }
  const size_t R = z->cut.round;
  const int most = z->group[0].size > z->group[1].size ? z->group[0].size : z->group[1].size;
  float *send = loom_xzalloc(z->mem, R * sizeof(float), "gathered weights");
  float *all = loom_xzalloc(z->mem, R * (size_t)most * sizeof(float), "gathered weights");
  gather_into(z, p, LOOM_DTYPE_F32, out, send, all, NULL);
  z->mem->release(z->mem, send);
  z->mem->release(z->mem, all);
}
