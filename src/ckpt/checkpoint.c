/* Sharded checkpoint save, resume onto any plan, and verify. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/assemble.h"
#include "ckpt/checkpoint.h"
#include "ckpt/local_ckpt.h"
#include "ckpt/manifest.h"
#include "core/check.h"
#include "core/log.h"
#include "core/fault.h"
#include "core/crc32c.h"
#include "core/timer.h"

/* A save that failed anywhere leaves latest on the previous step; its
 * partial directory goes, unless latest names it (a step saved before). */
static void discard_partial(const char *dir, const char *sub, int64_t step) {
  int64_t latest;
  loom_error ignored;
  if (loom_ckpt_latest_step(dir, &latest, &ignored) != LOOM_OK || latest != step) loom_ckpt_remove_step(sub);
}

/* One save, from its collective start to its manifest: the state the
 * phases below share (a synchronous save runs them in a row; an
 * asynchronous one writes the shard on a thread between them). */
struct loom_ckpt_async {
  char dir[4096], sub[4096], path[4200];
  int64_t step;
  int keep;
  const loom_parallel *ps;
  loom_local_ckpt *local;    /* a save into host memory (local_ckpt.h), or NULL */
  loom_ckpt_run run;
  int64_t *all;              /* [world * 3] every rank's report */
  loom_shard_binding binding;
  loom_shard_tensor *pieces;
  int count;
  loom_shard_written mine;
  loom_status st;            /* the shard's write */
  loom_error err;
  pthread_t writer;
  bool writing;              /* a writer thread runs (joined at the end) */
  atomic_bool written;       /* the writer finished, well or not */
  double staged_s, write_s;  /* seconds the copy to host took, and the write */
};

static void free_save(loom_ckpt_async *a) {
  free(a->run.expert_bias);
  free(a->run.fp8_scale);
  free(a->run.fp8_history);
  free(a->pieces);
  free(a->all);
  free(a);
}

/* The collective start: every allocation (a rank short of memory fails the
 * vote, before anything is written), the step directory, one save id
 * (rank 0's, which every shard and the manifest carry) and this rank's
 * pieces. NULL on failure, every rank alike. */
static loom_ckpt_async *begin_save(const char *dir, loom_local_ckpt *local, int64_t step, int keep,
                                   const loom_ckpt_chunk *chunks, int n, const loom_parallel *ps, const loom_ckpt_run *run,
                                   loom_status *out, loom_error *err) {
  if (local) dir = local->host_dir;
  loom_ckpt_async *a = loom_fault_calloc(1, sizeof *a);
  loom_status st = a ? LOOM_OK : loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory saving a checkpoint", dir);
  if (a) {
    *a = (loom_ckpt_async){.step = step, .keep = keep, .ps = ps, .local = local, .run = *run};
    /* The bias as of this step (training moves it on while the shard is written). */
    a->run.expert_bias = run->expert_bias_count ? loom_fault_malloc(run->expert_bias_count * sizeof(float)) : NULL;
    if (a->run.expert_bias) memcpy(a->run.expert_bias, run->expert_bias, run->expert_bias_count * sizeof(float));
    else a->run.expert_bias_count = 0;
    /* FP8 delayed scaling's state as of this step, likewise */
    const size_t hist = run->fp8_count * (size_t)run->cfg.fp8.history;
    a->run.fp8_scale = run->fp8_count ? loom_fault_malloc(run->fp8_count * sizeof(float)) : NULL;
    a->run.fp8_history = run->fp8_count ? loom_fault_malloc(hist * sizeof(float)) : NULL;
    if (a->run.fp8_scale && a->run.fp8_history) {
      memcpy(a->run.fp8_scale, run->fp8_scale, run->fp8_count * sizeof(float));
      memcpy(a->run.fp8_history, run->fp8_history, hist * sizeof(float));
    } else if (run->fp8_count) {
      st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory saving a checkpoint", dir);
    }
    snprintf(a->dir, sizeof a->dir, "%s", dir);
    loom_ckpt_step_dir(dir, step, a->sub, sizeof a->sub);
    a->pieces = loom_fault_calloc((size_t)loom_ckpt_max_pieces(chunks, n) + 1, sizeof *a->pieces);
    a->all = loom_fault_calloc((size_t)ps->world * 3, sizeof(int64_t));
    if (!a->pieces || !a->all || a->run.expert_bias_count != run->expert_bias_count) st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory saving a checkpoint", a->sub);
  }
  /* A persistent checkpoint's directory is shared, made by rank 0; a local one is each host's own. */
  if (st == LOOM_OK && (ps->rank == 0 || local)) st = loom_ckpt_make_dir(dir, err);
  if (st == LOOM_OK && (ps->rank == 0 || local)) st = loom_ckpt_make_dir(a->sub, err);
  int32_t bad = st != LOOM_OK;
  loom_comm_allreduce_typed(ps->world_group, &bad, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX); /* the directory exists before anyone writes */
  if (bad) {
    if (a && ps->rank == 0 && !local) discard_partial(dir, a->sub, step);
    if (a) free_save(a);
    *out = st != LOOM_OK ? st : loom_fail_elsewhere(err, LOOM_ERR_WRITE, 0, "start the checkpoint");
    return NULL;
  }
  int64_t save_id = ps->rank == 0 ? (int64_t)loom_ckpt_fresh_save_id() : 0;
  loom_comm_broadcast_typed(ps->world_group, &save_id, 1, LOOM_DTYPE_I64, 0);
  a->binding = (loom_shard_binding){(uint64_t)save_id, step, ps->rank};
  loom_ckpt_shard_path(a->sub, ps->rank, a->path, sizeof a->path);
  /* One writer of each replicated piece: the first of the ranks holding the same parameters (dp x cp). */
  a->count = loom_ckpt_save_pieces(chunks, n, ps->dp_cp_rank, ps->edp_rank, run->zero >= 1, a->pieces);
  *out = LOOM_OK;
  return a;
}

static void write_shard(loom_ckpt_async *a) {
  const double t0 = loom_now_s();
  a->st = loom_shard_file_write(a->path, &a->binding, a->pieces, a->count, &a->mine.bytes, &a->mine.crc32c, &a->err);
  a->write_s = loom_now_s() - t0;
}

/* The collective end: every rank reports success, size and checksum (as
 * exact 64-bit integers); rank 0 then writes the manifest and moves latest;
 * a failure anywhere leaves latest on the previous step. Frees a. */
static loom_status end_save(loom_ckpt_async *a, int64_t *total_bytes, loom_error *err) {
  const loom_parallel *ps = a->ps;
  loom_status st = a->st;
  if (st != LOOM_OK) *err = a->err;
  if (a->local) {
    st = loom_local_ckpt_record(a->local, a->sub, a->step, a->binding.save_id, &a->run, st, a->mine, total_bytes, err);
    free_save(a);
    return st;
  }
  /* A test fault: this rank dies here, its shard written and the manifest
   * not, as a node lost mid-save would. */
  if (loom_fault_fires(LOOM_FAULT_KILL_IN_SAVE, a->step, NULL)) abort();
  const int64_t report[3] = {st == LOOM_OK, a->mine.crc32c, a->mine.bytes};
  loom_comm_allgather_typed(ps->world_group, report, a->all, 3, LOOM_DTYPE_I64);
  int failed = -1; /* the first rank that could not write its shard */
  *total_bytes = 0;
  for (int r = 0; r < ps->world; r++) {
    if (a->all[3 * r] != 1 && failed < 0) failed = r;
    *total_bytes += a->all[3 * r + 2];
  }
  if (st == LOOM_OK && failed >= 0) st = loom_fail_elsewhere(err, LOOM_ERR_WRITE, failed, "write its shard; checkpoint not recorded");
  if (st == LOOM_OK && ps->rank == 0) {
    loom_shard_written *shards = loom_fault_calloc((size_t)ps->world, sizeof *shards);
    for (int r = 0; shards && r < ps->world; r++) {
      shards[r].bytes = a->all[3 * r + 2];
      shards[r].crc32c = (uint32_t)a->all[3 * r + 1];
    }
    st = shards ? loom_manifest_publish(a->dir, a->step, a->binding.save_id, &a->run, shards, ps->world, a->keep, err)
                : loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory writing the manifest", a->sub);
    free(shards);
  }
  int32_t bad = st != LOOM_OK;
  loom_comm_allreduce_typed(ps->world_group, &bad, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX); /* nobody goes on before the manifest */
  if (st == LOOM_OK && bad) st = loom_fail_elsewhere(err, LOOM_ERR_WRITE, 0, "record the checkpoint");
  if (bad && ps->rank == 0) discard_partial(a->dir, a->sub, a->step);
  free_save(a);
  return st;
}

loom_status loom_ckpt_save(const char *dir, int64_t step, int keep, const loom_ckpt_chunk *chunks, int n,
                           const loom_parallel *ps, const loom_ckpt_run *run, int64_t *total_bytes, loom_error *err) {
  loom_status st;
  loom_ckpt_async *a = begin_save(dir, NULL, step, keep, chunks, n, ps, run, &st, err);
  if (!a) return st;
  loom_ckpt_staging staging;
  a->st = loom_ckpt_stage(&staging, chunks[0].p->params.alloc, a->pieces, sizeof *a->pieces, a->count, true, &a->err);
  if (a->st == LOOM_OK) write_shard(a);
  loom_ckpt_unstage(&staging, false);
  return end_save(a, total_bytes, err);
}

/* ---- asynchronous saves ---- */

static void *writer_main(void *arg) {
  loom_ckpt_async *a = arg;
  write_shard(a);
  atomic_store(&a->written, true);
  return NULL;
}

void loom_ckpt_arena_free(loom_ckpt_arena *arena) {
  free(arena->data);
  *arena = (loom_ckpt_arena){0};
}

/* Copies every piece's values into the arena, LOOM_CKPT_STAGE_BYTES at a
 * time (a GPU's pinned staging stays bounded), and points the pieces at the
 * copies: the model may change from here on. */
static loom_status snapshot(loom_ckpt_async *a, const loom_allocator *mem, loom_ckpt_arena *arena, loom_error *err) {
  const double t0 = loom_now_s();
  size_t floats = 0;
  for (int i = 0; i < a->count; i++) floats += (size_t)a->pieces[i].count;
  if (floats > arena->floats) {
    loom_ckpt_arena_free(arena);
    arena->data = loom_fault_malloc(floats * sizeof(float));
    if (!arena->data) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory staging the checkpoint (%.3f GB)", a->sub,
                                       (double)floats * 4e-9);
    arena->floats = floats;
  }
  float *at = arena->data;
  for (int i = 0; i < a->count; i++) {
    loom_shard_tensor *t = &a->pieces[i];
    const size_t bytes = (size_t)t->count * sizeof(float);
    if (i == a->count / 2 && loom_fault_fires(LOOM_FAULT_KILL_IN_STAGE, a->step, NULL)) abort();
    for (size_t done = 0; done < bytes; done += LOOM_CKPT_STAGE_BYTES) {
      const size_t part = bytes - done < LOOM_CKPT_STAGE_BYTES ? bytes - done : LOOM_CKPT_STAGE_BYTES;
      if (mem->host_addressable) memcpy((char *)at + done, (const char *)t->data + done, part);
      else mem->to_host(mem, (char *)at + done, (const char *)t->data + done, part);
    }
    t->data = at;
    at += t->count;
  }
  a->staged_s = loom_now_s() - t0;
  return LOOM_OK;
}

static loom_status async_begin(loom_ckpt_async **out, const char *dir, loom_local_ckpt *local, int64_t step, int keep,
                               const loom_ckpt_chunk *chunks, int n, const loom_parallel *ps, const loom_ckpt_run *run,
                               loom_ckpt_arena *arena, loom_error *err) {
  loom_status st;
  *out = NULL;
  loom_ckpt_async *a = begin_save(dir, local, step, keep, chunks, n, ps, run, &st, err);
  if (!a) return st;
  a->st = snapshot(a, chunks[0].p->params.alloc, arena, &a->err);
  if (a->st == LOOM_OK && pthread_create(&a->writer, NULL, writer_main, a) == 0) a->writing = true;
  else if (a->st == LOOM_OK) a->st = loom_fail(&a->err, LOOM_ERR_RUNTIME, "%s: cannot start the checkpoint writer thread", a->sub);
  if (!a->writing) atomic_store(&a->written, true); /* nothing to wait for: the end reports the failure */
  *out = a;
  return LOOM_OK;
}

loom_status loom_ckpt_async_begin(loom_ckpt_async **out, const char *dir, int64_t step, int keep,
                                  const loom_ckpt_chunk *chunks, int n, const loom_parallel *ps, const loom_ckpt_run *run,
                                  loom_ckpt_arena *arena, loom_error *err) {
  return async_begin(out, dir, NULL, step, keep, chunks, n, ps, run, arena, err);
}

loom_status loom_ckpt_async_begin_local(loom_ckpt_async **out, loom_local_ckpt *local, int64_t step,
                                        const loom_ckpt_chunk *chunks, int n, const loom_parallel *ps,
                                        const loom_ckpt_run *run, loom_ckpt_arena *arena, loom_error *err) {
  return async_begin(out, NULL, local, step, 0, chunks, n, ps, run, arena, err);
}

void loom_ckpt_async_abandon(loom_ckpt_async **pa) {
  loom_ckpt_async *a = *pa;
  if (!a) return;
  if (a->writing) pthread_join(a->writer, NULL);
  free_save(a);
  *pa = NULL;
}

loom_status loom_ckpt_async_finish(loom_ckpt_async **pa, bool blocking, loom_ckpt_async_report *report, loom_error *err) {
  loom_ckpt_async *a = *pa;
  *report = (loom_ckpt_async_report){0};
  if (!a) return LOOM_OK;
  if (!blocking) { /* every rank's writer done, or no rank settles yet */
    int32_t busy = !atomic_load(&a->written);
    loom_comm_allreduce_typed(a->ps->world_group, &busy, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
    if (busy) return LOOM_OK;
  }
  if (a->writing) pthread_join(a->writer, NULL);
  *report = (loom_ckpt_async_report){.done = true, .step = a->step, .staged_s = a->staged_s, .write_s = a->write_s};
  *pa = NULL;
  return end_save(a, &report->bytes, err);
}

/* Refuses a checkpoint this run cannot continue: another model, or a
 * different data position, seed or learning-rate schedule. */
loom_status loom_ckpt_check_model(const char *where, const loom_gpt_config *m, const loom_gpt_config *c, const char *theirs,
                                  loom_error *err) {
  if (loom_gpt_config_same_model(m, c)) return LOOM_OK;
  char mine[256], other[256];
  return loom_fail(err, LOOM_ERR_FORMAT, "%s: checkpoint of another model (%s); %s has %s", where,
                   loom_gpt_config_describe(m, mine, sizeof mine), theirs, loom_gpt_config_describe(c, other, sizeof other));
}

static loom_status check_run(const char *sub, const loom_ckpt_run *have, const loom_ckpt_run *want, loom_error *err) {
  const loom_status st = loom_ckpt_check_model(sub, &have->cfg, &want->cfg, "this run", err);
  if (st != LOOM_OK) return st;
  if (have->global_batch != want->global_batch)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: trained with global batch %d; resume with the same (this run has %d)", sub,
                     have->global_batch, want->global_batch);
  if (have->seed != want->seed)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: trained with --seed %llu; resume with the same (this run has %llu)", sub,
                     (unsigned long long)have->seed, (unsigned long long)want->seed);
  if (have->lr.max_lr != want->lr.max_lr || have->lr.min_lr != want->lr.min_lr || have->lr.warmup_steps != want->lr.warmup_steps)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: trained with --lr %g (min %g, warmup %d); resume with the same schedule", sub,
                     (double)have->lr.max_lr, (double)have->lr.min_lr, have->lr.warmup_steps);
  if (have->lr.decay != want->lr.decay ||
      (have->lr.decay == LOOM_LR_WSD && (have->lr.wsd_decay_steps != want->lr.wsd_decay_steps ||
                                         have->lr.wsd_shape != want->lr.wsd_shape)))
    return loom_fail(err, LOOM_ERR_USAGE, "%s: trained with --lr-decay-style %s%s%s; resume with the same schedule", sub,
                     LOOM_LR_DECAY_NAMES[have->lr.decay], have->lr.decay == LOOM_LR_WSD ? " and " : "",
                     have->lr.decay == LOOM_LR_WSD ? LOOM_WSD_SHAPE_NAMES[have->lr.wsd_shape] : "");
  return LOOM_OK;
}

/* Whether the checkpoint's grad compression state (from `have`) resumes
 * into this run (`want`): the same method over the same layout. Where it
 * does not, a line says what starts fresh or is dropped, and why. */
static bool compression_resumes(const char *sub, int64_t step, const loom_ckpt_run *have, const loom_ckpt_run *want) {
  const bool held = have->compression_layout != NULL, wanted = want->compression_layout != NULL;
  const bool powersgd = want->compression_kind == LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD;
  const char *state = powersgd ? "PowerSGD's error feedback and warm start" : "the sign method's error feedback";
  if (!wanted) {
    if (held) loom_log_info("%s: its grad compression state is dropped: this run compresses no grads", sub);
    return false;
  }
  if (held && have->compression_kind == want->compression_kind && have->compression_rank == want->compression_rank &&
      strcmp(have->compression_layout, want->compression_layout) == 0)
    return true;
  if (!held)
    loom_log_info("resume: %s begin fresh at step %lld: %s holds none (saved without grad compression, or resharded)",
                  state, (long long)step + 1, sub);
  else if (have->compression_kind != want->compression_kind || have->compression_rank != want->compression_rank)
    loom_log_info("resume: %s begin fresh at step %lld: %s was saved under another compression method", state,
                  (long long)step + 1, sub);
  else
    loom_log_info("resume: %s begin fresh at step %lld: %s was saved by %s, and this run is %s (each rank's state is its "
                  "own, so only the same layout resumes it)", state, (long long)step + 1, sub, have->compression_layout,
                  want->compression_layout);
  return false;
}

/* Fills chunks from the checkpoint mf describes and sets their steps. */
static loom_status load_chunks(const char *sub, const Loom__CheckpointManifest *mf, const loom_ckpt_chunk *chunks, int n,
                               loom_error *err) {
  loom_ckpt_want *want = calloc((size_t)loom_ckpt_max_pieces(chunks, n) + 1, sizeof *want);
  const int count = loom_ckpt_load_pieces(chunks, n, want);
  loom_want_index *ix = loom_want_index_build(want, count);
  char **paths;
  int npaths;
  loom_status st = loom_manifest_paths(sub, mf, ix, &paths, &npaths, err); /* only the files holding our pieces */
  loom_ckpt_staging staging = {0};
  if (st == LOOM_OK) st = loom_ckpt_stage(&staging, chunks[0].p->params.alloc, &want[0].t, sizeof *want, count, false, err);
  if (st == LOOM_OK) st = loom_ckpt_assemble(sub, paths, npaths, want, count, err);
  loom_ckpt_unstage(&staging, st == LOOM_OK);
  for (int c = 0; c < n && st == LOOM_OK; c++)
    if (chunks[c].step) *chunks[c].step = (int)mf->step;
  loom_want_index_free(ix);
  free(want);
  if (paths) loom_manifest_paths_free(paths, mf->n_shards);
  return st;
}

loom_status loom_ckpt_resume(const char *dir, const loom_ckpt_chunk *chunks, int n, const loom_ckpt_run *run,
                             loom_ckpt_run *from, int64_t *step, loom_error *err) {
  char sub[4096];
  Loom__CheckpointManifest *mf;
  loom_status st = loom_manifest_read(dir, sub, sizeof sub, &mf, err);
  if (st != LOOM_OK) return st;
  loom_manifest_run(mf, from);
  st = check_run(sub, from, run, err);
  if (st == LOOM_OK) st = loom_manifest_expert_bias(sub, mf, run->expert_bias, run->expert_bias_count, err);
  if (st == LOOM_OK) st = loom_manifest_fp8(sub, mf, run, err);
  /* Grad compression's state loads only into the layout and method that saved it; otherwise the chunks load without it. */
  loom_ckpt_chunk *fresh = NULL;
  if (st == LOOM_OK && !compression_resumes(sub, mf->step, from, run)) {
    fresh = loom_fault_calloc((size_t)n + 1, sizeof *fresh);
    if (!fresh) st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", sub);
    for (int c = 0; fresh && c < n; c++) fresh[c] = chunks[c], fresh[c].compress = NULL;
  }
  if (st == LOOM_OK) st = load_chunks(sub, mf, fresh ? fresh : chunks, n, err);
  free(fresh);
  *step = mf->step;
  from->data = NULL, from->expert_bias = NULL, from->compression_layout = NULL; /* they pointed into mf */
  from->fp8_scale = from->fp8_history = NULL, from->fp8_count = 0;
  loom__checkpoint_manifest__free_unpacked(mf, NULL);
  return st;
}

/* Elements stored of each tensor name, to check that the pieces tile it. */
typedef struct {
  char name[96];
  int64_t stored, global;
} tally;

static void count_piece(tally **t, int *n, const loom_shard_tensor *p) {
  int i = 0;
  while (i < *n && strcmp((*t)[i].name, p->name) != 0) i++;
  if (i == *n) {
    *t = realloc(*t, (size_t)(*n + 1) * sizeof **t);
    memset(&(*t)[i], 0, sizeof **t);
    snprintf((*t)[i].name, sizeof (*t)[i].name, "%s", p->name);
    (*t)[i].global = 1;
    for (int d = 0; d < p->ndim; d++) (*t)[i].global *= p->global[d];
    (*n)++;
  }
  (*t)[i].stored += p->count;
}

/* The shards against the model the manifest describes: every tensor they
 * hold is one of its parameters (or that parameter's optimizer state) at
 * its global size, and every parameter is there (a manifest re-sealed over
 * another model's shards is caught here, not at load). */
static loom_status match_model(const char *sub, const Loom__CheckpointManifest *mf, const tally *t, int nt, loom_error *err) {
  loom_ckpt_run run;
  loom_manifest_run(mf, &run);
  /* Global shapes as the writing layout padded them (the vocabulary to a multiple of its tp). */
  const loom_gpt_config cfg = loom_gpt_config_for_tp(&run.cfg, run.tp);
  const int n = loom_gpt_param_table(&cfg, NULL, 0, run.tp, NULL, NULL);
  loom_tensor *specs = loom_fault_calloc((size_t)n + 1, sizeof *specs);
  loom_param_meta *meta = loom_fault_calloc((size_t)n + 1, sizeof *meta);
  loom_status st = specs && meta ? LOOM_OK : loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", sub);
  if (st == LOOM_OK) loom_gpt_param_table(&cfg, NULL, 0, run.tp, specs, meta);
  for (int i = 0; st == LOOM_OK && i < nt; i++) {
    if (strncmp(t[i].name, LOOM_CKPT_COMPRESSION_PREFIX, strlen(LOOM_CKPT_COMPRESSION_PREFIX)) == 0) continue; /* not a parameter's */
    const char *slash = strchr(t[i].name, '/'), *name = slash ? slash + 1 : t[i].name;
    int k = 0;
    while (k < n && strcmp(specs[k].name, name) != 0) k++;
    if (k == n)
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s is not part of the model the manifest describes", sub, t[i].name);
    else if (t[i].global != meta[k].layout.rows * meta[k].layout.cols)
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s: the shards hold %lld elements of it; the manifest's model "
                     "(hidden %d, %d layers, vocab %d) has %lld", sub, t[i].name, (long long)t[i].global, run.cfg.hidden,
                     run.cfg.layers, run.cfg.vocab, (long long)(meta[k].layout.rows * meta[k].layout.cols));
  }
  for (int k = 0; st == LOOM_OK && k < n; k++) {
    char want[128];
    snprintf(want, sizeof want, "param/%s", specs[k].name);
    int i = 0;
    while (i < nt && strcmp(t[i].name, want) != 0) i++;
    if (i == nt) st = loom_fail(err, LOOM_ERR_FORMAT, "%s: the shards hold no %s, which the manifest's model has", sub, want);
  }
  free(specs);
  free(meta);
  return st;
}

loom_status loom_ckpt_verify(const char *dir, int *shards, int *tensors, loom_error *err) {
  char sub[4096];
  Loom__CheckpointManifest *mf;
  *shards = *tensors = 0;
  loom_status st = loom_manifest_read(dir, sub, sizeof sub, &mf, err);
  if (st != LOOM_OK) return st;
  char **paths;
  int npaths;
  st = loom_manifest_paths(sub, mf, NULL, &paths, &npaths, err);
  tally *t = NULL;
  int nt = 0;
  for (int i = 0; st == LOOM_OK && i < npaths; i++) {
    loom_shard_file f;
    st = loom_shard_file_read(paths[i], &f, err);
    if (st != LOOM_OK) break;
    const uint32_t crc = loom_crc32c_file(paths[i]);
    if (crc != mf->shards[i]->crc32c)
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: checksum %08x, the manifest says %08x: the shard is damaged", paths[i], crc,
                     mf->shards[i]->crc32c);
    for (int k = 0; k < f.count; k++) count_piece(&t, &nt, &f.tensors[k]);
    *tensors += f.count;
    *shards += st == LOOM_OK;
    loom_shard_file_free(&f);
  }
  for (int i = 0; st == LOOM_OK && i < nt; i++)
    if (t[i].stored != t[i].global)
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s: the shards hold %lld of its %lld elements", sub, t[i].name,
                     (long long)t[i].stored, (long long)t[i].global);
  if (st == LOOM_OK) st = match_model(sub, mf, t, nt, err);
  free(t);
  if (paths) loom_manifest_paths_free(paths, mf->n_shards);
  loom__checkpoint_manifest__free_unpacked(mf, NULL);
  return st;
}
