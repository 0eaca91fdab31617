/* A training run's files, for the runtime below: --init-from (llm.c weights
 * into this rank's shards, by global offsets, one tensor in memory at a
 * time), checkpoints (resume, and the loop's save hook), and --save (the
 * trained model as one llm.c file, exported by rank 0 from a sharded
 * checkpoint tensor by tensor: no rank gathers the model in memory). Every
 * call is collective over the run's world, and every rank returns the same
 * verdict. */
#ifndef LOOM_RUN_FILES_H
#define LOOM_RUN_FILES_H

#include "ckpt/export.h"
#include "ckpt/checkpoint.h"
#include "pipeline/trainer.h"

typedef struct {
  loom_trainer *tr;
  const char *dir; /* --ckpt, or NULL */
  int keep;
  loom_ckpt_chunk *chunks; /* [loom_pipeline_chunk_count(tr->pipe)] parameters and optimizer state */
  loom_ckpt_run run;
  bool async_save;          /* --async-save: the shard written on a thread while training goes on */
  loom_ckpt_async *pending; /* the asynchronous save in flight, or NULL */
  double pending_stall_s;   /* the step loop's stall starting it */
  loom_ckpt_arena arena;    /* the host copy of this rank's shard, kept between saves */
  loom_local_ckpt *local;        /* --local-save-every: checkpoints in host memory with peer replicas, or NULL */
  loom_ckpt_async *local_pending; /* the local save in flight, or NULL */
  double local_stall_s;
  loom_ckpt_arena local_arena;
  bool finished;                 /* the run ended with a persistent checkpoint: the local copies may go */
  char compression_layout[160]; /* run.compression_layout's text */
  bool locked;              /* rank 0 holds dir/.lock (lock_fd) for the run's life */
  int lock_fd;
} loom_run_files;

/* seed and data describe the run in the checkpoint's manifest. */
void loom_run_files_init(loom_run_files *f, loom_trainer *tr, const char *dir, int keep, uint64_t seed, const char *data);
void loom_run_files_free(loom_run_files *f);
/* Loads an llm.c model file's weights; the file's model must be the plan's. */
loom_status loom_run_init_from(loom_run_files *f, const char *path, loom_error *err);
/* Refuses a checkpoint directory that cannot be made or written, before
 * the first step rather than at the first save, or that another run holds:
 * rank 0 locks it (flock on dir/.lock, which names the holder) until
 * loom_run_files_free. */
loom_status loom_run_check_dir(loom_run_files *f, loom_error *err);
/* Keeps checkpoints in host memory under root/HOST too, replicated to a peer (ckpt/local_ckpt.h). Collective. */
loom_status loom_run_local_init(loom_run_files *f, const char *root, loom_error *err);
/* The loop's hook for an in-memory checkpoint of `step` (asynchronous as --async-save; recorded by loom_run_settle). */
loom_status loom_run_local_save(void *ctx, int64_t step, loom_error *err);
/* Loads dir/latest, from whatever plan wrote it; *first gets its step.
 * With local checkpoints, the newest complete in-memory set instead when
 * it is at least as new (with neither, *first is 0 and a line says so). */
loom_status loom_run_resume(loom_run_files *f, int64_t *first, loom_error *err);
/* The training loop's save hook (ctx: the loom_run_files): checkpoint `step`
 * under dir; with async_save, once an earlier save in flight is recorded,
 * start this one and return when its pieces are in host memory. */
loom_status loom_run_save(void *ctx, int64_t step, loom_error *err);
/* The loop's hook after each step (blocking: at the end of the run): record
 * an asynchronous save, and a local one, once every rank's shard is written.
 * Collective. */
loom_status loom_run_settle(void *ctx, bool blocking, loom_error *err);
/* The format --save writes: llm.c's file for GPT-2 (which it holds), a safetensors file for a Mixture of Experts
 * (its tensors by their Hugging Face names), else a Hugging Face directory. */
loom_model_format loom_run_save_format(const loom_gpt_config *cfg);
/* Writes the model after `step` to path, an llm.c file for GPT-2 and a
 * Hugging Face directory for other models (--save): from dir/latest
 * when the run keeps checkpoints (it was just saved), else through a
 * parameters-only checkpoint beside path, removed afterwards. */
loom_status loom_run_export(loom_run_files *f, int64_t step, const char *path, loom_error *err);

#endif
