/* Hugging Face model directories, offline: config.json and the weights
 * (model.safetensors, or shards listed by model.safetensors.index.json, as
 * the Hub ships every large model) as transformers writes and reads them, for
 * GPT2LMHeadModel (loom's GPT-2 setting), LlamaForCausalLM (RMSNorm,
 * SwiGLU, RoPE; grouped-query attention, biases, a tied head and Llama
 * 3.1's RoPE scaling as the config says), MistralForCausalLM (Llama's
 * model, its sliding window taken where it spans the whole sequence),
 * Qwen2ForCausalLM (Llama's with biases on q, k and v alone),
 * MixtralForCausalLM (Mistral's, each MLP a Mixture of Experts) and
 * Qwen2MoeForCausalLM (Qwen2's, each MLP a Mixture of Experts beside a
 * gated shared expert), Qwen3ForCausalLM and Qwen3MoeForCausalLM (heads of
 * their own width, QK-norm), GptOssForCausalLM (sinks, windows by layer,
 * YaRN, biased experts stacked in its files) and DeepseekV3ForCausalLM
 * (multi-head latent attention, noaux_tc routing, MTP: hf_deepseek.h). The Llama
 * family's canonical names are transformers' own,
 * and its RoPE pairs dimension i of a head with i + head_dim/2 as
 * transformers' rotate_half does, so q and k need no permutation.
 *
 * Reading checks everything before a value is used: the architecture and
 * every field of config.json (a field loom does not know is refused, not
 * ignored), every tensor's presence, dtype (F32, BF16, F16) and shape, and
 * that no tensor is left over. Shards are checked against their index:
 * each holds exactly the tensors the index puts in it, no tensor is in two,
 * and their bytes add up to the index's metadata.total_size. Tensors are
 * read one at a time, never a whole file. */
#ifndef LOOM_HF_H
#define LOOM_HF_H

#include <stdbool.h>
#include "ckpt/hf_tokenizer.h"
#include "ckpt/model_source.h"

#define LOOM_HF_CONFIG "config.json"
#define LOOM_HF_WEIGHTS "model.safetensors"
#define LOOM_HF_INDEX "model.safetensors.index.json"
/* transformers' save_pretrained default max_shard_size, "5GB" (10^9 bytes a GB). */
#define LOOM_HF_MAX_SHARD_DEFAULT 5000000000ull

/* The name tensor `name` (canonical) has in a Hugging Face directory of
 * cfg's model: the same, but for a Mixture of Experts' Mixtral names
 * (block_sparse_moe.gate, block_sparse_moe.experts.N.w1 / w3 / w2 for
 * gate, up and down); buf holds it when it differs. */
const char *loom_hf_tensor_name(const loom_gpt_config *cfg, const char *name, char *buf, size_t n);
/* Whether a Hugging Face directory of cfg's model stacks its experts (GPT-OSS's: hf_stack.h). */
bool loom_hf_stacks_experts(const loom_gpt_config *cfg);
/* Whether path is a directory (a Hugging Face model, not an llm.c file). */
bool loom_hf_is_dir(const char *path);
/* The model config.json in dir describes. */
loom_status loom_hf_read_config(const char *dir, loom_gpt_config *cfg, loom_error *err);
/* The same from config.json's text (path names it in messages). */
loom_status loom_hf_parse_config(const char *text, size_t len, const char *path, loom_gpt_config *cfg, loom_error *err);
/* The model in dir as a source, its safetensors header checked on opening. */
loom_status loom_hf_source(loom_model_source *s, const char *dir, loom_error *err);
/* Whether a transformers class holds the model (GPT2LMHeadModel,
 * LlamaForCausalLM, Qwen2ForCausalLM, MixtralForCausalLM or
 * Qwen2MoeForCausalLM); the error names its architecture, or what keeps a
 * MoE model from its class (Mixtral's without a shared expert, Qwen2-MoE's
 * with one). */
loom_status loom_hf_check_class(const loom_gpt_config *c, loom_error *err);
/* Writes dir/config.json, generation_config.json, tok's files where tok is
 * not NULL (hf_tokenizer.h) and the weights (values as dtype): one
 * model.safetensors, or where the data exceeds max_shard_bytes (0: the
 * default), shards model-0000i-of-0000N.safetensors of at most that much
 * each (a larger tensor alone), tensors never split, and the index; every
 * file atomically. Makes dir. Refuses a model no transformers class holds. */
loom_status loom_hf_write(const char *dir, const loom_model_source *src, loom_dtype dtype, uint64_t max_shard_bytes,
                          const loom_hf_tokenizer *tok, loom_error *err);

#endif
