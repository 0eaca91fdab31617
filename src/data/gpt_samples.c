/* GPT samples over an indexed dataset. */
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "core/rng.h"
#include "data/gpt_samples.h"
#include "data/shuffle.h"

bool gpt_samples_init(gpt_samples *s, const loom_indexed *ix, int64_t first, int64_t docs, int T, bool shuffle, uint64_t seed,
                      uint64_t stream) {
  *s = (gpt_samples){.ix = ix, .first = first, .docs = docs, .T = T, .shuffle = shuffle, .seed = seed, .stream = stream};
  for (int64_t i = 0; i < docs; i++) s->tokens += loom_indexed_length(ix, first + i);
  s->samples = s->tokens > 0 ? (s->tokens - 1) / T : 0;
  for (int c = 0; c < 2; c++) s->cache[c].epoch = -1;
  return s->samples > 0;
}

void gpt_samples_free(gpt_samples *s) {
  for (int c = 0; c < 2; c++) {
    free(s->cache[c].order);
    free(s->cache[c].cum);
  }
}

static const gpt_epoch *epoch_of(gpt_samples *s, int64_t epoch) {
  for (int c = 0; c < 2; c++)
    if (s->cache[c].epoch == epoch) return &s->cache[c];
  gpt_epoch *e = &s->cache[s->next_evict];
  s->next_evict ^= 1;
  if (!e->order) {
    e->order = loom_xmalloc((size_t)s->docs * sizeof *e->order, "document order");
    e->cum = loom_xmalloc((size_t)(s->docs + 1) * sizeof *e->cum, "document offsets");
  }
  if (s->shuffle) {
    loom_shuffle_identity(e->order, s->docs, s->seed, loom_hash_u64(loom_hash_u64(s->stream, 0xd0c), (uint64_t)epoch));
  } else {
    for (int64_t i = 0; i < s->docs; i++) e->order[i] = i;
  }
  e->cum[0] = 0;
  for (int64_t i = 0; i < s->docs; i++) e->cum[i + 1] = e->cum[i] + loom_indexed_length(s->ix, s->first + e->order[i]);
  e->epoch = epoch;
  return e;
}

void gpt_samples_window(gpt_samples *s, int64_t k, int *window) {
  const int64_t epoch = k / s->samples;
  int64_t j = k % s->samples;
  if (s->shuffle) j = loom_permute_index(j, s->samples, s->seed, loom_hash_u64(loom_hash_u64(s->stream, 0x5a3), (uint64_t)epoch));
  const gpt_epoch *e = epoch_of(s, epoch);
  int64_t at = j * s->T, lo = 0, hi = s->docs; /* the last position whose document starts at or before `at` */
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (e->cum[mid] <= at) lo = mid;
    else hi = mid;
  }
  int64_t filled = 0;
  for (int64_t p = lo; filled < s->T + 1; p++) {
    LOOM_CHECK(p < s->docs, "a sample ran past its epoch's tokens");
    const int64_t seq = s->first + e->order[p], from = at + filled - e->cum[p];
    const int64_t len = loom_indexed_length(s->ix, seq), take = len - from < s->T + 1 - filled ? len - from : s->T + 1 - filled;
    if (take > 0) loom_indexed_read(s->ix, seq, from, take, window + filled);
    filled += take > 0 ? take : 0;
  }
}
