/* Sharded checkpoints: every rank writes its own shard file (its parameters
 * and Adam moments, each tensor with canonical name, global shape, offset
 * and checksum); rank 0 writes the protobuf manifest only after every rank
 * has finished, and points DIR/latest at the new step directory by an
 * atomic rename. A crash at any moment leaves the previous checkpoint whole.
 *
 * Resuming restores parameters, moments and the step; everything else a run
 * depends on (data order, dropout masks, learning rate) is a function of the
 * step and seed, so the resumed run continues bit-identically. This version
 * resumes onto the same layout; resharding onto another plan comes later. */
#ifndef LOOM_CHECKPOINT_H
#define LOOM_CHECKPOINT_H

#include "layers/gpt.h"
#include "optim/adamw.h"
#include "tensor_parallel/parallel_state.h"

typedef struct {
  const loom_gpt_config *cfg; /* the whole model */
  int micro_batch, global_batch, vpp;
  uint64_t seed;
} loom_ckpt_run;

/* Saves step `step` (optimizer steps taken) under dir; collective over the world. */
loom_status loom_ckpt_save(const char *dir, int64_t step, loom_gpt *chunks, loom_adamw *opts, int n,
                           const loom_parallel *ps, const loom_ckpt_run *run, loom_error *err);
/* Loads the checkpoint dir/latest points at into this rank's chunks and
 * optimizers; *step gets its step. Refuses another layout or model. */
loom_status loom_ckpt_resume(const char *dir, loom_gpt *chunks, loom_adamw *opts, int n, const loom_parallel *ps,
                             const loom_ckpt_run *run, int64_t *step, loom_error *err);

/* Checks the checkpoint dir/latest names without loading a model: every
 * shard's size and checksum against the manifest, and every tensor's
 * checksum and shape. *shards and *tensors count what was checked. */
loom_status loom_ckpt_verify(const char *dir, int *shards, int *tensors, loom_error *err);

#endif
