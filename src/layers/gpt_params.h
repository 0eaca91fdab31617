/* GPT parameters: the canonical table (GPT-2 names and full shapes, with
 * per-parameter metadata), the contiguous buffers and their named views, and
 * partition-invariant initialisation from the keyed RNG. */
#ifndef LOOM_GPT_PARAMS_H
#define LOOM_GPT_PARAMS_H

#include <stdbool.h>
#include <stdint.h>
#include "core/tensor.h"
#include "layers/gpt_config.h"
#include "tensor_parallel/shard.h"

typedef enum { LOOM_INIT_NORMAL, LOOM_INIT_ZEROS, LOOM_INIT_ONES } loom_init_kind;

/* What a tensor is to the model: which named view it fills. A block's
 * roles are the indices of loom_block_weights' views; LOOM_ROLE_FUSED
 * tensors are read as the rows after the previous tensor's (the Llama
 * family's k and v projections after q, up after gate: one GEMM each). */
typedef enum {
  LOOM_ROLE_LN_1_W, LOOM_ROLE_LN_1_B, LOOM_ROLE_QKV_W, LOOM_ROLE_QKV_B, LOOM_ROLE_ATTN_PROJ_W, LOOM_ROLE_ATTN_PROJ_B,
  LOOM_ROLE_LN_2_W, LOOM_ROLE_LN_2_B, LOOM_ROLE_FC_W, LOOM_ROLE_FC_B, LOOM_ROLE_MLP_PROJ_W, LOOM_ROLE_MLP_PROJ_B,
  LOOM_ROLE_ROUTER_W, LOOM_ROLE_EXPERTS_FC_W, LOOM_ROLE_EXPERTS_PROJ_W, LOOM_ROLE_SHARED_GATE_W,
  LOOM_ROLE_Q_NORM_W, LOOM_ROLE_K_NORM_W, LOOM_ROLE_SINKS, LOOM_ROLE_ROUTER_B, LOOM_ROLE_EXPERTS_FC_B,
  LOOM_ROLE_EXPERTS_PROJ_B, LOOM_ROLE_MLA_DOWN_W, LOOM_ROLE_MLA_Q_NORM_W, LOOM_ROLE_MLA_KV_NORM_W, LOOM_ROLE_MLA_Q_UP_W,
  LOOM_ROLE_MLA_KV_UP_W,
  LOOM_BLOCK_VIEWS, /* views of a block */
  LOOM_ROLE_FUSED = LOOM_BLOCK_VIEWS,
  LOOM_ROLE_WTE, LOOM_ROLE_WPE, LOOM_ROLE_LN_F_W, LOOM_ROLE_LN_F_B, LOOM_ROLE_LM_HEAD,
  /* an MTP module's, one run per depth after the head (loom_mtp_weights' views, in order) */
  LOOM_ROLE_MTP_ENORM_W, LOOM_ROLE_MTP_ENORM_B, LOOM_ROLE_MTP_HNORM_W, LOOM_ROLE_MTP_HNORM_B, LOOM_ROLE_MTP_EH_PROJ_W,
  LOOM_ROLE_MTP_NORM_W, LOOM_ROLE_MTP_NORM_B
} loom_param_role;

/* Metadata one place decides and everything else reads (grad norm, grad
 * reduction, weight decay, checkpoint sharding). */
typedef struct {
  loom_param_role role;
  loom_init_kind init;
  float init_std;
  int64_t init_rows;         /* global rows drawn from the RNG; rows past it start at 0 (vocab padding) */
  bool weight_decay;         /* decoupled AdamW decay applies */
  loom_shard_layout layout;  /* global shape and how tensor parallelism splits it */
  bool tp_replicated;        /* identical on every TP rank (norms, wpe, row-parallel biases) */
  bool per_head;             /* tp_replicated, but applied to each head (QK-norm's weights): a rank's grad is its
                              * heads' share, summed over the TP group with or without sequence parallelism */
  bool shared;               /* lives on more than one pipeline stage (tied wte) */
  bool expert;               /* a MoE expert's: under expert parallelism its grads sum over the expert-data-parallel
                              * group, and the expert-parallel group's ranks hold different ones */
} loom_param_meta;

/* Where a tensor's grad enters the squared grad norm on this TP rank: 0 in
 * the part summed over the TP group, 1 in the part every rank holds alike
 * (counted once), 3 in the part summed over the expert-parallel group (and
 * the TP group where it splits the experts), 4 in the part summed over the
 * expert-parallel group alone (an expert's tensor every TP rank holds
 * alike), -1 nowhere (a replicated key/value head that its first replica
 * counts). */
static inline int loom_param_norm_part(const loom_param_meta *m, int tp_rank, int tp_size) {
  if (m->expert) return m->tp_replicated ? 4 : 3; /* an expert-parallel rank's own experts (or slices of them) */
  if (m->tp_replicated) return 1;
  return loom_shard_primary(&m->layout, tp_rank, tp_size) ? 0 : -1;
}

/* Views of one transformer block's parameters (or grads), NULL where the
 * config has no such tensor (biases, RMSNorm's shift). Fused views run over
 * consecutive tensors: c_attn_w is this rank's rows of q | k | v (GPT-2's
 * c_attn, or the Llama family's q_proj, k_proj, v_proj), c_fc_w its rows of
 * gate | up under SwiGLU. In a Mixture-of-Experts layer c_fc_w and
 * mlp_proj_w are the shared expert's (NULL: none), and the experts' views
 * run over every expert the rank holds, each expert's matrix after the
 * previous one's. */
typedef struct {
  float *ln_1_w, *ln_1_b;           /* [h], [h] */
  float *c_attn_w, *c_attn_b;       /* [(H + 2K) D, h] rows q|k|v, [(H + 2K) D] */
  float *attn_proj_w, *attn_proj_b; /* [h, H D], [h] */
  float *ln_2_w, *ln_2_b;           /* [h], [h] */
  float *c_fc_w, *c_fc_b;           /* [f, h] (SwiGLU: [2f, h] rows gate|up), [f] or [2f] */
  float *mlp_proj_w, *mlp_proj_b;   /* [h, f], [h] */
  float *router_w;                  /* [E, h] the router's */
  float *experts_fc_w;              /* [E][fe, h] (SwiGLU: [E][2fe, h], each expert's rows gate|up) */
  float *experts_proj_w;            /* [E][h, fe] */
  float *shared_gate_w;             /* [1, h] the shared expert's gate (NULL: none) */
  float *q_norm_w, *k_norm_w;       /* [D], [D] QK-norm's, over each q and k head (NULL: none) */
  float *sinks;                     /* [H] each head's attention sink logit (NULL: none) */
  float *router_b;                  /* [E] the router's bias (NULL: none) */
  float *experts_fc_b;              /* [E][fe] (SwiGLU: [E][2fe], gate|up) the experts' biases (NULL: none) */
  float *experts_proj_b;            /* [E][h] */
  /* Multi-head latent attention's (NULL: none; c_attn_w then none), rq the
   * q rank (0: none), rkv the kv rank, P the RoPE part, D = nope + P: */
  float *mla_down_w;                /* [rq + rkv + P, h] rows q_a | kv_a (its latent, then the RoPE key), every tp rank's */
  float *mla_q_norm_w;              /* [rq] (NULL: no q latent) */
  float *mla_kv_norm_w;             /* [rkv] */
  float *mla_q_up_w;                /* [H D, rq] (no q latent: [H D, h]) this rank's heads' rows, each head nope | RoPE */
  float *mla_kv_up_w;               /* [H (nope + v), rkv] this rank's heads' rows, each head k's nope | v */
} loom_block_weights;

_Static_assert(sizeof(loom_block_weights) == LOOM_BLOCK_VIEWS * sizeof(float *),
               "loom_block_weights must be exactly its views, in role order");

/* Views of one multi-token prediction module's own tensors (its block is a
 * layer of the table): the norms of the token embedding and of the previous
 * depth's hidden states, the projection of the two side by side, and its
 * final norm (DeepSeek-V3's shared_head.norm). */
typedef struct {
  float *enorm_w, *enorm_b;   /* [h], [h] (LayerNorm's shift, else NULL) */
  float *hnorm_w, *hnorm_b;   /* [h], [h] */
  float *eh_proj_w;           /* [h, 2h] columns enorm(e) | hnorm(h), every tp rank's */
  float *norm_w, *norm_b;     /* [h], [h] */
} loom_mtp_weights;

_Static_assert(sizeof(loom_mtp_weights) == (LOOM_ROLE_MTP_NORM_B - LOOM_ROLE_MTP_ENORM_W + 1) * sizeof(float *),
               "loom_mtp_weights must be exactly its views, in role order");

/* Views of a stage's parameters (or grads); NULL where the stage lacks them. */
typedef struct {
  float *wte;             /* [Vp, h] on the first stage (and the last, when tied or predicting more tokens) */
  float *wpe;             /* [S, h] on the first stage, with learned positions */
  loom_block_weights *h;  /* [layer_end - layer_begin], local index */
  float *ln_f_w, *ln_f_b; /* [h], [h] on the last stage */
  float *lm_head;         /* [Vp, h] on the last stage: wte when tied */
  loom_mtp_weights *mtp;  /* [cfg.mtp_layers] on the last stage */
} loom_gpt_weights;

/* The part of the model a pipeline stage (or one chunk of it) holds. */
typedef struct {
  int layer_begin, layer_end; /* global layers [begin, end) */
  bool first, last;           /* holds the embedding / the final norm, head and loss */
} loom_stage_range;

/* Every layer, first and last: the whole model. */
loom_stage_range loom_stage_whole(const loom_gpt_config *cfg);
/* Layer kinds: a dense layer (0) and a MoE layer (1), whose tensors differ
 * (loom_gpt_layer_is_moe); layers of one kind hold the same tensors. */
enum { LOOM_LAYER_KINDS = 2 };
/* A range's parts for sizes that add up per tensor: *edges (its embedding
 * and head, no layer), and per kind k one of its layers of that kind alone
 * (kinds[k]) and how many it holds (counts[k]; 0: none, kinds[k] unset).
 * A range's sum is the edges' plus each kind's count times its layer's. */
void loom_stage_range_kinds(const loom_gpt_config *cfg, const loom_stage_range *r, loom_stage_range *edges,
                            loom_stage_range kinds[LOOM_LAYER_KINDS], int counts[LOOM_LAYER_KINDS]);
/* Model FLOPs of one training step of a stage's part on `tokens` tokens of
 * length T, by a formula of gpt_config.h. Megatron's: 6 x its matmul
 * parameters (q, k and v with the config's key/value heads, the output
 * projection, two MLP matrices or SwiGLU's three, and the LM head's on the
 * last stage) x tokens, plus 6 x its layers x q x T x tokens for causal
 * attention's scores and values (12, halved; q = heads x head dim, the
 * hidden size unless --kv-channels sets it; a windowed layer's T is
 * loom_attention_keys'). An MTP module adds its block as a layer, 3h +
 * 2h^2 for its norms and eh_proj, and the head's matmul again, as
 * Megatron's formula does. SC21's: 8 x the layers'
 * matmul parameters and 16 x layers x q x T, per token, and 6 x the
 * head's. Over the whole model, loom_gpt_train_flops. */
double loom_gpt_stage_train_flops(const loom_gpt_config *cfg, const loom_stage_range *range, int T, double tokens,
                                  loom_flops_formula formula);
/* The keys causal attention over T rows counts per query, as Megatron's
 * formula does: T (half the T x T pairs, twice per query over 2), or
 * under a window of W < T keys back its pairs T W - W^2 / 2, per query
 * 2 W - W^2 / T: what a window saves. */
double loom_attention_keys(int T, int window);

typedef struct {
  loom_gpt_config cfg;
  loom_stage_range range; /* the layers this part holds */
  int layers;             /* layer_end - layer_begin */
  int *layer_tensor;      /* [layers + 1] each layer's first tensor in the table, then the blocks' end */
  int tp_rank, tp_size;   /* this rank's slice of every partitioned tensor */
  loom_buffer params;     /* views in canonical order: wte, wpe, h.0.*, ..., ln_f.* (local shapes) */
  loom_buffer grads;      /* same layout as params */
  loom_buffer compute;    /* bf16 runs: the weights the model computes with, params rounded to bf16 (else empty) */
  bool compute_fresh;     /* AdamW's last step wrote compute as it stepped params: the next sync has nothing to do
                           * (a checkpoint or model load clears it) */
  loom_param_meta *meta;  /* [params.count] */
  loom_gpt_weights w, g;  /* named views into params and grads */
} loom_gpt_params;

/* Tensors in one block of cfg's model: the same in every layer. */
int loom_gpt_block_tensors(const loom_gpt_config *cfg, int layer);
/* Index in p's table of its first block tensor (the embedding's come first). */
int loom_gpt_first_block_tensor(const loom_gpt_params *p);
/* The same for any stage of cfg's model: the tensors its table lists before its blocks. */
int loom_gpt_tensors_before_blocks(const loom_gpt_config *cfg, const loom_stage_range *range);
/* Whether ZeRO cuts a model's experts into buckets of their own, sharded
 * over the ranks holding the same experts (the expert-data-parallel group,
 * tp x dp / ep of them) where the rest is sharded over dp: under expert
 * parallelism, where the ranks of a dp group hold different experts. */
static inline bool loom_gpt_zero_experts_apart(const loom_gpt_config *cfg) { return cfg->moe.ep > 1; }
/* Whether ZeRO-1 reduce-scatters and all-gathers the whole buffer in place
 * as one bucket (padded to dp pieces), rather than bucket by bucket. */
static inline bool loom_gpt_zero_in_place(const loom_gpt_config *cfg, int stage) {
  return stage == 1 && !loom_gpt_zero_experts_apart(cfg);
}
/* ZeRO's buckets of a stage's table: in place (loom_gpt_zero_in_place) one
 * bucket of every tensor; else each tensor before the blocks alone, then
 * each layer's tensors, then the rest (the final norm, an untied LM head),
 * and with the experts apart each layer's runs of experts' and of other
 * tensors as buckets of their own. Returns the bucket count n; with first
 * not NULL (room for the table's tensors + 1) bucket b holds tensors
 * [first[b], first[b + 1]). The one cut, for the optimizer (optim/zero.c)
 * and the memory model (plan/memory.c). */
int loom_gpt_zero_buckets(const loom_gpt_config *cfg, const loom_stage_range *range, int stage, int *first);
/* Elements per replica of one round of a bucket's all-gather into the
 * model (ZeRO-2's after each step): bounds the staging to dp x 16 MiB,
 * however large a bucket (wte) is. */
#define LOOM_ZERO_GATHER_ROUND ((size_t)1 << 22)
/* The sizes of that cut, each bucket padded to equal pieces over its group
 * (dp, or the experts' replicas), in elements of one tp rank's table: what
 * ZeRO's optimizer and runtime allocate (optim/zero.c,
 * pipeline/zero_runtime.c) and the memory model counts (plan/memory.c),
 * from this one function. */
typedef struct {
  size_t shard;       /* this replica's pieces, over all buckets */
  size_t max_shard;   /* the largest bucket's piece */
  size_t layer_max;   /* the largest layer's buckets, padded, together */
  size_t layer_shard; /* the largest layer's pieces, together */
  size_t edges;       /* the edge buckets, padded, together */
  size_t edge_shard;  /* the largest edge bucket's piece */
  size_t round;       /* a round of a bucket's collective, per replica: max_shard up to LOOM_ZERO_GATHER_ROUND */
  size_t slice;       /* the piece in transit: in place the shard, else a round */
  size_t staging;     /* a round from every replica of the largest group, where buckets cross one by one through
                       * it (ZeRO-2's gathers, ZeRO-1 not in place); else 0 */
} loom_zero_cut;
loom_zero_cut loom_gpt_zero_cut(const loom_gpt_config *cfg, const loom_stage_range *range, int tp, int dp, int stage);
/* Points the named views of w at the tensors [k0, k1) of p's table, tensor
 * k at addr[k - k0] (NULL: at nothing). Block views go to w->h[i], where i
 * counts the blocks from the first one of [k0, k1). */
void loom_gpt_bind_views(const loom_gpt_params *p, int k0, int k1, float *const *addr, loom_gpt_weights *w);

/* The canonical table of the stage `range` (NULL: every layer) on one TP
 * rank, without any memory for values: specs get names and local shapes
 * (data NULL), meta the metadata. With specs NULL, only counts. Returns the
 * number of tensors. */
int loom_gpt_param_table(const loom_gpt_config *cfg, const loom_stage_range *range, int tp_rank, int tp_size,
                         loom_tensor *specs, loom_param_meta *meta);
/* Allocates this TP rank's shards (tp_size 1: the whole model) of the
 * stage `range` (NULL: every layer) in `mem`, a backend's memory. cfg's
 * padded vocab must be a multiple of tp_size (see loom_gpt_config_for_tp). */
loom_status loom_gpt_params_init(loom_gpt_params *p, const loom_gpt_config *cfg, int tp_rank, int tp_size,
                                 const loom_stage_range *range, const loom_allocator *mem);
/* The elements a chunk's three buffers take as ZeRO `stage` (0: none)
 * over dp keeps them (loom_gpt_params_init, loom_gpt_params_init_for_zero):
 * the fp32 weights, the fp32 grads and, in bf16 runs, the bf16 weights
 * computed with; 0 where it keeps none. */
typedef struct {
  size_t params, grads, compute;
} loom_gpt_params_elements;
loom_gpt_params_elements loom_gpt_params_stored_elements(const loom_gpt_config *cfg, const loom_stage_range *range, int tp,
                                                         int dp, int stage);
/* The same for a run under ZeRO `stage` (1..3) over dp replicas
 * (optim/zero.h). ZeRO-1: params, grads and the bf16 copy are padded to a
 * multiple of dp elements (loom_buffer_init_padded), so the optimizer
 * reduce-scatters and all-gathers them in place. ZeRO-2: grads are a layout
 * without storage (loom_buffer_layout; g views NULL until a runtime points
 * them at a layer's transient buffer). ZeRO-3: the weights too, fp32 and
 * bf16. In bf16 runs, Megatron's distributed optimizer, params is a layout
 * without storage at every stage (w views NULL): each replica's optimizer
 * holds only its pieces of the fp32 master weights. */
loom_status loom_gpt_params_init_for_zero(loom_gpt_params *p, const loom_gpt_config *cfg, int tp_rank, int tp_size,
                                          const loom_stage_range *range, const loom_allocator *mem, int dp, int stage);
/* Points views [k0, k1) of b (p's params, grads or compute) at consecutive
 * places from base (NULL: at nothing), as the buffer lays them out, and
 * refreshes p's named views: ZeRO-2/3 lend a layer transient memory. */
void loom_gpt_params_point(loom_gpt_params *p, loom_buffer *b, int k0, int k1, void *base);
/* Refreshes p's named views (w, g) from its buffers' views. */
void loom_gpt_params_rebind(loom_gpt_params *p);
/* Whether p holds its fp32 master weights (all but the above). */
static inline bool loom_gpt_params_have_master(const loom_gpt_params *p) { return p->params.base != NULL; }
/* The same without grads (an empty grads buffer, g views NULL): for loading,
 * saving, exporting and resharding, which never train, at half the memory. */
loom_status loom_gpt_params_init_weights(loom_gpt_params *p, const loom_gpt_config *cfg, int tp_rank, int tp_size,
                                         const loom_stage_range *range, const loom_allocator *mem);
void loom_gpt_params_free(loom_gpt_params *p);
/* Draws every parameter from (seed, canonical name, global element index). */
void loom_gpt_params_randomize(loom_gpt_params *p, uint64_t seed);
/* The same for the flat elements [begin, end) of p's layout only, into dst
 * (that many floats of p's backend memory): a distributed optimizer's slice. */
void loom_gpt_params_randomize_slice(const loom_gpt_params *p, uint64_t seed, float *dst, size_t begin, size_t end);
/* Parameter elements one TP rank of the stage `range` (NULL: every layer)
 * holds, read off the table without allocating them; the vocab is padded as
 * a tp_size split pads it (unless cfg is already padded to a multiple of that).
 * The one source of parameter counts. */
size_t loom_gpt_param_count(const loom_gpt_config *cfg, const loom_stage_range *range, int tp_size);
/* Of the whole model's, those a token computes with: a MoE model's total
 * less, in each layer, the experts beyond its top-k (Mixtral 8x7B's 12.9B
 * of 46.7B). */
size_t loom_gpt_active_param_count(const loom_gpt_config *cfg);
/* Of the stage `range`'s (NULL: every layer's) elements, its routed
 * experts' on one rank (those of loom_gpt_local_experts, their slices under
 * expert tensor parallelism). */
size_t loom_gpt_expert_param_count(const loom_gpt_config *cfg, const loom_stage_range *range);
/* Whether a tensor's grad is summed over the TP group each step
 * (loom_gpt_sum_replicated_grad): one every TP rank holds alike (norms,
 * wpe, row-parallel biases) whose grad a rank computes from its positions
 * alone under sequence parallelism, or from its heads alone (per_head). */
static inline bool loom_param_tp_summed(const loom_param_meta *m, bool sequence_parallel) {
  return m->tp_replicated && (sequence_parallel || m->per_head);
}
/* Of those, the ones whose grads are so summed (tp > 1). */
size_t loom_gpt_tp_summed_param_count(const loom_gpt_config *cfg, const loom_stage_range *range, int tp_size,
                                      bool sequence_parallel);
/* Whether a tensor is a vocabulary table: the embedding, or an untied LM head. */
static inline bool loom_param_is_vocab_table(const loom_param_meta *m) {
  return m->role == LOOM_ROLE_WTE || m->role == LOOM_ROLE_LM_HEAD;
}
/* Of the stage's elements, those of its vocabulary tables (bf16 runs read
 * them as the bf16 copy holds them, with no fp32 scratch). */
size_t loom_gpt_vocab_param_count(const loom_gpt_config *cfg, const loom_stage_range *range, int tp_size);
/* Whether the stage holds the second copy of the tied wte (the last stage
 * when it is not also the first): its grads are left out of the norm, and it
 * is neither saved nor counted twice. The one source of tied ownership. */
static inline bool loom_stage_holds_tied_copy(const loom_stage_range *r) { return r->last && !r->first; }
/* Copies between this rank's shards and a whole (tp_size 1, all layers)
 * model's parameters in the same backend's memory, matching tensors by
 * canonical name: to_local scatters full into p, else p's shards are
 * written into full. Rows past the smaller padded vocab are skipped. */
void loom_gpt_params_copy_shards(loom_gpt_params *p, loom_gpt_params *full, int to_local);
/* Index of the view named `name`, or -1. */
int loom_gpt_params_find(const loom_gpt_params *p, const char *name);

#endif
