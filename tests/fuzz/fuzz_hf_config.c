/* Hugging Face config.json files: the JSON reader and every field's check. */
#include "ckpt/hf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  loom_error err;
  loom_gpt_config cfg;
  (void)loom_hf_parse_config((const char *)data, size, "config.json", &cfg, &err);
  return 0;
}
