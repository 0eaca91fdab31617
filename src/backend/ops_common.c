/* Pieces of op semantics shared by every backend: the GELU formula and the
 * keyed dropout mask. Defining them once keeps the backends in agreement. */
#include <math.h>
#include "backend/ops.h"
#include "core/rng.h"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

float loom_gelu_value(float x) {
  const float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
}

float loom_gelu_grad(float x) {
  const float cube = 0.044715f * x * x * x;
  const float tanh_out = tanhf(GELU_SCALE * (x + cube));
  const float sech2 = 1.0f - tanh_out * tanh_out;
  return 0.5f * (1.0f + tanh_out) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

int loom_dropout_keep(const loom_dropout *d, uint64_t index) {
  return loom_rng_uniform(d->seed, d->stream, index) >= d->p;
}

uint64_t loom_dropout_index(const loom_dropout *d, int t, int b, int c, int T, int C) {
  const uint64_t sample = (uint64_t)(d->sample_offset + b);
  const uint64_t total = (uint64_t)(d->seq_total ? d->seq_total : T);
  return (sample * total + (uint64_t)(d->seq_offset + t)) * (uint64_t)C + (uint64_t)c;
}

uint64_t loom_attn_dropout_index(const loom_dropout *d, const loom_attn_shape *s, int b, int h,
                                 int tq, int tk) {
  const uint64_t sample = (uint64_t)(d->sample_offset + b);
  const uint64_t head = (uint64_t)(s->head_offset + h);
  const uint64_t T = (uint64_t)s->T;
  return ((sample * (uint64_t)s->total_heads + head) * T + (uint64_t)tq) * T + (uint64_t)tk;
}

int loom_row_argmax(const float *z, int V) {
  int best = V > 0 ? 0 : -1;
  for (int v = 1; v < V; v++)
    if (z[v] > z[best]) best = v;
  return best;
}
