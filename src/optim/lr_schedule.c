/* Warmup + cosine, and WSD, learning-rate schedules. */
#include <math.h>
#include <stddef.h>
#include "optim/lr_schedule.h"

const char *const LOOM_LR_DECAY_NAMES[] = {"cosine", "WSD", NULL};
const char *const LOOM_WSD_SHAPE_NAMES[] = {"exponential", "linear", "cosine", "minus_sqrt", NULL};

static double wsd_coefficient(loom_wsd_shape shape, double r) {
  switch (shape) {
  case LOOM_WSD_LINEAR: return 1.0 - r;
  case LOOM_WSD_COSINE: return 0.5 * (1.0 + cos(3.14159265358979323846 * r));
  case LOOM_WSD_MINUS_SQRT: return 1.0 - sqrt(r);
  case LOOM_WSD_EXPONENTIAL: break;
  }
  return 2.0 * pow(0.5, r) - 1.0;
}

float loom_lr_at(const loom_lr_schedule *s, int step) {
  if (step < s->warmup_steps) return s->max_lr * (float)(step + 1) / (float)s->warmup_steps;
  const int last = s->total_steps - 1;
  double coefficient;
  if (s->decay == LOOM_LR_WSD) {
    const int anneal_from = last - s->wsd_decay_steps; /* the last stable step */
    if (step <= anneal_from || s->wsd_decay_steps <= 0) return s->max_lr;
    double r = (double)(step - anneal_from) / s->wsd_decay_steps;
    if (r > 1.0) r = 1.0;
    coefficient = wsd_coefficient(s->wsd_shape, r);
  } else {
    const int decay_steps = last - s->warmup_steps;
    if (decay_steps <= 0) return s->max_lr;
    double progress = (double)(step - s->warmup_steps) / decay_steps;
    if (progress > 1.0) progress = 1.0;
    coefficient = 0.5 * (1.0 + cos(3.14159265358979323846 * progress));
  }
  return (float)(s->min_lr + (s->max_lr - s->min_lr) * coefficient);
}
