/* Sharded checkpoint save, resume onto any plan, and verify. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/assemble.h"
#include "ckpt/checkpoint.h"
#include "ckpt/manifest.h"
#include "core/check.h"
#include "core/fault.h"
#include "core/crc32c.h"

/* A save that failed anywhere leaves latest on the previous step; its
 * partial directory goes, unless latest names it (a step saved before). */
static void discard_partial(const char *dir, const char *sub, int64_t step) {
  int64_t latest;
  loom_error ignored;
  if (loom_ckpt_latest_step(dir, &latest, &ignored) != LOOM_OK || latest != step) loom_ckpt_remove_step(sub);
}

loom_status loom_ckpt_save(const char *dir, int64_t step, int keep, const loom_ckpt_chunk *chunks, int n,
                           const loom_parallel *ps, const loom_ckpt_run *run, int64_t *total_bytes, loom_error *err) {
  char sub[4096], path[4200];
  loom_ckpt_step_dir(dir, step, sub, sizeof sub);
  /* Every allocation comes first, so a rank short of memory fails the vote below, before anything is written. */
  loom_shard_tensor *pieces = loom_fault_calloc((size_t)loom_ckpt_max_pieces(chunks, n) + 1, sizeof *pieces);
  int64_t *all = loom_fault_calloc((size_t)ps->world * 3, sizeof(int64_t));
  loom_status st = pieces && all ? LOOM_OK : loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory saving a checkpoint", sub);
  if (st == LOOM_OK && ps->rank == 0) st = loom_ckpt_make_dir(dir, err);
  if (st == LOOM_OK && ps->rank == 0) st = loom_ckpt_make_dir(sub, err);
  int32_t bad = st != LOOM_OK;
  loom_comm_allreduce_typed(ps->world_group, &bad, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX); /* the directory exists before anyone writes */
  if (bad) {
    free(pieces);
    free(all);
    if (ps->rank == 0) discard_partial(dir, sub, step);
    return st != LOOM_OK ? st : loom_fail_elsewhere(err, LOOM_ERR_WRITE, 0, "start the checkpoint");
  }
  /* One id for this save, rank 0's: every shard and the manifest carry it. */
  int64_t save_id = ps->rank == 0 ? (int64_t)loom_ckpt_fresh_save_id() : 0;
  loom_comm_broadcast_typed(ps->world_group, &save_id, 1, LOOM_DTYPE_I64, 0);
  const loom_shard_binding binding = {(uint64_t)save_id, step, ps->rank};
  loom_ckpt_shard_path(sub, ps->rank, path, sizeof path);
  const int count = loom_ckpt_save_pieces(chunks, n, ps->dp_rank, run->zero >= 1, pieces);
  loom_shard_written mine = {0, 0};
  loom_ckpt_staging staging;
  st = loom_ckpt_stage(&staging, chunks[0].p->params.alloc, pieces, sizeof *pieces, count, true, err);
  if (st == LOOM_OK) st = loom_shard_file_write(path, &binding, pieces, count, &mine.bytes, &mine.crc32c, err);
  loom_ckpt_unstage(&staging, false);
  free(pieces);
  /* A test fault: this rank dies here, its shard written and the manifest
   * not, as a node lost mid-save would. */
  if (loom_fault_fires(LOOM_FAULT_KILL_IN_SAVE, step, NULL)) abort();
  /* Every rank reports success, size and checksum, as exact 64-bit integers. */
  const int64_t report[3] = {st == LOOM_OK, mine.crc32c, mine.bytes};
  loom_comm_allgather_typed(ps->world_group, report, all, 3, LOOM_DTYPE_I64);
  int failed = -1; /* the first rank that could not write its shard */
  *total_bytes = 0;
  for (int r = 0; r < ps->world; r++) {
    if (all[3 * r] != 1 && failed < 0) failed = r;
    *total_bytes += all[3 * r + 2];
  }
  if (st == LOOM_OK && failed >= 0) st = loom_fail_elsewhere(err, LOOM_ERR_WRITE, failed, "write its shard; checkpoint not recorded");
  if (st == LOOM_OK && ps->rank == 0) {
    loom_shard_written *shards = loom_fault_calloc((size_t)ps->world, sizeof *shards);
    for (int r = 0; shards && r < ps->world; r++) {
      shards[r].bytes = all[3 * r + 2];
      shards[r].crc32c = (uint32_t)all[3 * r + 1];
    }
    st = shards ? loom_manifest_publish(dir, step, (uint64_t)save_id, run, shards, ps->world, keep, err)
                : loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory writing the manifest", sub);
    free(shards);
  }
  free(all);
  bad = st != LOOM_OK;
  loom_comm_allreduce_typed(ps->world_group, &bad, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX); /* nobody goes on before the manifest */
  if (st == LOOM_OK && bad) st = loom_fail_elsewhere(err, LOOM_ERR_WRITE, 0, "record the checkpoint");
  if (bad && ps->rank == 0) discard_partial(dir, sub, step);
  return st;
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
  if (st == LOOM_OK) st = load_chunks(sub, mf, chunks, n, err);
  *step = mf->step;
  from->data = NULL; /* it pointed into mf */
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
    uint32_t crc = 0;
    FILE *fp = fopen(paths[i], "rb");
    char buf[65536];
    for (size_t got; fp && (got = fread(buf, 1, sizeof buf, fp)) > 0;) crc = loom_crc32c(crc, buf, got);
    if (fp) fclose(fp);
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
