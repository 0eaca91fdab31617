/* Batches from datasets, shared by every kind of dataset. */
#include <stdlib.h>
#include "core/check.h"
#include "data/dataset.h"

int64_t loom_dataset_batch(loom_dataset *ds, loom_split split, int64_t first_sample, int T, int B,
                           int *tokens, int *targets) {
  int *window = loom_xmalloc((size_t)(T + 1) * sizeof(int), "data window");
  unsigned char *scored = loom_xmalloc((size_t)(T + 1), "data window mask");
  int64_t counted = 0;
  for (int b = 0; b < B; b++) {
    ds->window(ds, split, first_sample + b, T, window, scored);
    for (int t = 0; t < T; t++) {
      tokens[t * B + b] = window[t];
      targets[t * B + b] = scored[t + 1] ? window[t + 1] : -1;
      counted += scored[t + 1];
    }
  }
  free(window);
  free(scored);
  return counted;
}

int64_t loom_dataset_count_targets(loom_dataset *ds, loom_split split, int64_t first, int count, int T) {
  int *tokens = loom_xmalloc((size_t)T * (size_t)count * sizeof(int), "data batch");
  int *targets = loom_xmalloc((size_t)T * (size_t)count * sizeof(int), "data batch targets");
  const int64_t counted = loom_dataset_batch(ds, split, first, T, count, tokens, targets);
  free(tokens);
  free(targets);
  return counted;
}

void loom_dataset_free(loom_dataset *ds) {
  if (ds) ds->free(ds);
}

int64_t loom_dataset_samples(const loom_dataset *ds, loom_split split) { return ds->samples ? ds->samples(ds, split) : -1; }
