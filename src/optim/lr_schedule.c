/* Warmup + cosine learning-rate schedule. */
#include <math.h>
#include "optim/lr_schedule.h"

float loom_lr_at(const loom_lr_schedule *s, int step) {
  if (step < s->warmup_steps) return s->max_lr * (float)(step + 1) / (float)s->warmup_steps;
  const int decay_steps = s->total_steps - 1 - s->warmup_steps;
  if (decay_steps <= 0) return s->max_lr;
  double progress = (double)(step - s->warmup_steps) / decay_steps;
  if (progress > 1.0) progress = 1.0;
  const double cosine = 0.5 * (1.0 + cos(3.14159265358979323846 * progress));
  return (float)(s->min_lr + (s->max_lr - s->min_lr) * cosine);
}
