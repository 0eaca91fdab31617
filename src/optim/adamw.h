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
/* The squared norm behind it, for summing over pipeline stages; skip_shared
 * leaves out tensors shared with another stage (the last stage's copy of the
 * tied wte), so each element is still counted once. */
double loom_grad_sumsq(const loom_gpt_params *p, const loom_ops *ops, const loom_tp *tp, bool skip_shared);
/* The factor global-norm clipping multiplies the grads by: cfg's clip over
 * the norm when the norm exceeds it, else 1. */
float loom_adamw_clip_scale(const loom_adamw_config *cfg, double grad_norm);
/* Clips to cfg.grad_clip given the norm (inside the update, as
 * loom_adamw_args.grad_scale), then takes one AdamW step at lr. */
void loom_adamw_step(loom_adamw *opt, loom_gpt_params *p, float lr, double grad_norm, const loom_ops *ops);

#endif
