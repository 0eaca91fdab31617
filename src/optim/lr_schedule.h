/* Learning-rate schedules: linear warmup, then either cosine decay to
 * min_lr over the rest of the run, or WSD (warmup, stable, decay; Megatron-LM's
 * --lr-decay-style WSD): max_lr held until the last wsd_decay_steps steps,
 * which anneal to min_lr in one of Megatron's four shapes. */
#ifndef LOOM_LR_SCHEDULE_H
#define LOOM_LR_SCHEDULE_H

/* The decay styles and WSD's annealing shapes, in Megatron-LM's names
 * (LOOM_LR_DECAY_NAMES, LOOM_WSD_SHAPE_NAMES); the checkpoint's TrainState
 * keeps them as these numbers. */
typedef enum { LOOM_LR_COSINE = 0, LOOM_LR_WSD = 1 } loom_lr_decay;
typedef enum { LOOM_WSD_EXPONENTIAL = 0, LOOM_WSD_LINEAR, LOOM_WSD_COSINE, LOOM_WSD_MINUS_SQRT } loom_wsd_shape;
extern const char *const LOOM_LR_DECAY_NAMES[];  /* "cosine", "WSD", NULL */
extern const char *const LOOM_WSD_SHAPE_NAMES[]; /* "exponential", "linear", "cosine", "minus_sqrt", NULL */

typedef struct {
  float max_lr;
  float min_lr;
  int warmup_steps;
  int total_steps;
  loom_lr_decay decay;
  int wsd_decay_steps;    /* WSD: the steps that anneal, the run's last ones */
  loom_wsd_shape wsd_shape;
} loom_lr_schedule;

/* LR for 0-based `step`: (step+1)/warmup * max during warmup; then cosine
 * from max_lr down to min_lr at total_steps - 1; or under WSD max_lr until
 * the annealing, whose fraction r = (step - (total_steps - 1 -
 * wsd_decay_steps)) / wsd_decay_steps of the way from max_lr reaches min_lr
 * at total_steps - 1 by the shape's coefficient: exponential 2 * 0.5^r - 1,
 * linear 1 - r, cosine (1 + cos(pi r)) / 2, minus_sqrt 1 - sqrt(r). */
float loom_lr_at(const loom_lr_schedule *s, int step);

#endif
