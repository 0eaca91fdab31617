/* DeepSeek-V3's Hugging Face layout (DeepseekV3ForCausalLM) beside loom's
 * table, for the directory reader and writer (hf.c, hf_weights.c,
 * safetensors.c).
 *
 * - RoPE rows: DeepSeek's files hold the RoPE part of each q head (in
 *   q_b_proj, or q_proj without a q latent) and of the shared key (the last
 *   qk_rope_head_dim rows of kv_a_proj_with_mqa) in interleaved pairs, which
 *   transformers reorders before RoPE (rope_interleave: dims 2j and 2j + 1
 *   become j and j + P/2); loom's rows are in that order already, so the rows
 *   are permuted on reading and back on writing.
 * - Tensors beyond loom's table: each MoE layer's mlp.gate.e_score_correction_bias
 *   (the expert bias, which loom keeps as routing state), and each MTP layer's
 *   copies of the embedding (embed_tokens) and of the head
 *   (shared_head.head), which DeepSeek's checkpoints carry and loom shares
 *   with the main model. */
#ifndef LOOM_HF_DEEPSEEK_H
#define LOOM_HF_DEEPSEEK_H

#include <stdbool.h>
#include "ckpt/model_source.h"

/* Whether a Hugging Face directory of cfg's model is DeepSeek-V3's (an MLA model). */
static inline bool loom_hf_deepseek(const loom_gpt_config *cfg) { return loom_gpt_is_mla(cfg); }

/* Tensor `name`'s values (loom's canonical name, whole) between the file's
 * row order and loom's: to_loom reads, else writes. Other tensors unchanged. */
void loom_hf_deepseek_rows(const loom_gpt_config *cfg, const char *name, float *values, bool to_loom);

/* DeepSeek's tensors beyond loom's table, in order (every MoE layer's
 * correction bias, then every MTP layer's embedding and head copies):
 * returns how many; fills specs[] and meta[] where not NULL. */
int loom_hf_deepseek_extras(const loom_gpt_config *cfg, loom_tensor *specs, loom_param_meta *meta);

/* Appends them to a source's own table (an opened DeepSeek-V3 directory's),
 * and makes its expert bias the correction biases it reads through fetch. */
loom_status loom_hf_deepseek_extend_table(loom_model_source *s, const char *where, loom_error *err);

/* A source to write: src's tensors, then the extras (the biases from src's
 * expert bias, the copies from src's embedding and head); *out borrows src,
 * which must outlive it. Free with loom_model_source_free. */
loom_status loom_hf_deepseek_writer_source(const loom_model_source *src, loom_model_source *out, loom_error *err);

#endif
