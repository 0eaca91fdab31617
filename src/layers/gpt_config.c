/* GPT presets and shape checks. */
#include <stdio.h>
#include <string.h>
#include "layers/gpt_config.h"

typedef struct {
  const char *name;
  loom_gpt_config cfg;
} preset;

/* gpt-tiny is the default: small enough to learn 2-digit addition on 2 cores
 * in about a minute (wider or deeper models sit longer on the plateau before
 * attention finds the digits it needs). */
static const preset PRESETS[] = {
    {"gpt-tiny", {.layers = 2, .hidden = 64, .heads = 4, .vocab = 256, .seq = 64, .norm_eps = 1e-5f}},
    {"gpt2-small", {.layers = 12, .hidden = 768, .heads = 12, .vocab = 50257, .seq = 1024, .norm_eps = 1e-5f}},
    {"gpt-1.3b", {.layers = 24, .hidden = 2048, .heads = 16, .vocab = 50257, .seq = 2048, .norm_eps = 1e-5f}},
    {"gpt-13b", {.layers = 40, .hidden = 5120, .heads = 40, .vocab = 50257, .seq = 2048, .norm_eps = 1e-5f}},
    {"gpt50b", {.layers = 64, .hidden = 8192, .heads = 64, .ffn = 32768, .vocab = 51200, .seq = 2048, .norm_eps = 1e-5f}},
    {"gpt-175b", {.layers = 96, .hidden = 12288, .heads = 96, .vocab = 50257, .seq = 2048, .norm_eps = 1e-5f}},
};

int loom_gpt_config_preset(loom_gpt_config *cfg, const char *name) {
  for (size_t i = 0; i < sizeof PRESETS / sizeof PRESETS[0]; i++) {
    if (strcmp(PRESETS[i].name, name) == 0) {
      *cfg = PRESETS[i].cfg;
      loom_gpt_config_finish(cfg);
      return 0;
    }
  }
  return -1;
}

const char *loom_gpt_config_preset_names(void) { return "gpt-tiny, gpt2-small, gpt-1.3b, gpt-13b, gpt50b, gpt-175b"; }

void loom_gpt_config_finish(loom_gpt_config *cfg) {
  if (cfg->ffn <= 0) cfg->ffn = 4 * cfg->hidden;
  if (cfg->vocab > 0) {
    cfg->padded_vocab = (cfg->vocab + LOOM_VOCAB_ALIGN - 1) / LOOM_VOCAB_ALIGN * LOOM_VOCAB_ALIGN;
  }
}

loom_gpt_config loom_gpt_config_for_tp(const loom_gpt_config *cfg, int tp) {
  loom_gpt_config c = *cfg;
  const int align = LOOM_VOCAB_ALIGN * tp;
  c.padded_vocab = (c.vocab + align - 1) / align * align;
  return c;
}

const char *loom_gpt_config_check(const loom_gpt_config *cfg, char *msg, size_t msg_len) {
  if (cfg->heads < 1) snprintf(msg, msg_len, "--heads must be at least 1 (got %d)", cfg->heads);
  else if (cfg->hidden % cfg->heads != 0)
    snprintf(msg, msg_len, "--hidden %d is not divisible by --heads %d; pick heads that divide hidden",
             cfg->hidden, cfg->heads);
  else if (cfg->dropout < 0.0f || cfg->dropout >= 1.0f)
    snprintf(msg, msg_len, "--dropout must be in [0, 1) (got %g)", (double)cfg->dropout);
  else return NULL;
  return msg;
}
