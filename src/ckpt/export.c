/* Exporting a model source to one file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ckpt/export.h"
#include "ckpt/hf.h"
#include "ckpt/hf_deepseek.h"
#include "ckpt/llmc_model.h"
#include "ckpt/safetensors.h"
#include "core/strbuf.h"
#include "core/write_file.h"

const char *const LOOM_MODEL_FORMAT_NAMES[LOOM_FORMAT_COUNT + 1] = {
    [LOOM_FORMAT_LLMC] = "llmc", [LOOM_FORMAT_SAFETENSORS] = "safetensors", [LOOM_FORMAT_HF] = "hf"};
const char *const LOOM_MODEL_FORMAT_WHAT[LOOM_FORMAT_COUNT] = {
    [LOOM_FORMAT_LLMC] = "llm.c format", [LOOM_FORMAT_SAFETENSORS] = "safetensors, Hugging Face names",
    [LOOM_FORMAT_HF] = "a Hugging Face directory: config.json and safetensors weights"};

loom_model_format loom_model_format_of(const char *name) {
  for (int f = 0; f < LOOM_FORMAT_COUNT; f++)
    if (strcmp(name, LOOM_MODEL_FORMAT_NAMES[f]) == 0) return (loom_model_format)f;
  return LOOM_FORMAT_LLMC;
}

static void free_params(void *state) {
  loom_gpt_params_free(state);
  free(state);
}

/* Whether path is a directory of loom checkpoints (it has a latest). */
static bool is_ckpt_dir(const char *path) {
  char latest[4200];
  snprintf(latest, sizeof latest, "%s/latest", path);
  return loom_hf_is_dir(path) && access(latest, F_OK) == 0;
}

loom_status loom_model_file_source(loom_model_source *s, const char *path, loom_error *err) {
  if (is_ckpt_dir(path)) return loom_model_source_of_ckpt(s, path, err);
  return loom_hf_is_dir(path) ? loom_hf_source(s, path, err) : loom_llmc_source(s, path, err);
}

loom_status loom_model_source_open(loom_model_source *s, const char *dir, const char *model_path,
                                   const loom_gpt_config *cfg, uint64_t seed, loom_error *err) {
  if (dir) return loom_model_source_of_ckpt(s, dir, err);
  if (model_path) return loom_model_file_source(s, model_path, err);
  memset(s, 0, sizeof *s);
  loom_gpt_params *p = calloc(1, sizeof *p);
  if (!p || loom_gpt_params_init_weights(p, cfg, 0, 1, NULL, &loom_host_memory) != LOOM_OK) {
    free(p);
    return loom_fail(err, LOOM_ERR_NOMEM, "out of memory building the model");
  }
  loom_gpt_params_randomize(p, seed);
  loom_model_source_of_params(s, p);
  s->state = p;
  s->free_state = free_params;
  return LOOM_OK;
}

loom_status loom_model_export_check(const loom_gpt_config *cfg, loom_model_format format, const char *flag,
                                    const char *out, bool force, bool expert_bias_written, loom_error *err) {
  /* DeepSeek-V3's directories hold the expert bias (e_score_correction_bias); no other file does */
  const bool written = expert_bias_written && format == LOOM_FORMAT_HF && loom_hf_deepseek(cfg);
  if (loom_gpt_is_moe(cfg) && cfg->moe.expert_bias && !written)
    return loom_fail(err, LOOM_ERR_USAGE, "%s %s: this model routes with an expert bias (--moe-router-enable-expert-bias), "
                     "which only a loom checkpoint holds so far; keep its checkpoint (--ckpt) and evaluate or sample from "
                     "that (--init-from DIR)", flag, out);
  if (format == LOOM_FORMAT_HF && loom_hf_check_class(cfg, err) != LOOM_OK)
    return loom_error_prefix(err, LOOM_ERR_USAGE, flag);
  static const char *const FILE_SUFFIXES[] = {".safetensors", ".bin", ".json", ".txtpb", ".pb"};
  const bool named_safetensors = loom_str_ends_with(out, ".safetensors");
  bool named_file = false;
  for (size_t i = 0; i < sizeof FILE_SUFFIXES / sizeof FILE_SUFFIXES[0]; i++) named_file |= loom_str_ends_with(out, FILE_SUFFIXES[i]);
  const char *why = format == LOOM_FORMAT_SAFETENSORS && !named_safetensors ? "safetensors files end in .safetensors"
                    : format == LOOM_FORMAT_LLMC && named_safetensors        ? "this is an llm.c file, not safetensors"
                    : format == LOOM_FORMAT_HF && named_file ? "this is a Hugging Face directory, not a file" : NULL;
  if (why)
    return loom_fail(err, LOOM_ERR_USAGE, "%s %s: the name contradicts what is written (%s): %s; rename it", flag, out,
                     LOOM_MODEL_FORMAT_WHAT[format], why);
  return loom_output_check(flag, out, format == LOOM_FORMAT_HF, force, err);
}

loom_status loom_model_export(const loom_model_source *src, const loom_export_options *o, const char *out, loom_error *err) {
  if (o->format == LOOM_FORMAT_HF) return loom_hf_write(out, src, o->dtype, o->max_shard_bytes, o->tok, err);
  return o->format == LOOM_FORMAT_SAFETENSORS ? loom_safetensors_write(out, src, 0, src->count, o->dtype, false, err)
                                              : loom_llmc_write(out, src, o->dtype, err);
}
