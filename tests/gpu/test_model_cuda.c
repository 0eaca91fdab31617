/* The whole model on the GPU against the CPU: a tiny GPT (dropout on) built
 * twice from one seed, once on the CPU backend and once on the CUDA backend
 * (synchronised ops, managed memory: host-addressable, so the grads are compared in place); one forward and backward on the same
 * batch must give the same loss (relative 1e-5) and every parameter's grad
 * within NMSE 1e-8; then 20 AdamW steps must keep the losses within relative
 * 1e-4 of each other. Exits 77 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "backend/cuda/cuda_backend.h"
#include "layers/gpt.h"
#include "optim/adamw.h"
#include "test_util.h"

enum { T = 16, B = 4 };

static loom_gpt_config tiny(void) {
  loom_gpt_config c = {.layers = 2, .hidden = 32, .heads = 4, .vocab = 64, .seq = T, .dropout = 0.1f, .norm_eps = 1e-5f};
  loom_gpt_config_finish(&c);
  return c;
}

static void build(loom_gpt *m, const loom_ops *ops) {
  const loom_gpt_config c = tiny();
  if (loom_gpt_init(m, &c, ops, 1234, NULL) != LOOM_OK || loom_gpt_set_batch_shape(m, T, B) != LOOM_OK) {
    printf("FAIL: cannot build the %s model\n", ops->name);
    exit(1);
  }
}

/* Batch k: tokens and next-token targets from a fixed pattern. */
static loom_gpt_batch batch_of(int k, int *tokens, int *targets) {
  for (int i = 0; i < T * B; i++) {
    tokens[i] = (i * 7 + k * 13) % 64;
    targets[i] = (i * 7 + k * 13 + 5) % 64;
  }
  return (loom_gpt_batch){.tokens = tokens, .targets = targets, .sample_offset = (int64_t)k * B, .step = k, .train = true};
}

int main(void) {
  if (!loom_cuda_available()) {
    printf("SKIP: no CUDA device here\n");
    return 77;
  }
  loom_gpt cpu, gpu;
  build(&cpu, loom_ops_cpu());
  loom_cuda_select_device(0);
  build(&gpu, loom_cuda_open(true));
  int tokens[T * B], targets[T * B], failures = 0;
  loom_gpt_batch batch = batch_of(0, tokens, targets);
  const float lc = loom_gpt_forward(&cpu, &batch), lg = loom_gpt_forward(&gpu, &batch);
  loom_gpt_backward(&cpu, &batch, 1.0f / (T * B));
  loom_gpt_backward(&gpu, &batch, 1.0f / (T * B));
  const int loss_ok = fabs(lc - lg) <= 1e-5 * fabs(lc);
  printf("  loss: cpu %.7f gpu %.7f %s\n", lc, lg, loss_ok ? "OK" : "FAIL");
  failures += !loss_ok;
  for (int k = 0; k < cpu.p.grads.count; k++) {
    const loom_tensor *a = &cpu.p.grads.views[k], *b = &gpu.p.grads.views[k];
    const double e = tu_nmse(b->data, a->data, loom_tensor_numel(a));
    if (e > 1e-8) printf("  grad %-28s FAIL nmse %.2e\n", a->name, e);
    failures += e > 1e-8;
  }
  printf("  grads: %d tensors compared (NMSE <= 1e-8)\n", cpu.p.grads.count);
  /* Training: the loss curves stay together. */
  loom_adamw oc, og;
  const loom_adamw_config cfg = loom_adamw_defaults();
  loom_adamw_init(&oc, &cpu.p, &cfg);
  loom_adamw_init(&og, &gpu.p, &cfg);
  double worst = 0.0;
  for (int step = 1; step <= 20; step++) {
    batch = batch_of(step, tokens, targets);
    loom_gpt_zero_grad(&cpu);
    loom_gpt_zero_grad(&gpu);
    const float a = loom_gpt_forward(&cpu, &batch), b = loom_gpt_forward(&gpu, &batch);
    loom_gpt_backward(&cpu, &batch, 1.0f / (T * B));
    loom_gpt_backward(&gpu, &batch, 1.0f / (T * B));
    loom_adamw_step(&oc, &cpu.p, 1e-3f, loom_grad_norm(&cpu.p, cpu.ops, NULL), cpu.ops);
    loom_adamw_step(&og, &gpu.p, 1e-3f, loom_grad_norm(&gpu.p, gpu.ops, NULL), gpu.ops);
    const double rel = fabs(a - b) / fabs(a);
    if (rel > worst) worst = rel;
  }
  printf("  20 steps: worst relative loss difference %.2e %s\n", worst, worst <= 1e-4 ? "OK" : "FAIL");
  failures += worst > 1e-4;
  loom_adamw_free(&oc);
  loom_adamw_free(&og);
  loom_gpt_free(&cpu);
  loom_gpt_free(&gpu);
  printf("%s\n", failures ? "FAIL" : "ok");
  return failures ? 1 : 0;
}
