/* Checkpoint shard files: the whole-file reader, and the piece index a
 * loader opens, loading each piece it lists. */
#include <stdlib.h>
#include "ckpt/shard_file.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_file f;
  fuzz_file_open(&f, data, size);
  loom_error err;
  loom_shard_file whole;
  if (loom_shard_file_read(f.path, &whole, &err) == LOOM_OK) loom_shard_file_free(&whole);
  loom_shard_binding binding;
  (void)loom_shard_read_binding(f.path, &binding, &err);
  loom_shard_index ix;
  if (loom_shard_index_open(f.path, &ix, &err) == LOOM_OK) {
    for (int i = 0; i < ix.count; i++) {
      float *dst = malloc((size_t)ix.tensors[i].count * sizeof(float) + 1);
      if (dst) (void)loom_shard_index_load(&ix, i, dst, &err);
      free(dst);
    }
    loom_shard_index_close(&ix);
  }
  fuzz_file_close(&f);
  return 0;
}
