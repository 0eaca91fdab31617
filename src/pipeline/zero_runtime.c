/* ZeRO-2/3 during forward and backward: per-layer gathers and reduce-scatters. */
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "pipeline/zero_runtime.h"

static size_t padded(const loom_zero *z, int b) { return z->buckets[b].shard * (size_t)z->dp_size; }

static bool is_edge(const loom_zero *z, const loom_gpt_params *p, int b) {
  return p->layers == 0 || b < loom_zero_layer_bucket(z, p, 0) || b > loom_zero_layer_bucket(z, p, p->layers - 1);
}

static void *take(loom_zero_runtime *rt, size_t elements, size_t esize) {
  const size_t bytes = (elements ? elements : 1) * esize;
  rt->transient_bytes += bytes;
  return loom_xzalloc(rt->mem, bytes, "ZeRO transient buffer");
}

loom_status loom_zero_runtime_init(loom_zero_runtime *rt, loom_zero *z, loom_gpt *m, loom_comm *dp) {
  LOOM_CHECK(z->stage >= 2, "the ZeRO runtime is ZeRO-2/3's");
  memset(rt, 0, sizeof *rt);
  rt->z = z, rt->m = m, rt->dp = dp, rt->mem = z->mem;
  rt->wtype = m->p.cfg.bf16 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32;
  rt->edge = loom_xcalloc((size_t)z->nbuckets, sizeof *rt->edge, "edge buckets");
  rt->edge_at = loom_xcalloc((size_t)z->nbuckets, sizeof *rt->edge_at, "edge buckets");
  size_t edges = 0; /* where each edge bucket lies in the edges' buffer */
  for (int b = 0; b < z->nbuckets; b++) {
    if (!is_edge(z, &m->p, b)) {
      LOOM_CHECK(padded(z, b) <= z->cut.layer_max, "a layer bucket within loom_gpt_zero_cut's");
      continue;
    }
    rt->edge[rt->nedge] = b;
    rt->edge_at[rt->nedge++] = edges;
    edges += padded(z, b);
  }
  LOOM_CHECK(edges == z->cut.edges, "the edge buckets are loom_gpt_zero_cut's");
  /* Sized by the optimizer's cut, the one the memory model counts (loom_gpt_zero_cut). */
  const size_t layer_max = z->cut.layer_max, edge_shard = z->cut.edge_shard;
  const size_t f = sizeof(float), w = loom_dtype_size(rt->wtype), layer_shard = layer_max / (size_t)z->dp_size;
  for (int i = 0; i < 2; i++) {
    rt->gbuf[i] = take(rt, layer_max, f);
    rt->grecv[i] = take(rt, layer_shard, f);
    rt->gbucket[i] = rt->wbucket[i] = -1;
  }
  rt->edge_g = take(rt, z->cut.edges, f);
  rt->edge_piece = take(rt, edge_shard, f); /* room for either type */
  if (z->stage == 3) {
    for (int i = 0; i < 2; i++) {
      rt->wbuf[i] = take(rt, layer_max, w);
      rt->wsend[i] = take(rt, layer_shard, f);
    }
    rt->edge_w = take(rt, z->cut.edges, w);
  }
  return LOOM_OK;
}

void loom_zero_runtime_free(loom_zero_runtime *rt) {
  const loom_allocator *mem = rt->mem; /* the optimizer may be gone already */
  void *const held[] = {rt->gbuf[0], rt->gbuf[1], rt->grecv[0], rt->grecv[1], rt->edge_g, rt->edge_piece,
                        rt->wbuf[0], rt->wbuf[1], rt->wsend[0], rt->wsend[1], rt->edge_w};
  for (size_t i = 0; i < sizeof held / sizeof *held; i++)
    if (held[i]) mem->release(mem, held[i]);
  free(rt->edge);
  free(rt->edge_at);
  memset(rt, 0, sizeof *rt);
}

/* The buffer (params, or the bf16 copy) whose views the gathered weights back. */
static loom_buffer *weight_views(loom_zero_runtime *rt) {
  return rt->wtype == LOOM_DTYPE_BF16 ? &rt->m->p.compute : &rt->m->p.params;
}

static void point(loom_zero_runtime *rt, loom_buffer *b, int bucket, void *base) {
  loom_gpt_params_point(&rt->m->p, b, rt->z->buckets[bucket].k0, rt->z->buckets[bucket].k1, base);
}

/* ---- weights (ZeRO-3) ---- */

static loom_request *gather(loom_zero_runtime *rt, int b, void *send, void *out) {
  return loom_zero_gather(rt->z, &rt->m->p, b, rt->wtype, send, out, rt->dp, rt->m->ops);
}

/* Issues layer l's gather into its buffer (l's parity), unless it is there or under way. */
static void prefetch(loom_zero_runtime *rt, int l) {
  if (l < 0 || l >= rt->m->p.layers) return;
  const int b = loom_zero_layer_bucket(rt->z, &rt->m->p, l), i = l & 1;
  if (rt->wbucket[i] == b) return;
  LOOM_CHECK(rt->wreq[i] == NULL, "a layer's weights buffer is still being gathered");
  rt->wbucket[i] = b;
  rt->wreq[i] = gather(rt, b, rt->wsend[i], rt->wbuf[i]);
}

static void gather_layer(loom_zero_runtime *rt, bool backward, int l) {
  const int i = l & 1;
  prefetch(rt, l);
  loom_comm_wait(rt->dp, rt->wreq[i]);
  rt->wreq[i] = NULL;
  point(rt, weight_views(rt), rt->wbucket[i], rt->wbuf[i]);
  prefetch(rt, backward ? l - 1 : l + 1);
}

static void release_layer(loom_zero_runtime *rt, int l) {
  const int i = l & 1;
  point(rt, weight_views(rt), rt->wbucket[i], NULL);
  rt->wbucket[i] = -1;
}

static void gather_edges(loom_zero_runtime *rt, bool gather_them) {
  const size_t w = loom_dtype_size(rt->wtype);
  for (int e = 0; e < rt->nedge; e++) {
    char *at = (char *)rt->edge_w + rt->edge_at[e] * w;
    if (gather_them) loom_comm_wait(rt->dp, gather(rt, rt->edge[e], rt->edge_piece, at));
    point(rt, weight_views(rt), rt->edge[e], gather_them ? at : NULL);
  }
}

/* ---- grads (ZeRO-2/3) ---- */

/* Completes buffer i's reduce-scatter and adds this replica's piece to the summed grads. */
static void settle(loom_zero_runtime *rt, int i) {
  if (rt->gbucket[i] < 0) return;
  loom_comm_wait(rt->dp, rt->greq[i]);
  rt->greq[i] = NULL;
  loom_zero_add_grad(rt->z, rt->gbucket[i], rt->grecv[i], rt->m->ops);
  rt->gbucket[i] = -1;
}

static void open_layer_grads(loom_zero_runtime *rt, int l) {
  const int i = l & 1, b = loom_zero_layer_bucket(rt->z, &rt->m->p, l);
  settle(rt, i);
  loom_mem_zero(rt->z->mem, rt->gbuf[i], padded(rt->z, b));
  point(rt, &rt->m->p.grads, b, rt->gbuf[i]);
}

static void reduce_layer_grads(loom_zero_runtime *rt, int l) {
  const int i = l & 1, b = loom_zero_layer_bucket(rt->z, &rt->m->p, l);
  point(rt, &rt->m->p.grads, b, NULL);
  rt->gbucket[i] = b;
  rt->greq[i] = loom_comm_ireduce_scatter(rt->dp, rt->gbuf[i], rt->grecv[i], rt->z->buckets[b].shard);
}

static void open_edge_grads(loom_zero_runtime *rt) {
  size_t total = 0;
  for (int e = 0; e < rt->nedge; e++) total += padded(rt->z, rt->edge[e]);
  loom_mem_zero(rt->z->mem, rt->edge_g, total);
  for (int e = 0; e < rt->nedge; e++) point(rt, &rt->m->p.grads, rt->edge[e], rt->edge_g + rt->edge_at[e]);
}

static void reduce_edge_grads(loom_zero_runtime *rt) {
  settle(rt, 0);
  settle(rt, 1);
  for (int e = 0; e < rt->nedge; e++) {
    const int b = rt->edge[e];
    point(rt, &rt->m->p.grads, b, NULL);
    loom_comm_reduce_scatter(rt->dp, rt->edge_g + rt->edge_at[e], rt->edge_piece, rt->z->buckets[b].shard);
    loom_zero_add_grad(rt->z, b, rt->edge_piece, rt->m->ops);
  }
}

/* ---- the hooks ---- */

void loom_zero_runtime_before(loom_zero_runtime *rt, bool backward, int layer) {
  const bool three = rt->z->stage == 3;
  if (layer == LOOM_GPT_EDGES) {
    if (three) {
      gather_edges(rt, !backward || rt->m->p.range.last);
      prefetch(rt, backward ? rt->m->p.layers - 1 : 0);
    }
    if (backward) open_edge_grads(rt);
    return;
  }
  if (three) gather_layer(rt, backward, layer);
  if (backward) open_layer_grads(rt, layer);
}

void loom_zero_runtime_after(loom_zero_runtime *rt, bool backward, int layer) {
  const bool three = rt->z->stage == 3;
  if (layer == LOOM_GPT_EDGES) {
    if (backward) reduce_edge_grads(rt);
    if (three) gather_edges(rt, false);
    return;
  }
  if (backward) reduce_layer_grads(rt, layer);
  if (three) release_layer(rt, layer);
}
