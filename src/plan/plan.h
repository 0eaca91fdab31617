/* Partition plans as data (DESIGN.md invariant 2): building one from a model
 * and a layout, balancing layers across stages, the rules a plan must obey
 * (checked before any rank allocates memory) and its size and memory
 * estimates. The plan sits above the layers and the schedule: its sizes come
 * from the layers' parameter table and its in-flight counts from the
 * schedule verifier, never from formulas of its own. */
#ifndef LOOM_PLAN_H
#define LOOM_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include "layers/gpt_params.h"
#include "plan/grad_compression.h"
#include "plan/plan_io.h"
#include "schedule/schedule.h"

/* What `loom plan new` (and every command that runs a model) builds a plan
 * from; model fields as in Model. */
typedef struct {
  loom_gpt_config model; /* finished (loom_gpt_config_finish); precision comes from the field below */
  int train_seq; /* the training sequence when shorter than model.seq, else 0 */
  int tp, pp, dp, vpp, zero_stage;
  int ep; /* a MoE model's expert-parallel size (0 or 1: none) */
  int etp; /* its expert-tensor-parallel size (0 or 1: none; else tp) */
  int cp;  /* context-parallel size (0 or 1: none) */
  Loom__CpCommType cp_comm; /* how its attention meets the other ranks' keys and values */
  bool tp_comm_overlap;     /* --tp-comm-overlap */
  bool no_grad_reduce_overlap; /* --no-overlap-grad-reduce: the dp grads after backward, not in buckets during it */
  bool param_gather_overlap;   /* --overlap-param-gather */
  bool no_p2p_overlap;         /* --no-overlap-p2p-communication: each pipeline send waited for */
  Loom__Fp8Format fp8;         /* --fp8-format */
  loom_fp8_config fp8_scaling; /* the FP8 recipe's settings (its on and hybrid aside: fp8 says them) */
  bool sequence_parallel, recompute;
  int recompute_layers; /* with recompute: each stage's first N layers (Megatron's block method; capped at the stage's); 0: all */
  int recompute_group;  /* with recompute: layers per recomputed group (Megatron's uniform method); 0 or 1: each alone */
  int micro_batch, global_batch;
  Loom__ScheduleKind schedule;
  Loom__Balance balance;
  Loom__Precision precision, grad_reduce;
  Loom__CompressionKind compression; /* how grads cross dp */
  int compression_rank;              /* PowerSGD's r */
  const int *layer_counts; /* explicit layers per virtual stage, or NULL */
  int nlayer_counts;
  const char *name;
} loom_plan_spec;

/* Bounds of every size a plan holds, checked by validation and taken by the
 * flags that set them. With them, and the products validation bounds too
 * (ranks, virtual stages, micro-batch x dp, micro-batch x seq), every size
 * the runtime forms fits its type: ranks and GEMM dimensions in int,
 * element and parameter counts in int64. */
#define LOOM_PLAN_MAX_LAYERS LOOM_GPT_MAX_LAYERS
#define LOOM_PLAN_MAX_HIDDEN (1 << 20)
#define LOOM_PLAN_MAX_HEADS 4096
#define LOOM_PLAN_MAX_FFN (1 << 22)
#define LOOM_PLAN_MAX_VOCAB (1 << 24)
#define LOOM_PLAN_MAX_SEQ (1 << 20)
#define LOOM_PLAN_MAX_TP 4096
#define LOOM_PLAN_MAX_CP 4096
#define LOOM_PLAN_MAX_PP 4096
#define LOOM_PLAN_MAX_DP (1 << 20)
#define LOOM_PLAN_MAX_CHUNKS 64
#define LOOM_PLAN_MAX_STAGES 4096 /* pp x virtual_chunks */
#define LOOM_PLAN_MAX_MICRO_BATCH (1 << 20)
#define LOOM_PLAN_MAX_MICRO_BATCHES 16383 /* per step and replica: x chunks x 2 within MPI's 32767 tags */
#define LOOM_PLAN_MAX_GLOBAL_BATCH (1 << 30)
#define LOOM_PLAN_MAX_COMPRESSION_RANK 1024
#define LOOM_PLAN_MAX_DEVICES_PER_NODE 1024
#define LOOM_PLAN_MAX_EXPERTS 4096 /* and the expert-parallel size */
#define LOOM_PLAN_MAX_CAPACITY_FACTOR 1024.0 /* a plan's cluster block and a cluster profile alike */

/* Builds the plan (with stages and estimates); the caller frees it. */
loom_status loom_plan_build(const loom_plan_spec *spec, loom_plan **out, loom_error *err);


/* The training schedule the plan's ranks run (its kind, pp, chunks and
 * micro-batches), without the tied-embedding reduction when the model's
 * head is untied: what the executor runs and the verifier proves. */
loom_status loom_plan_schedule(const loom_plan *plan, loom_schedule *s, loom_error *err);
/* The FP8 settings a plan runs with (fp8 and fp8_scaling; Megatron-Core's defaults where absent). */
loom_fp8_config loom_plan_fp8(const loom_plan *p);
/* The model the plan describes, as the layers take it. */
void loom_plan_model_config(const loom_plan *plan, loom_gpt_config *cfg);
/* The same as one rank holds it: a MoE model's experts placed over its
 * expert-parallel group (loom_gpt_config_for_ep, at ep rank 0: every rank
 * holds as many), for the sizes one rank allocates and computes. */
void loom_plan_rank_config(const loom_plan *plan, loom_gpt_config *cfg);
/* Where the sequence is: the plan's context-parallel split and how its
 * attention exchanges keys and values, into cfg (the rank config's part
 * the runtime sets on the whole model's). */
void loom_plan_context_config(const loom_plan *plan, loom_gpt_config *cfg);
/* The one translation between the Model message and the layers' config
 * (plans and checkpoint manifests): of reads m (bf16 false), fill writes
 * every field of c into m, which the caller has initialised; RoPE scaling,
 * where c has it, goes into rooms->scaling, which m->rope_scaling then
 * points at, and a MoE model's settings into rooms->moe (its layer pattern,
 * where it has dense layers, into rooms->pattern): the caller's to keep
 * alive as long as m, or to copy where m outlives them. */
typedef struct {
  Loom__RopeScaling scaling;
  Loom__Mla mla;
  Loom__Moe moe;
  int32_t pattern[LOOM_GPT_MAX_LAYERS];        /* the MoE layers */
  int32_t window_pattern[LOOM_GPT_MAX_LAYERS]; /* the windowed layers */
} loom_model_rooms;
void loom_model_proto_config(const Loom__Model *m, loom_gpt_config *cfg);
void loom_model_proto_fill(Loom__Model *m, const loom_gpt_config *c, loom_model_rooms *rooms);
/* What the layers compute with (bf16 in mixed precision, else fp32), and
 * what grads cross dp in (the plan's grad_reduce): their sizes are
 * loom_dtype_size's. */
loom_dtype loom_plan_compute_dtype(const loom_plan *plan);
loom_dtype loom_plan_grad_reduce_dtype(const loom_plan *plan);
/* The size of the experts' data-parallel groups (loom_expert_data_size:
 * tp x cp x dp / (etp x ep)), the dense ones' (grad replicas) without
 * expert parallelism. */
int loom_plan_expert_replicas(const loom_plan *plan);
/* The training sequence length: batch.seq, else model.seq. */
int loom_plan_train_seq(const loom_plan *plan);
/* What communication the plan runs beside compute (Overlap's fields, its
 * defaults applied): the one reading of them. */
typedef struct {
  bool tp_comm, grad_reduce, param_gather, p2p;
} loom_plan_overlap;
loom_plan_overlap loom_plan_overlaps(const loom_plan *plan);
/* Ranks the plan runs on: tp x cp x dp x pp. */
int64_t loom_plan_ranks(const loom_plan *plan);
/* The world rank of pipeline rank pp_rank's first member (tp, cp and dp 0): whose sheet stands for its stage. */
int loom_plan_pipeline_rank(const loom_plan *plan, int pp_rank);
/* The ranks holding the same parameters, over which grads sum and ZeRO
 * shards: dp x cp (Megatron-Core's data-parallel group with cp). */
int loom_plan_grad_replicas(const loom_plan *plan);
/* Whether the stages recompute activations in backward (a rule makes them agree). */
bool loom_plan_recompute(const loom_plan *plan);
/* What stage v recomputes in backward: its first layers (none without
 * recompute, stages[v].recompute_layers where set, else all) in groups of
 * stages[v].recompute_group (where set, else 1). */
loom_recompute loom_plan_stage_recompute(const loom_plan *plan, int v);
/* Micro-batches per step and replica: global / (micro x dp). */
int loom_plan_micro_batches(const loom_plan *plan);
/* Layers and ends of virtual stage v (loom_plan_stage_index) of a checked plan. */
loom_stage_range loom_plan_stage_range(const loom_plan *plan, int v);
/* The virtual stage (pp_rank, chunk) holds under the plan's schedule: the
 * rule of schedule.h's loom_stage_of, looped or V-shaped. */
int loom_plan_stage_index(const loom_plan *plan, int pp_rank, int chunk);

/* The plan's grad_compression, with its dp (NONE when absent). */
loom_compression loom_plan_compression(const loom_plan *plan);
/* What gradient compression costs and saves one rank for the stage `range`,
 * from the layers' table (plan/grad_compression.h): the 32-bit words of
 * state it keeps (its error feedback, and its two message buffers as
 * optim/grad_compress.c allocates them), and the words its grads send over
 * dp per step against the words they would send whole (equal, and no
 * state, without compression). */
typedef struct {
  double error_words, a_words, b_words; /* the state */
  double sent_words, whole_words;
  double message_words; /* the part of sent_words that is compressed tensors' messages (the rest crosses whole) */
} loom_compression_cost;
loom_compression_cost loom_plan_compression_cost(const loom_plan *plan, const loom_stage_range *range);
/* The same for a model (as the plan holds it whole) split tp ways, experts over etp x ep, compressed by compression. */
loom_compression_cost loom_range_compression_cost(const loom_gpt_config *model, int tp, int etp, int ep,
                                                  const loom_compression *compression, const loom_stage_range *range);

/* Parameters of the whole model, from the layers' parameter table. */
int64_t loom_plan_total_parameters(const loom_plan *plan);

/* Fills plan->estimates: per stage parameters (from the layers' table),
 * per-rank memory by kind from the memory model (plan/memory.h: the
 * buffers a rank allocates, from the layers' tables and the verified
 * schedule's buffer events), gradient compression's state, the bytes a
 * rank sends over dp per step (as ring collectives move them), and the
 * bubble. */
void loom_plan_estimate(loom_plan *plan);

/* What grads cross dp with per step, from the estimates: the words one tp
 * rank's model sends (compressed where the plan compresses) against its
 * whole grads' words; the pipeline rank that sends the most over dp, its
 * bytes and the whole words they carry; and the most bytes any pipeline
 * rank sends over its experts' data-parallel group. */
typedef struct {
  double sent_words, whole_words;
  int busiest;
  double busiest_bytes, busiest_words;
  double expert_most;
} loom_dp_traffic;
loom_dp_traffic loom_plan_dp_traffic(const loom_plan *plan);

/* Bytes pipeline rank pp_rank needs on its device by the plan's estimates
 * (filled by loom_plan_estimate), over every chunk it runs; *activations,
 * if not NULL, gets the activations' part. */
int64_t loom_plan_rank_bytes(const loom_plan *plan, int pp_rank, int64_t *activations);

/* One line per broken rule, each naming the field, the value, the rule and a
 * fix; world and device_memory (bytes) are checked when > 0. Returns the
 * number of violations; lines (if not NULL) get them, newline-separated. */
int loom_plan_check_rules(const loom_plan *plan, int world, int64_t device_memory, char *lines, size_t cap);

/* The size rules alone (each size within its bound above, then each product
 * within its type) for parts of a run from outside, a checkpoint manifest
 * or a model file; any part may be NULL. Returns the number of violations,
 * lines as in loom_plan_check_rules. */
int loom_plan_check_sizes(const Loom__Model *model, const Loom__Parallel *parallel, const Loom__Batch *batch, char *lines,
                          size_t cap);

/* A model from outside (a model file, a checkpoint manifest) against the
 * size rules and the model's own rules (those a plan checks, at tp 1).
 * Returns the number of violations, lines as in loom_plan_check_rules. */
int loom_plan_check_model(const Loom__Model *model, char *lines, size_t cap);

/* What a plan is validated against before a run. */
typedef struct {
  int world;             /* ranks launched (0: unchecked) */
  int64_t device_memory; /* bytes of one device for the plan's mixed-precision estimates (0: unchecked) */
  int64_t host_memory;   /* bytes this host has for its ranks' fp32 CPU run (0: unchecked) */
  int host_ranks;        /* ranks sharing host_memory */
} loom_plan_limits;

/* The one validation: the rules, then the schedule built and verified
 * deadlock-free, then memory. Returns the number of problems, with lines as
 * in loom_plan_check_rules. */
int loom_plan_validate(const loom_plan *plan, const loom_plan_limits *limits, char *lines, size_t cap);
/* The same as a refusal: LOOM_OK, or LOOM_ERR_USAGE with the first problem
 * as err's message (callers prefix their command). */
loom_status loom_plan_refuse(const loom_plan *plan, const loom_plan_limits *limits, loom_error *err);

/* Lowers the plan's dp to fit `world` ranks, world / (tp x pp) replicas,
 * keeping everything else, the global batch too (each replica takes more
 * micro-batches): what a job restarted on fewer hosts runs. A plan that
 * fits is left alone; a world of no whole tp x pp group, or a global batch
 * the new dp does not divide, is refused. */
loom_status loom_plan_fit_world(loom_plan *plan, int world, loom_error *err);

/* Layers of each virtual stage (loom_plan_stage_index) into counts
 * (room for every stage); returns the number of stages. */
int loom_plan_layer_counts(const loom_plan *plan, int *counts);

#endif
