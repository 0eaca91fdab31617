/* The cost model's per-action costs. */
#include <math.h>
#include <string.h>
#include <stdlib.h>
#include "core/check.h"
#include "layers/gpt.h"
#include "plan/rank_sheet.h"
#include "sim/cost.h"

int loom_group_per_node(int n, int stride, int devices_per_node) {
  if (stride >= devices_per_node) return 1;
  const int fit = (devices_per_node + stride - 1) / stride;
  return n < fit ? n : fit;
}

/* A link's curve for a kind of collective, or NULL (LOOM_COLL_KINDS: none asked). */
static const Loom__CollectiveCurve *curve_of(const Loom__Link *l, loom_collective kind) {
  for (size_t i = 0; i < l->n_collective; i++)
    if ((int)l->collective[i]->kind == (int)kind) return l->collective[i];
  return NULL;
}

/* A link's bus bandwidth (bytes/s per device) and latency step (s) for a kind: its curve's, else its own. */
static void link_rate(const Loom__Link *l, loom_collective kind, double *bw, double *latency) {
  const Loom__CollectiveCurve *c = curve_of(l, kind);
  *bw = (c ? c->bus_gbs : l->bandwidth_gbs * l->efficiency) * 1e9;
  *latency = (c ? c->latency_us : l->latency_us) * 1e-6;
}

/* The bus bandwidth (bytes/s) and per-step latency (s) of a kind of
 * collective over a group of n ranks, per_node in each node. */
static void group_link(const loom_profile *prof, loom_collective kind, int n, int per_node, double *bw, double *latency) {
  link_rate(prof->intra_node, kind, bw, latency);
  if (per_node < n) {
    /* Between nodes each member of a node sends through its own adapter (one per
     * device, each on its rail), so a node's members add their bandwidth, up to
     * what the intra-node link can feed them. */
    const double intra_bw = *bw;
    link_rate(prof->inter_node, kind, bw, latency);
    *bw = fmin(*bw * per_node, intra_bw);
  }
}

double loom_collective_latency_steps(loom_collective kind, int n) {
  switch (kind) {
  case LOOM_COLL_ALLREDUCE: return fmin(2.0 * (n - 1), 2.0 * ceil(log2(n)));
  case LOOM_COLL_ALLGATHER:
  case LOOM_COLL_REDUCE_SCATTER: return n - 1;
  default: return 1.0;
  }
}

double loom_collective_seconds(const loom_profile *prof, loom_collective kind, double bytes, int n, int per_node,
                               double *sent) {
  if (sent) *sent = 0.0;
  if (n < 2 || bytes <= 0.0) return 0.0;
  double bw, latency;
  group_link(prof, kind, n, per_node, &bw, &latency);
  const double factor = loom_collective_factor(kind, n);
  if (sent) *sent = factor * bytes;
  return factor * bytes / bw + loom_collective_latency_steps(kind, n) * latency;
}

/* What a layout puts where: the sizes one rank works on. */
typedef struct {
  const loom_plan *plan;
  const loom_profile *prof;
  loom_gpt_config cfg;
  Loom__Precision precision;
  Loom__Precision linear; /* the linear layers' GEMMs: the precision's, or fp8 under --fp8-format */
  loom_fp8_recipe fp8_recipe; /* and how fp8 scales them */
  double e;            /* bytes of an activation value */
  double f32;          /* bytes of an fp32 value (grads, the loss's statistics, what crosses ranks in fp32) */
  double s, b, tokens; /* sequence, micro-batch, tokens of a micro-batch one rank holds (s / cp of each sequence) */
  double sq;           /* the queries of a sequence one rank holds: s, or s / cp under context parallelism */
  double rows;         /* tokens whose hidden vectors one rank holds in elementwise ops (1/tp under SP) */
  int tp, dp, pp; /* dp: the ranks summing a rank's grads, dp x cp */
  bool sp;
  int tp_per_node, dp_per_node;
  int ep, ep_per_node; /* a MoE model's expert-parallel group: ep consecutive ranks of a stage */
  int etp;             /* 1, or tp: the tp group splitting each expert */
  int cp, cp_per_node; /* the context-parallel group: cp ranks tp apart */
  bool cp_all_gather;  /* its keys and values all-gathered, not passed round a ring */
  double overhead; /* seconds per op */
  bool tp_overlap; /* the plan's --tp-comm-overlap */
  double slowdown; /* the extra time compute takes per second it runs beside a collective (overlap_sm_share's) */
  double moe_imbalance; /* loom_sim_assumptions' moe_rank_imbalance */
} layout;

typedef struct {
  double compute, comm; /* seconds */
  double tp_bytes;      /* sent */
  double etp_bytes;     /* sent over the tp group's ranks splitting the experts (counted apart from tp_bytes) */
  double cp_bytes;      /* sent round the context-parallel ring */
  double bytes;         /* moved by its memory-bound ops */
} pass;

/* Memory-bound ops over `bytes`, read and written: their time, and the bytes. */
static void stream(const layout *L, pass *x, double bytes) {
  x->compute += loom_profile_memory_seconds(L->prof, bytes);
  x->bytes += bytes;
}

static double gemm(const layout *L, Loom__Precision dtype, double m, double n, double k, double batch) {
  return loom_profile_gemm_seconds(L->prof, dtype, m, n, k, batch);
}
/* A GEMM's backward: the input's grad (m x k over n) and the weight's (n x k over m). */
static double gemm_backward(const layout *L, Loom__Precision dtype, double m, double n, double k, double batch) {
  return gemm(L, dtype, m, k, n, batch) + gemm(L, dtype, n, k, m, batch);
}

/* Under --fp8-format, the passes Transformer Engine adds to a linear layer's fp8 GEMMs (m rows, n outputs, k
 * inputs), by recipe. Delayed scaling: forward, its bf16 input read (2 bytes) and written in fp8 (1), unless the
 * kernel before it writes fp8 itself (a norm fused with the linear, as TE's LayerNormLinear: `fused_input`);
 * backward, its output's grad read and written in fp8 twice, as it is and transposed for the weight grad.
 * Tensorwise (current) scaling reads each operand once more first, for its amax (2 bytes an element), and a
 * fused norm cannot cast before the amax is known. Blockwise and MXFP8 scale each block as they cast (no amax
 * pass) but write the input twice, tiled along each of its dimensions (the weight grad's copy is not the
 * transpose of the forward's); their scales, a 32nd of the codes at most, are left out. */
static void fp8_casts(const layout *L, pass *f, pass *g, double m, double n, double k, double batch, bool fused_input) {
  if (L->linear != LOOM__PRECISION__PRECISION_FP8) return;
  const bool current = L->fp8_recipe == LOOM_FP8_RECIPE_TENSORWISE;
  const bool blocks = L->fp8_recipe == LOOM_FP8_RECIPE_BLOCKWISE || L->fp8_recipe == LOOM_FP8_RECIPE_MXFP8;
  if (!fused_input || current) stream(L, f, 3.0 * m * k * batch);
  if (current) stream(L, f, 2.0 * m * k * batch), stream(L, g, 2.0 * m * n * batch);
  if (blocks) stream(L, f, 1.0 * m * k * batch);
  stream(L, g, 4.0 * m * n * batch); /* one byte each: read and written twice */
}

/* A GEMM's forward, backward and the weight grad's share of it (as long as the forward), in dtype. */
static void gemm_costs(const layout *L, Loom__Precision dtype, pass *f, pass *g, pass *w, double m, double n, double k,
                       double batch) {
  f->compute += gemm(L, dtype, m, n, k, batch);
  g->compute += gemm_backward(L, dtype, m, n, k, batch);
  w->compute += gemm(L, dtype, m, n, k, batch);
}

/* A linear layer's GEMMs in the linear layers' dtype, with fp8's casts. */
static void linear_costs(const layout *L, pass *f, pass *g, pass *w, double m, double n, double k, double batch) {
  gemm_costs(L, L->linear, f, g, w, m, n, k, batch);
  fp8_casts(L, f, g, m, n, k, batch, false);
}

/* A collective of `comm` seconds run beside compute of `compute` seconds:
 * what the compute cannot hide, plus the compute's slowdown while the two
 * share the device. */
static double beside(const layout *L, double comm, double compute) {
  const double hidden = fmin(comm, compute);
  return comm - hidden + L->slowdown * hidden;
}

static void tp_collective(const layout *L, pass *x, loom_collective kind, double bytes) {
  double sent;
  x->comm += loom_collective_seconds(L->prof, kind, bytes, L->tp, L->tp_per_node, &sent);
  x->tp_bytes += sent;
}

/* The same over the ranks splitting the experts (the tp group's), counted apart. */
static void etp_collective(const layout *L, pass *x, loom_collective kind, double bytes) {
  double sent;
  x->comm += loom_collective_seconds(L->prof, kind, bytes, L->etp, L->tp_per_node, &sent);
  x->etp_bytes += sent;
}

/* A block's entry or exit across the tp group: an all-reduce, or under SP
 * the all-gather or reduce-scatter that moves the same bytes; with
 * --tp-comm-overlap run beside the GEMM of `gemm` seconds that consumes or
 * produces it. */
static void tp_exchange(const layout *L, pass *x, loom_collective sp_kind, double gemm) {
  pass alone = {0};
  tp_collective(L, &alone, L->sp ? sp_kind : LOOM_COLL_ALLREDUCE, L->tokens * L->cfg.hidden * L->e);
  x->comm += L->tp_overlap ? beside(L, alone.comm, gemm) : alone.comm;
  x->tp_bytes += alone.tp_bytes;
}

/* An all-to-all-v over the expert-parallel group moving `bytes` of rows,
 * spread evenly: each rank keeps 1/ep of them and sends the rest. */
static void ep_exchange(const layout *L, pass *x, double bytes) {
  if (L->ep < 2) return;
  double bw, latency;
  group_link(L->prof, LOOM_COLL_KINDS, L->ep, L->ep_per_node, &bw, &latency); /* no curve for all-to-all: the link's own */
  x->comm += bytes * (L->ep - 1.0) / L->ep / bw + (L->ep - 1.0) * latency;
}

/* A Mixture-of-Experts MLP as the runtime runs it (layers/moe.c) on the
 * tokens the rank routes (its share under SP, else all of them): the
 * router's GEMM, each of its E / ep experts' GEMMs over its rows (the load
 * the sim states: for a dropless run the assumed imbalance times an even
 * share of the group's choices, the busiest rank's, which every rank waits
 * for; with a capacity factor C, C times that share, the busiest expert at
 * its capacity, which bounds an uneven routing and is what Megatron pads
 * every expert to), the rows' gather and combine and the activation between
 * the GEMMs, under expert parallelism the rows' all-to-alls there and back
 * in each pass (a dropless run's busiest rank receiving its load's rows),
 * and under SP or cp the load-balancing counts summed over the ranks
 * sharing the micro-batch (with a capacity factor also every rank's
 * choices gathered). Under expert tensor
 * parallelism each rank runs every rank's rows through its slice of the
 * experts: the rows (fp32) all-gathered and the partial sums
 * reduce-scattered in each pass, with the counts gathered first. The
 * router's and the experts' weight-grad GEMMs are W work, as the dense
 * linears'. */
static void moe_costs(const layout *L, pass *f, pass *g, pass *w) {
  const loom_gpt_config *c = &L->cfg;
  const double E = c->moe.experts, El = loom_gpt_local_experts(c), k = c->moe.topk, n = L->rows, h = c->hidden;
  const double fe = loom_gpt_local_expert_ffn(c), e = L->e, etp = L->etp;
  /* each expert's rows from the whole group (and from every rank splitting the experts) */
  const bool dropless = c->moe.capacity_factor <= 0.0;
  const double load = dropless ? L->moe_imbalance : c->moe.capacity_factor;
  const double up = loom_mlp_fc_factor(c->mlp) * fe, r = load * etp * n * k / El;
  const double shapes[][4] = {{r, up, h, El}, {r, h, fe, El}};
  gemm_costs(L, L->precision, f, g, w, n, E, h, 1); /* the router's, in the run's precision (not a Transformer Engine linear) */
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    linear_costs(L, f, g, w, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3]);
  const double bytes = 2.0 * n * k * h * e + (n * k + n) * h * e + (up + fe) * n * k * e;
  stream(L, f, bytes);
  stream(L, g, 2.0 * bytes);
  f->compute += 6.0 * L->overhead;
  g->compute += 8.0 * L->overhead;
  const double exchanged = (dropless ? load : 1.0) * n * k * h * e;
  for (int i = 0; i < 2; i++) ep_exchange(L, f, exchanged), ep_exchange(L, g, exchanged);
  if (L->etp > 1) { /* the gathered buffers: a block of each rank's n k rows (its counts first) */
    etp_collective(L, f, LOOM_COLL_ALLGATHER, etp * El * L->f32);
    for (int i = 0; i < 2; i++) {
      pass *x = i ? g : f;
      etp_collective(L, x, LOOM_COLL_ALLGATHER, etp * n * k * h * L->f32);
      etp_collective(L, x, LOOM_COLL_REDUCE_SCATTER, etp * n * k * h * L->f32);
    }
  }
  /* The load-balancing counts summed over the ranks sharing the micro-batch: the tp group's under SP, the cp group's,
   * or both together (a group of its own, counted in neither's traffic; tp fastest, so its ranks are consecutive). */
  if (L->cp > 1 && L->sp) {
    const int ranks = L->tp * L->cp;
    f->comm += loom_collective_seconds(L->prof, LOOM_COLL_ALLREDUCE, 8.0 * E, ranks,
                                       loom_group_per_node(ranks, 1, L->prof->devices_per_node), NULL);
  } else if (L->cp > 1) {
    double sent;
    f->comm += loom_collective_seconds(L->prof, LOOM_COLL_ALLREDUCE, 8.0 * E, L->cp, L->cp_per_node, &sent);
    f->cp_bytes += sent;
  }
  if (!L->sp || L->cp > 1) return;
  tp_collective(L, f, LOOM_COLL_ALLREDUCE, 8.0 * E);
  if (c->moe.capacity_factor > 0.0) /* every rank's choices (the plan refuses a capacity factor under cp) */
    for (int i = 0; i < 2; i++) tp_collective(L, f, LOOM_COLL_ALLGATHER, L->tokens * k * L->f32);
}

/* Context parallelism's ring as layers/ring_attention.c runs it, given a
 * layer's attention compute forward and backward (att_f, att_g): forward,
 * the cp - 1 blocks of keys and values (fp32, the rank's rows of its kv
 * heads) hop round the cp group, each hop posted before the block before
 * it computes, so only what outlasts a block's share of the attention is
 * exposed (all of it where the profile's communication does not overlap
 * compute); backward, beside each block's compute the next block and the
 * sum of the grads before it travel (both on the same link: one hop, then
 * cp - 2 steps of two, then the last sum's one), and the last sum's hop
 * home is waited for. The all-gather variant waits for every block
 * gathered in each pass and, backward, for the grads' reduce-scatter. */
static void ring_costs(const layout *L, pass *f, pass *g, double att_f, double att_g) {
  if (L->cp < 2) return;
  const double block = L->tokens * loom_gpt_local_kv_heads(&L->cfg, L->tp) *
                       (loom_gpt_qk_head_dim(&L->cfg) + loom_gpt_v_head_dim(&L->cfg)) * L->f32;
  if (L->cp_all_gather) {
    double gathered, scattered;
    const double gather = loom_collective_seconds(L->prof, LOOM_COLL_ALLGATHER, L->cp * block, L->cp, L->cp_per_node, &gathered);
    const double scatter =
        loom_collective_seconds(L->prof, LOOM_COLL_REDUCE_SCATTER, L->cp * block, L->cp, L->cp_per_node, &scattered);
    f->comm += gather, g->comm += gather + scatter;
    f->cp_bytes += gathered, g->cp_bytes += gathered + scattered;
    return;
  }
  const double hop = loom_collective_seconds(L->prof, LOOM_COLL_SENDRECV, block, 2, L->cp_per_node < L->cp ? 1 : 2, NULL);
  const bool overlaps = L->prof->comm_overlaps_compute;
  const double cp = L->cp, hidden_f = overlaps ? att_f / cp : 0.0, hidden_g = overlaps ? att_g / cp : 0.0;
  f->comm += (cp - 1.0) * beside(L, hop, hidden_f);
  g->comm += 2.0 * beside(L, hop, hidden_g) + (cp - 2.0) * beside(L, 2.0 * hop, hidden_g) + hop;
  f->cp_bytes += (cp - 1.0) * block;
  g->cp_bytes += (2.0 * cp - 1.0) * block;
}

/* The kinds of layer whose costs differ: dense or MoE (bit 0), attending in full or windowed (bit 1). */
enum { SIM_LAYER_KINDS = 4 };
static int sim_layer_kind(const loom_gpt_config *c, int l) {
  return (loom_gpt_layer_is_moe(c, l) ? 1 : 0) + (loom_gpt_layer_window(c, l) > 0 ? 2 : 0);
}

/* One transformer layer for one micro-batch, a MoE layer or a dense one, windowed or not (window 0):
 * forward into f, backward (without recompute) into g; w: the part of g
 * that is its weight-grad GEMMs (each the FLOPs of its forward GEMM). */
static void layer_costs(const layout *L, bool moe, int window, pass *f, pass *g, pass *w) {
  const loom_gpt_config *c = &L->cfg;
  const double t = L->tp, h = c->hidden, hd = loom_gpt_qk_head_dim(c), vd = loom_gpt_v_head_dim(c), heads = c->heads / t;
  const double kv = loom_gpt_local_kv_heads(c, L->tp), ffn = (moe ? c->moe.shared_ffn : c->ffn) / t, T = L->tokens, s = L->s;
  const double sq = L->sq; /* a rank's queries meet every key of the sequence */
  const double up = loom_mlp_fc_factor(c->mlp) * ffn, e = L->e;
  /* GEMMs: q|k|v, scores and values per head, the output projection, the MLP's two. */
  const double shapes[][4] = {
      {T, (heads + kv) * hd + kv * vd, h, 1}, {sq, s, hd, L->b * heads}, {sq, vd, s, L->b * heads},
      {T, h, heads * vd, 1},                  {T, up, h, 1},             {T, h, ffn, 1},
  };
  /* MLA's projections in q|k|v's place, each its own GEMM: the down projections (every tp rank's whole, on its rows:
   * its sequence shard under SP), then q's and kv's up projections (this rank's heads). */
  double mla[3][4] = {{0}};
  const int mla_gemms = loom_gpt_is_mla(c) ? 3 : 0;
  if (mla_gemms) {
    const loom_mla_config *a = &c->mla;
    const double rows = L->sp ? T / t : T, down = a->q_lora_rank + a->kv_lora_rank + a->qk_pos_emb_head_dim;
    const double gemms[3][4] = {{rows, down, h, 1},
                                {T, heads * hd, a->q_lora_rank ? a->q_lora_rank : h, 1},
                                {T, heads * (a->qk_head_dim + vd), a->kv_lora_rank, 1}};
    memcpy(mla, gemms, sizeof mla);
  }
  const Loom__DeviceProfile *dev = L->prof->device;
  const bool fused = dev->has_attention_efficiency; /* a fused kernel: scores, softmax, dropout and values at its own rate */
  double att_f = 0.0, att_g = 0.0; /* the attention's own compute (what the ring's hops hide behind) */
  double fw[6] = {0}, bw[6] = {0};  /* each GEMM's, forward and backward (what --tp-comm-overlap hides behind) */
  /* Under --tp-comm-overlap Transformer Engine's userbuffers split the GEMMs beside an exchange along their rows
   * (its defaults): ring exchange in tp chunks for q|k|v's and fc1's forwards and the projection's and fc2's input
   * grads; a pipeline of 4 for the projection's and fc2's forwards; q|k|v's and fc1's grads overlap in bulk, whole.
   * Each chunk is a GEMM of its own rows, at the curve's rate for them. MLA's projections are left whole. */
  const int tp = L->tp_overlap && !mla_gemms ? L->tp : 1, pipeline = L->tp_overlap && !mla_gemms ? 4 : 1;
  const int split_f[6] = {tp, 1, 1, pipeline, tp, pipeline}, split_g[6] = {1, 1, 1, tp, 1, tp};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    if ((fused && (i == 1 || i == 2)) || (i >= 4 && ffn == 0.0)) continue; /* a MoE layer without a shared expert */
    const bool attention = i == 1 || i == 2; /* the scores and values: never fp8 (nor are they under Transformer Engine) */
    const Loom__Precision dtype = attention ? L->precision : L->linear;
    const int parts = i == 0 && mla_gemms ? mla_gemms : 1;
    double whole = 0.0; /* the forward unsplit: the weight grad's share */
    for (int j = 0; j < parts; j++) {
      const double *x = parts > 1 ? mla[j] : shapes[i];
      fw[i] += split_f[i] * gemm(L, dtype, x[0] / split_f[i], x[1], x[2], x[3]);
      whole += gemm(L, dtype, x[0], x[1], x[2], x[3]);
      bw[i] += split_g[i] * gemm(L, dtype, x[0] / split_g[i], x[2], x[1], x[3]) + gemm(L, dtype, x[1], x[2], x[0], x[3]);
      if (!attention) fp8_casts(L, f, g, x[0], x[1], x[2], x[3], (i == 0 && j == 0) || i == 4);
    }
    f->compute += fw[i], g->compute += bw[i];
    if (!attention) w->compute += whole;
    else att_f += fw[i], att_g += bw[i];
  }
  if (fused) { /* a causal kernel skips the masked half of the score tiles (FlashAttention's, cuDNN's), and a windowed
                * one every tile outside the window */
    const double keys = L->cp > 1 && !L->cp_all_gather ? s / L->cp : s; /* what one kernel's queries meet */
    const double length = dev->has_attention_half_seq ? keys / (keys + dev->attention_half_seq) : 1.0;
    const double share = loom_attention_keys((int)s, window) / s; /* the window's share of the causal pairs */
    const double flops = L->b * heads * sq * s * (hd + vd) * share; /* scores over q's width, values over v's */
    const double rate = loom_profile_peak_flops(L->prof, L->precision) * dev->attention_efficiency * length;
    att_f += flops / rate, att_g += 2.0 * flops / rate;
    f->compute += flops / rate;
    g->compute += 2.0 * flops / rate;
  }
  ring_costs(L, f, g, att_f, att_g);
  /* Memory-bound ops, read and write: two norms, two bias-dropout-residual adds
   * (with a byte of mask each under dropout), the fused scale-mask-softmax and
   * the attention dropout, the activation, RoPE's turn of q and k. */
  const double hidden_values = L->rows * h, drop = c->dropout > 0.0f ? 1.0 : 0.0;
  const double probs = L->b * heads * sq * s;
  double bytes = 2.0 * 2.0 * hidden_values * e + 2.0 * (3.0 * e + drop) * hidden_values;
  if (!fused) bytes += 2.0 * probs * e + drop * probs * (2.0 * e + 1.0);
  bytes += loom_mlp_matrices(c->mlp) * T * ffn * e; /* the fc outputs read, the activation written */
  if (c->position == LOOM_POSITION_ROPE) bytes += 2.0 * T * (heads + kv) * hd * e;
  if (c->qk_norm) bytes += 2.0 * T * (heads + kv) * hd * e; /* QK-norm's read and write of q and k */
  if (c->softmax != LOOM_SOFTMAX_VANILLA) bytes += 2.0 * T * heads * vd * e; /* the sinks rescale the output */
  const double ops = 14.0 + (c->qk_norm ? 2.0 : 0.0) + (c->softmax != LOOM_SOFTMAX_VANILLA ? 1.0 : 0.0);
  stream(L, f, bytes);
  stream(L, g, 2.0 * bytes);
  f->compute += ops * L->overhead;
  g->compute += 2.0 * ops * L->overhead;
  if (moe) moe_costs(L, f, g, w);
  /* Attention's and the MLP's exits forward and entries backward (all-reduces, or SP's reduce-scatters); under
   * SP also their entries forward and exits backward (all-gathers), which are identities without it. Each beside
   * its linear's GEMM under --tp-comm-overlap: an exit's the row-parallel linear's (proj, fc2), an entry's the
   * column-parallel one's (qkv, fc1). A MoE layer without a shared expert has no MLP region: its experts move
   * their own rows (moe_costs). */
  static const int exits[2] = {3, 5}, entries[2] = {0, 4};
  for (int i = 0; i < (ffn > 0.0 ? 2 : 1); i++) {
    tp_exchange(L, f, LOOM_COLL_REDUCE_SCATTER, fw[exits[i]]);
    tp_exchange(L, g, LOOM_COLL_REDUCE_SCATTER, bw[entries[i]]);
    if (L->sp) tp_exchange(L, f, LOOM_COLL_ALLGATHER, fw[entries[i]]), tp_exchange(L, g, LOOM_COLL_ALLGATHER, bw[exits[i]]);
  }
}

/* A vocab-parallel lookup whose partial rows meet in an all-reduce (reduce-scatter under SP, whose backward
 * all-gathers the grads): the first stage's embedding, and each MTP module's of the tokens ahead. */
static void embedding_costs(const layout *L, pass *f, pass *g, pass *w) {
  const double h = L->cfg.hidden, T = L->tokens, e = L->e, f32 = L->f32;
  stream(L, f, 3.0 * T * h * e);
  f->compute += 2.0 * L->overhead;
  const double grad_bytes = 3.0 * T * h * f32; /* all of it weight grads */
  stream(L, g, grad_bytes);
  g->compute += 2.0 * L->overhead;
  w->compute += loom_profile_memory_seconds(L->prof, grad_bytes) + 2.0 * L->overhead;
  tp_exchange(L, f, LOOM_COLL_REDUCE_SCATTER, 0.0); /* no GEMM beside them */
  if (L->sp) tp_exchange(L, g, LOOM_COLL_ALLGATHER, 0.0);
}

/* A final norm, the logits over the vocab shard and fp32 cross-entropy's passes over them: the main head's, and each
 * MTP module's through the same head. */
static void head_costs(const layout *L, pass *f, pass *g, pass *w) {
  const double h = L->cfg.hidden, T = L->tokens, e = L->e, vocab = loom_gpt_vocab_shard(&L->cfg, L->tp), f32 = L->f32;
  gemm_costs(L, L->precision, f, g, w, T, vocab, h, 1);
  f->compute += 6.0 * L->overhead;
  g->compute += 6.0 * L->overhead;
  stream(L, f, 2.0 * L->rows * h * e + 3.0 * T * vocab * f32);
  stream(L, g, 4.0 * L->rows * h * e + 2.0 * T * vocab * f32);
  if (L->sp) tp_exchange(L, f, LOOM_COLL_ALLGATHER, 0.0); /* not split beside the head's GEMM (nor is Megatron's) */
  tp_exchange(L, g, LOOM_COLL_REDUCE_SCATTER, 0.0);
  for (int i = 0; i < 3; i++) tp_collective(L, f, LOOM_COLL_ALLREDUCE, T * f32); /* max, sum, target logit */
}

/* An MTP module's combination on the rank's rows: enorm and hnorm, eh_proj's [2h -> h] GEMM (replicated over tp:
 * no collective), with the lookup of the tokens ahead and its own head (its block is a layer's). */
static void mtp_costs(const layout *L, pass *f, pass *g, pass *w) {
  const double h = L->cfg.hidden, e = L->e;
  embedding_costs(L, f, g, w);
  gemm_costs(L, L->linear, f, g, w, L->rows, h, 2.0 * h, 1);
  stream(L, f, 6.0 * L->rows * h * e); /* the norms and the interleave */
  stream(L, g, 10.0 * L->rows * h * e);
  f->compute += 4.0 * L->overhead;
  g->compute += 4.0 * L->overhead;
  head_costs(L, f, g, w);
}

/* The embedding (first stage) and the final norm, LM head and loss (last), with the MTP modules' own parts. */
static void edge_costs(const layout *L, const loom_stage_range *r, pass *f, pass *g, pass *w) {
  if (r->first) embedding_costs(L, f, g, w);
  if (r->last) head_costs(L, f, g, w);
  for (int k = 0; r->last && k < L->cfg.mtp_layers; k++) mtp_costs(L, f, g, w);
}

/* One micro-batch's mean forward or backward of a rank's v chunks. */
static double mean_of(const double *x, int v) {
  double sum = 0.0;
  for (int k = 0; k < v; k++) sum += x[k];
  return sum / v;
}

/* The dp grads' reduce under --overlap-grad-reduce when they are summed once a step (ZeRO 0 or 1), given the rank's
 * chunks' backward of one micro-batch: what it adds after the rank's last backward, and the slowdown of the compute
 * it runs beside. Each chunk's grads become final during its last backward, bucket by bucket, and go on one stream
 * in that order. The interleaved cooldown (Megatron's and loom's) runs the last pp micro-batches' backwards chunk by
 * chunk, chunk v - 1 first, so chunk k's last backward ends k pp steps before the rank's last one; a chunk's last
 * bucket goes after its backward. */
static double reduce_exposed(const layout *L, const double *backward, int v, double reduce, double buckets) {
  const double step = mean_of(backward, v), each = reduce / v, last = each / fmax(buckets / v, 1.0);
  double done = -INFINITY; /* when the stream finishes what is queued; time 0: the end of the last backward */
  for (int k = v - 1; k >= 0; k--) {
    const double end = -k * L->pp * step;
    done = fmax(done, end - backward[k]) + each;
    done = fmax(done, end + last);
  }
  const double exposed = fmax(done, 0.0);
  return exposed + L->slowdown * fmax(reduce - exposed, 0.0);
}

/* ZeRO-1/2's all-gather of the stepped weights under --overlap-param-gather, given the rank's chunks' forward of one
 * micro-batch: how long the next step's forwards wait for it, plus the slowdown of the compute it runs beside. The
 * gathers go on one stream from the step's end, chunk by chunk and bucket by bucket, each chunk's first bucket needed
 * when its first forward starts (chunk k's after k pp forwards: the interleaved warmup runs the first pp
 * micro-batches chunk by chunk) and the rest before that forward ends. */
static double gather_exposed(const layout *L, const double *forward, int v, double gather, double buckets) {
  const double step = mean_of(forward, v), each = gather / v, first = each / fmax(buckets / v, 1.0);
  double done = 0.0, wait = 0.0;
  for (int k = 0; k < v; k++) {
    const double start = k * L->pp * step + wait; /* chunk k's first forward, as late as the waits before it made it */
    wait += fmax(done + first - start, 0.0);
    done += each;
    wait += fmax(done - (k * L->pp * step + wait + forward[k]), 0.0);
  }
  return wait + L->slowdown * fmax(gather - wait, 0.0);
}

/* Parameters one tp rank of a pipeline rank (its sheet) holds, over its chunks. */
static double rank_params(const layout *L, const loom_rank_sheet *s, double *layers) {
  double n = 0.0;
  *layers = 0.0;
  for (int c = 0; c < s->chunks; c++) {
    const loom_stage_range *range = &s->chunk[c].range;
    n += (double)loom_gpt_param_count(&L->cfg, range, L->tp);
    *layers += range->layer_end - range->layer_begin;
  }
  return n;
}

static double *zeros(int n) { return loom_xcalloc((size_t)(n > 0 ? n : 1), sizeof(double), "cost model"); }

void loom_sim_costs_build(const loom_plan *plan, const loom_profile *prof, loom_sim_costs *c) {
  loom_sim_costs_build_assuming(plan, prof, &LOOM_SIM_ASSUME_BALANCED, c);
}

/* What a layout puts where, for the plan (a rank's sheet of it) on the profile's cluster. */
static layout layout_of(const loom_plan *plan, const loom_rank_sheet *sh, const loom_profile *prof, const loom_sim_assumptions *a) {
  layout L = {.plan = plan, .prof = prof, .tp = sh->size.tp, .dp = sh->grad_replicas, .pp = sh->size.pp,
              .sp = sh->sequence_parallel && sh->size.tp > 1, .precision = plan->precision,
              .linear = plan->fp8 != LOOM__FP8_FORMAT__FP8_NONE ? LOOM__PRECISION__PRECISION_FP8 : plan->precision,
              .fp8_recipe = loom_plan_fp8(plan).recipe};
  L.cfg = sh->rank_model;
  L.e = (double)loom_dtype_size(sh->compute_dtype);
  L.f32 = (double)loom_dtype_size(LOOM_DTYPE_F32);
  L.s = sh->seq;
  L.sq = loom_gpt_local_seq(&L.cfg, (int)L.s);
  L.b = sh->micro_batch;
  L.tokens = L.sq * L.b;
  L.rows = L.sp ? L.tokens / L.tp : L.tokens;
  const int dpn = prof->devices_per_node;
  L.tp_per_node = loom_group_per_node(L.tp, 1, dpn);
  L.dp_per_node = loom_group_per_node(L.dp, L.tp, dpn);
  L.ep = sh->ep;
  L.ep_per_node = loom_group_per_node(L.ep, 1, dpn);
  L.etp = loom_gpt_expert_tp(&L.cfg);
  L.cp = sh->size.cp;
  L.tp_overlap = sh->overlap.tp_comm;
  const double share = prof->has_overlap_sm_share ? prof->overlap_sm_share : 0.0;
  L.slowdown = share / (1.0 - share);
  L.moe_imbalance = a->moe_rank_imbalance;
  L.cp_all_gather = L.cfg.cp_all_gather;
  L.cp_per_node = loom_group_per_node(L.cp, L.tp, dpn);
  L.overhead = prof->op_overhead_us * 1e-6;
  return L;
}

/* The costs' arrays, zeroed, and the links each group's traffic crosses. */
static void costs_init(const layout *L, loom_sim_costs *c) {
  const int p = L->pp, v = L->plan->parallel->virtual_chunks, m = loom_plan_micro_batches(L->plan); /* the plan's shape */
  const int dpn = L->prof->devices_per_node;
  *c = (loom_sim_costs){.p = p, .v = v, .m = m};
  c->forward = zeros(p * v), c->backward = zeros(p * v), c->forward_comm = zeros(p * v), c->backward_comm = zeros(p * v);
  c->weight = zeros(p * v);
  c->dp = zeros(p), c->dp_exposed = zeros(p), c->optimizer = zeros(p);
  c->tp_bytes = zeros(p), c->etp_bytes = zeros(p), c->edp_bytes = zeros(p), c->cp_bytes = zeros(p), c->p2p_bytes = zeros(p),
  c->dp_bytes = zeros(p), c->memory_bytes = zeros(p);
  c->tp_link = L->tp_per_node < L->tp ? LOOM_LINK_INTER : LOOM_LINK_INTRA;
  c->dp_link = L->dp_per_node < L->dp ? LOOM_LINK_INTER : LOOM_LINK_INTRA;
  c->cp_link = L->cp_per_node < L->cp ? LOOM_LINK_INTER : LOOM_LINK_INTRA;
  c->p2p_link = p > 1 && L->tp * L->dp >= dpn ? LOOM_LINK_INTER : LOOM_LINK_INTRA; /* tp x dp ranks between stages */
}

/* Adds n of a layer's passes (x) to a stage's (to). */
static void add_layers(pass *to, const pass *x, double n) {
  to->compute += n * x->compute, to->comm += n * x->comm, to->tp_bytes += n * x->tp_bytes, to->bytes += n * x->bytes;
  to->etp_bytes += n * x->etp_bytes, to->cp_bytes += n * x->cp_bytes;
}

/* Chunk k of pipeline rank q: its forward, backward (with what it recomputes) and weight grads of one
 * micro-batch from its layers' (lf, lg, lw: a dense layer's and a MoE layer's) and edges' costs, and what it sends
 * over tp, etp, cp and p2p and streams through memory in a step. */
static void chunk_costs(const layout *L, loom_sim_costs *c, const loom_rank_sheet *s, int k, const pass lf[SIM_LAYER_KINDS],
                        const pass lg[SIM_LAYER_KINDS], const pass lw[SIM_LAYER_KINDS], double message) {
  const int p = c->p, v = c->v, m = c->m, q = s->at.pp, stage = s->chunk[k].stage;
  const loom_stage_range r = s->chunk[k].range;
  const int count = r.layer_end - r.layer_begin, redone = s->chunk[k].recompute.layers;
  const int redo_end = r.layer_begin + (redone < count ? redone : count); /* the first ones: forward runs again in backward */
  double layers[SIM_LAYER_KINDS] = {0}, redo[SIM_LAYER_KINDS] = {0};
  for (int l = r.layer_begin; l < r.layer_end; l++) {
    layers[sim_layer_kind(&L->cfg, l)]++;
    if (l < redo_end) redo[sim_layer_kind(&L->cfg, l)]++;
  }
  pass f = {0}, g = {0}, w = {0};
  for (int kind = 0; kind < SIM_LAYER_KINDS; kind++) {
    add_layers(&f, &lf[kind], layers[kind]);
    add_layers(&g, &lg[kind], layers[kind]);
    w.compute += layers[kind] * lw[kind].compute;
  }
  edge_costs(L, &r, &f, &g, &w);
  for (int kind = 0; kind < SIM_LAYER_KINDS; kind++) add_layers(&g, &lf[kind], redo[kind]);
  const int i = q * v + k;
  c->forward[i] = f.compute + f.comm, c->forward_comm[i] = f.comm;
  c->backward[i] = g.compute + g.comm, c->backward_comm[i] = g.comm;
  c->weight[i] = w.compute;
  c->tp_bytes[q] += m * (f.tp_bytes + g.tp_bytes);
  c->etp_bytes[q] += m * (f.etp_bytes + g.etp_bytes);
  c->cp_bytes[q] += m * (f.cp_bytes + g.cp_bytes);
  c->memory_bytes[q] += m * (f.bytes + g.bytes);
  const bool v_shape = loom_schedule_kind_v_shape(s->kind);
  int up_rank = -1, down_rank = -1, chunk;
  if (stage < p * v - 1) loom_stage_place(v_shape, p, stage + 1, &up_rank, &chunk);
  if (stage > 0) loom_stage_place(v_shape, p, stage - 1, &down_rank, &chunk);
  const bool sends_up = up_rank >= 0 && up_rank != q, sends_down = down_rank >= 0 && down_rank != q;
  c->p2p_bytes[q] += m * message * ((sends_up ? 1.0 : 0.0) + (sends_down ? 1.0 : 0.0));
}

/* Data parallelism of pipeline rank q: the plan's own count of the bytes a rank sends (ZeRO stage, compression and
 * all), at the dp group's bus bandwidth; under expert parallelism also the experts' over their own replicas' group.
 * `layers`: the rank's layers (its buckets). */
static void dp_costs(const layout *L, loom_sim_costs *c, int q, double layers) {
  const loom_plan *plan = L->plan;
  const loom_profile *prof = L->prof;
  const int v = c->v, m = c->m, zero = plan->parallel->zero_stage;
  double dp_sent = 0.0, edp_sent = 0.0, gather_sent = 0.0, edp_gather_sent = 0.0;
  for (size_t k = 0; k < plan->n_stages; k++)
    if (plan->stages[k]->pp_rank == q) {
      dp_sent += (double)plan->estimates->stages[k]->dp_bytes_sent;
      edp_sent += (double)plan->estimates->stages[k]->edp_bytes_sent;
      gather_sent += (double)plan->estimates->stages[k]->dp_gather_bytes_sent;
      edp_gather_sent += (double)plan->estimates->stages[k]->edp_gather_bytes_sent;
    }
  c->dp_bytes[q] = dp_sent, c->edp_bytes[q] = edp_sent;
  if (L->dp < 2 && edp_sent <= 0.0) return;
  const double buckets = zero >= 2 ? m * fmax(layers, 1.0) : fmax(layers, 1.0);
  /* The grads all-reduced, or reduce-scattered under ZeRO; the stepped weights all-gathered. */
  const loom_collective reduce_kind = zero >= 1 ? LOOM_COLL_REDUCE_SCATTER : LOOM_COLL_ALLREDUCE;
  double bw, latency, gather_bw, gather = 0.0; /* ZeRO-1/2's all-gather of the stepped weights, which runs after the step */
  if (L->dp > 1) {
    group_link(prof, reduce_kind, L->dp, L->dp_per_node, &bw, &latency);
    group_link(prof, LOOM_COLL_ALLGATHER, L->dp, L->dp_per_node, &gather_bw, &(double){0});
    gather = gather_sent / gather_bw; /* dp_sent counts the gather's bytes too */
    c->dp[q] = (dp_sent - gather_sent) / bw + gather + buckets * loom_collective_latency_steps(reduce_kind, L->dp) * latency;
  }
  if (edp_sent > 0.0) { /* ranks etp x ep apart in the stage */
    const int edp = loom_plan_expert_replicas(plan), edp_per_node = loom_group_per_node(edp, L->ep * L->etp, prof->devices_per_node);
    group_link(prof, reduce_kind, edp, edp_per_node, &bw, &latency);
    group_link(prof, LOOM_COLL_ALLGATHER, edp, edp_per_node, &gather_bw, &(double){0});
    const double edp_gather = edp_gather_sent / gather_bw; /* the experts' own, on their group's link */
    c->dp[q] += (edp_sent - edp_gather_sent) / bw + edp_gather + buckets * loom_collective_latency_steps(reduce_kind, edp) * latency;
    gather += edp_gather;
  }
  /* With --overlap-grad-reduce (loom's default) buckets go as their layers' grads are ready: once a step
   * (reduce_exposed), or under ZeRO-2/3 behind every micro-batch's backward, the last bucket waited for.
   * ZeRO-1/2's weight gather follows the step: waited for, or with --overlap-param-gather run beside the next
   * step's first forwards (gather_exposed). */
  const loom_plan_overlap o = loom_plan_overlaps(plan);
  const double reduce = c->dp[q] - gather, last = reduce / buckets;
  double window = 0.0;
  for (int k = 0; k < v; k++) window += m * c->backward[q * v + k];
  const double reduced = zero >= 2 ? last + beside(L, reduce - last, window)
                                   : reduce_exposed(L, c->backward + q * v, v, reduce, buckets);
  c->dp_exposed[q] = prof->comm_overlaps_compute && o.grad_reduce
                         ? reduced + (o.param_gather ? gather_exposed(L, c->forward + q * v, v, gather, buckets) : gather)
                         : c->dp[q];
}

/* The optimizer step of pipeline rank q (`params`: one tp rank's parameters over its chunks). AdamW streams each
 * local parameter's fp32 state: grad, master weight and two moments read, those three written, and the bf16 copy
 * written in bf16 runs. Before the step the fp32 grads each tp rank computes a part of are summed over tp (under
 * sequence parallelism those of every parameter the ranks hold alike, else QK-norm's, per head): all of them, or
 * under ZeRO-2/3 the replica's pieces (1/dp of them on the mean). */
static void optimizer_costs(const layout *L, loom_sim_costs *c, const loom_rank_sheet *s, double params) {
  const int zero = s->zero_stage, q = s->at.pp;
  const double f32 = L->f32, per_param = 7.0 * f32 + (L->e < f32 ? L->e : 0.0);
  const double shard = zero >= 1 ? params / L->dp : params;
  c->optimizer[q] = loom_profile_memory_seconds(L->prof, per_param * shard) + 4.0 * L->overhead;
  c->memory_bytes[q] += per_param * shard;
  double replicated = 0.0;
  for (int k = 0; k < s->chunks && L->tp > 1; k++)
    replicated += (double)loom_gpt_tp_summed_param_count(&L->cfg, &s->chunk[k].range, L->tp, L->sp);
  if (replicated == 0.0) return;
  pass sum = {0};
  tp_collective(L, &sum, LOOM_COLL_ALLREDUCE, replicated * f32 / (zero >= 2 ? L->dp : 1));
  c->optimizer[q] += sum.comm;
  c->tp_bytes[q] += sum.tp_bytes;
}

void loom_sim_costs_build_assuming(const loom_plan *plan, const loom_profile *prof, const loom_sim_assumptions *a,
                                   loom_sim_costs *c) {
  /* Each pipeline rank's part of the plan, resolved as its runtime would be (plan/rank_sheet.h). */
  const int p = plan->parallel->pp;
  loom_rank_sheet *sheets = loom_xmalloc((size_t)p * sizeof *sheets, "rank sheets");
  for (int q = 0; q < p; q++) loom_plan_resolve(plan, loom_plan_pipeline_rank(plan, q), &sheets[q]);
  const layout L = layout_of(plan, &sheets[0], prof, a);
  costs_init(&L, c);
  const int v = c->v;
  /* One activation (or its grad) between stages, as the executor sends it. */
  const double message = loom_gpt_boundary_bytes(&L.cfg, (int)L.s, (int)L.b, L.tp, L.sp);
  c->p2p = p > 1 ? loom_collective_seconds(prof, LOOM_COLL_SENDRECV, message, 2, c->p2p_link == LOOM_LINK_INTER ? 1 : 2, NULL) : 0.0;
  c->p2p_waited = !sheets[0].overlap.p2p;
  pass lf[SIM_LAYER_KINDS] = {{0}}, lg[SIM_LAYER_KINDS] = {{0}}, lw[SIM_LAYER_KINDS] = {{0}};
  for (int kind = 0; kind < SIM_LAYER_KINDS; kind++)
    layer_costs(&L, (kind & 1) && loom_gpt_is_moe(&L.cfg), kind & 2 ? L.cfg.window : 0, &lf[kind], &lg[kind], &lw[kind]);
  for (int q = 0; q < p; q++) {
    for (int k = 0; k < v; k++) chunk_costs(&L, c, &sheets[q], k, lf, lg, lw, message);
    double layers;
    const double params = rank_params(&L, &sheets[q], &layers);
    dp_costs(&L, c, q, layers);
    optimizer_costs(&L, c, &sheets[q], params);
  }
  free(sheets);
  /* The tied embedding's fp32 grads between the first and last stage. */
  const int tied_per_node = (p - 1) * L.tp * L.dp < prof->devices_per_node ? 2 : 1;
  c->tied = loom_collective_seconds(prof, LOOM_COLL_ALLREDUCE, (double)loom_gpt_vocab_shard(&L.cfg, L.tp) * L.cfg.hidden * L.f32, 2,
                                    tied_per_node, NULL);
}

void loom_sim_costs_free(loom_sim_costs *c) {
  double *all[] = {c->forward, c->backward, c->forward_comm, c->backward_comm, c->weight, c->dp, c->dp_exposed,
                   c->optimizer, c->tp_bytes, c->etp_bytes, c->edp_bytes, c->cp_bytes, c->p2p_bytes, c->dp_bytes, c->memory_bytes};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
  *c = (loom_sim_costs){0};
}

double loom_sim_action_seconds(const loom_sim_costs *c, int rank, const loom_action *a) {
  switch (a->kind) {
  case LOOM_ACT_SEND_ACT:
  case LOOM_ACT_SEND_GRAD: return c->p2p_waited ? loom_sim_flight_seconds(c, rank, a) : 0.0;
  case LOOM_ACT_FORWARD: return c->forward[rank * c->v + a->chunk];
  case LOOM_ACT_BACKWARD: return c->backward[rank * c->v + a->chunk];
  case LOOM_ACT_BACKWARD_INPUT: return c->backward[rank * c->v + a->chunk] - c->weight[rank * c->v + a->chunk];
  case LOOM_ACT_BACKWARD_WEIGHT: return c->weight[rank * c->v + a->chunk];
  case LOOM_ACT_REDUCE_TIED: return c->tied;
  case LOOM_ACT_REDUCE_DP: return c->dp_exposed[rank];
  case LOOM_ACT_OPTIMIZER_STEP: return c->optimizer[rank];
  default: return 0.0;
  }
}

double loom_sim_flight_seconds(const loom_sim_costs *c, int rank, const loom_action *a) {
  const bool away = a->peer != rank; /* a V's turn from chunk 0 to chunk 1 stays on its rank */
  return away && (a->kind == LOOM_ACT_SEND_ACT || a->kind == LOOM_ACT_SEND_GRAD) ? c->p2p : 0.0;
}

/* The part of (rank, chunk) i's backward that the stage below waits for: a
 * split one sends its input grad before its weight half runs. */
static double backward_sent(const loom_sim_costs *c, int i, bool splits_backward) {
  return c->backward[i] - (splits_backward ? c->weight[i] : 0.0);
}

double loom_sim_step_lower_bound(const loom_sim_costs *c, bool splits_backward) {
  const int v = c->v;
  const double tail = c->dp_exposed[0] + c->optimizer[0]; /* rank 0's last actions, after its last backward */
  double bound = 0.0;
  double arrival = 0.0; /* when micro-batch 0's activation can reach rank q (its first stage is stage q) */
  double drain = 0.0;   /* from a backward of stage q to the end of stage 0's, through the stages below */
  for (int q = 0; q < c->p; q++) {
    double busy = c->dp_exposed[q] + c->optimizer[q], chained = 0.0;
    for (int k = 0; k < v; k++) {
      const int i = q * v + k;
      busy += c->m * (c->forward[i] + c->backward[i]);
      chained += c->m * (c->forward[i] + backward_sent(c, i, splits_backward));
    }
    /* Every forward and backward of rank q for a micro-batch comes before
     * that micro-batch's backward of stage q (its chunk 0), whose grad then
     * runs down to stage 0, after which rank 0 reduces and steps. */
    bound = fmax(bound, fmax(arrival + busy, arrival + chained + drain + tail));
    arrival += c->forward[q * v] + c->p2p;
    drain += backward_sent(c, q * v, splits_backward) + c->p2p;
  }
  return bound;
}
