/* The layers' buffer tables, inside the layers: the shapes every activation
 * table is cut from (dims), the builders that list a slot's, the shared
 * scratch's and a weight-grad state's views (gpt_tables.c), and the views
 * the forward and backward bind to them (gpt.c). Not for use outside
 * src/layers/: the rest of loom asks gpt.h's sizes. */
#ifndef LOOM_GPT_TABLES_H
#define LOOM_GPT_TABLES_H

#include "layers/gpt.h"
#include "layers/run_buffers.h"

/* Builder for activation tables of one dtype: specs are appended, then pointers bound. */
typedef struct {
  loom_tensor specs[96];
  void *slots[96]; /* float ** (F32) or uint16_t ** (BF16) */
  loom_dtype dtype;
  int count;
} act_list;

/* Shapes every table below is cut from. */
typedef struct {
  int64_t N, n, h, f, w, V; /* f: the widest MLP of the stage's layers (the scratch's) */
  int64_t lse;            /* attention's log-sum-exps of a layer: B x local heads x T */
  int64_t qkv, fc;        /* row widths of the column-parallel outputs (fc: the widest layer's) */
  int64_t fk[LOOM_LAYER_KINDS], fck[LOOM_LAYER_KINDS]; /* a dense (0) and a MoE layer's (1) MLP width and fc row */
  const loom_gpt_config *cfg; /* whose layers [layer0, layer0 + L) the stage holds: their kinds */
  int layer0;
  int64_t d_qkv_w;        /* replicated key/value heads: the q|k|v grads computed apart */
  int64_t weight_scratch; /* bf16 runs: fp32 values of one layer's weights and the embedding's and head's */
  int64_t E, k, M, taken; /* a stage with MoE layers: experts and top-k, the rows a rank dispatches (n k) and its experts take; else 0 */
  int64_t X;              /* the rows its experts compute over: taken, or under expert tensor parallelism every rank's */
  int64_t ep, etp;        /* its expert-parallel group's size, and the expert-tensor-parallel one's */
  int64_t fe, fce;        /* an expert's width, and its first GEMM's output row's (SwiGLU: 2 fe) */
  int64_t ring;           /* context parallelism: one travelling block of keys and values (0: none) */
  int64_t cp;             /* its group's size */
  bool cp_all_gather;     /* every rank's blocks gathered, not passed round a ring */
  bool gate;              /* a MoE model's shared expert is gated */
  int64_t qk_rows;        /* QK-norm: the rows of D it normalises, each [t, b] row's local q and k heads (0: none) */
  int64_t D;              /* a head's width */
  /* multi-head latent attention (mla_kv 0: none): its latents' widths (q's 0: none), the RoPE key's, and the rows
   * of its up projections' outputs on this rank */
  int64_t mla_q, mla_kv, mla_pe, mla_q_up, mla_kv_up, mla_widest;
  int64_t fp8_elems, fp8_dim; /* FP8 linears: the casts' workspace (loom_fp8_workspace_floats; 0: none) */
  int L, tp;
  int mtp;  /* the MTP depths whose heads the stage computes (the last stage's: the model's), else 0 */
  int R, K; /* layers recomputed in backward (the first R), and kept whole (the other K) */
  int G;    /* the recomputed layers' groups: G layers each (the last may be short), the first one's input kept */
  bool first, last, bf16;
} dims;

/* The activations a layer's weight grads read, the inputs of its four
 * linears: ln_1, atty, ln_2 and fc_gelu, by their place in BIG_NAMES below. */
enum { WEIGHT_INPUTS = 4 };
static const int WEIGHT_INPUT[WEIGHT_INPUTS] = {0, 2, 4, 6};

/* Per-layer activation kinds: one view each, [L * per-layer size]; bits:
 * the linears' inputs as bf16 bits (WEIGHT_INPUT order), where a table
 * keeps them. */
typedef struct {
  float *ln1m, *ln1r, *lse, *ln1, *qkv, *atty, *resa, *ln2m, *ln2r, *ln2, *fc, *fcg, *out;
  float *qk_raw, *qk_rstd; /* QK-norm's input and statistics */
  loom_mla_acts mla;       /* multi-head latent attention's, for every layer */
  uint16_t *bits[WEIGHT_INPUTS];
  loom_moe_acts moe; /* a MoE model's, for every layer */
} layer_views;

/* The layers a table holds: the stage's layers [first, first + L), or
 * (first < 0) L layers of scratch, each as large as the stage's largest
 * layer of each kind (a recompute group computes in it, whatever its
 * layers' kinds). */
typedef struct {
  int first, L;
} span;

/* A layer's big activations, in one order for every table: names, and
 * element counts per layer (N rows inside the parallel regions, n outside). */
enum { BIG = 8 };
static const char *const BIG_NAMES[BIG] = {"ln_1", "qkv", "atty", "res_attn", "ln_2", "fc", "fc_gelu", "out"};

enum { WGRADS = 4 }; /* a layer's four linears' output grads */

/* Views of a split backward's state: the linears' output grads of every
 * layer and the inputs of the recomputed layers' (the slot keeps none of
 * theirs); fp32, or bits in bf16 runs. */
typedef struct {
  float *grads[WGRADS];
  uint16_t *grad_bits[WGRADS];
  float *inputs[WEIGHT_INPUTS];
  uint16_t *input_bits[WEIGHT_INPUTS];
  loom_moe_wgrad moe; /* every MoE layer's */
  loom_moe_acts moe_inputs; /* the recomputed MoE layers': x, perm and act, copied from the recompute scratch */
} wgrad_views;

uint16_t **loom_tables_act_bits_field(loom_block_acts *a, int k);
float **loom_tables_act_field(loom_block_acts *a, int i);
void loom_tables_big_counts(const dims *d, int kind, int64_t c[BIG]);
void loom_tables_bind_layers(loom_block_acts *b, const layer_views *v, const dims *d, span s);
void loom_tables_bind_packed(loom_block_packed *b, const loom_block_packed *p, const dims *d, span s);
void loom_tables_bind_wstate(loom_gpt_wstate *s, const wgrad_views *v, const dims *d, const loom_block_scratch *scratch);
dims loom_tables_dims_of(const loom_gpt_config *c, int T, int B, int tp, bool sp, const loom_stage_range *r, loom_recompute rc);
void loom_tables_list_slot(act_list *l, act_list *l16, loom_gpt_slot *s, layer_views *v, loom_block_packed *p, const dims *d);
void loom_tables_list_work(act_list *l, act_list *l16, loom_gpt_work *w, layer_views *v, const dims *d);
void loom_tables_list_wstate(act_list *l, act_list *l16, wgrad_views *v, const dims *d);
loom_status loom_tables_place(loom_buffer *mem, act_list *l, const loom_allocator *backend, loom_run_buffer name);
int loom_tables_recompute_groups(int R, int G);
loom_recompute loom_tables_recompute_of(const loom_gpt *m);
int loom_tables_redo_layers(const dims *d);
dims loom_tables_with_weight_scratch(dims d, const loom_gpt_config *c, int tp);

#endif
