/* Plan search: enumerate, refuse by the plan's rules and memory, predict, rank. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "sim/search.h"

loom_status loom_candidate_plan(const loom_plan *base, const loom_candidate *c, loom_plan **out, loom_error *err) {
  loom_plan_spec spec = {
      .train_seq = base->batch->has_seq ? base->batch->seq : 0, .tp = c->tp, .pp = c->pp, .dp = c->dp, .vpp = c->vpp,
      .zero_stage = c->zero, .ep = c->ep, .etp = c->etp, .cp = c->cp,
      .cp_comm = c->cp_all_gather ? LOOM__CP_COMM_TYPE__CP_COMM_ALL_GATHER : LOOM__CP_COMM_TYPE__CP_COMM_P2P,
      .tp_comm_overlap = c->tp_comm_overlap, .no_grad_reduce_overlap = !loom_plan_overlaps(base).grad_reduce, /* as asked */
      .param_gather_overlap = c->param_gather_overlap, .no_p2p_overlap = !loom_plan_overlaps(base).p2p, .fp8 = base->fp8, .fp8_scaling = loom_plan_fp8(base),
      .sequence_parallel = c->sequence_parallel, .recompute = c->recompute,
      .recompute_layers = c->recompute_layers,
      .micro_batch = c->micro_batch, .global_batch = base->batch->global_batch, .schedule = c->schedule,
      .balance = base->balance, .precision = base->precision, .grad_reduce = c->zero ? LOOM__PRECISION__PRECISION_FP32 : base->grad_reduce,
      .name = base->name};
  if (base->grad_compression) { /* every candidate compresses as the user asked; the plan's dp bytes price it */
    spec.compression = base->grad_compression->kind;
    spec.compression_rank = base->grad_compression->rank;
  }
  loom_plan_model_config(base, &spec.model);
  return loom_plan_build(&spec, out, err);
}

const char *loom_candidate_recompute(const loom_candidate *c, char *buf, size_t n) {
  if (!c->recompute) snprintf(buf, n, "none");
  else if (c->recompute_layers) snprintf(buf, n, "block %d", c->recompute_layers);
  else snprintf(buf, n, "full");
  return buf;
}

/* Counts a refusal under the field its rule names: "parallel.tp = 3: ..." -> "parallel.tp". */
static void drop(loom_search_result *res, const char *why) {
  char key[96];
  size_t n = strcspn(why, " =:(");
  if (n >= sizeof key) n = sizeof key - 1;
  memcpy(key, why, n);
  key[n] = '\0';
  for (int i = 0; i < res->ndropped; i++)
    if (strcmp(res->dropped[i].reason, key) == 0) {
      res->dropped[i].count++;
      return;
    }
  if (res->ndropped == LOOM_SEARCH_MAX_REASONS) return;
  snprintf(res->dropped[res->ndropped].reason, sizeof res->dropped[0].reason, "%s", key);
  res->dropped[res->ndropped++].count = 1;
}

static void push(loom_candidate **list, int *n, const loom_candidate *c) {
  if ((*n & (*n - 1)) == 0) {
    *list = realloc(*list, (size_t)(*n ? 2 * *n : 1) * sizeof **list);
    LOOM_CHECK(*list != NULL, "out of memory searching plans");
  }
  (*list)[(*n)++] = *c;
}

/* The most memory one rank of a plan's pp ranks needs. */
static int64_t busiest_bytes(const loom_plan *plan, int pp) {
  int64_t most = 0;
  for (int q = 0; q < pp; q++) {
    const int64_t need = loom_plan_rank_bytes(plan, q, NULL);
    most = need > most ? need : most;
  }
  return most;
}

/* The assumptions for a candidate: an imbalance of at most its ep (its busiest rank takes at most every row). */
static loom_sim_assumptions for_candidate(const loom_sim_assumptions *assume, const loom_candidate *c) {
  loom_sim_assumptions a = *assume;
  a.moe_rank_imbalance = fmin(a.moe_rank_imbalance, (double)c->ep);
  return a;
}

/* Sizes one candidate: refused by a rule (counted), over memory (kept in
 * unfit), or fitting, into *fits with the lower bound on its step; returns
 * whether it fits. */

static bool measure(const loom_plan *base, const loom_profile *prof, const loom_sim_assumptions *assume, loom_candidate c,
                    loom_search_result *res, loom_candidate **fits, int *nfits) {
  c.order = res->considered++;
  loom_plan *plan = NULL;
  loom_error err = {0};
  char lines[1024];
  if (loom_candidate_plan(base, &c, &plan, &err) != LOOM_OK) {
    drop(res, err.msg);
    return false;
  }
  bool fit = false;
  if (loom_plan_check_rules(plan, 0, 0, lines, sizeof lines) > 0) {
    drop(res, lines);
  } else {
    /* Memory first, from the plan's estimates: a layout that does not fit is not worth a replay. */
    c.memory = busiest_bytes(plan, c.pp);
    fit = c.memory <= prof->device->memory_bytes;
    if (!fit) {
      drop(res, "memory");
      push(&res->unfit, &res->nunfit, &c);
    } else {
      loom_sim_costs costs;
      const loom_sim_assumptions a = for_candidate(assume, &c);
      loom_sim_costs_build_assuming(plan, prof, &a, &costs);
      c.bound_s = loom_sim_step_lower_bound(&costs, loom_schedule_kind_splits_backward(c.schedule));
      loom_sim_costs_free(&costs);
      res->fit++;
      push(fits, nfits, &c);
    }
  }
  loom_plan_free(plan);
  return fit;
}

/* Whether c is a valid plan within the device's memory, judged as measure()
 * does but recording nothing. */
static bool fits_memory(const loom_plan *base, const loom_profile *prof, const loom_candidate *c) {
  loom_plan *plan = NULL;
  loom_error err = {0};
  char lines[1024];
  const bool fit = loom_candidate_plan(base, c, &plan, &err) == LOOM_OK &&
                   loom_plan_check_rules(plan, 0, 0, lines, sizeof lines) == 0 &&
                   busiest_bytes(plan, c->pp) <= prof->device->memory_bytes;
  loom_plan_free(plan);
  return fit;
}

/* Recompute only where the layout does not fit without it: it adds a
 * forward and saves nothing but memory, so of the settings that fit the
 * one recomputing least is the fastest. None; else full, and where full
 * fits, also the fewest of each stage's first layers (Megatron's block
 * method) that fit, found by bisection (memory falls as layers are
 * recomputed). Records what it measures. */
static void measure_recompute(const loom_plan *base, const loom_profile *prof, const loom_sim_assumptions *assume,
                              loom_candidate c, loom_search_result *res, loom_candidate **fits, int *nfits) {
  if (measure(base, prof, assume, c, res, fits, nfits)) return;
  c.recompute = true;
  if (!measure(base, prof, assume, c, res, fits, nfits)) return;
  int lo = 0, hi = base->model->layers / (c.pp * c.vpp); /* hi fits (it is full recompute for a stage that short) */
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    loom_candidate probe = c;
    probe.recompute_layers = mid;
    if (fits_memory(base, prof, &probe)) hi = mid;
    else lo = mid;
  }
  c.recompute_layers = hi;
  if (hi < base->model->layers / (c.pp * c.vpp)) measure(base, prof, assume, c, res, fits, nfits);
}

/* Replays one fitting candidate into the ranking. */
static void predict(const loom_plan *base, const loom_profile *prof, const loom_sim_assumptions *assume, loom_candidate c,
                    loom_search_result *res) {
  loom_plan *plan = NULL;
  loom_error err = {0};
  loom_sim_result r;
  const loom_sim_assumptions a = for_candidate(assume, &c);
  if (loom_candidate_plan(base, &c, &plan, &err) != LOOM_OK || loom_sim_run(plan, prof, &a, &r, &err) != LOOM_OK) {
    drop(res, err.msg); /* not expected: measure() built the same plan */
    res->fit--;
    loom_plan_free(plan);
    return;
  }
  c.step_s = r.step_s, c.tokens_per_s = r.tokens_per_s, c.tflops_per_gpu = r.tflops_per_gpu, c.mfu = r.mfu;
  c.bubble = r.bubble;
  push(&res->ranked, &res->nranked, &c);
  loom_sim_result_free(&r);
  loom_plan_free(plan);
}

/* Whether a replay of c cannot change the answer: `keep` predicted layouts
 * are faster than c can be, and one of them needs no more memory than c. */
static bool dominated(const loom_search_result *res, const loom_candidate *c, int keep) {
  int faster = 0;
  bool leaner = false;
  for (int i = 0; i < res->nranked; i++)
    if (res->ranked[i].step_s < c->bound_s) {
      faster++;
      leaner = leaner || res->ranked[i].memory <= c->memory;
    }
  return keep > 0 && faster >= keep && leaner;
}

/* A lower bound on the memory of every layout of a grid (tp, cp, pp and
 * so dp) at micro-batch `mb`: the least any variant needs that differs in
 * what can lower memory (ZeRO stage, recompute none or full, sequence
 * parallelism, expert parallelism as wide as the grid allows, with expert
 * tensor parallelism or without), under 1F1B with one chunk per stage
 * (more chunks, GPipe and the zero-bubble schedules hold more in flight)
 * and without overlap's buffers. Memory grows with the micro-batch, so a
 * micro-batch whose bound is over the device's memory ends the grid's
 * search. The bytes are the plan's estimate, read whether or not the rules
 * accept the variant (they judge other things); -1 where no variant can be
 * built (then nothing is pruned). */
static int64_t leanest_bytes(const loom_plan *base, int tp, int cp, int pp, int dp, int mb, int experts, int expert_ffn) {
  int64_t least = -1;
  for (int split = 0; split < (experts > 1 && tp > 1 ? 2 : 1); split++) {
    const int etp = split ? tp : 1;
    if (expert_ffn % etp) continue;
    int ep = 1;
    for (int e = 2; e <= experts && e <= tp * dp; e *= 2)
      if (experts % e == 0 && (tp * dp) % (e * etp) == 0) ep = e;
    for (int zero = 0; zero <= (dp > 1 ? 3 : 0); zero++)
      for (int recompute = 0; recompute < 2; recompute++)
        for (int sp = 0; sp < (tp > 1 ? 2 : 1); sp++) {
          const loom_candidate c = {.tp = tp, .pp = pp, .dp = dp, .vpp = 1, .micro_batch = mb, .zero = zero, .ep = ep,
                                    .etp = etp, .cp = cp, .sequence_parallel = sp, .recompute = recompute,
                                    .schedule = LOOM_SCHEDULE_1F1B};
          loom_plan *plan = NULL;
          loom_error err = {0};
          if (loom_candidate_plan(base, &c, &plan, &err) == LOOM_OK) {
            const int64_t bytes = busiest_bytes(plan, pp);
            least = least < 0 || bytes < least ? bytes : least;
          }
          loom_plan_free(plan);
        }
  }
  return least;
}

/* The schedules worth trying for pp ranks with vpp chunks each and m
 * micro-batches: without a pipeline only 1F1B (the others equal it), else
 * each training kind whose shape rule (loom_schedule_shape_problem) takes
 * (pp, vpp, m), but interleaving one chunk (1F1B itself). */
static int schedules_for(int pp, int vpp, int m, loom_schedule_kind *kinds) {
  if (pp == 1) {
    kinds[0] = LOOM_SCHEDULE_1F1B;
    return vpp == 1;
  }
  static const loom_schedule_kind TRAINING[] = {LOOM_SCHEDULE_1F1B, LOOM_SCHEDULE_GPIPE, LOOM_SCHEDULE_ZB_H1,
                                                 LOOM_SCHEDULE_INTERLEAVED, LOOM_SCHEDULE_ZB_V};
  int n = 0;
  for (size_t i = 0; i < sizeof TRAINING / sizeof *TRAINING; i++)
    if (!(TRAINING[i] == LOOM_SCHEDULE_INTERLEAVED && vpp == 1) && !loom_schedule_shape_problem(TRAINING[i], pp, vpp, m, NULL, 0))
      kinds[n++] = TRAINING[i];
  return n;
}

static int faster_first(const void *a, const void *b) {
  const loom_candidate *x = a, *y = b;
  if (x->tokens_per_s != y->tokens_per_s) return x->tokens_per_s < y->tokens_per_s ? 1 : -1;
  return x->order - y->order;
}

static int lowest_bound_first(const void *a, const void *b) {
  const loom_candidate *x = a, *y = b;
  if (x->bound_s != y->bound_s) return x->bound_s < y->bound_s ? -1 : 1;
  return x->order - y->order;
}

loom_status loom_plan_search(const loom_plan *base, int gpus, const loom_profile *prof, const loom_sim_assumptions *assume,
                             const loom_search_options *opt, loom_search_result *res, loom_error *err) {
  *res = (loom_search_result){0};
  loom_candidate *fits = NULL;
  int nfits = 0;
  const int global = base->batch->global_batch, layers = base->model->layers, node = prof->devices_per_node;
  const int experts = base->model->moe ? base->model->moe->experts : 1;
  loom_gpt_config model;
  loom_plan_model_config(base, &model);
  const int expert_ffn = loom_gpt_expert_ffn(&model), seq = loom_plan_train_seq(base);
  /* --tp-comm-overlap only where the profile states what it costs compute (its overlap_sm_share);
   * --overlap-param-gather where collectives run beside compute and the grads are reduced during backward. */
  const bool overlap_costed = prof->has_overlap_sm_share;
  const bool gather_costed = prof->comm_overlaps_compute && loom_plan_overlaps(base).grad_reduce;
  if (gpus < 1) return loom_fail(err, LOOM_ERR_USAGE, "--gpus %d: need at least 1", gpus);
  for (int tp = 1; tp <= node && tp <= gpus; tp *= 2) {
    if (gpus % tp) continue;
    /* Context parallelism for a dense model's long sequences: cp 2, 4, ... while each rank keeps at least
     * LOOM_SEARCH_CP_MIN_ROWS rows of a sequence (shorter, and a ring's blocks are too small to hide their hops). */
    for (int cp = 1; cp == 1 || (!base->model->moe && seq / cp >= LOOM_SEARCH_CP_MIN_ROWS && tp * cp <= gpus); cp *= 2)
    for (int pp = 1; pp <= layers && tp * cp * pp <= gpus; pp++) {
      if (gpus % (tp * cp * pp) || seq % (2 * cp)) continue;
      const int dp = gpus / (tp * cp * pp);
      if (global % dp) continue; /* each replica takes a whole share of the global batch */
      const int64_t lean = opt->exhaustive ? -1 : leanest_bytes(base, tp, cp, pp, dp, 1, experts, expert_ffn);
      if (lean > prof->device->memory_bytes) { /* nothing in this grid fits: not enumerated */
        res->pruned++;
        res->pruned_least_bytes = res->pruned == 1 || lean < res->pruned_least_bytes ? lean : res->pruned_least_bytes;
        continue;
      }
      for (int mb = 1; mb <= global / dp; mb *= 2) {
        if ((global / dp) % mb) continue;
        if (mb > 1 && !opt->exhaustive && leanest_bytes(base, tp, cp, pp, dp, mb, experts, expert_ffn) > prof->device->memory_bytes)
          break; /* this micro-batch's leanest layout is over memory, and every larger one's more */
        const int m = global / dp / mb;
        for (int vpp = 1; vpp <= 8; vpp++) {
          if (vpp > 1 && (pp == 1 || layers % (pp * vpp))) continue; /* chunks need a pipeline and even layers */
          loom_schedule_kind kinds[8];
          const int nkinds = schedules_for(pp, vpp, m, kinds);
          for (int k = 0; k < nkinds; k++)
            for (int sp = 0; sp < (tp > 1 ? 2 : 1); sp++)
              for (int zero = 0; zero <= (dp > 1 ? 3 : 0); zero++)
                for (int ep = 1; ep <= experts && ep <= tp * dp; ep *= 2) /* a dense model (or cp > 1): 1 alone */
                  for (int split = 0; split < (experts > 1 && tp > 1 && sp ? 2 : 1); split++) { /* etp 1, or tp */
                    const int etp = split ? tp : 1;
                    for (int gather = 0; gather < (cp > 1 ? 2 : 1); gather++) /* the ring, or Megatron's all-gather */
                      for (int overlap = 0; overlap < (sp && overlap_costed ? 2 : 1); overlap++) /* needs SP */
                      for (int pg = 0; pg < ((zero == 1 || zero == 2) && gather_costed ? 2 : 1); pg++) {
                        const loom_candidate c = {.tp = tp, .pp = pp, .dp = dp, .vpp = vpp, .micro_batch = mb, .zero = zero,
                                                  .ep = ep, .etp = etp, .cp = cp, .cp_all_gather = gather,
                                                  .tp_comm_overlap = overlap, .param_gather_overlap = pg,
                                                  .sequence_parallel = sp, .schedule = kinds[k]};
                        measure_recompute(base, prof, assume, c, res, &fits, &nfits);
                        if (opt->progress) opt->progress(res, opt->ctx);
                      }
                  }
        }
      }
    }
  }
  /* Replays, most promising first, so the layouts that cannot matter are known early. */
  if (nfits > 1) qsort(fits, (size_t)nfits, sizeof *fits, lowest_bound_first);
  for (int i = 0; i < nfits; i++) {
    if (dominated(res, &fits[i], opt->keep))
      res->bounded++;
    else
      predict(base, prof, assume, fits[i], res);
    if (opt->progress) opt->progress(res, opt->ctx);
  }
  free(fits);
  if (res->nranked > 1) qsort(res->ranked, (size_t)res->nranked, sizeof *res->ranked, faster_first);
  return LOOM_OK;
}

void loom_search_result_free(loom_search_result *res) {
  free(res->ranked);
  free(res->unfit);
  *res = (loom_search_result){0};
}
