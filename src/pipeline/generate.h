/* Text generation with a plan's model: each new token from the logits of
 * the last position, greedily or drawn at a temperature, with the context
 * window the plan's sequence length. It runs on one rank, the plan (1,1,1)
 * with micro-batch 1; the trainer is built forward-only. */
#ifndef LOOM_GENERATE_H
#define LOOM_GENERATE_H

#include "pipeline/trainer.h"

typedef struct {
  int max_tokens;
  float temperature; /* 0: greedy */
  uint64_t seed;     /* of the draws */
} loom_generate_options;

/* Continues prompt[len] (len >= 1), calling emit with each new token. */
loom_status loom_generate(loom_trainer *tr, const int *prompt, int len, const loom_generate_options *o,
                          void (*emit)(void *ctx, int token), void *ctx, loom_error *err);

#endif
