/* One pre-LayerNorm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)).
 * Forward saves what backward needs in loom_block_acts; backward adds into the
 * block's parameter grads and turns dres (grad of the block output) into the
 * grad of the block input, in place. */
#ifndef LOOM_BLOCK_H
#define LOOM_BLOCK_H

#include <stdint.h>
#include "backend/ops.h"
#include "layers/gpt_params.h"

/* Local shapes of a block call (the TP issue shrinks heads and ffn per rank). */
typedef struct {
  int T, B;
  int hidden;
  int heads, head_dim;
  int ffn;
  float norm_eps;
} loom_block_shape;

/* Saved activations of one block; N = T*B rows in [s, b] order. */
typedef struct {
  float *ln_1, *ln_1_mean, *ln_1_rstd; /* [N, h], [N], [N] */
  float *qkv;                          /* [N, 3h] */
  float *att;                          /* [B, heads, T, T] softmax probabilities */
  float *atty;                         /* [N, h] attention output before c_proj */
  float *res_attn;                     /* [N, h] x + attention branch */
  float *ln_2, *ln_2_mean, *ln_2_rstd; /* [N, h], [N], [N] */
  float *fc;                           /* [N, f] before GELU */
  float *fc_gelu;                      /* [N, f] */
  float *out;                          /* [N, h] block output */
} loom_block_acts;

/* Scratch shared by all blocks of a model; contents never outlive a call. */
typedef struct {
  float *branch; /* [N, h] */
  float *d_ln;   /* [N, h] */
  float *d_atty; /* [N, h] */
  float *d_qkv;  /* [N, 3h] */
  float *d_att;  /* [B, heads, T, T] */
  float *d_fc;   /* [N, f] */
  float *d_fc2;  /* [N, f] */
} loom_block_scratch;

/* Dropout keys of one block in one step; p == 0 disables dropout. */
typedef struct {
  float p;
  uint64_t seed;
  int64_t step;
  int layer; /* global layer index */
  int64_t sample_offset;
} loom_block_dropout;

void loom_block_forward(loom_block_acts *a, loom_block_scratch *s, const float *x,
                        const loom_block_weights *w, const loom_block_shape *shape,
                        const loom_block_dropout *drop, const loom_ops *ops);
/* dres[N, h]: grad of the block output on entry, of the block input on exit. */
void loom_block_backward(float *dres, loom_block_weights *g, loom_block_scratch *s,
                         const loom_block_acts *a, const float *x, const loom_block_weights *w,
                         const loom_block_shape *shape, const loom_block_dropout *drop,
                         const loom_ops *ops);

/* Dropout sites; part of the mask key, so never renumber them. */
enum { LOOM_SITE_EMBED = 0, LOOM_SITE_ATTN_PROBS = 1, LOOM_SITE_ATTN_OUT = 2, LOOM_SITE_MLP_OUT = 3 };
loom_dropout loom_dropout_for(const loom_block_dropout *d, int site);

#endif
