/* Sharded checkpoints: every rank writes its own shard file (see
 * ckpt_tensors.h for which pieces); rank 0 writes the protobuf manifest only
 * after every rank has reported success, then points DIR/latest at the new
 * step directory by an atomic rename, then prunes old steps beyond --keep.
 * A crash at any moment leaves the previous checkpoint whole.
 *
 * Loading is by global offsets, so any plan (tp, pp, vpp, dp, ZeRO stage) loads
 * a checkpoint of any other with no conversion step. Everything else a run
 * depends on (data order, dropout masks, learning rate) is a function of the
 * step and seed, so a resumed run continues bit-identically on the same plan
 * and within fp32 rounding on another. */
#ifndef LOOM_CHECKPOINT_H
#define LOOM_CHECKPOINT_H

#include "ckpt/ckpt_tensors.h"
#include "optim/lr_schedule.h"
#include "tensor_parallel/parallel_state.h"

/* The run a checkpoint belongs to: model, layout and training state. */
typedef struct {
  loom_gpt_config cfg; /* the whole model */
  int tp, pp, dp, vpp, zero;
  int micro_batch, global_batch;
  uint64_t seed;
  loom_lr_schedule lr;
  const char *data; /* the token file, or NULL for the addition task */
} loom_ckpt_run;

/* Saves step `step` (optimizer steps taken) of this rank's chunks under dir,
 * keeping the newest `keep` steps (0: all); collective over the world.
 * *total_bytes gets the size of every rank's shard file together. */
loom_status loom_ckpt_save(const char *dir, int64_t step, int keep, const loom_ckpt_chunk *chunks, int n,
                           const loom_parallel *ps, const loom_ckpt_run *run, int64_t *total_bytes, loom_error *err);

/* Loads the checkpoint dir/latest names into this rank's chunks and sets
 * their step counters; *from gets the run that wrote it (its step in
 * *step). Refuses another model, global batch, seed or LR schedule. */
loom_status loom_ckpt_resume(const char *dir, const loom_ckpt_chunk *chunks, int n, const loom_ckpt_run *run,
                             loom_ckpt_run *from, int64_t *step, loom_error *err);

/* Refuses a checkpoint of model m where model c is wanted (`theirs` names
 * what holds c in the message: "this run", a plan file). */
loom_status loom_ckpt_check_model(const char *where, const loom_gpt_config *m, const loom_gpt_config *c, const char *theirs,
                                  loom_error *err);
/* Writes dst as a checkpoint of src's latest step for the layout in `to`
 * (model and training state are src's), one rank at a time, in this
 * process. layer_counts (ncounts entries, or NULL) splits the layers over
 * the pp * vpp stages. model (or NULL): the model the new layout was made
 * for, which must be the checkpoint's; model_from names it in the refusal. */
loom_status loom_ckpt_reshard(const char *src, const char *dst, int tp, int pp, int dp, int vpp, int zero,
                              const int *layer_counts, int ncounts, const loom_gpt_config *model, const char *model_from,
                              loom_error *err);

/* Checks the checkpoint dir/latest names without loading a model: every
 * shard's size and checksum against the manifest, every piece's checksum
 * and bounds, and that the pieces of each tensor add up to its global
 * shape. *shards and *tensors count what was checked. */
loom_status loom_ckpt_verify(const char *dir, int *shards, int *tensors, loom_error *err);

#endif
