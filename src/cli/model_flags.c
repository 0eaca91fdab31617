/* Model-shape flags and their resolution. */
#include <string.h>
#include "ckpt/llmc_model.h"
#include "cli/model_flags.h"
#include "plan/plan.h"

static const char *const PRESET_CHOICES[] = {"gpt-tiny", "gpt2-small", "gpt-1.3b", "gpt-13b", "gpt50b", "gpt-175b", NULL};

void loom_model_flags_table(loom_model_flags *mf, loom_flag *out) {
  const loom_flag table[LOOM_MODEL_FLAG_COUNT] = {
      {"--model", FLAG_STRING, &mf->preset, "model preset", LOOM_NO_RANGE, PRESET_CHOICES, false, NULL},
      {"--init-from", FLAG_STRING, &mf->init_from, "start from an llm.c model file instead of random init", LOOM_NO_RANGE, NULL, false, NULL},
      {"--layers", FLAG_INT, &mf->layers, "transformer layers (overrides the preset)", 1, LOOM_PLAN_MAX_LAYERS, NULL, false, "model.layers"},
      {"--hidden", FLAG_INT, &mf->hidden, "hidden size", 1, LOOM_PLAN_MAX_HIDDEN, NULL, false, "model.hidden"},
      {"--heads", FLAG_INT, &mf->heads, "attention heads", 1, LOOM_PLAN_MAX_HEADS, NULL, false, "model.heads"},
      {"--ffn", FLAG_INT, &mf->ffn, "MLP width (0: 4 * hidden)", 0, LOOM_PLAN_MAX_FFN, NULL, false, "model.ffn"},
      {"--vocab", FLAG_INT, &mf->vocab, "vocabulary size", 2, LOOM_PLAN_MAX_VOCAB, NULL, false, "model.vocab"},
      {"--seq", FLAG_INT, &mf->seq, "sequence length", 1, LOOM_PLAN_MAX_SEQ, NULL, false, "model.seq"},
      {"--dropout", FLAG_FLOAT, &mf->dropout, "dropout probability", 0, 0.99, NULL, false, "model.dropout"},
  };
  memcpy(out, table, sizeof table);
}

loom_status loom_model_flags_resolve(const char *cmd, const loom_model_flags *mf, const loom_flag *table,
                                     loom_gpt_config *cfg, int *T, loom_error *err) {
  static const char *const SHAPE[] = {"--layers", "--hidden", "--heads", "--ffn", "--vocab", "--model"};
  if (mf->init_from) {
    for (size_t i = 0; i < sizeof SHAPE / sizeof SHAPE[0]; i++)
      if (loom_flags_find(table, LOOM_MODEL_FLAG_COUNT, SHAPE[i])->set)
        return loom_fail(err, LOOM_ERR_USAGE, "%s: %s cannot be combined with --init-from: the model file fixes the shape",
                         cmd, SHAPE[i]);
    loom_status st = loom_llmc_read_config(mf->init_from, cfg, err);
    if (st != LOOM_OK) return st;
    cfg->dropout = mf->dropout;
    *T = loom_flags_find(table, LOOM_MODEL_FLAG_COUNT, "--seq")->set ? mf->seq : cfg->seq;
    if (*T > cfg->seq)
      return loom_fail(err, LOOM_ERR_USAGE, "%s: --seq %d exceeds the model's maximum sequence length %d",
                       cmd, *T, cfg->seq);
    return LOOM_OK;
  }
  loom_gpt_config_preset(cfg, mf->preset); /* the flag's choices guarantee a known preset */
  const int overrides[] = {mf->layers, mf->hidden, mf->heads, mf->ffn, mf->vocab, mf->seq};
  int *fields[] = {&cfg->layers, &cfg->hidden, &cfg->heads, &cfg->ffn, &cfg->vocab, &cfg->seq};
  static const char *const NAMES[] = {"--layers", "--hidden", "--heads", "--ffn", "--vocab", "--seq"};
  for (int i = 0; i < 6; i++)
    if (loom_flags_find(table, LOOM_MODEL_FLAG_COUNT, NAMES[i])->set) *fields[i] = overrides[i];
  if (!loom_flags_find(table, LOOM_MODEL_FLAG_COUNT, "--ffn")->set &&
      loom_flags_find(table, LOOM_MODEL_FLAG_COUNT, "--hidden")->set)
    cfg->ffn = 0; /* follow the new hidden size */
  cfg->dropout = mf->dropout;
  loom_gpt_config_finish(cfg); /* the plan's rules check the shape */
  *T = cfg->seq;
  return LOOM_OK;
}
