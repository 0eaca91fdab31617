/* Tokenizer files: the first byte picks the format (a tokenizer.json, or a
 * tiktoken rank file for gpt2 or cl100k_base), the rest is the file. What
 * loads must encode a fixed text and the input itself, and decode both back
 * to their bytes exactly; a difference aborts. */
#include <stdlib.h>
#include <string.h>
#include "data/bpe_impl.h"
#include "fuzz_file.h"

static void round_trip(const loom_bpe *t, const char *text, size_t len) {
  for (int special = 0; special < 2; special++) {
    loom_bpe_encoder *e = loom_bpe_encoder_new(t, special);
    loom_ids ids = {0};
    loom_bpe_encode(e, text, len, &ids);
    loom_strbuf back = {0};
    loom_error err;
    if (loom_bpe_decode(t, ids.ids, ids.count, &back, &err) != LOOM_OK || back.len != len || memcmp(back.buf, text, len) != 0) abort();
    free(back.buf);
    loom_ids_free(&ids);
    loom_bpe_encoder_free(e);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  fuzz_file f;
  fuzz_file_open(&f, data + 1, size - 1);
  loom_error err;
  loom_bpe *t = NULL;
  loom_status st;
  switch (data[0] % 3) {
  case 0: st = bpe_load_tokenizer_json(&t, f.path, &err); break;
  case 1: st = bpe_load_tiktoken(&t, f.path, "gpt2", &err); break;
  default: st = bpe_load_tiktoken(&t, f.path, "cl100k_base", &err); break;
  }
  if (st == LOOM_OK) {
    static const char text[] = "Hello world's 123 \xe4\xb8\x96\xe7\x95\x8c <|endoftext|>\xff\xfe  \n\n x";
    round_trip(t, text, sizeof text - 1);
    round_trip(t, (const char *)data + 1, size - 1);
  }
  loom_bpe_free(t);
  fuzz_file_close(&f);
  return 0;
}
