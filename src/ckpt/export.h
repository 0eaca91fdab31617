/* Whole-model files from any model source: llm.c's format or safetensors
 * with Hugging Face's GPT-2 names, one tensor in memory at a time. */
#ifndef LOOM_EXPORT_H
#define LOOM_EXPORT_H

#include "ckpt/hf_tokenizer.h"
#include "ckpt/model_source.h"

typedef enum { LOOM_FORMAT_LLMC, LOOM_FORMAT_SAFETENSORS, LOOM_FORMAT_HF, LOOM_FORMAT_COUNT } loom_model_format;

/* "llmc", "safetensors", "hf", then NULL: the names a flag offers. hf
 * writes a directory (config.json and the weights, sharded if large: hf.h). */
extern const char *const LOOM_MODEL_FORMAT_NAMES[];
/* What each format writes, for logs ("llm.c format", ...). */
extern const char *const LOOM_MODEL_FORMAT_WHAT[];
/* The format of a name from LOOM_MODEL_FORMAT_NAMES. */
loom_model_format loom_model_format_of(const char *name);

/* The model to export: a checkpoint's latest step (dir), else a model file
 * (model_path: an llm.c file or a Hugging Face directory), else cfg freshly
 * initialised from seed. */
loom_status loom_model_source_open(loom_model_source *s, const char *dir, const char *model_path,
                                   const loom_gpt_config *cfg, uint64_t seed, loom_error *err);
/* A model file as a source: a directory of loom checkpoints (its latest),
 * a Hugging Face directory, else an llm.c file. */
loom_status loom_model_file_source(loom_model_source *s, const char *path, loom_error *err);
/* Before any work: whether cfg's model can be written to out (named by
 * `flag`) in format: a transformers class for hf; a model routed with an
 * expert bias only where the file holds it (a DeepSeek-V3 directory) and
 * the source gives it (expert_bias_written: a checkpoint's, a directory's,
 * a fresh model's zeros); a name that does not contradict the format
 * (safetensors ends in .safetensors, llm.c's does not, a directory's is no
 * file name); and the output itself (loom_output_check: nothing there
 * unless force, and writable). */
loom_status loom_model_export_check(const loom_gpt_config *cfg, loom_model_format format, const char *flag,
                                    const char *out, bool force, bool expert_bias_written, loom_error *err);
/* How a model is written: values in dtype (LOOM_DTYPE_F32, or
 * LOOM_DTYPE_BF16 rounded to nearest even: llm.c's version 5, safetensors'
 * "BF16"); a Hugging Face directory's weights in shards of at most
 * max_shard_bytes (0: transformers' default, hf.h), with the tokenizer tok
 * beside them (NULL: none). */
typedef struct {
  loom_model_format format;
  loom_dtype dtype;
  uint64_t max_shard_bytes;
  const loom_hf_tokenizer *tok;
} loom_export_options;
loom_status loom_model_export(const loom_model_source *src, const loom_export_options *o, const char *out, loom_error *err);

#endif
