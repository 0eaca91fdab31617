/* The fused attention kernels against the cuBLAS attention (scores
 * materialised per call), forward and backward of one causal attention
 * call, measured in one run on one device: time, the ratio, and each one's
 * memory peak beyond its inputs and outputs, from the context's allocator.
 *   loom_cuda_attention_bench [T B HEADS HEAD_DIM]   (default 2048 4 16 128: the 1.3B model's layer)
 * Prints RESULT fused_over_cublas_time=... for scripts. */
#include <stdio.h>
#include <stdlib.h>
#include "backend/cuda/cuda_backend.h"
#include "core/timer.h"

typedef struct {
  const loom_ops *cu;
  loom_attn_shape s;
  float *qkv, *out, *lse, *dout, *dqkv;
} call;

/* Best of `iters` forward + backward passes after one warm-up, in seconds. */
static double time_pass(call *c, int iters) {
  const loom_dropout none = {0};
  double best = 1e30;
  for (int i = -1; i < iters; i++) {
    loom_cuda_sync(c->cu);
    const double t0 = loom_now_s();
    c->cu->attention_forward(c->cu, c->out, c->lse, c->qkv, &c->s, &none);
    c->cu->attention_backward(c->cu, c->dqkv, c->dout, c->out, c->qkv, c->lse, &c->s, &none);
    loom_cuda_sync(c->cu);
    const double dt = loom_now_s() - t0;
    if (i >= 0 && dt < best) best = dt;
  }
  return best;
}

int main(int argc, char **argv) {
  if (!loom_cuda_available()) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  const int T = argc > 1 ? atoi(argv[1]) : 2048, B = argc > 2 ? atoi(argv[2]) : 4, H = argc > 3 ? atoi(argv[3]) : 16,
            D = argc > 4 ? atoi(argv[4]) : 128;
  if (T < 1 || B < 1 || H < 1 || D < 1 || T > 65536 || B > 1024 || H > 1024 || D > 1024) {
    fprintf(stderr, "loom_cuda_attention_bench: T B HEADS HEAD_DIM must be positive (and at most 65536 1024 1024 1024)\n");
    return 2;
  }
  loom_cuda_select_device(0);
  call c = {.cu = loom_cuda_open(false), .s = {.T = T, .B = B, .heads = H, .kv_heads = H, .head_dim = D, .total_heads = H}};
  const loom_allocator *mem = c.cu->mem;
  const size_t rows = (size_t)T * B, qkv = rows * 3 * H * D, o = rows * H * D;
  float **bufs[] = {&c.qkv, &c.dqkv, &c.out, &c.dout, &c.lse};
  const size_t sizes[] = {qkv, qkv, o, o, (size_t)B * H * T};
  for (int i = 0; i < 5; i++) *bufs[i] = loom_xzalloc(mem, sizes[i] * sizeof(float), "attention bench");
  float *host = malloc(qkv * sizeof(float));
  for (size_t i = 0; i < qkv; i++) host[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
  mem->from_host(mem, c.qkv, host, qkv * sizeof(float));
  mem->from_host(mem, c.dout, host, o * sizeof(float));
  free(host);
  const double inputs = (double)mem->counts(mem).peak, mib = 1048576.0;
  char name[256];
  loom_cuda_device_name(c.cu, name, sizeof name);
  printf("device: %s | causal attention, T %d, batch %d, %d heads of %d, fp32 | forward + backward, best of 5\n", name, T, B, H, D);
  const double fused = time_pass(&c, 5), fused_peak = (double)mem->counts(mem).peak - inputs;
  loom_cuda_set_attention(c.cu, LOOM_CUDA_ATTENTION_CUBLAS);
  const double cublas = time_pass(&c, 5), cublas_peak = (double)mem->counts(mem).peak - inputs;
  /* Causal: half the 4 T^2 D products a head's forward counts, and twice that backward (the fused kernels redo the scores). */
  const double flops = 3.0 * 4.0 * B * H * (double)T * T * D / 2.0;
  printf("fused:  %8.2f ms  %6.1f TFLOP/s  extra memory %8.1f MiB\n", fused * 1e3, flops / fused * 1e-12, fused_peak / mib);
  printf("cuBLAS: %8.2f ms  %6.1f TFLOP/s  extra memory %8.1f MiB\n", cublas * 1e3, flops / cublas * 1e-12,
         (cublas_peak > fused_peak ? cublas_peak : fused_peak) / mib);
  printf("RESULT fused_over_cublas_time=%.3f\n", fused / cublas);
  for (int i = 0; i < 5; i++) mem->release(mem, *bufs[i]);
  loom_cuda_close(c.cu);
  return 0;
}
