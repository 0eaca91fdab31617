/* `loom bench step`: training-step speed of the GPT-2-small shape (or another
 * preset), reported as model GFLOP/s and as a fraction of this machine's
 * sgemm peak measured in the same run (absolute times on a shared machine are
 * noise; ratios are not). With --device cuda: TFLOP/s and MFU against the
 * device's bf16 peak and against cuBLAS's bf16 GEMM measured in the run. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backend/cpu/cpu_peak.h"
#include "ckpt/manifest.h"
#include "ckpt/run_files.h"
#include "cli/flag_defs.h"
#include "cli/commands.h"
#include "cli/device.h"
#include "cli/flags.h"
#include "cli/launch.h"
#include "cli/plan_flags.h"
#include "comm/measure.h"
#include "pipeline/train_loop.h"
#include "sim/cost.h"
#include "core/check.h"
#include "core/log.h"
#include "core/sysinfo.h"
#include "core/rng.h"
#include "core/timer.h"
#ifdef LOOM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

typedef struct {
  loom_plan_flags layout; /* the model and layout, through the same builder as `loom plan new` */
  int steps, threads;
  bool verbose;
  const char *device;
  const loom_ops *ops; /* the --device backend */
} bench_flags;

#define BENCH_FLAG_COUNT (LOOM_PLAN_FLAG_COUNT + 4)

/* Uniform random tokens: the step's cost does not depend on the data. */
static void random_window(loom_dataset *ds, loom_split split, int64_t g, int T, int *window, unsigned char *scored) {
  (void)ds;
  for (int t = 0; t <= T; t++) {
    window[t] = (int)(loom_rng_u32(7, (uint64_t)split, (uint64_t)g * (uint64_t)(T + 1) + (uint64_t)t) % 50257u);
    scored[t] = 1;
  }
}
static void no_free(loom_dataset *ds) { (void)ds; }

/* Times `steps` training steps of a plan over `world` (NULL: this rank
 * alone) after one warm-up; returns the best step's seconds (the slowest
 * rank's). */
static double time_steps(const loom_plan *plan, const bench_flags *f, loom_comm *world, loom_status *st,
                         loom_error *err, double *estimate) {
  loom_dataset data = {.name = "random", .window = random_window, .free = no_free};
  const loom_trainer_options o = {
      .seed = 1, .weight_decay = loom_adamw_defaults().weight_decay, .grad_clip = loom_adamw_defaults().grad_clip,
      .lr = {.max_lr = 6e-4f, .min_lr = 6e-5f, .warmup_steps = 0, .total_steps = f->steps + 1}};
  loom_trainer tr;
  *st = loom_trainer_init(&tr, world, plan, f->ops, &data, &o, err);
  const double best = *st == LOOM_OK ? loom_train_best_step(&tr, f->steps) : 0.0;
  if (*st == LOOM_OK && estimate) {
    const loom_memory mem = loom_trainer_memory(&tr);
    *estimate = loom_memory_total(&mem);
  }
  loom_trainer_free(&tr);
  return best;
}

/* The plan of the flags at sequence length T (the model's too, as a bench
 * of seq T would size it); parallel false: the same model on one rank. */
static loom_status plan_at(const bench_flags *f, const loom_flag *table, int T, bool parallel, int world,
                           loom_plan **plan, loom_error *err) {
  loom_plan_flags layout = f->layout;
  layout.model.seq = T;
  if (!parallel) layout.tp = layout.pp = layout.dp = 1;
  loom_flag given[BENCH_FLAG_COUNT]; /* the parsed table, with --seq given as T */
  memcpy(given, table, sizeof given);
  given[loom_flags_find(table, BENCH_FLAG_COUNT, "--seq") - table].set = true;
  loom_status st = loom_plan_flags_build("loom bench step", &layout, given, plan, err);
  const loom_plan_limits limits = {.world = parallel ? world : 1};
  if (st == LOOM_OK) st = loom_plan_flags_refuse("loom bench step", *plan, &limits, table, NULL, err);
  return st;
}

static bool seq_flag(const loom_flag *table) { return loom_flags_find(table, BENCH_FLAG_COUNT, "--seq")->set; }

/* Model GFLOP/s of one step of a plan taking dt seconds. */
static double step_gflops(const loom_plan *plan, double dt) {
  loom_gpt_config cfg;
  loom_plan_model_config(plan, &cfg);
  const int T = loom_plan_train_seq(plan);
  return loom_gpt_train_flops(&cfg, T, (double)plan->batch->global_batch * T, LOOM_FLOPS_MEGATRON) / dt * 1e-9;
}

static void print_step(const char *label, const loom_plan *plan, double dt, double peak) {
  const int T = loom_plan_train_seq(plan);
  const double tokens = (double)plan->batch->global_batch * T, gflops = step_gflops(plan, dt);
  printf("seq %4d%s: step %8.1f ms | %8.0f tok/s | model %6.1f GFLOP/s | %5.1f%% of GEMM peak\n", T, label,
         dt * 1e3, tokens / dt, gflops, 100.0 * gflops / peak);
}

/* The best GEMM per dtype at 2048^3: sgemm over the libraries built in, and the bf16 GEMM. */
static void gemm_peaks(double peak[2], const char *when) {
  loom_gemm_library fastest = LOOM_GEMM_OPENBLAS;
  peak[0] = loom_cpu_sgemm_peak(2048, 1.0, &fastest);
  peak[1] = loom_cpu_bf16_gemm_gflops(2048, 1.0);
  char bf16[96];
  loom_cpu_bf16_gemm_describe(loom_cpu_bf16_gemm_path(), bf16, sizeof bf16);
  printf("GEMM peak %s (2048^3, best of >= 1 s): fp32 %.1f GFLOP/s (%s, the fastest built in), bf16 %.1f GFLOP/s (%s)\n",
         when, peak[0], loom_cpu_gemm_name(fastest), peak[1], bf16);
}

/* --verbose: every GEMM of the step at T (each linear layer's forward,
 * input grad and weight grad, as the CPU backend calls them) timed through
 * every library built in, with the one the backend runs it through. */
static void gemm_shapes(const loom_plan *plan) {
  loom_gpt_config cfg;
  loom_plan_model_config(plan, &cfg);
  const int n = loom_gpt_param_table(&cfg, NULL, 0, 1, NULL, NULL);
  loom_tensor *specs = loom_xcalloc((size_t)n, sizeof *specs, "parameter table");
  loom_param_meta *meta = loom_xcalloc((size_t)n, sizeof *meta, "parameter table");
  loom_gpt_param_table(&cfg, NULL, 0, 1, specs, meta);
  static const char *const ROLE[LOOM_LINEAR_GEMMS] = {"forward", "input grad", "weight grad"};
  const int tokens = plan->batch->micro_batch * loom_plan_train_seq(plan);
  const loom_gemm_library runs = loom_cpu_gemm_library();
  const loom_bf16_gemm_path bf16_runs = loom_cpu_bf16_gemm_path();
  char bf16[96];
  loom_cpu_bf16_gemm_describe(LOOM_BF16_GEMM_NATIVE, bf16, sizeof bf16);
  printf("GEMMs of one micro-batch (%d tokens), GFLOP/s per fp32 library and per bf16 path (native: %s); * marks the "
         "ones loom runs:\n", tokens, bf16);
  for (int k = 0; k < n; k++) {
    const loom_tensor *w = &specs[k];
    /* The position table is no matmul; fused projections (k and v after q, up after gate) run in their first's GEMM. */
    if (w->ndim != 2 || meta[k].role == LOOM_ROLE_WPE || meta[k].role == LOOM_ROLE_FUSED) continue;
    int64_t rows = w->shape[0];
    for (int j = k + 1; j < n && meta[j].role == LOOM_ROLE_FUSED; j++) rows += specs[j].shape[0];
    bool seen = false;
    for (int j = 0; j < k && !seen; j++) seen = specs[j].ndim == 2 && specs[j].shape[0] == rows && specs[j].shape[1] == w->shape[1];
    if (seen) continue;
    loom_gemm_shape g[LOOM_LINEAR_GEMMS];
    loom_cpu_linear_gemms(tokens, (int)w->shape[1], (int)rows, g);
    for (int r = 0; r < LOOM_LINEAR_GEMMS; r++) {
      printf("  %-28s %-11s M %5d N %5d K %5d%s%s:", w->name, ROLE[r], g[r].M, g[r].N, g[r].K, g[r].ta ? " A^T" : "",
             g[r].tb ? " B^T" : "");
      for (int lib = 0; lib < LOOM_GEMM_LIBRARIES; lib++)
        if (loom_cpu_gemm_available((loom_gemm_library)lib))
          printf("  %s%s %6.1f", lib == (int)runs ? "*" : " ", loom_cpu_gemm_name((loom_gemm_library)lib),
                 loom_cpu_gemm_shape_gflops((loom_gemm_library)lib, &g[r], 0.2));
      printf(" | bf16");
      for (int path = 0; path < LOOM_BF16_GEMM_PATHS; path++)
        if (path != LOOM_BF16_GEMM_NATIVE || loom_cpu_bf16_native_available())
          printf("  %s%s %6.1f", path == (int)bf16_runs ? "*" : " ", loom_cpu_bf16_gemm_path_name((loom_bf16_gemm_path)path),
                 loom_cpu_bf16_gemm_shape_gflops((loom_bf16_gemm_path)path, &g[r], 0.2));
      if (loom_cpu_bf16_native_available()) { /* oneDNN picks its implementation shape by shape */
        char impl[64];
        loom_cpu_bf16_gemm_impl(&g[r], impl, sizeof impl);
        printf(" (%s)", impl);
      }
      printf("\n");
    }
  }
  free(specs);
  free(meta);
}

/* The memory bandwidth the roofline holds the memory-bound passes to:
 * STREAM's triad over arrays far larger than any cache. */
static double triad_gbs(const char *when) {
  const double gbs = loom_measure_memory_gbs((size_t)384 << 20, 1.0);
  printf("memory %s (STREAM triad, 384 MiB, best of >= 1 s): %.1f GB/s\n", when, gbs);
  return gbs;
}

/* This machine as a roofline in the cost model's terms: GEMMs (attention's
 * products too, as one fused kernel) at the measured peaks whatever their
 * shape, memory-bound passes at the measured triad, nothing per op. */
static loom_profile *roofline_profile(const double peak[2], double gbs) {
  char text[1024];
  snprintf(text, sizeof text,
           "name: \"roofline\" devices_per_node: 1 op_overhead_us: 0 "
           "device { name: \"this CPU\" peak_tflops_fp32: %.9g peak_tflops_bf16: %.9g memory_bytes: %lld "
           "memory_bandwidth_gbs: %.9g memory_efficiency: 1 attention_efficiency: 1 "
           "gemm { dtype: PRECISION_FP32 max_efficiency: 1 half_dim: 0 } "
           "gemm { dtype: PRECISION_BF16 max_efficiency: 1 half_dim: 0 } } "
           "intra_node { bandwidth_gbs: %.9g latency_us: 0 efficiency: 1 topology: TOPOLOGY_SWITCH } "
           "inter_node { bandwidth_gbs: %.9g latency_us: 0 efficiency: 1 topology: TOPOLOGY_SWITCH }",
           peak[0] * 1e-3, peak[1] * 1e-3, (long long)loom_mem_available_bytes(), gbs, gbs, gbs);
  loom_profile *prof = NULL;
  loom_error err;
  LOOM_CHECK(loom_profile_parse(text, strlen(text), "the roofline", &prof, &err) == LOOM_OK, "the roofline profile parses");
  return prof;
}

/* A step's roofline on one rank: its GEMMs at the dtype's peak plus its
 * memory-bound bytes at the triad (the cost model's FLOPs and bytes). */
typedef struct {
  double gemm_s, memory_s, bytes;
} roofline;

static roofline roofline_of(const loom_plan *plan, const double peak[2], double gbs) {
  loom_profile *prof = roofline_profile(peak, gbs);
  loom_sim_costs c;
  loom_sim_costs_build(plan, prof, &c);
  const double step = c.m * (c.forward[0] + c.backward[0]) + c.optimizer[0];
  roofline r = {.bytes = c.memory_bytes[0], .memory_s = c.memory_bytes[0] / (gbs * 1e9)};
  r.gemm_s = step - r.memory_s;
  loom_sim_costs_free(&c);
  loom_profile_free(prof);
  return r;
}

static double best_of(double a, double b) { return a > b ? a : b; }

/* Single-rank bench: each sequence length (--seq's, else 64 and 256) and
 * precision against that dtype's GEMM peak and against the step's roofline,
 * each from the best of the figures measured before and after the steps (a
 * share of a slower reading would pass 100%). */
static loom_status bench_serial(bench_flags *f, loom_flag *table, loom_error *err) {
  static const char *const PRECISIONS[] = {"fp32", "bf16"};
  const bool one_precision = loom_flags_find(table, BENCH_FLAG_COUNT, "--precision")->set;
  printf("the step's fp32 GEMMs: %s; its bf16 GEMMs: %s\n", loom_cpu_gemm_name(loom_cpu_gemm_library()),
         loom_cpu_bf16_gemm_path_name(loom_cpu_bf16_gemm_path()));
  double before[2], after[2];
  gemm_peaks(before, "before");
  const double gbs_before = triad_gbs("before");
  const int seqs[2] = {seq_flag(table) ? f->layout.model.seq : 64, 256}, nseqs = seq_flag(table) ? 1 : 2;
  double seconds[2][2] = {{0.0, 0.0}, {0.0, 0.0}}; /* 0: not measured */
  loom_plan *plans[2][2] = {{NULL, NULL}, {NULL, NULL}};
  loom_status st = LOOM_OK;
  for (int i = 0; i < nseqs && st == LOOM_OK; i++) {
    bool shown = false; /* the GEMM shapes of this length (both dtypes run them in fp32 here) */
    for (int k = 0; k < 2 && st == LOOM_OK; k++) {
      if (one_precision && strcmp(f->layout.precision, PRECISIONS[k]) != 0) continue;
      bench_flags fk = *f;
      fk.layout.precision = PRECISIONS[k];
      st = plan_at(&fk, table, seqs[i], false, 1, &plans[i][k], err);
      if (st == LOOM_OK && f->verbose && !shown) gemm_shapes(plans[i][k]);
      shown = true;
      if (st == LOOM_OK) seconds[i][k] = time_steps(plans[i][k], &fk, NULL, &st, err, NULL);
    }
  }
  if (st == LOOM_OK) {
    gemm_peaks(after, "after");
    const double gbs = best_of(gbs_before, triad_gbs("after")), peak[2] = {best_of(before[0], after[0]), best_of(before[1], after[1])};
    printf("drift: fp32 %+.1f%%, bf16 %+.1f%%\n", 100.0 * (after[0] - before[0]) / before[0],
           100.0 * (after[1] - before[1]) / before[1]);
    char results[512] = "";
    for (int i = 0; i < nseqs; i++)
      for (int k = 0; k < 2; k++) {
        if (seconds[i][k] <= 0.0) continue;
        const double dt = seconds[i][k];
        char label[16];
        snprintf(label, sizeof label, " %s", PRECISIONS[k]);
        print_step(label, plans[i][k], dt, peak[k]);
        const roofline r = roofline_of(plans[i][k], peak, gbs);
        const double limit = r.gemm_s + r.memory_s;
        printf("    roofline: GEMMs %.1f ms at %.1f GFLOP/s + memory-bound passes %.2f GB in %.1f ms at %.1f GB/s = %.1f ms;"
               " the step takes %.2fx it, %.1f%% of the limit\n",
               r.gemm_s * 1e3, peak[k], r.bytes * 1e-9, r.memory_s * 1e3, gbs, limit * 1e3, dt / limit, 100.0 * limit / dt);
        const size_t used = strlen(results);
        snprintf(results + used, sizeof results - used, " seq%d_%s_peak_frac=%.3f seq%d_%s_roofline_frac=%.3f", seqs[i],
                 PRECISIONS[k], step_gflops(plans[i][k], dt) / peak[k], seqs[i], PRECISIONS[k], limit / dt);
      }
    if (seconds[nseqs - 1][0] > 0.0 && seconds[nseqs - 1][1] > 0.0) {
      const size_t used = strlen(results);
      snprintf(results + used, sizeof results - used, " seq%d_bf16_over_fp32=%.3f", seqs[nseqs - 1],
               seconds[nseqs - 1][1] / seconds[nseqs - 1][0]);
    }
    printf("RESULT%s\n", results);
  }
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 2; k++) loom_plan_free(plans[i][k]);
  return st;
}

/* `loom bench ckpt`: the step loop's stall for one checkpoint of the
 * model, synchronous against asynchronous against in memory (--local-save-
 * every), measured in one run: the same process saves the same trained
 * state each way, in turn, --steps times each, into fresh directories under
 * $TMPDIR; while an asynchronous or in-memory save's shard is written,
 * training steps go on, and the background write is timed too. Then the
 * restores: from the persistent checkpoint and from the in-memory copies,
 * and the setup a relaunch repeats (the model built, its first step). Best
 * of each (a shared machine's noise only slows). */
static loom_status bench_ckpt(bench_flags *f, loom_flag *table, loom_error *err) {
  loom_plan *plan = NULL;
  loom_status st = plan_at(f, table, seq_flag(table) ? f->layout.model.seq : 64, false, 1, &plan, err);
  loom_dataset data = {.name = "random", .window = random_window, .free = no_free};
  const loom_trainer_options o = {
      .seed = 1, .weight_decay = loom_adamw_defaults().weight_decay, .grad_clip = loom_adamw_defaults().grad_clip,
      .lr = {.max_lr = 6e-4f, .min_lr = 6e-5f, .total_steps = 1000}};
  loom_trainer tr = {0};
  const double setup_t0 = loom_now_s();
  if (st == LOOM_OK) st = loom_trainer_init(&tr, NULL, plan, f->ops, &data, &o, err);
  const char *tmp = getenv("TMPDIR");
  char root[4096];
  snprintf(root, sizeof root, "%s/loom_bench_ckpt_XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (st == LOOM_OK && !mkdtemp(root)) st = loom_fail(err, LOOM_ERR_IO, "loom bench ckpt: cannot make %s", root);
  const bool made = st == LOOM_OK;
  char dirs[2][4200], local[4200];
  snprintf(dirs[0], sizeof dirs[0], "%s/sync", root);
  snprintf(dirs[1], sizeof dirs[1], "%s/async", root);
  snprintf(local, sizeof local, "%s/local", root);
  loom_run_files files = {0};
  if (st == LOOM_OK) loom_run_files_init(&files, &tr, dirs[0], 1, 1, NULL);
  int step = 0;
  if (st == LOOM_OK) loom_trainer_step(&tr, step++); /* the Adam state exists, pages are touched */
  const double setup_s = loom_now_s() - setup_t0;
  if (st == LOOM_OK) st = loom_run_local_init(&files, local, err);
  double sync_s = 0.0, stall_s = 0.0, write_s = 0.0, local_s = 0.0;
  int during = 0;
  for (int i = 0; i < f->steps && st == LOOM_OK; i++) {
    files.async_save = false, files.dir = dirs[0];
    double t0 = loom_now_s();
    st = loom_run_save(&files, step, err);
    const double s = loom_now_s() - t0;
    sync_s = i == 0 || s < sync_s ? s : sync_s;
    files.async_save = true, files.dir = dirs[1];
    t0 = loom_now_s();
    if (st == LOOM_OK) st = loom_run_save(&files, step, err);
    const double stall = loom_now_s() - t0;
    stall_s = i == 0 || stall < stall_s ? stall : stall_s;
    int steps = 0;
    while (st == LOOM_OK && files.pending) { /* train while the shard is written */
      loom_trainer_step(&tr, step++);
      steps++;
      st = loom_run_settle(&files, false, err);
    }
    const double written = loom_now_s() - t0;
    if (i == 0 || written < write_s) write_s = written, during = steps;
    /* In memory: the copy to host memory, then (recorded at a later step) the replica and the manifest. */
    t0 = loom_now_s();
    if (st == LOOM_OK) st = loom_run_local_save(&files, step, err);
    double local = loom_now_s() - t0;
    while (st == LOOM_OK && files.local_pending) {
      loom_trainer_step(&tr, step++);
      t0 = loom_now_s();
      st = loom_run_settle(&files, false, err);
      local += loom_now_s() - t0;
    }
    local_s = i == 0 || local < local_s ? local : local_s;
  }
  /* The restores: the in-memory copies hold the newer step; without them, the persistent checkpoint. */
  double restore_s = 0.0, local_restore_s = 0.0;
  loom_log_set_quiet(true); /* each resume's own lines */
  for (int i = 0; i < f->steps && st == LOOM_OK; i++) {
    int64_t first;
    files.dir = dirs[0];
    double t0 = loom_now_s();
    st = loom_run_resume(&files, &first, err);
    const double from_memory = loom_now_s() - t0;
    loom_local_ckpt *kept = files.local;
    files.local = NULL;
    t0 = loom_now_s();
    if (st == LOOM_OK) st = loom_run_resume(&files, &first, err);
    const double from_store = loom_now_s() - t0;
    files.local = kept;
    local_restore_s = i == 0 || from_memory < local_restore_s ? from_memory : local_restore_s;
    restore_s = i == 0 || from_store < restore_s ? from_store : restore_s;
  }
  loom_log_set_quiet(false);
  if (st == LOOM_OK) {
    const double gb = (double)loom_ckpt_load_bytes(files.chunks, loom_pipeline_chunk_count(tr.pipe)) / 1e9;
    char cpu[256];
    printf("bench ckpt: %s shape, %.3f GB per checkpoint (weights and AdamW state), into %s; %s, copies by memcpy\n",
           f->layout.model.preset, gb, root, loom_cpu_model(cpu, sizeof cpu));
    printf("synchronous save: the step loop stalled %.3f s (best of %d)\n", sync_s, f->steps);
    printf("asynchronous save: the step loop stalled %.3f s (best of %d), %.3fx the synchronous stall; its shard was "
           "written in the background in %.2f s, while %d training step%s ran\n", stall_s, f->steps, stall_s / sync_s,
           write_s, during, during == 1 ? "" : "s");
    printf("in-memory save (--local-save-every, into %s): the step loop stalled %.3f s (best of %d: the copy to host "
           "memory, then the replica and the manifest), %.3fx the asynchronous save's stall\n", local, local_s, f->steps,
           local_s / stall_s);
    printf("restore: %.3f s from the persistent checkpoint, %.3f s from the in-memory copies (best of %d); setup a "
           "relaunch repeats (the model built, its first step): %.3f s\n", restore_s, local_restore_s, f->steps, setup_s);
    printf("RESULT ckpt_sync_stall_s=%.4f ckpt_async_stall_s=%.4f ckpt_async_over_sync=%.4f ckpt_local_stall_s=%.4f "
           "ckpt_restore_s=%.4f ckpt_local_restore_s=%.4f ckpt_setup_s=%.4f ckpt_gb=%.3f\n", sync_s, stall_s,
           stall_s / sync_s, local_s, restore_s, local_restore_s, setup_s, gb);
  }
  files.finished = true; /* the in-memory copies go with the rest */
  loom_run_files_free(&files);
  for (int k = 0; made && k < 2; k++) loom_ckpt_remove(dirs[k]);
  if (made) rmdir(root);
  loom_trainer_free(&tr);
  loom_plan_free(plan);
  return st;
}

#ifdef LOOM_HAVE_CUDA
/* GPU bench: each sequence length's model TFLOP/s against the device's dense
 * bf16 peak (stated) and against cuBLAS's bf16 GEMM measured in this run. */
static loom_status bench_cuda(bench_flags *f, loom_flag *table, loom_error *err) {
  const double peak = loom_cuda_bf16_peak_tflops(f->ops), gemm = loom_cuda_bf16_gemm_tflops(f->ops, 8192, 8192, 8192, 5);
  char name[256];
  loom_cuda_device_name(f->ops, name, sizeof name);
  printf("device: %s | dense bf16 peak used: %.0f TFLOP/s%s | cuBLAS bf16 GEMM 8192^3 measured: %.1f TFLOP/s\n", name,
         peak, peak > 0 ? " (NVIDIA's datasheet)" : " (unknown to loom)", gemm);
  printf("precision: %s, device memory, one compute stream\n",
         strcmp(f->layout.precision, "bf16") == 0 ? "bf16 (bf16 tensor-core GEMMs, fp32 master weights)" : "fp32");
  /* --seq: that length alone; else three, shortest first */
  const int given[] = {f->layout.model.seq}, lengths[] = {64, 256, 1024};
  const int *seqs = seq_flag(table) ? given : lengths, count = seq_flag(table) ? 1 : 3;
  for (int i = 0; i < count; i++) {
    loom_plan *plan;
    loom_status st = plan_at(f, table, seqs[i], false, 1, &plan, err);
    if (st == LOOM_OK) st = loom_device_match_plan("loom bench", f->ops, plan, err);
    double estimate = 0.0;
    const double dt = st == LOOM_OK ? time_steps(plan, f, NULL, &st, err, &estimate) : 0.0;
    const double tflops = st == LOOM_OK ? step_gflops(plan, dt) * 1e-3 : 0.0;
    loom_plan_free(plan);
    if (st != LOOM_OK) return st;
    /* Lengths run shortest first, so the allocator's peak so far is this length's. */
    const double used = (double)f->ops->mem->counts(f->ops->mem).peak, gib = 1073741824.0;
    printf("seq %4d: step %8.1f ms | model %7.1f TFLOP/s | MFU %5.1f%% of bf16 peak | %5.1f%% of measured bf16 GEMM"
           " | memory peak %.2f GiB, plan's estimate %.2f GiB (%+.1f%%)\n",
           seqs[i], dt * 1e3, tflops, peak > 0 ? 100.0 * tflops / peak : 0.0, 100.0 * tflops / gemm, used / gib,
           estimate / gib, 100.0 * (estimate - used) / used);
    printf("RESULT seq%d_mfu=%.4f seq%d_memory_estimate_over_peak=%.4f seq%d_step_s=%.6f\n", seqs[i],
           peak > 0 ? tflops / peak : 0.0, seqs[i], estimate / used, seqs[i], dt);
  }
  return LOOM_OK;
}
#endif

/* The CPUs of every rank together: what the job was given. Collective. */
static void job_cpus(loom_comm *world, loom_cpu_mask *out) {
  loom_cpu_mask mine;
  loom_cpu_affinity(&mine);
  const int n = loom_comm_size(world);
  int64_t *all = loom_xmalloc((size_t)n * LOOM_CPU_MASK_WORDS * sizeof(int64_t), "CPU masks");
  loom_comm_allgather_typed(world, mine.bits, all, LOOM_CPU_MASK_WORDS, LOOM_DTYPE_I64);
  memset(out, 0, sizeof *out);
  for (int r = 0; r < n; r++)
    for (int w = 0; w < LOOM_CPU_MASK_WORDS; w++) out->bits[w] |= (uint64_t)all[r * LOOM_CPU_MASK_WORDS + w];
  free(all);
}

/* A parallel plan under mpirun against the same model on rank 0 alone. The
 * baseline gets the same cores as the plan: every rank's CPUs (mpirun binds
 * each rank to its own), as BLAS threads; the plan then runs one thread per
 * rank. Ranks not in a phase sleep, so each phase has the whole machine. */
static loom_status bench_parallel(bench_flags *f, loom_flag *table, loom_launch *launch, loom_error *err) {
  const int T = seq_flag(table) ? f->layout.model.seq : 256;
  loom_plan *serial_plan = NULL, *plan = NULL;
  loom_status st = plan_at(f, table, T, false, 1, &serial_plan, err);
  if (st == LOOM_OK) st = plan_at(f, table, T, true, launch->size, &plan, err);
  loom_cpu_mask all, own;
  job_cpus(launch->world, &all);
  loom_cpu_affinity(&own);
  double serial = 0.0, peak = 0.0;
  if (launch->rank == 0 && st == LOOM_OK) {
    const int cores = loom_cpu_mask_count(&all);
    loom_cpu_set_threads(cores);
    if (loom_cpu_pin_threads(&all) != 0) printf("warning: could not widen rank 0 to the job's %d CPUs\n", cores);
    peak = loom_cpu_sgemm_gflops(2048, 1.0);
    printf("sgemm peak, 1 rank x %d threads on the job's %d CPUs (2048^3): %.1f GFLOP/s\n", cores, cores, peak);
    serial = time_steps(serial_plan, f, NULL, &st, err, NULL);
    if (st == LOOM_OK) print_step(" (1,1,1) on 1 rank", serial_plan, serial, peak);
    loom_cpu_pin_threads(&own);
  }
  loom_comm_idle_barrier(launch->world, 0); /* the others sleep through the baseline, leaving it their cores */
  int32_t bad = st != LOOM_OK;
  loom_comm_allreduce_typed(launch->world, &bad, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  loom_cpu_set_threads(f->threads ? f->threads : 1);
  const double split = !bad ? time_steps(plan, f, launch->world, &st, err, NULL) : 0.0;
  if (launch->rank == 0 && !bad && st == LOOM_OK) {
    char label[96];
    snprintf(label, sizeof label, " tp %d x pp %d x dp %d (%d ranks)", plan->parallel->tp, plan->parallel->pp,
             plan->parallel->dp, launch->size);
    print_step(label, plan, split, peak);
    printf("RESULT parallel_over_serial_step_time=%.3f\n", split / serial);
  }
  loom_plan_free(serial_plan);
  loom_plan_free(plan);
  if (st == LOOM_OK && bad) st = loom_fail(err, LOOM_ERR_RUNTIME, "loom bench step: rank 0 failed");
  return st;
}

static loom_status bench_step(bench_flags *f, loom_flag *table, loom_error *err) {
  char device[160];
  loom_status st = loom_device_setup("loom bench step", f->device, &f->ops, device, sizeof device, err);
  if (st != LOOM_OK) return st;
  const int world = loom_launch_env_size();
  loom_plan *plan;
  st = plan_at(f, table, seq_flag(table) ? f->layout.model.seq : 256, true, world, &plan, err);
  if (st != LOOM_OK) return st;
  loom_gpt_config cfg;
  loom_plan_model_config(plan, &cfg);
  const bool parallel = loom_plan_ranks(plan) > 1;
  loom_plan_free(plan);
  loom_launch launch;
  if ((st = loom_launch_init(&launch, err)) != LOOM_OK) {
    loom_launch_finish(&launch);
    return st;
  }
  if (launch.rank == 0)
    printf("bench step: %s shape (%d layers, hidden %d, heads %d, vocab %d), micro-batch %d, %d threads x %d ranks\n",
           f->layout.model.preset, cfg.layers, cfg.hidden, cfg.heads, cfg.vocab, f->layout.micro_batch,
           parallel ? 1 : (f->threads ? f->threads : loom_cpu_threads()), launch.size);
  loom_cpu_set_threads(f->threads);
#ifdef LOOM_HAVE_CUDA
  if (f->ops != loom_ops_cpu()) st = bench_cuda(f, table, err);
  else
#endif
    st = parallel ? bench_parallel(f, table, &launch, err) : bench_serial(f, table, err);
  loom_launch_finish(&launch);
  return st;
}

int loom_cmd_bench(int argc, char **argv) {
  bench_flags f = {.layout = loom_plan_flags_defaults(), .steps = 3, .threads = 0, .device = "auto"};
  f.layout.model.preset = "gpt2-small";
  f.layout.micro_batch = 4;
  loom_flag table[BENCH_FLAG_COUNT];
  loom_plan_flags_table(&f.layout, table);
  const loom_flag rest[] = {
      loom_flag_def_as("--steps", &f.steps, "timed steps per sequence length (best is kept)"),
      loom_flag_def_as("--threads", &f.threads, "CPU threads (0: all cores; 1 per rank in a parallel plan)"),
      loom_flag_def("--device", &f.device),
      {"--verbose", FLAG_BOOL, &f.verbose, "also time each GEMM shape of the step in every library built in, and name the one that runs it",
       LOOM_NO_RANGE, NULL, false, NULL},
  };
  _Static_assert(sizeof rest / sizeof rest[0] == BENCH_FLAG_COUNT - LOOM_PLAN_FLAG_COUNT, "BENCH_FLAG_COUNT");
  memcpy(table + LOOM_PLAN_FLAG_COUNT, rest, sizeof rest);
  loom_error err = {0};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse("loom bench", "loom bench step [flags] (--seq: only that length; else 64 and 256, "
                                  "or 256 for a parallel plan under mpirun)", table, BENCH_FLAG_COUNT, argc, argv, pos,
                                  1, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  const bool ckpt = npos == 1 && strcmp(pos[0], "ckpt") == 0;
  if (st == LOOM_OK && !ckpt && (npos != 1 || strcmp(pos[0], "step") != 0))
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom bench: expected the benchmark name 'step' or 'ckpt'%s%s%s",
                   npos ? ", got '" : "", npos ? pos[0] : "", npos ? "'" : "");
  if (st == LOOM_OK && ckpt) st = loom_device_setup("loom bench ckpt", f.device, &f.ops, (char[160]){0}, 160, &err);
  if (st == LOOM_OK) st = ckpt ? bench_ckpt(&f, table, &err) : bench_step(&f, table, &err);
  return loom_report(st, &err);
}
