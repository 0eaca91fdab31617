/* Checkpoint manifests: the bytes as given (which rarely carry a valid
 * checksum), then the same message sealed with a valid checksum, as a
 * hostile or buggy writer would, so the checks past the checksum and the
 * run it describes are reached too. */
#include <stdlib.h>
#include "ckpt/manifest.h"
#include "core/crc32c.h"

static void decode(const uint8_t *bytes, size_t n, int64_t step) {
  Loom__CheckpointManifest *mf;
  loom_error err;
  if (loom_manifest_decode(bytes, n, step, "fuzz", &mf, &err) != LOOM_OK) return;
  loom_ckpt_run run;
  loom_manifest_run(mf, &run);
  loom__checkpoint_manifest__free_unpacked(mf, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Loom__CheckpointManifest *mf = loom__checkpoint_manifest__unpack(NULL, size, data);
  if (!mf) return 0;
  decode(data, size, mf->step);
  mf->has_crc32c = 0;
  size_t n = loom__checkpoint_manifest__get_packed_size(mf);
  uint8_t *sealed = malloc(n + 8);
  if (sealed) {
    loom__checkpoint_manifest__pack(mf, sealed);
    mf->has_crc32c = 1;
    mf->crc32c = loom_crc32c(0, sealed, n);
    n = loom__checkpoint_manifest__pack(mf, sealed);
    decode(sealed, n, mf->step);
    free(sealed);
  }
  loom__checkpoint_manifest__free_unpacked(mf, NULL);
  return 0;
}
