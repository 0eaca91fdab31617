/* Layer ranges of pipeline stages. */
#include <stdlib.h>
#include "pipeline/layer_split.h"

loom_status loom_layer_split(int layers, int stages, const int *counts, int ncounts, int *begin, loom_error *err) {
  begin[0] = 0;
  if (!counts) {
    for (int s = 0; s < stages; s++) begin[s + 1] = begin[s] + layers / stages + (s < layers % stages);
    return LOOM_OK;
  }
  if (ncounts != stages)
    return loom_fail(err, LOOM_ERR_USAGE, "--layer-split has %d entries but there are %d stages (pp x vpp)", ncounts,
                     stages);
  for (int s = 0; s < stages; s++) {
    if (counts[s] < 0)
      return loom_fail(err, LOOM_ERR_USAGE, "--layer-split entry %d is negative (%d)", s, counts[s]);
    begin[s + 1] = begin[s] + counts[s];
  }
  if (begin[stages] != layers)
    return loom_fail(err, LOOM_ERR_USAGE,
                     "--layer-split covers %d layers but the model has %d; every layer must be covered exactly once",
                     begin[stages], layers);
  return LOOM_OK;
}

int loom_layer_split_parse(const char *text, int *counts, int max) {
  int n = 0;
  for (const char *p = text; *p;) {
    char *end;
    const long v = strtol(p, &end, 10);
    if (end == p || n == max || v < -1000000 || v > 1000000) return -1;
    counts[n++] = (int)v;
    if (*end == ',') end++;
    else if (*end != '\0') return -1;
    p = end;
  }
  return n;
}
