/* ZeRO-2/3 during forward and backward: per-layer gathers and reduce-scatters. */
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "layers/run_buffers.h"
#include "pipeline/zero_runtime.h"

static size_t padded(const loom_zero *z, int b) { return z->buckets[b].shard * (size_t)loom_zero_group_size(z, b); }

static bool is_edge(const loom_zero *z, const loom_gpt_params *p, int b) {
  return b < z->layer_first[0] || b >= z->layer_first[p->layers];
}

static void *take(loom_zero_runtime *rt, size_t elements, size_t esize, loom_run_buffer name) {
  if (rt->short_of_memory) return NULL; /* the first buffer short is the one reported */
  const size_t bytes = (elements ? elements : 1) * esize;
  rt->transient_bytes += bytes;
  void *p = loom_zalloc(rt->mem, bytes, loom_run_buffer_name(name));
  rt->short_of_memory |= !p;
  return p;
}

/* Where bucket b of local layer l starts in a layer's buffers: padded elements before it, or (pieces) its pieces'. */
static size_t layer_offset(const loom_zero *z, int l, int bucket, bool pieces) {
  size_t at = 0;
  for (int b = z->layer_first[l]; b < bucket; b++) at += pieces ? z->buckets[b].shard : padded(z, b);
  return at;
}

loom_status loom_zero_runtime_init(loom_zero_runtime *rt, loom_zero *z, loom_gpt *m, bool grads_bf16) {
  LOOM_CHECK(z->stage >= 2 && z->layer_first, "the ZeRO runtime is ZeRO-2/3's");
  memset(rt, 0, sizeof *rt);
  rt->z = z, rt->m = m, rt->mem = z->mem;
  rt->wtype = m->p.cfg.bf16 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32;
  rt->edge = loom_xcalloc((size_t)z->nbuckets, sizeof *rt->edge, "edge buckets");
  rt->edge_at = loom_xcalloc((size_t)z->nbuckets, sizeof *rt->edge_at, "edge buckets");
  size_t edges = 0; /* where each edge bucket lies in the edges' buffer */
  for (int b = 0; b < z->nbuckets; b++) {
    if (!is_edge(z, &m->p, b)) continue;
    rt->edge[rt->nedge] = b;
    rt->edge_at[rt->nedge++] = edges;
    edges += padded(z, b);
  }
  LOOM_CHECK(edges == z->cut.edges, "the edge buckets are loom_gpt_zero_cut's");
  for (int l = 0; l < m->p.layers; l++) {
    const int end = z->layer_first[l + 1];
    LOOM_CHECK(layer_offset(z, l, end, false) <= z->cut.layer_max && layer_offset(z, l, end, true) <= z->cut.layer_shard,
               "a layer's buckets within loom_gpt_zero_cut's");
    if (end - z->layer_first[l] > rt->most) rt->most = end - z->layer_first[l];
  }
  /* Sized by the optimizer's cut, the one the memory model counts (loom_gpt_zero_cut). */
  const size_t layer_max = z->cut.layer_max, layer_shard = z->cut.layer_shard;
  const size_t f = sizeof(float), w = loom_dtype_size(rt->wtype);
  for (int i = 0; i < 2; i++) {
    rt->gbuf[i] = take(rt, layer_max, f, LOOM_BUF_ZERO_LAYER_GRADS);
    rt->grecv[i] = take(rt, layer_shard, f, LOOM_BUF_ZERO_LAYER_PIECE);
    rt->glayer[i] = rt->wlayer[i] = -1;
    rt->greq[i] = loom_xcalloc((size_t)rt->most + 1, sizeof *rt->greq[i], "ZeRO requests");
    rt->wreq[i] = loom_xcalloc((size_t)rt->most + 1, sizeof *rt->wreq[i], "ZeRO requests");
  }
  rt->edge_g = take(rt, z->cut.edges, f, LOOM_BUF_ZERO_EDGE_GRADS);
  rt->edge_piece = take(rt, z->cut.edge_shard, f, LOOM_BUF_ZERO_EDGE_PIECE); /* room for either type */
  if (grads_bf16) {
    const size_t h = sizeof(uint16_t);
    for (int i = 0; i < 2; i++)
      rt->gsend[i] = take(rt, layer_max, h, LOOM_BUF_ZERO_LAYER_GRADS_BF16),
      rt->grecv16[i] = take(rt, layer_shard, h, LOOM_BUF_ZERO_LAYER_PIECE_BF16);
    rt->edge_gsend = take(rt, z->cut.edges, h, LOOM_BUF_ZERO_EDGE_GRADS_BF16);
    rt->edge_recv16 = take(rt, z->cut.edge_shard, h, LOOM_BUF_ZERO_EDGE_PIECE_BF16);
  }
  if (z->stage == 3) {
    for (int i = 0; i < 2; i++) {
      rt->wbuf[i] = take(rt, layer_max, w, LOOM_BUF_ZERO_LAYER_WEIGHTS);
      rt->wsend[i] = take(rt, layer_shard, f, LOOM_BUF_ZERO_LAYER_SEND); /* room for either type */
    }
    rt->edge_w = take(rt, z->cut.edges, w, LOOM_BUF_ZERO_EDGE_WEIGHTS);
  }
  return rt->short_of_memory ? LOOM_ERR_NOMEM : LOOM_OK; /* loom_alloc_failure names the buffer */
}

void loom_zero_runtime_free(loom_zero_runtime *rt) {
  const loom_allocator *mem = rt->mem; /* the optimizer may be gone already */
  void *const held[] = {rt->gbuf[0], rt->gbuf[1], rt->grecv[0], rt->grecv[1], rt->edge_g, rt->edge_piece,
                        rt->wbuf[0], rt->wbuf[1], rt->wsend[0], rt->wsend[1], rt->edge_w, rt->gsend[0], rt->gsend[1],
                        rt->grecv16[0], rt->grecv16[1], rt->edge_gsend, rt->edge_recv16};
  for (size_t i = 0; i < sizeof held / sizeof *held; i++)
    if (held[i]) mem->release(mem, held[i]);
  for (int i = 0; i < 2; i++) free(rt->greq[i]), free(rt->wreq[i]);
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

/* Points layer l's views of buf into base (elements of esize) as the layer's buffers hold them, or at nothing. */
static void point_layer(loom_zero_runtime *rt, loom_buffer *buf, int l, void *base, size_t esize) {
  for (int b = rt->z->layer_first[l]; b < rt->z->layer_first[l + 1]; b++)
    point(rt, buf, b, base ? (char *)base + layer_offset(rt->z, l, b, false) * esize : NULL);
}

/* ---- weights (ZeRO-3) ---- */

static loom_request *gather(loom_zero_runtime *rt, int b, void *send, void *out) {
  return loom_zero_gather(rt->z, &rt->m->p, b, rt->wtype, send, out, rt->m->ops);
}

/* Issues layer l's gathers into its buffer (l's parity), unless it is there or under way. */
static void prefetch(loom_zero_runtime *rt, int l) {
  if (l < 0 || l >= rt->m->p.layers) return;
  const int i = l & 1, b0 = rt->z->layer_first[l];
  if (rt->wlayer[i] == l) return;
  rt->wlayer[i] = l;
  const size_t w = loom_dtype_size(rt->wtype);
  for (int b = b0; b < rt->z->layer_first[l + 1]; b++) {
    LOOM_CHECK(rt->wreq[i][b - b0] == NULL, "a layer's weights buffer is still being gathered");
    rt->wreq[i][b - b0] = gather(rt, b, (float *)rt->wsend[i] + layer_offset(rt->z, l, b, true),
                                 (char *)rt->wbuf[i] + layer_offset(rt->z, l, b, false) * w);
  }
}

static void gather_layer(loom_zero_runtime *rt, bool backward, int l) {
  const int i = l & 1, b0 = rt->z->layer_first[l];
  prefetch(rt, l);
  for (int b = b0; b < rt->z->layer_first[l + 1]; b++) {
    loom_comm_wait(loom_zero_comm(rt->z, b), rt->wreq[i][b - b0]);
    rt->wreq[i][b - b0] = NULL;
  }
  point_layer(rt, weight_views(rt), l, rt->wbuf[i], loom_dtype_size(rt->wtype));
  prefetch(rt, backward ? l - 1 : l + 1);
}

static void release_layer(loom_zero_runtime *rt, int l) {
  point_layer(rt, weight_views(rt), l, NULL, 0);
  rt->wlayer[l & 1] = -1;
}

static void gather_edges(loom_zero_runtime *rt, bool gather_them) {
  const size_t w = loom_dtype_size(rt->wtype);
  for (int e = 0; e < rt->nedge; e++) {
    char *at = (char *)rt->edge_w + rt->edge_at[e] * w;
    if (gather_them) loom_comm_wait(loom_zero_comm(rt->z, rt->edge[e]), gather(rt, rt->edge[e], rt->edge_piece, at));
    point(rt, weight_views(rt), rt->edge[e], gather_them ? at : NULL);
  }
}

/* ---- grads (ZeRO-2/3) ---- */

/* Completes buffer i's reduce-scatters and adds this replica's pieces to the summed grads (bf16 ones widened first). */
static void settle(loom_zero_runtime *rt, int i) {
  const int l = rt->glayer[i];
  if (l < 0) return;
  const int b0 = rt->z->layer_first[l];
  for (int b = b0; b < rt->z->layer_first[l + 1]; b++) {
    loom_comm_wait(loom_zero_comm(rt->z, b), rt->greq[i][b - b0]);
    rt->greq[i][b - b0] = NULL;
    float *piece = rt->grecv[i] + layer_offset(rt->z, l, b, true);
    if (rt->gsend[i]) rt->m->ops->from_bf16(rt->m->ops, piece, rt->grecv16[i] + layer_offset(rt->z, l, b, true), rt->z->buckets[b].shard);
    loom_zero_add_grad(rt->z, b, piece, rt->m->ops);
  }
  rt->glayer[i] = -1;
}

static void open_layer_grads(loom_zero_runtime *rt, int l) {
  const int i = l & 1;
  settle(rt, i);
  loom_mem_zero(rt->z->mem, rt->gbuf[i], layer_offset(rt->z, l, rt->z->layer_first[l + 1], false));
  point_layer(rt, &rt->m->p.grads, l, rt->gbuf[i], sizeof(float));
}

static void reduce_layer_grads(loom_zero_runtime *rt, int l) {
  const int i = l & 1, b0 = rt->z->layer_first[l];
  point_layer(rt, &rt->m->p.grads, l, NULL, 0);
  rt->glayer[i] = l;
  const size_t padded_layer = layer_offset(rt->z, l, rt->z->layer_first[l + 1], false);
  if (rt->gsend[i]) rt->m->ops->to_bf16(rt->m->ops, rt->gsend[i], rt->gbuf[i], padded_layer); /* the padding is zero */
  for (int b = b0; b < rt->z->layer_first[l + 1]; b++) {
    const size_t at = layer_offset(rt->z, l, b, false), piece = layer_offset(rt->z, l, b, true), n = rt->z->buckets[b].shard;
    loom_comm *c = loom_zero_comm(rt->z, b);
    rt->greq[i][b - b0] = rt->gsend[i] ? loom_comm_ireduce_scatter_typed(c, rt->gsend[i] + at, rt->grecv16[i] + piece, n, LOOM_DTYPE_BF16)
                                       : loom_comm_ireduce_scatter(c, rt->gbuf[i] + at, rt->grecv[i] + piece, n);
  }
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
    const size_t n = rt->z->buckets[b].shard;
    loom_comm *c = loom_zero_comm(rt->z, b);
    point(rt, &rt->m->p.grads, b, NULL);
    if (rt->edge_gsend) {
      rt->m->ops->to_bf16(rt->m->ops, rt->edge_gsend, rt->edge_g + rt->edge_at[e], padded(rt->z, b));
      loom_comm_reduce_scatter_typed(c, rt->edge_gsend, rt->edge_recv16, n, LOOM_DTYPE_BF16);
      rt->m->ops->from_bf16(rt->m->ops, rt->edge_piece, rt->edge_recv16, n);
    } else {
      loom_comm_reduce_scatter(c, rt->edge_g + rt->edge_at[e], rt->edge_piece, n);
    }
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
