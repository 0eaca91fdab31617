/* The whole model as one safetensors file, named as Hugging Face's GPT-2
 * (wte.weight, h.0.attn.c_attn.weight, ...), so transformers and other
 * safetensors readers load it directly. GPT-2's linear layers are Conv1D,
 * stored [in, out], so loom's [out, in] matrices are written transposed;
 * wte keeps only the real vocab rows. Layout: u64 little-endian header
 * length, a JSON header (each tensor's dtype, shape and byte range in the
 * data, plus {"format": "pt"} metadata) padded with spaces to 8 bytes, then
 * the fp32 data. The source may be a model in memory or a checkpoint. */
#ifndef LOOM_SAFETENSORS_H
#define LOOM_SAFETENSORS_H

#include "ckpt/model_source.h"

/* Writes atomically, one tensor in memory at a time, as "F32" or "BF16" values. */
loom_status loom_safetensors_write(const char *path, const loom_model_source *src, loom_dtype dtype, loom_error *err);

#endif
