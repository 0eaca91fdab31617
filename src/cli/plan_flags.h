/* The one table of flags that shape the model and the parallel layout, each
 * naming the plan field it sets. `loom plan new` and `loom train` both parse
 * it and turn it into a plan with the same builder, so a flag set means the
 * same plan everywhere, and a plan rule's message can name the flag instead
 * of the field. */
#ifndef LOOM_PLAN_FLAGS_H
#define LOOM_PLAN_FLAGS_H

#include "cli/model_flags.h"
#include "plan/plan.h"

typedef struct {
  loom_model_flags model;
  int tp, pp, dp, vpp, layers_per_virtual_stage, zero, micro_batch, global_batch, micro_batches, recompute_num_layers, ep, etp, cp;
  bool sequence_parallel;
  const char *schedule, *recompute, *recompute_method, *balance, *precision, *grad_reduce, *grad_compression, *layer_split, *name;
  const char *cp_comm_type; /* --cp-comm-type: p2p or all_gather */
  const char *fp8_format;   /* --fp8-format: none, hybrid or e4m3 */
  const char *fp8_recipe, *fp8_amax_compute_algo; /* --fp8-recipe, --fp8-amax-compute-algo */
  int fp8_amax_history_len, fp8_margin, layers_at_start_in_bf16, layers_at_end_in_bf16;
  bool first_last_layers_bf16;
  bool tp_comm_overlap, overlap_grad_reduce, no_overlap_grad_reduce, overlap_param_gather, no_overlap_p2p;
} loom_plan_flags;

#define LOOM_PLAN_FLAG_COUNT (LOOM_MODEL_FLAG_COUNT + 37)

loom_plan_flags loom_plan_flags_defaults(void);
/* Writes the table's entries into out[LOOM_PLAN_FLAG_COUNT], pointing into f. */
void loom_plan_flags_table(loom_plan_flags *f, loom_flag *out);
/* The plan these flags describe (table: the parsed entries, the plan flags
 * first). Refuses only what cannot become a plan at all; the plan's rules
 * judge the rest. */
loom_status loom_plan_flags_build(const char *cmd, const loom_plan_flags *f, const loom_flag *table, loom_plan **out,
                                  loom_error *err);
/* The plan a command runs: read from file (--plan), which no fixed plan
 * flag may accompany, or built from the flags when file is NULL. */
loom_status loom_plan_flags_or_file(const char *cmd, const char *file, const loom_plan_flags *f, const loom_flag *table,
                                    loom_plan **plan, loom_error *err);
/* Copies a rule message, naming each plan field by its flag: "model.heads = 6"
 * becomes "--heads 6", "parallel.tp (4)" becomes "--tp (4)". */
void loom_plan_flags_name_fields(const loom_flag *table, const char *in, char *out, size_t cap);
/* The same over any table of count flags, each naming its field. */
void loom_flags_name_fields(const loom_flag *table, int count, const char *in, char *out, size_t cap);
/* loom_plan_refuse as a command's refusal: the first problem, in flag names
 * when the plan came from flags (file NULL), else naming the plan file. */
loom_status loom_plan_flags_refuse(const char *cmd, const loom_plan *plan, const loom_plan_limits *limits,
                                   const loom_flag *table, const char *file, loom_error *err);
/* Parses "7,8,8,7" into counts (at most max entries); returns how many, or -1. */
int loom_plan_flags_parse_split(const char *text, int *counts, int max);
/* Whether a plan-flag entry is one the plan fixes (with --plan it may not be given). */
bool loom_plan_flags_fixed(const loom_flag *entry);

#endif
