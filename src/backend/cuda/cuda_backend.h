/* The CUDA backend: the op table (backend/ops.h) over device memory, bf16
 * casts and the bf16 GEMM with fp32 accumulation included. Every pointer an op takes is a device pointer; every op is
 * queued on the backend's one compute stream, in order, and returns without
 * waiting, except sumsq, which returns a host value. cuBLAS does the
 * matmuls (fp32, or TF32 tensor cores when enabled) and the attention's
 * batched products; the rest are loom's kernels. Built only when CMake finds
 * nvcc; available() says whether this process can use a GPU. */
#ifndef LOOM_CUDA_BACKEND_H
#define LOOM_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "backend/ops.h"
#include "core/block_cache.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether a CUDA device is present and usable: a GPU is visible and cuBLAS,
 * opened at run time, loads (false on a machine without either). */
bool loom_cuda_available(void);
/* Whether this build's device is the emulated GPU (-DLOOM_CUDA_EMU=ON,
 * docs/gpus.md): correct and slow, so --device auto never picks it. */
bool loom_cuda_emulated(void);
/* Why not, in a few words ("" when available), into out[len]. */
void loom_cuda_unavailable_reason(char *out, size_t len);
/* Makes device `ordinal` (a launcher's local rank modulo the device count)
 * the calling thread's current device; returns it, or -1 without a GPU. */
int loom_cuda_select_device(int ordinal);

/* A CUDA context on the calling thread's current device: its stream,
 * cuBLAS handle, scratch, and an allocator. The returned op table and its
 * `mem` carry the context as their state; nothing is shared between
 * contexts. Call only when loom_cuda_available(); close with loom_cuda_close.
 *
 * synced false, the fast path: memory is device memory (cudaMalloc under a
 * block cache, core/block_cache.h), which host code cannot address; every
 * op and copy is queued on the context's stream and returns without
 * waiting; the host waits only for what it reads (to_host, sumsq).
 * synced true, the correctness path: memory is CUDA managed memory and each
 * op waits for its result, so host code between ops may read and write it. */
const loom_ops *loom_cuda_open(bool synced);
void loom_cuda_close(const loom_ops *be);
/* The context's device, and its name (the driver's) into out[len]. */
int loom_cuda_device(const loom_ops *be);
void loom_cuda_device_name(const loom_ops *be, char *out, size_t len);
/* FP8 GEMMs this context ran on cuBLASLt's FP8 matmuls so far (per-tensor scales, where the shapes allow); the
 * rest run as the definition's kernel. */
long loom_cuda_fp8_lt_matmuls(const loom_ops *be);
/* The device's memory in bytes (0 unknown). */
size_t loom_cuda_memory_bytes(const loom_ops *be);
/* The device's compute capability as major x 10 + minor (90: Hopper, 100: Blackwell); 0 unknown. */
int loom_cuda_compute_capability(const loom_ops *be);
/* fp32 matmuls on TF32 tensor cores (10-bit mantissa inputs) when on; exact fp32 when off (default). */
void loom_cuda_set_tf32(const loom_ops *be, bool on);
/* bf16 runs: every matmul's operands are converted to bf16 (exactly, for
 * the bf16 values a bf16 run keeps) and multiplied on bf16 tensor cores with
 * fp32 accumulation and fp32 results. Off (default): fp32 GEMMs. */
void loom_cuda_set_bf16_gemms(const loom_ops *be, bool on);
/* Which implementation runs the attention ops (both keep ops.h's flash
 * contract: out and each row's log-sum-exp, nothing T x T between calls):
 * FUSED, the default, is cuda_flash.cu's tiled kernels, O(T) memory in
 * all; CUBLAS materialises each call's scores in scratch and multiplies
 * with cuBLAS, the reference the fused kernels are measured against. */
typedef enum { LOOM_CUDA_ATTENTION_FUSED = 0, LOOM_CUDA_ATTENTION_CUBLAS = 1 } loom_cuda_attention;
void loom_cuda_set_attention(const loom_ops *be, loom_cuda_attention kind);
/* What the context's allocator has handed out and reserved, with peaks
 * (the context's own scratch included). */
loom_block_cache_stats loom_cuda_memory_stats(const loom_ops *be);
/* How the host waits for the compute stream (to_host, sumsq, sync): by
 * default cudaStreamSynchronize; a multi-GPU run installs the NCCL
 * watchdog's wait (comm/nccl/nccl_watchdog.h), which polls for NCCL errors
 * and stalls. `what` names what the host waits for. */
void loom_cuda_set_host_wait(const loom_ops *be, void (*wait)(void *stream, const char *what));
/* The compute stream (a cudaStream_t) every op is queued on. */
void *loom_cuda_stream(const loom_ops *be);
/* Waits for every queued op. */
void loom_cuda_sync(const loom_ops *be);

/* Device memory on the current device, and copies between host and device
 * on the context's stream (they return when the copy is done). */
void *loom_cuda_malloc(size_t bytes);
void loom_cuda_free(void *p);
void loom_cuda_to_device(const loom_ops *be, void *dst, const void *src, size_t bytes);
void loom_cuda_to_host(const loom_ops *be, void *dst, const void *src, size_t bytes);

/* The bf16 GEMM throughput cuBLAS reaches on the context's device for an
 * m x n x k product, in TFLOP/s (best of `iters` timed runs after a warm-up). */
double loom_cuda_bf16_gemm_tflops(const loom_ops *be, int m, int n, int k, int iters);
/* The device's dense bf16 tensor-core peak in TFLOP/s where loom knows it
 * (SXM H100/H200 989, NVL 835, PCIe 756, A100 312), else 0. */
double loom_cuda_bf16_peak_tflops(const loom_ops *be);

#ifdef __cplusplus
}
#endif

#endif
