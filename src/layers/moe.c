/* A Mixture-of-Experts MLP on one rank (see moe.h). */
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include "core/check.h"
#include "layers/moe.h"

int64_t loom_moe_recv_rows(const loom_gpt_config *cfg, int64_t n, int seq) {
  const int64_t k = cfg->moe.topk, ep = cfg->moe.ep > 1 ? cfg->moe.ep : 1, local = loom_gpt_local_experts(cfg);
  if (ep == 1) return n * k;
  int64_t most = ep * n * (k < local ? k : local);
  const loom_moe_dispatch_config d = {.experts = cfg->moe.experts, .topk = cfg->moe.topk,
                                      .capacity_factor = cfg->moe.capacity_factor};
  const int64_t cap = loom_moe_capacity(&d, (int)(n * seq)), per = cap < n ? cap : n;
  if (cfg->moe.capacity_factor > 0.0 && ep * local * per < most) most = ep * local * per;
  return most;
}

int64_t loom_moe_expert_rows(const loom_gpt_config *cfg, int64_t n, int seq) {
  return (int64_t)loom_gpt_expert_tp(cfg) * loom_moe_recv_rows(cfg, n, seq);
}

loom_moe_shape loom_moe_shape_of(const loom_gpt_config *cfg, int n, int seq) {
  const loom_moe_config *m = &cfg->moe;
  return (loom_moe_shape){
      .n = n, .hidden = cfg->hidden, .ffn = loom_gpt_local_expert_ffn(cfg), .mlp = cfg->mlp, .glu = cfg->glu,
      .router = {.experts = m->experts, .topk = m->topk, .score = m->score, .pre_softmax = m->pre_softmax,
                 .aux_loss_coeff = m->aux_loss_coeff, .z_loss_coeff = m->z_loss_coeff, .groups = m->router_groups,
                 .group_topk = m->router_group_topk, .topk_scaling = m->topk_scaling},
      .dispatch = {.experts = m->experts, .topk = m->topk, .capacity_factor = m->capacity_factor,
                   .drop_by_position = m->drop_by_position},
      .bf16 = cfg->bf16, .ep = m->ep > 1 ? m->ep : 1, .ep_rank = m->ep > 1 ? m->ep_rank : 0,
      .local_experts = loom_gpt_local_experts(cfg), .recv_rows = loom_moe_recv_rows(cfg, n, seq),
      .etp = loom_gpt_expert_tp(cfg)};
}

loom_moe_host *loom_moe_host_new(int n, int experts, int topk, int ep, int etp) {
  const size_t E = (size_t)experts, nk = (size_t)n * (size_t)topk, nE = (size_t)n * E, P = (size_t)(ep > 1 ? ep : 1);
  loom_moe_host *h = loom_xcalloc(1, sizeof *h, "routing");
  h->routing = (loom_moe_routing){.experts = loom_xmalloc(nk * sizeof(int) + 1, "routing"),
                                  .weights = loom_xmalloc(nk * sizeof(float) + 1, "routing"),
                                  .load = loom_xmalloc(E * sizeof(int64_t), "routing"),
                                  .aux_load = loom_xmalloc(E * sizeof(int64_t), "routing"),
                                  .score_sum = loom_xmalloc(E * sizeof(double), "routing")};
  h->dispatch = (loom_moe_dispatch){.counts = loom_xmalloc(E * sizeof(int64_t), "routing"),
                                    .rows = loom_xmalloc(nk * sizeof(int) + 1, "routing"),
                                    .slots = loom_xmalloc(nk * sizeof(int) + 1, "routing")};
  h->counts = loom_xmalloc(E * sizeof(int), "routing");
  h->block_counts = loom_xmalloc((size_t)(etp > 1 ? etp : 1) * E * sizeof(int), "routing");
  h->logits = loom_xmalloc(nE * sizeof(float) + 1, "routing");
  h->gate = loom_xmalloc((size_t)n * sizeof(float) + 1, "routing");
  h->gate_grad = loom_xmalloc((size_t)n * sizeof(float) + 1, "routing");
  h->identity = loom_xmalloc((size_t)n * sizeof(int) + 1, "routing");
  for (int i = 0; i < n; i++) h->identity[i] = i;
  h->send_rows = loom_xmalloc(P * sizeof(size_t), "routing");
  h->recv_rows = loom_xmalloc(P * sizeof(size_t), "routing");
  h->peer_counts = loom_xmalloc(P * E * sizeof(int64_t), "routing");
  return h;
}

void loom_moe_host_free(loom_moe_host *h) {
  if (!h) return;
  free(h->routing.experts), free(h->routing.weights), free(h->routing.load), free(h->routing.aux_load);
  free(h->routing.score_sum), free(h->dispatch.counts), free(h->dispatch.rows), free(h->dispatch.slots);
  free(h->gate), free(h->gate_grad), free(h->identity);
  free(h->counts), free(h->block_counts), free(h->logits), free(h->send_rows), free(h->recv_rows), free(h->peer_counts), free(h);
}

static void to_bf16_values(const loom_moe_shape *s, const loom_ops *ops, float *x, size_t n) {
  if (s->bf16) ops->round_bf16(ops, x, n);
}

/* The rows the experts compute over: block q (one without expert tensor
 * parallelism, else one per rank of the group splitting them) holds rank
 * q's rows from row q x stride, counts[q E + e] of them expert e's. */
typedef struct {
  int blocks;
  int64_t stride;
  const int *counts;
} expert_rows;

static expert_rows rows_of(const loom_moe_host *h, const loom_moe_shape *s) {
  if (s->etp == 1) return (expert_rows){1, h->received, h->counts};
  return (expert_rows){s->etp, h->block_rows, h->block_counts};
}

/* Block q's rows, all experts'. */
static int block_len(const expert_rows *r, int q, int E) {
  int n = 0;
  for (int e = 0; e < E; e++) n += r->counts[(size_t)q * E + e];
  return n;
}

/* The experts' linear over one block's rows: out[M, OC] = each expert's
 * rows of inp[M, C] times its [OC, C] matrix, plus its bias[OC] where bias
 * is not NULL (bf16 runs: the bf16 copy's matrices, one of the backend's
 * bf16 GEMMs per expert with rows; with biases one GEMM per expert too). */
static void block_forward(const loom_ops *ops, float *out, const float *inp, loom_linear_weight w, const float *bias,
                          const int *counts, int E, int C, int OC) {
  if (w.f32 && !bias) {
    ops->grouped_matmul_forward(ops, out, inp, w.f32, counts, E, C, OC);
    return;
  }
  size_t row = 0;
  for (int e = 0; e < E; row += (size_t)counts[e], e++) {
    if (counts[e] == 0) continue;
    const float *b = bias ? bias + (size_t)e * OC : NULL;
    if (w.f32) ops->matmul_forward(ops, out + row * OC, inp + row * C, w.f32 + (size_t)e * OC * C, b, counts[e], C, OC);
    else loom_linear_forward(ops, out + row * OC, loom_bf16_values(inp + row * C),
                             (loom_linear_weight){.bf16 = w.bf16 + (size_t)e * OC * C, .fp8 = w.fp8}, b, counts[e], C, OC);
  }
}

/* Its backward: dinp[M, C] +=, dweight[E][OC, C] += and dbias[E][OC] +=
 * (any NULL: not computed; without dinp the weights are not read and may be
 * absent). */
static void block_backward(const loom_ops *ops, float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                           loom_linear_weight w, const int *counts, int E, int C, int OC, bool bf16) {
  if (!bf16 && !dbias) {
    ops->grouped_matmul_backward(ops, dinp, dweight, dout, inp, w.f32, counts, E, C, OC);
    return;
  }
  size_t row = 0;
  for (int e = 0; e < E; row += (size_t)counts[e], e++) {
    if (counts[e] == 0) continue;
    float *di = dinp ? dinp + row * C : NULL, *dw = dweight ? dweight + (size_t)e * OC * C : NULL;
    float *db = dbias ? dbias + (size_t)e * OC : NULL;
    if (!bf16)
      ops->matmul_backward(ops, di, dw, db, dout + row * OC, inp + row * C, w.f32 ? w.f32 + (size_t)e * OC * C : NULL,
                           counts[e], C, OC);
    else
      loom_linear_backward(ops, di, dw, db, loom_bf16_values(dout + row * OC), loom_bf16_values(inp + row * C),
                           (loom_linear_weight){.bf16 = w.bf16 ? w.bf16 + (size_t)e * OC * C : NULL, .fp8 = w.fp8},
                           counts[e], C, OC);
  }
}

/* The same over every block. */
static void experts_forward(const loom_ops *ops, float *out, const float *inp, loom_linear_weight w, const float *bias,
                            const expert_rows *r, int E, int C, int OC) {
  for (int q = 0; q < r->blocks; q++)
    block_forward(ops, out + q * r->stride * OC, inp + q * r->stride * C, w, bias, r->counts + (size_t)q * E, E, C, OC);
}

static void experts_backward(const loom_ops *ops, float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, loom_linear_weight w, const expert_rows *r, int E, int C, int OC, bool bf16) {
  for (int q = 0; q < r->blocks; q++)
    block_backward(ops, dinp ? dinp + q * r->stride * C : NULL, dweight, dbias, dout + q * r->stride * OC,
                   inp + q * r->stride * C, w, r->counts + (size_t)q * E, E, C, OC, bf16);
}

/* Whether this rank adds the down projection's bias: split over a group, its partial sums reduced, only the
 * group's first rank adds it (and takes its grad), as a row-parallel linear's. */
static bool adds_proj_bias(const loom_moe_shape *shape) { return shape->etp_rank == 0; }

/* The activation (and its bf16 rounding) over every block's rows of fc[., fc width] into act[., f]. */
static void experts_activation(const loom_moe_shape *shape, const loom_ops *ops, float *act, const float *fc,
                               const expert_rows *r) {
  const int f = shape->ffn, fc_w = loom_moe_fc_width(shape);
  for (int q = 0; q < r->blocks; q++) {
    const int rows = block_len(r, q, shape->local_experts);
    float *out = act + q * r->stride * f;
    if (shape->mlp == LOOM_MLP_SWIGLU) ops->swiglu_forward(ops, out, fc + q * r->stride * fc_w, rows, f, shape->glu);
    else ops->gelu_forward(ops, out, fc + q * r->stride * fc_w, (size_t)rows * f);
    to_bf16_values(shape, ops, out, (size_t)rows * f);
  }
}

/* Rounds every block's rows of x[., width] to bf16 values (bf16 runs). */
static void round_blocks(const loom_moe_shape *shape, const loom_ops *ops, float *x, const expert_rows *r, int width) {
  for (int q = 0; q < r->blocks; q++) to_bf16_values(shape, ops, x + q * r->stride * width, (size_t)block_len(r, q, shape->local_experts) * width);
}

/* Expert tensor parallelism: every rank's rows per expert gathered over
 * the group, and the block they are padded to. */
static void plan_blocks(loom_moe_host *h, const loom_moe_shape *shape, loom_comm *etp) {
  const int El = shape->local_experts;
  loom_comm_allgather_typed(etp, h->counts, h->block_counts, (size_t)El, LOOM_DTYPE_I32);
  const expert_rows r = {shape->etp, 0, h->block_counts};
  h->block_rows = 0;
  for (int q = 0; q < shape->etp; q++) h->block_rows = block_len(&r, q, El) > h->block_rows ? block_len(&r, q, El) : h->block_rows;
  LOOM_CHECK(h->block_rows <= shape->recv_rows, "every rank's experts take at most their bound's rows");
}

/* This rank's R rows of src[R, h] gathered with every rank's over the
 * group into all[etp blocks, h], through the scratch's block (zero past R). */
static void gather_blocks(const loom_moe_shape *shape, const loom_moe_scratch *s, loom_comm *etp, float *all, const float *src,
                          int64_t R, int64_t block, const loom_allocator *mem) {
  const size_t h = (size_t)shape->hidden;
  if (src != s->mine) mem->copy(mem, s->mine, src, (size_t)R * h * sizeof(float));
  loom_mem_zero(mem, s->mine + (size_t)R * h, (size_t)(block - R) * h);
  loom_comm_allgather_typed(etp, s->mine, all, (size_t)block * h, LOOM_DTYPE_F32);
}

/* The dispatch of this rank's tokens. With a capacity factor under
 * sequence parallelism the experts keep their choices from the whole
 * micro-batch's (gathered over the group): the plan over every rank's
 * choices decides the drops, this rank's rows are its kept choices. */
static void plan_dispatch(loom_moe_host *h, const loom_moe_shape *shape, loom_comm *group) {
  const int n = shape->n, k = shape->router.topk, ranks = group ? loom_comm_size(group) : 1;
  const loom_moe_routing *r = &h->routing;
  if (!(shape->dispatch.capacity_factor > 0.0) || ranks == 1) {
    loom_moe_dispatch_plan(&shape->dispatch, r->experts, r->weights, n, &h->dispatch);
    return;
  }
  const size_t nk = (size_t)n * k, all = nk * (size_t)ranks;
  int *experts = loom_xmalloc(all * sizeof(int), "dispatch"), *rows = loom_xmalloc(all * sizeof(int), "dispatch");
  int *slots = loom_xmalloc(all * sizeof(int), "dispatch");
  float *weights = loom_xmalloc(all * sizeof(float), "dispatch");
  int64_t *counts = loom_xmalloc((size_t)shape->router.experts * sizeof(int64_t), "dispatch");
  loom_comm_allgather_typed(group, r->experts, experts, nk, LOOM_DTYPE_I32);
  loom_comm_allgather_typed(group, r->weights, weights, nk, LOOM_DTYPE_F32);
  loom_moe_dispatch whole = {.counts = counts, .rows = rows, .slots = slots};
  loom_moe_dispatch_plan(&shape->dispatch, experts, weights, n * ranks, &whole);
  int *mine = experts + nk * (size_t)loom_comm_rank(group);
  const int *kept = slots + nk * (size_t)loom_comm_rank(group);
  for (size_t i = 0; i < nk; i++) mine[i] = kept[i] < 0 ? -1 : mine[i];
  loom_moe_dispatch_config dropless = shape->dispatch;
  dropless.capacity_factor = 0.0;
  loom_moe_dispatch_plan(&dropless, mine, r->weights, n, &h->dispatch);
  free(experts), free(rows), free(slots), free(weights), free(counts);
}

/* Expert parallelism: who sends whom how many rows. Every peer's rows
 * per expert are gathered; this rank sends peer p its rows for p's
 * experts and receives from q q's rows for its own. The rows it receives
 * lie peer by peer, each peer's expert by expert; its experts take them
 * expert by expert, each expert's peer by peer: sort[i] is the received row
 * of expert row i, unsort the inverse. */
static void plan_exchange(loom_moe_host *h, const loom_moe_shape *shape, loom_comm *ep, int *sort, int *unsort) {
  const int P = shape->ep, E = shape->router.experts, El = shape->local_experts, me = shape->ep_rank;
  loom_comm_allgather_typed(ep, h->dispatch.counts, h->peer_counts, (size_t)E, LOOM_DTYPE_I64);
  const int64_t *mine = h->peer_counts + (size_t)me * E;
  for (int p = 0; p < P; p++) {
    h->send_rows[p] = h->recv_rows[p] = 0;
    for (int j = 0; j < El; j++) {
      h->send_rows[p] += (size_t)mine[p * El + j];
      h->recv_rows[p] += (size_t)h->peer_counts[(size_t)p * E + me * El + j];
    }
  }
  int64_t at = 0;
  for (int j = 0; j < El; j++) {
    int64_t rows = 0;
    for (int q = 0, base = 0; q < P; base += (int)h->recv_rows[q], q++) {
      int64_t offset = base; /* expert j's rows from peer q: after q's rows for this rank's earlier experts */
      for (int i = 0; i < j; i++) offset += h->peer_counts[(size_t)q * E + me * El + i];
      const int64_t n = h->peer_counts[(size_t)q * E + me * El + j];
      for (int64_t r = 0; r < n; r++) sort[at + rows + r] = (int)(offset + r);
      rows += n;
    }
    h->counts[j] = (int)rows;
    at += rows;
  }
  h->received = at;
  LOOM_CHECK(at <= shape->recv_rows, "an expert-parallel rank takes at most its bound's rows");
  for (int64_t i = 0; i < at; i++) unsort[sort[i]] = (int)i;
}

/* Rows of width h between the EP group's ranks: send's rows to each peer
 * (send_rows), recv's from each (recv_rows); bf16 runs move their bf16
 * values as bf16. */
static void exchange(const loom_moe_shape *shape, const loom_moe_scratch *s, loom_comm *ep, float *recv, const float *send,
                     const size_t *send_rows, const size_t *recv_rows, const loom_ops *ops) {
  const int P = shape->ep, h = shape->hidden;
  size_t sc[P], rc[P], out = 0, in = 0;
  for (int p = 0; p < P; p++) sc[p] = send_rows[p] * (size_t)h, rc[p] = recv_rows[p] * (size_t)h, out += sc[p], in += rc[p];
  if (!shape->bf16) {
    loom_comm_alltoallv_typed(ep, send, sc, recv, rc, LOOM_DTYPE_F32);
    return;
  }
  ops->to_bf16(ops, s->wire, send, out);
  loom_comm_alltoallv_typed(ep, s->wire, sc, s->wire2, rc, LOOM_DTYPE_BF16);
  ops->from_bf16(ops, recv, s->wire2, in);
}

void loom_moe_forward(loom_moe_acts *a, const loom_moe_scratch *s, float *out, const float *x, const loom_moe_weights *w,
                      const loom_moe_shape *shape, loom_moe_groups g, const loom_ops *ops) {
  const int n = shape->n, h = shape->hidden, E = shape->router.experts, k = shape->router.topk, f = shape->ffn;
  const int fc = loom_moe_fc_width(shape), El = shape->local_experts;
  const loom_allocator *mem = ops->mem;
  loom_moe_host *host = a->host;
  if (a->x != x) mem->copy(mem, a->x, x, (size_t)n * h * sizeof(float));
  /* The router, in fp32; its choices and the dispatch on the host. */
  ops->matmul_forward(ops, a->logits, a->x, w->router, w->router_b, n, h, E);
  mem->to_host(mem, host->logits, a->logits, (size_t)n * E * sizeof(float));
  loom_moe_routing *r = &host->routing;
  loom_moe_router router = shape->router;
  router.expert_bias = w->expert_bias;
  loom_moe_route(&router, host->logits, n, r);
  const int ranks = loom_comm_size(g.seq);
  if (ranks > 1) { /* the load-balancing loss counts the whole micro-batch's choices */
    loom_comm_allreduce_typed(g.seq, r->aux_load, (size_t)E, LOOM_DTYPE_I64, LOOM_REDUCE_SUM);
    loom_moe_route_losses(&shape->router, (int64_t)n * ranks, r);
  }
  plan_dispatch(host, shape, g.seq);
  const loom_moe_dispatch *d = &host->dispatch;
  const int M = (int)d->rows_total;
  mem->from_host(mem, a->weights, r->weights, (size_t)n * k * sizeof(float));
  mem->from_host(mem, a->slots, d->slots, (size_t)n * k * sizeof(int));
  if (M > 0) mem->from_host(mem, a->rows, d->rows, (size_t)M * sizeof(int));
  /* The rows into this rank's experts' order: in place without expert parallelism, else through the group; under
   * expert tensor parallelism gathered with the rest of the group's after. */
  const bool split = shape->etp > 1;
  float *mine = split ? s->mine : a->perm;
  int R = M;
  if (shape->ep == 1) {
    host->received = M;
    for (int e = 0; e < E; e++) host->counts[e] = (int)d->counts[e];
    ops->rows_gather(ops, mine, a->x, a->rows, M, h);
  } else {
    int *sort = loom_xmalloc(2 * (size_t)shape->recv_rows * sizeof(int) + 1, "expert rows"), *unsort = sort + shape->recv_rows;
    plan_exchange(host, shape, g.ep, sort, unsort);
    R = (int)host->received;
    if (R > 0) mem->from_host(mem, a->sort, sort, (size_t)R * sizeof(int)), mem->from_host(mem, a->unsort, unsort, (size_t)R * sizeof(int));
    free(sort);
    ops->rows_gather(ops, s->send, a->x, a->rows, M, h);
    exchange(shape, s, g.ep, s->recv, s->send, host->send_rows, host->recv_rows, ops);
    ops->rows_gather(ops, mine, s->recv, a->sort, R, h);
  }
  if (split) {
    plan_blocks(host, shape, g.etp);
    gather_blocks(shape, s, g.etp, a->perm, mine, R, host->block_rows, mem);
  }
  /* The experts over their rows (split: their slices over every rank's, the partial sums reduce-scattered home). */
  const expert_rows rows = rows_of(host, shape);
  float *y = shape->ep == 1 ? a->y : s->recv, *partial = split ? s->part : y;
  if (split) loom_mem_zero(mem, s->part, (size_t)(rows.blocks * rows.stride) * h);
  experts_forward(ops, a->fc, a->perm, w->fc, w->fc_b, &rows, El, h, fc);
  round_blocks(shape, ops, a->fc, &rows, fc);
  experts_activation(shape, ops, a->act, a->fc, &rows);
  experts_forward(ops, partial, a->act, w->proj, adds_proj_bias(shape) ? w->proj_b : NULL, &rows, El, f, h);
  if (split) loom_comm_reduce_scatter(g.etp, s->part, y, (size_t)rows.stride * h);
  to_bf16_values(shape, ops, y, (size_t)R * h);
  if (shape->ep > 1) { /* back in arrival order, and home */
    ops->rows_gather(ops, s->recv2, s->recv, a->unsort, R, h);
    exchange(shape, s, g.ep, a->y, s->recv2, host->recv_rows, host->send_rows, ops);
  }
  ops->rows_combine(ops, out, a->y, a->slots, a->weights, n, k, h);
  to_bf16_values(shape, ops, out, (size_t)n * h);
}

void loom_moe_backward_weight(const loom_moe_grads *dw, const loom_moe_acts *a, const loom_moe_wgrad *ws,
                              const loom_moe_shape *shape, loom_fp8_site *fp8_fc, loom_fp8_site *fp8_proj,
                              const loom_ops *ops) {
  const int n = shape->n, h = shape->hidden, E = shape->router.experts, f = shape->ffn, El = shape->local_experts;
  /* the input grads are done: no weights read */
  const loom_linear_weight fc = {.fp8 = fp8_fc}, proj = {.fp8 = fp8_proj};
  const expert_rows rows = rows_of(a->host, shape);
  experts_backward(ops, NULL, dw->proj, adds_proj_bias(shape) ? dw->proj_b : NULL, ws->d_y, a->act, proj, &rows, El, f, h,
                   shape->bf16);
  experts_backward(ops, NULL, dw->fc, dw->fc_b, ws->d_fc, a->perm, fc, &rows, El, h, loom_moe_fc_width(shape), shape->bf16);
  ops->matmul_backward(ops, NULL, dw->router, dw->router_b, ws->d_logits, a->x, NULL, n, h, E);
}

void loom_moe_backward(float *dx, const loom_moe_grads *dw, const float *dout, const loom_moe_acts *a,
                       const loom_moe_scratch *s, const loom_moe_weights *w, const loom_moe_shape *shape,
                       float loss_weight, loom_moe_groups g, const loom_moe_wgrad *ws, const loom_ops *ops) {
  const int n = shape->n, h = shape->hidden, E = shape->router.experts, k = shape->router.topk, f = shape->ffn;
  const int fc = loom_moe_fc_width(shape), El = shape->local_experts;
  const loom_allocator *mem = ops->mem;
  const loom_moe_host *host = a->host;
  const int M = (int)host->dispatch.rows_total, R = (int)host->received;
  /* The combine: each row's grad, and each choice's weight's; sent to the rows' experts. */
  ops->rows_combine_backward(ops, s->d_y, s->d_weights, dout, a->y, a->slots, a->weights, n, k, h);
  to_bf16_values(shape, ops, s->d_y, (size_t)M * h);
  /* This rank's experts' rows' grads, expert by expert (a split backward keeps them for the weight half); under
   * expert tensor parallelism gathered with the rest of the group's. */
  const bool split = shape->etp > 1;
  const expert_rows rows = rows_of(host, shape);
  const size_t X = (size_t)(rows.blocks * rows.stride);
  float *d_y = split ? s->mine : ws ? ws->d_y : shape->ep > 1 ? s->recv2 : s->d_y;
  if (shape->ep > 1) {
    exchange(shape, s, g.ep, s->recv, s->d_y, host->send_rows, host->recv_rows, ops);
    ops->rows_gather(ops, d_y, s->recv, a->sort, R, h);
  } else if (d_y != s->d_y) {
    mem->copy(mem, d_y, s->d_y, (size_t)R * h * sizeof(float));
  }
  if (split) {
    float *all = ws ? ws->d_y : s->part;
    gather_blocks(shape, s, g.etp, all, d_y, R, rows.stride, mem);
    d_y = all;
  }
  /* The experts, down then up (a split backward leaves their weight grads for the weight half). */
  loom_mem_zero(mem, s->d_act, X * f);
  experts_backward(ops, s->d_act, ws ? NULL : dw->proj, ws || !adds_proj_bias(shape) ? NULL : dw->proj_b, d_y, a->act, w->proj,
                   &rows, El, f, h, shape->bf16);
  round_blocks(shape, ops, s->d_act, &rows, f);
  float *d_up = ws ? ws->d_fc : s->d_fc;
  loom_mem_zero(mem, d_up, X * fc);
  for (int q = 0; q < rows.blocks; q++) {
    const size_t at = (size_t)(q * rows.stride), n_q = (size_t)block_len(&rows, q, El);
    if (shape->mlp == LOOM_MLP_SWIGLU)
      ops->swiglu_backward(ops, d_up + at * fc, s->d_act + at * f, a->fc + at * fc, (int)n_q, f, shape->glu);
    else ops->gelu_backward(ops, d_up + at * fc, s->d_act + at * f, a->fc + at * fc, n_q * f);
  }
  round_blocks(shape, ops, d_up, &rows, fc);
  loom_mem_zero(mem, s->d_perm, X * h);
  experts_backward(ops, s->d_perm, ws ? NULL : dw->fc, ws ? NULL : dw->fc_b, d_up, a->perm, w->fc, &rows, El, h, fc,
                   shape->bf16);
  float *d_perm = s->d_perm; /* split: the partial sums reduce-scattered home */
  if (split) loom_comm_reduce_scatter(g.etp, s->d_perm, d_perm = s->mine, (size_t)rows.stride * h);
  to_bf16_values(shape, ops, d_perm, (size_t)R * h);
  /* Home again (expert parallelism), then the gather's backward: each token's rows summed (a combine without weights). */
  const float *d_rows = d_perm;
  if (shape->ep > 1) {
    ops->rows_gather(ops, s->recv, d_perm, a->unsort, R, h);
    exchange(shape, s, g.ep, s->d_y, s->recv, host->recv_rows, host->send_rows, ops);
    d_rows = s->d_y;
  }
  ops->rows_combine(ops, s->d_x, d_rows, a->slots, NULL, n, k, h);
  /* The router: the weights' grads and the losses' through its backward, on the host. */
  float *d_choice = s->host, *dlogits = s->host + (size_t)n * k;
  mem->to_host(mem, d_choice, s->d_weights, (size_t)n * k * sizeof(float));
  loom_moe_route_backward(&shape->router, host->logits, n, (int64_t)n * loom_comm_size(g.seq), &host->routing, d_choice,
                          loss_weight, loss_weight, dlogits);
  float *d_logits = ws ? ws->d_logits : s->d_logits;
  mem->from_host(mem, d_logits, dlogits, (size_t)n * E * sizeof(float));
  ops->matmul_backward(ops, s->d_x, ws ? NULL : dw->router, ws ? NULL : dw->router_b, d_logits, a->x, w->router, n, h, E);
  to_bf16_values(shape, ops, s->d_x, (size_t)n * h);
  ops->add(ops, dx, dx, s->d_x, (size_t)n * h);
}

void loom_moe_gate_forward(loom_moe_acts *a, const loom_moe_scratch *s, float *shared, const float *w,
                           const loom_moe_shape *shape, const loom_ops *ops) {
  const int n = shape->n, h = shape->hidden;
  const loom_allocator *mem = ops->mem;
  loom_moe_host *host = a->host;
  mem->copy(mem, a->shared, shared, (size_t)n * h * sizeof(float));
  ops->matmul_forward(ops, s->gate_d, a->x, w, NULL, n, h, 1);
  mem->to_host(mem, host->gate, s->gate_d, (size_t)n * sizeof(float));
  for (int i = 0; i < n; i++) host->gate[i] = (float)(1.0 / (1.0 + exp(-(double)host->gate[i])));
  mem->from_host(mem, a->gate, host->gate, (size_t)n * sizeof(float));
  mem->from_host(mem, s->gate_rows, host->identity, (size_t)n * sizeof(int));
  ops->rows_combine(ops, shared, a->shared, s->gate_rows, a->gate, n, 1, h);
  to_bf16_values(shape, ops, shared, (size_t)n * h);
}

void loom_moe_gate_backward(float *d_shared, const float *dout, const loom_moe_acts *a, const loom_moe_scratch *s,
                            const loom_moe_shape *shape, const loom_ops *ops) {
  const int n = shape->n, h = shape->hidden;
  const loom_allocator *mem = ops->mem;
  loom_moe_host *host = a->host;
  mem->from_host(mem, s->gate_rows, host->identity, (size_t)n * sizeof(int));
  ops->rows_combine_backward(ops, d_shared, s->gate_d, dout, a->shared, s->gate_rows, a->gate, n, 1, h);
  to_bf16_values(shape, ops, d_shared, (size_t)n * h);
  /* d logit = d gate x gate (1 - gate), on the host as the router's are, with the forward's gates. */
  mem->to_host(mem, host->gate_grad, s->gate_d, (size_t)n * sizeof(float));
  for (int i = 0; i < n; i++) host->gate_grad[i] *= host->gate[i] * (1.0f - host->gate[i]);
  mem->from_host(mem, s->gate_d, host->gate_grad, (size_t)n * sizeof(float));
}

void loom_moe_gate_backward_weights(float *dx, float *dw, const loom_moe_acts *a, const loom_moe_scratch *s, const float *w,
                                    const loom_moe_shape *shape, const loom_ops *ops) {
  ops->matmul_backward(ops, dx, dw, NULL, s->gate_d, a->x, w, shape->n, shape->hidden, 1);
}
