/* The whole GPT: every parameter's gradient against central finite
 * differences (with and without dropout), the CPU backend against the
 * reference backend end to end, the loss at init, and overfitting one batch.
 *
 * Gradient check: h = 1e-2 on fp32 parameters of a tiny model; each tensor's
 * analytic gradient must match with relative L2 error <= 1e-2 and every
 * element within 5e-4 + 5e-2 * |fd|. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/rng.h"
#include "layers/gpt.h"
#include "optim/adamw.h"
#include "test_util.h"

static loom_gpt_config tiny(float dropout) {
  loom_gpt_config c = {.layers = 2, .hidden = 8, .heads = 2, .vocab = 20, .seq = 6, .dropout = dropout, .norm_eps = 1e-5f};
  loom_gpt_config_finish(&c);
  return c;
}

/* A fixed batch of T x B tokens below vocab. */
static void make_batch(int *tokens, int *targets, int T, int B, int vocab, uint64_t stream) {
  for (int i = 0; i < T * B; i++) {
    tokens[i] = (int)(loom_rng_u32(9, stream, (uint64_t)i) % (uint32_t)vocab);
    targets[i] = (int)(loom_rng_u32(9, stream + 1, (uint64_t)i) % (uint32_t)vocab);
  }
}

static void grad_check(float dropout) {
  enum { T = 5, B = 2 };
  const loom_gpt_config cfg = tiny(dropout);
  loom_gpt m;
  ck_assert_int_eq(loom_gpt_init(&m, &cfg, loom_ops_ref(), 11, NULL), LOOM_OK);
  ck_assert_int_eq(loom_gpt_set_batch_shape(&m, T, B), LOOM_OK);
  /* Nonzero biases and non-unit norms so every path carries signal. */
  for (int i = 0; i < m.p.params.count; i++) {
    loom_tensor *t = &m.p.params.views[i];
    if (m.p.meta[i].init == LOOM_INIT_NORMAL) {
      loom_rng_fill_normal(t->data, loom_tensor_numel(t), 3, (uint64_t)i, 0, 0.0f, 0.3f);
    } else {
      loom_rng_fill_normal(t->data, loom_tensor_numel(t), 4, (uint64_t)i, 0, m.p.meta[i].init == LOOM_INIT_ONES ? 1.0f : 0.0f, 0.2f);
    }
  }
  int tokens[T * B], targets[T * B];
  make_batch(tokens, targets, T, B, cfg.vocab, 1);
  targets[3] = -1; /* a masked position */
  const loom_gpt_batch batch = {.tokens = tokens, .targets = targets, .sample_offset = 4, .step = 2, .train = true};
  loom_gpt_zero_grad(&m);
  loom_gpt_forward(&m, &batch);
  loom_gpt_backward(&m, &batch, 1.0f / (T * B - 1));
  for (int i = 0; i < m.p.params.count; i++) {
    loom_tensor *t = &m.p.params.views[i];
    const float *g = m.p.grads.views[i].data;
    float *w = t->data;
    const size_t n = loom_tensor_numel(t);
    double num = 0.0, den = 0.0;
    for (size_t k = 0; k < n; k++) {
      const float saved = w[k], h = 1e-2f;
      w[k] = saved + h;
      const double lp = loom_gpt_forward(&m, &batch);
      w[k] = saved - h;
      const double lm = loom_gpt_forward(&m, &batch);
      w[k] = saved;
      const double fd = (lp - lm) / (2.0 * h);
      ck_assert_msg(fabs(g[k] - fd) <= 5e-4 + 5e-2 * fabs(fd), "%s[%zu]: analytic %g vs fd %g", t->name, k, (double)g[k], fd);
      num += (g[k] - fd) * (g[k] - fd);
      den += fd * fd;
    }
    ck_assert_msg(den == 0.0 ? num == 0.0 : sqrt(num / den) <= 1e-2, "%s: relative L2 error %g", t->name, sqrt(num / den));
  }
  /* Padded vocab rows never reach the loss. */
  const float *gwte = m.p.g.wte;
  for (size_t k = (size_t)cfg.vocab * cfg.hidden; k < (size_t)cfg.padded_vocab * cfg.hidden; k++) ck_assert_float_eq(gwte[k], 0.0f);
  loom_gpt_free(&m);
}

START_TEST(gradients_match_finite_differences) { grad_check(0.0f); }
END_TEST
START_TEST(gradients_match_finite_differences_with_dropout) { grad_check(0.2f); }
END_TEST

/* The CPU backend and the reference backend agree on loss and every grad. */
START_TEST(cpu_backend_matches_reference) {
  enum { T = 6, B = 3 };
  loom_gpt_config cfg = tiny(0.1f);
  cfg.hidden = 16;
  cfg.ffn = 64;
  loom_gpt a, r;
  ck_assert_int_eq(loom_gpt_init(&a, &cfg, loom_ops_cpu(), 5, NULL), LOOM_OK);
  ck_assert_int_eq(loom_gpt_init(&r, &cfg, loom_ops_ref(), 5, NULL), LOOM_OK);
  loom_gpt_set_batch_shape(&a, T, B);
  loom_gpt_set_batch_shape(&r, T, B);
  int tokens[T * B], targets[T * B];
  make_batch(tokens, targets, T, B, cfg.vocab, 7);
  const loom_gpt_batch batch = {.tokens = tokens, .targets = targets, .step = 1, .train = true};
  loom_gpt_zero_grad(&a);
  loom_gpt_zero_grad(&r);
  const float la = loom_gpt_forward(&a, &batch), lr = loom_gpt_forward(&r, &batch);
  ck_assert_double_eq_tol(la, lr, 1e-5 * fabs(lr));
  loom_gpt_backward(&a, &batch, 1.0f / (T * B));
  loom_gpt_backward(&r, &batch, 1.0f / (T * B));
  for (int i = 0; i < a.p.grads.count; i++) {
    const size_t n = loom_tensor_numel(&a.p.grads.views[i]);
    const double e = tu_nmse(a.p.grads.views[i].data, r.p.grads.views[i].data, n);
    ck_assert_msg(e <= 1e-9, "%s: cpu vs ref grad NMSE %g", a.p.grads.views[i].name, e);
  }
  loom_gpt_free(&a);
  loom_gpt_free(&r);
}
END_TEST

/* GPT-2 init predicts near-uniformly: the loss starts close to ln V. */
START_TEST(initial_loss_is_log_vocab) {
  enum { T = 32, B = 4 };
  loom_gpt_config cfg;
  loom_gpt_config_preset(&cfg, "gpt-tiny");
  loom_gpt m;
  ck_assert_int_eq(loom_gpt_init(&m, &cfg, loom_ops_cpu(), 1, NULL), LOOM_OK);
  loom_gpt_set_batch_shape(&m, T, B);
  int tokens[T * B], targets[T * B];
  make_batch(tokens, targets, T, B, cfg.vocab, 3);
  const loom_gpt_batch batch = {.tokens = tokens, .targets = targets};
  ck_assert_uint_eq(loom_gpt_activation_bytes(&cfg, T, B, 1, false, NULL, false, 1),
                    (m.a->mem.numel + m.w.mem.numel) * sizeof(float));
  const float loss = loom_gpt_forward(&m, &batch);
  ck_assert_msg(fabs(loss - log(cfg.vocab)) < 0.05, "initial loss %g vs ln V %g", (double)loss, log(cfg.vocab));
  loom_gpt_free(&m);
}
END_TEST

/* Repeated steps on one fixed batch drive the loss below 0.05. */
START_TEST(overfits_one_batch) {
  enum { T = 16, B = 4 };
  loom_gpt_config cfg = {.layers = 2, .hidden = 32, .heads = 4, .vocab = 64, .seq = T, .norm_eps = 1e-5f};
  loom_gpt_config_finish(&cfg);
  loom_gpt m;
  loom_adamw opt;
  ck_assert_int_eq(loom_gpt_init(&m, &cfg, loom_ops_cpu(), 2, NULL), LOOM_OK);
  loom_gpt_set_batch_shape(&m, T, B);
  loom_adamw_config oc = loom_adamw_defaults();
  oc.weight_decay = 0.0f;
  ck_assert_int_eq(loom_adamw_init(&opt, &m.p, &oc), LOOM_OK);
  int tokens[T * B], targets[T * B];
  make_batch(tokens, targets, T, B, cfg.vocab, 5);
  const loom_gpt_batch batch = {.tokens = tokens, .targets = targets, .train = true};
  float loss = 0.0f, first = 0.0f;
  for (int step = 0; step < 300; step++) {
    loom_gpt_zero_grad(&m);
    loss = loom_gpt_forward(&m, &batch);
    if (step == 0) first = loss;
    loom_gpt_backward(&m, &batch, 1.0f / (T * B));
    loom_adamw_step(&opt, &m.p, 1e-2f, loom_grad_norm(&m.p, m.ops, NULL), m.ops);
  }
  ck_assert_msg(loss < 0.05f, "loss after 300 steps on one batch: %g (from %g)", (double)loss, (double)first);
  loom_adamw_free(&opt);
  loom_gpt_free(&m);
}
END_TEST

/* Every parameter element is drawn by canonical name and global index: two
 * models with different padding agree on every real element. */
START_TEST(init_is_keyed_by_name_and_index) {
  loom_gpt_config a = tiny(0.0f), b = tiny(0.0f);
  b.padded_vocab = 256;
  loom_gpt_params pa, pb;
  loom_gpt_params_init(&pa, &a, 0, 1, NULL, &loom_host_memory);
  loom_gpt_params_init(&pb, &b, 0, 1, NULL, &loom_host_memory);
  loom_gpt_params_randomize(&pa, 77);
  loom_gpt_params_randomize(&pb, 77);
  for (int i = 0; i < pa.params.count; i++) {
    const loom_tensor *ta = &pa.params.views[i], *tb = &pb.params.views[i];
    ck_assert_str_eq(ta->name, tb->name);
    const size_t n = i == 0 ? (size_t)a.vocab * a.hidden : loom_tensor_numel(ta);
    ck_assert_mem_eq(ta->data, tb->data, n * sizeof(float));
  }
  /* Names follow GPT-2 and shapes are the full canonical ones. */
  const int k = loom_gpt_params_find(&pa, "h.1.attn.c_attn.weight");
  ck_assert_int_ge(k, 0);
  ck_assert_int_eq(pa.params.views[k].shape[0], 3 * a.hidden);
  ck_assert_int_eq(pa.params.views[k].shape[1], a.hidden);
  ck_assert_int_ge(loom_gpt_params_find(&pa, "ln_f.bias"), 0);
  ck_assert_uint_eq(loom_gpt_param_count(&a, NULL, 1), pa.params.numel);
  ck_assert_uint_eq(loom_gpt_param_count(&b, NULL, 1), pb.params.numel);
  loom_gpt_params_free(&pa);
  loom_gpt_params_free(&pb);
}
END_TEST

int main(void) {
  Suite *s = suite_create("model");
  TCase *tc = tcase_create("model");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, gradients_match_finite_differences);
  tcase_add_test(tc, gradients_match_finite_differences_with_dropout);
  tcase_add_test(tc, cpu_backend_matches_reference);
  tcase_add_test(tc, initial_loss_is_log_vocab);
  tcase_add_test(tc, overfits_one_batch);
  tcase_add_test(tc, init_is_keyed_by_name_and_index);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
