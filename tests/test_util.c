/* Test helpers: deterministic fills, error norms, temp files. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <stdarg.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "comm/mpi/comm_mpi.h"
#include "core/rng.h"
#include "layers/moe_router.h"
#include "core/fault.h"
#include "test_util.h"

void tu_fill(float *x, size_t n, uint64_t stream, float lo, float hi) {
  for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * loom_rng_uniform(42, stream, i);
}

/* Every comparison below treats a NaN or infinity in either input as the
 * worst difference there is (INFINITY), so "diff <= tol" fails on it and
 * "diff > tol" catches it; fmax alone would drop a NaN and pass. */
static bool any_nonfinite(const float *a, const float *b, size_t n) {
  if (n == 0) { /* not ck_assert: the GPU programs compare outside Check's runner */
    fprintf(stderr, "test_util: a comparison of nothing (n = 0): there must be something to compare\n");
    abort();
  }
  for (size_t i = 0; i < n; i++)
    if (!isfinite(a[i]) || !isfinite(b[i])) return true;
  return false;
}

double tu_nmse(const float *a, const float *b, size_t n) {
  if (any_nonfinite(a, b, n)) return INFINITY;
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; i++) {
    num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    den += (double)b[i] * b[i];
  }
  return den > 0.0 ? num / den : num;
}

double tu_max_abs_diff(const float *a, const float *b, size_t n) {
  if (any_nonfinite(a, b, n)) return INFINITY;
  double m = 0.0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
  return m;
}

double tu_rel_max_diff(const float *a, const float *b, size_t n) {
  if (any_nonfinite(a, b, n)) return INFINITY;
  double most = 0.0;
  for (size_t i = 0; i < n; i++) most = fmax(most, fabs(b[i]));
  ck_assert_msg(most > 0.0, "nothing to compare");
  return tu_max_abs_diff(a, b, n) / most;
}

tu_attention_case tu_attention_case_new(const loom_ops *ops, const loom_attn_shape *s, const loom_dropout *drop, uint64_t seed) {
  const size_t rows = (size_t)s->T * s->B, W = loom_attn_qkv_width(s), HD = (size_t)s->heads * s->head_dim;
  tu_attention_case c = {.qkv = malloc(rows * W * sizeof(float)), .dout = malloc(rows * HD * sizeof(float)),
                         .out = malloc(rows * HD * sizeof(float)),
                         .lse = malloc((size_t)s->B * s->heads * s->T * sizeof(float)), .dqkv = calloc(rows * W, sizeof(float))};
  tu_fill(c.qkv, rows * W, seed, -1.0f, 1.0f);
  tu_fill(c.dout, rows * HD, seed + 1, -1.0f, 1.0f);
  ops->attention_forward(ops, c.out, c.lse, c.qkv, s, drop);
  ops->attention_backward(ops, c.dqkv, c.dout, c.out, c.qkv, c.lse, s, drop);
  return c;
}

void tu_attention_case_free(tu_attention_case *c) {
  free(c->qkv), free(c->dout), free(c->out), free(c->lse), free(c->dqkv);
  memset(c, 0, sizeof *c);
}

int tu_all_finite(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return 0;
  return 1;
}

/* Every test process writes under one folder of its own, removed with all it
 * holds when the process exits, so a test run leaves $TMPDIR as it found it. */
static char g_tmp_dir[600];
static pid_t g_tmp_owner;
/* Under tu_run, the runner's own folder, which each forked test's folder
 * goes inside: a test that fails leaves by _exit, past atexit, and the
 * runner removes what it left. */
static char g_root[512];

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

void tu_remove_tree(const char *path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

static void remove_tmp_dir(void) {
  if (g_tmp_dir[0] && getpid() == g_tmp_owner) tu_remove_tree(g_tmp_dir);
}

const char *tu_tmp_path(const char *name) {
  static char paths[64][1024];
  static int next;
  if (!g_tmp_dir[0] || g_tmp_owner != getpid()) { /* a forked test child makes its own */
    const char *dir = g_root[0] ? g_root : getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(g_tmp_dir, sizeof g_tmp_dir, "%s/loom_test_XXXXXX", dir);
    ck_assert_msg(mkdtemp(g_tmp_dir) != NULL, "cannot make a folder under %s", dir);
    if (!g_tmp_owner) atexit(remove_tmp_dir);
    g_tmp_owner = getpid();
  }
  char *p = paths[next++ % 64];
  snprintf(p, sizeof paths[0], "%s/%s", g_tmp_dir, name);
  return p;
}

void tu_write_bytes(const char *path, const void *data, size_t n) {
  FILE *fp = fopen(path, "wb");
  ck_assert_msg(fp != NULL, "cannot create %s", path);
  ck_assert_uint_eq(fwrite(data, 1, n, fp), n);
  fclose(fp);
}

void *tu_read_bytes(const char *path, size_t *n) {
  FILE *fp = fopen(path, "rb");
  ck_assert_msg(fp != NULL, "cannot open %s", path);
  fseek(fp, 0, SEEK_END);
  *n = (size_t)ftell(fp);
  fseek(fp, 0, SEEK_SET);
  char *buf = malloc(*n + 1);
  ck_assert_ptr_nonnull(buf);
  ck_assert_uint_eq(fread(buf, 1, *n, fp), *n);
  buf[*n] = '\0'; /* a text file reads as a string */
  fclose(fp);
  return buf;
}

int tu_run(Suite *s) {
  const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(g_root, sizeof g_root, "%s/loom_tests_XXXXXX", tmp);
  if (!mkdtemp(g_root)) {
    fprintf(stderr, "cannot make a folder under %s\n", tmp);
    return 1;
  }
  chmod(g_root, 0755); /* as the folder was before: a test may run a command as another user inside */
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  tu_remove_tree(g_root);
  return failed == 0 ? 0 : 1;
}

int tu_run_rank(Suite *s, int rank) {
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK); /* MPI and fork do not mix */
  srunner_run_all(sr, rank == 0 ? CK_NORMAL : CK_SILENT);
  const int failed = srunner_ntests_failed(sr);
  if (rank != 0 && failed) {
    TestResult **results = srunner_failures(sr);
    for (int i = 0; i < failed; i++)
      fprintf(stderr, "rank %d: %s:%d: %s\n", rank, tr_lfile(results[i]), tr_lno(results[i]), tr_msg(results[i]));
    free(results);
  }
  srunner_free(sr);
  return failed;
}

void tu_slice_of(const loom_gpt_params *local, const loom_buffer *whole_buf, const loom_gpt_params *whole, float *out) {
  loom_gpt_params src = *whole, dst = *local;
  src.params = *whole_buf;
  loom_tensor *views = malloc((size_t)local->params.count * sizeof *views);
  for (int k = 0; k < local->params.count; k++) {
    views[k] = local->params.views[k];
    views[k].data = out + loom_buffer_offset(&local->params, k);
  }
  dst.params.base = out;
  dst.params.views = views;
  memset(out, 0, local->params.numel * sizeof(float));
  loom_gpt_params_copy_shards(&dst, &src, 1);
  free(views);
}

int tu_run_mpi(Suite *s, loom_comm *world) {
  float failed = (float)tu_run_rank(s, world->rank);
  loom_comm_allreduce(world, &failed, 1, LOOM_REDUCE_MAX); /* any rank's failure fails the job */
  loom_comm_free(world);
  loom_mpi_finalize();
  return failed > 0 ? 1 : 0;
}

void tu_train_serial(loom_gpt *m, loom_adamw *opt, loom_dataset *data, int global, loom_lr_schedule lr, int steps,
                     float *losses, double *norms) {
  const int T = m->T, B = m->B, micro_steps = global / B;
  ck_assert_int_eq(global % B, 0);
  int *tokens = malloc((size_t)T * B * sizeof(int)), *targets = malloc((size_t)T * B * sizeof(int));
  const loom_moe_config *moe = &m->p.cfg.moe;
  const size_t biases = moe->expert_bias ? (size_t)m->p.layers * (size_t)moe->experts : 0;
  float *bias = biases ? calloc(biases, sizeof *bias) : NULL;
  m->expert_bias = bias;
  for (int step = 0; step < steps; step++) {
    loom_gpt_moe_stats_reset(m);
    const int64_t first_sample = (int64_t)step * global;
    int64_t scored = 0; /* every micro-batch's grads are weighted alike: count first */
    for (int k = 0; k < micro_steps; k++)
      scored += loom_dataset_batch(data, LOOM_SPLIT_TRAIN, first_sample + (int64_t)k * B, T, B, tokens, targets);
    const float dloss = scored ? 1.0f / (float)scored : 0.0f;
    double loss_sum = 0.0;
    loom_gpt_zero_grad(m);
    for (int k = 0; k < micro_steps; k++) {
      const int64_t first = first_sample + (int64_t)k * B;
      const int64_t counted = loom_dataset_batch(data, LOOM_SPLIT_TRAIN, first, T, B, tokens, targets);
      const loom_gpt_batch batch = {.tokens = tokens, .targets = targets, .sample_offset = first, .step = step,
                                    .train = true};
      loss_sum += (double)loom_gpt_forward(m, &batch) * (double)counted;
      loom_gpt_backward(m, &batch, dloss);
    }
    losses[step] = scored ? (float)(loss_sum / (double)scored) : 0.0f;
    loom_gpt_sync_replicated_grads(m);
    const double norm = loom_grad_norm(&m->p, m->ops, &m->tp);
    if (norms) norms[step] = norm;
    if (isfinite(norm)) loom_adamw_step(opt, &m->p, loom_lr_at(&lr, step), norm, m->ops);
    for (size_t l = 0; bias && l < (size_t)m->p.layers; l++) /* as the trainer steps it, from this step's loads */
      loom_moe_expert_bias_update(bias + l * moe->experts, m->moe_stats.load + l * moe->experts, moe->experts,
                                  moe->bias_update_rate);
  }
  m->expert_bias = NULL;
  free(bias);
  free(tokens);
  free(targets);
}

int tu_each_allocation_failing(loom_status (*attempt)(void *ctx, loom_error *err),
                               void (*judge)(void *ctx, loom_status st, const loom_error *err, int k), void *ctx) {
  for (int k = 1; k < 100000; k++) {
    char spec[32];
    loom_error err = {0};
    snprintf(spec, sizeof spec, "alloc:*:%d", k);
    ck_assert_int_eq(loom_fault_arm(spec, &err), LOOM_OK);
    const loom_status st = attempt(ctx, &err);
    loom_fault_disarm();
    if (st == LOOM_OK) return k - 1;
    ck_assert_msg(strstr(err.msg, "out of memory") && !strchr(err.msg, '\n'), "allocation %d: %s", k, err.msg);
    judge(ctx, st, &err, k);
  }
  ck_abort_msg("still failing after 100000 allocations");
  return 0;
}

void tu_row(tu_rows *t, int ok, const char *fmt, ...) {
  t->rows++;
  if (ok) return;
  t->failed++;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "row %d failed: ", t->rows);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

void tu_rows_done(const tu_rows *t) {
  ck_assert_msg(t->rows > 0 && t->failed == 0, "%d of %d rows failed (each printed above)", t->failed, t->rows);
}

/* ---- the recording allocator ---- */

static tu_recorder *recorder_of(const loom_allocator *mem) { return (tu_recorder *)mem; }
static const loom_allocator *inner_of(const loom_allocator *mem) { return recorder_of(mem)->inner; }

static void *rec_zalloc(const loom_allocator *mem, size_t bytes, const char *what) {
  tu_recorder *r = recorder_of(mem);
  void *p = r->count + 1 == r->fail_at ? NULL : r->inner->zalloc(r->inner, bytes, what);
  if (r->count == r->cap) {
    r->cap = r->cap ? 2 * r->cap : 256;
    r->rows = realloc(r->rows, (size_t)r->cap * sizeof *r->rows);
    ck_assert_ptr_nonnull(r->rows);
  }
  r->rows[r->count++] = (tu_allocation){.what = what ? what : "unnamed", .bytes = bytes, .p = p, .held = p != NULL};
  return p;
}
static void rec_release(const loom_allocator *mem, void *p) {
  tu_recorder *r = recorder_of(mem);
  for (int i = r->count - 1; p && i >= 0; i--)
    if (r->rows[i].p == p && r->rows[i].held) {
      r->rows[i].held = 0;
      break;
    }
  r->inner->release(r->inner, p);
}
static void rec_copy(const loom_allocator *mem, void *dst, const void *src, size_t bytes) {
  inner_of(mem)->copy(inner_of(mem), dst, src, bytes);
}
static void rec_copy_2d(const loom_allocator *mem, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                        size_t width, size_t rows) {
  inner_of(mem)->copy_2d(inner_of(mem), dst, dst_pitch, src, src_pitch, width, rows);
}
static void rec_fill32(const loom_allocator *mem, void *dst, uint32_t pattern, size_t count) {
  inner_of(mem)->fill32(inner_of(mem), dst, pattern, count);
}
static void rec_to_host(const loom_allocator *mem, void *host, const void *src, size_t bytes) {
  inner_of(mem)->to_host(inner_of(mem), host, src, bytes);
}
static void rec_from_host(const loom_allocator *mem, void *dst, const void *host, size_t bytes) {
  inner_of(mem)->from_host(inner_of(mem), dst, host, bytes);
}
static bool rec_owns(const loom_allocator *mem, const void *p) { return inner_of(mem)->owns(inner_of(mem), p); }
static loom_memory_counts rec_counts(const loom_allocator *mem) { return inner_of(mem)->counts(inner_of(mem)); }
static void rec_reset_peak(const loom_allocator *mem) { inner_of(mem)->reset_peak(inner_of(mem)); }

void tu_recorder_init(tu_recorder *r, const loom_ops *base, loom_ops *ops) {
  const loom_allocator *inner = base->mem;
  *r = (tu_recorder){.inner = inner};
  r->base = *inner;
  r->base.zalloc = rec_zalloc, r->base.release = rec_release, r->base.copy = rec_copy, r->base.copy_2d = rec_copy_2d;
  r->base.fill32 = rec_fill32, r->base.to_host = rec_to_host, r->base.from_host = rec_from_host, r->base.owns = rec_owns;
  r->base.counts = rec_counts, r->base.reset_peak = rec_reset_peak;
  *ops = *base;
  ops->mem = &r->base;
}

void tu_recorder_free(tu_recorder *r) {
  free(r->rows);
  r->rows = NULL;
  r->count = r->cap = 0;
}
