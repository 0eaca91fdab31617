/* Sharded checkpoint save and same-layout resume. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "ckpt/checkpoint.h"
#include "ckpt/shard_file.h"
#include "core/crc32c.h"
#include "core/write_file.h"
#include "loom.pb-c.h"

static const char *const KINDS[3] = {"param", "adam_m", "adam_v"};

static loom_status make_dir(const char *path, loom_error *err) {
  if (mkdir(path, 0755) == 0 || errno == EEXIST) return LOOM_OK;
  return loom_fail(err, LOOM_ERR_IO, "%s: cannot create checkpoint directory: %s", path, strerror(errno));
}

/* Size and CRC-32C of a whole file. */
static loom_status file_crc(const char *path, int64_t *bytes, uint32_t *crc, loom_error *err) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return loom_fail(err, LOOM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  char buf[65536];
  size_t got;
  *bytes = 0;
  *crc = 0;
  while ((got = fread(buf, 1, sizeof buf, fp)) > 0) {
    *crc = loom_crc32c(*crc, buf, got);
    *bytes += (int64_t)got;
  }
  fclose(fp);
  return LOOM_OK;
}

/* This rank's tensors: params, then Adam m and v, of every chunk. */
static int list_tensors(loom_gpt *chunks, loom_adamw *opts, int n, loom_shard_tensor *out) {
  int count = 0;
  for (int c = 0; c < n; c++) {
    const loom_gpt_params *p = &chunks[c].p;
    const loom_buffer *bufs[3] = {&p->params, &opts[c].m, &opts[c].v};
    for (int kind = 0; kind < 3; kind++)
      for (int k = 0; k < p->params.count; k++) {
        loom_shard_tensor *t = &out[count++];
        const loom_tensor *v = &bufs[kind]->views[k];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%s/%s", KINDS[kind], v->name);
        t->ndim = 2;
        t->global[0] = p->meta[k].layout.rows;
        t->global[1] = p->meta[k].layout.cols;
        loom_shard_locate(&p->meta[k].layout, p->tp_rank, p->tp_size, 0, &t->offset[0], &t->offset[1]);
        loom_shard_local_shape(&p->meta[k].layout, p->tp_rank, p->tp_size, &t->local[0], &t->local[1]);
        t->data = v->data;
      }
  }
  return count;
}

static int total_tensors(loom_gpt *chunks, int n) {
  int count = 0;
  for (int c = 0; c < n; c++) count += 3 * chunks[c].p.params.count;
  return count;
}

static void fill_layout(Loom__CheckpointManifest *mf, Loom__Model *m, Loom__Parallel *l, Loom__Batch *b,
                        const loom_parallel *ps, const loom_ckpt_run *run) {
  const loom_gpt_config *c = run->cfg;
  m->has_layers = m->has_hidden = m->has_heads = m->has_ffn = m->has_vocab = m->has_seq = 1;
  m->layers = c->layers, m->hidden = c->hidden, m->heads = c->heads, m->ffn = c->ffn, m->vocab = c->vocab, m->seq = c->seq;
  l->has_tp = l->has_pp = l->has_dp = l->has_virtual_chunks = 1;
  l->tp = ps->tp, l->pp = ps->pp, l->dp = ps->dp, l->virtual_chunks = run->vpp;
  b->has_micro_batch = b->has_global_batch = 1;
  b->micro_batch = run->micro_batch, b->global_batch = run->global_batch;
  mf->model = m, mf->parallel = l, mf->batch = b;
  mf->has_seed = 1;
  mf->seed = run->seed;
}

loom_status loom_ckpt_save(const char *dir, int64_t step, loom_gpt *chunks, loom_adamw *opts, int n,
                           const loom_parallel *ps, const loom_ckpt_run *run, loom_error *err) {
  char sub[4096], path[4200], name[64];
  snprintf(name, sizeof name, "step_%08lld", (long long)step);
  snprintf(sub, sizeof sub, "%s/%s", dir, name);
  loom_status st = ps->rank == 0 ? make_dir(dir, err) : LOOM_OK;
  if (st == LOOM_OK && ps->rank == 0) st = make_dir(sub, err);
  float ok = st == LOOM_OK;
  loom_comm_allreduce(ps->world_group, &ok, 1, LOOM_REDUCE_MAX); /* the directory exists before anyone writes */
  if (ok == 0.0f) return st;
  snprintf(path, sizeof path, "%s/rank_%05d.shard", sub, ps->rank);
  loom_shard_tensor *tensors = calloc((size_t)total_tensors(chunks, n), sizeof *tensors);
  const int count = list_tensors(chunks, opts, n, tensors);
  int64_t bytes = 0;
  uint32_t crc = 0;
  st = loom_shard_file_write(path, tensors, count, &bytes, &crc, err);
  free(tensors);
  /* Every rank reports success, size and checksum (as exact 16-bit and 24-bit float pieces). */
  float mine[5] = {st == LOOM_OK, (float)(crc >> 16), (float)(crc & 0xffff), (float)(bytes >> 24), (float)(bytes & 0xffffff)};
  float *all = calloc((size_t)ps->world * 5, sizeof(float));
  loom_comm_allgather(ps->world_group, mine, all, 5);
  int everyone = 1;
  for (int r = 0; r < ps->world; r++) everyone &= all[5 * r] == 1.0f;
  if (st == LOOM_OK && !everyone) st = loom_fail(err, LOOM_ERR_IO, "%s: another rank failed to write its shard; checkpoint not recorded", sub);
  if (st == LOOM_OK && ps->rank == 0) {
    Loom__CheckpointManifest mf = LOOM__CHECKPOINT_MANIFEST__INIT;
    Loom__Model m = LOOM__MODEL__INIT;
    Loom__Parallel l = LOOM__PARALLEL__INIT;
    Loom__Batch b = LOOM__BATCH__INIT;
    fill_layout(&mf, &m, &l, &b, ps, run);
    mf.has_format_version = mf.has_step = 1;
    mf.format_version = 1;
    mf.step = step;
    Loom__ShardFileInfo *infos = calloc((size_t)ps->world, sizeof *infos);
    Loom__ShardFileInfo **ptrs = calloc((size_t)ps->world, sizeof *ptrs);
    char (*files)[32] = calloc((size_t)ps->world, 32);
    for (int r = 0; r < ps->world; r++) {
      loom__shard_file_info__init(&infos[r]);
      snprintf(files[r], 32, "rank_%05d.shard", r);
      infos[r].has_rank = infos[r].has_bytes = infos[r].has_crc32c = 1;
      infos[r].rank = r;
      infos[r].file = files[r];
      infos[r].bytes = ((int64_t)all[5 * r + 3] << 24) | (int64_t)all[5 * r + 4];
      infos[r].crc32c = ((uint32_t)all[5 * r + 1] << 16) | (uint32_t)all[5 * r + 2];
      ptrs[r] = &infos[r];
    }
    mf.n_shards = (size_t)ps->world;
    mf.shards = ptrs;
    const size_t len = loom__checkpoint_manifest__get_packed_size(&mf);
    uint8_t *buf = malloc(len + 1);
    loom__checkpoint_manifest__pack(&mf, buf);
    snprintf(path, sizeof path, "%s/manifest.pb", sub);
    const loom_chunk chunk = {buf, len};
    st = loom_write_file_atomic(path, &chunk, 1, err);
    /* Last: DIR/latest names the new checkpoint (temp file, then rename). */
    char line[80];
    snprintf(line, sizeof line, "%s\n", name);
    snprintf(path, sizeof path, "%s/latest", dir);
    const loom_chunk latest = {line, strlen(line)};
    if (st == LOOM_OK) st = loom_write_file_atomic(path, &latest, 1, err);
    free(buf);
    free(files);
    free(ptrs);
    free(infos);
  }
  free(all);
  float done = st == LOOM_OK;
  loom_comm_allreduce(ps->world_group, &done, 1, LOOM_REDUCE_MAX); /* nobody goes on before the manifest */
  return st;
}

/* The shard file of `info` under sub, checked against the manifest's size and checksum. */
static loom_status check_shard(const char *sub, const Loom__ShardFileInfo *info, char *path, size_t len, loom_error *err) {
  snprintf(path, len, "%s/%s", sub, info->file ? info->file : "?");
  int64_t bytes = 0;
  uint32_t crc = 0;
  loom_status st = file_crc(path, &bytes, &crc, err);
  if (st == LOOM_OK && (bytes != info->bytes || crc != info->crc32c))
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: %lld bytes with checksum %08x, the manifest says %lld and %08x: the shard is damaged",
                   path, (long long)bytes, crc, (long long)info->bytes, info->crc32c);
  return st;
}

static loom_status read_manifest(const char *dir, char *sub, size_t sub_len, Loom__CheckpointManifest **out, loom_error *err) {
  char path[4200], name[256] = "";
  snprintf(path, sizeof path, "%s/latest", dir);
  FILE *fp = fopen(path, "r");
  if (!fp) return loom_fail(err, LOOM_ERR_IO, "%s: no checkpoint to resume from (%s)", path, strerror(errno));
  const int got = fscanf(fp, "%255s", name);
  fclose(fp);
  if (got != 1) return loom_fail(err, LOOM_ERR_FORMAT, "%s: empty; it should name a step directory", path);
  snprintf(sub, sub_len, "%s/%s", dir, name);
  snprintf(path, sizeof path, "%s/manifest.pb", sub);
  fp = fopen(path, "rb");
  if (!fp) return loom_fail(err, LOOM_ERR_FORMAT, "%s: missing manifest: the checkpoint is incomplete", path);
  uint8_t *buf = malloc(1 << 20);
  const size_t len = fread(buf, 1, 1 << 20, fp);
  fclose(fp);
  *out = loom__checkpoint_manifest__unpack(NULL, len, buf);
  free(buf);
  if (!*out || !(*out)->model || !(*out)->parallel) return loom_fail(err, LOOM_ERR_FORMAT, "%s: not a loom checkpoint manifest", path);
  return LOOM_OK;
}

loom_status loom_ckpt_resume(const char *dir, loom_gpt *chunks, loom_adamw *opts, int n, const loom_parallel *ps,
                             const loom_ckpt_run *run, int64_t *step, loom_error *err) {
  char sub[4096], path[4200];
  Loom__CheckpointManifest *mf = NULL;
  loom_status st = read_manifest(dir, sub, sizeof sub, &mf, err);
  if (st != LOOM_OK) {
    if (mf) loom__checkpoint_manifest__free_unpacked(mf, NULL);
    return st;
  }
  const Loom__Model *m = mf->model;
  const Loom__Parallel *l = mf->parallel;
  const loom_gpt_config *c = run->cfg;
  if (m->layers != c->layers || m->hidden != c->hidden || m->heads != c->heads || m->ffn != c->ffn || m->vocab != c->vocab)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: checkpoint of another model (layers %d, hidden %d, heads %d, vocab %d); this run has layers %d, hidden %d, heads %d, vocab %d",
                   sub, m->layers, m->hidden, m->heads, m->vocab, c->layers, c->hidden, c->heads, c->vocab);
  else if (l->tp != ps->tp || l->pp != ps->pp || l->dp != ps->dp || l->virtual_chunks != run->vpp)
    st = loom_fail(err, LOOM_ERR_USAGE, "%s: written by tp %d x pp %d x dp %d (vpp %d); resume with that layout (resharding is not in this loom yet)",
                   sub, l->tp, l->pp, l->dp, l->virtual_chunks);
  else if ((int)mf->n_shards != ps->world)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: manifest lists %zu shards for %d ranks", sub, mf->n_shards, ps->world);
  if (st == LOOM_OK) st = check_shard(sub, mf->shards[ps->rank], path, sizeof path, err);
  loom_shard_file f = {0};
  if (st == LOOM_OK) st = loom_shard_file_read(path, &f, err);
  if (st == LOOM_OK) {
    loom_shard_tensor *want = calloc((size_t)total_tensors(chunks, n), sizeof *want);
    const int count = list_tensors(chunks, opts, n, want);
    for (int i = 0; i < count && st == LOOM_OK; i++) {
      const loom_shard_tensor *have = NULL;
      for (int j = 0; j < f.count && !have; j++)
        if (strcmp(f.tensors[j].name, want[i].name) == 0) have = &f.tensors[j];
      if (!have || loom_shard_numel(have) != loom_shard_numel(&want[i]))
        st = loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s is %s", path, want[i].name, have ? "of another shape" : "missing");
      else memcpy(want[i].data, have->data, (size_t)loom_shard_numel(have) * sizeof(float));
    }
    free(want);
    loom_shard_file_free(&f);
  }
  if (st == LOOM_OK) {
    *step = mf->step;
    for (int i = 0; i < n; i++) opts[i].step = (int)mf->step;
  }
  loom__checkpoint_manifest__free_unpacked(mf, NULL);
  return st;
}

loom_status loom_ckpt_verify(const char *dir, int *shards, int *tensors, loom_error *err) {
  char sub[4096], path[4200];
  Loom__CheckpointManifest *mf = NULL;
  *shards = *tensors = 0;
  loom_status st = read_manifest(dir, sub, sizeof sub, &mf, err);
  for (size_t i = 0; st == LOOM_OK && i < mf->n_shards; i++) {
    st = check_shard(sub, mf->shards[i], path, sizeof path, err);
    loom_shard_file f;
    if (st == LOOM_OK) st = loom_shard_file_read(path, &f, err);
    if (st == LOOM_OK) {
      *tensors += f.count;
      loom_shard_file_free(&f);
      (*shards)++;
    }
  }
  if (mf) loom__checkpoint_manifest__free_unpacked(mf, NULL);
  return st;
}
