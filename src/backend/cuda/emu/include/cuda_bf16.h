/* The emulated GPU's stand-in for cuda_bf16.h. loom's kernels keep bf16 as
 * uint16_t bits and convert with backend/op_math.h's one rounding, so only
 * the type's name is needed here. */
#ifndef LOOM_EMU_CUDA_BF16_H
#define LOOM_EMU_CUDA_BF16_H
#include <stdint.h>
#include "cuda_runtime.h"
typedef struct {
  uint16_t x;
} __nv_bfloat16;
#endif
