/* `loom train`: builds the model, data and optimizer from flags, then runs
 * the training loop with per-step logs, held-out evals and metrics. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_peak.h"
#include "ckpt/llmc_model.h"
#include "cli/commands.h"
#include "cli/metrics.h"
#include "cli/model_flags.h"
#include "cli/trainer.h"
#include "core/check.h"
#include "core/log.h"
#include "core/sysinfo.h"
#include "cli/launch.h"
#include "tensor_parallel/parallel_state.h"
#include "core/timer.h"
#include "data/addition.h"
#include "data/byte_tokenizer.h"
#include "pipeline/layer_split.h"
#include "pipeline/trace.h"
#include "plan/plan.h"
#include "schedule/verify.h"

typedef struct {
  loom_model_flags model;
  int micro_batch, global_batch, steps, warmup, digits, eval_every, eval_batches, threads, log_every, tp;
  int pp, vpp, micro_batches;
  bool sequence_parallel;
  const char *schedule, *recompute, *layer_split, *trace, *plan;
  int64_t seed;
  float lr, min_lr_frac, weight_decay, grad_clip;
  const char *data, *eval_data, *data_order, *synthetic, *metrics, *save;
} train_flags;

static const char *const ORDER_CHOICES[] = {"sequential", "shuffled", NULL};
static const char *const SYNTHETIC_CHOICES[] = {"addition", NULL};
static const char *const SCHEDULE_CHOICES[] = {"gpipe", "1f1b", "interleaved", NULL};
static const char *const RECOMPUTE_CHOICES[] = {"none", "full", NULL};

#define TRAIN_FLAG_COUNT (LOOM_MODEL_FLAG_COUNT + 30)
#define MAX_STAGES 1024

static void train_table(train_flags *f, loom_flag *t) {
  loom_model_flags_table(&f->model, t);
  const loom_flag rest[] = {
      {"--micro-batch", FLAG_INT, &f->micro_batch, "sequences per micro-batch", 1, 1 << 20, NULL, false},
      {"--global-batch", FLAG_INT, &f->global_batch, "sequences per optimizer step (0: the micro-batch)", 0, 1 << 24, NULL, false},
      {"--steps", FLAG_INT, &f->steps, "optimizer steps", 1, 1e9, NULL, false},
      {"--lr", FLAG_FLOAT, &f->lr, "peak learning rate", 0, 10, NULL, false},
      {"--min-lr-frac", FLAG_FLOAT, &f->min_lr_frac, "final cosine LR as a fraction of --lr", 0, 1, NULL, false},
      {"--warmup", FLAG_INT, &f->warmup, "linear warmup steps", 0, 1e9, NULL, false},
      {"--weight-decay", FLAG_FLOAT, &f->weight_decay, "AdamW decoupled weight decay", 0, 10, NULL, false},
      {"--grad-clip", FLAG_FLOAT, &f->grad_clip, "max global grad norm (0: off)", 0, 1e9, NULL, false},
      {"--seed", FLAG_INT64, &f->seed, "seed of init, data order and dropout", 0, 9007199254740991.0, NULL, false},
      {"--data", FLAG_STRING, &f->data, "train on an llm.c token file", LOOM_NO_RANGE, NULL, false},
      {"--eval-data", FLAG_STRING, &f->eval_data, "held-out token file (default: the tail of --data)", LOOM_NO_RANGE, NULL, false},
      {"--data-order", FLAG_STRING, &f->data_order, "order of --data windows", LOOM_NO_RANGE, ORDER_CHOICES, false},
      {"--synthetic", FLAG_STRING, &f->synthetic, "train on a built-in task (used when --data is absent)", LOOM_NO_RANGE, SYNTHETIC_CHOICES, false},
      {"--digits", FLAG_INT, &f->digits, "operand digits of the addition task", 1, 9, NULL, false},
      {"--eval-every", FLAG_INT, &f->eval_every, "held-out evaluation every N steps (0: off)", 0, 1e9, NULL, false},
      {"--eval-batches", FLAG_INT, &f->eval_batches, "micro-batches per evaluation", 1, 1e6, NULL, false},
      {"--log-every", FLAG_INT, &f->log_every, "print a progress line every N steps", 1, 1e9, NULL, false},
      {"--metrics", FLAG_STRING, &f->metrics, "write JSON lines of per-step metrics here", LOOM_NO_RANGE, NULL, false},
      {"--save", FLAG_STRING, &f->save, "save the final model in llm.c format", LOOM_NO_RANGE, NULL, false},
      {"--threads", FLAG_INT, &f->threads, "CPU threads per rank (0: the node's cores shared among its ranks)", 0, 4096, NULL, false},
      {"--tp", FLAG_INT, &f->tp, "tensor-parallel ranks (launch with mpirun -np TP)", 1, 4096, NULL, false},
      {"--sequence-parallel", FLAG_BOOL, &f->sequence_parallel, "split norms and dropout along the sequence across the TP group", LOOM_NO_RANGE, NULL, false},
      {"--pp", FLAG_INT, &f->pp, "pipeline stages (world size = tp x pp)", 1, 1024, NULL, false},
      {"--vpp", FLAG_INT, &f->vpp, "model chunks per pipeline rank (--schedule interleaved)", 1, 64, NULL, false},
      {"--micro-batches", FLAG_INT, &f->micro_batches, "micro-batches per step (0: global batch / micro-batch)", 0, 16383, NULL, false},
      {"--schedule", FLAG_STRING, &f->schedule, "pipeline schedule", LOOM_NO_RANGE, SCHEDULE_CHOICES, false},
      {"--recompute", FLAG_STRING, &f->recompute, "activation recomputation in backward", LOOM_NO_RANGE, RECOMPUTE_CHOICES, false},
      {"--layer-split", FLAG_STRING, &f->layer_split, "layers per stage, e.g. 7,8,8,7 (default: even)", LOOM_NO_RANGE, NULL, false},
      {"--trace", FLAG_STRING, &f->trace, "write the last step's pipeline timeline as Chrome-trace JSON", LOOM_NO_RANGE, NULL, false},
      {"--plan", FLAG_STRING, &f->plan, "run a partition plan (.txtpb or .pb); it fixes the model and layout", LOOM_NO_RANGE, NULL, false},
  };
  _Static_assert(sizeof rest / sizeof rest[0] == TRAIN_FLAG_COUNT - LOOM_MODEL_FLAG_COUNT, "TRAIN_FLAG_COUNT");
  memcpy(t + LOOM_MODEL_FLAG_COUNT, rest, sizeof rest);
}

/* The flags a plan fixes; with --plan only steps, learning rate, data and
 * output paths (and how progress is shown) may be given. */
static const char *const PLAN_FIXED[] = {"--model", "--layers", "--hidden", "--heads", "--ffn", "--vocab", "--seq",
                                         "--dropout", "--micro-batch", "--global-batch", "--micro-batches", "--tp",
                                         "--pp", "--vpp", "--sequence-parallel", "--schedule", "--recompute",
                                         "--layer-split", NULL};

/* Fills the model and layout flags from a plan file, refusing broken plans. */
static loom_status apply_plan(train_flags *f, const loom_flag *t, loom_gpt_config *cfg, int *T, int *counts,
                              int *ncounts, loom_error *err) {
  for (const char *const *name = PLAN_FIXED; *name; name++)
    if (loom_flags_find(t, TRAIN_FLAG_COUNT, *name)->set)
      return loom_fail(err, LOOM_ERR_USAGE, "loom train: %s cannot be combined with --plan: the plan fixes the model and layout",
                       *name);
  loom_plan *plan;
  loom_status st = loom_plan_read(f->plan, &plan, err);
  if (st != LOOM_OK) return st;
  char lines[2048];
  if (loom_plan_check_rules(plan, loom_launch_env_size(), 0, lines, sizeof lines) > 0) {
    char *nl = strchr(lines, '\n');
    if (nl) *nl = '\0';
    st = loom_fail(err, LOOM_ERR_USAGE, "loom train: %s: %s (loom plan check lists every problem)", f->plan, lines);
  } else if (plan->parallel->dp != 1 || plan->parallel->zero_stage != 0) {
    st = loom_fail(err, LOOM_ERR_USAGE, "loom train: %s: dp %d / zero_stage %d: data parallelism is not in this loom yet; use dp 1",
                   f->plan, plan->parallel->dp, plan->parallel->zero_stage);
  }
  for (size_t k = 1; st == LOOM_OK && k < plan->n_stages; k++)
    if (plan->stages[k]->recompute != plan->stages[0]->recompute)
      st = loom_fail(err, LOOM_ERR_USAGE, "loom train: %s: stages disagree on recompute; this loom recomputes all stages or none",
                     f->plan);
  if (st == LOOM_OK) {
    const Loom__Model *m = plan->model;
    *cfg = (loom_gpt_config){.layers = m->layers, .hidden = m->hidden, .heads = m->heads, .ffn = m->ffn,
                             .vocab = m->vocab, .seq = m->seq, .dropout = m->dropout, .norm_eps = m->norm_eps};
    loom_gpt_config_finish(cfg);
    *T = m->seq;
    f->tp = plan->parallel->tp;
    f->pp = plan->parallel->pp;
    f->vpp = plan->parallel->virtual_chunks;
    f->sequence_parallel = plan->parallel->sequence_parallel;
    f->micro_batch = plan->batch->micro_batch;
    f->global_batch = plan->batch->global_batch;
    static const char *const KINDS[] = {"1f1b", "gpipe", "interleaved"};
    f->schedule = KINDS[plan->schedule];
    f->recompute = plan->n_stages && plan->stages[0]->recompute ? "full" : "none";
    *ncounts = (int)plan->n_stages;
    for (size_t k = 0; k < plan->n_stages; k++) {
      const Loom__Stage *s = plan->stages[k];
      counts[s->chunk * plan->parallel->pp + s->pp_rank] = s->layer_end - s->layer_begin;
    }
  }
  loom_plan_free(plan);
  return st;
}

static train_flags train_defaults(void) {
  return (train_flags){.model = {.preset = "gpt-tiny"}, .micro_batch = 16, .global_batch = 0,
                       .steps = 2000, .warmup = 30, .digits = LOOM_ADDITION_DEFAULT_DIGITS,
                       .eval_every = 250, .eval_batches = 8, .threads = 0, .log_every = 1, .tp = 1,
                       .pp = 1, .vpp = 1, .schedule = "1f1b", .recompute = "none",
                       .seed = 1337, .lr = 3e-3f, .min_lr_frac = 0.1f, .weight_decay = 0.1f,
                       .grad_clip = 1.0f, .data_order = "sequential", .synthetic = "addition"};
}

/* Cross-flag checks the table cannot express. */
static loom_status check_flags(const train_flags *f, const loom_flag *t, const loom_gpt_config *cfg, loom_error *err) {
  if (f->global_batch % f->micro_batch != 0)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --global-batch %d is not a multiple of --micro-batch %d",
                     f->global_batch, f->micro_batch);
  if (f->data && loom_flags_find(t, TRAIN_FLAG_COUNT, "--synthetic")->set)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: give --data or --synthetic, not both");
  if (f->eval_data && !f->data)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --eval-data needs --data");
  if (f->micro_batches && loom_flags_find(t, TRAIN_FLAG_COUNT, "--global-batch")->set &&
      f->global_batch != f->micro_batches * f->micro_batch)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --global-batch %d != --micro-batches %d x --micro-batch %d",
                     f->global_batch, f->micro_batches, f->micro_batch);
  if (f->layer_split && loom_layer_split_parse(f->layer_split, (int[MAX_STAGES]){0}, MAX_STAGES) < 0)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --layer-split '%s' is not a comma-separated list of layer counts",
                     f->layer_split);
  if (!f->data && cfg->vocab < LOOM_BYTE_VOCAB)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --synthetic %s needs --vocab of at least %d (byte tokens), got %d",
                     f->synthetic, LOOM_BYTE_VOCAB, cfg->vocab);
  return LOOM_OK;
}

/* Refuses a run that cannot fit in memory before allocating any of it: all
 * `ranks` of this machine share its memory. */
static loom_status check_memory(const loom_gpt_config *cfg, int T, int B, int tp, bool sp, int ranks, loom_error *err) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double per_rank_state = 4.0 * sizeof(float) * (double)loom_gpt_param_count(cfg, tp); /* params, grads, Adam m, v */
  const double state = ranks * per_rank_state;
  const double acts = ranks * (double)loom_gpt_activation_bytes(cfg, T, B, tp, sp, NULL, false, 1);
  const double avail = (double)loom_mem_available_bytes();
  if (state + acts <= avail) return LOOM_OK;
  return loom_fail(err, LOOM_ERR_USAGE,
                   "loom train: this run needs %.1f GiB (parameters, grads and Adam state %.1f GiB, activations "
                   "%.1f GiB for micro-batch %d x seq %d) but %.1f GiB is available; lower --micro-batch or --seq",
                   (state + acts) / gib, state / gib, acts / gib, B, T, avail / gib);
}

typedef struct {
  loom_gpt_config cfg; /* the whole model (tp 1 vocab padding) */
  loom_launch launch;
  loom_parallel ps;
  loom_gpt model;       /* when not pipelined */
  loom_pipeline pipe;   /* when pipelined */
  bool pipelined;
  loom_adamw *opts;     /* one per chunk (one when not pipelined) */
  int nopts;
  const int *plan_counts; /* a plan's layers per virtual stage, or NULL */
  int plan_ncounts;
  loom_dataset *data;
  loom_trainer trainer;
  loom_metrics metrics;
} train_run;

/* This rank's model parts: the chunks of its pipeline stage, or the one model. */
static int parts(train_run *r, loom_gpt **out) {
  *out = r->pipelined ? r->pipe.chunks : &r->model;
  return r->pipelined ? r->pipe.v : 1;
}

/* Loads an llm.c file into this rank's shards (every rank reads the file). */
static loom_status load_shards(loom_gpt *m, const char *path, loom_error *err) {
  loom_gpt_params full;
  loom_status st = loom_gpt_params_init(&full, &m->p.cfg, 0, 1, NULL);
  if (st != LOOM_OK) return loom_fail(err, st, "%s: out of memory reading the model", path);
  full.cfg.padded_vocab = m->p.cfg.padded_vocab;
  loom_gpt_config file_cfg;
  st = loom_llmc_read_config(path, &file_cfg, err);
  if (st == LOOM_OK && file_cfg.padded_vocab != full.cfg.padded_vocab) {
    /* The file's vocab padding differs from this split's: read it at its own. */
    loom_gpt_params_free(&full);
    file_cfg.dropout = m->p.cfg.dropout;
    st = loom_gpt_params_init(&full, &file_cfg, 0, 1, NULL);
  }
  if (st == LOOM_OK) st = loom_llmc_load(path, &full, err);
  if (st == LOOM_OK) loom_gpt_params_copy_shards(&m->p, &full, 1);
  loom_gpt_params_free(&full);
  return st;
}

/* Gathers every rank's shards and writes the whole model from rank 0. */
static loom_status save_model(train_run *r, const loom_gpt_config *cfg, const char *path, loom_error *err) {
  loom_gpt_params full;
  loom_status st = loom_gpt_params_init(&full, cfg, 0, 1, NULL);
  if (st != LOOM_OK) return loom_fail(err, st, "%s: out of memory assembling the model", path);
  loom_gpt *chunks;
  const int n = parts(r, &chunks);
  for (int c = 0; c < n; c++) {
    loom_gpt_params_gather(&chunks[c].p, &full, chunks[c].tp.group);
    /* Both ends hold the tied wte; the last stage's copy stays out of the sum below. */
    if (chunks[c].p.range.last && !chunks[c].p.range.first) memset(full.w.wte, 0, loom_tensor_bytes(&full.params.views[0]));
  }
  /* Each tensor lives on one pipeline stage and is zero elsewhere: summing assembles the model. */
  if (r->pipelined) loom_comm_allreduce(r->ps.pp_group, full.params.base, full.params.numel, LOOM_REDUCE_SUM);
  if (r->launch.rank == 0) st = loom_llmc_save(path, &full, err);
  loom_gpt_params_free(&full);
  if (st == LOOM_OK) loom_log_info("saved %s (llm.c format)", path);
  return st;
}

static loom_status build_model(train_run *r, const train_flags *f, const loom_gpt_config *cfg, int T) {
  const loom_tp tp = loom_tp_of(&r->ps);
  loom_status st = loom_gpt_init(&r->model, cfg, loom_ops_cpu(), (uint64_t)f->seed, &tp);
  return st == LOOM_OK ? loom_gpt_set_batch_shape(&r->model, T, f->micro_batch) : st;
}

static loom_status build_pipeline(train_run *r, const train_flags *f, const loom_gpt_config *cfg, int T, loom_error *err) {
  int counts[MAX_STAGES];
  int ncounts = f->layer_split ? loom_layer_split_parse(f->layer_split, counts, MAX_STAGES) : 0;
  if (r->plan_counts) {
    memcpy(counts, r->plan_counts, (size_t)r->plan_ncounts * sizeof(int));
    ncounts = r->plan_ncounts;
  }
  loom_schedule_kind kind = LOOM_SCHEDULE_1F1B;
  loom_schedule_kind_parse(f->schedule, &kind); /* the flag's choices guarantee a known kind */
  const loom_pipeline_config pc = {.kind = kind, .v = f->vpp, .micro_batches = f->global_batch / f->micro_batch,
                                   .layer_counts = ncounts ? counts : NULL, .nlayer_counts = ncounts,
                                   .recompute = strcmp(f->recompute, "full") == 0};
  loom_status st = loom_pipeline_init(&r->pipe, &r->ps, cfg, loom_ops_cpu(), (uint64_t)f->seed, &pc, T, f->micro_batch, err);
  return loom_error_prefix(err, st, "loom train");
}

static loom_status setup(train_run *r, const train_flags *f, const loom_gpt_config *cfg, int T, loom_error *err) {
  loom_status st;
  r->cfg = *cfg;
  /* Fault injection for tests: one rank fails alone, as a missing file on one node would. */
  const char *fail_rank = getenv("LOOM_TEST_FAIL_RANK");
  if (fail_rank && atoi(fail_rank) == r->launch.rank)
    return loom_fail(err, LOOM_ERR_IO, "injected failure on this rank (LOOM_TEST_FAIL_RANK)");
  if (f->data) {
    const loom_data_order order = strcmp(f->data_order, "shuffled") == 0 ? LOOM_ORDER_SHUFFLED : LOOM_ORDER_SEQUENTIAL;
    st = loom_dataset_open_tokens(&r->data, f->data, f->eval_data, cfg->vocab, T, order, (uint64_t)f->seed, true, err);
    if (st != LOOM_OK) return st;
  } else {
    r->data = loom_dataset_addition(f->digits, (uint64_t)f->seed);
  }
  st = loom_metrics_open(&r->metrics, r->launch.rank == 0 ? f->metrics : NULL, err);
  if (st != LOOM_OK) return st;
  st = r->pipelined ? build_pipeline(r, f, cfg, T, err) : build_model(r, f, cfg, T);
  loom_gpt *chunks;
  const int n = parts(r, &chunks);
  for (int c = 0; c < n && st == LOOM_OK && f->model.init_from; c++) st = load_shards(&chunks[c], f->model.init_from, err);
  loom_adamw_config oc = loom_adamw_defaults();
  oc.weight_decay = f->weight_decay;
  oc.grad_clip = f->grad_clip;
  r->opts = loom_xcalloc((size_t)n, sizeof *r->opts, "optimizers");
  r->nopts = n;
  for (int c = 0; c < n && st == LOOM_OK; c++) st = loom_adamw_init(&r->opts[c], &chunks[c].p, &oc);
  if (st == LOOM_ERR_NOMEM) return loom_fail(err, st, "loom train: out of memory building the model and optimizer");
  if (st != LOOM_OK) return st;
  const loom_lr_schedule lr = {.max_lr = f->lr, .min_lr = f->lr * f->min_lr_frac,
                               .warmup_steps = f->warmup, .total_steps = f->steps};
  if (r->pipelined) loom_trainer_init_pipeline(&r->trainer, &r->pipe, r->opts, r->data, T, f->micro_batch, lr);
  else loom_trainer_init(&r->trainer, &r->model, r->opts, r->data, T, f->micro_batch, f->global_batch, lr);
  return LOOM_OK;
}

/* Logs a held-out evaluation; adds it to the current metrics line if `record`. */
static void run_eval(train_run *r, const train_flags *f, int step, bool record) {
  const int digits = f->data ? 0 : f->digits;
  const loom_eval_stats e = loom_trainer_eval(&r->trainer, f->eval_batches, digits);
  if (record) loom_metrics_num(&r->metrics, "eval_loss", e.loss);
  if (digits > 0 && e.problems > 0) {
    const double acc = (double)e.correct / e.problems;
    loom_log_info("eval  step %5d | held-out loss %.4f | exact match %5.1f%% (%d/%d held-out sums)", step,
                  (double)e.loss, 100.0 * acc, e.correct, e.problems);
    if (record) loom_metrics_num(&r->metrics, "eval_accuracy", acc);
  } else {
    loom_log_info("eval  step %5d | held-out loss %.4f", step, (double)e.loss);
  }
}

/* The layout, the schedule's theoretical bubble, and what recompute saved. */
static void log_pipeline(train_run *r, const train_flags *f) {
  const loom_pipeline *p = &r->pipe;
  loom_log_info("parallel: %d ranks, tp %d%s x pp %d | schedule %s, vpp %d, %d micro-batches | bubble in theory %.1f%%",
                r->ps.world, r->ps.tp, r->ps.sequence_parallel ? " (sequence parallel)" : "", r->ps.pp, f->schedule,
                p->v, p->m, 100.0 * loom_schedule_theory_bubble(&p->sched));
  const double mib = 1048576.0, kept = (double)p->act_bytes, full = (double)p->act_bytes_without_recompute;
  if (strcmp(f->recompute, "full") == 0)
    loom_log_info("activations on rank 0: %.2f MiB with full recompute, %.2f MiB without: saves %.2f MiB", kept / mib,
                  full / mib, (full - kept) / mib);
  else
    loom_log_info("activations on rank 0: %.2f MiB for %d micro-batches in flight", kept / mib, p->nslots);
}

/* Measured peak memory of the busiest rank against loom's own estimate of it:
 * fp32 weights, grads and Adam moments (16 bytes per local parameter) plus
 * the activation and scratch buffers this layout allocates. */
static void report_memory(train_run *r) {
  loom_gpt *chunks;
  const int n = parts(r, &chunks);
  double params = 0.0, acts = r->pipelined ? (double)r->pipe.act_bytes : 0.0;
  for (int c = 0; c < n; c++) params += (double)chunks[c].p.params.numel;
  if (!r->pipelined) acts = (double)(r->model.a->mem.numel + r->model.w.mem.numel) * sizeof(float);
  float numbers[2] = {(float)loom_peak_rss_bytes(), (float)(16.0 * params + acts)};
  loom_comm_allreduce(r->launch.world, numbers, 2, LOOM_REDUCE_MAX);
  const double mib = 1048576.0;
  loom_log_info("memory: peak %.1f MiB on the busiest rank; estimated %.1f MiB (16 B per parameter + activations), "
                "%+.1f%% off", numbers[0] / mib, numbers[1] / mib, 100.0 * (numbers[1] - numbers[0]) / numbers[0]);
}

static loom_status train_loop(train_run *r, const train_flags *f, int T, loom_error *err) {
  const loom_gpt_config *cfg = &r->cfg;
  /* Every rank measures at once, so the sum is this job's sgemm peak. */
  float peak_sum = (float)loom_cpu_sgemm_gflops(1024, 0.3);
  loom_comm_allreduce(r->launch.world, &peak_sum, 1, LOOM_REDUCE_SUM);
  const double peak = peak_sum;
  const double tokens = (double)f->global_batch * T, flops = loom_gpt_train_flops(cfg, T, tokens);
  loom_log_info("model: %d layers, hidden %d, heads %d, vocab %d (padded %d), seq %d: %zu parameters",
                cfg->layers, cfg->hidden, cfg->heads, cfg->vocab, cfg->padded_vocab, cfg->seq,
                loom_gpt_param_count(&r->cfg, 1));
  if (r->ps.world > 1 && !r->pipelined)
    loom_log_info("parallel: %d ranks, tp %d%s | %zu parameters per rank", r->ps.world, r->ps.tp,
                  r->ps.sequence_parallel ? " with sequence parallelism" : "", r->model.p.params.numel);
  if (r->pipelined) log_pipeline(r, f);
  loom_log_info("data: %s | batch %d x %d tokens (micro-batch %d) | %d steps | %d threads x %d ranks | sgemm peak %.1f GFLOP/s",
                f->data ? f->data : "synthetic addition", f->global_batch, T, f->micro_batch, f->steps,
                loom_cpu_threads(), r->launch.size, peak);
  if (f->eval_every > 0) run_eval(r, f, 0, false);
  for (int step = 0; step < f->steps; step++) {
    if (r->pipelined) r->pipe.tracing = f->trace && step + 1 == f->steps;
    const double t0 = loom_now_s();
    const loom_step_stats s = loom_trainer_step(&r->trainer, step);
    const double dt = loom_now_s() - t0, gflops = flops / dt * 1e-9;
    if (!isfinite(s.loss))
      return loom_fail(err, LOOM_ERR_RUNTIME, "loom train: loss became %g at step %d; lower --lr or check the data",
                       (double)s.loss, step + 1);
    if ((step + 1) % f->log_every == 0 || step == 0 || step + 1 == f->steps)
      loom_log_info("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %8.0f tok/s | %6.1f GFLOP/s | %4.1f%% peak",
                    step + 1, f->steps, (double)s.loss, (double)s.lr, s.grad_norm, dt * 1e3, tokens / dt, gflops,
                    100.0 * gflops / peak);
    loom_metrics_begin(&r->metrics, step + 1);
    loom_metrics_num(&r->metrics, "loss", s.loss);
    loom_metrics_num(&r->metrics, "lr", s.lr);
    loom_metrics_num(&r->metrics, "grad_norm", s.grad_norm);
    loom_metrics_num(&r->metrics, "ms", dt * 1e3);
    loom_metrics_num(&r->metrics, "tokens_per_s", tokens / dt);
    loom_metrics_num(&r->metrics, "gflops", gflops);
    loom_metrics_num(&r->metrics, "peak_frac", gflops / peak);
    if (f->eval_every > 0 && ((step + 1) % f->eval_every == 0 || step + 1 == f->steps)) run_eval(r, f, step + 1, true);
    loom_metrics_end(&r->metrics);
  }
  report_memory(r);
  if (f->trace) {
    double bubble;
    loom_status st = loom_trace_write(&r->pipe, r->launch.world, f->trace, &bubble, err);
    if (st != LOOM_OK) return st;
    loom_log_info("trace %s: bubble measured %.1f%%, theory %.1f%% (loom trace svg %s -o FILE.svg draws it)", f->trace,
                  100.0 * bubble, 100.0 * loom_schedule_theory_bubble(&r->pipe.sched), f->trace);
  }
  return f->save ? save_model(r, &r->cfg, f->save, err) : LOOM_OK;
}

int loom_cmd_train(int argc, char **argv) {
  train_flags f = train_defaults();
  loom_flag table[TRAIN_FLAG_COUNT];
  train_table(&f, table);
  loom_error err = {{0}};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse("loom train", "loom train [flags]", table, TRAIN_FLAG_COUNT, argc, argv, pos, 0, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (f.global_batch == 0) f.global_batch = f.micro_batches ? f.micro_batches * f.micro_batch : f.micro_batch;
  loom_gpt_config cfg;
  int T, plan_counts[MAX_STAGES], plan_ncounts = 0;
  st = f.plan ? apply_plan(&f, table, &cfg, &T, plan_counts, &plan_ncounts, &err)
              : loom_model_flags_resolve("loom train", &f.model, table, &cfg, &T, &err);
  const int world = loom_launch_env_size();
  if (st == LOOM_OK) st = check_flags(&f, table, &cfg, &err);
  if (st == LOOM_OK)
    st = loom_error_prefix(&err, loom_parallel_check(f.tp, f.pp, 1, world, f.sequence_parallel, cfg.heads, cfg.hidden,
                                                     cfg.ffn, T, &err), "loom train");
  if (st == LOOM_OK) st = check_memory(&cfg, T, f.micro_batch, f.tp, f.sequence_parallel, world, &err);
  if (st != LOOM_OK) return loom_report(st, &err);
  loom_cpu_set_threads(f.threads ? f.threads : loom_launch_default_threads());
  train_run r;
  memset(&r, 0, sizeof r);
  loom_launch_init(&r.launch);
  loom_log_set_quiet(r.launch.rank != 0);
  loom_parallel_init(&r.ps, r.launch.world, f.tp, f.pp, 1, f.sequence_parallel);
  r.pipelined = f.pp > 1 || f.vpp > 1 || strcmp(f.recompute, "none") != 0 || f.trace || f.plan ||
                loom_flags_find(table, TRAIN_FLAG_COUNT, "--schedule")->set;
  r.plan_counts = f.plan ? plan_counts : NULL;
  r.plan_ncounts = plan_ncounts;
  st = setup(&r, &f, &cfg, T, &err);
  if (st == LOOM_OK) st = train_loop(&r, &f, T, &err);
  const int code = loom_report(st, &err);
  loom_trainer_free(&r.trainer);
  for (int c = 0; c < r.nopts; c++) loom_adamw_free(&r.opts[c]);
  free(r.opts);
  if (r.pipelined) loom_pipeline_free(&r.pipe);
  else loom_gpt_free(&r.model);
  loom_dataset_free(r.data);
  loom_metrics_close(&r.metrics);
  loom_parallel_free(&r.ps);
  loom_launch_finish(&r.launch);
  return code;
}
