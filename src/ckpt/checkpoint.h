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

#include <stdbool.h>
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
  /* model.moe.expert_bias: the trainer's [layers x experts], which a save
   * records and a resume fills (NULL, 0: none) */
  float *expert_bias;
  size_t expert_bias_count;
  /* FP8 delayed scaling: the trainer's scales [fp8_count] and amax histories [fp8_count x cfg.fp8.history], which a
   * save records and a resume fills (NULL, 0: none) */
  float *fp8_scale, *fp8_history;
  size_t fp8_count;
  /* Grad compression: its method (kind NONE: none) and the layout whose
   * ranks hold its state in the shards ("tp 2 cp 1 dp 2 ..."), which only
   * the same layout and method resume; NULL: no state saved. */
  Loom__CompressionKind compression_kind;
  int compression_rank;
  const char *compression_layout;
} loom_ckpt_run;

/* Saves step `step` (optimizer steps taken) of this rank's chunks under dir,
 * keeping the newest `keep` steps (0: all); collective over the world.
 * *total_bytes gets the size of every rank's shard file together. */
loom_status loom_ckpt_save(const char *dir, int64_t step, int keep, const loom_ckpt_chunk *chunks, int n,
                           const loom_parallel *ps, const loom_ckpt_run *run, int64_t *total_bytes, loom_error *err);

/* Asynchronous saves (--async-save), as Megatron-LM's: the same start as
 * loom_ckpt_save (collective), then this rank's pieces copied to host
 * memory in pieces of at most LOOM_CKPT_STAGE_BYTES, then a thread writes
 * the shard while training goes on. The manifest and latest are written
 * only in loom_ckpt_async_finish, once every rank's shard is durable, so a
 * crash at any point leaves the previous checkpoint the one latest names.
 * Returns an error only where the start failed (every rank alike); a
 * failure after it is reported by the finish. */
#define LOOM_CKPT_STAGE_BYTES ((size_t)64 << 20)
typedef struct loom_ckpt_async loom_ckpt_async;
/* The host memory the shard is copied into, kept from one save to the next
 * (grown when a shard outgrows it): pages touched for the first time cost
 * far more than the copy into them (6 s against 0.1 s for 1.5 GB on this
 * project's machines), and only the first save pays that. */
typedef struct {
  float *data;
  size_t floats;
} loom_ckpt_arena;
void loom_ckpt_arena_free(loom_ckpt_arena *arena);
loom_status loom_ckpt_async_begin(loom_ckpt_async **out, const char *dir, int64_t step, int keep,
                                  const loom_ckpt_chunk *chunks, int n, const loom_parallel *ps, const loom_ckpt_run *run,
                                  loom_ckpt_arena *arena, loom_error *err);
/* The same into host memory with a replica on a peer (local_ckpt.h), finished by loom_ckpt_async_finish. */
typedef struct loom_local_ckpt loom_local_ckpt;
loom_status loom_ckpt_async_begin_local(loom_ckpt_async **out, loom_local_ckpt *local, int64_t step,
                                        const loom_ckpt_chunk *chunks, int n, const loom_parallel *ps,
                                        const loom_ckpt_run *run, loom_ckpt_arena *arena, loom_error *err);
/* What a finished save did: its step, bytes over every rank, and this
 * rank's seconds copying to host (the step loop's stall) and writing. */
typedef struct {
  bool done;
  int64_t step, bytes;
  double staged_s, write_s;
} loom_ckpt_async_report;
/* Collective over the world. Blocking: waits for this rank's writer, then
 * records the checkpoint. Else only when every rank's writer has finished
 * (one all-reduce to ask), which report->done says. *a becomes NULL once
 * recorded (or failed); NULL: nothing in flight. */
loom_status loom_ckpt_async_finish(loom_ckpt_async **a, bool blocking, loom_ckpt_async_report *report, loom_error *err);

/* Waits for this rank's writer and drops the save unrecorded (a run ending
 * on an error, where collectives may not be reached): latest stays on the
 * previous step. Not collective; NULL: nothing. */
void loom_ckpt_async_abandon(loom_ckpt_async **a);

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
