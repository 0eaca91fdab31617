/* The one validation of a plan before a run: rules, the verified schedule,
 * and memory against the device and the host. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "layers/gpt.h"
#include "plan/plan.h"
#include "schedule/verify.h"

static void append(char *lines, size_t cap, const char *fmt, const char *what) {
  if (!lines || !cap) return;
  const size_t used = strlen(lines);
  if (used + 2 < cap) snprintf(lines + used, cap - used, fmt, what);
}

/* Bytes one rank's fp32 CPU run holds: weights, grads and Adam m and v (16 B
 * per local parameter, less Adam under ZeRO-1) and its chunks' activations
 * for the micro-batches the schedule keeps live. */
static double rank_bytes(const loom_plan *p, const loom_gpt_config *cfg, const loom_schedule *s, int pp_rank) {
  const Loom__Parallel *l = p->parallel;
  const int T = loom_plan_train_seq(p), B = p->batch->micro_batch;
  double bytes = 0.0;
  for (int c = 0; c < l->virtual_chunks; c++) {
    const loom_stage_range range = loom_plan_stage_range(p, c * l->pp + pp_rank);
    const double params = (double)loom_gpt_param_count(cfg, &range, l->tp);
    bytes += 8.0 * params + 8.0 * params / (l->zero_stage >= 1 ? l->dp : 1);
    const int slots = loom_schedule_chunk_peak(s, pp_rank, c);
    bytes += (double)loom_gpt_activation_bytes(cfg, T, B, l->tp, l->sequence_parallel, &range,
                                               p->n_stages && p->stages[0]->recompute, slots > 0 ? slots : 1);
  }
  return bytes;
}

static int check_host_memory(const loom_plan *p, const loom_schedule *s, const loom_plan_limits *lim, char *lines,
                             size_t cap) {
  loom_gpt_config cfg;
  loom_plan_model_config(p, &cfg);
  double most = 0.0;
  for (int r = 0; r < p->parallel->pp; r++) {
    const double b = rank_bytes(p, &cfg, s, r);
    most = b > most ? b : most;
  }
  const double need = most * (lim->host_ranks > 0 ? lim->host_ranks : 1), gib = 1073741824.0;
  if (need <= (double)lim->host_memory) return 0;
  char line[512];
  snprintf(line, sizeof line,
           "batch.micro_batch = %d: this run needs %.1f GiB on this host (%d ranks of %.2f GiB: fp32 weights, grads, "
           "Adam state and activations for seq %d) but %.1f GiB is available; lower batch.micro_batch or model.seq",
           p->batch->micro_batch, need / gib, lim->host_ranks > 0 ? lim->host_ranks : 1, most / gib,
           loom_plan_train_seq(p), (double)lim->host_memory / gib);
  append(lines, cap, "%s\n", line);
  return 1;
}

int loom_plan_validate(const loom_plan *p, const loom_plan_limits *lim, char *lines, size_t cap) {
  int bad = loom_plan_check_rules(p, lim->world, lim->device_memory, lines, cap);
  if (bad) return bad;
  loom_schedule s;
  loom_error err = {{0}};
  if (loom_schedule_build(&s, p->schedule, p->parallel->pp, p->parallel->virtual_chunks, loom_plan_micro_batches(p),
                          &err) != LOOM_OK) {
    append(lines, cap, "schedule: %s\n", err.msg);
    return 1;
  }
  loom_schedule_report rep;
  if (loom_schedule_verify(&s, &rep) != LOOM_OK) {
    append(lines, cap, "schedule: %s\n", rep.why);
    bad++;
  }
  loom_schedule_report_free(&rep);
  if (!bad && lim->host_memory > 0) bad += check_host_memory(p, &s, lim, lines, cap);
  loom_schedule_free(&s);
  return bad;
}
