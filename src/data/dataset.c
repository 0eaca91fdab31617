/* Batches from datasets, shared by every kind of dataset. */
#include <stdlib.h>
#include "core/check.h"
#include "data/dataset.h"

void loom_dataset_batch(loom_dataset *ds, loom_split split, int64_t first_sample, int T, int B,
                        int *tokens, int *targets) {
  int *window = loom_xmalloc((size_t)(T + 1) * sizeof(int), "data window");
  for (int b = 0; b < B; b++) {
    ds->window(ds, split, first_sample + b, T, window);
    for (int t = 0; t < T; t++) {
      tokens[t * B + b] = window[t];
      targets[t * B + b] = window[t + 1];
    }
  }
  free(window);
}

void loom_dataset_free(loom_dataset *ds) {
  if (ds) ds->free(ds);
}
