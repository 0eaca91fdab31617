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
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether a CUDA device is present and usable: a GPU is visible and cuBLAS,
 * opened at run time, loads (false on a machine without either). */
bool loom_cuda_available(void);
/* Why not, in a few words ("" when available). */
const char *loom_cuda_unavailable_reason(void);
/* Selects device `ordinal` (a launcher's local rank modulo the device count). */
int loom_cuda_select_device(int ordinal);
/* The op table; call only when loom_cuda_available(). */
const loom_ops *loom_ops_cuda(void);
/* The same ops, each waiting for its result before it returns, and an
 * allocator of CUDA managed memory (reachable from kernels and host code
 * alike). Together they run any loom model on the GPU unchanged: host code
 * between ops (the loss, MPI, zeroing grads) reads and writes the same
 * memory. That is the correctness path (exact parity, 50-step curves);
 * speed needs device-resident buffers and asynchronous streams. */
const loom_ops *loom_ops_cuda_synced(void);
const loom_allocator *loom_cuda_managed_allocator(void);
/* fp32 matmuls on TF32 tensor cores (10-bit mantissa inputs) when on; exact fp32 when off (default). */
void loom_cuda_set_tf32(bool on);
/* The compute stream (a cudaStream_t) every op is queued on. */
void *loom_cuda_stream(void);
/* Waits for every queued op. */
void loom_cuda_sync(void);

/* Device memory, and copies between host and device (synchronous). */
void *loom_cuda_malloc(size_t bytes);
void loom_cuda_free(void *p);
void loom_cuda_to_device(void *dst, const void *src, size_t bytes);
void loom_cuda_to_host(void *dst, const void *src, size_t bytes);

/* The bf16 GEMM throughput cuBLAS reaches on this device for an m x n x k
 * product, in TFLOP/s (best of `iters` timed runs after a warm-up). */
double loom_cuda_bf16_gemm_tflops(int m, int n, int k, int iters);
/* The device's name, and its dense bf16 tensor-core peak in TFLOP/s where
 * loom knows it (H100/H200 989, A100 312), else 0. */
const char *loom_cuda_device_name(void);
double loom_cuda_bf16_peak_tflops(void);

#ifdef __cplusplus
}
#endif

#endif
