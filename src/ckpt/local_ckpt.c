/* Checkpoints in host memory, replicated to a peer (see local_ckpt.h). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ckpt/assemble.h"
#include "ckpt/local_ckpt.h"
#include "ckpt/shard_file.h"
#include "core/check.h"
#include "core/crc32c.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/read_file.h"
#include "core/write_file.h"

enum { REPLICA_TAG = 0x4c52, RESTORE_TAG = 0x4c53 };
enum { KIND_OWN = 0, KIND_REPLICA = 1 };
/* Why a copy was refused, as a survey reports it. */
enum { REFUSED_SIZE = 2, REFUSED_BINDING = 3, REFUSED_CHECKSUM = 4 };
static const char *const REFUSED_WHY[] = {
    [REFUSED_SIZE] = "its size is not the manifest's (truncated or overwritten)",
    [REFUSED_BINDING] = "it is bound to another save, step or rank (a stale copy)",
    [REFUSED_CHECKSUM] = "its CRC-32C is not the manifest's (damaged in memory)"};

static void replica_path(const char *sub, int shard, char *out, size_t len) {
  snprintf(out, len, "%s/replicas/rank_%05d.shard", sub, shard);
}

static void copy_path(const char *sub, int shard, int kind, char *out, size_t len) {
  if (kind == KIND_OWN) loom_ckpt_shard_path(sub, shard, out, len);
  else replica_path(sub, shard, out, len);
}

loom_status loom_local_ckpt_init(loom_local_ckpt *l, const char *root, const loom_parallel *ps, loom_error *err) {
  *l = (loom_local_ckpt){.ps = ps, .partner = -1};
  snprintf(l->root, sizeof l->root, "%s", root);
  const int world = ps->world;
  char name[64] = "";
  gethostname(name, sizeof name - 1);
  l->host_names = loom_fault_calloc((size_t)world, sizeof *l->host_names);
  l->host_of = loom_fault_calloc((size_t)world, sizeof *l->host_of);
  l->sources = loom_fault_calloc(LOOM_LOCAL_SOURCES, sizeof *l->sources);
  l->held = loom_fault_calloc((size_t)world * LOOM_LOCAL_HELD * 4, sizeof *l->held);
  l->holders = loom_fault_calloc((size_t)world * 2, sizeof *l->holders);
  int32_t bad = !l->host_names || !l->host_of || !l->sources || !l->held || !l->holders;
  loom_comm_allreduce_typed(ps->world_group, &bad, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  if (bad) return loom_fail(err, LOOM_ERR_NOMEM, "--local-dir %s: out of memory for the host map", root);
  loom_comm_allgather_typed(ps->world_group, name, l->host_names, sizeof name, LOOM_DTYPE_BYTE);
  /* Hosts in the order of their lowest ranks; each rank's index among its host's ranks. */
  int *local = calloc((size_t)world, sizeof *local), *count = calloc((size_t)world, sizeof *count);
  int *first_rank = calloc((size_t)world, sizeof *first_rank);
  for (int r = 0; r < world; r++) {
    int h = 0;
    while (h < l->hosts && strcmp(l->host_names[r], l->host_names[first_rank[h]]) != 0) h++;
    if (h == l->hosts) first_rank[l->hosts++] = r;
    l->host_of[r] = h;
    local[r] = count[h]++;
  }
  /* The partner: the same local index on the next host (modulo its ranks); on one host, the next rank. A rank
   * holds at most LOOM_LOCAL_SOURCES replicas (hosts of unequal rank counts): a rank whose partner is full has none. */
  int *held_by = calloc((size_t)world, sizeof *held_by), unreplicated = 0;
  for (int r = 0; world > 1 && r < world; r++) {
    int partner;
    if (l->hosts == 1) {
      partner = (r + 1) % world;
    } else {
      const int next = (l->host_of[r] + 1) % l->hosts, want = local[r] % count[next];
      partner = 0;
      while (l->host_of[partner] != next || local[partner] != want) partner++;
    }
    if (held_by[partner] == LOOM_LOCAL_SOURCES) {
      unreplicated++;
      continue;
    }
    held_by[partner]++;
    if (r == ps->rank) l->partner = partner;
    if (partner == ps->rank) l->sources[l->nsources++] = r;
  }
  free(held_by);
  if (unreplicated && ps->rank == 0)
    loom_log_info("local checkpoints: %d rank%s keep no replica: the next host has too few ranks to hold them (at most %d "
                  "each); put as many ranks on every host", unreplicated, unreplicated == 1 ? "" : "s", LOOM_LOCAL_SOURCES);
  l->host = l->host_of[ps->rank];
  l->host_leader = first_rank[l->host] == ps->rank;
  free(first_rank);
  free(local);
  free(count);
  snprintf(l->host_dir, sizeof l->host_dir, "%s/%s", root, name[0] ? name : "host");
  loom_status st = loom_make_dirs(l->host_dir, "--local-dir", err);
  bad = st != LOOM_OK;
  loom_comm_allreduce_typed(ps->world_group, &bad, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  if (st == LOOM_OK && bad) st = loom_fail_elsewhere(err, LOOM_ERR_IO, 0, "make its --local-dir");
  if (st == LOOM_OK && ps->rank == 0)
    loom_log_info("local checkpoints: %s/HOST on %d host%s; %s", root, l->hosts, l->hosts == 1 ? "" : "s",
                  world == 1 ? "one rank: no replicas"
                  : l->hosts == 1 ? "replicas on the same host (one host): they outlive a lost process, not a lost host"
                                  : "each rank's replica on the next host");
  return st;
}

/* Removes the files of a local step directory, its replicas and the directory. */
static void remove_local_step(const char *sub) {
  char replicas[4500];
  snprintf(replicas, sizeof replicas, "%s/replicas", sub);
  loom_ckpt_remove_step(replicas);
  loom_ckpt_remove_step(sub);
}

/* The steps under a host directory, newest first (at most max). */
static int list_steps(const char *dir, int64_t *steps, int max) {
  int n = 0;
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    long long s;
    char tail;
    if (sscanf(e->d_name, "step_%8lld%c", &s, &tail) != 1) continue;
    int at = n < max ? n++ : max; /* insertion, newest first */
    while (at > 0 && steps[at - 1] < s) {
      if (at < max) steps[at] = steps[at - 1];
      at--;
    }
    if (at < max) steps[at] = s;
  }
  if (d) closedir(d);
  return n;
}

void loom_local_ckpt_free(loom_local_ckpt *l, bool remove) {
  if (remove && l->host_leader && l->host_dir[0]) {
    int64_t steps[64];
    const int n = list_steps(l->host_dir, steps, 64);
    for (int i = 0; i < n; i++) {
      char sub[4400];
      loom_ckpt_step_dir(l->host_dir, steps[i], sub, sizeof sub);
      remove_local_step(sub);
    }
    rmdir(l->host_dir);
    rmdir(l->root);
  }
  free(l->host_names);
  free(l->host_of);
  free(l->sources);
  free(l->held);
  free(l->holders);
  *l = (loom_local_ckpt){0};
}

/* A whole file into memory, rounded up to whole floats (the comm moves floats). */
static float *read_whole(const char *path, size_t bytes) {
  float *buf = loom_fault_calloc(bytes / sizeof(float) + 1, sizeof(float));
  FILE *fp = buf ? fopen(path, "rb") : NULL;
  const bool ok = fp && fread(buf, 1, bytes, fp) == bytes;
  if (fp) fclose(fp);
  if (!ok) free(buf);
  return ok ? buf : NULL;
}

static loom_status write_whole(const char *path, const void *data, size_t bytes, loom_error *err) {
  const loom_chunk chunk = {data, bytes};
  return loom_write_file_atomic(path, &chunk, 1, err);
}

/* Sends this rank's shard to its partner and takes its sources' shards into sub/replicas, each checked against the
 * size and checksum its writer reported (all: [world * 3] ok, crc, bytes). */
static loom_status exchange_replicas(loom_local_ckpt *l, const char *sub, const int64_t *all, loom_error *err) {
  const loom_parallel *ps = l->ps;
  loom_comm *world = ps->world_group;
  char path[4400];
  loom_status st = LOOM_OK;
  float *mine = NULL, *theirs[LOOM_LOCAL_SOURCES] = {0};
  loom_request *sent = NULL, *got[LOOM_LOCAL_SOURCES] = {0};
  if (l->partner >= 0) {
    loom_ckpt_shard_path(sub, ps->rank, path, sizeof path);
    mine = read_whole(path, (size_t)all[3 * ps->rank + 2]);
    if (!mine) st = loom_fail(err, LOOM_ERR_IO, "%s: cannot read it back to send its replica", path);
    snprintf(path, sizeof path, "%s/replicas", sub);
    if (st == LOOM_OK && l->nsources) st = loom_make_dirs(path, "--local-dir", err);
  }
  for (int i = 0; i < l->nsources && st == LOOM_OK; i++)
    if (!(theirs[i] = loom_fault_calloc((size_t)all[3 * l->sources[i] + 2] / sizeof(float) + 1, sizeof(float))))
      st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory for the replica of rank %d", sub, l->sources[i]);
  /* Everyone posts or nobody does: a rank short of memory must not leave its partner waiting. */
  int32_t bad = st != LOOM_OK;
  loom_comm_allreduce_typed(world, &bad, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  if (!bad) {
    for (int i = 0; i < l->nsources; i++)
      got[i] = loom_comm_irecv(world, theirs[i], (size_t)all[3 * l->sources[i] + 2] / sizeof(float) + 1, l->sources[i],
                               REPLICA_TAG);
    if (l->partner >= 0)
      sent = loom_comm_isend(world, mine, (size_t)all[3 * ps->rank + 2] / sizeof(float) + 1, l->partner, REPLICA_TAG);
    for (int i = 0; i < l->nsources; i++) loom_comm_wait(world, got[i]);
    if (sent) loom_comm_wait(world, sent);
  } else if (st == LOOM_OK) {
    st = loom_fail_elsewhere(err, LOOM_ERR_NOMEM, 0, "prepare the replicas");
  }
  for (int i = 0; i < l->nsources && st == LOOM_OK; i++) {
    const int src = l->sources[i];
    const size_t bytes = (size_t)all[3 * src + 2];
    replica_path(sub, src, path, sizeof path);
    if (loom_crc32c(0, theirs[i], bytes) != (uint32_t)all[3 * src + 1])
      st = loom_fail(err, LOOM_ERR_IO, "%s: the replica of rank %d arrived with another checksum than its writer's", path, src);
    else
      st = write_whole(path, theirs[i], bytes, err);
  }
  for (int i = 0; i < l->nsources; i++) free(theirs[i]);
  free(mine);
  return st;
}

/* This rank's manifest entry as bytes, every rank's gathered; the lowest rank of each host writes the manifest. */
static loom_status write_manifests(loom_local_ckpt *l, const char *sub, int64_t step, uint64_t save_id,
                                   const loom_ckpt_run *run, const int64_t *all, loom_error *err) {
  const loom_parallel *ps = l->ps;
  const int world = ps->world;
  char path[4400], file[32];
  loom_ckpt_shard_path(sub, ps->rank, path, sizeof path);
  Loom__ShardFileInfo info;
  const loom_shard_written w = {all[3 * ps->rank + 2], (uint32_t)all[3 * ps->rank + 1]};
  loom_status st = loom_manifest_shard_info(path, ps->rank, w, &info, file, err);
  int64_t len = st == LOOM_OK ? (int64_t)loom__shard_file_info__get_packed_size(&info) : 0, most = len;
  loom_comm_allreduce_typed(ps->world_group, &most, 1, LOOM_DTYPE_I64, LOOM_REDUCE_MAX);
  uint8_t *mine = loom_fault_calloc((size_t)most + 8, 1);
  uint8_t *every = loom_fault_calloc((size_t)world * ((size_t)most + 8), 1);
  if (st == LOOM_OK && (!mine || !every)) st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory for the manifest", sub);
  if (st == LOOM_OK) {
    memcpy(mine, &len, 8);
    loom__shard_file_info__pack(&info, mine + 8);
  }
  loom_manifest_shard_info_free(&info);
  int32_t bad = st != LOOM_OK;
  loom_comm_allreduce_typed(ps->world_group, &bad, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  if (bad) {
    free(mine);
    free(every);
    return st != LOOM_OK ? st : loom_fail_elsewhere(err, LOOM_ERR_NOMEM, 0, "list its shard's pieces");
  }
  loom_comm_allgather_typed(ps->world_group, mine, every, (size_t)most + 8, LOOM_DTYPE_BYTE);
  const bool leader = l->host_leader;
  Loom__ShardFileInfo **infos = leader ? loom_fault_calloc((size_t)world, sizeof *infos) : NULL;
  if (leader && !infos) st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory for the manifest", sub);
  for (int r = 0; leader && r < world && st == LOOM_OK; r++) {
    const uint8_t *at = every + (size_t)r * ((size_t)most + 8);
    int64_t n;
    memcpy(&n, at, 8);
    if (!(infos[r] = loom__shard_file_info__unpack(NULL, (size_t)n, at + 8)))
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: rank %d's manifest entry does not decode", sub, r);
  }
  uint8_t *buf = NULL;
  size_t bytes = 0;
  if (leader && st == LOOM_OK) st = loom_manifest_encode(step, save_id, run, infos, world, sub, &buf, &bytes, err);
  snprintf(path, sizeof path, "%s/manifest.pb", sub);
  if (leader && st == LOOM_OK) st = write_whole(path, buf, bytes, err); /* last: the step is complete on this host */
  for (int r = 0; infos && r < world; r++)
    if (infos[r]) loom__shard_file_info__free_unpacked(infos[r], NULL);
  free(infos);
  free(buf);
  free(mine);
  free(every);
  return st;
}

/* The host's leader keeps the newest LOOM_LOCAL_KEEP complete steps (this one and the one before). */
static void prune_local(const loom_local_ckpt *l, int64_t step) {
  if (!l->host_leader) return;
  int64_t steps[64];
  const int n = list_steps(l->host_dir, steps, 64);
  int kept = 0;
  for (int i = 0; i < n; i++) {
    char sub[4400], manifest[4500];
    loom_ckpt_step_dir(l->host_dir, steps[i], sub, sizeof sub);
    snprintf(manifest, sizeof manifest, "%s/manifest.pb", sub);
    const bool complete = access(manifest, F_OK) == 0;
    if (steps[i] > step) continue; /* (none: steps only grow) */
    if (complete && kept < LOOM_LOCAL_KEEP) kept++;
    else remove_local_step(sub);
  }
}

loom_status loom_local_ckpt_record(loom_local_ckpt *l, const char *sub, int64_t step, uint64_t save_id,
                                   const loom_ckpt_run *run, loom_status wrote, loom_shard_written mine,
                                   int64_t *total_bytes, loom_error *err) {
  const loom_parallel *ps = l->ps;
  int64_t *all = loom_xcalloc((size_t)ps->world * 3, sizeof *all, "local checkpoint reports");
  const int64_t report[3] = {wrote == LOOM_OK, mine.crc32c, mine.bytes};
  loom_comm_allgather_typed(ps->world_group, report, all, 3, LOOM_DTYPE_I64);
  int failed = -1;
  *total_bytes = 0;
  for (int r = 0; r < ps->world; r++) {
    if (all[3 * r] != 1 && failed < 0) failed = r;
    *total_bytes += all[3 * r + 2];
  }
  loom_status st = wrote;
  if (st == LOOM_OK && failed >= 0) st = loom_fail_elsewhere(err, LOOM_ERR_WRITE, failed, "write its local shard");
  if (failed < 0) st = exchange_replicas(l, sub, all, err);
  int32_t bad = st != LOOM_OK;
  loom_comm_allreduce_typed(ps->world_group, &bad, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  if (bad && st == LOOM_OK) st = loom_fail_elsewhere(err, LOOM_ERR_WRITE, 0, "place the local replicas");
  if (!bad) st = write_manifests(l, sub, step, save_id, run, all, err);
  bad = st != LOOM_OK;
  loom_comm_allreduce_typed(ps->world_group, &bad, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  if (bad && st == LOOM_OK) st = loom_fail_elsewhere(err, LOOM_ERR_WRITE, 0, "record the local checkpoint");
  if (!bad) prune_local(l, step);
  free(all);
  return st;
}

/* ---- restore ---- */

/* Whether a manifest describes a save this run can load at its own layout. */
static bool same_layout(const Loom__CheckpointManifest *mf, const loom_ckpt_run *run, int world) {
  loom_ckpt_run have;
  loom_manifest_run(mf, &have);
  return (int)mf->n_shards == world && have.tp == run->tp && have.pp == run->pp && have.dp == run->dp &&
         have.vpp == run->vpp && have.zero == run->zero && loom_gpt_config_same_model(&have.cfg, &run->cfg);
}

static loom_status read_manifest(const char *sub, int64_t step, Loom__CheckpointManifest **mf, loom_error *err) {
  char path[4500], *bytes;
  size_t n;
  snprintf(path, sizeof path, "%s/manifest.pb", sub);
  loom_status st = loom_read_small_file(path, "local manifest", (size_t)1 << 30, &bytes, &n, err);
  if (st == LOOM_OK) st = loom_manifest_decode((const uint8_t *)bytes, n, step, path, mf, err);
  if (st == LOOM_OK) free(bytes);
  return st;
}

/* 0 when the copy at path is shard `shard` of mf, whole; else why not (REFUSED_*). */
static int check_copy(const char *path, const Loom__CheckpointManifest *mf, int shard) {
  const Loom__ShardFileInfo *info = mf->shards[shard];
  struct stat sb;
  if (stat(path, &sb) != 0 || (int64_t)sb.st_size != info->bytes) return REFUSED_SIZE;
  loom_shard_binding b;
  loom_error ignored;
  if (loom_shard_read_binding(path, &b, &ignored) != LOOM_OK || b.save_id != mf->save_id || b.step != (int64_t)mf->step ||
      b.rank != shard)
    return REFUSED_BINDING;
  return loom_crc32c_file(path) == info->crc32c ? 0 : REFUSED_CHECKSUM;
}

/* l->holders for the save (step, save_id): who holds each shard's own copy and its replica. */
static void index_holders(loom_local_ckpt *l, int64_t step, int64_t save_id) {
  const int world = l->ps->world;
  for (int i = 0; i < 2 * world; i++) l->holders[i] = -1;
  for (int d = 0; d < world * LOOM_LOCAL_HELD; d++) {
    const int64_t *o = &l->held[d * 4];
    if (o[0] == step && o[1] == save_id && o[3] <= KIND_REPLICA && o[2] >= 0 && o[2] < world)
      l->holders[2 * o[2] + o[3]] = d / LOOM_LOCAL_HELD;
  }
}

loom_status loom_local_ckpt_newest(loom_local_ckpt *l, const loom_ckpt_run *run, int64_t *step, loom_error *err) {
  const loom_parallel *ps = l->ps;
  const int world = ps->world;
  int64_t mine[LOOM_LOCAL_HELD * 4];
  for (int i = 0; i < LOOM_LOCAL_HELD * 4; i++) mine[i] = -1;
  int64_t steps[LOOM_LOCAL_STEPS];
  const int nsteps = list_steps(l->host_dir, steps, LOOM_LOCAL_STEPS);
  int held = 0;
  for (int i = 0; i < nsteps; i++) {
    char sub[4400], path[4500];
    loom_ckpt_step_dir(l->host_dir, steps[i], sub, sizeof sub);
    Loom__CheckpointManifest *mf;
    loom_error ignored;
    if (read_manifest(sub, steps[i], &mf, &ignored) != LOOM_OK) continue; /* partial, or another run's */
    if (same_layout(mf, run, world)) {
      for (int k = 0; k <= l->nsources; k++) {
        const int shard = k == 0 ? ps->rank : l->sources[k - 1], kind = k == 0 ? KIND_OWN : KIND_REPLICA;
        copy_path(sub, shard, kind, path, sizeof path);
        if (access(path, F_OK) != 0) continue;
        const int why = check_copy(path, mf, shard);
        int64_t *e = &mine[4 * held++];
        e[0] = steps[i], e[1] = (int64_t)mf->save_id, e[2] = shard, e[3] = why ? why : kind;
      }
    }
    loom__checkpoint_manifest__free_unpacked(mf, NULL);
  }
  loom_comm_allgather_typed(ps->world_group, mine, l->held, LOOM_LOCAL_HELD * 4, LOOM_DTYPE_I64);
  /* Refused copies, one line each (rank 0 speaks for all). */
  for (int r = 0; r < world && ps->rank == 0; r++)
    for (int i = 0; i < LOOM_LOCAL_HELD; i++) {
      const int64_t *e = &l->held[(r * LOOM_LOCAL_HELD + i) * 4];
      if (e[0] >= 0 && e[3] >= REFUSED_SIZE)
        loom_log_info("local checkpoint: step %lld, %s of shard %lld on %s (rank %d) refused: %s", (long long)e[0],
                      e[2] == r ? "the copy" : "the replica", (long long)e[2], l->host_names[r], r, REFUSED_WHY[e[3]]);
    }
  /* The newest (step, save) with every shard held by some rank: each distinct pair counted once. */
  *step = -1;
  const int entries = world * LOOM_LOCAL_HELD;
  for (int c = 0; c < entries; c++) {
    const int64_t *cand = &l->held[c * 4];
    if (cand[0] <= *step || cand[3] > KIND_REPLICA) continue;
    bool seen = false; /* an earlier entry of the same pair: counted already */
    for (int d = 0; d < c && !seen; d++)
      seen = l->held[d * 4] == cand[0] && l->held[d * 4 + 1] == cand[1] && l->held[d * 4 + 3] <= KIND_REPLICA;
    if (seen) continue;
    index_holders(l, cand[0], cand[1]);
    int count = 0;
    for (int s = 0; s < world; s++) count += l->holders[2 * s] >= 0 || l->holders[2 * s + 1] >= 0;
    if (count == world) *step = cand[0], l->save_id = cand[1];
  }
  if (*step >= 0) index_holders(l, *step, l->save_id);
  return LOOM_OK;
}

/* The rank that serves shard s of the chosen save to rank q: q itself if it holds it, else one on q's host (read in
 * place), else the other; *kind gets whether it holds it as its own or as a replica. -1: nobody. */
static int holder_for(const loom_local_ckpt *l, int q, int s, int *kind) {
  int best = -1, rank_of_best = 3; /* 0: q, 1: q's host, 2: elsewhere */
  for (int k = KIND_OWN; k <= KIND_REPLICA; k++) {
    const int r = l->holders[2 * s + k];
    if (r < 0) continue;
    const int how = r == q ? 0 : l->host_of[r] == l->host_of[q] ? 1 : 2;
    if (how < rank_of_best) best = r, rank_of_best = how, *kind = k;
  }
  return best;
}

/* The shards this rank's chunks need from mf, as a list. */
static int needed_shards(const Loom__CheckpointManifest *mf, const loom_ckpt_chunk *chunks, int n, int32_t *need) {
  loom_ckpt_want *want = loom_xcalloc((size_t)loom_ckpt_max_pieces(chunks, n) + 1, sizeof *want, "checkpoint pieces");
  const int count = loom_ckpt_load_pieces(chunks, n, want);
  loom_want_index *ix = loom_want_index_build(want, count);
  int k = 0;
  for (size_t i = 0; i < mf->n_shards; i++)
    if (loom_manifest_shard_needed(mf->shards[i], ix)) need[k++] = (int32_t)i;
  loom_want_index_free(ix);
  free(want);
  return k;
}

/* Says where each rank's own shard came from (rank 0, for every rank). */
static void log_sources(const loom_local_ckpt *l, int64_t step, int64_t persistent) {
  const int world = l->ps->world;
  int in_place = 0, replicas_here = 0, sent = 0;
  char sources[1024] = "";
  size_t at = 0;
  for (int s = 0; s < world; s++) {
    int kind = KIND_OWN;
    const int h = holder_for(l, s, s, &kind);
    const bool here = l->host_of[h] == l->host_of[s];
    in_place += here && kind == KIND_OWN, replicas_here += here && kind == KIND_REPLICA, sent += !here;
    if (s < 16 && at < sizeof sources)
      at += (size_t)snprintf(sources + at, sizeof sources - at, "%sshard %d: %s", s ? "; " : "", s,
                             here && kind == KIND_OWN ? "its own copy"
                             : here                   ? "the replica on its host"
                                                      : "a peer's replica, sent by rank ");
    if (s < 16 && !here && at < sizeof sources)
      at += (size_t)snprintf(sources + at, sizeof sources - at, "%d on %s", h, l->host_names[h]);
  }
  char before[96] = "none";
  if (persistent >= 0) snprintf(before, sizeof before, "step %lld", (long long)persistent);
  loom_log_info("resume: step %lld from the in-memory copies (the persistent checkpoint holds %s): %d shard%s read in "
                "place, %d from a replica on the same host, %d sent by peers holding replicas%s%s%s", (long long)step,
                before, in_place, in_place == 1 ? "" : "s", replicas_here, sent, world > 16 ? " (the first 16: " : " (",
                sources, ")");
}

/* Removes a restore directory: its step (files and links), latest, itself. */
static void remove_restore(const char *root, int64_t step) {
  char path[4500];
  loom_ckpt_step_dir(root, step, path, sizeof path);
  loom_ckpt_remove_step(path);
  snprintf(path, sizeof path, "%s/latest", root);
  unlink(path);
  rmdir(root);
}

/* Fills root (a checkpoint directory of its own) with what this rank's load needs: the manifest, latest, and each
 * needed shard, linked to the copy on this host or received from the rank holding it. */
static loom_status gather_needed(loom_local_ckpt *l, int64_t step, const Loom__CheckpointManifest *mf,
                                 const uint8_t *mbytes, size_t mlen, const int32_t *needs, int most, const char *root,
                                 loom_error *err) {
  const loom_parallel *ps = l->ps;
  const int world = ps->world, me = ps->rank;
  char sub[4400], path[4600], from[4600], line[32];
  loom_ckpt_step_dir(root, step, sub, sizeof sub);
  remove_restore(root, step);
  loom_status st = loom_make_dirs(sub, "--local-dir", err);
  snprintf(path, sizeof path, "%s/manifest.pb", sub);
  if (st == LOOM_OK) st = write_whole(path, mbytes, mlen, err);
  snprintf(line, sizeof line, "step_%08lld\n", (long long)step);
  snprintf(path, sizeof path, "%s/latest", root);
  if (st == LOOM_OK) st = write_whole(path, line, strlen(line), err);
  char held_sub[4400];
  loom_ckpt_step_dir(l->host_dir, step, held_sub, sizeof held_sub);
  /* Every transfer, in one order that every rank computes alike: receives, then sends, then the waits. */
  float **bufs = loom_xcalloc((size_t)world * (size_t)most + 1, sizeof *bufs, "restore buffers");
  loom_request **reqs = loom_xcalloc((size_t)world * (size_t)most + 1, sizeof *reqs, "restore requests");
  int *holder = loom_xcalloc((size_t)world * (size_t)most + 1, sizeof *holder, "restore holders");
  for (int q = 0; q < world; q++)
    for (int i = 0; i < most; i++) {
      const int s = needs[q * most + i];
      int kind = KIND_OWN;
      const int h = holder[q * most + i] = s < 0 ? -1 : holder_for(l, q, s, &kind);
      const size_t bytes = s < 0 ? 0 : (size_t)mf->shards[s]->bytes, floats = bytes / sizeof(float) + 1;
      if (h < 0 || (q != me && h != me) || l->host_of[h] == l->host_of[q]) {
        if (q == me && h >= 0 && st == LOOM_OK) { /* on this host: read in place */
          copy_path(held_sub, s, kind, from, sizeof from);
          loom_ckpt_shard_path(sub, s, path, sizeof path);
          if (symlink(from, path) != 0) st = loom_fail(err, LOOM_ERR_IO, "%s: cannot link %s: %s", path, from, strerror(errno));
        }
        continue;
      }
      float **b = &bufs[q * most + i];
      if (q == me) {
        *b = loom_fault_calloc(floats, sizeof(float));
        if (!*b) st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory receiving shard %d", sub, s);
      } else {
        copy_path(held_sub, s, kind, from, sizeof from);
        *b = read_whole(from, bytes);
        if (!*b) st = loom_fail(err, LOOM_ERR_IO, "%s: cannot read it to send to rank %d", from, q);
      }
    }
  int32_t bad = st != LOOM_OK;
  loom_comm_allreduce_typed(ps->world_group, &bad, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  for (int pass = 0; pass < 2 && !bad; pass++)
    for (int q = 0; q < world; q++)
      for (int i = 0; i < most; i++) {
        const int s = needs[q * most + i];
        if (!bufs[q * most + i] || (pass == 0) != (q == me)) continue;
        const size_t floats = (size_t)mf->shards[s]->bytes / sizeof(float) + 1;
        reqs[q * most + i] = q == me ? loom_comm_irecv(ps->world_group, bufs[q * most + i], floats, holder[q * most + i],
                                                       RESTORE_TAG)
                                     : loom_comm_isend(ps->world_group, bufs[q * most + i], floats, q, RESTORE_TAG);
      }
  for (int k = 0; k < world * most; k++)
    if (reqs[k]) loom_comm_wait(ps->world_group, reqs[k]);
  for (int i = 0; i < most && !bad && st == LOOM_OK; i++) {
    const int s = needs[me * most + i];
    if (s < 0 || !bufs[me * most + i]) continue;
    const size_t bytes = (size_t)mf->shards[s]->bytes;
    loom_ckpt_shard_path(sub, s, path, sizeof path);
    if (loom_crc32c(0, bufs[me * most + i], bytes) != mf->shards[s]->crc32c)
      st = loom_fail(err, LOOM_ERR_IO, "%s: shard %d arrived with another checksum than the manifest's", sub, s);
    else
      st = write_whole(path, bufs[me * most + i], bytes, err);
  }
  for (int k = 0; k < world * most; k++) free(bufs[k]);
  free(bufs);
  free(reqs);
  free(holder);
  if (bad && st == LOOM_OK) st = loom_fail_elsewhere(err, LOOM_ERR_IO, 0, "prepare the in-memory restore");
  return st;
}

loom_status loom_local_ckpt_restore(loom_local_ckpt *l, int64_t step, const loom_ckpt_chunk *chunks, int n,
                                    const loom_ckpt_run *run, loom_ckpt_run *from, loom_error *err) {
  const loom_parallel *ps = l->ps;
  const int world = ps->world;
  /* The manifest, from the lowest rank whose host holds it. */
  int source = -1;
  for (int i = 0; i < 2 * world; i++)
    if (l->holders[i] >= 0 && (source < 0 || l->holders[i] < source)) source = l->holders[i];
  if (source < 0) return loom_fail(err, LOOM_ERR_FORMAT, "local checkpoints: no rank holds step %lld", (long long)step);
  char sub[4400], *bytes = NULL;
  size_t len = 0;
  loom_ckpt_step_dir(l->host_dir, step, sub, sizeof sub);
  char path[4500];
  snprintf(path, sizeof path, "%s/manifest.pb", sub);
  loom_status st = ps->rank == source ? loom_read_small_file(path, "local manifest", (size_t)1 << 30, &bytes, &len, err) : LOOM_OK;
  int64_t n64 = st == LOOM_OK ? (int64_t)len : -1;
  loom_comm_broadcast_typed(ps->world_group, &n64, 1, LOOM_DTYPE_I64, source);
  if (n64 < 0) return st != LOOM_OK ? st : loom_fail_elsewhere(err, LOOM_ERR_IO, source, "read the local manifest");
  if (ps->rank != source) bytes = loom_xcalloc((size_t)n64 + 1, 1, "local manifest");
  loom_comm_broadcast_bytes(ps->world_group, bytes, (size_t)n64, source);
  Loom__CheckpointManifest *mf = NULL;
  st = loom_manifest_decode((const uint8_t *)bytes, (size_t)n64, step, path, &mf, err);
  /* What every rank needs, gathered, so each sees the whole plan of transfers. */
  int32_t *mine = loom_xcalloc((size_t)world + 1, sizeof *mine, "restore needs");
  int32_t count = st == LOOM_OK ? needed_shards(mf, chunks, n, mine) : 0, most = count;
  loom_comm_allreduce_typed(ps->world_group, &most, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  int32_t *needs = loom_xcalloc((size_t)world * (size_t)most + 1, sizeof *needs, "restore needs");
  for (int i = count; i < most; i++) mine[i] = -1;
  loom_comm_allgather_typed(ps->world_group, mine, needs, (size_t)most, LOOM_DTYPE_I32);
  int32_t bad = st != LOOM_OK;
  loom_comm_allreduce_typed(ps->world_group, &bad, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  char root[4300];
  snprintf(root, sizeof root, "%s/restore_rank_%05d", l->host_dir, ps->rank);
  if (!bad) st = gather_needed(l, step, mf, (const uint8_t *)bytes, (size_t)n64, needs, most, root, err);
  else if (st == LOOM_OK) st = loom_fail_elsewhere(err, LOOM_ERR_FORMAT, 0, "decode the local manifest");
  bad = st != LOOM_OK;
  loom_comm_allreduce_typed(ps->world_group, &bad, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  int64_t loaded = -1;
  if (!bad) st = loom_ckpt_resume(root, chunks, n, run, from, &loaded, err);
  else if (st == LOOM_OK) st = loom_fail_elsewhere(err, LOOM_ERR_IO, 0, "gather the in-memory shards");
  remove_restore(root, step);
  if (mf) loom__checkpoint_manifest__free_unpacked(mf, NULL);
  free(bytes);
  free(mine);
  free(needs);
  return st;
}

void loom_local_ckpt_log_sources(const loom_local_ckpt *l, int64_t step, int64_t persistent) {
  if (l->ps->rank == 0) log_sources(l, step, persistent);
}
