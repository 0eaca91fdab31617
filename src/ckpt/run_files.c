/* Model files and checkpoints of a training run. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include "ckpt/llmc_model.h"
#include "ckpt/local_ckpt.h"
#include "ckpt/manifest.h"
#include "ckpt/model_source.h"
#include "ckpt/run_files.h"
#include "ckpt/export.h"
#include "core/check.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/read_file.h"
#include "core/timer.h"
#include "plan/memory.h"

#define LOCK_FILE ".lock"

void loom_run_files_init(loom_run_files *f, loom_trainer *tr, const char *dir, int keep, uint64_t seed, const char *data) {
  const int v = loom_pipeline_chunk_count(tr->pipe);
  *f = (loom_run_files){.tr = tr, .dir = dir, .keep = keep};
  f->chunks = loom_xcalloc((size_t)v, sizeof *f->chunks, "checkpoint chunks");
  for (int c = 0; c < v; c++) {
    loom_gpt_params *p = &loom_pipeline_chunk(tr->pipe, c)->p;
    f->chunks[c] = tr->zero   ? loom_ckpt_chunk_zero(p, &tr->zero[c])
                   : tr->opts ? loom_ckpt_chunk_adamw(p, &tr->opts[c])
                              : (loom_ckpt_chunk){.p = p}; /* no optimizer */
    f->chunks[c].compress = loom_pipeline_compression_state(tr->pipe, c);
    f->chunks[c].rank = tr->ps.rank;
  }
  const loom_plan *plan = tr->plan;
  f->run = (loom_ckpt_run){.tp = tr->ps.tp, .pp = tr->ps.pp, .dp = tr->ps.dp, .vpp = v, .zero = plan->parallel->zero_stage,
                           .micro_batch = tr->micro_batch, .global_batch = tr->global_batch, .seed = seed, .lr = tr->lr,
                           .data = data, .expert_bias = tr->expert_bias, .expert_bias_count = tr->expert_bias_count,
                           .fp8_scale = tr->fp8_scale, .fp8_history = tr->fp8_history, .fp8_count = tr->fp8_count};
  loom_plan_model_config(plan, &f->run.cfg);
  const loom_compression *gc = loom_pipeline_compression(tr->pipe);
  if (gc) { /* every coordinate that says which rank holds which state */
    const Loom__Parallel *l = plan->parallel;
    snprintf(f->compression_layout, sizeof f->compression_layout, "tp %d cp %d dp %d pp %d vpp %d ep %d etp %d zero %d order %d",
             l->tp, l->cp, l->dp, l->pp, l->virtual_chunks, l->ep, l->etp, l->zero_stage, (int)l->rank_order);
    f->run.compression_kind = gc->kind, f->run.compression_rank = gc->rank, f->run.compression_layout = f->compression_layout;
  }
}

void loom_run_files_free(loom_run_files *f) {
  loom_ckpt_async_abandon(&f->pending);
  loom_ckpt_async_abandon(&f->local_pending);
  if (f->local) loom_local_ckpt_free(f->local, f->finished);
  free(f->local);
  f->local = NULL;
  loom_ckpt_arena_free(&f->local_arena);
  if (f->locked) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", f->dir, LOCK_FILE);
    unlink(path);
    close(f->lock_fd);
    f->locked = false;
  }
  loom_ckpt_arena_free(&f->arena);
  free(f->chunks);
  f->chunks = NULL;
}

/* Every rank's verdict: a failing rank keeps its own message; the others
 * fail too, quietly, naming the first rank that failed (loom_report). */
static loom_status agree(const loom_run_files *f, loom_status st, const char *what, loom_error *err) {
  const loom_parallel *ps = &f->tr->ps;
  int32_t first = st != LOOM_OK ? -ps->rank : -ps->world; /* the lowest failing rank, as a max */
  loom_comm_allreduce_typed(ps->world_group, &first, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  if (st != LOOM_OK || -first == ps->world) return st;
  return loom_fail_elsewhere(err, LOOM_ERR_IO, -first, what);
}

/* The parameters of this rank's chunks, without optimizer state. */
static loom_ckpt_chunk *param_chunks(const loom_run_files *f) {
  const int v = loom_pipeline_chunk_count(f->tr->pipe);
  loom_ckpt_chunk *p = loom_fault_calloc((size_t)v, sizeof *p);
  for (int c = 0; p && c < v; c++) {
    const loom_ckpt_chunk *all = &f->chunks[c];
    p[c] = all->master ? (loom_ckpt_chunk){.p = all->p, .master = all->master, .runs = all->runs, .nruns = all->nruns}
                       : (loom_ckpt_chunk){.p = all->p};
  }
  return p;
}

static loom_status load_model_file(const loom_run_files *f, const char *path, loom_error *err) {
  loom_model_source src;
  loom_status st = loom_model_file_source(&src, path, err);
  if (st != LOOM_OK) return st;
  if ((st = loom_llmc_check_model(path, &src.cfg, &f->run.cfg, err)) != LOOM_OK) {
    loom_model_source_free(&src);
    return st;
  }
  loom_ckpt_chunk *chunks = param_chunks(f);
  const int v = loom_pipeline_chunk_count(f->tr->pipe);
  loom_ckpt_want *want = chunks ? loom_fault_calloc((size_t)loom_ckpt_max_pieces(chunks, v) + 1, sizeof *want) : NULL;
  loom_piece_source pieces = {0};
  loom_assembly *fill = NULL;
  if (!want) st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
  if (st == LOOM_OK) st = loom_model_source_pieces(&src, path, &pieces, err);
  loom_ckpt_staging staging = {0};
  if (st == LOOM_OK) {
    const int count = loom_ckpt_load_pieces(chunks, v, want);
    st = loom_ckpt_stage(&staging, chunks[0].p->params.alloc, &want[0].t, sizeof *want, count, false, err);
    fill = st == LOOM_OK ? loom_assembly_begin(want, count) : NULL;
    if (st == LOOM_OK && !fill) st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
  }
  if (fill) {
    st = loom_assembly_add(fill, &pieces, err);
    st = loom_assembly_finish(fill, st, path, err);
  }
  loom_ckpt_unstage(&staging, st == LOOM_OK);
  if (st == LOOM_OK) st = loom_model_source_expert_bias(&src, path, f->tr->expert_bias, f->tr->expert_bias_count, err);
  loom_model_source_pieces_free(&pieces);
  free(want);
  free(chunks);
  loom_model_source_free(&src);
  return st;
}

loom_status loom_run_init_from(loom_run_files *f, const char *path, loom_error *err) {
  const loom_status st = agree(f, load_model_file(f, path, err), "load --init-from", err);
  if (st == LOOM_OK) loom_trainer_publish_weights(f->tr);
  return st;
}

/* Rank 0 makes the directory and writes and removes a file in it. */
static loom_status probe_dir(const char *dir, loom_error *err) {
  loom_status st = loom_ckpt_make_dir(dir, err);
  if (st != LOOM_OK) return st;
  char path[4200];
  snprintf(path, sizeof path, "%s/.loom_probe_%d", dir, (int)getpid());
  FILE *fp = fopen(path, "w");
  const bool ok = fp && fputc('x', fp) != EOF;
  int why = errno; /* before unlink's own errno */
  if (fp && fclose(fp) != 0) st = LOOM_ERR_IO, why = errno;
  unlink(path);
  if (!ok || st != LOOM_OK)
    return loom_fail(err, LOOM_ERR_IO, "--ckpt %s: cannot write there (%s); checkpoints would fail after hours of training",
                     dir, loom_errno_words(why));
  return LOOM_OK;
}

/* Two runs on one directory would overwrite each other's steps and latest:
 * the first holds an exclusive flock for its life (the kernel drops it when
 * the process ends, however it ends); the second is refused, told who holds it. */
static loom_status lock_dir(loom_run_files *f, loom_error *err) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", f->dir, LOCK_FILE);
  const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return loom_fail(err, LOOM_ERR_IO, "--ckpt %s: cannot open %s: %s", f->dir, path, strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    char holder[256] = "";
    const ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
    holder[n > 0 ? n : 0] = '\0';
    holder[strcspn(holder, "\n")] = '\0';
    close(fd);
    if (e == EWOULDBLOCK)
      return loom_fail(err, LOOM_ERR_USAGE, "--ckpt %s: another run holds this checkpoint directory (%s); two runs on one "
                       "directory would overwrite each other's steps", f->dir, *holder ? holder : "its holder unnamed");
    return loom_fail(err, LOOM_ERR_IO, "--ckpt %s: cannot lock %s: %s", f->dir, path, strerror(e));
  }
  char host[128] = "?", line[256];
  gethostname(host, sizeof host - 1);
  const int len = snprintf(line, sizeof line, "loom train, pid %d on %s\n", (int)getpid(), host);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len) {
    /* The lock holds without its note; a refused run then says its holder is unnamed. */
  }
  f->locked = true, f->lock_fd = fd;
  return LOOM_OK;
}

loom_status loom_run_check_dir(loom_run_files *f, loom_error *err) {
  loom_status st = f->tr->ps.rank == 0 ? probe_dir(f->dir, err) : LOOM_OK;
  if (st == LOOM_OK && f->tr->ps.rank == 0) st = lock_dir(f, err);
  return agree(f, st, "reach the checkpoint directory", err);
}

/* The in-memory copies of this host's ranks against the space free where they go (tmpfs: host memory). */
static loom_status check_local_space(const loom_run_files *f, loom_error *err) {
  const loom_local_ckpt *l = f->local;
  int ranks = 0;
  for (int r = 0; r < f->tr->ps.world; r++) ranks += l->host_of[r] == l->host;
  const double shard = loom_plan_checkpoint_shard_bytes(f->tr->plan);
  const double need = ranks * loom_local_ckpt_host_bytes(shard);
  struct statvfs fs;
  if (statvfs(l->host_dir, &fs) != 0) return LOOM_OK; /* nothing to judge by */
  const double free_bytes = (double)fs.f_bavail * (double)fs.f_frsize;
  if (f->tr->ps.rank == 0)
    loom_log_info("local checkpoints: %.3g GB of host memory on each host (%d ranks x %.0f copies of a shard of %.3g GB: "
                  "its own and a peer's for %d steps kept and one being written, and the staging copy); %.3g GB free in %s",
                  need / 1e9, ranks, loom_local_ckpt_host_bytes(1.0), shard / 1e9, LOOM_LOCAL_KEEP, free_bytes / 1e9, l->root);
  if (need <= free_bytes) return LOOM_OK;
  return loom_fail(err, LOOM_ERR_USAGE, "--local-dir %s: the in-memory checkpoints need %.3g GB on this host (%d ranks x "
                   "%.0f copies of a %.3g GB shard) and it has %.3g GB free; name a --local-dir with room for them", l->root, need / 1e9, ranks, loom_local_ckpt_host_bytes(1.0),
                   shard / 1e9, free_bytes / 1e9);
}

loom_status loom_run_local_init(loom_run_files *f, const char *root, loom_error *err) {
  f->local = loom_fault_calloc(1, sizeof *f->local);
  loom_status st = agree(f, f->local ? LOOM_OK : loom_fail(err, LOOM_ERR_NOMEM, "--local-dir: out of memory"),
                         "set up local checkpoints", err);
  if (st == LOOM_OK) st = loom_local_ckpt_init(f->local, root, &f->tr->ps, err);
  if (st == LOOM_OK) st = agree(f, check_local_space(f, err), "fit its in-memory checkpoints", err);
  return st;
}

/* Where a resume loads from: the persistent checkpoint's step and, with
 * local checkpoints, the newest complete in-memory set's (-1: none). */
static loom_status choose_source(loom_run_files *f, int64_t *persistent, int64_t *local, loom_error *err) {
  loom_error none;
  *persistent = *local = -1;
  if (loom_ckpt_latest_step(f->dir, persistent, &none) != LOOM_OK) *persistent = -1;
  int64_t lowest = *persistent; /* every rank must see the same latest */
  loom_comm_allreduce_typed(f->tr->ps.world_group, &lowest, 1, LOOM_DTYPE_I64, LOOM_REDUCE_MAX);
  *persistent = lowest;
  return f->local ? loom_local_ckpt_newest(f->local, &f->run, local, err) : LOOM_OK;
}

loom_status loom_run_resume(loom_run_files *f, int64_t *first, loom_error *err) {
  const double t0 = loom_now_s();
  loom_ckpt_run from;
  const int v = loom_pipeline_chunk_count(f->tr->pipe);
  int64_t persistent = -1, local = -1;
  loom_status st = choose_source(f, &persistent, &local, err);
  if (st != LOOM_OK) return st;
  const bool from_memory = local >= 0 && local >= persistent;
  if (f->local && !from_memory && persistent >= 0)
    loom_log_info("resume: %s; loading the persistent checkpoint at step %lld", local < 0 ? "no complete set of in-memory "
                  "copies at this layout" : "the in-memory copies are older", (long long)persistent);
  if (f->local && local < 0 && persistent < 0) {
    loom_log_info("resume: no checkpoint yet, in memory or in %s: training starts at step 1", f->dir);
    *first = 0;
    return LOOM_OK;
  }
  if (from_memory) {
    st = loom_local_ckpt_restore(f->local, local, f->chunks, v, &f->run, &from, err);
    *first = local;
    if (st == LOOM_OK) loom_local_ckpt_log_sources(f->local, local, persistent);
  } else {
    st = agree(f, loom_ckpt_resume(f->dir, f->chunks, v, &f->run, &from, first, err), "load the checkpoint", err);
  }
  if (st != LOOM_OK) return st;
  loom_trainer_publish_weights(f->tr);
  const double dt = loom_now_s() - t0;
  double gb = (double)loom_ckpt_load_bytes(f->chunks, v) / 1e9;
  loom_comm_allreduce_typed(f->tr->ps.world_group, &gb, 1, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
  const loom_ckpt_run *ck = &f->run;
  if (from.tp != ck->tp || from.pp != ck->pp || from.dp != ck->dp || from.vpp != ck->vpp || from.zero != ck->zero)
    loom_log_info("resharding: the checkpoint was written by tp %d x pp %d x dp %d (vpp %d, zero %d); loaded by global offsets",
                  from.tp, from.pp, from.dp, from.vpp, from.zero);
  loom_log_info("resumed from %s%s at step %lld: %.3f GB into all ranks in %.2f s (%.2f GB/s)",
                from_memory ? "the in-memory copies" : f->dir, from_memory ? "" : "/latest", (long long)*first, gb, dt, gb / dt);
  const loom_lr_schedule *was = &from.lr, *now = &ck->lr;
  if (was->total_steps != now->total_steps && *first < now->total_steps)
    loom_log_info("--steps %d where the checkpoint's run had %d: the cosine schedule now ends at step %d, so the learning "
                  "rate at step %lld is %.3g (it would have been %.3g)", now->total_steps, was->total_steps,
                  now->total_steps, (long long)*first + 1, (double)loom_lr_at(now, (int)*first),
                  (double)loom_lr_at(was, (int)*first));
  if (*first >= now->total_steps)
    loom_log_info("nothing to train: the checkpoint is at step %lld and --steps is %d (it counts from the start of "
                  "training; raise it to train on)", (long long)*first, now->total_steps);
  return LOOM_OK;
}

/* Records the local save in flight once every rank's shard is written. */
static loom_status settle_local(loom_run_files *f, bool blocking, loom_error *err) {
  if (!f->local_pending) return LOOM_OK;
  loom_ckpt_async_report r;
  const loom_status st = loom_ckpt_async_finish(&f->local_pending, blocking, &r, err);
  if (st == LOOM_OK && r.done)
    loom_log_info("local checkpoint step %lld: %.3f GB in host memory (%s/HOST), each shard also on a peer; the step loop "
                  "stalled %.1f ms for it (copying %.1f ms of it to host memory)", (long long)r.step, (double)r.bytes / 1e9,
                  f->local->root, 1e3 * f->local_stall_s, 1e3 * r.staged_s);
  return st;
}

loom_status loom_run_local_save(void *ctx, int64_t step, loom_error *err) {
  loom_run_files *f = ctx;
  loom_status st = settle_local(f, true, err); /* one local save in flight at a time */
  const double t0 = loom_now_s();
  if (st == LOOM_OK)
    st = loom_ckpt_async_begin_local(&f->local_pending, f->local, step, f->chunks, loom_pipeline_chunk_count(f->tr->pipe),
                                     &f->tr->ps, &f->run, &f->local_arena, err);
  f->local_stall_s = loom_now_s() - t0;
  return st;
}

loom_status loom_run_settle(void *ctx, bool blocking, loom_error *err) {
  loom_run_files *f = ctx;
  const loom_status local = settle_local(f, blocking, err);
  if (local != LOOM_OK || !f->pending) return local;
  loom_ckpt_async_report r;
  const loom_status st = loom_ckpt_async_finish(&f->pending, blocking, &r, err);
  if (st == LOOM_OK && r.done)
    loom_log_info("checkpoint %s/step_%08lld: %.3f GB written in the background in %.2f s; the step loop stalled %.1f ms "
                  "for it (copying %.1f ms of it to host memory): every rank's shard, then the manifest, then latest",
                  f->dir, (long long)r.step, (double)r.bytes / 1e9, r.write_s, 1e3 * f->pending_stall_s, 1e3 * r.staged_s);
  return st;
}

loom_status loom_run_save(void *ctx, int64_t step, loom_error *err) {
  loom_run_files *f = ctx;
  if (f->async_save) {
    loom_status st = loom_run_settle(f, true, err); /* one save in flight at a time */
    const double t0 = loom_now_s();
    if (st == LOOM_OK)
      st = loom_ckpt_async_begin(&f->pending, f->dir, step, f->keep, f->chunks, loom_pipeline_chunk_count(f->tr->pipe),
                                 &f->tr->ps, &f->run, &f->arena, err);
    f->pending_stall_s = loom_now_s() - t0;
    return st;
  }
  const double t0 = loom_now_s();
  int64_t bytes = 0;
  const loom_status st = loom_ckpt_save(f->dir, step, f->keep, f->chunks, loom_pipeline_chunk_count(f->tr->pipe), &f->tr->ps, &f->run, &bytes, err);
  const double gb = (double)bytes / 1e9, dt = loom_now_s() - t0;
  if (st == LOOM_OK)
    loom_log_info("checkpoint %s/step_%08lld: %.3f GB in %.2f s (%.2f GB/s), the step loop stalled for all of it: every "
                  "rank's shard, then the manifest, then latest", f->dir, (long long)step, gb, dt, gb / dt);
  return st;
}

loom_model_format loom_run_save_format(const loom_gpt_config *cfg) {
  if (loom_gpt_is_moe(cfg)) return LOOM_FORMAT_SAFETENSORS; /* its tensors by their Hugging Face names, no class yet */
  return loom_gpt_config_is_gpt2(cfg) && !cfg->untied ? LOOM_FORMAT_LLMC : LOOM_FORMAT_HF;
}

/* Rank 0 streams dir/latest into the model file. */
static loom_status write_model(const char *dir, const char *path, loom_error *err) {
  loom_model_source src;
  loom_status st = loom_model_source_of_ckpt(&src, dir, err);
  if (st != LOOM_OK) return st;
  const loom_export_options o = {.format = loom_run_save_format(&src.cfg), .dtype = LOOM_DTYPE_F32};
  st = loom_model_export(&src, &o, path, err);
  loom_model_source_free(&src);
  return st;
}

loom_status loom_run_export(loom_run_files *f, int64_t step, const char *path, loom_error *err) {
  char scratch[4200];
  const char *dir = f->dir;
  loom_status st = LOOM_OK;
  if (!dir) { /* the parameters alone, beside the output */
    snprintf(scratch, sizeof scratch, "%s.shards", path);
    dir = scratch;
    loom_ckpt_chunk *params = param_chunks(f);
    st = agree(f, params ? LOOM_OK : loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", path), "save the model", err);
    int64_t bytes;
    if (st == LOOM_OK) st = loom_ckpt_save(dir, step, 1, params, loom_pipeline_chunk_count(f->tr->pipe), &f->tr->ps, &f->run, &bytes, err);
    free(params);
  }
  if (st == LOOM_OK && f->tr->ps.rank == 0) st = write_model(dir, path, err);
  st = agree(f, st, "write the model", err);
  if (dir == scratch && f->tr->ps.rank == 0) loom_ckpt_remove(scratch);
  if (st == LOOM_OK)
    loom_log_info("saved %s (%s)", path, LOOM_MODEL_FORMAT_WHAT[loom_run_save_format(&f->run.cfg)]);
  return st;
}
