/* Offline resharding onto another plan, in one process: each target rank is
 * built, filled by global offsets and written in turn, so memory holds one
 * rank at a time. */
#include <unistd.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/assemble.h"
#include "ckpt/checkpoint.h"
#include "ckpt/manifest.h"
#include "core/log.h"
#include "plan/rank_sheet.h"
#include "schedule/schedule.h"

/* One rank of a layout, built without communication. */
typedef struct {
  int n;
  loom_gpt_params *p;
  loom_adamw *opt;
  loom_zero *z;
  loom_ckpt_chunk *chunks;
} offline_rank;

static void free_rank(offline_rank *r) {
  for (int c = 0; c < r->n; c++) {
    loom_gpt_params_free(&r->p[c]);
    if (r->opt) loom_adamw_free(&r->opt[c]);
    if (r->z) loom_zero_free(&r->z[c]);
  }
  free(r->p);
  free(r->opt);
  free(r->z);
  free(r->chunks);
  memset(r, 0, sizeof *r);
}

/* The rank of `to` its sheet describes (its coordinates and its chunks' layers). */
static loom_status build_rank(const loom_ckpt_run *to, const loom_rank_sheet *sheet, offline_rank *r) {
  const int tp_rank = sheet->at.tp, dp_rank = sheet->at.dp;
  const loom_gpt_config cfg = loom_gpt_config_for_tp(&to->cfg, to->tp);
  const loom_adamw_config oc = loom_adamw_defaults();
  memset(r, 0, sizeof *r);
  r->n = to->vpp;
  r->p = calloc((size_t)r->n, sizeof *r->p);
  r->chunks = calloc((size_t)r->n, sizeof *r->chunks);
  if (to->zero) r->z = calloc((size_t)r->n, sizeof *r->z);
  else r->opt = calloc((size_t)r->n, sizeof *r->opt);
  loom_status st = r->p && r->chunks && (r->z || r->opt) ? LOOM_OK : LOOM_ERR_NOMEM;
  for (int c = 0; c < r->n && st == LOOM_OK; c++) {
    st = loom_gpt_params_init_weights(&r->p[c], &cfg, tp_rank, to->tp, &sheet->chunk[c].range, &loom_host_memory);
    const loom_zero_group dp = {dp_rank, to->dp, NULL}, groups[LOOM_ZERO_GROUPS] = {dp, dp}; /* ep 1 */
    if (st == LOOM_OK) st = to->zero ? loom_zero_init(&r->z[c], &r->p[c], groups, to->zero, &oc) : loom_adamw_init(&r->opt[c], &r->p[c], &oc);
    if (st == LOOM_OK) r->chunks[c] = to->zero ? loom_ckpt_chunk_zero(&r->p[c], &r->z[c]) : loom_ckpt_chunk_adamw(&r->p[c], &r->opt[c]);
  }
  return st;
}

/* Fills rank `rank` of `to` from the checkpoint (only the shard files holding
 * its pieces) and writes its shard under out_dir. */
static loom_status reshard_rank(const char *sub, const Loom__CheckpointManifest *mf, const loom_ckpt_run *to,
                                const loom_plan *plan, int rank, const char *out_dir, uint64_t save_id,
                                loom_shard_written *written, loom_error *err) {
  loom_rank_sheet sheet; /* its coordinates and chunks' layers: resolved, no schedule or buffers needed */
  loom_plan_resolve(plan, rank, &sheet);
  offline_rank r = {0};
  loom_status st = build_rank(to, &sheet, &r);
  const int dp_rank = sheet.at.dp; /* the layout written holds every expert on every rank: ep 1 */
  if (st != LOOM_OK) {
    free_rank(&r);
    return loom_fail(err, st, "loom ckpt reshard: out of memory building rank %d", rank);
  }
  const int max = loom_ckpt_max_pieces(r.chunks, r.n) + 1;
  loom_ckpt_want *want = calloc((size_t)max, sizeof *want);
  loom_shard_tensor *pieces = calloc((size_t)max, sizeof *pieces);
  const int nwant = loom_ckpt_load_pieces(r.chunks, r.n, want);
  loom_want_index *ix = loom_want_index_build(want, nwant);
  char **paths;
  int npaths;
  st = loom_manifest_paths(sub, mf, ix, &paths, &npaths, err);
  if (st == LOOM_OK) st = loom_ckpt_assemble(sub, paths, npaths, want, nwant, err);
  if (paths) loom_manifest_paths_free(paths, mf->n_shards);
  loom_want_index_free(ix);
  char path[4200];
  loom_ckpt_shard_path(out_dir, rank, path, sizeof path);
  const int count = loom_ckpt_save_pieces(r.chunks, r.n, dp_rank, dp_rank, to->zero >= 1, pieces);
  const loom_shard_binding binding = {save_id, mf->step, rank};
  if (st == LOOM_OK) st = loom_shard_file_write(path, &binding, pieces, count, &written->bytes, &written->crc32c, err);
  free(want);
  free(pieces);
  free_rank(&r);
  return st;
}

loom_status loom_ckpt_reshard(const char *src, const char *dst, int tp, int pp, int dp, int vpp, int zero,
                              const int *layer_counts, int ncounts, const loom_gpt_config *model, const char *model_from,
                              loom_error *err) {
  char sub[4096], out_dir[4096];
  Loom__CheckpointManifest *mf;
  loom_status st = loom_manifest_read(src, sub, sizeof sub, &mf, err);
  if (st != LOOM_OK) return st;
  loom_ckpt_run to;
  loom_manifest_run(mf, &to);
  if (model && (st = loom_ckpt_check_model(sub, &to.cfg, model, model_from, err)) != LOOM_OK) {
    loom__checkpoint_manifest__free_unpacked(mf, NULL);
    return st;
  }
  to.tp = tp, to.pp = pp, to.dp = dp, to.vpp = vpp, to.zero = zero;
  /* Each rank's compression state belongs to the layout that wrote it (loom_ckpt_resume): the copy goes without it. */
  if (to.compression_layout)
    loom_log_info("loom ckpt reshard: grad compression's state (each rank's error feedback%s, saved by %s) is not carried: "
                  "a run resumed from %s starts it fresh", to.compression_kind == LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD
                                                               ? ", PowerSGD's warm start" : "",
                  to.compression_layout, dst);
  to.compression_layout = NULL;
  const int world = tp * pp * dp;
  /* The new layout is a plan, built and validated as every run's is. Its
   * micro-batch only needs to split the global batch over dp into a count
   * the schedule takes (loom_schedule_shape_problem): the run that resumes
   * brings its own. */
  const loom_schedule_kind kind = vpp > 1 ? LOOM_SCHEDULE_INTERLEAVED : LOOM_SCHEDULE_1F1B;
  int micro = to.micro_batch;
  for (int b = to.micro_batch; b >= 1; b--)
    if (to.global_batch % (b * dp) == 0 && !loom_schedule_shape_problem(kind, pp, vpp, to.global_batch / (b * dp), NULL, 0)) {
      micro = b;
      break;
    }
  const loom_plan_spec spec = {.model = to.cfg, .tp = tp, .pp = pp,
                               .dp = dp, .vpp = vpp, .zero_stage = zero, .micro_batch = micro,
                               .global_batch = to.global_batch,
                               .schedule = kind,
                               .layer_counts = layer_counts, .nlayer_counts = ncounts};
  loom_plan *plan = NULL;
  if (st == LOOM_OK) st = loom_error_prefix(err, loom_plan_build(&spec, &plan, err), "loom ckpt reshard");
  if (st == LOOM_OK) st = loom_error_prefix(err, loom_plan_refuse(plan, &(loom_plan_limits){.world = world}, err),
                                             "loom ckpt reshard");
  struct stat sb;
  const bool made_dst = st == LOOM_OK && stat(dst, &sb) != 0; /* a failure removes what this call made, and only that */
  if (st == LOOM_OK) st = loom_ckpt_make_dir(dst, err);
  loom_ckpt_step_dir(dst, mf->step, out_dir, sizeof out_dir);
  const bool began = st == LOOM_OK;
  if (st == LOOM_OK) st = loom_ckpt_make_dir(out_dir, err);
  loom_shard_written *written = calloc((size_t)world, sizeof *written);
  const uint64_t save_id = loom_ckpt_fresh_save_id();
  for (int rank = 0; rank < world && st == LOOM_OK; rank++)
    st = reshard_rank(sub, mf, &to, plan, rank, out_dir, save_id, &written[rank], err);
  if (st == LOOM_OK) st = loom_manifest_publish(dst, mf->step, save_id, &to, written, world, 0, err);
  if (st != LOOM_OK && began) {
    loom_ckpt_remove_step(out_dir);
    if (made_dst) rmdir(dst);
  }
  free(written);
  loom_plan_free(plan);
  loom__checkpoint_manifest__free_unpacked(mf, NULL);
  return st;
}
