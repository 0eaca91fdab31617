/* Datasets: a source of token windows addressed by (split, global sample).
 *
 * Sample g of a split is a pure function of (seed, g), so the data a run
 * sees depends only on the seed and the global batch, never on how the batch
 * is split across micro-batches or ranks. A window holds T+1 tokens: inputs
 * are its first T, targets its last T. A task may mark some tokens as not
 * worth predicting (the random operands of a sum): they get target -1 and
 * stay out of the loss. */
#ifndef LOOM_DATASET_H
#define LOOM_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core/status.h"

typedef enum { LOOM_SPLIT_TRAIN = 0, LOOM_SPLIT_HELDOUT = 1 } loom_split;
typedef enum { LOOM_ORDER_SEQUENTIAL = 0, LOOM_ORDER_SHUFFLED = 1 } loom_data_order;

typedef struct loom_dataset loom_dataset;
struct loom_dataset {
  const char *name;
  /* Writes window[T+1] of global sample g of the split, and scored[T+1]:
   * 1 where the token is a training target, 0 where it is masked out. */
  void (*window)(loom_dataset *ds, loom_split split, int64_t g, int T, int *window, unsigned char *scored);
  /* Optional: one line on how the first `samples` train samples are drawn. */
  void (*describe)(loom_dataset *ds, int64_t samples, char *buf, size_t cap);
  /* Samples in one pass (an epoch) over a split; NULL where unbounded (a synthetic task). */
  int64_t (*samples)(const loom_dataset *ds, loom_split split);
  void (*free)(loom_dataset *ds);
  void *impl;
};

/* Fills tokens[T,B] and targets[T,B] (sequence-major) with samples
 * first_sample .. first_sample+B-1 of the split; masked targets are -1.
 * Returns the number of unmasked targets. */
int64_t loom_dataset_batch(loom_dataset *ds, loom_split split, int64_t first_sample, int T, int B,
                           int *tokens, int *targets);
/* Targets (unmasked tokens past the first) in windows first .. first+count-1 of the split. */
int64_t loom_dataset_count_targets(loom_dataset *ds, loom_split split, int64_t first, int count, int T);
void loom_dataset_free(loom_dataset *ds);

/* A dataset over an llm.c token file. Train uses windows of T+1 tokens at
 * stride T from the start (as llm.c does), in file order or shuffled per
 * epoch. The held-out split is heldout_path if given, else (with
 * hold_out_tail) the last 1/20 of the windows, at least one; without either
 * every window is train and there is no held-out split. */
loom_status loom_dataset_open_tokens(loom_dataset **out, const char *path, const char *heldout_path,
                                     int vocab, int T, loom_data_order order, uint64_t seed,
                                     bool hold_out_tail, loom_error *err);
/* What --data names, as Megatron's arguments do: */
typedef struct {
  const char *data;      /* an llm.c token file, a Megatron indexed dataset's prefix, or "W1 PREFIX1 W2 PREFIX2 ..." */
  const char *eval_data; /* held-out data of the same kinds, or NULL for the held-out part of data */
  const char *split;     /* indexed data: Megatron's --split shares of train,held-out,test documents */
  int vocab, T;
  bool shuffle;          /* document and sample order (window order for llm.c files) */
  uint64_t seed;
  bool hold_out;         /* a held-out split is needed */
} loom_data_options;

#define LOOM_DEFAULT_SPLIT "969,30,1" /* Megatron's default */

/* Opens --data: indexed datasets (and blends of them) give Megatron's GPT
 * samples (gpt_samples.h), drawn in Megatron's blending order; an llm.c file
 * opens as loom_dataset_open_tokens (its tail held out). */
loom_status loom_dataset_open(loom_dataset **out, const loom_data_options *o, loom_error *err);
/* Megatron's get_split_indices: bounds[0..3] of the train, held-out and test
 * documents of `docs` for a --split such as "969,30,1", each share rounded
 * half to even, the rounding error taken off every bound after the first. */
loom_status loom_data_split_bounds(const char *split, int64_t docs, int64_t bounds[4], loom_error *err);
/* Whether a --data value names indexed data (a blend, or PREFIX.idx exists). */
bool loom_data_is_indexed(const char *spec);

/* Samples in one pass over a split, or -1 where unbounded. */
int64_t loom_dataset_samples(const loom_dataset *ds, loom_split split);

#endif
