/* Megatron indexed datasets: the first 4 bytes give the .idx part's length
 * (modulo what follows), the rest is the .idx then the .bin. Whatever the
 * check accepts is then read whole, sequence by sequence. */
#include <stdlib.h>
#include <string.h>
#include "data/indexed.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  uint32_t split;
  memcpy(&split, data, 4);
  data += 4;
  size -= 4;
  split = size ? split % (uint32_t)(size + 1) : 0;
  loom_indexed d = {.idx = data, .idx_bytes = split, .bin = data + split, .bin_bytes = size - split};
  loom_error err;
  const int vocabs[2] = {50257, 1 << 20};
  for (int k = 0; k < 2; k++) {
    if (loom_indexed_check(&d, "fuzz.idx", "fuzz.bin", vocabs[k], &err) != LOOM_OK) continue;
    int window[64];
    for (int64_t s = 0; s < d.sequences; s++) {
      const int64_t len = loom_indexed_length(&d, s);
      for (int64_t at = 0; at < len; at += 64) loom_indexed_read(&d, s, at, len - at < 64 ? len - at : 64, window);
    }
  }
  return 0;
}
