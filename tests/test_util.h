/* Helpers shared by loom's Check tests. */
#ifndef LOOM_TEST_UTIL_H
#define LOOM_TEST_UTIL_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>
#include "backend/ops.h"

/* Fills x[n] with uniform values in [lo, hi) from a fixed-seed stream. */
void tu_fill(float *x, size_t n, uint64_t stream, float lo, float hi);
/* The comparisons: a NaN or infinity anywhere in a or b is the worst
 * difference, INFINITY (so `diff <= tol` fails on it), and n must be
 * positive (a check fails on nothing to compare). */
/* Normalised mean squared error ||a - b||^2 / ||b||^2 (||a - b||^2 if b is all zero). */
double tu_nmse(const float *a, const float *b, size_t n);
/* Largest |a - b|. */
double tu_max_abs_diff(const float *a, const float *b, size_t n);
/* Largest |a - b| over b's largest magnitude; b must hold something (a check fails if it is all zero). */
double tu_rel_max_diff(const float *a, const float *b, size_t n);

/* A random sequence of shape s (its q | k | v rows and output grads, from
 * streams seed and seed + 1 in [-1, 1)) and one-rank attention over it on
 * ops (host memory): its output, log-sum-exps and grads. */
typedef struct {
  float *qkv, *dout, *out, *lse, *dqkv;
} tu_attention_case;
tu_attention_case tu_attention_case_new(const loom_ops *ops, const loom_attn_shape *s, const loom_dropout *drop, uint64_t seed);
void tu_attention_case_free(tu_attention_case *c);
/* 1 if every element is finite. */
int tu_all_finite(const float *x, size_t n);
/* An allocator that hands out `inner`'s memory and records every
 * allocation made through it: its name (what the caller told zalloc), its
 * bytes, and whether it is still held. */
typedef struct {
  const char *what;
  size_t bytes;
  void *p;
  int held;
} tu_allocation;
typedef struct {
  loom_allocator base; /* first: the functions find the recorder through it */
  const loom_allocator *inner;
  tu_allocation *rows;
  int count, cap;
  int fail_at; /* the allocation (1, 2, ...) that fails, recorded with p NULL; 0: none */
} tu_recorder;
/* Points ops at a copy of base with its memory the recorder's; free with tu_recorder_free. */
void tu_recorder_init(tu_recorder *r, const loom_ops *base, loom_ops *ops);
void tu_recorder_free(tu_recorder *r);

/* A path under the test's temporary directory, unique per name. */
const char *tu_tmp_path(const char *name);
/* rm -r path. */
void tu_remove_tree(const char *path);
/* Writes bytes to path; aborts the test on failure. */
void tu_write_bytes(const char *path, const void *data, size_t n);
/* Reads a whole file; *n gets its size, and a NUL follows the bytes (text reads as a string). Caller frees. */
void *tu_read_bytes(const char *path, size_t *n);
/* Writes this rank's slice of a whole model's tensors (its params or its
 * grads, `whole_buf`) into out, in the local layout of `local` (which may be
 * a TP shard and/or a pipeline stage). */
#include "layers/gpt_params.h"
void tu_slice_of(const loom_gpt_params *local, const loom_buffer *whole_buf, const loom_gpt_params *whole, float *out);

/* The serial reference every parallel run is held to: `steps` AdamW steps
 * of the whole model m (or its TP shard) with the trainer's rules (global
 * batch `global` as micro-batches of m's batch shape, the loss averaged over
 * every scored target, grads synced over TP replicas, clipped by the global
 * norm), written directly over the layers' forward and backward, not through
 * the runtime. losses[steps] gets each step's loss, and norms[steps] (unless
 * NULL) its grad norm before clipping. */
#include "data/dataset.h"
#include "layers/gpt.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
void tu_train_serial(loom_gpt *m, loom_adamw *opt, loom_dataset *data, int global, loom_lr_schedule lr, int steps,
                     float *losses, double *norms);

/* Runs attempt(ctx) with allocation k (through the fault registry) failing,
 * for k = 1, 2, ... until an attempt succeeds; after each failed one,
 * judge(ctx, st, err, k) checks what it left. Returns how many failed. */
#include "core/status.h"
int tu_each_allocation_failing(loom_status (*attempt)(void *ctx, loom_error *err),
                               void (*judge)(void *ctx, loom_status st, const loom_error *err, int k), void *ctx);

/* A table of cases that reports every failing row, not only the first:
 * tu_row checks one row (printing it when it fails) and goes on;
 * tu_rows_done fails the test if any row failed, or if none ran. */
typedef struct {
  int rows, failed;
} tu_rows;
void tu_row(tu_rows *t, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void tu_rows_done(const tu_rows *t);

/* Runs a suite and returns the process exit code. */
int tu_run(Suite *s);
/* Runs a suite on one MPI rank without forking: rank 0 reports in full, other
 * ranks print only their failures. Returns the number of failures. */
int tu_run_rank(Suite *s, int rank);
/* tu_run_rank on every rank of world, then frees world and finalizes MPI;
 * returns the process exit code, 1 if any rank failed. */
struct loom_comm;
int tu_run_mpi(Suite *s, struct loom_comm *world);

#endif
