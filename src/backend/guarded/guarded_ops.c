/* The guarded backend: the CPU backend's kernels on memory that host code
 * cannot touch. Every pointer its allocator hands out carries a tag bit (bit
 * 52) that makes it an invalid address on every 64-bit target loom runs on:
 * non-canonical on x86-64, past the 48- or 52-bit address space on AArch64.
 * Pointer arithmetic on a tagged pointer keeps the tag, so views into a
 * buffer stay tagged; only this file's ops and transfers strip it. Any
 * dereference elsewhere (a memcpy, a loop, MPI reading a send buffer) faults
 * at once, and the fault handler says so. Results are the CPU backend's bit
 * for bit: the same kernels run on the same bytes. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backend/op_math.h"
#include "backend/ops.h"
#include "core/block_cache.h"

#define TAG ((uintptr_t)1 << 52)

static void *tag(void *p) { return p ? (void *)((uintptr_t)p | TAG) : NULL; }
/* The host address behind a tagged pointer; NULL stays NULL. */
static void *U(const void *p) { return (void *)((uintptr_t)p & ~TAG); }

/* Blocks come from a block cache, as on a GPU (core/block_cache.h): the
 * runtime's memory peak is measured here as it is there, and a block
 * released twice is caught. */
static void *raw_alloc(void *ctx, size_t bytes) { return tag(calloc(bytes, 1)); }
static void raw_release(void *ctx, void *p) { free(U(p)); }

static loom_block_cache *g_cache;
/* At exit every block goes back to calloc's heap: the cache holds them by
 * tagged pointers, which a leak checker scanning for pointers cannot see. */
static void drop_cache(void) { loom_block_cache_delete(g_cache); }
static void make_cache(void) {
  g_cache = loom_block_cache_new((loom_raw_memory){raw_alloc, raw_release, NULL});
  if (g_cache) atexit(drop_cache);
}
static loom_block_cache *cache(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, make_cache);
  if (!g_cache) abort(); /* out of host memory at the first allocation */
  return g_cache;
}

static bool guarded_owns(const loom_allocator *mem, const void *p) { return loom_block_cache_owns(cache(), p); }

static void *guarded_zalloc(const loom_allocator *mem, size_t bytes, const char *what) {
  void *p = loom_block_cache_alloc(cache(), bytes);
  if (p) memset(U(p), 0, bytes);
  return p;
}

static void guarded_release(const loom_allocator *mem, void *p) {
  if (p && !loom_block_cache_free(cache(), p)) {
    fprintf(stderr, "loom: guarded memory at %p released twice, or never allocated\n", p);
    abort();
  }
}

static loom_memory_counts guarded_counts(const loom_allocator *mem) {
  const loom_block_cache_stats s = loom_block_cache_stats_of(cache());
  return (loom_memory_counts){s.in_use, s.peak_in_use};
}
static void guarded_reset_peak(const loom_allocator *mem) { loom_block_cache_reset_peaks(cache()); }

static void guarded_copy(const loom_allocator *mem, void *dst, const void *src, size_t bytes) {
  if (bytes) memmove(U(dst), U(src), bytes);
}

static void guarded_copy_2d(const loom_allocator *mem, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                            size_t width, size_t rows) {
  loom_host_memory.copy_2d(&loom_host_memory, U(dst), dst_pitch, U(src), src_pitch, width, rows);
}

static void guarded_fill32(const loom_allocator *mem, void *dst, uint32_t pattern, size_t count) {
  loom_host_memory.fill32(&loom_host_memory, U(dst), pattern, count);
}

static void guarded_to_host(const loom_allocator *mem, void *host, const void *src, size_t bytes) {
  if (bytes) memcpy(host, U(src), bytes);
}

static void guarded_from_host(const loom_allocator *mem, void *dst, const void *host, size_t bytes) {
  if (bytes) memcpy(U(dst), host, bytes);
}

static const loom_allocator GUARDED_MEMORY = {.name = "guarded",
                                              .device = LOOM_DEVICE_CPU,
                                              .host_addressable = false,
                                              .zalloc = guarded_zalloc,
                                              .release = guarded_release,
                                              .copy = guarded_copy,
                                              .copy_2d = guarded_copy_2d,
                                              .fill32 = guarded_fill32,
                                              .to_host = guarded_to_host,
                                              .from_host = guarded_from_host,
                                              .owns = guarded_owns,
                                              .counts = guarded_counts,
                                              .reset_peak = guarded_reset_peak};

/* Each op: the CPU kernel with every tensor pointer untagged. */
#define CPU (loom_ops_cpu())

static void g_matmul_forward(const loom_ops *be, float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                             int OC) {
  CPU->matmul_forward(CPU, U(out), U(inp), U(weight), U(bias), N, C, OC);
}
static void g_matmul_backward(const loom_ops *be, float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                              const float *weight, int N, int C, int OC) {
  CPU->matmul_backward(CPU, U(dinp), U(dweight), U(dbias), U(dout), U(inp), U(weight), N, C, OC);
}
static void g_layernorm_forward(const loom_ops *be, float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                const float *bias, int N, int C, float eps) {
  CPU->layernorm_forward(CPU, U(out), U(mean), U(rstd), U(inp), U(weight), U(bias), N, C, eps);
}
static void g_layernorm_backward(const loom_ops *be, float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                 const float *weight, const float *mean, const float *rstd, int N, int C) {
  CPU->layernorm_backward(CPU, U(dinp), U(dweight), U(dbias), U(dout), U(inp), U(weight), U(mean), U(rstd), N, C);
}
static void g_rmsnorm_forward(const loom_ops *be, float *out, float *rstd, const float *inp, const float *weight, int N,
                              int C, float eps) {
  CPU->rmsnorm_forward(CPU, U(out), U(rstd), U(inp), U(weight), N, C, eps);
}
static void g_rmsnorm_backward(const loom_ops *be, float *dinp, float *dweight, const float *dout, const float *inp,
                               const float *weight, const float *rstd, int N, int C) {
  CPU->rmsnorm_backward(CPU, U(dinp), U(dweight), U(dout), U(inp), U(weight), U(rstd), N, C);
}
static void g_swiglu_forward(const loom_ops *be, float *out, const float *inp, int N, int F, loom_glu glu) {
  CPU->swiglu_forward(CPU, U(out), U(inp), N, F, glu);
}
static void g_swiglu_backward(const loom_ops *be, float *dinp, const float *dout, const float *inp, int N, int F,
                              loom_glu glu) {
  CPU->swiglu_backward(CPU, U(dinp), U(dout), U(inp), N, F, glu);
}
static void g_rope_forward(const loom_ops *be, float *x, int T, int B, int stride, int heads, int D, int pos_offset,
                           loom_rope rope) {
  CPU->rope_forward(CPU, U(x), T, B, stride, heads, D, pos_offset, rope);
}
static void g_rope_backward(const loom_ops *be, float *dx, int T, int B, int stride, int heads, int D, int pos_offset,
                            loom_rope rope) {
  CPU->rope_backward(CPU, U(dx), T, B, stride, heads, D, pos_offset, rope);
}
static void g_gelu_forward(const loom_ops *be, float *out, const float *inp, size_t n) { CPU->gelu_forward(CPU, U(out), U(inp), n); }
static void g_gelu_backward(const loom_ops *be, float *dinp, const float *dout, const float *inp, size_t n) {
  CPU->gelu_backward(CPU, U(dinp), U(dout), U(inp), n);
}
static void g_attention_forward(const loom_ops *be, float *out, float *lse, const float *qkv, const loom_attn_shape *s,
                                const loom_dropout *drop) {
  CPU->attention_forward(CPU, U(out), U(lse), U(qkv), s, drop);
}
static void g_attention_backward(const loom_ops *be, float *dqkv, const float *dout, const float *out, const float *qkv,
                                 const float *lse, const loom_attn_shape *s, const loom_dropout *drop) {
  CPU->attention_backward(CPU, U(dqkv), U(dout), U(out), U(qkv), U(lse), s, drop);
}
static void g_attention_block_forward(const loom_ops *be, float *out, float *lse, const float *q, const float *kv, int Tq,
                                      int Tk, const int *q_pos, const int *k_pos, const loom_attn_shape *s,
                                      const loom_dropout *drop, bool first) {
  CPU->attention_block_forward(CPU, U(out), U(lse), U(q), U(kv), Tq, Tk, q_pos, k_pos, s, drop, first);
}
static void g_attention_block_backward(const loom_ops *be, float *dq, float *dkv, const float *dout, const float *out,
                                       const float *q, const float *kv, int Tq, int Tk, const int *q_pos, const int *k_pos,
                                       const float *lse, const loom_attn_shape *s, const loom_dropout *drop) {
  CPU->attention_block_backward(CPU, U(dq), U(dkv), U(dout), U(out), U(q), U(kv), Tq, Tk, q_pos, k_pos, U(lse), s, drop);
}
static void g_attention_sink_forward(const loom_ops *be, float *out, float *lse, const float *sinks, const loom_attn_shape *s) {
  CPU->attention_sink_forward(CPU, U(out), U(lse), U(sinks), s);
}
static void g_attention_sink_backward(const loom_ops *be, float *dsinks, const float *dout, const float *out, const float *lse,
                                      const float *sinks, const loom_attn_shape *s) {
  CPU->attention_sink_backward(CPU, U(dsinks), U(dout), U(out), U(lse), U(sinks), s);
}
static void g_embedding_forward(const loom_ops *be, float *out, const int *tokens, const float *wte, int vocab_start, int rows, int T,
                                int B, int C) {
  CPU->embedding_forward(CPU, U(out), U(tokens), U(wte), vocab_start, rows, T, B, C);
}
static void g_embedding_forward_bf16(const loom_ops *be, float *out, const int *tokens, const uint16_t *wte, int vocab_start,
                                     int rows, int T, int B, int C) {
  CPU->embedding_forward_bf16(CPU, U(out), U(tokens), U(wte), vocab_start, rows, T, B, C);
}
static void g_embedding_backward(const loom_ops *be, float *dwte, const float *dout, const int *tokens, int vocab_start, int rows, int T,
                                 int B, int C) {
  CPU->embedding_backward(CPU, U(dwte), U(dout), U(tokens), vocab_start, rows, T, B, C);
}
static void g_position_forward(const loom_ops *be, float *out, const float *wpe, int T, int B, int C, int pos_offset) {
  CPU->position_forward(CPU, U(out), U(wpe), T, B, C, pos_offset);
}
static void g_position_backward(const loom_ops *be, float *dwpe, const float *dout, int T, int B, int C, int pos_offset) {
  CPU->position_backward(CPU, U(dwpe), U(dout), T, B, C, pos_offset);
}
static void g_bias_forward(const loom_ops *be, float *out, const float *bias, int N, int OC) { CPU->bias_forward(CPU, U(out), U(bias), N, OC); }
static void g_bias_backward(const loom_ops *be, float *dbias, const float *dout, int N, int OC) {
  CPU->bias_backward(CPU, U(dbias), U(dout), N, OC);
}
static void g_logsumexp(const loom_ops *be, float *lse, const float *logits, int N, int V, int width) {
  CPU->logsumexp(CPU, U(lse), U(logits), N, V, width);
}
static void g_pick_targets(const loom_ops *be, float *picked, const float *logits, const int *targets, int vocab_start, int N, int V,
                           int width) {
  CPU->pick_targets(CPU, U(picked), U(logits), U(targets), vocab_start, N, V, width);
}
static void g_crossentropy_backward(const loom_ops *be, float *dlogits, const float *logits, const float *lse, const int *targets,
                                    int vocab_start, float dloss, int N, int V, int width) {
  CPU->crossentropy_backward(CPU, U(dlogits), U(logits), U(lse), U(targets), vocab_start, dloss, N, V, width);
}
static void g_crossentropy_losses(const loom_ops *be, float *losses, const float *lse, const float *picked, const int *targets, int N) {
  CPU->crossentropy_losses(CPU, U(losses), U(lse), U(picked), U(targets), N);
}
static void g_exp_shifted(const loom_ops *be, float *x, const float *shift, size_t n) { CPU->exp_shifted(CPU, U(x), U(shift), n); }
static void g_log_shifted(const loom_ops *be, float *x, const float *shift, size_t n) { CPU->log_shifted(CPU, U(x), U(shift), n); }
static void g_argmax(const loom_ops *be, float *val, int *idx, const float *logits, int N, int V, int width) {
  CPU->argmax(CPU, U(val), U(idx), U(logits), N, V, width);
}
static void g_add(const loom_ops *be, float *out, const float *a, const float *b, size_t n) { CPU->add(CPU, U(out), U(a), U(b), n); }
static void g_accumulate(const loom_ops *be, float *acc, const float *x, size_t n) { CPU->accumulate(CPU, U(acc), U(x), n); }
static void g_gemm(const loom_ops *be, bool ta, bool tb, int M, int N, int K, float alpha, const float *a, const float *b,
                   float beta, float *c) {
  CPU->gemm(CPU, ta, tb, M, N, K, alpha, U(a), U(b), beta, U(c));
}
static void g_orthonormalize(const loom_ops *be, float *x, int n, int r) { CPU->orthonormalize(CPU, U(x), n, r); }
static void g_sign_pack(const loom_ops *be, uint32_t *msg, const float *x, size_t n) { CPU->sign_pack(CPU, U(msg), U(x), n); }
static void g_rows_gather(const loom_ops *be, float *out, const float *x, const int *rows, int M, int C) {
  CPU->rows_gather(CPU, U(out), U(x), U(rows), M, C);
}
static void g_rows_combine(const loom_ops *be, float *y, const float *x, const int *slots, const float *w, int N, int k, int C) {
  CPU->rows_combine(CPU, U(y), U(x), U(slots), U(w), N, k, C);
}
static void g_rows_combine_backward(const loom_ops *be, float *dx, float *dw, const float *dy, const float *x,
                                    const int *slots, const float *w, int N, int k, int C) {
  CPU->rows_combine_backward(CPU, U(dx), U(dw), U(dy), U(x), U(slots), U(w), N, k, C);
}
static void g_sign_unpack_add(const loom_ops *be, float *y, const uint32_t *msg, size_t n, float weight) {
  CPU->sign_unpack_add(CPU, U(y), U(msg), n, weight);
}
static double g_sumsq(const loom_ops *be, const float *x, size_t n) { return CPU->sumsq(CPU, U(x), n); }
static void g_dropout_forward(const loom_ops *be, float *x, int T, int B, int C, const loom_dropout *drop) {
  CPU->dropout_forward(CPU, U(x), T, B, C, drop);
}
static void g_dropout_backward(const loom_ops *be, float *dx, int T, int B, int C, const loom_dropout *drop) {
  CPU->dropout_backward(CPU, U(dx), T, B, C, drop);
}
static void g_to_bf16(const loom_ops *be, uint16_t *out, const float *in, size_t n) { CPU->to_bf16(CPU, U(out), U(in), n); }
static void g_from_bf16(const loom_ops *be, float *out, const uint16_t *in, size_t n) { CPU->from_bf16(CPU, U(out), U(in), n); }
static void g_round_bf16(const loom_ops *be, float *x, size_t n) { CPU->round_bf16(CPU, U(x), n); }
/* An operand's pointer made usable by the CPU kernels. */
static loom_bf16_operand UO(loom_bf16_operand x) { return (loom_bf16_operand){.bf16 = U(x.bf16), .f32 = U(x.f32)}; }
static void g_matmul_forward_bf16(const loom_ops *be, float *out, loom_bf16_operand inp, const uint16_t *weight,
                                  const float *bias, int N, int C, int OC) {
  CPU->matmul_forward_bf16(CPU, U(out), UO(inp), U(weight), U(bias), N, C, OC);
}
static void g_matmul_backward_bf16(const loom_ops *be, float *dinp, float *dweight, float *dbias, loom_bf16_operand dout,
                                   loom_bf16_operand inp, const uint16_t *weight, int N, int C, int OC) {
  CPU->matmul_backward_bf16(CPU, U(dinp), U(dweight), U(dbias), UO(dout), UO(inp), U(weight), N, C, OC);
}
static float g_fp8_amax(const loom_ops *be, loom_bf16_operand x, size_t n) { return CPU->fp8_amax(CPU, UO(x), n); }
static void g_fp8_quantize(const loom_ops *be, uint8_t *codes, float *scale_inv, loom_bf16_operand x, int R, int C,
                           bool transpose, const loom_fp8_quant *q) {
  CPU->fp8_quantize(CPU, U(codes), U(scale_inv), UO(x), R, C, transpose, q);
}
/* An FP8 operand's pointers made usable by the CPU kernels. */
static loom_fp8_matrix UF(const loom_fp8_matrix *m) {
  loom_fp8_matrix out = *m;
  out.codes = U(m->codes), out.scale_inv = U(m->scale_inv);
  return out;
}
static void g_fp8_gemm(const loom_ops *be, float *c, bool accumulate, const loom_fp8_matrix *a, const loom_fp8_matrix *b,
                       int M, int N, int K) {
  const loom_fp8_matrix ua = UF(a), ub = UF(b);
  CPU->fp8_gemm(CPU, U(c), accumulate, &ua, &ub, M, N, K);
}
static void g_adamw(const loom_ops *be, float *param, const float *grad, float *m, float *v, uint16_t *compute, size_t n,
                    const loom_adamw_args *args) {
  CPU->adamw(CPU, U(param), U(grad), U(m), U(v), U(compute), n, args);
}

static const loom_ops GUARDED_OPS = {
    .name = "guarded",
    .mem = &GUARDED_MEMORY,
    .matmul_forward = g_matmul_forward,
    .matmul_backward = g_matmul_backward,
    .layernorm_forward = g_layernorm_forward,
    .layernorm_backward = g_layernorm_backward,
    .rmsnorm_forward = g_rmsnorm_forward,
    .rmsnorm_backward = g_rmsnorm_backward,
    .swiglu_forward = g_swiglu_forward,
    .swiglu_backward = g_swiglu_backward,
    .rope_forward = g_rope_forward,
    .rope_backward = g_rope_backward,
    .gelu_forward = g_gelu_forward,
    .gelu_backward = g_gelu_backward,
    .attention_forward = g_attention_forward,
    .attention_block_forward = g_attention_block_forward,
    .attention_block_backward = g_attention_block_backward,
    .attention_backward = g_attention_backward,
    .embedding_forward = g_embedding_forward,
    .embedding_forward_bf16 = g_embedding_forward_bf16,
    .embedding_backward = g_embedding_backward,
    .position_forward = g_position_forward,
    .position_backward = g_position_backward,
    .bias_forward = g_bias_forward,
    .bias_backward = g_bias_backward,
    .logsumexp = g_logsumexp,
    .pick_targets = g_pick_targets,
    .crossentropy_backward = g_crossentropy_backward,
    .crossentropy_losses = g_crossentropy_losses,
    .exp_shifted = g_exp_shifted,
    .log_shifted = g_log_shifted,
    .argmax = g_argmax,
    .add = g_add,
    .accumulate = g_accumulate,
    .sumsq = g_sumsq,
    .sumsq_batch = loom_host_sumsq_batch,
    .gemm = g_gemm,
    .orthonormalize = g_orthonormalize,
    .attention_sink_forward = g_attention_sink_forward,
    .attention_sink_backward = g_attention_sink_backward,
    .sign_pack = g_sign_pack,
    .sign_unpack_add = g_sign_unpack_add,
    .grouped_matmul_forward = loom_grouped_matmul_by_expert,
    .grouped_matmul_backward = loom_grouped_matmul_backward_by_expert,
    .rows_gather = g_rows_gather,
    .rows_combine = g_rows_combine,
    .rows_combine_backward = g_rows_combine_backward,
    .dropout_forward = g_dropout_forward,
    .dropout_backward = g_dropout_backward,
    .to_bf16 = g_to_bf16,
    .from_bf16 = g_from_bf16,
    .round_bf16 = g_round_bf16,
    .matmul_forward_bf16 = g_matmul_forward_bf16,
    .matmul_backward_bf16 = g_matmul_backward_bf16,
    .fp8_amax = g_fp8_amax,
    .fp8_quantize = g_fp8_quantize,
    .fp8_gemm = g_fp8_gemm,
    .adamw = g_adamw,
};

/* A stray access is a segmentation fault (or, for a non-canonical address,
 * a general-protection fault the kernel also delivers as SIGSEGV): name the
 * likely cause, then die of the signal as before. */
static void on_fault(int sig) {
  static const char msg[] = "loom: segmentation fault under the guarded backend: host code dereferenced tensor "
                            "memory, which only the backend's ops and transfers may touch\n";
  if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) { /* nothing more to do */
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

const loom_ops *loom_ops_guarded(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fault;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, NULL);
  sigaction(SIGBUS, &sa, NULL);
  return &GUARDED_OPS;
}
