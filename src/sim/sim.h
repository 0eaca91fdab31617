/* `loom sim`'s engine: a plan's verified schedule replayed with the cost
 * model's times (schedule/verify.h's simulation, src/sim/cost.h's costs), so
 * every rank's actions run in order and each recv waits for its send. The
 * result is the predicted step: time, throughput, model FLOP/s per GPU and
 * MFU, the bubble, time by kind, memory per rank and bytes per link. */
#ifndef LOOM_SIM_H
#define LOOM_SIM_H

#include "schedule/timeline.h"
#include "schedule/verify.h"
#include "sim/cost.h"

typedef struct {
  int gpus;
  loom_sim_assumptions assumed; /* what the prediction took as given */
  double model_flops;  /* per step, by the assumed formula */
  double peak_flops;   /* one device's dense peak in the plan's precision */
  double step_s, tokens_per_s, tflops_per_gpu, mfu;
  double bubble;       /* the replay's idle share before the last backward, averaged over pipeline ranks */
  double theory_bubble;
  /* Seconds of the step by kind, averaged over pipeline ranks: compute,
   * exposed tensor-parallel communication, messages between stages in
   * flight, exposed data-parallel communication, the optimizer, and idle. */
  double compute_s, tp_s, p2p_s, dp_s, optimizer_s, idle_s;
  int64_t max_rank_memory_bytes;
  int64_t *rank_memory_bytes; /* [pp] */
  loom_sim_costs costs;
  loom_schedule schedule;
  loom_schedule_report replay;
} loom_sim_result;

/* An MoE load imbalance the plan's model can have: 1, or for a dropless
 * MoE model any finite factor from 1 (loom_sim_run also bounds it by ep). */
loom_status loom_sim_check_imbalance(const loom_plan *plan, double imbalance, loom_error *err);
/* Predicts one training step of a plan that passes its rules, with fresh
 * estimates (loom_plan_build's, or loom_plan_estimate's), under the
 * assumptions. Refuses a plan whose schedule cannot be built, and an
 * imbalance loom_sim_check_imbalance refuses or over the plan's ep. */
loom_status loom_sim_run(const loom_plan *plan, const loom_profile *prof, const loom_sim_assumptions *assume,
                         loom_sim_result *res, loom_error *err);
void loom_sim_result_free(loom_sim_result *res);
/* The predicted timeline as Chrome-trace JSON (`loom trace svg` draws it). */
loom_status loom_sim_write_trace(const loom_sim_result *res, const char *path, loom_error *err);

#endif
