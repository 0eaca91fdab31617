/* The step loop and what a person watching it sees. */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>
#include "comm/flight_recorder.h"
#include "core/check.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/sysinfo.h"
#include "core/timer.h"
#include "pipeline/trace.h"
#include "pipeline/train_loop.h"
#include "schedule/verify.h"

enum { DEFAULT_LOG_EVERY = 10 };

void loom_train_describe(const loom_trainer *tr) {
  const loom_pipeline *p = tr->pipe;
  const loom_parallel *ps = &tr->ps;
  char dp[32] = "", cp[32] = "";
  if (ps->dp > 1) snprintf(dp, sizeof dp, " x dp %d", ps->dp);
  if (ps->cp > 1) snprintf(cp, sizeof cp, " x cp %d", ps->cp);
  loom_log_info("parallel: %d ranks, tp %d%s%s x pp %d%s | schedule %s, vpp %d, %d micro-batches | bubble in theory %.1f%%",
                ps->world, ps->tp, ps->sequence_parallel ? " (sequence parallel)" : "", cp, ps->pp, dp,
                loom_schedule_kind_name(tr->sheet.schedule.kind), loom_pipeline_chunk_count(p), loom_pipeline_micro_batches(p),
                100.0 * loom_schedule_theory_bubble(loom_pipeline_schedule(p)));
  if (ps->ep > 1) {
    const loom_gpt_config *c = &loom_pipeline_chunk(p, 0)->p.cfg;
    loom_log_info("experts: ep %d x expert-data-parallel %d in each MoE layer, %d of %d experts on each rank; their tokens "
                  "cross the ep group in all-to-alls, their grads the expert-data-parallel group", ps->ep,
                  ps->edp, loom_gpt_local_experts(c), c->moe.experts);
  }
  const loom_plan_overlap overlap = tr->sheet.overlap;
  if (overlap.tp_comm)
    loom_log_info("overlap: --tp-comm-overlap is what `loom sim` costs; this runtime runs each tensor-parallel collective "
                  "between its GEMMs (it does not split them beside the GEMMs yet)");
  if (overlap.param_gather)
    loom_log_info("overlap: --overlap-param-gather is what `loom sim` costs; this runtime gathers the stepped weights "
                  "after the optimizer step, before the next forward");
  if (!overlap.p2p)
    loom_log_info("overlap: --no-overlap-p2p-communication is what `loom sim` costs; this runtime posts each pipeline "
                  "transfer as it makes it and waits for it only where its buffer or its data is needed");
  if (!overlap.grad_reduce && ps->dp * ps->cp > 1)
    loom_log_info("overlap: the data-parallel grads are reduced after backward, all at once (--no-overlap-grad-reduce)");
  if (ps->cp > 1)
    loom_log_info("context: each sequence of %d split over cp %d, %d rows per rank (chunks r and %d - r); keys and values "
                  "%s, grads sum over dp x cp (%d ranks)", tr->T, ps->cp, tr->T / ps->cp, 2 * ps->cp - 1,
                  loom_pipeline_chunk(p, 0)->p.cfg.cp_all_gather ? "all-gathered over the cp group (--cp-comm-type all_gather)"
                                                                 : "pass round the cp ring",
                  ps->dp * ps->cp);
  if (ps->etp > 1)
    loom_log_info("experts: each split over the tp group (etp %d), every rank's rows gathered for them and their outputs "
                  "reduce-scattered back", ps->etp);
  const loom_memory held = loom_trainer_memory(tr);
  const double mib = 1048576.0, kept = held.bytes[LOOM_MEM_ACTIVATIONS] + held.bytes[LOOM_MEM_WEIGHT_GRAD_STATES],
               full = tr->sheet.activations_unrecomputed;
  const loom_gpt *c0 = loom_pipeline_chunk(p, 0);
  char which[64] = "full recompute";
  if (c0->recompute_layers < c0->p.layers)
    snprintf(which, sizeof which, "recompute of %d of %d layers (block)", c0->recompute_layers, c0->p.layers);
  else if (c0->recompute_group > 1)
    snprintf(which, sizeof which, "full recompute in groups of %d layers (uniform)", c0->recompute_group);
  if (c0->recompute_layers)
    loom_log_info("activations on rank 0: %.2f MiB with %s, %.2f MiB without: saves %.2f MiB", kept / mib, which,
                  full / mib, (full - kept) / mib);
  else
    loom_log_info("activations on rank 0: %.2f MiB for %d micro-batches in flight", kept / mib, loom_pipeline_usage_of(p).slots);
  const loom_compression *compression = loom_pipeline_compression(p);
  if (compression) {
    int64_t sent, whole;
    loom_pipeline_dp_words(p, &sent, &whole);
    char method[64];
    loom_compression_describe(compression, method, sizeof method);
    loom_log_info("grad compression on rank 0: %s sends %.3f MiB per step over dp instead of %.3f MiB (%.1fx fewer "
                  "bytes)", method, 4.0 * (double)sent / mib, 4.0 * (double)whole / mib,
                  sent > 0 ? (double)whole / (double)sent : 0.0);
  }
  const loom_memory mem = loom_trainer_memory(tr);
  const double *b = mem.bytes;
  char zero[48] = "without ZeRO";
  if (tr->zero) snprintf(zero, sizeof zero, "with ZeRO-%d over dp%s %d", tr->zero[0].stage, ps->cp > 1 ? " x cp" : "", ps->dp * ps->cp);
  const double unsharded = 4.0 * (double)loom_trainer_local_params(tr);
  loom_log_info("state on rank 0 %s: weights %.2f MiB, grads %.2f MiB, Adam %.2f MiB, in transit %.2f MiB (fp32 "
                "weights whole: %.2f MiB); with activations and buffers %.2f MiB in all (loom plan show lists each kind)",
                zero, (b[LOOM_MEM_WEIGHTS] + b[LOOM_MEM_MASTER]) / mib, b[LOOM_MEM_GRADS] / mib,
                b[LOOM_MEM_OPTIMIZER] / mib, b[LOOM_MEM_ZERO_TRANSIENT] / mib, unsharded / mib, loom_memory_total(&mem) / mib);
}

/* The busiest rank's tensor memory, the backend allocator's counted peak,
 * beside the memory model's estimate of it; and apart from both, the
 * process's resident peak, which holds what tensor memory leaves out. The
 * metrics file gets the same as its last record. */
static void report_memory(const loom_trainer *tr, loom_metrics *metrics) {
  const loom_memory model = loom_trainer_memory(tr);
  enum { F = 4 };
  const double mine[F] = {loom_trainer_tensor_peak(tr), loom_memory_total(&model), (double)loom_peak_rss_bytes(),
                          model.bytes[LOOM_MEM_ACTIVATIONS] + model.bytes[LOOM_MEM_WEIGHT_GRAD_STATES]};
  const int n = tr->ps.world;
  double *all = loom_xmalloc((size_t)n * F * sizeof(double), "memory report");
  loom_comm_allgather_typed(tr->ps.world_group, mine, all, F, LOOM_DTYPE_F64);
  int busiest = 0; /* the rank whose tensor memory peaked highest */
  for (int r = 1; r < n; r++)
    if (all[F * r] > all[F * busiest]) busiest = r;
  const double *b = all + F * busiest, mib = 1048576.0;
  const bool device = tr->mem->device != LOOM_DEVICE_CPU;
  loom_log_info("memory: rank %d's tensor memory peaked at %.2f MiB (the %s allocator's count); loom estimated %.2f MiB, "
                "%+.2f%% off; the process's resident peak %.1f MiB %s", busiest, b[0] / mib, tr->mem->name, b[1] / mib,
                b[0] > 0 ? 100.0 * (b[1] - b[0]) / b[0] : 0.0, b[2] / mib,
                device ? "is outside tensor memory (MPI, BLAS, the program)"
                       : "holds it and what is outside tensor memory (MPI, BLAS, the program)");
  loom_metrics_memory(metrics, busiest, b[1], b[0], b[2], b[3]);
  free(all);
}

static int by_value(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The straggler report's memory: each rank's slowness, smoothed over steps. */
typedef struct {
  double expected;  /* this rank's model FLOPs per step: its stages' share, the LM head included */
  double *slowness; /* [world] compute time per expected FLOP over the median rank's, smoothed */
} straggler_watch;

/* How much each step moves the smoothed slowness: a rank must stay slow for
 * a few steps to be named (1.0 to 2.0 at 1.5x takes 3 steps), while one
 * noisy step on a shared machine is not enough. */
#define SLOWNESS_WEIGHT 0.25
/* Seconds a step must lose to a rank before it is named. */
#define STRAGGLER_MIN_EXCESS_S 1e-3

static void watch_init(straggler_watch *w, const loom_trainer *tr) {
  w->expected = 0.0;
  for (int c = 0; c < loom_pipeline_chunk_count(tr->pipe); c++)
    w->expected += loom_gpt_stage_train_flops(&loom_pipeline_chunk(tr->pipe, c)->p.cfg, &loom_pipeline_chunk(tr->pipe, c)->p.range, tr->T, 1.0, LOOM_FLOPS_MEGATRON);
  w->slowness = loom_xmalloc((size_t)tr->ps.world * sizeof(double), "straggler watch");
  for (int r = 0; r < tr->ps.world; r++) w->slowness[r] = 1.0;
}

/* Straggler report: every rank's compute time this step, gathered and put
 * against its expected cost (the last stage also runs the LM head and the
 * loss, so it is slower by design); a rank whose time per expected FLOP
 * stays above the median rank's by the factor is named in the log and
 * metrics (a GPU throttled by heat slows the whole job). Collective. */
static void report_stragglers(const loom_trainer *tr, const loom_train_loop *loop, straggler_watch *w,
                              const loom_step_stats *s, int step) {
  const int n = tr->ps.world;
  const double mine[3] = {s->compute_s, s->wait_s, s->compute_s / w->expected};
  double *all = loom_xmalloc((size_t)n * 3 * sizeof(double), "straggler"),
         *sorted = loom_xmalloc((size_t)n * sizeof(double), "straggler");
  loom_comm_allgather_typed(tr->ps.world_group, mine, all, 3, LOOM_DTYPE_F64);
  for (int k = 0; k < n; k++) sorted[k] = all[3 * k + 2];
  qsort(sorted, (size_t)n, sizeof(double), by_value);
  const double median_rate = sorted[(n - 1) / 2]; /* the lower median: with two ranks, the faster one */
  int straggler = -1, slowest = 0;
  for (int k = 0; k < n; k++) {
    const double ratio = median_rate > 0.0 ? all[3 * k + 2] / median_rate : 1.0;
    w->slowness[k] += SLOWNESS_WEIGHT * (ratio - w->slowness[k]);
    if (w->slowness[k] > w->slowness[slowest]) slowest = k;
  }
  /* Sub-millisecond gaps are the scheduler's noise, not a slow device. */
  const double excess = all[3 * slowest] * (1.0 - median_rate / all[3 * slowest + 2]);
  if (w->slowness[slowest] > loop->straggler_factor && excess > STRAGGLER_MIN_EXCESS_S) straggler = slowest;
  for (int k = 0; k < n; k++) sorted[k] = all[3 * k];
  qsort(sorted, (size_t)n, sizeof(double), by_value);
  const double median = sorted[(n - 1) / 2];
  double waited = 0.0;
  for (int k = 0; k < n; k++)
    if (k != slowest && all[3 * k + 1] > waited) waited = all[3 * k + 1];
  loom_metrics_num(loop->metrics, "compute_ms_median", 1e3 * median);
  loom_metrics_num(loop->metrics, "compute_ms_max", 1e3 * sorted[n - 1]);
  loom_metrics_num(loop->metrics, "straggler_rank", straggler);
  if (straggler >= 0)
    loom_log_info("step %5d: straggler rank %d: compute %.1f ms, %.1fx the median rank's for its share of the model "
                  "(over the %.1fx limit, smoothed over steps); its peers waited up to %.1f ms", step + 1, straggler,
                  1e3 * all[3 * straggler], w->slowness[straggler], (double)loop->straggler_factor, 1e3 * waited);
  free(all);
  free(sorted);
}

/* Logs a held-out evaluation; adds it to the current metrics line if `record`. */
static loom_status run_eval(loom_trainer *tr, const loom_train_loop *loop, int step, bool record, loom_error *err) {
  loom_eval_stats e;
  const loom_status st = loom_trainer_eval(tr, loop->eval_batches, loop->digits, &e, err);
  if (st != LOOM_OK) return st;
  if (record) loom_metrics_num(loop->metrics, "eval_loss", e.loss);
  if (record && e.mtp_loss > 0.0) loom_metrics_num(loop->metrics, "eval_mtp_loss", e.mtp_loss);
  if (loop->digits > 0 && e.problems > 0) {
    const double acc = (double)e.correct / e.problems;
    loom_log_info("eval  step %5d | held-out loss %.4f | exact match %5.1f%% (%d/%d held-out sums)", step,
                  (double)e.loss, 100.0 * acc, e.correct, e.problems);
    if (record) loom_metrics_num(loop->metrics, "eval_accuracy", acc);
  } else {
    loom_log_info("eval  step %5d | held-out loss %.4f", step, (double)e.loss);
  }
  if (e.mtp_loss > 0.0) loom_log_info("eval  step %5d | held-out mtp loss %.4f", step, e.mtp_loss);
  return LOOM_OK;
}

/* "1h02m", "3m07s", "42s": a duration as a person reads it. */
static void format_duration(double s, char *out, size_t n) {
  const long t = s > 0.0 && s < 1e9 ? (long)(s + 0.5) : 0;
  if (t >= 3600) snprintf(out, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else if (t >= 60) snprintf(out, n, "%ldm%02lds", t / 60, t % 60);
  else snprintf(out, n, "%lds", t);
}

/* One step's numbers as Megatron-LM and torchtitan log them: per device
 * (rank), against the job's dense peak, with rank 0's counted peak of
 * allocated tensor memory and the iterations skipped so far. */
typedef struct {
  double ms, tokens_per_s, tflops_per_device, mfu, max_allocated;
  int skipped_iterations;
  bool moe; /* a Mixture-of-Experts model: its routing is logged too */
} step_numbers;

static step_numbers step_numbers_of(const loom_trainer *tr, const loom_train_loop *loop, double dt, double tokens,
                                    double gflops, int skipped) {
  const double devices = tr->ps.world;
  return (step_numbers){.ms = dt * 1e3, .tokens_per_s = tokens / dt / devices, .tflops_per_device = gflops / devices * 1e-3,
                        .mfu = gflops / loop->peak_gflops, .max_allocated = loom_trainer_tensor_peak(tr),
                        .skipped_iterations = skipped, .moe = tr->moe_load != NULL};
}

/* The step's line: the status line on a terminal, else a plain line every log_every steps. */
static void show_progress(const loom_train_loop *loop, int step, const loom_step_stats *s, const step_numbers *n,
                          double started, int first) {
  const int done = step + 1, every = loop->log_every ? loop->log_every : DEFAULT_LOG_EVERY;
  if (loop->log_every == 0 && loom_log_on_terminal()) {
    const double elapsed = loom_now_s() - started, eta = elapsed / (done - first) * (loop->steps - done);
    char el[48], left[48];
    format_duration(elapsed, el, sizeof el);
    format_duration(eta, left, sizeof left);
    loom_log_status("step %d/%d | loss %.4f | %.0f tok/s/dev | MFU %.1f%% | elapsed %s | ETA %s", done, loop->steps,
                    (double)s->loss, n->tokens_per_s, 100.0 * n->mfu, el, left);
    return;
  }
  if (done % every == 0 || step == first || done == loop->steps)
    loom_log_info("step %5d/%d | loss %.4f | lr %.2e | grad norm %.3f | %7.1f ms/iter | %7.0f tok/s/dev | %6.3f TFLOP/s/dev | "
                  "MFU %4.1f%% | max alloc %.1f MiB | skipped %d",
                  done, loop->steps, (double)s->loss, (double)s->lr, s->grad_norm, n->ms, n->tokens_per_s,
                  n->tflops_per_device, 100.0 * n->mfu, n->max_allocated / 1048576.0, n->skipped_iterations);
  if ((done % every == 0 || step == first || done == loop->steps) && s->mtp_loss > 0.0)
    loom_log_info("step %5d/%d | mtp loss %.4f", done, loop->steps, s->mtp_loss);
  if ((done % every == 0 || step == first || done == loop->steps) && n->moe)
    loom_log_info("step %5d/%d | load_balancing_loss %.4e | z_loss %.4e | expert load max/mean %.2f | dropped %lld", done,
                  loop->steps, s->moe_aux_loss, s->moe_z_loss, s->moe_load_imbalance, (long long)s->moe_dropped);
}

static void record_step(const loom_trainer *tr, const loom_train_loop *loop, straggler_watch *w, int step,
                        const loom_step_stats *s, const step_numbers *n) {
  loom_metrics *mx = loop->metrics;
  loom_metrics_begin(mx, step + 1);
  loom_metrics_num(mx, "loss", s->loss);
  if (loom_pipeline_chunk(tr->pipe, 0)->p.cfg.mtp_layers) loom_metrics_num(mx, "mtp_loss", s->mtp_loss);
  loom_metrics_num(mx, "lr", s->lr);
  loom_metrics_num(mx, "grad_norm", s->grad_norm);
  loom_metrics_num(mx, "ms", n->ms);
  loom_metrics_num(mx, "tokens_per_s", n->tokens_per_s * tr->ps.world);
  loom_metrics_num(mx, "tokens_per_s_per_device", n->tokens_per_s);
  loom_metrics_num(mx, "tflops_per_device", n->tflops_per_device);
  loom_metrics_num(mx, "mfu", n->mfu);
  loom_metrics_num(mx, "max_allocated_bytes", n->max_allocated);
  loom_metrics_num(mx, "batch_size", tr->global_batch);
  loom_metrics_num(mx, "skipped", s->skipped);
  loom_metrics_num(mx, "skipped_iterations", n->skipped_iterations);
  if (n->moe) {
    const loom_gpt_config *c = &loom_pipeline_chunk(tr->pipe, 0)->p.cfg;
    loom_metrics_num(mx, "load_balancing_loss", s->moe_aux_loss);
    loom_metrics_num(mx, "z_loss", s->moe_z_loss);
    loom_metrics_num(mx, "moe_dropped_tokens", (double)s->moe_dropped);
    loom_metrics_num(mx, "moe_load_imbalance", s->moe_load_imbalance);
    loom_metrics_num(mx, "moe_expert_rows_max", (double)s->moe_rows);
    loom_metrics_list(mx, "moe_tokens_per_expert", tr->moe_load, loom_gpt_blocks(c), c->moe.experts);
  }
  if (tr->ps.world > 1) report_stragglers(tr, loop, w, s, step);
  if (loom_pipeline_compression(tr->pipe)) {
    int64_t sent, whole;
    loom_pipeline_dp_words(tr->pipe, &sent, &whole);
    loom_metrics_num(mx, "dp_bytes", 4.0 * (double)sent);
    loom_metrics_num(mx, "dp_bytes_uncompressed", 4.0 * (double)whole);
  } else if (tr->ps.dp * tr->ps.cp > 1 && !tr->zero) {
    loom_metrics_num(mx, "dp_overlap", s->dp_overlap);
    loom_metrics_num(mx, "dp_wait_ms", 1e3 * s->dp_wait_s);
    if (step + 1 == loop->steps)
      loom_log_info("data-parallel grads: %.0f%% of the bytes reduced in buckets during backward; %.2f ms waited after it",
                    100.0 * s->dp_overlap, 1e3 * s->dp_wait_s);
  }
  if (s->skipped)
    loom_log_info("step %5d: the grads hold an inf or NaN (norm %g); every rank skipped this step", step + 1, s->grad_norm);
}

/* Whether any rank was asked to stop; every rank gets the same answer. */
static bool stop_requested(const loom_trainer *tr, const loom_train_loop *loop) {
  int32_t stop = loop->stop && *loop->stop != 0;
  loom_comm_allreduce_typed(tr->ps.world_group, &stop, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  return stop != 0;
}

/* A MoE model's busiest experts over the run against an even share of the
 * rows (n tokens routed k ways: what `loom sim --moe-rank-imbalance` takes
 * as the ratio) and against the rows the memory model gave them
 * (loom_moe_recv_rows: dropless, the worst case). */
static void report_expert_rows(const loom_trainer *tr) {
  const loom_gpt *m = loom_pipeline_chunk(tr->pipe, 0);
  if (!loom_gpt_is_moe(&m->p.cfg) || !tr->moe_load) return;
  const int64_t bound = m->moe.recv_rows, even = (int64_t)m->moe.n * m->p.cfg.moe.topk;
  loom_log_info("experts: the busiest rank's experts took at most %lld rows in one layer's micro-batch, %.2fx an even "
                "share of %lld (loom sim --moe-rank-imbalance) and %.1f%% of the %lld its buffers and the memory model allot "
                "(%s)", (long long)tr->moe_rows_peak, even ? (double)tr->moe_rows_peak / (double)even : 0.0, (long long)even,
                bound ? 100.0 * (double)tr->moe_rows_peak / (double)bound : 0.0, (long long)bound,
                m->p.cfg.moe.capacity_factor > 0.0 ? "as the capacity factor caps them"
                                                   : "dropless: as if every token routed there");
}

static loom_status finish(loom_trainer *tr, const loom_train_loop *loop, loom_error *err) {
  report_memory(tr, loop->metrics);
  report_expert_rows(tr);
  if (!loop->trace) return LOOM_OK;
  loom_trace_summary sum;
  const loom_status st = loom_trace_write(tr->pipe, tr->ps.world_group, loop->trace, &sum, err);
  if (st != LOOM_OK) return st;
  loom_log_info("trace %s: bubble measured %.1f%%, theory %.1f%% (loom trace svg %s -o FILE.svg draws it)", loop->trace,
                100.0 * sum.bubble, 100.0 * loom_schedule_theory_bubble(loom_pipeline_schedule(tr->pipe)), loop->trace);
  const double *u = sum.ring_us, ring = u[LOOM_RING_BLOCK] + u[LOOM_RING_WAIT] + u[LOOM_RING_GRADS] + u[LOOM_RING_GATHER];
  if (ring > 0.0)
    loom_log_info("trace %s: the cp ring, per rank: %.2f ms of attention blocks with the next block in flight, %.2f ms "
                  "waiting for blocks and sums after them, %.2f ms on the grads' last hop home, %.2f ms in all-gathers (%.0f%% "
                  "of its time waiting)", loop->trace, u[LOOM_RING_BLOCK] / 1e3, u[LOOM_RING_WAIT] / 1e3, u[LOOM_RING_GRADS] / 1e3,
                  u[LOOM_RING_GATHER] / 1e3, 100.0 * (ring - u[LOOM_RING_BLOCK]) / ring);
  return LOOM_OK;
}

static loom_status run_loop(loom_trainer *tr, const loom_train_loop *loop, straggler_watch *watch, bool *stopped,
                            loom_error *err) {
  const double tokens = (double)tr->global_batch * tr->T;
  const double flops = loom_gpt_train_flops(&loom_pipeline_chunk(tr->pipe, 0)->p.cfg, tr->T, tokens, LOOM_FLOPS_MEGATRON);
  const int first = loop->first_step;
  *stopped = false;
  loom_status st = loop->eval_every > 0 && first == 0 ? run_eval(tr, loop, 0, false, err) : LOOM_OK;
  const double started = loom_now_s();
  int skipped = 0;
  for (int step = first; step < loop->steps && st == LOOM_OK; step++) {
    if (loom_fault_fires(LOOM_FAULT_STALL, step + 1, NULL))
      for (;;) sleep(1);
    if (loom_fault_fires(LOOM_FAULT_KILL, step + 1, NULL)) raise(SIGKILL);
    loom_flight_set_step(step + 1);
    loom_pipeline_set_tracing(tr->pipe, loop->trace && step + 1 == loop->steps);
    const double t0 = loom_now_s();
    const loom_step_stats s = loom_trainer_step(tr, step);
    const double dt = loom_now_s() - t0, gflops = flops / dt * 1e-9;
    if (!isfinite(s.loss)) {
      loom_log_status_end();
      return loom_fail(err, LOOM_ERR_RUNTIME, "loss became %g at step %d; lower --lr or check the data",
                       (double)s.loss, step + 1);
    }
    skipped += s.skipped;
    const step_numbers n = step_numbers_of(tr, loop, dt, tokens, gflops, skipped);
    show_progress(loop, step, &s, &n, started, first);
    record_step(tr, loop, watch, step, &s, &n);
    if (loop->eval_every > 0 && ((step + 1) % loop->eval_every == 0 || step + 1 == loop->steps))
      st = run_eval(tr, loop, step + 1, true, err);
    loom_metrics_end(loop->metrics);
    *stopped = stop_requested(tr, loop);
    if (loop->goodput) loom_goodput_step(loop->goodput, step + 1, dt);
    const bool due = (loop->save_every && (step + 1) % loop->save_every == 0) || step + 1 == loop->steps;
    const bool persistent = loop->save && (*stopped || due); /* else, when due, one in memory */
    const bool local = !persistent && loop->local_save && (step + 1) % loop->local_every == 0;
    double t1 = loom_now_s();
    if (st == LOOM_OK && persistent) st = loop->save(loop->save_ctx, step + 1, err);
    if (st == LOOM_OK && local) st = loop->local_save(loop->save_ctx, step + 1, err);
    if (loop->goodput && (persistent || local)) loom_goodput_saved(loop->goodput, step + 1, loom_now_s() - t1);
    t1 = loom_now_s();
    if (st == LOOM_OK && loop->settle) st = loop->settle(loop->save_ctx, *stopped || step + 1 == loop->steps, err);
    if (loop->goodput && loop->settle) loom_goodput_stalled(loop->goodput, loom_now_s() - t1);
    if (*stopped) {
      loom_log_status_end();
      if (st == LOOM_OK)
        loom_log_info("stopped by a signal after step %d%s", step + 1,
                      loop->save ? "; resume with --resume" : " (no --ckpt, nothing saved)");
      return st;
    }
  }
  loom_log_status_end();
  return st == LOOM_OK ? finish(tr, loop, err) : st;
}

loom_status loom_train_run(loom_trainer *tr, const loom_train_loop *loop, bool *stopped, loom_error *err) {
  straggler_watch watch;
  watch_init(&watch, tr);
  const loom_status st = run_loop(tr, loop, &watch, stopped, err);
  free(watch.slowness);
  return st;
}

double loom_train_best_step(loom_trainer *tr, int steps) {
  double best = 0.0;
  for (int s = 0; s <= steps; s++) {
    loom_comm_barrier(tr->ps.world_group);
    const double t0 = loom_now_s();
    loom_trainer_step(tr, s);
    double dt = loom_now_s() - t0;
    loom_comm_allreduce_typed(tr->ps.world_group, &dt, 1, LOOM_DTYPE_F64, LOOM_REDUCE_MAX);
    if (s > 0 && (best == 0.0 || dt < best)) best = dt;
  }
  return best;
}
