/* llm.c token files, loaded for GPT-2's vocabulary and for a small one (so
 * the range check of every token is reached both ways). */
#include "data/token_file.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_file f;
  fuzz_file_open(&f, data, size);
  loom_error err;
  const int vocabs[2] = {50257, 256};
  for (int k = 0; k < 2; k++) {
    loom_token_file tokens;
    if (loom_token_file_load(&tokens, f.path, vocabs[k], &err) == LOOM_OK) loom_token_file_free(&tokens);
  }
  fuzz_file_close(&f);
  return 0;
}
