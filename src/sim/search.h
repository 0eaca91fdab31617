/* `loom plan search`: every layout of a model on N GPUs of a cluster (tp
 * within a node, pp, dp, interleaved chunks, micro-batch, recompute (none,
 * the fewest of each stage's first layers that fit, or full),
 * sequence parallelism, ZeRO stage and schedule), each refused by the
 * plan's own rules or its memory estimate or else predicted by `loom sim`'s
 * cost model, ranked by throughput. */
#ifndef LOOM_SIM_SEARCH_H
#define LOOM_SIM_SEARCH_H

#include "sim/sim.h"

typedef struct {
  int tp, pp, dp, vpp, micro_batch, zero;
  int ep;  /* a MoE model's expert-parallel size (0 or 1: none) */
  int etp; /* and its expert-tensor-parallel size (0 or 1: none; else tp) */
  int cp;  /* context-parallel size (0 or 1: none) */
  bool cp_all_gather; /* its keys and values all-gathered (else round a ring) */
  bool tp_comm_overlap; /* --tp-comm-overlap (with tp > 1 and SP) */
  bool param_gather_overlap; /* --overlap-param-gather (ZeRO 1 or 2, the grads reduced during backward) */
  bool sequence_parallel, recompute;
  int recompute_layers; /* with recompute: each stage's first N layers (Megatron's block method); 0: all */
  loom_schedule_kind schedule;
  double step_s, tokens_per_s, tflops_per_gpu, mfu, bubble;
  double bound_s; /* the cost model's lower bound on step_s, known before any replay */
  int64_t memory; /* the most one rank needs */
  double goodput; /* with a failure rate (loom plan search --mtbf-hours): the better level's expected goodput; else 0 */
  int order;      /* when it was enumerated: equal candidates rank in this order */
} loom_candidate;
/* "none", "full" or "block N": a candidate's recompute, for tables. */
const char *loom_candidate_recompute(const loom_candidate *c, char *buf, size_t n);

typedef struct {
  char reason[96]; /* the rule's field ("batch.global_batch"), or "memory": over the device's */
  int count;
} loom_drop_count;

#define LOOM_SEARCH_MAX_REASONS 32
/* The search tries context parallelism (a dense model's) only where each
 * rank keeps at least this many rows of a sequence: cp is for long
 * sequences, and below it a ring's blocks grow too small to hide their hops. */
#define LOOM_SEARCH_CP_MIN_ROWS 4096

typedef struct {
  int considered;
  int fit;                /* valid layouts within the device's memory: ranked or bounded */
  loom_candidate *ranked; /* fitting candidates predicted by a replay, fastest first */
  int nranked;
  int bounded;            /* fitting candidates not replayed: slower, by their bound, than a predicted layout
                           * that needs no more memory and than the `keep` fastest */
  loom_candidate *unfit;  /* valid layouts over the device's memory: their memory only, never replayed */
  int nunfit;
  loom_drop_count dropped[LOOM_SEARCH_MAX_REASONS];
  int ndropped;
  /* Grids (tp, cp, pp and so dp) not enumerated: their leanest layout
   * already needs more than the device holds (search.c's leanest_bytes),
   * and the least of those needs. Micro-batches past a grid's first that
   * are over memory by the same bound are not enumerated either. */
  int pruned;
  int64_t pruned_least_bytes;
} loom_search_result;

typedef struct loom_search_options {
  /* The fastest `keep` layouts are predicted exactly (a table's rows); so is
   * every layout that no faster one beats on memory, so the memory-throughput
   * frontier is whole. 0: every layout that fits is predicted. */
  int keep;
  /* Called after each candidate with the counts so far; may be NULL. */
  void (*progress)(const loom_search_result *res, void *ctx);
  void *ctx;
  /* Enumerate every layout, pruning nothing by memory (the tests' check that pruning loses no layout that fits). */
  bool exhaustive;
} loom_search_options;

/* Searches the layouts of base's model, batch and precision on gpus GPUs:
 * every candidate's memory and cost bound first, then replays in order of
 * the bound, skipping those that cannot matter (see keep). A candidate's
 * MoE load imbalance is the assumed one, or its ep where that is less. */
loom_status loom_plan_search(const loom_plan *base, int gpus, const loom_profile *prof, const loom_sim_assumptions *assume,
                             const loom_search_options *opt, loom_search_result *res, loom_error *err);
void loom_search_result_free(loom_search_result *res);
/* The plan of a candidate (base's model, batch and precision). */
loom_status loom_candidate_plan(const loom_plan *base, const loom_candidate *c, loom_plan **out, loom_error *err);

#endif
