/* `loom train`: flags become a plan (or --plan is read), the plan is
 * validated once, and the runtime runs it; this file only parses, chooses
 * the backend and data, and wires the run's files to the loop. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_peak.h"
#include "ckpt/run_files.h"
#include "cli/commands.h"
#include "cli/device.h"
#include "cli/launch.h"
#include "cli/train_flags.h"
#include "comm/flight_recorder.h"
#include "comm/mpi/comm_mpi.h"
#include "core/fault.h"
#include "data/addition.h"
#include "core/log.h"
#include "pipeline/preflight.h"
#include "core/sysinfo.h"
#include "core/timer.h"
#include "pipeline/train_loop.h"

/* SIGTERM, SIGINT or SIGHUP (Slurm preemption, Ctrl-C, a closed terminal), or SIGUSR1 (what
 * launch/loom-run turns them into, as mpirun forwards it to every rank
 * where it would end the job on the others): finish the step, checkpoint,
 * exit 0. */
static volatile sig_atomic_t g_stop;
static double g_launched; /* when this attempt's process started (the goodput ledger's clock) */
static void on_signal(int sig) { g_stop = sig; }

static void catch_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL); /* the terminal closed: stop as cleanly as for SIGTERM */
  sigaction(SIGUSR1, &sa, NULL);
}

static loom_status open_data(const loom_train_flags *f, const loom_plan *plan, loom_dataset **data, loom_error *err) {
  if (!f->data) {
    *data = loom_dataset_addition(f->digits, (uint64_t)f->seed);
    return LOOM_OK;
  }
  const bool shuffle = f->data_order ? strcmp(f->data_order, "shuffled") == 0 : loom_data_is_indexed(f->data);
  const loom_data_options o = {.data = f->data, .eval_data = f->eval_data, .split = f->split, .vocab = plan->model->vocab,
                               .T = loom_plan_train_seq(plan), .shuffle = shuffle, .seed = (uint64_t)f->seed, .hold_out = f->eval_every > 0};
  return loom_dataset_open(data, &o, err);
}

/* A run in which no position has a target trains nothing (loss 0, gradient
 * 0, every step): refused before step 1. The first global batch is read (at
 * most a few dozen samples: every window of the synthetic task has the
 * same shape, and data whose first samples are all masked is broken). */
static loom_status check_targets(const loom_train_flags *f, const loom_plan *plan, loom_dataset *data, loom_error *err) {
  const int T = loom_plan_train_seq(plan), samples = plan->batch->global_batch < 64 ? plan->batch->global_batch : 64;
  if (loom_dataset_count_targets(data, LOOM_SPLIT_TRAIN, 0, samples, T) > 0) return LOOM_OK;
  if (!f->data)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: no position has a target, so the run cannot learn: the addition task "
                     "with --digits %d puts its first target (the sum) at position %d, past the sequence of %d; give --seq "
                     "%d or more, or fewer --digits", f->digits, loom_addition_first_target(f->digits), T,
                     loom_addition_first_target(f->digits));
  return loom_fail(err, LOOM_ERR_USAGE, "loom train: no position of the first %d samples of %s has a target (every token "
                   "is masked), so the run cannot learn", samples, f->data);
}

static bool run_in_bf16(const loom_plan *plan) { return plan->precision == LOOM__PRECISION__PRECISION_BF16; }

static void log_run(const loom_trainer *tr, const loom_train_flags *f, const char *device, double peak,
                    const char *peak_what) {
  loom_gpt_config cfg;
  loom_plan_model_config(tr->plan, &cfg);
  char active[64] = "";
  if (loom_gpt_is_moe(&cfg)) snprintf(active, sizeof active, " (%zu active per token)", loom_gpt_active_param_count(&cfg));
  loom_log_info("model: %d layers, hidden %d, heads %d, vocab %d (padded %d), seq %d: %zu parameters%s", cfg.layers,
                cfg.hidden, cfg.heads, cfg.vocab, cfg.padded_vocab, cfg.seq, loom_plan_total_parameters(tr->plan), active);
  char arch[LOOM_ARCHITECTURE_LEN];
  if (*loom_gpt_config_architecture(&cfg, tr->ps.tp, arch, sizeof arch)) loom_log_info("architecture: %s", arch);
  if (tr->ps.world > 1) loom_train_describe(tr);
  loom_log_info("device: %s", device);
  if (cfg.fp8.on) {
    char line[512];
    loom_fp8_describe(&cfg.fp8, cfg.layers, line, sizeof line);
    loom_log_info("%s", line);
  }
  loom_log_info("data: %s | batch %d x %d tokens (micro-batch %d) | %d steps | %d threads x %d ranks",
                f->data ? f->data : "synthetic addition", tr->global_batch, tr->T, tr->micro_batch, f->steps,
                loom_cpu_threads(), tr->ps.world);
  loom_log_info("MFU: the share of the job's dense peak, %.1f TFLOP/s over %d device%s (%s), that the model's FLOPs "
                "(Megatron-LM's count) reach", peak * 1e-3, tr->ps.world, tr->ps.world == 1 ? "" : "s", peak_what);
  if (tr->data->describe) {
    char drawn[4096];
    tr->data->describe(tr->data, (int64_t)f->steps * tr->global_batch, drawn, sizeof drawn);
    loom_log_info("data samples: %s", drawn);
  }
}

/* --preflight: the run's own groups measured before step 1; rank 0 logs the report. */
static loom_status preflight(const loom_trainer *tr, const loom_ops *ops, loom_error *err) {
  loom_preflight_options o = loom_preflight_defaults();
  o.gpu = loom_device_gpu();
  char *report;
  const int found = loom_preflight_run(&tr->ps, ops, &o, &report);
  for (char *line = report, *end; line && *line; line = end ? end + 1 : NULL) {
    end = strchr(line, '\n');
    if (end) *end = '\0';
    loom_log_info("%s", line);
  }
  free(report);
  return found ? loom_fail(err, LOOM_ERR_RUNTIME, "loom train: preflight named %d problem%s above; training did not start",
                           found, found == 1 ? "" : "s")
               : LOOM_OK;
}

/* Builds the run on this rank and trains it; every rank returns the same verdict. */
static loom_status run(const loom_plan *plan, const loom_train_flags *f, const loom_ops *ops, const char *device,
                       loom_comm *world, loom_error *err) {
  loom_dataset *data = NULL;
  loom_metrics metrics = {0};
  loom_trainer tr = {0};
  loom_run_files files = {0};
  loom_status st = loom_fault_fires(LOOM_FAULT_SETUP, 0, NULL)
                       ? loom_fail(err, LOOM_ERR_IO, "injected failure on this rank (LOOM_FAULT setup)")
                       : open_data(f, plan, &data, err);
  if (st == LOOM_OK) st = check_targets(f, plan, data, err);
  const loom_trainer_options o = {
      .seed = (uint64_t)f->seed, .bucket_bytes = (size_t)(f->bucket_mb * 1048576.0), .weight_decay = f->weight_decay,
      .grad_clip = f->grad_clip,
      .lr = loom_train_flags_lr(f)};
  /* Every rank takes its device's peak at once (on the CPU, measured), so
   * the sum is this job's, what MFU is a share of; BLAS is warm before the
   * trainer notes the memory the process starts from. A rank that failed
   * alone skips every collective from here: it exits, and the launcher ends
   * the job with its message. */
  char peak_what[256] = "";
  double peak = st != LOOM_OK ? 0.0 : loom_device_peak_gflops(ops, run_in_bf16(plan), peak_what, sizeof peak_what);
  if (st == LOOM_OK) loom_comm_allreduce_typed(world, &peak, 1, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
  if (st == LOOM_OK) st = loom_trainer_init(&tr, world, plan, ops, data, &o, err);
  if (st == LOOM_OK) loom_run_files_init(&files, &tr, f->ckpt, f->keep, (uint64_t)f->seed, f->data);
  if (st == LOOM_OK && f->ckpt) st = loom_run_check_dir(&files, err);
  files.async_save = f->async_save;
  if (st == LOOM_OK && f->local_every) st = loom_run_local_init(&files, f->local_dir, err);
  if (st == LOOM_OK && f->layout.model.init_from) st = loom_run_init_from(&files, f->layout.model.init_from, err);
  if (st == LOOM_OK) log_run(&tr, f, device, peak, peak_what);
  if (st == LOOM_OK && f->preflight) st = preflight(&tr, ops, err);
  int64_t first = 0;
  const double restore_t0 = loom_now_s();
  if (st == LOOM_OK && f->resume) st = loom_run_resume(&files, &first, err);
  loom_goodput ledger;
  /* A restart by loom-run (LOOM_ATTEMPT 2 and on) continues the ledger even when there was nothing to resume. */
  const char *attempt = getenv("LOOM_ATTEMPT");
  const bool continued = f->resume || (attempt && atoi(attempt) > 1);
  const bool ledgered = st == LOOM_OK && f->ckpt && loom_comm_rank(world) == 0 &&
                        loom_goodput_open(&ledger, f->ckpt, g_launched, continued, first, loom_now_s() - restore_t0, err) == LOOM_OK;
  if (st == LOOM_OK)
    st = loom_metrics_open(&metrics, loom_comm_rank(world) == 0 ? f->metrics : NULL, f->resume ? (long)first : -1, err);
  if (st == LOOM_OK)
    st = loom_metrics_open_tensorboard(&metrics, loom_comm_rank(world) == 0 ? f->tensorboard_dir : NULL,
                                       f->resume ? (long)first : -1, err);
  const loom_train_loop loop = {.first_step = (int)first, .steps = f->steps, .log_every = f->log_every,
                                .eval_every = f->eval_every, .eval_batches = f->eval_batches,
                                .digits = f->data ? 0 : f->digits, .straggler_factor = f->straggler_factor,
                                .trace = f->trace, .metrics = &metrics, .peak_gflops = peak, .stop = &g_stop,
                                .save_every = f->save_every, .save_ctx = &files, .save = f->ckpt ? loom_run_save : NULL,
                                .settle = f->ckpt && (f->async_save || f->local_every) ? loom_run_settle : NULL,
                                .local_every = f->local_every, .local_save = f->local_every ? loom_run_local_save : NULL,
                                .goodput = ledgered ? &ledger : NULL};
  bool stopped = false;
  if (st == LOOM_OK) st = loom_train_run(&tr, &loop, &stopped, err);
  if (st == LOOM_OK && !stopped && f->save) st = loom_run_export(&files, f->steps, f->save, err);
  files.finished = st == LOOM_OK; /* its last step is in --ckpt: the in-memory copies are no longer needed */
  loom_goodput_summary goodput;
  loom_error ignored;
  if (ledgered && st == LOOM_OK && loom_goodput_close(&ledger, &goodput, &ignored) == LOOM_OK) {
    char line[512];
    loom_goodput_describe(&goodput, line, sizeof line);
    loom_log_info("%s", line);
    loom_metrics_goodput(&metrics, &goodput);
  }
  loom_run_files_free(&files);
  loom_trainer_free(&tr);
  loom_metrics_close(&metrics);
  if (st == LOOM_OK) st = loom_metrics_status(&metrics, err);
  loom_dataset_free(data);
  return st;
}

/* --elastic: the plan's dp lowered to the ranks launched, said once. */
static loom_status fit_world(loom_plan *plan, int world, loom_error *err) {
  const int dp = plan->parallel->dp, micro = loom_plan_micro_batches(plan);
  const loom_status st = loom_plan_fit_world(plan, world, err);
  if (st != LOOM_OK) return loom_error_prefix(err, st, "loom train: --elastic");
  if (plan->parallel->dp != dp && world > 0 && loom_launch_env_rank() == 0)
    loom_log_info("elastic: %d ranks for a plan of %d: dp %d -> %d, global batch %d kept (micro-batches per replica %d -> %d)",
                  world, world / plan->parallel->dp * dp, dp, plan->parallel->dp, plan->batch->global_batch, micro,
                  loom_plan_micro_batches(plan));
  return LOOM_OK;
}

int loom_cmd_train(int argc, char **argv) {
  g_launched = loom_goodput_clock();
  loom_train_flags f = loom_train_flags_defaults();
  loom_flag table[LOOM_TRAIN_FLAG_COUNT];
  loom_train_flags_table(&f, table);
  loom_error err = {0};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse("loom train", "loom train [flags]", table, LOOM_TRAIN_FLAG_COUNT, argc, argv, pos, 0, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  loom_plan *plan = NULL;
  st = loom_train_plan(&f, table, &plan, &err);
  if (st == LOOM_OK && f.print_plan) {
    loom_plan_estimate(plan); /* a plan file's stored estimates may come from an older loom */
    st = loom_plan_write("-", plan, &err);
  }
  if (st == LOOM_OK && !f.print_plan && f.elastic) st = fit_world(plan, loom_launch_env_size(), &err);
  if (st == LOOM_OK && !f.print_plan) {
    const int world = loom_launch_env_size();
    /* The one validation; the host's memory is shared by every rank launched here. */
    const loom_plan_limits limits = {.world = world, .host_memory = (int64_t)loom_mem_available_bytes(), .host_ranks = world};
    st = loom_plan_flags_refuse("loom train", plan, &limits, table, f.plan, &err);
  }
  if (st == LOOM_OK && !f.print_plan) st = loom_train_flags_check(&f, table, plan, &err);
  /* Rank 0 writes every output but the checkpoint shards (whose directory each rank probes below). */
  if (st == LOOM_OK && !f.print_plan && loom_launch_env_rank() == 0) st = loom_train_flags_check_outputs(&f, plan, &err);
  const loom_ops *ops = NULL;
  char device[160];
  if (st == LOOM_OK && !f.print_plan) st = loom_device_setup("loom train", f.device, &ops, device, sizeof device, &err);
  if (st == LOOM_OK && !f.print_plan) st = loom_device_match_plan("loom train", ops, plan, &err);
  if (st != LOOM_OK || f.print_plan) {
    loom_plan_free(plan);
    return loom_report(st, &err);
  }
  loom_cpu_set_threads(f.threads ? f.threads : loom_launch_default_threads());
  catch_signals();
  loom_comm_mpi_set_watchdog(f.watchdog_timeout);
  loom_flight_configure(f.flight_entries, f.flight_dir ? f.flight_dir : f.ckpt);
  loom_launch launch;
  st = loom_launch_init(&launch, &err);
  loom_log_set_quiet(launch.rank != 0);
  if (st == LOOM_OK) {
    char collectives[128], described[320];
    loom_comm *world = loom_device_world(launch.world, ops, collectives, sizeof collectives);
    snprintf(described, sizeof described, "%s; collectives: %s", device, collectives);
    st = run(plan, &f, ops, described, world, &err);
    loom_device_world_free(world, launch.world);
  }
  const int code = loom_report(st, &err);
  loom_launch_finish(&launch);
  loom_plan_free(plan);
  return code;
}
