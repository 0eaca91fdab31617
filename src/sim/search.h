/* `loom plan search`: every layout of a model on N GPUs of a cluster (tp
 * within a node, pp, dp, interleaved chunks, micro-batch, recompute,
 * sequence parallelism, ZeRO stage and schedule), each refused by the
 * plan's own rules or its memory estimate or else predicted by `loom sim`'s
 * cost model, ranked by throughput. */
#ifndef LOOM_SIM_SEARCH_H
#define LOOM_SIM_SEARCH_H

#include "sim/sim.h"

typedef struct {
  int tp, pp, dp, vpp, micro_batch, zero;
  bool sequence_parallel, recompute;
  loom_schedule_kind schedule;
  double step_s, tokens_per_s, tflops_per_gpu, mfu, bubble;
  int64_t memory; /* the most one rank needs */
} loom_candidate;

typedef struct {
  char reason[96]; /* the rule's field ("batch.global_batch"), or "memory": over the device's */
  int count;
} loom_drop_count;

#define LOOM_SEARCH_MAX_REASONS 32

typedef struct {
  int considered;
  loom_candidate *ranked; /* fitting candidates, fastest first */
  int nranked;
  loom_candidate *unfit;  /* valid layouts over the device's memory: their memory only, never replayed */
  int nunfit;
  loom_drop_count dropped[LOOM_SEARCH_MAX_REASONS];
  int ndropped;
} loom_search_result;

/* Searches the layouts of base's model, batch and precision on gpus GPUs. */
loom_status loom_plan_search(const loom_plan *base, int gpus, const loom_profile *prof, loom_flops_formula formula,
                             loom_search_result *res, loom_error *err);
void loom_search_result_free(loom_search_result *res);
/* The plan of a candidate (base's model, batch and precision). */
loom_status loom_candidate_plan(const loom_plan *base, const loom_candidate *c, loom_plan **out, loom_error *err);

#endif
