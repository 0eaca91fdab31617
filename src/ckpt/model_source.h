/* The whole model's parameters, one canonical tensor at a time, for writers
 * of single-file formats (llm.c, safetensors): from a model in memory, or
 * straight from a sharded checkpoint, where each tensor is assembled by
 * global offsets from only the shard files that hold it. Memory is then one
 * tensor, not the model: a 52B checkpoint exports on a machine that could
 * never hold it. */
#ifndef LOOM_MODEL_SOURCE_H
#define LOOM_MODEL_SOURCE_H

#include "ckpt/assemble.h"
#include "layers/gpt_params.h"

typedef struct loom_model_source {
  loom_gpt_config cfg;
  int count;
  const loom_tensor *specs;  /* [count] whole model (tp 1, every layer), canonical order; names and shapes */
  const loom_param_meta *meta;
  /* Fills dst (specs[k]'s elements) with tensor k. */
  loom_status (*fetch)(const struct loom_model_source *s, int k, float *dst, loom_error *err);
  /* Fills bias[count] with the model's expert bias (layers x experts), where the source holds one (a checkpoint's
   * routing state, a DeepSeek-V3 directory's e_score_correction_bias); NULL: it holds none. */
  loom_status (*expert_bias)(const struct loom_model_source *s, float *bias, size_t count, loom_error *err);
  void (*free_state)(void *state); /* NULL: nothing to free */
  void *state;
  loom_tensor *own_specs;     /* the table loom_model_source_make_table made (specs, meta point at it), or NULL */
  loom_param_meta *own_meta;
} loom_model_source;

/* Gives s the whole model's table of s->cfg, which s owns from then on
 * (loom_model_source_free frees it); where names s in errors. */
loom_status loom_model_source_make_table(loom_model_source *s, const char *where, loom_error *err);

/* A whole (tp 1) model in memory. */
void loom_model_source_of_params(loom_model_source *s, const loom_gpt_params *p);
/* The checkpoint dir/latest names. */
loom_status loom_model_source_of_ckpt(loom_model_source *s, const char *dir, loom_error *err);
void loom_model_source_free(loom_model_source *s);
/* Fills bias[count] with the model's expert bias (model.moe.expert_bias,
 * layers x experts): the source's (s->expert_bias), else all 0 with a line
 * saying so (a model file other than DeepSeek-V3's holds none). */
loom_status loom_model_source_expert_bias(const loom_model_source *s, const char *where, float *bias, size_t count,
                                          loom_error *err);
/* The source's tensors as whole pieces ("param/<name>"), to fill a rank's
 * wanted pieces by global offsets (assemble.h) one tensor at a time; where
 * names the source in errors and must outlive out. */
loom_status loom_model_source_pieces(const loom_model_source *s, const char *where, loom_piece_source *out,
                                     loom_error *err);
void loom_model_source_pieces_free(loom_piece_source *out);
/* Elements of the largest tensor: the scratch a writer needs. */
size_t loom_model_source_max_numel(const loom_model_source *s);

/* Rewrites n fp32 values in place as dtype's (bf16: packed into the first
 * half of the buffer); returns their bytes. What every single-file writer
 * (llm.c, safetensors, a Hugging Face directory) stores of a tensor. */
size_t loom_export_values(float *values, size_t n, loom_dtype dtype);

#endif
