/* The GPT model, or one pipeline stage of it, on one rank: token embedding
 * (+ learned positions) on the first stage, pre-norm blocks, the final norm,
 * the LM head (tied to wte, or its own) and the mean cross-entropy loss on
 * the last stage. The config decides the architecture (gpt_config.h).
 *
 * Under tensor parallelism (loom_tp with size > 1) this rank holds its
 * shards: the vocab-parallel wte and LM head (one tensor when tied), and the
 * loss is computed without full logits ever existing on one rank. Every rank
 * of a TP group sees the same tokens and returns the same loss.
 *
 * Activations of a micro-batch live in a slot; a pipeline stage keeps as many
 * slots as its schedule has micro-batches in flight. Scratch is shared by all
 * slots. The stage's first recompute_layers layers (all of them under full
 * recompute; Megatron's block method picks how many) keep only their input
 * in a slot, and the backward pass runs each one's forward again before its
 * backward. In
 * bf16 runs (cfg.bf16) each layer runs in fp32 scratch on bf16 values, and
 * a slot keeps its activations packed as bf16. */
#ifndef LOOM_GPT_H
#define LOOM_GPT_H

#include <stdbool.h>
#include <stdint.h>
#include "backend/ops.h"
#include "layers/block.h"
#include "layers/gpt_params.h"
#include "layers/mtp.h"

/* A kept layer's big activations as bf16 (bf16 runs);
 * its norm statistics stay fp32 in the slot's blocks. */
typedef struct {
  uint16_t *ln_1, *qkv, *atty, *res_attn, *ln_2, *fc, *fc_gelu, *out;
} loom_block_packed;

/* One micro-batch's saved activations. N = T*B rows; n = N/tp under SP, else N. */
typedef struct {
  loom_buffer mem;
  loom_buffer mem16;        /* bf16 runs: the packed activations */
  loom_block_packed *packed; /* [kept layers] (bf16 runs): layer l's at l - recompute_layers */
  int *tokens, *targets;    /* [N] [s, b] order */
  int *pred;                /* [N] greedy predictions */
  float *x0;                /* [n, h] stage input: the embedding output, or the received activation */
  loom_block_acts *blocks;  /* [kept layers] layer l's at l - recompute_layers (only the norm statistics in bf16 runs) */
  float *inputs;            /* [groups (+1 when some layers are kept), n, h] the input of each recomputed group's
                             * first layer (group 0's is x0), then the first kept layer's */
  float *out;               /* [n, h] stage output (when every layer recomputes, or bf16, or an empty stage) */
  float *dx0;               /* [n, h] grad of the stage input, kept until its send completes */
  /* The last stage's heads: the main one's, then each MTP depth's (1 + mtp_layers of each, one after another) */
  float *ln_f_mean, *ln_f_rstd; /* [n] */
  float *ln_f;              /* [N, h] (gathered under SP; fp32 runs) */
  uint16_t *ln_f_bits;      /* [N, h] bf16 runs: ln_f packed, all the head's GEMMs read */
  float *logits;            /* [N, Vp/tp]; backward overwrites it with dlogits */
  float *losses, *lse, *picked; /* [N] */
  /* Multi-token prediction (the last stage of a model with it), per depth */
  int *mtp_tokens, *mtp_targets; /* [N] the tokens ahead and their targets */
  float *mtp_emb, *mtp_hin, *mtp_stats, *mtp_cat, *mtp_x; /* loom_mtp_acts' */
  float *mtp_y;             /* [n, h] the output of the layer before the depth's block: its head's input */
} loom_gpt_slot;

/* A split backward's state, from its input half to its weight half: the
 * linears' output grads per layer, and the recomputed layers' inputs (only
 * ln_1, atty, ln_2 and fc_gelu are set), which a slot does not keep for
 * them. The LM head's are its slot's logits (by then their grads) and ln_f;
 * the embedding's, its slot's dx0. A stage holds as many as its schedule
 * has backwards waiting for their weight half. */
typedef struct {
  loom_buffer mem, mem16;   /* fp32 views, and bf16 runs' bits */
  loom_block_wgrad *wgrad;  /* [layers] (bf16 runs: their bits; the fp32 views are the block scratch's) */
  loom_block_acts *winputs; /* [recompute_layers] (bf16 runs: their bits) */
} loom_gpt_wstate;

/* Scratch shared by every slot. */
typedef struct {
  loom_buffer mem, mem16;   /* fp32 views, and bf16 runs' bits */
  loom_block_scratch block;
  loom_block_acts *redo;    /* [a recompute group's layers, or 1] activations recomputed in backward, or computed in
                             * fp32 in bf16 runs (bf16 runs with recompute: with the linears' inputs as bits) */
  int redo_count;
  float *xin;               /* [n, h] bf16 runs: the current layer's input */
  float *weights;           /* bf16 runs: the fp32 values of the compute weights in use */
  loom_block_weights layer_w[LOOM_LAYER_KINDS]; /* views of weights: one layer's, of each kind (they share its start) */
  loom_gpt_weights weights_of; /* views of weights: the embedding's and head's, and h = layer_w */
  float *edges;             /* where the embedding's and head's weights start in weights */
  float *embed_full;        /* [N, h] */
  loom_mtp_scratch mtp;     /* multi-token prediction's combination */
  float *mtp_dcat, *mtp_demb, *mtp_dhin; /* [n, 2h], [n, h], [n, h] its grads */
  loom_mtp_weights *mtp_w;  /* bf16 runs: views of weights, the MTP depths' (weights_of.mtp) */
  int *mtp_host;            /* host [2 mtp_layers N]: the tokens ahead and targets, shifted here */
  float *dres;              /* [n, h] running residual grad */
  float *d_ln_f;            /* [N, h] */
  float *lse_scratch;       /* [N] */
  uint16_t *tp_staging;     /* bf16 runs with tp > 1: the regions' collectives (loom_tp.staging) */
  float *fp8_space;         /* FP8 linears: the casts' workspace, fp8_elems codes by fp8_dim (fp8_linear.h) */
  int64_t fp8_elems, fp8_dim;
} loom_gpt_work;

struct loom_gpt_s;

/* The hook's layer for the embedding, final norm and head: the whole pass. */
#define LOOM_GPT_EDGES (-1)

/* A runtime's calls around each part of a pass (any may be NULL): before
 * and after local layer l's forward or backward (with recompute, the
 * backward's includes the layer's forward again), and around the whole
 * stage pass with LOOM_GPT_EDGES. The executor reduces a layer's grads once
 * they are final; ZeRO-2/3 gather weights and reduce-scatter grads. */
typedef struct {
  void *ctx;
  void (*before)(void *ctx, struct loom_gpt_s *m, bool backward, int layer);
  void (*after)(void *ctx, struct loom_gpt_s *m, bool backward, int layer);
} loom_gpt_hooks;

/* What a MoE model's routing came to over the forwards since the last
 * loom_gpt_moe_stats_reset (recomputes left out): this rank's shares. */
typedef struct {
  double aux_loss, z_loss; /* summed over layers and forwards (each forward's micro-batch losses as routed) */
  int64_t dropped;         /* choices dropped over capacity */
  int64_t most_rows;       /* the most rows this rank's experts took in one layer's forward */
  int64_t *load;           /* [layers * experts] tokens routed to each expert of each local layer */
} loom_gpt_moe_stats;

/* What multi-token prediction came to over the forwards since the last
 * loom_gpt_mtp_stats_reset: this rank's shares. */
typedef struct {
  double loss_sum; /* every depth's losses, summed over their scored targets */
  int64_t scored;  /* the main head's scored targets */
} loom_gpt_mtp_stats;

/* The depths' mean loss they came to (each depth's over the main head's count). */
static inline double loom_gpt_mtp_loss(const loom_gpt_mtp_stats *s, int depths) {
  return depths > 0 && s->scored > 0 ? s->loss_sum / (double)s->scored / depths : 0.0;
}

typedef struct loom_gpt_s {
  loom_gpt_params p;
  const loom_ops *ops;
  uint64_t seed;
  loom_tp tp;
  int recompute_layers; /* the stage's first layers that recompute in backward (0: none; its layer count: all) */
  int recompute_group;  /* in groups of this many (1: each alone) */
  int T, B, nslots; /* T: this rank's rows of each sequence (its chunks' under context parallelism) */
  int *cp_pos;      /* context parallelism: their global positions, and room for a peer's (host, [2 T]) */
  loom_gpt_slot *slots;
  int nwstates;
  loom_gpt_wstate *wstates; /* [nwstates] */
  loom_gpt_slot *a;         /* slots[0], what single-micro-batch callers read */
  loom_gpt_work w;
  loom_gpt_hooks hooks;
  loom_moe_shape moe;           /* a MoE model's layer shape (set with the slots) */
  loom_mla_shape mla;           /* multi-head latent attention's, where the model has it */
  loom_gpt_moe_stats moe_stats; /* a MoE model's routing since the last reset */
  loom_gpt_mtp_stats mtp_stats; /* multi-token prediction's losses since the last reset */
  /* [layers * experts] host memory: the expert bias of this stage's layers
   * (model.moe.expert_bias), owned by whoever trains the model (the
   * trainer keeps the whole model's); NULL: routing without one. */
  const float *expert_bias;
  /* FP8 linears (cfg.fp8.on): each local layer's state [layers x LOOM_FP8_LINEARS] (set with the slots; a layer
   * left in bf16 has none: fp8_on), and the workspace its casts write */
  loom_fp8_site *fp8_sites;
  loom_fp8_workspace fp8_ws;
} loom_gpt;

/* Whether global layer g's linears run in FP8: the run's on, and g is not among the first or last layers it keeps
 * in bf16, nor an MTP module's. */
bool loom_gpt_layer_fp8(const loom_gpt_config *c, int g);
/* Delayed scaling: points each local layer's FP8 state at the run's scales and step amaxes, [blocks x
 * LOOM_FP8_LINEARS x LOOM_FP8_OPERANDS] for the whole model (the trainer's). */
void loom_gpt_fp8_bind(loom_gpt *m, const float *scale, float *step_amax);

/* What one forward pass sees. tokens/targets are [T, B] sequence-major. */
typedef struct {
  const int *tokens;      /* read on the first stage (and saved for its backward) */
  const int *targets;     /* read on the last stage; may be NULL for inference; < 0 masks a position */
  /* Multi-token prediction: [mtp_layers][T, B] each depth's tokens ahead and targets at this rank's rows
   * (loom_mtp_shift of the whole sequence, then its rows under context parallelism); NULL: shifted here from
   * tokens and targets (no context parallelism) */
  const int *mtp_tokens, *mtp_targets;
  int64_t sample_offset;  /* global index of this micro-batch's sample 0 */
  int64_t step;           /* dropout key */
  bool train;             /* enables dropout */
} loom_gpt_batch;


/* Builds and initialises this rank's part of the whole model. tp NULL:
 * serial. Under TP the vocab is padded to a multiple of 128 * tp. */
loom_status loom_gpt_init(loom_gpt *m, const loom_gpt_config *cfg, const loom_ops *ops, uint64_t seed,
                          const loom_tp *tp);
/* The same for one pipeline stage (or chunk): the layers of `range`,
 * recomputing in backward what `recompute` says.
 * zero_dp > 0: trained by ZeRO `zero_stage` over that many replicas, with
 * parameters as loom_gpt_params_init_for_zero builds them; where they get
 * no fp32 master (bf16 runs, ZeRO-3) they get no initial values either,
 * which the distributed optimizer holds and draws. */
loom_status loom_gpt_init_stage(loom_gpt *m, const loom_gpt_config *cfg, const loom_ops *ops, uint64_t seed,
                                const loom_tp *tp, const loom_stage_range *range, loom_recompute recompute, int zero_dp,
                                int zero_stage);
void loom_gpt_free(loom_gpt *m);
/* (Re)sizes activations for `slots` micro-batches of (T, B); T <= cfg.seq
 * (under context parallelism a multiple of 2 cp, this rank holding T / cp
 * rows of each sequence). */
loom_status loom_gpt_set_slots(loom_gpt *m, int T, int B, int slots);
/* One slot of (T, B): for single-rank training and evaluation. */
loom_status loom_gpt_set_batch_shape(loom_gpt *m, int T, int B);
/* Values of one micro-batch's activation (or its grad) crossing a stage
 * boundary, [T / cp (/ tp under sequence parallelism), B, hidden]: the size of
 * every pipeline message, for the executor, the memory model and the sim. */
size_t loom_gpt_boundary_floats(const loom_gpt_config *cfg, int T, int B, int tp, bool sequence_parallel);
/* 32-bit words of one such message as the pipeline sends it: fp32 values,
 * or in bf16 runs bf16 ones, two to a word (what it holds are bf16 values,
 * so nothing is lost), an odd count's last word padded. */
static inline size_t loom_gpt_boundary_words(const loom_gpt_config *cfg, int T, int B, int tp, bool sequence_parallel) {
  const size_t n = loom_gpt_boundary_floats(cfg, T, B, tp, sequence_parallel);
  return cfg->bf16 ? loom_bf16_words(n) : n;
}
/* Its bytes: the executor's send buffers and traffic, the memory model's,
 * the sim's p2p cost and byte counts. */
static inline double loom_gpt_boundary_bytes(const loom_gpt_config *cfg, int T, int B, int tp, bool sequence_parallel) {
  return 4.0 * (double)loom_gpt_boundary_words(cfg, T, B, tp, sequence_parallel);
}
/* The elements of each allocation the activations of one rank of a tp-way
 * split of stage `range` (NULL: the whole model) take at micro-batches of
 * (T, B), as loom_gpt_set_slots and loom_gpt_set_weight_states make them:
 * per slot its fp32 and bf16 tables and its tokens, targets and predictions
 * (three int buffers of `tokens`), the chunk's shared scratch once, and per
 * weight-grad state its two tables. 0: no allocation (an empty table). */
typedef struct {
  size_t slot, slot16, tokens;
  size_t work, work16;
  size_t wstate, wstate16;
} loom_gpt_activation_sizes;
loom_gpt_activation_sizes loom_gpt_activation_sizes_of(const loom_gpt_config *cfg, int T, int B, int tp,
                                                        bool sequence_parallel, const loom_stage_range *range,
                                                        loom_recompute recompute);
/* Their bytes over `slots` slots and `weight_states` states. */
size_t loom_gpt_activation_bytes(const loom_gpt_config *cfg, int T, int B, int tp, bool sequence_parallel,
                                 const loom_stage_range *range, loom_recompute recompute, int slots, int weight_states);
/* (Re)sizes the weight-grad states of a split backward, after the slots. */
loom_status loom_gpt_set_weight_states(loom_gpt *m, int n);

/* Stage forward of a micro-batch into `slot`. input[n, h] is the previous
 * stage's activation (NULL on the first stage). Returns the mean loss over
 * unmasked targets on the last stage, else 0. */
float loom_gpt_stage_forward(loom_gpt *m, int slot, const loom_gpt_batch *batch, const float *input);
/* The stage output [n, h] of a slot, for the next stage. */
const float *loom_gpt_stage_output(const loom_gpt *m, int slot);
/* Stage backward of a slot: dout[n, h] is the grad of the stage output (NULL
 * on the last stage, which starts from the loss with each token weighted by
 * dloss). Adds into grads; leaves the grad of the stage input in slot's dx0. */
void loom_gpt_stage_backward(loom_gpt *m, int slot, const loom_gpt_batch *batch, const float *dout, float dloss);
/* The same backward in two halves (zero-bubble schedules), through
 * weight-grad state `wstate`. The input half (B) leaves the grad of the
 * stage input in dx0 and adds the norm and bias grads; the weight half (W),
 * run any time after it and before its slot or state is reused, adds every
 * weight GEMM's grad and the embedding's. The hooks surround each layer's
 * weight half, which is what finishes its grads; the input half calls none. */
void loom_gpt_stage_backward_input(loom_gpt *m, int slot, int wstate, const loom_gpt_batch *batch, const float *dout,
                                   float dloss);
void loom_gpt_stage_backward_weight(loom_gpt *m, int slot, int wstate, const loom_gpt_batch *batch);

/* The whole model in slot 0: forward returns the mean loss; backward adds
 * into m->p.grads with each token's loss weighted by dloss (use 1 / tokens in
 * the global batch to average). */
float loom_gpt_forward(loom_gpt *m, const loom_gpt_batch *batch);
void loom_gpt_backward(loom_gpt *m, const loom_gpt_batch *batch, float dloss);
/* Clears the routing statistics (a MoE model's; a no-op for a dense one). */
void loom_gpt_moe_stats_reset(loom_gpt *m);
void loom_gpt_mtp_stats_reset(loom_gpt *m);
/* Under sequence parallelism each rank's grads of TP-replicated parameters
 * (norms, wpe, row-parallel biases) cover only its positions, and a
 * per-head one's (QK-norm's) only its heads under any tp: sums them over
 * the TP group. Call once per step after the last backward. */
void loom_gpt_sync_replicated_grads(loom_gpt *m);
/* The one rule behind it, for n values at g of tensor k's grad (a whole
 * tensor, or a ZeRO piece of one): summed over tp's group when the tensor
 * is TP-replicated under sequence parallelism or per head, else left alone. */
void loom_gpt_sum_replicated_grad(const loom_gpt_params *p, const loom_tp *tp, int k, float *g, size_t n);
void loom_gpt_zero_grad(loom_gpt *m);
/* Flat range [lo, hi) of local layers [l0, l1)'s tensors in the stage's
 * parameter buffers (params, grads and the bf16 copy share one layout). */
void loom_gpt_block_range(const loom_gpt *m, int l0, int l1, size_t *lo, size_t *hi);
/* bf16 runs: rounds the fp32 master weights into the bf16 copy the model
 * computes with (a no-op in fp32, under the distributed optimizer, whose
 * all-gather writes that copy, and right after a plain AdamW step, which
 * wrote it as it stepped: p.compute_fresh). Call after the master weights
 * change and before the next forward: the runtime does at each step and
 * evaluation. */
void loom_gpt_sync_compute_weights(loom_gpt *m);
/* Greedy next-token prediction for every row of slot 0's last forward, over
 * the whole vocab even when it is split across the TP group (collective
 * there). out[N] is host memory; clobbers the forward's picked logits. */
void loom_gpt_predict(loom_gpt *m, int *out);

#endif
