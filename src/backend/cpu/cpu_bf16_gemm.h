/* The CPU backend's bf16 GEMM: bf16 operands, fp32 accumulation and output.
 *
 * Native where this CPU runs bf16 dot products (AVX512-BF16 or AMX) and
 * loom was built with oneDNN: its matmul primitive, one per shape, created
 * once and kept. Elsewhere the bf16 values are widened (exactly) to fp32
 * and go through the fp32 GEMM (cpu_gemm.h). Each product of two bf16
 * values is exact in fp32, so the two paths differ by summation order only.
 * The path is decided at run time from what oneDNN reports of the CPU, never
 * by timing, so a resumed run computes as the uninterrupted one did. */
#ifndef LOOM_CPU_BF16_GEMM_H
#define LOOM_CPU_BF16_GEMM_H

#include <stdbool.h>
#include <stdint.h>
#include "backend/cpu/cpu_gemm.h"
#include "backend/ops.h"
#include "core/status.h"

typedef enum { LOOM_BF16_GEMM_NATIVE = 0, LOOM_BF16_GEMM_WIDEN = 1, LOOM_BF16_GEMM_PATHS } loom_bf16_gemm_path;

/* Whether the native path can run here: oneDNN built in and a CPU whose bf16
 * instructions oneDNN dispatches to. */
bool loom_cpu_bf16_native_available(void);
/* The path the backend's bf16 GEMMs take: LOOM_CPU_BF16_GEMM's, else the
 * native one where available, else widening. */
loom_bf16_gemm_path loom_cpu_bf16_gemm_path(void);
/* LOOM_CPU_BF16_GEMM=native|widen (either case) makes every bf16 GEMM of this
 * process take that path (tests force each); native where it cannot run is
 * refused, as is any other value. */
#define LOOM_CPU_BF16_GEMM_ENV "LOOM_CPU_BF16_GEMM"
loom_status loom_cpu_bf16_gemm_choose_from_env(loom_error *err);
/* Forces a path (tests); false if it cannot run here. */
bool loom_cpu_bf16_gemm_force(loom_bf16_gemm_path path);
/* "native" or "widen": the flag's words. */
const char *loom_cpu_bf16_gemm_path_name(loom_bf16_gemm_path path);
/* What a path runs on, in words: oneDNN's implementation of the native
 * matmul ("brg:avx512_core_amx_bf16", ...), or the widening and the fp32
 * GEMM library it feeds. */
void loom_cpu_bf16_gemm_describe(loom_bf16_gemm_path path, char *out, size_t len);
/* The implementation oneDNN runs shape s on along the native path
 * ("brg:avx512_core_amx_bf16", ...; its primitive is made and kept), or
 * what stands in for it where the native path cannot run. */
void loom_cpu_bf16_gemm_impl(const loom_gemm_shape *s, char *out, size_t len);
/* x (n elements) as `path` reads it, converted if need be into scratch of
 * its own that the next call of this function reuses: for an operand two
 * GEMMs share, converted once. */
loom_bf16_operand loom_cpu_bf16_gemm_operand(loom_bf16_gemm_path path, loom_bf16_operand x, size_t n);
/* C[M,N] = op(A) op(B) + beta C (beta 0 or 1) laid out as s says
 * (loom_gemm_shape), through `path`. */
void loom_cpu_bf16_gemm_run(loom_bf16_gemm_path path, const loom_gemm_shape *s, loom_bf16_operand A,
                            loom_bf16_operand B, float *C);

#endif
