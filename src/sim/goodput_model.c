/* Goodput predicted (see goodput_model.h). */
#include <math.h>
#include "core/rng.h"
#include "sim/goodput_model.h"

double loom_goodput_daly(double tau, double delta, double restart, double mtbf) {
  return tau / (mtbf * exp(restart / mtbf) * expm1((tau + delta) / mtbf));
}

double loom_goodput_two_level(const loom_goodput_model *m, double tau, int64_t k) {
  const double rate = 1.0 / m->mtbf_s, q = m->unrecoverable;
  const double cycle = (double)k * tau + (double)(k - 1) * m->local_stall_s + m->save_stall_s, segment = cycle / (double)k;
  const double lost = (1.0 - q) * rate * (segment / 2 + m->local_restore_s + m->relaunch_s) +
                      q * rate * (cycle / 2 + m->restore_s + m->relaunch_s);
  return (1.0 - lost) * (double)k * tau / cycle;
}

/* The tau in (lo, hi) that maximises f (unimodal there), by golden sections. */
static double argmax(double (*f)(const void *ctx, double tau), const void *ctx, double lo, double hi) {
  const double g = (sqrt(5.0) - 1.0) / 2.0;
  double a = lo, b = hi, c = b - g * (b - a), d = a + g * (b - a), fc = f(ctx, c), fd = f(ctx, d);
  for (int i = 0; i < 200 && b - a > 1e-9 * b; i++) {
    if (fc > fd) b = d, d = c, fd = fc, c = b - g * (b - a), fc = f(ctx, c);
    else a = c, c = d, fc = fd, d = a + g * (b - a), fd = f(ctx, d);
  }
  return (a + b) / 2;
}

typedef struct {
  const loom_goodput_model *m;
  int64_t k;
} level_ctx;

static double daly_at(const void *ctx, double tau) {
  const loom_goodput_model *m = ((const level_ctx *)ctx)->m;
  return loom_goodput_daly(tau, m->save_stall_s, m->restore_s + m->relaunch_s, m->mtbf_s);
}

static double two_level_at(const void *ctx, double tau) {
  const level_ctx *c = ctx;
  return loom_goodput_two_level(c->m, tau, c->k);
}

/* A uniform in (0, 1) from the counter-based generator. */
static double uniform(uint64_t seed, uint64_t *n) {
  const uint64_t a = loom_rng_u32(seed, 0x9d, (*n)++), b = loom_rng_u32(seed, 0x9d, (*n)++);
  return ((double)((a << 21) | (b >> 11)) + 0.5) / 9007199254740992.0;
}

double loom_goodput_simulate(const loom_goodput_model *m, double tau, int64_t k, int64_t failures, uint64_t seed,
                             double *se) {
  enum { BATCHES = 20 };
  const double q = m->unrecoverable, horizon = (double)(failures > BATCHES ? failures / BATCHES : 1) * m->mtbf_s;
  double sum = 0.0, sum2 = 0.0;
  uint64_t n = 0;
  for (int batch = 0; batch < BATCHES; batch++) {
    double t = 0.0, saved = 0.0, persisted = 0.0; /* work at the last save, and at the last persistent one */
    double next = -m->mtbf_s * log(uniform(seed, &n)); /* time to the next failure */
    while (t < horizon) {
      const int64_t index = llround(saved / tau) + 1; /* the save that ends this segment */
      const bool persistent = index % k == 0;
      const double need = tau + (persistent ? m->save_stall_s : m->local_stall_s);
      if (next >= need) {
        t += need, next -= need, saved += tau;
        if (persistent) persisted = saved;
        continue;
      }
      t += next; /* a failure: the segment is lost; restart, and again if a failure strikes the restart */
      for (;;) {
        const bool covered = uniform(seed, &n) >= q;
        if (!covered) saved = persisted;
        const double restart = m->relaunch_s + (covered ? m->local_restore_s : m->restore_s);
        next = -m->mtbf_s * log(uniform(seed, &n));
        if (next >= restart) {
          t += restart, next -= restart;
          break;
        }
        t += next;
      }
    }
    const double g = saved / t;
    sum += g, sum2 += g * g;
  }
  const double mean = sum / BATCHES;
  *se = sqrt(fmax(sum2 / BATCHES - mean * mean, 0.0) / (BATCHES - 1));
  return mean;
}

/* The better of the whole-step intervals beside tau seconds. */
static int64_t whole_steps(double tau, double step_s, double (*f)(const void *, double), const void *ctx) {
  const int64_t lo = (int64_t)fmax(1.0, floor(tau / step_s)), hi = lo + 1;
  return f(ctx, (double)lo * step_s) >= f(ctx, (double)hi * step_s) ? lo : hi;
}

loom_status loom_goodput_predict(const loom_goodput_model *m, int64_t failures, loom_goodput_prediction *out,
                                 loom_error *err) {
  if (!(m->step_s > 0) || !(m->mtbf_s > 0) || m->unrecoverable < 0 || m->unrecoverable > 1)
    return loom_fail(err, LOOM_ERR_USAGE, "goodput: a step time and an MTBF above 0 and an unrecoverable share in [0, 1]");
  *out = (loom_goodput_prediction){0};
  loom_goodput_level *p = &out->persistent;
  /* Persistent checkpoints alone: every failure rolls back to the last one. */
  loom_goodput_model alone = *m;
  alone.local_stall_s = 0.0, alone.local_restore_s = m->restore_s, alone.unrecoverable = 1.0;
  const level_ctx one = {&alone, 1};
  p->young_s = sqrt(2.0 * m->save_stall_s * m->mtbf_s);
  p->daly_s = p->young_s - m->save_stall_s;
  const double floor_s = fmax(1e-6 * m->mtbf_s, m->min_persistent_s);
  p->optimum_s = argmax(daly_at, &one, floor_s, fmax(10.0 * m->mtbf_s, 2 * floor_s));
  p->interval_steps = whole_steps(p->optimum_s, m->step_s, daly_at, &one);
  while ((double)p->interval_steps * m->step_s < m->min_persistent_s) p->interval_steps++;
  p->goodput = daly_at(&one, (double)p->interval_steps * m->step_s);
  p->simulated = failures > 0 ? loom_goodput_simulate(&alone, (double)p->interval_steps * m->step_s, 1, failures, 1,
                                                      &p->simulated_se)
                              : NAN;
  if (!(m->local_stall_s > 0)) return LOOM_OK;
  /* With in-memory copies: the best (tau, k), k persistent-every counted in saves. */
  double best = -1.0;
  for (int64_t k = 1; k <= 100000; k = k < 64 ? k + 1 : k + k / 16) {
    const level_ctx c = {m, k};
    const double lo = fmax(1e-6 * m->mtbf_s, m->min_persistent_s / (double)k);
    const double tau = argmax(two_level_at, &c, lo, fmax(10.0 * m->mtbf_s, 2 * lo));
    int64_t steps = whole_steps(tau, m->step_s, two_level_at, &c);
    while ((double)(steps * k) * m->step_s < m->min_persistent_s) steps++;
    const double g = two_level_at(&c, (double)steps * m->step_s);
    if (g > best) best = g, out->local_steps = steps, out->persistent_every = k;
  }
  out->local_goodput = best;
  out->local_simulated = failures > 0 ? loom_goodput_simulate(m, (double)out->local_steps * m->step_s, out->persistent_every,
                                                              failures, 2, &out->local_simulated_se)
                                      : NAN;
  return LOOM_OK;
}
