/* The CPU backend's attention: causal (and windowed) attention over a
 * whole sequence, and context parallelism's blocks of it, forward and
 * backward (ops.h's attention ops), one query row at a time with online
 * softmax. */
#ifndef LOOM_CPU_ATTENTION_H
#define LOOM_CPU_ATTENTION_H

#include "backend/ops.h"

void loom_cpu_attention_forward(const loom_ops *be, float *out, float *lse, const float *qkv, const loom_attn_shape *s, const loom_dropout *drop);
void loom_cpu_attention_backward(const loom_ops *be, float *dqkv, const float *dout, const float *out, const float *qkv, const float *lse, const loom_attn_shape *s, const loom_dropout *drop);
void loom_cpu_attention_block_forward(const loom_ops *be, float *out, float *lse, const float *q, const float *kv, int Tq, int Tk, const int *q_pos, const int *k_pos, const loom_attn_shape *s, const loom_dropout *drop, bool first);
void loom_cpu_attention_block_backward(const loom_ops *be, float *dq, float *dkv, const float *dout, const float *out, const float *q, const float *kv, int Tq, int Tk, const int *q_pos, const int *k_pos, const float *lse, const loom_attn_shape *s, const loom_dropout *drop);

#endif
