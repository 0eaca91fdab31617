/* AdamW over a model's parameter buffer, with decoupled weight decay applied
 * only where the parameter metadata says so (not biases or norm weights),
 * and global grad-norm clipping. Moments share the parameters' layout. */
#ifndef LOOM_ADAMW_H
#define LOOM_ADAMW_H

#include "backend/ops.h"
#include "layers/gpt_params.h"
#include "tensor_parallel/parallel_state.h"

typedef struct {
  float beta1, beta2, eps, weight_decay;
  float grad_clip; /* max global grad norm; <= 0 disables clipping */
} loom_adamw_config;

typedef struct {
  loom_adamw_config cfg;
  loom_buffer m, v;
  int step; /* optimizer steps taken */
} loom_adamw;

loom_adamw_config loom_adamw_defaults(void);
loom_status loom_adamw_init(loom_adamw *opt, const loom_gpt_params *p, const loom_adamw_config *cfg);
void loom_adamw_free(loom_adamw *opt);

/* Global L2 norm of all grads, each element counted once: shards are summed
 * over the TP group, TP-replicated tensors counted once (tp NULL: serial). */
double loom_grad_norm(const loom_gpt_params *p, const loom_ops *ops, const loom_tp *tp);
/* The one rule for a grad norm's squared sum, fed piece by piece (whole
 * tensors, or ZeRO's pieces of them): each piece enters the part
 * loom_param_norm_part names for its tensor, and with skip_shared a tensor
 * shared with another stage (the last stage's copy of the tied wte) enters
 * `uncounted` instead, so each element is counted once while an inf or NaN
 * in the copy is still seen. The pieces are summed together at the total
 * (the backend's sumsq_batch: a device waits once, not once a piece). */
typedef struct {
  double sums[4];   /* [0] sharded over TP, summed over the group; [1] replicated, the same everywhere; [2] experts,
                     * summed over the expert-parallel group (and over TP where it splits them); [3] experts' tensors
                     * every TP rank holds alike, summed over the expert-parallel group */
  double uncounted; /* skipped shared copies (known after the total) */
  bool skip_shared;
  const loom_ops *ops;        /* the pieces' backend */
  const float **piece;        /* [count] the pieces queued */
  size_t *len;                /* [count] */
  signed char *into;          /* [count] 0, 1: sums[into]; 2: uncounted; 3, 4: sums[into - 1] */
  int count, cap;
} loom_norm_sum;
void loom_norm_sum_add(loom_norm_sum *s, const loom_gpt_params *p, int k, const float *g, size_t n, const loom_ops *ops);
/* The squared sum over this TP group (tp NULL: serial); frees the queue. */
double loom_norm_sum_total(loom_norm_sum *s, const loom_tp *tp);
/* The squared norm of p's grads, for summing over pipeline stages, with
 * skip_shared as above; *uncounted (if not NULL) gets the skipped copies'. */
double loom_grad_sumsq(const loom_gpt_params *p, const loom_ops *ops, const loom_tp *tp, bool skip_shared, double *uncounted);
/* The factor global-norm clipping multiplies the grads by: cfg's clip over
 * the norm when the norm exceeds it, else 1. */
float loom_adamw_clip_scale(const loom_adamw_config *cfg, double grad_norm);
/* Clips to cfg.grad_clip given the norm (inside the update, as
 * loom_adamw_args.grad_scale), then takes one AdamW step at lr. */
void loom_adamw_step(loom_adamw *opt, loom_gpt_params *p, float lr, double grad_norm, const loom_ops *ops);

#endif
