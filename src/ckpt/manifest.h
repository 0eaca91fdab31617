/* A checkpoint directory's bookkeeping: DIR/step_NNNNNNNN/ holds one shard
 * file per rank and manifest.pb; DIR/latest names the newest complete step. */
#ifndef LOOM_MANIFEST_H
#define LOOM_MANIFEST_H

#include <stdbool.h>
#include "ckpt/assemble.h"
#include "ckpt/checkpoint.h"
#include "loom.pb-c.h"

typedef struct {
  int64_t bytes;
  uint32_t crc32c;
} loom_shard_written;

/* DIR/step_NNNNNNNN, and rank r's shard file in it. */
void loom_ckpt_step_dir(const char *dir, int64_t step, char *out, size_t len);
void loom_ckpt_shard_path(const char *step_dir, int rank, char *out, size_t len);
loom_status loom_ckpt_make_dir(const char *path, loom_error *err);
/* Removes one step directory and its files (a save that failed part-way). */
void loom_ckpt_remove_step(const char *step_dir);
/* Removes a checkpoint directory: its steps, latest, then the directory if
 * nothing else is in it. */
void loom_ckpt_remove(const char *dir);

/* Records a complete step: its manifest (the run, and each rank's shard
 * size, checksum and list of pieces, read from the shard's header table,
 * so a loader opens only the files it needs), then DIR/latest by atomic rename, then removes all
 * but the newest `keep` steps (0 keeps all). */
loom_status loom_manifest_publish(const char *dir, int64_t step, uint64_t save_id, const loom_ckpt_run *run,
                                  const loom_shard_written *shards, int nshards, int keep, loom_error *err);
/* The sealed manifest of step `step` as bytes (*out malloc'd): the run and the shards' infos (where names the step in
 * messages). */
loom_status loom_manifest_encode(int64_t step, uint64_t save_id, const loom_ckpt_run *run, Loom__ShardFileInfo **shards,
                                 int nshards, const char *where, uint8_t **out, size_t *len, loom_error *err);
/* A written shard's entry in a manifest: its file name (into file), size, checksum and pieces, read from the file at
 * path. Free the pieces with loom_manifest_shard_info_free. */
loom_status loom_manifest_shard_info(const char *path, int rank, loom_shard_written w, Loom__ShardFileInfo *info,
                                     char file[32], loom_error *err);
void loom_manifest_shard_info_free(Loom__ShardFileInfo *info);
/* Whether the shard holds a piece `wants` needs (every shard when wants is NULL). */
bool loom_manifest_shard_needed(const Loom__ShardFileInfo *info, const loom_want_index *wants);
/* The step DIR/latest names (one step_NNNNNNNN line in a regular file). */
loom_status loom_ckpt_latest_step(const char *dir, int64_t *step, loom_error *err);
/* Sets mf's own checksum (CRC-32C of it packed without the field), as the
 * writer does; false when out of memory. */
bool loom_manifest_seal(Loom__CheckpointManifest *mf);
/* Decodes a manifest read from path, the directory of `step`: it must carry
 * a valid checksum of itself, sizes within the plan's bounds and that step. */
loom_status loom_manifest_decode(const uint8_t *bytes, size_t n, int64_t step, const char *path,
                                 Loom__CheckpointManifest **out, loom_error *err);
/* Reads and decodes the manifest DIR/latest names; *step_dir gets its directory. */
loom_status loom_manifest_read(const char *dir, char *step_dir, size_t len, Loom__CheckpointManifest **out, loom_error *err);
/* The run a manifest describes (run->data, expert_bias and compression_layout point into mf). */
void loom_manifest_run(const Loom__CheckpointManifest *mf, loom_ckpt_run *run);
/* Fills bias[count] (a model's expert bias, layers x experts; count 0:
 * the run has none, so any recorded is left, with a line saying so) from
 * the manifest's: all 0 when the manifest holds none (a checkpoint of a run
 * without it), refused when it holds another count or a value not finite. */
loom_status loom_manifest_expert_bias(const char *where, const Loom__CheckpointManifest *mf, float *bias, size_t count,
                                      loom_error *err);
/* FP8 delayed scaling's state into run's fp8_scale and fp8_history (fp8_count operands, cfg.fp8.history each)
 * from the manifest's: the scales 1 and the history empty where it holds none (a line says so), the history
 * empty under another history length (likewise), refused for another operand count or a scale not positive and
 * finite or an amax below 0. A run without delayed scaling (fp8_count 0) takes nothing. */
loom_status loom_manifest_fp8(const char *where, const Loom__CheckpointManifest *mf, const loom_ckpt_run *run,
                              loom_error *err);
/* A fresh id for a save (random bits; a save shares rank 0's). */
uint64_t loom_ckpt_fresh_save_id(void);
/* The paths of a manifest's shard files that hold a piece `wants` needs
 * (every file when wants is NULL), each checked to exist at its recorded
 * size and to be bound to the manifest's save, step and rank; *npaths counts
 * them. Free with loom_manifest_paths_free. */
loom_status loom_manifest_paths(const char *step_dir, const Loom__CheckpointManifest *mf, const loom_want_index *wants,
                                char ***paths, int *npaths, loom_error *err);
void loom_manifest_paths_free(char **paths, size_t n);

#endif
