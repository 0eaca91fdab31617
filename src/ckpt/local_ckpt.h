/* Checkpoints in host memory, replicated to a peer (--local-save-every).
 *
 * Every K steps each rank writes its shard, as the persistent save does
 * (checkpoint.h, asynchronously), into a host-local directory ROOT/HOST
 * (tmpfs: /dev/shm by default), and sends a copy to its partner: the rank
 * of the same local index on the next host in the host map, so losing one
 * host loses no shard that another host does not hold too. Once every
 * shard and replica is in place, the lowest rank of each host writes that
 * host's copy of the step's manifest (sizes, checksums, pieces), last: a
 * step without it is partial and never loaded. The two newest steps stay.
 *
 * On restart each rank checks the copies it wrote (its own shard and the
 * replicas it holds) against its host's manifest: size, binding to the
 * save, step and rank, and the whole file's CRC-32C; a copy that fails is
 * refused with a line saying why. The newest step whose every shard is
 * held somewhere, at this run's layout, is loaded: shards on a rank's own
 * host are read in place, the rest sent over the network by a rank that
 * holds them, and then loaded by the same code as a persistent checkpoint.
 * The caller falls back to the persistent checkpoint when no such step is
 * newer. */
#ifndef LOOM_LOCAL_CKPT_H
#define LOOM_LOCAL_CKPT_H

#include "ckpt/checkpoint.h"
#include "ckpt/manifest.h"

struct loom_local_ckpt {
  char root[2048], host_dir[2200];
  const loom_parallel *ps;
  int host, hosts; /* this rank's host (in the order of their lowest ranks), and their number */
  bool host_leader; /* the lowest rank of its host: it writes, prunes and removes the host's copies */
  int *host_of;    /* [world] each rank's host */
  char (*host_names)[64];
  int partner;     /* the rank holding this rank's replica (-1: a world of one) */
  int *sources;    /* the ranks whose replicas this rank holds */
  int nsources;
  int64_t save_id; /* the save loom_local_ckpt_newest chose */
  int64_t *held;   /* after a survey: [world * LOOM_LOCAL_HELD * 4] every rank's valid copies (step, save id, shard, kind) */
  int *holders;    /* of the chosen save: [world * 2] the rank holding each shard's own copy, and its replica (-1: none) */
};

/* Complete steps each host keeps; while a save is written, one more. */
#define LOOM_LOCAL_KEEP 2
/* Host memory the copies take per rank, for a shard of shard_bytes: its own and one replica for each step kept and
 * the one being written, and the staging copy the save is taken from. */
static inline double loom_local_ckpt_host_bytes(double shard_bytes) { return shard_bytes * (2.0 * (LOOM_LOCAL_KEEP + 1) + 1.0); }

/* Copies a rank reports in a survey: its own shard and its replicas, of the newest steps. */
#define LOOM_LOCAL_STEPS 3
#define LOOM_LOCAL_SOURCES 4
#define LOOM_LOCAL_HELD (LOOM_LOCAL_STEPS * (1 + LOOM_LOCAL_SOURCES))

/* The host map (every rank's host name, gathered), the partners, and ROOT/HOST made. Collective. */
loom_status loom_local_ckpt_init(loom_local_ckpt *l, const char *root, const loom_parallel *ps, loom_error *err);
/* Frees l; with remove, this host's copies go too (a run that ended with a persistent checkpoint). Not collective:
 * each host's lowest rank removes. */
void loom_local_ckpt_free(loom_local_ckpt *l, bool remove);

/* The end of a local save of step (save_id), this rank's shard written to sub (its status `wrote`, its size and
 * checksum `mine`): the replicas exchanged, each host's manifest written, older steps pruned. *total_bytes: every
 * rank's shard together. Collective. */
loom_status loom_local_ckpt_record(loom_local_ckpt *l, const char *sub, int64_t step, uint64_t save_id,
                                   const loom_ckpt_run *run, loom_status wrote, loom_shard_written mine,
                                   int64_t *total_bytes, loom_error *err);

/* The newest step a complete set of copies holds for this run's layout and model (-1: none); refused copies are
 * named in a line each. Collective. */
loom_status loom_local_ckpt_newest(loom_local_ckpt *l, const loom_ckpt_run *run, int64_t *step, loom_error *err);
/* Loads that step (from loom_local_ckpt_newest) into chunks, as loom_ckpt_resume, and says where each shard came
 * from. Collective. */
loom_status loom_local_ckpt_restore(loom_local_ckpt *l, int64_t step, const loom_ckpt_chunk *chunks, int n,
                                    const loom_ckpt_run *run, loom_ckpt_run *from, loom_error *err);

/* Rank 0 says where each shard of the restored step came from, and what the persistent checkpoint held (-1: none). */
void loom_local_ckpt_log_sources(const loom_local_ckpt *l, int64_t step, int64_t persistent);

#endif
