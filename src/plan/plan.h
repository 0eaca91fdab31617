/* Partition plans as data (DESIGN.md invariant 2): building one from a model
 * and a layout, balancing layers across stages, the rules a plan must obey
 * (checked before any rank allocates memory) and its size and memory
 * estimates. Schedule verification needs src/schedule, which sits below this
 * module: `loom plan check` adds it. */
#ifndef LOOM_PLAN_H
#define LOOM_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include "plan/plan_io.h"

/* What `loom plan new` builds a plan from; model fields as in Model. */
typedef struct {
  int layers, hidden, heads, ffn, vocab, seq;
  float dropout, norm_eps;
  int tp, pp, dp, vpp, zero_stage;
  bool sequence_parallel, recompute;
  int micro_batch, global_batch;
  Loom__ScheduleKind schedule;
  Loom__Balance balance;
  const int *layer_counts; /* explicit layers per virtual stage, or NULL */
  int nlayer_counts;
  const char *name;
} loom_plan_spec;

/* Builds the plan (with stages and estimates); the caller frees it. */
loom_status loom_plan_build(const loom_plan_spec *spec, loom_plan **out, loom_error *err);

/* Parameters of the whole model: 12 l h^2 + 13 l h + (V + s) h + 2 h for
 * GPT-2 shapes (ffn = 4h), in general l (4h^2 + 2hf + 9h + f) + (V + s) h + 2h. */
int64_t loom_plan_total_parameters(const Loom__Model *m);

/* Fills plan->estimates: per stage parameters and per-rank memory by kind
 * (mixed-precision training: bf16 weights 2 B, fp32 grads 4 B, fp32 master
 * weights and Adam moments 12 B, split 1/dp by ZeRO-1; activations by
 * Megatron's s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes per layer, or
 * s*b*h*(34 + 5*a*s/h)/t with sequence parallelism, 2*s*b*h with full
 * recompute, times the micro-batches the schedule keeps in flight), and the
 * bubble. */
void loom_plan_estimate(loom_plan *plan);

/* One line per broken rule, each naming the field, the value, the rule and a
 * fix; world and device_memory (bytes) are checked when > 0. Returns the
 * number of violations; lines (if not NULL) get them, newline-separated. */
int loom_plan_check_rules(const loom_plan *plan, int world, int64_t device_memory, char *lines, size_t cap);

/* Layers of each virtual stage (stage = chunk * pp + pp_rank) into counts
 * (room for every stage); returns the number of stages. */
int loom_plan_layer_counts(const loom_plan *plan, int *counts);

/* Peak micro-batches (per chunk) a pipeline rank keeps in flight. */
int loom_plan_in_flight(Loom__ScheduleKind kind, int pp, int vpp, int m, int rank);

#endif
