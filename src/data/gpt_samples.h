/* Megatron's GPT samples over a range of an indexed dataset's sequences
 * (each sequence a document): every epoch orders the documents by a seeded
 * shuffle, lays their tokens end to end, and cuts samples of seq+1 tokens at
 * stride seq, across document boundaries, as GPTDataset does; the samples of
 * an epoch are then drawn in a seeded permutation. Only the current epochs'
 * document orders are held (two, so a batch may straddle an epoch). */
#ifndef LOOM_GPT_SAMPLES_H
#define LOOM_GPT_SAMPLES_H

#include <stdbool.h>
#include <stdint.h>
#include "data/indexed.h"

typedef struct {
  int64_t epoch;     /* -1: empty */
  int64_t *order;    /* [docs] document order */
  int64_t *cum;      /* [docs + 1] tokens before each position */
} gpt_epoch;

typedef struct {
  const loom_indexed *ix;
  int64_t first, docs;       /* sequences [first, first + docs) */
  int64_t tokens, samples;   /* per epoch */
  int T;
  bool shuffle;
  uint64_t seed, stream;
  gpt_epoch cache[2];
  int next_evict;
} gpt_samples;

/* Samples of T+1 tokens over sequences [first, first + docs); false if there
 * is not one sample's worth of tokens. */
bool gpt_samples_init(gpt_samples *s, const loom_indexed *ix, int64_t first, int64_t docs, int T, bool shuffle, uint64_t seed,
                      uint64_t stream);
void gpt_samples_free(gpt_samples *s);
/* Sample k (k >= 0, epochs after the first repeat in new orders) into window[T+1]. */
void gpt_samples_window(gpt_samples *s, int64_t k, int *window);

#endif
