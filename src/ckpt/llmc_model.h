/* GPT-2 weights in llm.c's checkpoint format, so models move between loom,
 * llm.c and PyTorch: an int32[256] header (magic 20240326, version 3, max
 * seq, vocab, layers, heads, hidden, padded vocab) then every parameter as
 * fp32, grouped by kind across layers in llm.c's order. */
#ifndef LOOM_LLMC_MODEL_H
#define LOOM_LLMC_MODEL_H

#include "core/status.h"
#include "ckpt/model_source.h"
#include "layers/gpt.h"

#define LOOM_LLMC_MAGIC 20240326
#define LOOM_LLMC_VERSION 3      /* fp32 values */
#define LOOM_LLMC_VERSION_BF16 5 /* bf16 values, written by export */

/* Reads and checks the header of an llm.c model file into cfg. */
loom_status loom_llmc_read_config(const char *path, loom_gpt_config *cfg, loom_error *err);
/* Refuses an llm.c file whose model (file) is not the run's (padding aside). */
loom_status loom_llmc_check_model(const char *path, const loom_gpt_config *file, const loom_gpt_config *run,
                                  loom_error *err);
/* Loads the weights; the file's shape must equal p->cfg. */
loom_status loom_llmc_load(const char *path, loom_gpt_params *p, loom_error *err);
/* An llm.c file as a model source, read one tensor at a time (its header
 * and size checked on opening). */
loom_status loom_llmc_source(loom_model_source *s, const char *path, loom_error *err);
/* Writes p's weights atomically. */
loom_status loom_llmc_save(const char *path, const loom_gpt_params *p, loom_error *err);
/* Writes a model source's weights atomically, one tensor in memory at a
 * time, as fp32 (version 3) or bf16 (version 5) values. */
loom_status loom_llmc_write(const char *path, const loom_model_source *src, loom_dtype dtype, loom_error *err);

#endif
