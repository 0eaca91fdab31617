/* Checkpoint manifests, DIR/latest, and pruning old steps. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "ckpt/manifest.h"
#include "core/crc32c.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/read_file.h"
#include "core/rng.h"
#include "ckpt/shard_file.h"
#include "core/write_file.h"
#include "plan/plan.h"

#define MANIFEST_VERSION 3

void loom_ckpt_step_dir(const char *dir, int64_t step, char *out, size_t len) {
  snprintf(out, len, "%s/step_%08lld", dir, (long long)step);
}

void loom_ckpt_shard_path(const char *step_dir, int rank, char *out, size_t len) {
  snprintf(out, len, "%s/rank_%05d.shard", step_dir, rank);
}

loom_status loom_ckpt_make_dir(const char *path, loom_error *err) { return loom_make_dirs(path, "checkpoint directory", err); }

/* Removes a step directory and the files in it. */
static void remove_step(const char *dir, const char *name) {
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  loom_ckpt_remove_step(path);
}

void loom_ckpt_remove_step(const char *path) {
  DIR *d = opendir(path);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char file[4700];
    snprintf(file, sizeof file, "%s/%s", path, e->d_name);
    unlink(file);
  }
  closedir(d);
  rmdir(path);
}

void loom_ckpt_remove(const char *dir) {
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    long long step;
    char tail;
    if (sscanf(e->d_name, "step_%8lld%c", &step, &tail) == 1) remove_step(dir, e->d_name);
  }
  if (d) closedir(d);
  char path[4200];
  snprintf(path, sizeof path, "%s/latest", dir);
  unlink(path);
  rmdir(dir);
}

/* Steps older than the newest `keep` ones; `latest` is the newest. Short of
 * memory it removes nothing: the old steps stay until the next save. */
static void prune(const char *dir, int64_t latest, int keep) {
  if (keep <= 0) return;
  int64_t *steps = NULL;
  int n = 0;
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    long long s;
    char tail;
    if (sscanf(e->d_name, "step_%8lld%c", &s, &tail) != 1 || s > latest) continue;
    int64_t *more = loom_fault_realloc(steps, (size_t)(n + 1) * sizeof *steps);
    if (!more) {
      n = 0;
      break;
    }
    steps = more;
    steps[n++] = s;
  }
  if (d) closedir(d);
  for (int i = 0; i < n; i++) {
    int newer = 0; /* kept steps are the newest: count those newer than steps[i] */
    for (int j = 0; j < n; j++) newer += steps[j] > steps[i];
    if (newer >= keep) {
      char name[64];
      snprintf(name, sizeof name, "step_%08lld", (long long)steps[i]);
      remove_step(dir, name);
    }
  }
  free(steps);
}

/* The pieces a written shard file holds, read from its header table, into info. */
static loom_status list_pieces(const char *path, Loom__ShardFileInfo *info, loom_error *err) {
  loom_shard_index ix;
  loom_status st = loom_shard_index_open(path, &ix, err);
  if (st != LOOM_OK) return st;
  info->pieces = loom_fault_calloc((size_t)ix.count + 1, sizeof *info->pieces);
  for (int i = 0; i < ix.count && st == LOOM_OK; i++) {
    const loom_shard_tensor *t = &ix.tensors[i];
    Loom__ShardPiece *p = info->pieces ? loom_fault_malloc(sizeof *p + 3 * (size_t)t->ndim * sizeof(int64_t)) : NULL;
    char *name = p ? loom_fault_malloc(strlen(t->name) + 1) : NULL;
    if (!name) {
      free(p);
      st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory listing its pieces", path);
      break;
    }
    loom__shard_piece__init(p);
    int64_t *dims = (int64_t *)(p + 1); /* global, offset, local, in the same allocation */
    memcpy(dims, t->global, (size_t)t->ndim * sizeof(int64_t));
    memcpy(dims + t->ndim, t->offset, (size_t)t->ndim * sizeof(int64_t));
    memcpy(dims + 2 * t->ndim, t->local, (size_t)t->ndim * sizeof(int64_t));
    p->name = strcpy(name, t->name);
    p->n_global = p->n_offset = p->n_local = (size_t)t->ndim;
    p->global = dims, p->offset = dims + t->ndim, p->local = dims + 2 * t->ndim;
    p->has_first = p->has_count = 1;
    p->first = t->first, p->count = t->count;
    info->pieces[info->n_pieces++] = p;
  }
  if (st == LOOM_OK && !info->pieces) st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory listing its pieces", path);
  loom_shard_index_close(&ix);
  return st;
}

static void free_pieces(Loom__ShardFileInfo *info) {
  for (size_t i = 0; info->pieces && i < info->n_pieces; i++) {
    free(info->pieces[i]->name);
    free(info->pieces[i]);
  }
  free(info->pieces);
  info->pieces = NULL;
  info->n_pieces = 0;
}

/* The CRC-32C of mf packed without its own checksum (mf's crc fields are restored). */
static bool manifest_crc(Loom__CheckpointManifest *mf, uint32_t *crc) {
  const protobuf_c_boolean had = mf->has_crc32c;
  mf->has_crc32c = 0;
  const size_t len = loom__checkpoint_manifest__get_packed_size(mf);
  uint8_t *buf = loom_fault_malloc(len + 1);
  if (buf) {
    loom__checkpoint_manifest__pack(mf, buf);
    *crc = loom_crc32c(0, buf, len);
  }
  free(buf);
  mf->has_crc32c = had;
  return buf != NULL;
}

bool loom_manifest_seal(Loom__CheckpointManifest *mf) {
  if (!manifest_crc(mf, &mf->crc32c)) return false;
  mf->has_crc32c = 1;
  return true;
}

loom_status loom_manifest_encode(int64_t step, uint64_t save_id, const loom_ckpt_run *run, Loom__ShardFileInfo **shards,
                                 int nshards, const char *where, uint8_t **out, size_t *len, loom_error *err) {
  const loom_gpt_config *c = &run->cfg;
  Loom__Model m = LOOM__MODEL__INIT;
  loom_model_rooms rooms;
  loom_model_proto_fill(&m, c, &rooms);
  Loom__Parallel l = LOOM__PARALLEL__INIT;
  l.has_tp = l.has_pp = l.has_dp = l.has_virtual_chunks = l.has_zero_stage = 1;
  l.tp = run->tp, l.pp = run->pp, l.dp = run->dp, l.virtual_chunks = run->vpp, l.zero_stage = run->zero;
  Loom__Batch b = LOOM__BATCH__INIT;
  b.has_micro_batch = b.has_global_batch = 1;
  b.micro_batch = run->micro_batch, b.global_batch = run->global_batch;
  Loom__TrainState ts = LOOM__TRAIN_STATE__INIT;
  ts.has_max_lr = ts.has_min_lr = ts.has_warmup_steps = ts.has_total_steps = ts.has_samples_seen = ts.has_loss_scale = 1;
  ts.max_lr = run->lr.max_lr, ts.min_lr = run->lr.min_lr, ts.warmup_steps = run->lr.warmup_steps;
  ts.total_steps = run->lr.total_steps, ts.samples_seen = step * run->global_batch, ts.loss_scale = 1.0f;
  ts.has_lr_decay = ts.has_wsd_decay_steps = ts.has_wsd_shape = run->lr.decay == LOOM_LR_WSD;
  ts.lr_decay = (int32_t)run->lr.decay, ts.wsd_decay_steps = run->lr.wsd_decay_steps, ts.wsd_shape = (int32_t)run->lr.wsd_shape;
  ts.data = (char *)(run->data ? run->data : "");
  ts.n_expert_bias = run->expert_bias_count, ts.expert_bias = run->expert_bias;
  ts.n_fp8_scale = run->fp8_count, ts.fp8_scale = run->fp8_scale;
  ts.n_fp8_amax_history = run->fp8_count * (size_t)run->cfg.fp8.history, ts.fp8_amax_history = run->fp8_history;
  Loom__GradCompression gc = LOOM__GRAD_COMPRESSION__INIT;
  if (run->compression_layout) {
    gc.has_kind = gc.has_rank = 1, gc.kind = run->compression_kind, gc.rank = run->compression_rank;
    ts.grad_compression = &gc, ts.grad_compression_layout = (char *)run->compression_layout;
  }
  Loom__CheckpointManifest mf = LOOM__CHECKPOINT_MANIFEST__INIT;
  mf.has_format_version = mf.has_step = mf.has_seed = mf.has_save_id = 1;
  mf.format_version = MANIFEST_VERSION, mf.step = step, mf.seed = run->seed, mf.save_id = save_id;
  mf.model = &m, mf.parallel = &l, mf.batch = &b, mf.state = &ts;
  mf.n_shards = (size_t)nshards;
  mf.shards = shards;
  *out = NULL, *len = 0;
  if (!loom_manifest_seal(&mf)) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory writing the manifest", where);
  const size_t n = loom__checkpoint_manifest__get_packed_size(&mf);
  uint8_t *buf = loom_fault_malloc(n + 1);
  if (!buf) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory writing the manifest", where);
  loom__checkpoint_manifest__pack(&mf, buf);
  *out = buf, *len = n;
  return LOOM_OK;
}

loom_status loom_manifest_shard_info(const char *path, int rank, loom_shard_written w, Loom__ShardFileInfo *info,
                                     char file[32], loom_error *err) {
  loom__shard_file_info__init(info);
  snprintf(file, 32, "rank_%05d.shard", rank);
  info->has_rank = info->has_bytes = info->has_crc32c = 1;
  info->rank = rank, info->file = file, info->bytes = w.bytes, info->crc32c = w.crc32c;
  return list_pieces(path, info, err);
}

void loom_manifest_shard_info_free(Loom__ShardFileInfo *info) { free_pieces(info); }

loom_status loom_manifest_publish(const char *dir, int64_t step, uint64_t save_id, const loom_ckpt_run *run,
                                  const loom_shard_written *shards, int nshards, int keep, loom_error *err) {
  Loom__ShardFileInfo *infos = loom_fault_calloc((size_t)nshards + 1, sizeof *infos);
  Loom__ShardFileInfo **ptrs = loom_fault_calloc((size_t)nshards + 1, sizeof *ptrs);
  char (*files)[32] = loom_fault_calloc((size_t)nshards + 1, 32);
  char sub[4096], path[4200], line[80];
  loom_ckpt_step_dir(dir, step, sub, sizeof sub);
  loom_status st = infos && ptrs && files ? LOOM_OK : loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory writing the manifest", sub);
  const int listed = st == LOOM_OK ? nshards : 0;
  for (int r = 0; r < listed && st == LOOM_OK; r++) {
    ptrs[r] = &infos[r];
    loom_ckpt_shard_path(sub, r, path, sizeof path);
    st = loom_manifest_shard_info(path, r, shards[r], &infos[r], files[r], err);
  }
  uint8_t *buf = NULL;
  size_t len = 0;
  if (st == LOOM_OK) st = loom_manifest_encode(step, save_id, run, ptrs, nshards, sub, &buf, &len, err);
  snprintf(path, sizeof path, "%s/manifest.pb", sub);
  const loom_chunk chunk = {buf, len};
  if (st == LOOM_OK) st = loom_write_file_atomic(path, &chunk, 1, err);
  /* Last: DIR/latest names the new checkpoint (temp file, then rename). */
  snprintf(line, sizeof line, "step_%08lld\n", (long long)step);
  snprintf(path, sizeof path, "%s/latest", dir);
  const loom_chunk latest = {line, strlen(line)};
  if (st == LOOM_OK) st = loom_write_file_atomic(path, &latest, 1, err);
  if (st == LOOM_OK) prune(dir, step, keep);
  free(buf);
  for (int r = 0; r < listed; r++) free_pieces(&infos[r]);
  free(files);
  free(ptrs);
  free(infos);
  return st;
}

loom_status loom_ckpt_latest_step(const char *dir, int64_t *step, loom_error *err) {
  char path[4200], line[64] = "";
  snprintf(path, sizeof path, "%s/latest", dir);
  struct stat sb;
  if (stat(path, &sb) != 0) {
    const int why = errno;
    snprintf(path, sizeof path, "%s/manifest.pb", dir);
    if (stat(path, &sb) == 0) /* given a step directory */
      return loom_fail(err, LOOM_ERR_USAGE, "%s: is one step of a checkpoint; give the checkpoint directory that holds it "
                       "and its latest", dir);
    snprintf(path, sizeof path, "%s/latest", dir);
    return loom_fail(err, LOOM_ERR_IO, "%s: no checkpoint to load (%s)", path, strerror(why));
  }
  if (!S_ISREG(sb.st_mode)) return loom_fail(err, LOOM_ERR_FORMAT, "%s: not a file; it should name a step directory", path);
  FILE *fp;
  const loom_status opened = loom_open_for_reading(path, "checkpoint's latest file", &fp, err);
  if (opened != LOOM_OK) return opened;
  const size_t got = fread(line, 1, sizeof line - 1, fp);
  fclose(fp);
  long long n;
  char tail[2];
  if (got != 14 || sscanf(line, "step_%8lld%1[\n]", &n, tail) != 2 || n < 0)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: does not hold one line naming a step directory (step_NNNNNNNN)", path);
  *step = n;
  return LOOM_OK;
}

loom_status loom_manifest_decode(const uint8_t *bytes, size_t n, int64_t step, const char *path,
                                 Loom__CheckpointManifest **out, loom_error *err) {
  *out = NULL;
  Loom__CheckpointManifest *mf = loom__checkpoint_manifest__unpack(NULL, n, bytes);
  uint32_t crc = 0;
  char why[512];
  loom_status st = LOOM_OK;
  if (!mf || !mf->model || !mf->parallel || !mf->batch)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: not a loom checkpoint manifest", path);
  else if (mf->format_version != MANIFEST_VERSION)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: manifest format %u, this loom reads %d", path, mf->format_version, MANIFEST_VERSION);
  else if (!mf->has_crc32c || !manifest_crc(mf, &crc))
    st = loom_fail(err, mf->has_crc32c ? LOOM_ERR_NOMEM : LOOM_ERR_FORMAT, "%s: %s", path,
                   mf->has_crc32c ? "out of memory checking the manifest" : "the manifest has no checksum");
  else if (crc != mf->crc32c)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: checksum %08x, the manifest says %08x: the manifest is damaged", path, crc,
                   mf->crc32c);
  else if (loom_plan_check_sizes(NULL, mf->parallel, mf->batch, why, sizeof why) ||
           loom_plan_check_model(mf->model, why, sizeof why))
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: the manifest's run is out of bounds or breaks a rule: %.*s", path,
                   (int)strcspn(why, "\n"), why);
  else if (mf->step != step)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: a manifest of step %lld in the directory of step %lld: it belongs to another step",
                   path, (long long)mf->step, (long long)step);
  if (st == LOOM_OK) {
    *out = mf;
    return LOOM_OK;
  }
  if (mf) loom__checkpoint_manifest__free_unpacked(mf, NULL);
  return st;
}

loom_status loom_manifest_read(const char *dir, char *step_dir, size_t len, Loom__CheckpointManifest **out, loom_error *err) {
  char path[4200];
  int64_t named = 0;
  *out = NULL;
  loom_status st = loom_ckpt_latest_step(dir, &named, err);
  if (st != LOOM_OK) return st;
  loom_ckpt_step_dir(dir, named, step_dir, len);
  snprintf(path, sizeof path, "%s/manifest.pb", step_dir);
  FILE *fp;
  if (access(path, F_OK) != 0 && errno == ENOENT)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: missing manifest: the checkpoint is incomplete", path);
  if ((st = loom_open_for_reading(path, "checkpoint manifest", &fp, err)) != LOOM_OK) return st;
  struct stat sb;
  const size_t size = fstat(fileno(fp), &sb) == 0 ? (size_t)sb.st_size : 0;
  uint8_t *buf = loom_fault_malloc(size + 1);
  const size_t got_bytes = buf ? fread(buf, 1, size, fp) : 0;
  fclose(fp);
  if (!buf) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory reading the manifest", path);
  st = loom_manifest_decode(buf, got_bytes, named, path, out, err);
  free(buf);
  return st;
}

void loom_manifest_run(const Loom__CheckpointManifest *mf, loom_ckpt_run *run) {
  memset(run, 0, sizeof *run);
  const Loom__Model *m = mf->model;
  loom_model_proto_config(m, &run->cfg);
  const Loom__Parallel *l = mf->parallel;
  run->tp = l->tp, run->pp = l->pp, run->dp = l->dp, run->vpp = l->virtual_chunks, run->zero = l->zero_stage;
  run->micro_batch = mf->batch->micro_batch, run->global_batch = mf->batch->global_batch;
  run->seed = mf->seed;
  const Loom__TrainState *ts = mf->state;
  if (ts) {
    run->lr = (loom_lr_schedule){ts->max_lr, ts->min_lr, ts->warmup_steps, ts->total_steps,
                                 ts->lr_decay == LOOM_LR_WSD ? LOOM_LR_WSD : LOOM_LR_COSINE, ts->wsd_decay_steps,
                                 ts->wsd_shape >= 0 && ts->wsd_shape <= LOOM_WSD_MINUS_SQRT ? (loom_wsd_shape)ts->wsd_shape
                                                                                          : LOOM_WSD_EXPONENTIAL};
    run->data = ts->data && ts->data[0] ? ts->data : NULL;
    /* Held state travels with the run (into mf's memory): a tool that rewrites the checkpoint writes it again. */
    run->expert_bias = ts->n_expert_bias ? ts->expert_bias : NULL, run->expert_bias_count = ts->n_expert_bias;
    if (ts->grad_compression && ts->grad_compression_layout && ts->grad_compression_layout[0]) {
      run->compression_kind = ts->grad_compression->kind, run->compression_rank = ts->grad_compression->rank;
      run->compression_layout = ts->grad_compression_layout;
    }
  }
}

loom_status loom_manifest_expert_bias(const char *where, const Loom__CheckpointManifest *mf, float *bias, size_t count,
                                      loom_error *err) {
  const size_t have = mf->state ? mf->state->n_expert_bias : 0;
  if (!count) {
    if (have)
      loom_log_info("%s: its expert bias (model.moe.expert_bias) is dropped: this run routes without one (add "
                    "--moe-router-enable-expert-bias to keep it)", where);
    return LOOM_OK;
  }
  if (!have) {
    memset(bias, 0, count * sizeof *bias);
    loom_log_info("%s: holds no expert bias (trained without --moe-router-enable-expert-bias); it starts from 0", where);
    return LOOM_OK;
  }
  if (have != count)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: holds %zu expert-bias values, but the model has layers x experts = %zu",
                     where, have, count);
  for (size_t i = 0; i < have; i++)
    if (!isfinite(mf->state->expert_bias[i]))
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: expert-bias value %zu is %g; the checkpoint is damaged", where, i,
                       (double)mf->state->expert_bias[i]);
  memcpy(bias, mf->state->expert_bias, count * sizeof *bias);
  return LOOM_OK;
}

loom_status loom_manifest_fp8(const char *where, const Loom__CheckpointManifest *mf, const loom_ckpt_run *run,
                              loom_error *err) {
  const Loom__TrainState *ts = mf->state;
  const size_t scales = ts ? ts->n_fp8_scale : 0, history = ts ? ts->n_fp8_amax_history : 0;
  const size_t count = run->fp8_count, len = (size_t)run->cfg.fp8.history;
  if (!count) return LOOM_OK; /* a run without delayed scaling: nothing to fill (a saved history goes unused) */
  if (!scales) {
    loom_log_info("%s: holds no FP8 delayed-scaling state (saved without it); the scales start from 1", where);
    return LOOM_OK;
  }
  if (scales != count || history % scales != 0)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: holds %zu FP8 scales with %zu amax history values, but this run's model "
                     "has blocks x linears x operands = %zu FP8 operands", where, scales, history, count);
  for (size_t i = 0; i < scales; i++)
    if (!(ts->fp8_scale[i] > 0.0f) || !isfinite(ts->fp8_scale[i]))
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: FP8 scale %zu is %g; the checkpoint is damaged", where, i,
                       (double)ts->fp8_scale[i]);
  for (size_t i = 0; i < history; i++)
    if (!(ts->fp8_amax_history[i] >= 0.0f))
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: FP8 amax history value %zu is %g; the checkpoint is damaged", where, i,
                       (double)ts->fp8_amax_history[i]);
  memcpy(run->fp8_scale, ts->fp8_scale, count * sizeof(float));
  const size_t saved = history / scales; /* the saved history's length */
  if (saved != len) /* another --fp8-amax-history-len: the scales carry on, the history starts again */
    loom_log_info("%s: its FP8 amax history is %zu steps long, this run's %zu: the scales carry on, the history starts "
                  "empty", where, saved, len);
  memset(run->fp8_history, 0, count * len * sizeof(float));
  if (saved == len) memcpy(run->fp8_history, ts->fp8_amax_history, count * len * sizeof(float));
  return LOOM_OK;
}

/* Whether shard info holds a piece the index wants (every shard when there is no index). */
bool loom_manifest_shard_needed(const Loom__ShardFileInfo *info, const loom_want_index *wants) {
  if (!wants) return true;
  for (size_t k = 0; k < info->n_pieces; k++) {
    const Loom__ShardPiece *p = info->pieces[k];
    if (!p->name || p->n_global != 2 || p->n_offset != 2 || p->n_local != 2) return true; /* let the file speak */
    loom_shard_tensor t = {.ndim = 2, .first = p->first, .count = p->count};
    snprintf(t.name, sizeof t.name, "%s", p->name);
    memcpy(t.global, p->global, 2 * sizeof(int64_t));
    memcpy(t.offset, p->offset, 2 * sizeof(int64_t));
    memcpy(t.local, p->local, 2 * sizeof(int64_t));
    if (loom_want_index_needs(wants, &t)) return true;
  }
  return false;
}

uint64_t loom_ckpt_fresh_save_id(void) {
  uint64_t id = 0;
  FILE *fp = fopen("/dev/urandom", "rb");
  if (!fp || fread(&id, sizeof id, 1, fp) != 1) { /* no urandom: the clock and the process */
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    id = loom_hash_u64((uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec, (uint64_t)getpid());
  }
  if (fp) fclose(fp);
  return id;
}

/* A shard belongs to the save, step and rank its manifest lists it under. */
static loom_status check_binding(const char *path, const Loom__CheckpointManifest *mf, const Loom__ShardFileInfo *info,
                                 loom_error *err) {
  loom_shard_binding b;
  const loom_status st = loom_shard_read_binding(path, &b, err);
  if (st != LOOM_OK) return st;
  if (b.save_id == mf->save_id && b.step == mf->step && b.rank == info->rank) return LOOM_OK;
  return loom_fail(err, LOOM_ERR_FORMAT, "%s: written by rank %d at step %lld (save %016llx); the manifest lists it as rank "
                   "%d of step %lld (save %016llx): the shard is not this checkpoint's", path, b.rank, (long long)b.step,
                   (unsigned long long)b.save_id, info->rank, (long long)mf->step, (unsigned long long)mf->save_id);
}

loom_status loom_manifest_paths(const char *step_dir, const Loom__CheckpointManifest *mf, const loom_want_index *wants,
                                char ***paths, int *npaths, loom_error *err) {
  *paths = calloc(mf->n_shards + 1, sizeof **paths);
  *npaths = 0;
  loom_status st = LOOM_OK;
  for (size_t i = 0; st == LOOM_OK && i < mf->n_shards; i++) {
    const Loom__ShardFileInfo *info = mf->shards[i];
    if (!loom_manifest_shard_needed(info, wants)) continue;
    const size_t len = strlen(step_dir) + (info->file ? strlen(info->file) : 1) + 2;
    char *path = (*paths)[(*npaths)++] = malloc(len);
    snprintf(path, len, "%s/%s", step_dir, info->file ? info->file : "?");
    struct stat sb;
    if (!info->file || strchr(info->file, '/'))
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s/manifest.pb: shard %zu has no plain file name", step_dir, i);
    else if (stat(path, &sb) != 0)
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: missing shard file (%s)", path, strerror(errno));
    else if ((int64_t)sb.st_size != info->bytes)
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: %lld bytes, the manifest says %lld: the shard is damaged", path,
                     (long long)sb.st_size, (long long)info->bytes);
    else
      st = check_binding(path, mf, info, err);
  }
  if (st != LOOM_OK) {
    loom_manifest_paths_free(*paths, mf->n_shards);
    *paths = NULL;
    *npaths = 0;
  }
  return st;
}

void loom_manifest_paths_free(char **paths, size_t n) {
  for (size_t i = 0; paths && i < n; i++) free(paths[i]);
  free(paths);
}
