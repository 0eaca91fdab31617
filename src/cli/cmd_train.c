/* `loom train`: builds the model, data and optimizer from flags, then runs
 * the training loop with per-step logs, held-out evals and metrics. */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backend/cpu/cpu_peak.h"
#include "ckpt/checkpoint.h"
#include "ckpt/llmc_model.h"
#include "cli/commands.h"
#include "cli/device.h"
#include "cli/launch.h"
#include "cli/metrics.h"
#include "cli/train_flags.h"
#include "pipeline/trainer.h"
#include "comm/mpi/comm_mpi.h"
#include "core/check.h"
#include "core/log.h"
#include "core/sysinfo.h"
#include "core/timer.h"
#include "data/addition.h"
#include "pipeline/trace.h"
#include "schedule/verify.h"
#include "tensor_parallel/parallel_state.h"

typedef struct {
  const loom_plan *plan; /* what runs: every layout fact comes from it */
  loom_gpt_config cfg;   /* the plan's model (tp 1 vocab padding) */
  int T, B, global_batch;
  loom_launch launch;
  loom_parallel ps;
  loom_pipeline pipe;   /* every layout, (1,1,1) included, runs the executor */
  loom_adamw *opts;     /* one per chunk */
  loom_zero1 *zero;     /* one per chunk under ZeRO-1, else NULL */
  int nopts;
  loom_dataset *data;
  loom_trainer trainer;
  loom_metrics metrics;
  double peak; /* the job's sgemm GFLOP/s */
  const loom_ops *ops; /* the --device backend */
  char device[160];
} train_run;

/* This rank's model parts: the chunks of its pipeline stage, or the one model. */
static int parts(train_run *r, loom_gpt **out) {
  *out = r->pipe.chunks;
  return r->pipe.v;
}

/* Loads an llm.c file into this rank's shards (every rank reads the file). */
static loom_status load_shards(loom_gpt *m, const char *path, loom_error *err) {
  loom_gpt_params full;
  loom_status st = loom_gpt_params_init_weights(&full, &m->p.cfg, 0, 1, NULL);
  if (st != LOOM_OK) return loom_fail(err, st, "%s: out of memory reading the model", path);
  full.cfg.padded_vocab = m->p.cfg.padded_vocab;
  loom_gpt_config file_cfg;
  st = loom_llmc_read_config(path, &file_cfg, err);
  if (st == LOOM_OK && file_cfg.padded_vocab != full.cfg.padded_vocab) {
    /* The file's vocab padding differs from this split's: read it at its own. */
    loom_gpt_params_free(&full);
    file_cfg.dropout = m->p.cfg.dropout;
    st = loom_gpt_params_init_weights(&full, &file_cfg, 0, 1, NULL);
  }
  if (st == LOOM_OK) st = loom_llmc_load(path, &full, err);
  if (st == LOOM_OK) loom_gpt_params_copy_shards(&m->p, &full, 1);
  loom_gpt_params_free(&full);
  return st;
}

/* Gathers every rank's shards and writes the whole model from rank 0. */
static loom_status save_model(train_run *r, const loom_gpt_config *cfg, const char *path, loom_error *err) {
  loom_gpt_params full;
  loom_status st = loom_gpt_params_init_weights(&full, cfg, 0, 1, NULL);
  if (st != LOOM_OK) return loom_fail(err, st, "%s: out of memory assembling the model", path);
  loom_gpt *chunks;
  const int n = parts(r, &chunks);
  for (int c = 0; c < n; c++) {
    loom_gpt_params_gather(&chunks[c].p, &full, chunks[c].tp.group);
    /* Both ends hold the tied wte; the last stage's copy stays out of the sum below. */
    if (loom_stage_holds_tied_copy(&chunks[c].p.range)) memset(full.w.wte, 0, loom_tensor_bytes(&full.params.views[0]));
  }
  /* Each tensor lives on one pipeline stage and is zero elsewhere: summing assembles the model. */
  loom_comm_allreduce(r->ps.pp_group, full.params.base, full.params.numel, LOOM_REDUCE_SUM);
  if (r->launch.rank == 0) st = loom_llmc_save(path, &full, err);
  loom_gpt_params_free(&full);
  if (st == LOOM_OK) loom_log_info("saved %s (llm.c format)", path);
  return st;
}

static loom_status build_pipeline(train_run *r, const loom_train_flags *f, loom_error *err) {
  const loom_status st = loom_pipeline_init(&r->pipe, &r->ps, r->plan, r->ops, (uint64_t)f->seed,
                                            (size_t)(f->bucket_mb * 1048576.0), err);
  return loom_error_prefix(err, st, "loom train");
}

static loom_status setup(train_run *r, const loom_train_flags *f, loom_error *err) {
  loom_status st;
  const loom_gpt_config *cfg = &r->cfg;
  const int T = r->T;
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
  st = build_pipeline(r, f, err);
  loom_gpt *chunks;
  const int n = parts(r, &chunks);
  for (int c = 0; c < n && st == LOOM_OK && f->layout.model.init_from; c++)
    st = load_shards(&chunks[c], f->layout.model.init_from, err);
  loom_adamw_config oc = loom_adamw_defaults();
  oc.weight_decay = f->weight_decay;
  oc.grad_clip = f->grad_clip;
  r->opts = loom_xcalloc((size_t)n, sizeof *r->opts, "optimizers");
  r->nopts = n;
  if (r->plan->parallel->zero_stage == 1) r->zero = loom_xcalloc((size_t)n, sizeof *r->zero, "ZeRO-1 optimizers");
  for (int c = 0; c < n && st == LOOM_OK; c++)
    st = r->zero ? loom_zero1_init(&r->zero[c], &chunks[c].p, r->ps.dp_rank, r->ps.dp, &oc)
                 : loom_adamw_init(&r->opts[c], &chunks[c].p, &oc);
  if (st == LOOM_ERR_NOMEM) return loom_fail(err, st, "loom train: out of memory building the model and optimizer");
  if (st != LOOM_OK) return st;
  const loom_lr_schedule lr = {.max_lr = f->lr, .min_lr = f->lr * f->min_lr_frac,
                               .warmup_steps = f->warmup, .total_steps = f->steps};
  loom_trainer_init_pipeline(&r->trainer, &r->pipe, r->opts, r->data, T, r->B, lr);
  r->trainer.zero = r->zero;
  return LOOM_OK;
}

/* Logs a held-out evaluation; adds it to the current metrics line if `record`. */
static void run_eval(train_run *r, const loom_train_flags *f, int step, bool record) {
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
static void log_pipeline(train_run *r) {
  const loom_pipeline *p = &r->pipe;
  char dp[32] = "";
  if (r->ps.dp > 1) snprintf(dp, sizeof dp, " x dp %d", r->ps.dp);
  loom_log_info("parallel: %d ranks, tp %d%s x pp %d%s | schedule %s, vpp %d, %d micro-batches | bubble in theory %.1f%%",
                r->ps.world, r->ps.tp, r->ps.sequence_parallel ? " (sequence parallel)" : "", r->ps.pp, dp, loom_schedule_kind_name(r->plan->schedule),
                p->v, p->m, 100.0 * loom_schedule_theory_bubble(&p->sched));
  const double mib = 1048576.0, kept = (double)p->act_bytes, full = (double)p->act_bytes_without_recompute;
  if (p->chunks[0].recompute)
    loom_log_info("activations on rank 0: %.2f MiB with full recompute, %.2f MiB without: saves %.2f MiB", kept / mib,
                  full / mib, (full - kept) / mib);
  else
    loom_log_info("activations on rank 0: %.2f MiB for %d micro-batches in flight", kept / mib, p->nslots);
  double state = 0.0, unsharded = 0.0;
  for (int c = 0; c < p->v; c++) {
    unsharded += 2.0 * sizeof(float) * (double)p->chunks[c].p.params.numel;
    state += r->zero ? (double)loom_zero1_state_bytes(&r->zero[c]) : 2.0 * sizeof(float) * (double)p->chunks[c].p.params.numel;
  }
  if (r->zero)
    loom_log_info("Adam state on rank 0: %.2f MiB with ZeRO-1 over dp %d, %.2f MiB without (%.3f of it)", state / mib,
                  r->ps.dp, unsharded / mib, state / unsharded);
}

/* Measured peak memory of the busiest rank against loom's own estimate of it:
 * fp32 weights and grads (8 bytes per local parameter), Adam moments (8 more,
 * or this replica's ZeRO-1 slice), plus the activation and scratch buffers
 * this layout allocates. */
static void report_memory(train_run *r) {
  loom_gpt *chunks;
  const int n = parts(r, &chunks);
  double state = 0.0, acts = (double)r->pipe.act_bytes;
  for (int c = 0; c < n; c++) {
    const double params = (double)chunks[c].p.params.numel; /* weights and grads, then Adam m and v */
    state += 8.0 * params + (r->zero ? (double)loom_zero1_state_bytes(&r->zero[c]) : 8.0 * params);
  }
  double numbers[2] = {(double)loom_peak_rss_bytes(), state + acts};
  loom_comm_allreduce_typed(r->launch.world, numbers, 2, LOOM_DTYPE_F64, LOOM_REDUCE_MAX);
  const double mib = 1048576.0;
  loom_log_info("memory: peak %.1f MiB on the busiest rank; estimated %.1f MiB (16 B per parameter, less under ZeRO-1, + activations), "
                "%+.1f%% off", numbers[0] / mib, numbers[1] / mib, 100.0 * (numbers[1] - numbers[0]) / numbers[0]);
}

/* SIGTERM or SIGINT (Slurm preemption, Ctrl-C): finish the step, checkpoint, exit 0. */
static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { g_stop = sig; }

static void catch_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
}

/* Whether any rank was asked to stop; every rank gets the same answer. */
static bool stop_requested(train_run *r) {
  int32_t stop = g_stop != 0;
  loom_comm_allreduce_typed(r->launch.world, &stop, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  return stop != 0;
}

static int by_value(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* Straggler report: every rank's compute time this step, gathered; a rank
 * slower than the median by the factor is named in the log and metrics (a
 * GPU throttled by heat slows the whole job). Collective over the world. */
static void report_stragglers(train_run *r, const loom_train_flags *f, const loom_step_stats *s, int step) {
  const int n = r->launch.size;
  float mine[2] = {(float)s->compute_s, (float)s->wait_s}, *all = loom_xmalloc((size_t)n * 2 * sizeof(float), "straggler"),
        *sorted = loom_xmalloc((size_t)n * sizeof(float), "straggler");
  loom_comm_allgather(r->launch.world, mine, all, 2);
  int slowest = 0;
  for (int k = 0; k < n; k++) {
    sorted[k] = all[2 * k];
    if (all[2 * k] > all[2 * slowest]) slowest = k;
  }
  qsort(sorted, (size_t)n, sizeof(float), by_value);
  const float median = sorted[(n - 1) / 2]; /* the lower median: with two ranks, the faster one */
  const int straggler = median > 0.0f && all[2 * slowest] > f->straggler_factor * median ? slowest : -1;
  float waited = 0.0f;
  for (int k = 0; k < n; k++)
    if (k != slowest && all[2 * k + 1] > waited) waited = all[2 * k + 1];
  loom_metrics_num(&r->metrics, "compute_ms_median", 1e3 * median);
  loom_metrics_num(&r->metrics, "compute_ms_max", 1e3 * all[2 * slowest]);
  loom_metrics_num(&r->metrics, "straggler_rank", straggler);
  if (straggler >= 0)
    loom_log_info("step %5d: straggler rank %d: compute %.1f ms vs median %.1f ms (x%.1f, over the %.1fx limit); "
                  "its peers waited up to %.1f ms", step + 1, straggler, 1e3 * all[2 * slowest], 1e3 * median,
                  all[2 * slowest] / median, (double)f->straggler_factor, 1e3 * waited);
  free(all);
  free(sorted);
}

/* Saves a checkpoint and logs its size and write throughput. */
static loom_status save_checkpoint(train_run *r, const loom_train_flags *f, int64_t step, const loom_ckpt_chunk *chunks,
                                   int n, const loom_ckpt_run *ck, loom_error *err) {
  const double t0 = loom_now_s();
  int64_t bytes = 0;
  loom_status st = loom_ckpt_save(f->ckpt, step, f->keep, chunks, n, &r->ps, ck, &bytes, err);
  const double gb = (double)bytes / 1e9;
  if (st == LOOM_OK)
    loom_log_info("checkpoint %s/step_%08lld: %.3f GB in %.2f s (%.2f GB/s): every rank's shard, then the manifest, then latest",
                  f->ckpt, (long long)step, gb, loom_now_s() - t0, gb / (loom_now_s() - t0));
  return st;
}

/* Loads --ckpt/latest into this rank, from whatever plan wrote it. */
static loom_status resume(train_run *r, const loom_train_flags *f, const loom_ckpt_chunk *chunks, int n,
                          const loom_ckpt_run *ck, int64_t *first, loom_error *err) {
  const double t0 = loom_now_s();
  loom_ckpt_run from;
  loom_status st = loom_ckpt_resume(f->ckpt, chunks, n, ck, &from, first, err);
  int32_t bad = st != LOOM_OK;
  loom_comm_allreduce_typed(r->launch.world, &bad, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  if (st != LOOM_OK) return st;
  if (bad) return loom_fail(err, LOOM_ERR_IO, "loom train: another rank could not load the checkpoint");
  const double dt = loom_now_s() - t0;
  double gb = (double)loom_ckpt_load_bytes(chunks, n) / 1e9;
  loom_comm_allreduce_typed(r->launch.world, &gb, 1, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
  if (from.tp != ck->tp || from.pp != ck->pp || from.dp != ck->dp || from.vpp != ck->vpp || from.zero != ck->zero)
    loom_log_info("resharding: the checkpoint was written by tp %d x pp %d x dp %d (vpp %d, zero %d); loaded by global offsets",
                  from.tp, from.pp, from.dp, from.vpp, from.zero);
  loom_log_info("resumed from %s/latest at step %lld: %.3f GB into all ranks in %.2f s (%.2f GB/s)", f->ckpt,
                (long long)*first, (double)gb, dt, (double)gb / dt);
  return LOOM_OK;
}

static loom_status run_steps(train_run *r, const loom_train_flags *f, int T, int first, const loom_ckpt_chunk *ck_chunks,
                             int nparts, const loom_ckpt_run *ck, loom_error *err);

static loom_status train_loop(train_run *r, const loom_train_flags *f, int T, loom_error *err) {
  const loom_gpt_config *cfg = &r->cfg;
  /* Every rank measures at once, so the sum is this job's sgemm peak. */
  double peak_sum = loom_cpu_sgemm_gflops(1024, 0.3);
  loom_comm_allreduce_typed(r->launch.world, &peak_sum, 1, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
  r->peak = peak_sum;
  loom_log_info("model: %d layers, hidden %d, heads %d, vocab %d (padded %d), seq %d: %zu parameters",
                cfg->layers, cfg->hidden, cfg->heads, cfg->vocab, cfg->padded_vocab, cfg->seq,
                loom_gpt_param_count(&r->cfg, NULL, 1));
  if (r->ps.world > 1) log_pipeline(r);
  loom_log_info("device: %s", r->device);
  loom_log_info("data: %s | batch %d x %d tokens (micro-batch %d) | %d steps | %d threads x %d ranks | sgemm peak %.1f GFLOP/s",
                f->data ? f->data : "synthetic addition", r->global_batch, T, r->B, f->steps,
                loom_cpu_threads(), r->launch.size, r->peak);
  loom_gpt *chunks;
  const int nparts = parts(r, &chunks);
  loom_ckpt_chunk *ck_chunks = loom_xcalloc((size_t)nparts, sizeof *ck_chunks, "checkpoint chunks");
  for (int c = 0; c < nparts; c++)
    ck_chunks[c] = r->zero ? loom_ckpt_chunk_zero1(&chunks[c].p, &r->zero[c]) : loom_ckpt_chunk_adamw(&chunks[c].p, &r->opts[c]);
  const loom_ckpt_run ck = {.cfg = r->cfg, .tp = r->ps.tp, .pp = r->ps.pp, .dp = r->ps.dp, .vpp = r->pipe.v,
                            .zero = r->plan->parallel->zero_stage, .micro_batch = r->B, .global_batch = r->global_batch,
                            .seed = (uint64_t)f->seed, .lr = r->trainer.lr, .data = f->data};
  int64_t first = 0;
  loom_status st = f->resume ? resume(r, f, ck_chunks, nparts, &ck, &first, err) : LOOM_OK;
  if (st == LOOM_OK) st = run_steps(r, f, T, (int)first, ck_chunks, nparts, &ck, err);
  free(ck_chunks);
  return st;
}

/* Steps [first, --steps), with logs, evals, checkpoints and a stop on a signal. */
static loom_status run_steps(train_run *r, const loom_train_flags *f, int T, int first, const loom_ckpt_chunk *ck_chunks,
                             int nparts, const loom_ckpt_run *ck, loom_error *err) {
  const double tokens = (double)r->global_batch * T, flops = loom_gpt_train_flops(&r->cfg, T, tokens), peak = r->peak;
  if (f->eval_every > 0 && first == 0) run_eval(r, f, 0, false);
  /* Test-only: one rank hangs outside communication, as a stuck kernel would. */
  const char *stall_rank = getenv("LOOM_TEST_STALL_RANK"), *stall_step = getenv("LOOM_TEST_STALL_STEP");
  for (int step = first; step < f->steps; step++) {
    if (stall_rank && atoi(stall_rank) == r->launch.rank && stall_step && atoi(stall_step) == step + 1)
      for (;;) sleep(1);
    r->pipe.tracing = f->trace && step + 1 == f->steps;
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
    loom_metrics_num(&r->metrics, "skipped", s.skipped);
    if (r->launch.size > 1) report_stragglers(r, f, &s, step);
    if (r->ps.dp > 1 && !r->zero) {
      loom_metrics_num(&r->metrics, "dp_overlap", s.dp_overlap);
      loom_metrics_num(&r->metrics, "dp_wait_ms", 1e3 * s.dp_wait_s);
      if (step + 1 == f->steps)
        loom_log_info("data-parallel grads: %.0f%% of the bytes reduced in buckets during backward; %.2f ms waited after it",
                      100.0 * s.dp_overlap, 1e3 * s.dp_wait_s);
    }
    if (s.skipped)
      loom_log_info("step %5d: the grads hold an inf or NaN (norm %g); every rank skipped this step", step + 1, s.grad_norm);
    if (f->eval_every > 0 && ((step + 1) % f->eval_every == 0 || step + 1 == f->steps)) run_eval(r, f, step + 1, true);
    loom_metrics_end(&r->metrics);
    const bool stopping = stop_requested(r);
    if (f->ckpt && (stopping || (f->save_every && (step + 1) % f->save_every == 0) || step + 1 == f->steps)) {
      loom_status st = save_checkpoint(r, f, step + 1, ck_chunks, nparts, ck, err);
      if (st != LOOM_OK) return st;
    }
    if (stopping) {
      loom_log_info("stopped by a signal after step %d%s", step + 1,
                    f->ckpt ? "; resume with --resume" : " (no --ckpt, nothing saved)");
      return LOOM_OK;
    }
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
  loom_train_flags f = loom_train_flags_defaults();
  loom_flag table[LOOM_TRAIN_FLAG_COUNT];
  loom_train_flags_table(&f, table);
  loom_error err = {{0}};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse("loom train", "loom train [flags]", table, LOOM_TRAIN_FLAG_COUNT, argc, argv, pos, 0, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  loom_plan *plan = NULL;
  st = loom_train_plan(&f, table, &plan, &err);
  if (st == LOOM_OK && f.print_plan) st = loom_plan_write("-", plan, &err);
  if (st != LOOM_OK || f.print_plan) {
    loom_plan_free(plan);
    return loom_report(st, &err);
  }
  const int world = loom_launch_env_size();
  /* The one validation; the host's memory is shared by every rank launched here. */
  const loom_plan_limits limits = {.world = world, .host_memory = (int64_t)loom_mem_available_bytes(), .host_ranks = world};
  st = loom_plan_flags_refuse("loom train", plan, &limits, table, f.plan, &err);
  if (st == LOOM_OK) st = loom_train_flags_check(&f, table, plan, &err);
  if (st != LOOM_OK) {
    loom_plan_free(plan);
    return loom_report(st, &err);
  }
  loom_cpu_set_threads(f.threads ? f.threads : loom_launch_default_threads());
  catch_signals();
  loom_comm_mpi_set_watchdog(f.watchdog_timeout);
  train_run r;
  memset(&r, 0, sizeof r);
  r.plan = plan;
  loom_plan_model_config(plan, &r.cfg);
  r.T = loom_plan_train_seq(plan);
  r.B = plan->batch->micro_batch;
  r.global_batch = plan->batch->global_batch;
  st = loom_device_setup("loom train", f.device, &r.ops, r.device, sizeof r.device, &err);
  if (st != LOOM_OK) {
    loom_plan_free(plan);
    return loom_report(st, &err);
  }
  loom_launch_init(&r.launch);
  loom_log_set_quiet(r.launch.rank != 0);
  loom_parallel_init(&r.ps, r.launch.world, plan->parallel->tp, plan->parallel->pp, plan->parallel->dp,
                     plan->parallel->sequence_parallel);
  st = setup(&r, &f, &err);
  if (st == LOOM_OK) st = train_loop(&r, &f, r.T, &err);
  const int code = loom_report(st, &err);
  loom_trainer_free(&r.trainer);
  for (int c = 0; c < r.nopts; c++) {
    loom_adamw_free(&r.opts[c]);
    if (r.zero) loom_zero1_free(&r.zero[c]);
  }
  free(r.opts);
  free(r.zero);
  loom_pipeline_free(&r.pipe);
  loom_dataset_free(r.data);
  loom_metrics_close(&r.metrics);
  loom_parallel_free(&r.ps);
  loom_launch_finish(&r.launch);
  loom_plan_free(plan);
  return code;
}
