/* The op interface: every compute op a layer calls, as one table per backend.
 *
 * Layers never call BLAS or loops directly; they call through a loom_ops
 * table. The CPU backend (cpu/) is fast: OpenBLAS sgemm and OpenMP loops. The
 * reference backend (ref/) is naive loops written for clarity; it is the
 * oracle the tests compare every backend against.
 *
 * Conventions (as llm.c): rows are tokens in [s, b] order (sequence-major),
 * linear weights are [out, in], and every backward op ADDS into its gradient
 * outputs (dinp, dweight, dbias), so micro-batch accumulation is free. The one
 * exception is crossentropy_backward, which writes dlogits (in place is
 * allowed) because it starts the backward pass. */
#ifndef LOOM_OPS_H
#define LOOM_OPS_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "backend/fp8_math.h"
#include "core/tensor.h"

/* Keyed dropout: element index i of a site is kept iff
 * uniform(seed, stream, i) >= p; kept values are scaled by 1/(1-p). The
 * caller builds index from global coordinates (sample, position, feature), so
 * masks do not depend on the partition plan. p == 0 disables it. */
typedef struct {
  float p;
  uint64_t seed;
  uint64_t stream;        /* hash of (step, layer, site) */
  int64_t sample_offset;  /* global index of local sample b = 0 */
  int seq_offset;         /* position of local row t = 0 in the rank's sequence (sequence parallelism) */
  int seq_total;          /* global sequence length; 0 means the call's T */
  int cp, cp_rank;        /* context parallelism (cp > 1): the rank's sequence is its chunks of the global one
                           * (loom_cp_position); else it is the global one */
} loom_dropout;

/* A bf16 GEMM operand: bf16 bits, or fp32 that holds bf16 values (a bf16
 * run's activations and their grads); exactly one of the two is set, or
 * neither for an operand the call does not read. A backend converts what
 * its GEMM needs, exactly. */
typedef struct {
  const uint16_t *bf16;
  const float *f32;
} loom_bf16_operand;
static inline loom_bf16_operand loom_bf16_bits(const uint16_t *x) { return (loom_bf16_operand){.bf16 = x}; }
static inline loom_bf16_operand loom_bf16_values(const float *x) { return (loom_bf16_operand){.f32 = x}; }
static inline bool loom_bf16_operand_set(loom_bf16_operand x) { return x.bf16 || x.f32; }
/* A tensor a caller may also keep as bits: those where kept (bits set), else its values. */
static inline loom_bf16_operand loom_bf16_kept(const float *values, const uint16_t *bits) {
  return bits ? loom_bf16_bits(bits) : loom_bf16_values(values);
}

/* RoPE's frequencies: the base theta, and where factor > 0 (and not yarn) Llama 3.1's
 * rope_scaling ("rope_type": "llama3", as transformers computes it): the
 * frequencies whose wavelength exceeds original_max_position /
 * low_freq_factor are divided by factor, those shorter than
 * original_max_position / high_freq_factor kept, and those between
 * interpolated linearly in original_max_position / wavelength. */
typedef struct {
  float theta;
  float factor; /* 0: no scaling */
  float low_freq_factor, high_freq_factor;
  int original_max_position;
  /* yarn (1): the factor is YaRN's ("rope_type": "yarn", as transformers
   * computes it for GPT-OSS and DeepSeek): the frequencies below the
   * correction range (dims that turn fewer than beta_slow times over
   * original_max_position) divided by factor, those above it (beta_fast)
   * kept, a linear ramp between, its ends rounded outward to whole dims
   * where truncate is 1; and cos and sin scaled by attention_factor (each
   * of q and k, so the scores by its square; 0 means 1). */
  int yarn;
  float beta_fast, beta_slow;
  int truncate;
  float attention_factor;
} loom_rope;

/* A gated linear unit's activation over gate | up: out = (up' + offset)
 * g' sigmoid(alpha g'), g' the gate capped at clamp and up' the up value
 * clamped to [-clamp, clamp] (clamp 0: neither). SwiGLU is alpha 1 (0
 * means 1), no clamp, no offset; GPT-OSS's experts alpha 1.702, clamp 7,
 * offset 1 (Megatron's --quick-geglu, --activation-func-clamp-value 7,
 * --glu-linear-offset 1). */
typedef struct {
  float alpha, clamp, offset;
} loom_glu;
#define LOOM_QUICK_GELU_ALPHA 1.702f /* quick GELU's: g sigmoid(1.702 g) */
/* Whether a unit is SwiGLU itself (alpha 1 or its 0, no clamp, no offset). */
static inline int loom_glu_is_swiglu(loom_glu u) { return (u.alpha == 0.0f || u.alpha == 1.0f) && u.clamp == 0.0f && u.offset == 0.0f; }

/* Shapes of a causal self-attention call on the local heads. */
typedef struct {
  int T, B;          /* sequence length, micro-batch */
  int heads;         /* local query heads in this call */
  int kv_heads;      /* local key/value heads, dividing heads: each serves heads / kv_heads query heads
                      * (grouped-query attention; = heads for multi-head, 1 for multi-query) */
  int head_dim;      /* q's and k's */
  int v_head_dim;    /* v's and the output's, where it differs (multi-head latent attention's); 0: head_dim */
  float softmax_scale; /* the scores' scale (MLA's with YaRN's attention-scale factor squared); 0: 1 / sqrt(head_dim) */
  int head_offset;   /* global index of local head 0 (dropout keys) */
  int total_heads;   /* global heads (dropout keys) */
  int window;        /* sliding-window attention (Megatron's --window-size left): a query sees the keys at most this many
                      * positions before it (loom_attn_sees); 0: every earlier key */
} loom_attn_shape;

/* The widest head the attention takes on every backend: the fused CUDA
 * kernel's tiles in a block's shared memory, and FlashAttention's bound. */
#define LOOM_ATTN_MAX_HEAD_DIM 256

/* The width of each v head and output head. */
static inline int loom_attn_v_dim(const loom_attn_shape *s) { return s->v_head_dim > 0 ? s->v_head_dim : s->head_dim; }
/* What multiplies q . k. */
static inline float loom_attn_scale(const loom_attn_shape *s) {
  return s->softmax_scale > 0.0f ? s->softmax_scale : 1.0f / sqrtf((float)s->head_dim);
}
/* Floats in one [t, b] row of qkv: q of every query head | k | v of every key/value head; q and k
 * head_dim wide, v loom_attn_v_dim. */
static inline size_t loom_attn_qkv_width(const loom_attn_shape *s) {
  return (size_t)(s->heads + s->kv_heads) * s->head_dim + (size_t)s->kv_heads * loom_attn_v_dim(s);
}
/* Floats in one [t, b] row of the output: every query head's loom_attn_v_dim. */
static inline size_t loom_attn_out_width(const loom_attn_shape *s) { return (size_t)s->heads * loom_attn_v_dim(s); }
/* Floats in one [t, b] row of a ring block's keys and values: k | v of every key/value head. */
static inline size_t loom_attn_kv_width(const loom_attn_shape *s) {
  return (size_t)s->kv_heads * (s->head_dim + loom_attn_v_dim(s));
}
/* The key/value head query head h reads. */
static inline int loom_attn_kv_head(const loom_attn_shape *s, int h) { return h / (s->heads / s->kv_heads); }
/* Whether kv_heads is at least 1 and divides heads. */
static inline int loom_attn_shape_valid(const loom_attn_shape *s) { return s->kv_heads >= 1 && s->heads % s->kv_heads == 0; }
#define LOOM_ATTN_SHAPE_RULE "attention: key/value heads must divide the query heads (grouped-query attention)"

typedef struct {
  float lr, beta1, beta2, eps, weight_decay;
  float grad_scale; /* multiplies each grad first: global-norm clipping's factor, 1 without (never 0) */
  int step; /* 1-based, for bias correction */
} loom_adamw_args;

/* FP8 GEMMs (fp8_math.h's formats and scales). An operand: codes [rows, K]
 * row-major, K (the contracted dimension) contiguous, as cuBLASLt takes
 * both operands of an FP8 matmul on Hopper ("TN"); and the fp32 factors
 * that dequantise them, one per block of block_rows x block_k codes,
 * scale_inv[(r / block_rows) * loom_fp8_k_blocks(K, block_k) + k / block_k] (fp8_math.h). */
typedef struct {
  const uint8_t *codes;
  const float *scale_inv;
  int format; /* loom_fp8_format */
  int block_rows, block_k;
} loom_fp8_matrix;

/* How fp8_quantize casts: into codes of `format`, under one scale for the
 * whole tensor (scale > 0: tensorwise and delayed scaling), or each block of
 * block_rows x block_k codes (in the output's layout) under its own, from its
 * amax: fp32 (loom_fp8_scale, blockwise) or E8M0 (loom_mx_scale, MXFP8). */
typedef struct {
  int format; /* loom_fp8_format */
  float scale;
  int block_rows, block_k;
  bool mx;
} loom_fp8_quant;

typedef struct loom_ops loom_ops;
struct loom_ops {
  const char *name;
  /* The backend's tensor memory: allocation, copies, fills and host
   * transfers. Every array the ops below read or write comes from it. */
  const loom_allocator *mem;
  /* The backend's own state (a CUDA context: its device, stream, cuBLAS
   * handle and scratch), NULL where there is none. Every op receives its
   * table as `be`, so no backend keeps state in process-wide globals and two
   * contexts never share any. */
  void *state;

  /* out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC] (bias may be NULL) */
  void (*matmul_forward)(const loom_ops *be, float *out, const float *inp, const float *weight, const float *bias,
                         int N, int C, int OC);
  /* dinp[N,C] += dout @ weight; dweight[OC,C] += dout^T @ inp; dbias[OC] += sum dout.
   * Any of dinp, dweight and dbias may be NULL: a split backward computes the
   * input grad and the weight grad at different times. */
  void (*matmul_backward)(const loom_ops *be, float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int C, int OC);

  /* out[N,C] = (inp - mean) * rstd * weight + bias; saves mean[N], rstd[N] */
  void (*layernorm_forward)(const loom_ops *be, float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C, float eps);
  void (*layernorm_backward)(const loom_ops *be, float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C);

  /* RMSNorm (Llama's): out[N,C] = inp * rstd * weight; saves rstd[N] = 1 / sqrt(mean(inp^2) + eps) */
  void (*rmsnorm_forward)(const loom_ops *be, float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                          float eps);
  /* dinp[N,C] += its grad; dweight[C] += sum over rows of dout * inp * rstd */
  void (*rmsnorm_backward)(const loom_ops *be, float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C);

  /* SwiGLU over the rows of inp[N, 2F], each its gate | up halves: out[N,F] = silu(gate) * up, or the gated unit glu
   * says (loom_glu) */
  void (*swiglu_forward)(const loom_ops *be, float *out, const float *inp, int N, int F, loom_glu glu);
  /* dinp[N, 2F] += the grads of both halves (0 where a clamp held the value) */
  void (*swiglu_backward)(const loom_ops *be, float *dinp, const float *dout, const float *inp, int N, int F, loom_glu glu);

  /* Rotary position embedding in place. x holds T*B rows [t, b] of `stride`
   * floats; the first `heads` heads of D of each row are turned: dims i and
   * i + D/2 (the halves, as Megatron and Hugging Face pair them) by the
   * angle (pos_offset + t) times dims i's frequency (loom_rope_angle). Backward turns
   * the grads back by the same angle (the transpose). */
  void (*rope_forward)(const loom_ops *be, float *x, int T, int B, int stride, int heads, int D, int pos_offset,
                       loom_rope rope);
  void (*rope_backward)(const loom_ops *be, float *dx, int T, int B, int stride, int heads, int D, int pos_offset,
                        loom_rope rope);

  /* GELU, tanh approximation, elementwise over n */
  void (*gelu_forward)(const loom_ops *be, float *out, const float *inp, size_t n);
  void (*gelu_backward)(const loom_ops *be, float *dinp, const float *dout, const float *inp, size_t n);

  /* Causal softmax attention, flash attention's contract: nothing of size
   * T x T is kept; a query sees the keys loom_attn_sees says (its own and
   * every earlier one's, or under a window the latest window + 1). qkv[T,B,H*D+K*(D+Dv)] rows are q of the H local
   * query heads | k | v of the K local key/value heads (loom_attn_qkv_width; q and k D = head_dim wide, v
   * Dv = loom_attn_v_dim); out[T,B,H*Dv] = softmax(c q k^T) (dropped out) v, c = loom_attn_scale; lse[B,H,T]
   * saves each query row's log-sum-exp of its scaled scores, from which the
   * backward rebuilds the probabilities: p = exp(c q.k - lse). */
  void (*attention_forward)(const loom_ops *be, float *out, float *lse, const float *qkv, const loom_attn_shape *s,
                            const loom_dropout *drop);
  /* dqkv += the grads of q, k and v, from dout and the forward's out, qkv
   * and lse. The softmax's backward needs sum_k p dp for each row, which is
   * dout . out (dropout included), so no row is stored or summed twice. */
  void (*attention_backward)(const loom_ops *be, float *dqkv, const float *dout, const float *out, const float *qkv,
                             const float *lse, const loom_attn_shape *s, const loom_dropout *drop);
  /* One block of context-parallel (ring) attention, the same contract
   * over blocks of keys: the local queries q (Tq rows [t, b] of the qkv
   * layout, loom_attn_qkv_width apart, q first) against a block of keys
   * and values kv (Tk rows [t, b] of k | v of the K key/value heads,
   * loom_attn_kv_width apart), a key seen by a query where loom_attn_sees says so of their
   * global positions (q_pos[Tq] and k_pos[Tk], host memory), dropout keyed by
   * the global positions (s->T: the whole sequence). The block's softmax
   * joins out[Tq, B, H Dv] and lse[B, H, Tq] by their log-sum-exps (first:
   * it is the first block, whose rows are written; a row that sees none of
   * its keys gets 0 and -inf), so that after every block they are the
   * attention over all the keys. */
  void (*attention_block_forward)(const loom_ops *be, float *out, float *lse, const float *q, const float *kv, int Tq,
                                  int Tk, const int *q_pos, const int *k_pos, const loom_attn_shape *s,
                                  const loom_dropout *drop, bool first);
  /* dq (rows as q's) and dkv (as kv's) += the block's share of the grads,
   * from dout and the out and lse every block made (the softmax's
   * sum_k p dp for each row is dout . out, which spans the blocks). */
  void (*attention_block_backward)(const loom_ops *be, float *dq, float *dkv, const float *dout, const float *out,
                                   const float *q, const float *kv, int Tq, int Tk, const int *q_pos, const int *k_pos,
                                   const float *lse, const loom_attn_shape *s, const loom_dropout *drop);

  /* Attention sinks (GPT-OSS's; Megatron-Core's learnable softmax offset):
   * each local head h's logit sinks[h] joins every row's softmax
   * denominator and takes no value. Applied after an attention's every
   * block (once, however many a ring merged), in place on its out[T,B,H*Dv]
   * and lse[B,H,T]: lse' = log(exp(lse) + exp(sink)) and out *= exp(lse -
   * lse'), so the backward above, given out' and lse', computes the
   * attention's grads with the sink in every row (its sum_k p dp is dout .
   * out' still: the sink adds no value). sinks NULL: logit 0 for every
   * head (Megatron's off-by-one softmax). */
  void (*attention_sink_forward)(const loom_ops *be, float *out, float *lse, const float *sinks, const loom_attn_shape *s);
  /* dsinks[h] += the sinks' grads: minus the sum over head h's rows of
   * exp(sinks[h] - lse') (dout . out'), from the forward's out' and lse'. */
  void (*attention_sink_backward)(const loom_ops *be, float *dsinks, const float *dout, const float *out, const float *lse,
                                  const float *sinks, const loom_attn_shape *s);

  /* out[T,B,C] = wte[tokens[t,b] - vocab_start] for tokens this call owns
   * (vocab_start <= token < vocab_start + rows), 0 for the rest: under
   * tensor parallelism each rank holds one vocab range. */
  void (*embedding_forward)(const loom_ops *be, float *out, const int *tokens, const float *wte, int vocab_start, int rows,
                            int T, int B, int C);
  void (*embedding_backward)(const loom_ops *be, float *dwte, const float *dout, const int *tokens, int vocab_start, int rows,
                             int T, int B, int C);
  /* embedding_forward from a bf16 table (bf16 runs' weights, read in place), each value widened exactly. */
  void (*embedding_forward_bf16)(const loom_ops *be, float *out, const int *tokens, const uint16_t *wte, int vocab_start,
                                 int rows, int T, int B, int C);
  /* out[t,b,:] += wpe[pos_offset + t] */
  void (*position_forward)(const loom_ops *be, float *out, const float *wpe, int T, int B, int C, int pos_offset);
  void (*position_backward)(const loom_ops *be, float *dwpe, const float *dout, int T, int B, int C, int pos_offset);
  /* out[N,OC] += bias[OC] on every row; backward: dbias += column sums of dout */
  void (*bias_forward)(const loom_ops *be, float *out, const float *bias, int N, int OC);
  void (*bias_backward)(const loom_ops *be, float *dbias, const float *dout, int N, int OC);

  /* Cross-entropy in pieces, so that a vocab split across ranks only needs
   * N-sized reductions between them. Rows are `width` wide; only the first V
   * columns are vocabulary (the rest is padding that never enters the loss).
   * lse[n] = log sum_{v<V} exp(logits[n,v]). */
  void (*logsumexp)(const loom_ops *be, float *lse, const float *logits, int N, int V, int width);
  /* picked[n] = logits[n, targets[n] - vocab_start] when that column is one
   * of the first V, else 0 (another rank's column, or a masked target < 0). */
  void (*pick_targets)(const loom_ops *be, float *picked, const float *logits, const int *targets, int vocab_start,
                       int N, int V, int width);
  /* dlogits[n,v] = dloss * (exp(logits[n,v] - lse[n]) - [vocab_start + v == targets[n]])
   * for v < V; 0 for padding columns and masked rows. dlogits may alias logits. */
  void (*crossentropy_backward)(const loom_ops *be, float *dlogits, const float *logits, const float *lse, const int *targets,
                                int vocab_start, float dloss, int N, int V, int width);

  /* losses[n] = lse[n] - picked[n] for a scored target, 0 where targets[n] < 0. */
  void (*crossentropy_losses)(const loom_ops *be, float *losses, const float *lse, const float *picked, const int *targets, int N);
  /* Merging partial log-sum-exps across ranks: x[i] = exp(x[i] - shift[i]),
   * then (after summing) x[i] = shift[i] + log(x[i]). */
  void (*exp_shifted)(const loom_ops *be, float *x, const float *shift, size_t n);
  void (*log_shifted)(const loom_ops *be, float *x, const float *shift, size_t n);

  /* Greedy prediction: idx[n] = first column of the largest of the first V
   * logits of row n, val[n] that logit (V == 0: -inf and -1). */
  void (*argmax)(const loom_ops *be, float *val, int *idx, const float *logits, int N, int V, int width);

  /* out = a + b */
  void (*add)(const loom_ops *be, float *out, const float *a, const float *b, size_t n);
  /* acc += x */
  void (*accumulate)(const loom_ops *be, float *acc, const float *x, size_t n);
  /* sum of squares in double */
  double (*sumsq)(const loom_ops *be, const float *x, size_t n);
  /* out[i] = sumsq(x[i], n[i]) for count arrays, each summed as sumsq sums
   * it: one call for a step's grads, so a device backend waits once. */
  void (*sumsq_batch)(const loom_ops *be, const float *const *x, const size_t *n, int count, double *out);

  /* General matrix product for algorithms above the layers (gradient
   * compression): row-major c[M,N] = alpha op(a) op(b) + beta c, a [M,K]
   * ([K,M] when ta), b [K,N] ([N,K] when tb), all packed. beta 0 ignores
   * what c held. */
  void (*gemm)(const loom_ops *be, bool ta, bool tb, int M, int N, int K, float alpha, const float *a, const float *b,
               float beta, float *c);
  /* Makes the r columns of row-major x[n,r] orthonormal, in order, by
   * modified Gram-Schmidt with two passes of projections (dot products in
   * double); a column that lies, numerically, in the span of the ones
   * before it becomes zero (op_math.h's loom_orthonormal_scale). */
  void (*orthonormalize)(const loom_ops *be, float *x, int n, int r);
  /* Scaled sign compression (error-feedback signSGD): msg[0] holds, as a
   * float's bits, the mean magnitude of x[n] (summed in double), and bit b
   * of msg[1 + w] is 1 where x[32 w + b] >= 0 (unused bits 0);
   * loom_sign_message_words(n) words in all. unpack_add adds
   * weight * mean * (+1 or -1) to each y[i]. */
  void (*sign_pack)(const loom_ops *be, uint32_t *msg, const float *x, size_t n);
  void (*sign_unpack_add)(const loom_ops *be, float *y, const uint32_t *msg, size_t n, float weight);

  /* Mixture-of-experts token movement, rows of width C. rows_gather:
   * out[i] = x[rows[i]] for i < M (the tokens into their experts' order).
   * rows_combine: y[n] = sum over j < k, in order, of w[n k + j] (1 when w
   * is NULL) times x[slots[n k + j]] for n < N (the experts' outputs back
   * into token order; unweighted, the gather's backward); a slot < 0 (a
   * token its expert dropped) adds nothing. rows_combine_backward:
   * dx[slots[n k + j]] = w[n k + j] dy[n] (each slot once: the slots are
   * distinct) and, where dw is not NULL, dw[n k + j] = dy[n] . x[slots[n k + j]]
   * (0 for a dropped slot). Each element is one product or one ordered sum,
   * so backends differ at most by a fused multiply-add's rounding. */
  /* The experts' linears over their rows (a grouped GEMM): expert e's
   * counts[e] consecutive rows of inp (experts in order) times its weight,
   * the e-th [OC,C] matrix of weight: out rows as matmul_forward's,
   * backward's grads as matmul_backward's (accumulated; dinp or dweight
   * NULL: not computed), no bias. counts is host memory; an expert with no
   * rows costs nothing. */
  void (*grouped_matmul_forward)(const loom_ops *be, float *out, const float *inp, const float *weight, const int *counts,
                                 int experts, int C, int OC);
  void (*grouped_matmul_backward)(const loom_ops *be, float *dinp, float *dweight, const float *dout, const float *inp,
                                  const float *weight, const int *counts, int experts, int C, int OC);
  void (*rows_gather)(const loom_ops *be, float *out, const float *x, const int *rows, int M, int C);
  void (*rows_combine)(const loom_ops *be, float *y, const float *x, const int *slots, const float *w, int N, int k, int C);
  void (*rows_combine_backward)(const loom_ops *be, float *dx, float *dw, const float *dy, const float *x, const int *slots,
                                const float *w, int N, int k, int C);

  /* In-place keyed dropout on x[T,B,C]: element (t,b,c) has index
   * ((sample_offset+b)*T + t)*C + c. Backward applies the same mask to dx. */
  void (*dropout_forward)(const loom_ops *be, float *x, int T, int B, int C, const loom_dropout *drop);
  void (*dropout_backward)(const loom_ops *be, float *dx, int T, int B, int C, const loom_dropout *drop);

  /* bf16 stored as its 16 raw bits, rounded by op_math.h's loom_bf16_round
   * on every backend; from_bf16 is exact. */
  void (*to_bf16)(const loom_ops *be, uint16_t *out, const float *in, size_t n);
  void (*from_bf16)(const loom_ops *be, float *out, const uint16_t *in, size_t n);
  /* x[i] = the bf16 value nearest x[i], kept in fp32: what a bf16 tensor holds. */
  void (*round_bf16)(const loom_ops *be, float *x, size_t n);
  /* bf16 runs' linears: matmul_forward and matmul_backward with the weight
   * [OC,C] in bf16 (raw bits, read in place) and inp and dout bf16 operands:
   * bits, or fp32 holding bf16 values, as every activation and activation
   * grad of a bf16 run does (other values are outside the contract: a
   * backend may round them). Each product of two bf16 values is exact in
   * fp32 and the sums are fp32, so backends differ by summation order
   * alone; out and the grads are fp32, dbias the sum of dout's values.
   * dweight is the fp32 grad, accumulated; weight may be NULL when dinp is,
   * inp when dweight is. */
  void (*matmul_forward_bf16)(const loom_ops *be, float *out, loom_bf16_operand inp, const uint16_t *weight,
                              const float *bias, int N, int C, int OC);
  void (*matmul_backward_bf16)(const loom_ops *be, float *dinp, float *dweight, float *dbias, loom_bf16_operand dout,
                               loom_bf16_operand inp, const uint16_t *weight, int N, int C, int OC);

  /* FP8 (fp8_math.h). fp8_amax: the largest magnitude of x[n] (NaN where
   * one is NaN), as a host value. */
  float (*fp8_amax)(const loom_ops *be, loom_bf16_operand x, size_t n);
  /* codes and scale_inv (loom_fp8_matrix's layout) of x[R,C], or of its
   * transpose [C,R] when transpose, cast under q with fp8_math.h's
   * loom_fp8_encode. */
  void (*fp8_quantize)(const loom_ops *be, uint8_t *codes, float *scale_inv, loom_bf16_operand x, int R, int C,
                       bool transpose, const loom_fp8_quant *q);
  /* c[M,N] = (c +, when accumulate) the FP8 product of a [M,K] and b [N,K]
   * by its definition: for each block of block_k columns (a's and b's
   * alike), in order, the fp32 sum of the products of the codes' values
   * (each exact in fp32) times a's and b's scale_inv for the block
   * (multiplied first), added in fp32. Backends differ by the order of the
   * sums within a block alone. */
  void (*fp8_gemm)(const loom_ops *be, float *c, bool accumulate, const loom_fp8_matrix *a, const loom_fp8_matrix *b,
                   int M, int N, int K);

  /* AdamW with decoupled weight decay, over n elements. compute (NULL: none)
   * gets each updated parameter rounded to bf16 in the same pass: a bf16
   * run's compute copy, as to_bf16 would write it. */
  void (*adamw)(const loom_ops *be, float *param, const float *grad, float *m, float *v, uint16_t *compute, size_t n,
                const loom_adamw_args *args);
};

const loom_ops *loom_ops_cpu(void);
const loom_ops *loom_ops_ref(void);
/* The CPU kernels on memory host code cannot touch (guarded/). */
const loom_ops *loom_ops_guarded(void);

/* 32-bit words of a sign_pack message for n values: the mean, then the bits. */
static inline size_t loom_sign_message_words(size_t n) { return 1 + (n + 31) / 32; }

/* Shared pieces both backends use (one definition, no duplicated logic). */
void loom_host_crossentropy_losses(const loom_ops *be, float *losses, const float *lse, const float *picked, const int *targets, int N);
void loom_host_exp_shifted(const loom_ops *be, float *x, const float *shift, size_t n);
void loom_host_log_shifted(const loom_ops *be, float *x, const float *shift, size_t n);
/* Serial on purpose: every data-parallel replica must get the same bits from
 * the same input, whatever its thread count (PowerSGD's P). */
/* sumsq_batch by the backend's own sumsq, one array at a time (host backends). */
void loom_host_sumsq_batch(const loom_ops *be, const float *const *x, const size_t *n, int count, double *out);
void loom_host_orthonormalize(const loom_ops *be, float *x, int n, int r);
/* attention_sink_forward and _backward on host memory (the reference and CPU backends'). */
void loom_host_attention_sink_forward(const loom_ops *be, float *out, float *lse, const float *sinks, const loom_attn_shape *s);
void loom_host_attention_sink_backward(const loom_ops *be, float *dsinks, const float *dout, const float *out, const float *lse,
                                       const float *sinks, const loom_attn_shape *s);
/* The FP8 ops on host memory: amax and quantize (the reference and CPU
 * backends'), and the GEMM's definition as loops (the reference's). */
float loom_host_fp8_amax(const loom_ops *be, loom_bf16_operand x, size_t n);
void loom_host_fp8_quantize(const loom_ops *be, uint8_t *codes, float *scale_inv, loom_bf16_operand x, int R, int C,
                            bool transpose, const loom_fp8_quant *q);
void loom_host_fp8_gemm(const loom_ops *be, float *c, bool accumulate, const loom_fp8_matrix *a, const loom_fp8_matrix *b,
                        int M, int N, int K);
float loom_gelu_value(float x);
float loom_gelu_grad(float x);
/* Column of the first largest of z[0..V), -1 when V == 0. */
int loom_row_argmax(const float *z, int V);
/* 1 if dropout element `index` survives, 0 if dropped. */
int loom_dropout_keep(const loom_dropout *d, uint64_t index);
/* Global dropout index of element (t, b, c) of a [T,B,C] site. */
uint64_t loom_dropout_index(const loom_dropout *d, int t, int b, int c, int T, int C);
/* Aborts with LOOM_ATTN_SHAPE_RULE unless loom_attn_shape_valid (the host backends' check; the CUDA
 * backend, which links nothing of loom's C library, checks the same rule itself). */
void loom_attn_shape_check(const loom_attn_shape *s);
/* Dropout index of attention element (b, h, tq, tk). */
uint64_t loom_attn_dropout_index(const loom_dropout *d, const loom_attn_shape *s, int b, int h,
                                 int tq, int tk);

#endif
