/* GPT-OSS's experts as its Hugging Face files hold them: stacked, one
 * tensor per layer for every expert's gate and up projections together
 * (mlp.experts.gate_up_proj [E, h, 2f]: expert e's [h, 2f], x @ it the
 * projections, gate j in column 2j and up j in column 2j + 1), one for the
 * down projections (down_proj [E, f, h]), and their biases (gate_up_proj_bias
 * [E, 2f], interleaved the same way; down_proj_bias [E, h]). loom holds each
 * expert's projections apart, [out, in] as nn.Linear does (experts.e.gate_proj,
 * up_proj, down_proj), every expert's after the one before: so each stacked
 * tensor is one run of canonical tensors, expert by expert (gate then up
 * where they interleave), and each expert's piece of it, a slab of
 * [rows, cols], lies contiguous in the file. */
#ifndef LOOM_HF_STACK_H
#define LOOM_HF_STACK_H

#include <stdbool.h>
#include "ckpt/model_source.h"

typedef struct {
  char name[LOOM_NAME_LEN + 32]; /* the stacked tensor's name in the file */
  int first;                     /* the run's first canonical tensor */
  int count;                     /* canonical tensors in the run: experts x per_expert */
  int experts;                   /* E: the file tensor's first dimension */
  int per_expert;                /* canonical tensors an expert's slab holds: 2 (gate and up interleaved) or 1 */
  int piece;                     /* this tensor's place in the run */
  int64_t rows, cols;            /* an expert's slab: [rows, cols]; a bias's rows 1 (the file tensor is [E, cols]) */
  bool matrix;                   /* the file tensor is [E, rows, cols] and the slab is [in, out] of loom's [out, in] */
} loom_hf_stack;

/* Whether canonical tensor k of src's table is a piece of a stacked tensor
 * in a Hugging Face directory of src's model (GPT-OSS's experts); if so,
 * where (into s). */
bool loom_hf_stack_of(const loom_model_source *src, int k, loom_hf_stack *s);
/* Tensor k's values dst (its canonical shape) from its expert's slab
 * ([rows, cols], row-major). */
void loom_hf_stack_take(const loom_hf_stack *s, const float *slab, float *dst);
/* And back: tensor k's values into its columns of the slab. */
void loom_hf_stack_put(const loom_hf_stack *s, const float *src, float *slab);

#endif
