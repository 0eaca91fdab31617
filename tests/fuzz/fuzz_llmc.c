/* llm.c model files: the header, and for models of at most 65,536
 * parameters (so a long run stays fast) the whole load. */
#include "ckpt/llmc_model.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_file f;
  fuzz_file_open(&f, data, size);
  loom_error err;
  loom_gpt_config cfg;
  if (loom_llmc_read_config(f.path, &cfg, &err) == LOOM_OK && loom_gpt_param_count(&cfg, NULL, 1) <= (1u << 16)) {
    loom_gpt_params p;
    if (loom_gpt_params_init_weights(&p, &cfg, 0, 1, NULL, &loom_host_memory) == LOOM_OK) {
      (void)loom_llmc_load(f.path, &p, &err);
      loom_gpt_params_free(&p);
    }
  }
  fuzz_file_close(&f);
  return 0;
}
