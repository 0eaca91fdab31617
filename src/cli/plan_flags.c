/* Layout flags, their plan, and rule messages in flag names. */
#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/names.h"
#include "cli/flag_defs.h"
#include "cli/plan_flags.h"
#include "core/decimal.h"

static const char *const BALANCE_CHOICES[] = {"uniform", "params", "compute", NULL};
static const char *const RECOMPUTE_CHOICES[] = {"none", "full", NULL};
static const char *const RECOMPUTE_METHODS[] = {"uniform", "block", NULL};
static const char *const PRECISION_CHOICES[] = {"fp32", "bf16", NULL}; /* in Loom__Precision's order */
static const char *const CP_COMM_CHOICES[] = {"p2p", "all_gather", NULL}; /* in Loom__CpCommType's order (Megatron's names) */
static const char *const FP8_CHOICES[] = {"none", "hybrid", "e4m3", NULL}; /* in Loom__Fp8Format's order (Megatron's names) */
static const char *const FP8_RECIPE_CHOICES[] = {"delayed", "tensorwise", "blockwise", "mxfp8", NULL}; /* Loom__Fp8Recipe's order */
static const char *const FP8_AMAX_CHOICES[] = {"most_recent", "max", NULL}; /* Loom__Fp8AmaxAlgo's order */

loom_plan_flags loom_plan_flags_defaults(void) {
  return (loom_plan_flags){.model = {.preset = "gpt-tiny"}, .tp = 1, .pp = 1, .dp = 1, .vpp = 1, .ep = 1, .etp = 1, .cp = 1, .cp_comm_type = "p2p", .fp8_format = "none", .fp8_recipe = "delayed", .fp8_amax_compute_algo = "most_recent", .fp8_amax_history_len = 1, .layers_at_start_in_bf16 = 1, .layers_at_end_in_bf16 = 1, .micro_batch = 16,
                           .schedule = "1f1b", .recompute = "none", .balance = "uniform", .precision = "fp32",
                           .grad_reduce = "fp32", .grad_compression = "none"};
}

void loom_plan_flags_table(loom_plan_flags *f, loom_flag *out) {
  loom_model_flags_table(&f->model, out);
  const loom_flag rest[] = {
      loom_flag_def("--tp", &f->tp),
      loom_flag_def("--pp", &f->pp),
      loom_flag_def("--dp", &f->dp),
      {"--cp", FLAG_INT, &f->cp, "context-parallel ranks: each sample's sequence split over them (2 cp chunks, rank r "
       "holding chunks r and 2 cp - 1 - r), attention passing keys and values round a ring", 1, LOOM_PLAN_MAX_CP, NULL,
       false, "parallel.cp"},
      {"--cp-comm-type", FLAG_STRING, &f->cp_comm_type, "how context parallelism's attention meets the other ranks' keys "
       "and values: p2p (round a ring, each transfer overlapped with a block's attention) or all_gather (gathered before "
       "it, their grads reduce-scattered after)", LOOM_NO_RANGE, CP_COMM_CHOICES, false, "parallel.cp_comm_type"},
      loom_flag_def("--vpp", &f->vpp),
      {"--layers-per-virtual-stage", FLAG_INT, &f->layers_per_virtual_stage, "layers in each model chunk of a rank "
       "(Megatron-LM's convention): sets --vpp to layers / (pp x this), and the interleaved schedule unless --schedule "
       "names one", 1, LOOM_PLAN_MAX_LAYERS, NULL, false, NULL},
      {"--ep", FLAG_INT, &f->ep, "a MoE model's expert-parallel ranks: each holds experts / ep of the experts and "
       "trades tokens with the others (its MoE layers regroup tp x dp as ep x the rest)", 1, LOOM_PLAN_MAX_EXPERTS, NULL,
       false, "parallel.ep"},
      {"--etp", FLAG_INT, &f->etp, "a MoE model's expert tensor parallelism: 1 (each expert whole on its rank) or --tp (each "
       "expert's MLP split over the tp group as the dense MLP is)", 1, LOOM_PLAN_MAX_TP, NULL, false, "parallel.etp"},
      loom_flag_def("--zero", &f->zero),
      {"--sequence-parallel", FLAG_BOOL, &f->sequence_parallel, "split norms and dropout along the sequence across the TP group", LOOM_NO_RANGE, NULL, false, "parallel.sequence_parallel"},
      {"--micro-batch", FLAG_INT, &f->micro_batch, "sequences per micro-batch", 1, LOOM_PLAN_MAX_MICRO_BATCH, NULL, false, "batch.micro_batch"},
      {"--global-batch", FLAG_INT, &f->global_batch, "sequences per optimizer step (0: micro-batches x micro-batch x dp)", 0, LOOM_PLAN_MAX_GLOBAL_BATCH, NULL, false, "batch.global_batch"},
      loom_flag_def("--micro-batches", &f->micro_batches),
      loom_flag_def("--schedule", &f->schedule),
      {"--recompute", FLAG_STRING, &f->recompute, "activation recomputation in backward, on every stage", LOOM_NO_RANGE, RECOMPUTE_CHOICES, false, NULL},
      {"--recompute-method", FLAG_STRING, &f->recompute_method, "with --recompute full: uniform (every layer recomputes, in "
       "groups of --recompute-num-layers keeping the first one's input) or block (only each stage's first "
       "--recompute-num-layers recompute; the rest keep their activations)",
       LOOM_NO_RANGE, RECOMPUTE_METHODS, false, NULL},
      {"--recompute-num-layers", FLAG_INT, &f->recompute_num_layers, "block: the layers of each stage (each model chunk) "
       "that recompute; uniform: layers per recomputed group (default 1)", 1, LOOM_PLAN_MAX_LAYERS, NULL, false, "stages"},
      {"--balance", FLAG_STRING, &f->balance, "how layers spread over stages", LOOM_NO_RANGE, BALANCE_CHOICES, false, "balance"},
      loom_flag_def("--layer-split", &f->layer_split),
      {"--precision", FLAG_STRING, &f->precision, "fp32, or bf16 mixed precision (bf16 weights and activations, fp32 master weights and grads)", LOOM_NO_RANGE, PRECISION_CHOICES, false, "precision"},
      {"--grad-reduce-dtype", FLAG_STRING, &f->grad_reduce, "type grads cross data parallelism in: fp32, or bf16 (half the bytes)", LOOM_NO_RANGE, PRECISION_CHOICES, false, "grad_reduce"},
      {"--grad-compression", FLAG_STRING, &f->grad_compression, "how grads cross data parallelism: none, powersgd:RANK (low-rank factors) or sign (a bit per element), both with error feedback", LOOM_NO_RANGE, NULL, false, "grad_compression"},
      {"--tp-comm-overlap", FLAG_BOOL, &f->tp_comm_overlap, "split each layer's sequence-parallel all-gathers and "
       "reduce-scatters into chunks run beside the GEMMs that consume or produce them (Megatron-Core's; needs --tp 2 or "
       "more and --sequence-parallel): `loom sim` costs it; this runtime runs them between the GEMMs and says so",
       LOOM_NO_RANGE, NULL, false, "overlap.tp_comm"},
      {"--overlap-grad-reduce", FLAG_BOOL, &f->overlap_grad_reduce, "reduce the dp grads in buckets as backward makes them "
       "final (loom's default; Megatron-Core's flag)", LOOM_NO_RANGE, NULL, false, "overlap.grad_reduce"},
      {"--no-overlap-grad-reduce", FLAG_BOOL, &f->no_overlap_grad_reduce, "reduce the dp grads after backward, all at once",
       LOOM_NO_RANGE, NULL, false, "overlap.grad_reduce"},
      {"--overlap-param-gather", FLAG_BOOL, &f->overlap_param_gather, "run ZeRO-1/2's all-gather of the stepped weights "
       "beside the next step's first forward (Megatron-Core's distributed optimizer): `loom sim` costs it; this runtime "
       "gathers them after the step and says so", LOOM_NO_RANGE, NULL, false, "overlap.param_gather"},
      {"--no-overlap-p2p-communication", FLAG_BOOL, &f->no_overlap_p2p, "wait for each pipeline send before going on, "
       "as Megatron's 1F1B does without overlap: `loom sim` costs it; this runtime posts its transfers as it makes them "
       "and says so", LOOM_NO_RANGE, NULL, false, "overlap.p2p"},
      {"--fp8-format", FLAG_STRING, &f->fp8_format, "the linear layers' GEMMs in FP8 as Megatron-Core runs them "
       "(hybrid: e4m3 forward, e5m2 grads; needs --precision bf16); the embedding, the head, attention, norms and routers "
       "stay bf16/fp32", LOOM_NO_RANGE, FP8_CHOICES, false, "fp8"},
      {"--fp8-recipe", FLAG_STRING, &f->fp8_recipe, "how FP8 operands are scaled: delayed (an amax history a tensor), "
       "tensorwise (each tensor's amax as it is cast), blockwise (DeepSeek-V3's 1 x 128 and 128 x 128 tiles) or mxfp8 "
       "(32-element blocks, E8M0 scales)", LOOM_NO_RANGE, FP8_RECIPE_CHOICES, false, "fp8_scaling.recipe"},
      {"--fp8-amax-history-len", FLAG_INT, &f->fp8_amax_history_len, "delayed scaling: steps of amax each tensor keeps",
       0, LOOM_FP8_MAX_HISTORY, NULL, false, "fp8_scaling.amax_history_len"},
      {"--fp8-amax-compute-algo", FLAG_STRING, &f->fp8_amax_compute_algo, "delayed scaling: a tensor's scale from the "
       "latest amax (most_recent) or its history's max", LOOM_NO_RANGE, FP8_AMAX_CHOICES, false,
       "fp8_scaling.amax_compute_algo"},
      {"--fp8-margin", FLAG_INT, &f->fp8_margin, "delayed scaling: scales divided by 2^margin", 0, LOOM_FP8_MAX_MARGIN, NULL, false,
       "fp8_scaling.margin"},
      {"--first-last-layers-bf16", FLAG_BOOL, &f->first_last_layers_bf16, "keep the first and last layers' GEMMs in bf16 "
       "under --fp8-format (how many: the two flags below)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--num-layers-at-start-in-bf16", FLAG_INT, &f->layers_at_start_in_bf16, "with --first-last-layers-bf16: the "
       "first layers kept in bf16", 0, LOOM_PLAN_MAX_LAYERS, NULL, false, "fp8_scaling.bf16_first_layers"},
      {"--num-layers-at-end-in-bf16", FLAG_INT, &f->layers_at_end_in_bf16, "with --first-last-layers-bf16: the last "
       "layers kept in bf16", 0, LOOM_PLAN_MAX_LAYERS, NULL, false, "fp8_scaling.bf16_last_layers"},
      loom_flag_def_as("--name", &f->name, "a name for the plan"),
  };
  _Static_assert(sizeof rest / sizeof rest[0] == LOOM_PLAN_FLAG_COUNT - LOOM_MODEL_FLAG_COUNT, "LOOM_PLAN_FLAG_COUNT");
  memcpy(out + LOOM_MODEL_FLAG_COUNT, rest, sizeof rest);
}

loom_status loom_plan_flags_or_file(const char *cmd, const char *file, const loom_plan_flags *f, const loom_flag *table,
                                    loom_plan **plan, loom_error *err) {
  *plan = NULL;
  if (!file) return loom_plan_flags_build(cmd, f, table, plan, err);
  for (int k = 0; k < LOOM_PLAN_FLAG_COUNT; k++)
    if (table[k].set && loom_plan_flags_fixed(&table[k]))
      return loom_fail(err, LOOM_ERR_USAGE, "%s: %s cannot be combined with --plan: the plan fixes the model and layout",
                       cmd, table[k].name);
  return loom_plan_read(file, plan, err);
}

bool loom_plan_flags_fixed(const loom_flag *e) {
  return strcmp(e->name, "--init-from") != 0 && strcmp(e->name, "--name") != 0;
}

int loom_plan_flags_parse_split(const char *text, int *counts, int max) {
  int n = 0;
  for (const char *p = text; *p;) {
    const char *end;
    int64_t v;
    if (n == max || loom_parse_decimal(p, &end, 0, 1000000, &v) != LOOM_DECIMAL_OK) return -1;
    counts[n++] = (int)v;
    if (*end == ',') end++;
    else if (*end != '\0') return -1;
    p = end;
  }
  return n;
}

/* --grad-compression: "none", "sign" or "powersgd:RANK"; the rank's range is the plan's rule. */
static loom_status parse_compression(const char *cmd, const char *text, Loom__CompressionKind *kind, int *rank,
                                     loom_error *err) {
  *kind = LOOM__COMPRESSION_KIND__COMPRESSION_NONE, *rank = 0;
  if (strcmp(text, "none") == 0) return LOOM_OK;
  if (strcmp(text, "sign") == 0) {
    *kind = LOOM__COMPRESSION_KIND__COMPRESSION_SIGN;
    return LOOM_OK;
  }
  const char *prefix = "powersgd:";
  int64_t r = 0;
  if (strncmp(text, prefix, strlen(prefix)) != 0 ||
      loom_parse_decimal(text + strlen(prefix), NULL, INT_MIN, INT_MAX, &r) != LOOM_DECIMAL_OK)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --grad-compression " LOOM_QUOTE_FMT ": expected none, sign or powersgd:RANK (e.g. "
                     "powersgd:4)", cmd, LOOM_QUOTE(text));
  *kind = LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD, *rank = (int)r;
  return LOOM_OK;
}

loom_status loom_plan_flags_build(const char *cmd, const loom_plan_flags *f, const loom_flag *table, loom_plan **out,
                                  loom_error *err) {
  *out = NULL;
  loom_gpt_config cfg;
  int T;
  loom_status st = loom_model_flags_resolve(cmd, &f->model, table, &cfg, &T, err);
  if (st != LOOM_OK) return st;
  int counts[LOOM_PLAN_MAX_STAGES];
  const int ncounts = f->layer_split ? loom_plan_flags_parse_split(f->layer_split, counts, LOOM_PLAN_MAX_STAGES) : 0;
  if (ncounts < 0)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --layer-split " LOOM_QUOTE_FMT " is not a comma-separated list of layer counts", cmd,
                     LOOM_QUOTE(f->layer_split));
  const long long per_step = (long long)f->micro_batch * f->dp;
  if (f->micro_batches && f->global_batch && f->global_batch != f->micro_batches * per_step)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --global-batch %d != --micro-batches %d x --micro-batch %d%s", cmd,
                     f->global_batch, f->micro_batches, f->micro_batch, f->dp > 1 ? " x --dp" : "");
  const long long global = f->global_batch ? f->global_batch : (f->micro_batches ? f->micro_batches : 1) * per_step;
  if (global > LOOM_PLAN_MAX_GLOBAL_BATCH)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --micro-batches x --micro-batch x --dp = %lld sequences per step; at most %d", cmd,
                     global, LOOM_PLAN_MAX_GLOBAL_BATCH);
  Loom__CompressionKind compression;
  int compression_rank;
  st = parse_compression(cmd, f->grad_compression, &compression, &compression_rank, err);
  if (st != LOOM_OK) return st;
  loom_schedule_kind kind = LOOM_SCHEDULE_1F1B;
  loom_cli_schedule_kind(f->schedule, &kind); /* the flag's choices guarantee a known kind */
  /* ZB-V runs two chunks per rank: what --vpp means when not given. */
  const bool vpp_given = loom_flags_find(table, LOOM_PLAN_FLAG_COUNT, "--vpp")->set;
  int vpp = kind == LOOM_SCHEDULE_ZB_V && !vpp_given ? 2 : f->vpp;
  if (f->layers_per_virtual_stage) { /* Megatron's way to ask for interleaving: layers per chunk */
    const int per = f->layers_per_virtual_stage;
    if (vpp_given)
      return loom_fail(err, LOOM_ERR_USAGE, "%s: --layers-per-virtual-stage sets --vpp; give one of them", cmd);
    if (cfg.layers % (f->pp * per))
      return loom_fail(err, LOOM_ERR_USAGE, "%s: --layers-per-virtual-stage %d: the %d layers do not split into %d stages of "
                       "chunks of %d layers each", cmd, per, cfg.layers, f->pp, per);
    vpp = cfg.layers / (f->pp * per);
    if (!loom_flags_find(table, LOOM_PLAN_FLAG_COUNT, "--schedule")->set && vpp > 1) kind = LOOM_SCHEDULE_INTERLEAVED;
  }
  /* Megatron's partial recompute: its method and layer count refine --recompute full. */
  if (f->overlap_grad_reduce && f->no_overlap_grad_reduce)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --overlap-grad-reduce and --no-overlap-grad-reduce contradict; give one", cmd);
  const bool full = strcmp(f->recompute, "full") == 0, block = f->recompute_method && strcmp(f->recompute_method, "block") == 0;
  if ((f->recompute_method || f->recompute_num_layers) && !full)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --recompute-method and --recompute-num-layers shape full recompute; add "
                     "--recompute full (Megatron-LM's --recompute-granularity full)", cmd);
  if (block && !f->recompute_num_layers)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --recompute-method block needs --recompute-num-layers, the layers of each "
                     "stage that recompute", cmd);
  const loom_plan_spec spec = {
      .model = cfg, .train_seq = T, .tp = f->tp, .pp = f->pp, .dp = f->dp, .vpp = vpp, .zero_stage = f->zero, .ep = f->ep, .etp = f->etp, .cp = f->cp,
      .cp_comm = (Loom__CpCommType)loom_flag_choice_index(CP_COMM_CHOICES, f->cp_comm_type),
      .tp_comm_overlap = f->tp_comm_overlap, .no_grad_reduce_overlap = f->no_overlap_grad_reduce,
      .param_gather_overlap = f->overlap_param_gather, .no_p2p_overlap = f->no_overlap_p2p,
      .fp8 = (Loom__Fp8Format)loom_flag_choice_index(FP8_CHOICES, f->fp8_format),
      .fp8_scaling = {.recipe = (loom_fp8_recipe)loom_flag_choice_index(FP8_RECIPE_CHOICES, f->fp8_recipe),
                      .history = f->fp8_amax_history_len, .margin = f->fp8_margin,
                      .most_recent = loom_flag_choice_index(FP8_AMAX_CHOICES, f->fp8_amax_compute_algo) == 0,
                      .bf16_first = f->first_last_layers_bf16 ? f->layers_at_start_in_bf16 : 0,
                      .bf16_last = f->first_last_layers_bf16 ? f->layers_at_end_in_bf16 : 0},
      .sequence_parallel = f->sequence_parallel, .recompute = full, .recompute_layers = block ? f->recompute_num_layers : 0,
      .recompute_group = block ? 1 : f->recompute_num_layers,
      .micro_batch = f->micro_batch,
      .global_batch = (int)global, .schedule = kind, .balance = (Loom__Balance)loom_flag_choice_index(BALANCE_CHOICES, f->balance),
      .precision = (Loom__Precision)loom_flag_choice_index(PRECISION_CHOICES, f->precision),
      .grad_reduce = (Loom__Precision)loom_flag_choice_index(PRECISION_CHOICES, f->grad_reduce),
      .compression = compression, .compression_rank = compression_rank,
      .layer_counts = f->layer_split ? counts : NULL, .nlayer_counts = ncounts, .name = f->name};
  st = loom_plan_build(&spec, out, err);
  if (st != LOOM_OK) {
    char named[sizeof err->msg];
    loom_plan_flags_name_fields(table, err->msg, named, sizeof named);
    return loom_fail(err, st, "%s: %s", cmd, named);
  }
  return LOOM_OK;
}

static bool word_char(char c) { return isalnum((unsigned char)c) || c == '_' || c == '.'; }

void loom_flags_name_fields(const loom_flag *table, int count, const char *in, char *out, size_t cap) {
  size_t used = 0;
  for (const char *p = in; *p && used + 1 < cap;) {
    const loom_flag *hit = NULL;
    size_t len = 0;
    if (p == in || !word_char(p[-1]))
      for (int k = 0; k < count; k++) {
        const char *field = table[k].field;
        const size_t n = field ? strlen(field) : 0;
        /* A dotted field anywhere; a bare one ("schedule") only as "schedule = x". */
        if (n > len && strncmp(p, field, n) == 0 && !word_char(p[n]) && (strchr(field, '.') || strncmp(p + n, " = ", 3) == 0))
          hit = &table[k], len = n;
      }
    if (!hit) {
      out[used++] = *p++;
      continue;
    }
    p += len;
    if (strncmp(p, " = ", 3) == 0) p += 2; /* "model.heads = 6" reads "--heads 6" */
    used += (size_t)snprintf(out + used, cap - used, "%s", hit->name);
    if (used >= cap) used = cap - 1;
  }
  out[used] = '\0';
}

void loom_plan_flags_name_fields(const loom_flag *table, const char *in, char *out, size_t cap) {
  loom_flags_name_fields(table, LOOM_PLAN_FLAG_COUNT, in, out, cap);
}

loom_status loom_plan_flags_refuse(const char *cmd, const loom_plan *plan, const loom_plan_limits *limits,
                                   const loom_flag *table, const char *file, loom_error *err) {
  const loom_status st = loom_plan_refuse(plan, limits, err);
  if (st == LOOM_OK) return st;
  char first[sizeof err->msg];
  if (file) {
    snprintf(first, sizeof first, "%s", err->msg);
    return loom_fail(err, st, "%s: %s: %s (loom plan check lists every problem)", cmd, file, first);
  }
  loom_plan_flags_name_fields(table, err->msg, first, sizeof first);
  return loom_fail(err, st, "%s: %s", cmd, first);
}

