/* Learning-rate schedule: linear warmup, then cosine decay to min_lr. */
#ifndef LOOM_LR_SCHEDULE_H
#define LOOM_LR_SCHEDULE_H

typedef struct {
  float max_lr;
  float min_lr;
  int warmup_steps;
  int total_steps;
} loom_lr_schedule;

/* LR for 0-based `step`: (step+1)/warmup * max during warmup, then cosine
 * from max_lr down to min_lr at total_steps - 1. */
float loom_lr_at(const loom_lr_schedule *s, int step);

#endif
