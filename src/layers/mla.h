/* Multi-head latent attention's projections (DeepSeek-V2 and V3's;
 * Megatron-Core's MLASelfAttention): the front of a block's attention, from
 * the normed hidden state x to the attention's q | k | v rows, and back.
 *
 *   q  = RMSNorm(x W_qa) W_qb             (no q latent: x W_q)
 *   c  = RMSNorm(x W_kva's first kv_rank) k_nope | v = c W_kvb
 *   pe = x W_kva's last rope              the RoPE key every head shares
 *
 * Each q head is nope | rope wide and RoPE turns its last `rope` dims; each
 * k head is its own k_nope beside the turned pe; each v head is v wide.
 *
 * Under tensor parallelism the down projections and the latents' norms are
 * replicated (tp_replicated: computed on this rank's rows outside the
 * region, their grads this rank's rows' share under sequence parallelism,
 * summed over tp as a norm's are); the normed latents and pe enter the
 * region (an all-gather along the sequence under SP), and the up
 * projections are column-parallel over the heads. Leaving backward, the
 * latents' and pe's grads, each rank's heads' part, are summed over tp
 * (reduce-scattered under SP) before the norms' backward. Every weight grad
 * is taken in the input half of a split backward. */
#ifndef LOOM_MLA_H
#define LOOM_MLA_H

#include "backend/ops.h"
#include "layers/gpt_params.h"
#include "tensor_parallel/linear.h"
#include "tensor_parallel/parallel_state.h"

typedef struct {
  int q_rank;  /* q's latent (0: q projected from x) */
  int kv_rank; /* the compressed keys and values */
  int nope;    /* a q or k head's part without RoPE */
  int rope;    /* its RoPE part */
  int v;       /* a v head's width */
  bool bf16;   /* round every activation and activation grad to bf16 values; the linears run in bf16 */
} loom_mla_shape;

/* The weights its three linears compute with: fp32, or the bf16 copy's bits
 * (gpt_params.h's mla views: down, q's up, kv's up); the norms' from the
 * block's views. */
typedef struct {
  loom_linear_weight down, q_up, kv_up;
} loom_mla_weights;

/* A config's MLA shape (every size 0 where it has none). */
static inline loom_mla_shape loom_mla_shape_of(const loom_gpt_config *c) {
  return (loom_mla_shape){.q_rank = c->mla.q_lora_rank, .kv_rank = c->mla.kv_lora_rank, .nope = c->mla.qk_head_dim,
                          .rope = c->mla.qk_pos_emb_head_dim, .v = c->mla.v_head_dim, .bf16 = c->bf16};
}

/* A q or k head's width, and the widest latent (the scratch's rows). */
static inline int loom_mla_qk_head(const loom_mla_shape *m) { return m->nope + m->rope; }
static inline int loom_mla_widest(const loom_mla_shape *m) {
  const int w = m->q_rank > m->kv_rank ? m->q_rank : m->kv_rank;
  return w > m->rope ? w : m->rope;
}

/* Saved for backward, per layer: n rows outside the region, N inside. */
typedef struct {
  float *q_raw, *kv_raw; /* [n, q_rank], [n, kv_rank]: the down projections' outputs, the norms' inputs */
  float *rstd;           /* [2 n]: the q latent's norm's, then the kv latent's */
  float *q_in, *kv_in;   /* [N, q_rank], [N, kv_rank]: the normed latents in the region (q_in NULL: no q latent) */
} loom_mla_acts;

/* Shared by every layer, never outliving a call. */
typedef struct {
  float *q;              /* [N, heads (nope + rope)]: q's up projection; in backward its grad */
  float *kv;             /* [N, heads (nope + v)]: the kv up projection; in backward its grad */
  float *pe;             /* [N, rope]: the shared RoPE key in the region; in backward its grad */
  float *pe_head;        /* [N, rope]: one head's share of that grad */
  float *local, *local2; /* [n, loom_mla_widest] */
  float *full;           /* [N, loom_mla_widest]: a latent's grad in the region */
} loom_mla_scratch;

/* Where backward finds x: x_full[N, h] (fp32 runs), or x_bits[N, h] (bf16
 * runs: bits alone); without a q latent x brought into the region (q's
 * input), else this rank's rows first. */
typedef struct {
  float *full;
  uint16_t *bits;
} loom_mla_input;

/* qkv[N, heads (2 (nope + rope) + v)], the attention's rows (q and k turned),
 * from x[n, h], this rank's normed rows, kept in `kept`; v: the norms'
 * weights, cw the linears' as they compute. */
void loom_mla_forward(float *qkv, loom_mla_acts *a, loom_mla_scratch *s, loom_mla_input kept, const float *x,
                      const loom_block_weights *v, const loom_mla_weights *cw, const loom_mla_shape *m, int T, int B,
                      int h, int heads, float eps, loom_rope rope, const loom_tp *tp, const loom_ops *ops);
/* dx[n, h] = the grad of x (written), from dqkv, the grad of the attention's
 * rows (read, turned back in place); every MLA weight's grad added to g.
 * dfull[N, h] is scratch (may alias dx without SP). */
void loom_mla_backward(float *dx, float *dfull, loom_block_weights *g, loom_mla_scratch *s, const loom_mla_acts *a,
                       float *dqkv, loom_mla_input kept, const loom_block_weights *v, const loom_mla_weights *cw,
                       const loom_mla_shape *m, int T, int B, int h, int heads, loom_rope rope, const loom_tp *tp,
                       const loom_ops *ops);

#endif
