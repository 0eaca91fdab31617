/* Checkpoint manifests: the bytes as given (which rarely carry a valid
 * checksum), then the same message sealed with a valid checksum, as a
 * hostile or buggy writer would, so the checks past the checksum and the
 * run it describes are reached too. */
#include <stdlib.h>
#include "ckpt/manifest.h"

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
  uint8_t *sealed = loom_manifest_seal(mf) ? malloc(loom__checkpoint_manifest__get_packed_size(mf) + 1) : NULL;
  if (sealed) decode(sealed, loom__checkpoint_manifest__pack(mf, sealed), mf->step);
  free(sealed);
  loom__checkpoint_manifest__free_unpacked(mf, NULL);
  return 0;
}
