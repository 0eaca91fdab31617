/* The replay of a plan's schedule with the cost model's times. */
#include <math.h>
#include <stdlib.h>
#include "core/check.h"
#include "sim/sim.h"

static double action_seconds(void *ctx, int rank, const loom_action *a) {
  return loom_sim_action_seconds(ctx, rank, a);
}
static double flight_seconds(void *ctx, int rank, const loom_action *a) {
  return loom_sim_flight_seconds(ctx, rank, a);
}

loom_status loom_sim_check_imbalance(const loom_plan *plan, double imbalance, loom_error *err) {
  const Loom__Moe *moe = plan->model->moe;
  if (!(isfinite(imbalance) && imbalance >= 1.0))
    return loom_fail(err, LOOM_ERR_USAGE, "--moe-rank-imbalance %g: the busiest rank takes at least an even share (1)", imbalance);
  if (imbalance == 1.0) return LOOM_OK;
  if (!moe || moe->experts < 2)
    return loom_fail(err, LOOM_ERR_USAGE, "--moe-rank-imbalance %g: the plan's model has no experts", imbalance);
  if (moe->has_capacity_factor)
    return loom_fail(err, LOOM_ERR_USAGE, "--moe-rank-imbalance %g: the plan's capacity factor %g already costs each expert at "
                     "its capacity; drop one of them", imbalance, moe->capacity_factor);
  return LOOM_OK;
}

loom_status loom_sim_run(const loom_plan *plan, const loom_profile *prof, const loom_sim_assumptions *assume,
                         loom_sim_result *res, loom_error *err) {
  *res = (loom_sim_result){0};
  loom_status st = loom_sim_check_imbalance(plan, assume->moe_rank_imbalance, err);
  if (st != LOOM_OK) return st;
  const int ep = plan->parallel->ep > 1 ? plan->parallel->ep : 1;
  if (assume->moe_rank_imbalance > ep)
    return loom_fail(err, LOOM_ERR_USAGE, "--moe-rank-imbalance %g: the busiest of ep %d ranks takes at most %d times an even "
                     "share of the rows (every row of its group)", assume->moe_rank_imbalance, ep, ep);
  if (plan->fp8 != LOOM__FP8_FORMAT__FP8_NONE && loom_plan_fp8(plan).recipe == LOOM_FP8_RECIPE_MXFP8 &&
      !(prof->device->has_mxfp8 && prof->device->mxfp8))
    return loom_fail(err, LOOM_ERR_USAGE, "--fp8-recipe mxfp8: the profile %s's device has no MXFP8 GEMMs (Blackwell's "
                     "block-scaled tensor cores, device.mxfp8); use --fp8-recipe blockwise or tensorwise, or a profile "
                     "that gives them", prof->name);
  if (plan->fp8 != LOOM__FP8_FORMAT__FP8_NONE && !loom_profile_has_fp8(prof))
    return loom_fail(err, LOOM_ERR_USAGE, "--fp8-format: the profile %s prices no fp8 GEMMs (device.peak_tflops_fp8 and a "
                     "PRECISION_FP8 gemm entry); drop --fp8-format or use a profile that gives them", prof->name);
  st = loom_plan_schedule(plan, &res->schedule, err);
  if (st != LOOM_OK) return st;
  loom_sim_costs_build_assuming(plan, prof, assume, &res->costs);
  const loom_action_costs costs = {action_seconds, flight_seconds, &res->costs};
  if (loom_schedule_simulate(&res->schedule, &costs, &LOOM_SENDS_BUFFERED, &res->replay) != LOOM_OK) {
    st = loom_fail(err, LOOM_ERR_USAGE, "schedule: %s", res->replay.why);
    loom_sim_result_free(res);
    return st;
  }
  const Loom__Parallel *l = plan->parallel;
  const int p = l->pp, v = l->virtual_chunks, m = res->costs.m;
  loom_gpt_config cfg;
  loom_plan_model_config(plan, &cfg);
  const double T = loom_plan_train_seq(plan), tokens = (double)plan->batch->global_batch * T;
  res->gpus = (int)loom_plan_ranks(plan);
  res->assumed = *assume;
  res->model_flops = loom_gpt_train_flops(&cfg, (int)T, tokens, assume->formula);
  res->peak_flops = loom_profile_peak_flops(prof, plan->precision);
  res->step_s = res->replay.makespan;
  res->tokens_per_s = tokens / res->step_s;
  res->tflops_per_gpu = res->model_flops / res->step_s / res->gpus / 1e12;
  res->mfu = res->tflops_per_gpu * 1e12 / res->peak_flops;
  res->bubble = res->replay.bubble;
  res->theory_bubble = loom_schedule_theory_bubble(&res->schedule);
  res->rank_memory_bytes = loom_xcalloc((size_t)p, sizeof(int64_t), "sim memory");
  const loom_sim_costs *c = &res->costs;
  for (int r = 0; r < p; r++) {
    res->rank_memory_bytes[r] = loom_plan_rank_bytes(plan, r, NULL);
    if (res->rank_memory_bytes[r] > res->max_rank_memory_bytes) res->max_rank_memory_bytes = res->rank_memory_bytes[r];
    for (int k = 0; k < v; k++) {
      const int i = r * v + k;
      res->compute_s += m * (c->forward[i] - c->forward_comm[i] + c->backward[i] - c->backward_comm[i]) / p;
      res->tp_s += m * (c->forward_comm[i] + c->backward_comm[i]) / p;
    }
    res->dp_s += c->dp_exposed[r] / p;
    res->optimizer_s += c->optimizer[r] / p;
  }
  /* Each rank waits on at most its inbound messages: 2 per micro-batch and chunk but at the ends. */
  res->p2p_s = p > 1 ? 2.0 * m * v * c->p2p * (p * v - 1.0) / (p * v) : 0.0;
  res->idle_s = res->step_s - res->compute_s - res->tp_s - res->dp_s - res->optimizer_s;
  return LOOM_OK;
}

void loom_sim_result_free(loom_sim_result *res) {
  loom_sim_costs_free(&res->costs);
  loom_schedule_report_free(&res->replay);
  loom_schedule_free(&res->schedule);
  free(res->rank_memory_bytes);
  *res = (loom_sim_result){0};
}

loom_status loom_sim_write_trace(const loom_sim_result *res, const char *path, loom_error *err) {
  const loom_schedule *s = &res->schedule;
  const loom_schedule_report *rep = &res->replay;
  int n = 0;
  for (int r = 0; r < s->p; r++) n += rep->span_count[r];
  loom_trace_span *spans = loom_xmalloc((size_t)n * sizeof *spans + 1, "sim trace");
  n = 0;
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < rep->span_count[r]; i++) {
      const loom_span *sp = &rep->spans[r][i];
      const loom_action *a = &s->actions[r][sp->action];
      spans[n++] = (loom_trace_span){r, a->kind, a->mb, a->chunk, sp->start * 1e6, sp->end * 1e6, r, sp->action};
    }
  const loom_trace_info info = {s->p, s->p, s->v, s->m, loom_schedule_kind_name(s->kind), "bubble_predicted", res->bubble,
                                res->theory_bubble, s, NULL, 0};
  const loom_status st = loom_trace_write_json(path, spans, n, &info, err);
  free(spans);
  return st;
}
