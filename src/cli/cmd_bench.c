/* `loom bench step`: training-step speed of the GPT-2-small shape (or another
 * preset), reported as model GFLOP/s and as a fraction of this machine's
 * sgemm peak measured in the same run (absolute times on a shared machine are
 * noise; ratios are not). With --device cuda: TFLOP/s and MFU against the
 * device's bf16 peak and against cuBLAS's bf16 GEMM measured in the run. */
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_peak.h"
#include "cli/commands.h"
#include "cli/device.h"
#include "cli/flags.h"
#include "cli/launch.h"
#include "pipeline/trainer.h"
#include "tensor_parallel/parallel_state.h"
#include "core/check.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/timer.h"
#ifdef LOOM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

typedef struct {
  int micro_batch, steps, layers, threads, seq, tp;
  const char *model, *device;
  const loom_ops *ops; /* the --device backend */
} bench_flags;

/* Uniform random tokens: the step's cost does not depend on the data. */
static void random_window(loom_dataset *ds, loom_split split, int64_t g, int T, int *window, unsigned char *scored) {
  (void)ds;
  for (int t = 0; t <= T; t++) {
    window[t] = (int)(loom_rng_u32(7, (uint64_t)split, (uint64_t)g * (uint64_t)(T + 1) + (uint64_t)t) % 50257u);
    scored[t] = 1;
  }
}
static void no_free(loom_dataset *ds) { (void)ds; }

/* Times `steps` training steps at seq T after one warm-up; returns best seconds
 * (the slowest rank's, under TP). */
static double time_steps(const loom_gpt_config *cfg, int T, const bench_flags *f, const loom_tp *tp, loom_status *st) {
  loom_gpt model;
  loom_adamw opt;
  loom_dataset data = {.name = "random", .window = random_window, .free = no_free};
  loom_gpt_config c = *cfg;
  c.seq = T;
  double best = 0.0;
  *st = loom_gpt_init(&model, &c, f->ops, 1, tp);
  if (*st == LOOM_OK) *st = loom_gpt_set_batch_shape(&model, T, f->micro_batch);
  const loom_adamw_config oc = loom_adamw_defaults();
  if (*st == LOOM_OK) *st = loom_adamw_init(&opt, &model.p, &oc);
  if (*st == LOOM_OK) {
    loom_trainer tr;
    const loom_lr_schedule lr = {.max_lr = 6e-4f, .min_lr = 6e-5f, .warmup_steps = 0, .total_steps = f->steps + 1};
    loom_trainer_init(&tr, &model, &opt, &data, T, f->micro_batch, f->micro_batch, lr);
    for (int s = 0; s <= f->steps; s++) {
      loom_comm_barrier(tp ? tp->group : NULL);
      const double t0 = loom_now_s();
      loom_trainer_step(&tr, s);
      float dt_f = (float)(loom_now_s() - t0);
      loom_comm_allreduce(tp ? tp->group : NULL, &dt_f, 1, LOOM_REDUCE_MAX);
      const double dt = dt_f;
      if (s > 0 && (best == 0.0 || dt < best)) best = dt; /* step 0 warms caches and pages */
    }
    loom_trainer_free(&tr);
    loom_adamw_free(&opt);
  }
  loom_gpt_free(&model);
  return best;
}

static void print_step(const char *label, const loom_gpt_config *cfg, int T, int B, double dt, double peak) {
  const double tokens = (double)B * T, gflops = loom_gpt_train_flops(cfg, T, tokens) / dt * 1e-9;
  printf("seq %4d%s: step %8.1f ms | %8.0f tok/s | model %6.1f GFLOP/s | %5.1f%% of sgemm peak\n", T, label,
         dt * 1e3, tokens / dt, gflops, 100.0 * gflops / peak);
}

/* Single-rank bench: each sequence length against the sgemm peak. */
static loom_status bench_serial(const loom_gpt_config *cfg, const bench_flags *f, loom_error *err) {
  const double peak_before = loom_cpu_sgemm_gflops(2048, 1.0);
  printf("sgemm peak (2048^3, best of >= 1 s): %.1f GFLOP/s\n", peak_before);
  const int seqs[] = {64, 256};
  double frac[2] = {0.0, 0.0};
  for (int i = 0; i < 2; i++) {
    if (f->seq && f->seq != seqs[i]) continue;
    loom_status st;
    const double dt = time_steps(cfg, seqs[i], f, NULL, &st);
    if (st != LOOM_OK) return loom_fail(err, st, "loom bench step: out of memory at seq %d", seqs[i]);
    print_step("", cfg, seqs[i], f->micro_batch, dt, peak_before);
    frac[i] = loom_gpt_train_flops(cfg, seqs[i], (double)f->micro_batch * seqs[i]) / dt * 1e-9 / peak_before;
  }
  const double peak_after = loom_cpu_sgemm_gflops(2048, 1.0);
  printf("sgemm peak re-measured after: %.1f GFLOP/s (drift %+.1f%%)\n", peak_after,
         100.0 * (peak_after - peak_before) / peak_before);
  printf("RESULT seq64_peak_frac=%.3f seq256_peak_frac=%.3f\n", frac[0], frac[1]);
  return LOOM_OK;
}

#ifdef LOOM_HAVE_CUDA
/* GPU bench: each sequence length's model TFLOP/s against the device's dense
 * bf16 peak (stated) and against cuBLAS's bf16 GEMM measured in this run. */
static loom_status bench_cuda(const loom_gpt_config *cfg, const bench_flags *f, loom_error *err) {
  const double peak = loom_cuda_bf16_peak_tflops(), gemm = loom_cuda_bf16_gemm_tflops(8192, 8192, 8192, 5);
  printf("device: %s | dense bf16 peak used: %.0f TFLOP/s%s | cuBLAS bf16 GEMM 8192^3 measured: %.1f TFLOP/s\n",
         loom_cuda_device_name(), peak, peak > 0 ? " (NVIDIA's datasheet)" : " (unknown to loom)", gemm);
  printf("precision: fp32 ops, managed memory, each op synchronised (the correctness path; bf16 is not wired yet)\n");
  const int seqs[] = {64, 256, 1024};
  for (int i = 0; i < 3; i++) {
    if (f->seq && f->seq != seqs[i]) continue;
    loom_status st;
    const double dt = time_steps(cfg, seqs[i], f, NULL, &st);
    if (st != LOOM_OK) return loom_fail(err, st, "loom bench step: out of memory at seq %d", seqs[i]);
    const double tflops = loom_gpt_train_flops(cfg, seqs[i], (double)f->micro_batch * seqs[i]) / dt * 1e-12;
    printf("seq %4d: step %8.1f ms | model %7.1f TFLOP/s | MFU %5.1f%% of bf16 peak | %5.1f%% of measured bf16 GEMM\n",
           seqs[i], dt * 1e3, tflops, peak > 0 ? 100.0 * tflops / peak : 0.0, 100.0 * tflops / gemm);
  }
  return LOOM_OK;
}
#endif

/* TP bench under mpirun: the same step on rank 0 alone with every core as
 * BLAS threads, then split tp ways with one thread per rank. Ranks not in a
 * phase sleep, so each phase has the whole machine. */
static loom_status bench_tp(const loom_gpt_config *cfg, const bench_flags *f, loom_launch *launch, loom_error *err) {
  loom_parallel ps;
  loom_parallel_init(&ps, launch->world, f->tp, 1, 1, false);
  const loom_tp tp = loom_tp_of(&ps);
  const int T = f->seq ? f->seq : 256;
  double serial = 0.0, peak = 0.0;
  loom_status st = LOOM_OK;
  if (launch->rank == 0) {
    loom_cpu_set_threads(launch->size);
    peak = loom_cpu_sgemm_gflops(2048, 1.0);
    printf("sgemm peak, 1 rank x %d threads (2048^3): %.1f GFLOP/s\n", launch->size, peak);
    serial = time_steps(cfg, T, f, NULL, &st);
    if (st == LOOM_OK) print_step(" tp 1 (1 rank)", cfg, T, f->micro_batch, serial, peak);
  }
  loom_comm_idle_barrier(launch->world, 0);
  loom_cpu_set_threads(1);
  loom_status st_tp;
  const double split = time_steps(cfg, T, f, &tp, &st_tp);
  if (launch->rank == 0 && st == LOOM_OK && st_tp == LOOM_OK) {
    char label[64];
    snprintf(label, sizeof label, " tp %d (%d ranks)", f->tp, launch->size);
    print_step(label, cfg, T, f->micro_batch, split, peak);
    printf("RESULT tp%d_over_tp1_step_time=%.3f\n", f->tp, split / serial);
  }
  loom_parallel_free(&ps);
  if (st == LOOM_OK) st = st_tp;
  return st == LOOM_OK ? LOOM_OK : loom_fail(err, st, "loom bench step: out of memory at seq %d", T);
}

static loom_status bench_step(bench_flags *f, loom_error *err) {
  loom_gpt_config cfg;
  if (loom_gpt_config_preset(&cfg, f->model) != 0)
    return loom_fail(err, LOOM_ERR_USAGE, "loom bench step: --model %s: expected one of %s", f->model,
                     loom_gpt_config_preset_names());
  char device[160];
  loom_status dst = loom_device_setup("loom bench step", f->device, &f->ops, device, sizeof device, err);
  if (dst != LOOM_OK) return dst;
  if (f->layers) cfg.layers = f->layers;
  const int world = loom_launch_env_size();
  if (f->tp > 1 || world > 1) {
    loom_status st = loom_parallel_check(f->tp, 1, 1, world, false, cfg.heads, cfg.hidden, cfg.ffn, 0, err);
    if (st != LOOM_OK) return loom_error_prefix(err, st, "loom bench step");
  }
  loom_launch launch;
  loom_launch_init(&launch);
  if (launch.rank == 0)
    printf("bench step: %s shape (%d layers, hidden %d, heads %d, vocab %d), micro-batch %d, %d threads x %d ranks\n",
           f->model, cfg.layers, cfg.hidden, cfg.heads, cfg.vocab, f->micro_batch,
           f->tp > 1 ? 1 : (f->threads ? f->threads : loom_cpu_threads()), launch.size);
  loom_cpu_set_threads(f->threads);
  loom_status st;
#ifdef LOOM_HAVE_CUDA
  if (f->ops != loom_ops_cpu()) st = bench_cuda(&cfg, f, err);
  else
#endif
    st = f->tp > 1 ? bench_tp(&cfg, f, &launch, err) : bench_serial(&cfg, f, err);
  loom_launch_finish(&launch);
  return st;
}

int loom_cmd_bench(int argc, char **argv) {
  bench_flags f = {.micro_batch = 4, .steps = 3, .layers = 0, .threads = 0, .seq = 0, .tp = 1, .model = "gpt2-small",
                   .device = "auto"};
  loom_flag table[] = {
      {"--micro-batch", FLAG_INT, &f.micro_batch, "sequences per step", 1, 1024, NULL, false, NULL},
      {"--steps", FLAG_INT, &f.steps, "timed steps per sequence length (best is kept)", 1, 1000, NULL, false, NULL},
      {"--layers", FLAG_INT, &f.layers, "override the layer count (0: GPT-2-small's 12)", 0, 1024, NULL, false, NULL},
      {"--threads", FLAG_INT, &f.threads, "CPU threads (0: all cores)", 0, 4096, NULL, false, NULL},
      {"--seq", FLAG_INT, &f.seq, "run only this sequence length (0: 64 and 256; with --tp, 256)", 0, 1024, NULL, false, NULL},
      {"--model", FLAG_STRING, &f.model, "model preset (gpt2-small; gpt-1.3b is 24 layers, hidden 2048)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--device", FLAG_STRING, &f.device, "auto (cuda when a GPU is visible), cpu or cuda", LOOM_NO_RANGE, LOOM_DEVICE_CHOICES, false, NULL},
      {"--tp", FLAG_INT, &f.tp, "compare tp 1 on rank 0 with a tp-way split (mpirun -np TP)", 1, 64, NULL, false, NULL},
  };
  const int n = sizeof table / sizeof table[0];
  loom_error err = {{0}};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse("loom bench", "loom bench step [flags]", table, n, argc, argv, pos, 1, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (st == LOOM_OK && (npos != 1 || strcmp(pos[0], "step") != 0))
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom bench: expected the benchmark name 'step'%s%s%s",
                   npos ? ", got '" : "", npos ? pos[0] : "", npos ? "'" : "");
  if (st == LOOM_OK) st = bench_step(&f, &err);
  return loom_report(st, &err);
}
