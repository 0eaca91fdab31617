/* The whole model as one safetensors file with Hugging Face's names (GPT-2's
 * wte.weight, h.0.attn.c_attn.weight, ...; the Llama family's are loom's
 * own), so transformers and other safetensors readers load it directly.
 * GPT-2's linear layers are Conv1D, stored [in, out], so loom's [out, in]
 * block matrices are written transposed; Llama's nn.Linear layers keep
 * loom's layout. The embedding and LM head keep only the real vocab rows. Layout: u64 little-endian header
 * length, a JSON header (each tensor's dtype, shape and byte range in the
 * data, plus {"format": "pt"} metadata) padded with spaces to 8 bytes, then
 * the fp32 data. The source may be a model in memory or a checkpoint. */
#ifndef LOOM_SAFETENSORS_H
#define LOOM_SAFETENSORS_H

#include "ckpt/model_source.h"

/* How a canonical tensor lies in the file: rows and cols (cols 0: a
 * vector), and whether it is loom's [out, in] transposed. */
typedef struct {
  int64_t rows, cols;
  bool transpose;
} loom_safetensors_shape;
loom_safetensors_shape loom_safetensors_shape_of(const loom_gpt_config *cfg, const loom_tensor *spec,
                                                 const loom_param_meta *meta);

/* Writes tensors [first, last) of src's table (a whole model: 0 and
 * src->count; a shard: a run of them) atomically, one tensor in memory at a
 * time, as "F32" or "BF16" values. */
loom_status loom_safetensors_write(const char *path, const loom_model_source *src, int first, int last, loom_dtype dtype, bool hf,
                                   loom_error *err);
/* The bytes of tensor k's data in such a file. */
uint64_t loom_safetensors_bytes(const loom_model_source *src, int k, loom_dtype dtype);

#endif
