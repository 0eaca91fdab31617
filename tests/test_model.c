/* The whole model, in each family (the loop index: GPT-2; Llama's RMSNorm,
 * SwiGLU, RoPE, grouped-query attention without biases and an untied head;
 * a mix of the switches: LayerNorm with biases, SwiGLU, learned
 * positions, multi-query attention, untied, the off-by-one softmax;
 * Llama's MoE; Qwen3's heads of their own width with QK-norm; GPT-OSS's
 * attention sinks, alternating sliding windows and biased experts): every parameter's gradient
 * against central finite differences (with and without dropout), the CPU
 * backend against the reference backend end to end, the loss at init, and
 * overfitting one batch.
 *
 * Gradient check: h = 3e-3 on fp32 parameters of a tiny model (1e-2 left
 * RoPE and SwiGLU under dropout 0.006 off: truncation, not the grads); each
 * tensor's analytic gradient must match with relative L2 error <= 1e-2 and
 * every element within 5e-4 + 5e-2 * |fd| (a tensor whose grads are under
 * 1e-2 per element in RMS: an error under 1e-4 per element, the differences'
 * fp32 noise). A key projection's bias has a
 * true grad of zero (softmax ignores a shift every key shares): there the
 * analytic one must be rounding noise, under 1e-6. */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include "core/rng.h"
#include "layers/gpt.h"
#include "layers/moe_dispatch.h"
#include "layers/moe_router.h"
#include "optim/adamw.h"
#include "cli/names.h"
#include "test_util.h"

enum { GPT2, LLAMA, MIXED, MOE, QWEN3, OSS, DSV3, MLA_DIRECT, FAMILIES };

/* Sets the architecture switches of a family on c (its sizes stay). */
static void as_family(loom_gpt_config *c, int family) {
  if (family == LLAMA) {
    c->heads = 4, c->kv_heads = 2, c->ffn = 12;
    c->norm = LOOM_NORM_RMSNORM, c->mlp = LOOM_MLP_SWIGLU, c->position = LOOM_POSITION_ROPE;
    c->rope.theta = 100.0f; /* turns quickly enough to matter over a few positions */
    c->no_bias = c->untied = true;
  } else if (family == MIXED) { /* with Megatron's off-by-one softmax: a logit 0 in every row's denominator */
    c->kv_heads = 1, c->ffn = 12, c->mlp = LOOM_MLP_SWIGLU, c->untied = true, c->softmax = LOOM_SOFTMAX_OFF_BY_ONE;
  } else if (family == MOE) { /* Llama's, its MLPs 4 experts (top 2) and a gated shared expert, both router losses on,
                                * but for the first layer's, which stays dense (--moe-layer-freq ([0]+[1]*(L-1))) */
    as_family(c, LLAMA);
    c->moe = (loom_moe_config){.experts = 4, .topk = 2, .shared_ffn = 4, .shared_gate = true, .aux_loss_coeff = 0.1f,
                               .z_loss_coeff = 0.01f};
    if (c->layers > 1) loom_gpt_set_dense_layer(c, 0, true);
  } else if (family == QWEN3) { /* Llama's, its heads 6 wide whatever hidden / heads is (--kv-channels), QK-norm on */
    as_family(c, LLAMA);
    c->head_dim = 6, c->qk_norm = true;
  } else if (family == OSS) { /* GPT-OSS: Llama's with heads of their own width, biases on every linear (q, k, v, o and
                                * the experts'), learned sinks, a window of 2 keys back in its first layer, the second
                                * in full, and every MLP 4 experts (top 2) with GPT-OSS's clamped unit and a router bias */
    as_family(c, LLAMA);
    c->head_dim = 6, c->softmax = LOOM_SOFTMAX_LEARNABLE, c->window = 2, c->no_bias = false;
    c->glu = (loom_glu){.alpha = LOOM_QUICK_GELU_ALPHA, .clamp = 7.0f, .offset = 1.0f}; /* GPT-OSS's experts' unit */
    c->moe = (loom_moe_config){.experts = 4, .topk = 2, .router_bias = true, .aux_loss_coeff = 0.1f};
    if (c->layers > 1) loom_gpt_set_full_attention_layer(c, 1, true);
  } else if (family == DSV3) { /* DeepSeek-V3: multi-head latent attention with q through its latent, YaRN with its
                                * softmax factor (mscale_all_dim), the MLPs 4 experts beside a shared one routed by
                                * sigmoid scores from the better of 2 groups, the weights scaled, the first layer dense */
    as_family(c, LLAMA);
    c->kv_heads = 0;
    c->mla = (loom_mla_config){.q_lora_rank = 4, .kv_lora_rank = 6, .qk_head_dim = 4, .qk_pos_emb_head_dim = 2,
                               .v_head_dim = 3, .mscale_all_dim = 1.0f};
    c->rope = (loom_rope){.theta = 100.0f, .factor = 4.0f, .original_max_position = 2, .yarn = 1, .beta_fast = 32.0f,
                          .beta_slow = 1.0f, .truncate = 1, .attention_factor = 1.0f};
    c->moe = (loom_moe_config){.experts = 4, .topk = 2, .shared_ffn = 4, .score = LOOM_MOE_SCORE_SIGMOID, .router_groups = 2,
                               .router_group_topk = 1, .topk_scaling = 2.5f, .aux_loss_coeff = 0.1f};
    if (c->layers > 1) loom_gpt_set_dense_layer(c, 0, true);
  } else if (family == MLA_DIRECT) { /* MLA with q straight from the hidden state (DeepSeek-V2-Lite's), q and k heads 2
                                      * + 4 RoPE dims wide, v heads 5 */
    as_family(c, LLAMA);
    c->kv_heads = 0;
    c->mla = (loom_mla_config){.kv_lora_rank = 5, .qk_head_dim = 2, .qk_pos_emb_head_dim = 4, .v_head_dim = 5};
  }
  loom_gpt_config_finish(c);
}

static loom_gpt_config tiny(float dropout, int family) {
  loom_gpt_config c = {.layers = 2, .hidden = 8, .heads = 2, .vocab = 20, .seq = 6, .dropout = dropout, .norm_eps = 1e-5f};
  as_family(&c, family);
  return c;
}

/* The loss backward differentiates: the mean loss, plus a MoE model's
 * router losses at their weight (dloss per token times the tokens). */
static double objective(loom_gpt *m, const loom_gpt_batch *batch, double router_weight) {
  loom_gpt_moe_stats_reset(m);
  loom_gpt_mtp_stats_reset(m);
  const double loss = loom_gpt_forward(m, batch);
  return loom_mtp_total_loss(&m->p.cfg, loss, loom_gpt_mtp_loss(&m->mtp_stats, m->p.cfg.mtp_layers)) +
         router_weight * (m->moe_stats.aux_loss + m->moe_stats.z_loss);
}

/* A fixed batch of T x B tokens below vocab. */
static void make_batch(int *tokens, int *targets, int T, int B, int vocab, uint64_t stream) {
  for (int i = 0; i < T * B; i++) {
    tokens[i] = (int)(loom_rng_u32(9, stream, (uint64_t)i) % (uint32_t)vocab);
    targets[i] = (int)(loom_rng_u32(9, stream + 1, (uint64_t)i) % (uint32_t)vocab);
  }
}

/* Every parameter's gradient of cfg's model against central differences
 * (only the tensors whose names hold `only`, where not NULL). */
static void grad_check_of(const loom_gpt_config cfg, int family, const char *only);

static void grad_check(float dropout, int family) { grad_check_of(tiny(dropout, family), family, NULL); }

static void grad_check_of(const loom_gpt_config cfg, int family, const char *only) {
  enum { T = 5, B = 2 };
  loom_gpt m;
  ck_assert_int_eq(loom_gpt_init(&m, &cfg, loom_ops_ref(), 11, NULL), LOOM_OK);
  ck_assert_int_eq(loom_gpt_set_batch_shape(&m, T, B), LOOM_OK);
  /* Nonzero biases and non-unit norms so every path carries signal. */
  for (int i = 0; i < m.p.params.count; i++) {
    loom_tensor *t = &m.p.params.views[i];
    if (m.p.meta[i].init == LOOM_INIT_NORMAL) {
      loom_rng_fill_normal(t->data, loom_tensor_numel(t), 3, (uint64_t)i, 0, 0.0f, 0.3f);
    } else {
      /* a router's bias small, as a trained one starts: at 0.2 it brings a token's choices within a step of h of a tie */
      const float spread = m.p.meta[i].role == LOOM_ROLE_ROUTER_B ? 0.02f : 0.2f;
      loom_rng_fill_normal(t->data, loom_tensor_numel(t), 4, (uint64_t)i, 0, m.p.meta[i].init == LOOM_INIT_ONES ? 1.0f : 0.0f, spread);
    }
  }
  int tokens[T * B], targets[T * B];
  make_batch(tokens, targets, T, B, cfg.vocab, 1);
  targets[3] = -1; /* a masked position */
  const loom_gpt_batch batch = {.tokens = tokens, .targets = targets, .sample_offset = 4, .step = 2, .train = true};
  loom_gpt_zero_grad(&m);
  loom_gpt_forward(&m, &batch);
  const float dloss = 1.0f / (T * B - 1);
  loom_gpt_backward(&m, &batch, dloss);
  const double router_weight = (double)(dloss * T * B);
  if (family == MOE) { /* the router losses are there to check */
    objective(&m, &batch, router_weight);
    ck_assert(m.moe_stats.aux_loss > 1e-3 && m.moe_stats.z_loss > 1e-3);
  }
  /* The sanitized pass (LOOM_TEST_SANITIZED=1) checks memory, not numerics: it differences every 7th element of each
   * tensor (every tensor's code still runs), the unsanitized pass every one. */
  const size_t every = getenv("LOOM_TEST_SANITIZED") ? 7 : 1;
  for (int i = 0; i < m.p.params.count; i++) {
    loom_tensor *t = &m.p.params.views[i];
    const float *g = m.p.grads.views[i].data;
    if (only && !strstr(t->name, only)) continue;
    float *w = t->data;
    const size_t n = loom_tensor_numel(t);
    double num = 0.0, den = 0.0;
    for (size_t k = 0; k < n; k += every) {
      const float saved = w[k], h = 3e-3f;
      w[k] = saved + h;
      const double lp = objective(&m, &batch, router_weight);
      w[k] = saved - h;
      const double lm = objective(&m, &batch, router_weight);
      w[k] = saved;
      const double fd = (lp - lm) / (2.0 * h);
      ck_assert_msg(fabs(g[k] - fd) <= 5e-4 + 5e-2 * fabs(fd), "%s[%zu]: analytic %g vs fd %g", t->name, k, (double)g[k], fd);
      num += (g[k] - fd) * (g[k] - fd);
      den += fd * fd;
    }
    /* A tensor whose grads are near the differences' fp32 noise (an expert a token or two reach) is held to that
     * noise instead: 1e-4 per element in RMS, a few ulps of a loss near 3 over 2h (measured: halving h doubles it). */
    const double checked = (double)((n + every - 1) / every);
    const bool at_noise = sqrt(num) <= 1e-4 * sqrt(checked) && sqrt(den) <= 1e-2 * sqrt(checked);
    ck_assert_msg(den == 0.0 ? sqrt(num) <= 1e-6 : sqrt(num / den) <= 1e-2 || at_noise,
                  "%s: relative L2 error %g (error norm %g)", t->name, sqrt(num / den), sqrt(num));
  }
  /* Padded vocab rows never reach the loss, through the embedding or the head. */
  for (size_t k = (size_t)cfg.vocab * cfg.hidden; k < (size_t)cfg.padded_vocab * cfg.hidden; k++) {
    ck_assert_float_eq(m.p.g.wte[k], 0.0f);
    ck_assert_float_eq(m.p.g.lm_head[k], 0.0f);
  }
  ck_assert(cfg.untied == (m.p.g.lm_head != m.p.g.wte));
  loom_gpt_free(&m);
}

START_TEST(gradients_match_finite_differences) { grad_check(0.0f, _i); }
END_TEST

/* A learned bias on the router's logits (GPT-OSS's): its grad and the
 * router weights', the logits' grads summed over the rows. The bias drawn
 * with 0.2's spread brings a token's choices within a step of h of a tie,
 * where the central differences jump (measured: an embedding's fd -0.96 at
 * h 3e-3, 3.09 at 1e-3, analytic 0.22), so it is drawn small; and only the
 * router's tensors are checked, the experts' grads under this routing being
 * the MoE family's above. */
START_TEST(router_bias_gradients_match_finite_differences) {
  loom_gpt_config c = tiny(0.0f, MOE);
  c.moe.router_bias = true;
  grad_check_of(c, MOE, "mlp.gate.");
}
END_TEST
START_TEST(gradients_match_finite_differences_with_dropout) { grad_check(0.2f, _i); }
END_TEST

/* Multi-token prediction: two depths after Llama's two layers (with
 * dropout: the tokens ahead's embedding has its own), and DeepSeek-V3's
 * one depth after MLA and its routing, whose block is a MoE layer: every
 * grad of the main loss plus the MTP loss at scale 0.3. DeepSeek-V3's at a
 * vocab of 24: at 20 a token's choices lie within h of a tie (the
 * embedding's fd 1.02 at h 3e-3, 0.95 at 6e-3, the analytic 0.885 at 1e-3). */
START_TEST(mtp_gradients_match_finite_differences) {
  loom_gpt_config c = tiny(_i == 2 ? 0.0f : 0.2f * (float)_i, _i == 2 ? DSV3 : LLAMA);
  c.mtp_layers = _i == 2 ? 1 : 2, c.mtp_loss_scale = 0.3f;
  if (_i == 2) c.vocab = 24, loom_gpt_config_finish(&c);
  grad_check_of(c, _i == 2 ? DSV3 : LLAMA, NULL);
}
END_TEST

/* The CPU backend and the reference backend agree on loss and every grad. */
START_TEST(cpu_backend_matches_reference) {
  enum { T = 6, B = 3 };
  loom_gpt_config cfg = tiny(0.1f, _i);
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
    const double worst = tu_max_abs_diff(a.p.grads.views[i].data, r.p.grads.views[i].data, n);
    ck_assert_msg(e <= 1e-9 || worst <= 1e-7, "%s: cpu vs ref grad NMSE %g, worst %g (a zero grad's rounding noise passes)",
                  a.p.grads.views[i].name, e, worst);
  }
  loom_gpt_free(&a);
  loom_gpt_free(&r);
}
END_TEST

/* A bf16 run's activations and scratch take much less than an fp32 run's
 * at GPT-2-small's shape: the saved activations are bf16, the linears and
 * the embedding read the bf16 weights in place (no fp32 copy of a layer's
 * matrices or of the vocabulary table). What stays fp32: the norm
 * statistics, the logits and the loss, one layer's working activations and
 * the grads' scratch. */
START_TEST(bf16_activations_are_smaller) {
  loom_gpt_config cfg;
  loom_cli_preset("gpt2-small", &cfg);
  cfg.seq = 256;
  const double fp32 = (double)loom_gpt_activation_bytes(&cfg, 256, 4, 1, false, NULL, (loom_recompute){0}, 1, 0);
  cfg.bf16 = true;
  const double bf16 = (double)loom_gpt_activation_bytes(&cfg, 256, 4, 1, false, NULL, (loom_recompute){0}, 1, 0);
  ck_assert_msg(fp32 > 0.0 && bf16 <= 0.8 * fp32, "bf16 activations %.1f MiB against fp32's %.1f MiB", bf16 / 1048576.0,
                fp32 / 1048576.0);
}
END_TEST

/* GPT-2's init predicts near-uniformly in every family: the loss starts
 * within 0.05 of ln V. */
START_TEST(initial_loss_is_log_vocab) {
  enum { T = 32, B = 4 };
  loom_gpt_config cfg;
  loom_cli_preset(_i == LLAMA ? "llama-tiny" : _i == MOE ? "moe-tiny" : "gpt-tiny", &cfg);
  if (_i == MIXED) as_family(&cfg, MIXED);
  loom_gpt m;
  ck_assert_int_eq(loom_gpt_init(&m, &cfg, loom_ops_cpu(), 1, NULL), LOOM_OK);
  loom_gpt_set_batch_shape(&m, T, B);
  int tokens[T * B], targets[T * B];
  make_batch(tokens, targets, T, B, cfg.vocab, 3);
  const loom_gpt_batch batch = {.tokens = tokens, .targets = targets};
  ck_assert_uint_eq(loom_gpt_activation_bytes(&cfg, T, B, 1, false, NULL, (loom_recompute){0}, 1, 0), /* the slot's tokens, targets, predictions too */
                    (m.a->mem.numel + m.w.mem.numel) * sizeof(float) + 3 * (size_t)T * B * sizeof(int));
  const float loss = loom_gpt_forward(&m, &batch);
  ck_assert_msg(fabs(loss - log(cfg.vocab)) < 0.05, "initial loss %g vs ln V %g", (double)loss, log(cfg.vocab));
  loom_gpt_free(&m);
}
END_TEST

/* Repeated steps on one fixed batch drive the loss below 0.05. */
START_TEST(overfits_one_batch) {
  enum { T = 16, B = 4 };
  loom_gpt_config cfg = {.layers = 2, .hidden = 32, .heads = 4, .vocab = 64, .seq = T, .norm_eps = 1e-5f};
  as_family(&cfg, _i);
  cfg.ffn = _i == GPT2 ? 0 : 96;
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
  loom_gpt_config a = tiny(0.0f, GPT2), b = tiny(0.0f, GPT2);
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

/* The Llama family's tensors carry Hugging Face's names and full shapes:
 * separate q, k and v of kv_heads heads, gate and up, no biases, an LM head. */
START_TEST(llama_names_and_shapes) {
  loom_gpt_config c;
  loom_cli_preset("llama-tiny", &c);
  loom_gpt_params p;
  ck_assert_int_eq(loom_gpt_params_init_weights(&p, &c, 0, 1, NULL, &loom_host_memory), LOOM_OK);
  const struct {
    const char *name;
    int64_t rows, cols;
  } want[] = {{"model.embed_tokens.weight", 256, 64}, {"model.layers.1.input_layernorm.weight", 64, 1},
              {"model.layers.1.self_attn.q_proj.weight", 64, 64}, {"model.layers.1.self_attn.k_proj.weight", 32, 64},
              {"model.layers.1.self_attn.v_proj.weight", 32, 64}, {"model.layers.1.self_attn.o_proj.weight", 64, 64},
              {"model.layers.1.mlp.gate_proj.weight", 176, 64}, {"model.layers.1.mlp.up_proj.weight", 176, 64},
              {"model.layers.1.mlp.down_proj.weight", 64, 176}, {"model.norm.weight", 64, 1}, {"lm_head.weight", 256, 64}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    const int k = loom_gpt_params_find(&p, want[i].name);
    ck_assert_msg(k >= 0, "no %s", want[i].name);
    ck_assert_int_eq(p.meta[k].layout.rows, want[i].rows);
    ck_assert_int_eq(p.meta[k].layout.cols, want[i].cols);
  }
  /* 3 layers of 9 tensors, the embedding, the final norm and the head: nothing else (no biases, no positions). */
  ck_assert_int_eq(loom_gpt_block_tensors(&c, 0), 9);
  ck_assert_int_eq(p.params.count, 3 * 9 + 3);
  ck_assert_int_lt(loom_gpt_params_find(&p, "model.layers.0.self_attn.q_proj.bias"), 0);
  loom_gpt_params_free(&p);
}
END_TEST

/* A MoE model with dense layers among its MoE layers (the plan's rules
 * refuse it to a run so far; its tables and counts are ready): each layer's
 * tensors are its kind's, and every count by layer kind (parameters over
 * any stage, ZeRO's per-layer buckets, FLOPs) equals the table walked
 * tensor by tensor. */
START_TEST(dense_layers_among_moe_layers_count_by_kind) {
  loom_gpt_config c;
  ck_assert_int_eq(loom_cli_preset("moe-tiny", &c), 0);
  c.layers = 5;
  loom_gpt_config_finish(&c);
  const loom_gpt_config all_moe = c;
  char why[128];
  ck_assert_int_eq(loom_gpt_parse_moe_layer_freq(&c, "([0]*2+[1,0,1])", why, sizeof why), 0);
  ck_assert_int_eq(loom_gpt_moe_layers(&c, 0, 5), 2);
  ck_assert(loom_gpt_block_tensors(&c, 0) == 9 && loom_gpt_block_tensors(&c, 2) == loom_gpt_block_tensors(&all_moe, 0));
  for (int begin = 0; begin < 5; begin++)
    for (int end = begin; end <= 5; end++) {
      const loom_stage_range r = {begin, end, begin == 0, end == 5};
      const int count = loom_gpt_param_table(&c, &r, 0, 1, NULL, NULL);
      loom_tensor *specs = calloc((size_t)count + 1, sizeof *specs);
      loom_param_meta *meta = calloc((size_t)count + 1, sizeof *meta);
      loom_gpt_param_table(&c, &r, 0, 1, specs, meta);
      size_t numel = 0;
      for (int k = 0; k < count; k++) numel += loom_tensor_numel(&specs[k]);
      ck_assert_msg(loom_gpt_param_count(&c, &r, 1) == numel, "layers [%d, %d): %zu counted, %zu in the table", begin, end,
                    loom_gpt_param_count(&c, &r, 1), numel);
      int first[64];
      const int n = loom_gpt_zero_buckets(&c, &r, 2, first);
      for (int b = 0, l = begin; b < n; b++) /* a layer's bucket starts at its input norm */
        if (meta[first[b]].role == LOOM_ROLE_LN_1_W) ck_assert_str_eq(specs[first[b]].name, (snprintf(why, sizeof why,
                                                                        "model.layers.%d.input_layernorm.weight", l++), why));
      free(specs), free(meta);
    }
  /* FLOPs: the dense layers' MLPs at ffn, the MoE layers' at top-k experts plus the shared expert. */
  const loom_stage_range whole = loom_stage_whole(&c), layer0 = {0, 1, false, false}, layer2 = {2, 3, false, false};
  const double dense = loom_gpt_stage_train_flops(&c, &layer0, 64, 1.0, LOOM_FLOPS_MEGATRON);
  const double moe = loom_gpt_stage_train_flops(&c, &layer2, 64, 1.0, LOOM_FLOPS_MEGATRON);
  const double edges = loom_gpt_stage_train_flops(&c, &(loom_stage_range){0, 0, true, true}, 64, 1.0, LOOM_FLOPS_MEGATRON);
  ck_assert(dense != moe);
  ck_assert_double_eq_tol(loom_gpt_stage_train_flops(&c, &whole, 64, 1.0, LOOM_FLOPS_MEGATRON), edges + 3 * dense + 2 * moe,
                          1e-6 * (edges + 3 * dense + 2 * moe));
}
END_TEST

/* Model FLOPs per token: Megatron-LM's current formula (its
 * num_floating_point_operations: 12 L h^2 [(1 + G/H) + (f/h) x 3/2 for
 * SwiGLU] + 6 V h for the logits), with attention's scores and values
 * counted whole (12 L h T, SC21's convention, where Megatron's current
 * code halves them for causality). Written out here on its own. */
/* The MoE router, case by case: ties go to the lower expert; the weights
 * are the softmax of the chosen logits, or (pre-softmax) the chosen
 * probabilities, or the chosen sigmoids normalised, the expert bias moving
 * the choice but not the weights; the load, the aux loss as Megatron's
 * docstring writes it (E * sum f_i P_i) and the z-loss, worked out here. */
START_TEST(moe_router_routes_as_megatron) {
  const float logits[2][4] = {{1.0f, 3.0f, 3.0f, 0.0f}, {0.5f, -1.0f, 2.0f, 2.0f}};
  int experts[4];
  float weights[4];
  int64_t load[4], aux_load[4];
  double score_sum[4];
  loom_moe_routing r = {.experts = experts, .weights = weights, .load = load, .aux_load = aux_load, .score_sum = score_sum};
  loom_moe_router c = {.experts = 4, .topk = 2, .score = LOOM_MOE_SCORE_SOFTMAX, .aux_loss_coeff = 0.01f, .z_loss_coeff = 0.001f};
  loom_moe_route(&c, &logits[0][0], 2, &r);
  ck_assert(experts[0] == 1 && experts[1] == 2 && experts[2] == 2 && experts[3] == 3); /* equal scores: lower index first */
  ck_assert(fabsf(weights[0] - 0.5f) < 1e-7f && fabsf(weights[2] - 0.5f) < 1e-7f);
  ck_assert(load[0] == 0 && load[1] == 1 && load[2] == 2 && load[3] == 1);
  /* The aux loss: f_i = count_i / (T k), P_i = mean softmax; E * sum f_i P_i * coeff. The z-loss: coeff * mean lse^2. */
  double P[4] = {0}, z = 0.0;
  for (int n = 0; n < 2; n++) {
    double sum = 0.0;
    for (int e = 0; e < 4; e++) sum += exp(logits[n][e]);
    for (int e = 0; e < 4; e++) P[e] += exp(logits[n][e]) / sum / 2.0;
    z += log(sum) * log(sum) / 2.0;
  }
  double aux = 0.0;
  for (int e = 0; e < 4; e++) aux += (double)load[e] / (2.0 * 2.0) * P[e];
  ck_assert_double_eq_tol(r.aux_loss, 0.01 * 4.0 * aux, 1e-7 * r.aux_loss); /* coeff is a float */
  ck_assert_double_eq_tol(r.z_loss, 0.001 * z, 1e-7 * r.z_loss);
  c.topk = 1; /* one expert: the tie still goes low, its weight is 1 */
  loom_moe_route(&c, &logits[0][0], 1, &r);
  ck_assert(experts[0] == 1 && weights[0] == 1.0f);
  c.topk = 2, c.pre_softmax = true; /* the probabilities over all four, unnormalised */
  loom_moe_route(&c, &logits[1][0], 1, &r);
  const double sum = exp(0.5) + exp(-1.0) + 2.0 * exp(2.0);
  ck_assert(experts[0] == 2 && experts[1] == 3 && fabs(weights[0] - exp(2.0) / sum) < 1e-7);
  const float bias[4] = {0.0f, 0.9f, 0.0f, 0.0f}; /* sigmoid: the bias picks expert 1 over 0, not its weight */
  c = (loom_moe_router){.experts = 4, .topk = 2, .score = LOOM_MOE_SCORE_SIGMOID, .expert_bias = bias};
  loom_moe_route(&c, &logits[1][0], 1, &r);
  const double s1 = 1.0 / (1.0 + exp(1.0)), s2 = 1.0 / (1.0 + exp(-2.0));
  ck_assert(experts[0] == 1 && experts[1] == 2); /* 0.27 + 0.9 first, then the tie at 0.88 goes to 2 */
  ck_assert(fabs(weights[0] - s1 / (s1 + s2)) < 1e-6 && fabs(weights[1] - s2 / (s1 + s2)) < 1e-6);
}
END_TEST

/* Group-limited routing (DeepSeek-V3's, Megatron-Core's
 * group_limited_topk) worked by hand: 8 experts in 4 groups, top 4 from
 * the best 2 groups, each group scored by the sum of its best 4 / 2 = 2
 * logits: {3, -2} 1.0, {1.5, 1.4} 2.9, {1, 0.9} 1.9, {2.5, -3} -0.5. The
 * groups 1 and 2 win, so experts 2, 3, 4, 5, where the plain top 4 is 0,
 * 6, 2, 3; their weights (a softmax over the chosen) times 2.5. */
START_TEST(moe_router_limits_the_groups) {
  enum { E = 8, K = 4 };
  const float logits[E] = {3.0f, -2.0f, 1.5f, 1.4f, 1.0f, 0.9f, 2.5f, -3.0f};
  int experts[K];
  float weights[K];
  int64_t load[E], aux_load[E];
  double score_sum[E];
  loom_moe_routing r = {.experts = experts, .weights = weights, .load = load, .aux_load = aux_load, .score_sum = score_sum};
  loom_moe_router c = {.experts = E, .topk = K, .score = LOOM_MOE_SCORE_SOFTMAX};
  loom_moe_route(&c, logits, 1, &r);
  ck_assert(experts[0] == 0 && experts[1] == 6 && experts[2] == 2 && experts[3] == 3);
  c.groups = 4, c.group_topk = 2, c.topk_scaling = 2.5f;
  loom_moe_route(&c, logits, 1, &r);
  ck_assert(experts[0] == 2 && experts[1] == 3 && experts[2] == 4 && experts[3] == 5);
  const double sum = exp(1.5) + exp(1.4) + exp(1.0) + exp(0.9);
  for (int j = 0; j < K; j++) ck_assert_double_eq_tol(weights[j], 2.5 * exp(logits[experts[j]]) / sum, 1e-6);
  /* sigmoid scores plus the expert bias choose the groups too: +2 on expert 7 makes group 3 the best (0.92 + 2.05),
   * group 1 next (0.82 + 0.80, over group 0's 0.95 + 0.12); the top 4 of experts 2, 3, 6, 7 by score plus bias */
  const float bias[E] = {0, 0, 0, 0, 0, 0, 0, 2.0f};
  c = (loom_moe_router){.experts = E, .topk = K, .score = LOOM_MOE_SCORE_SIGMOID, .expert_bias = bias, .groups = 4,
                        .group_topk = 2};
  loom_moe_route(&c, logits, 1, &r);
  ck_assert(experts[0] == 7 && experts[1] == 6 && experts[2] == 2 && experts[3] == 3);
}
END_TEST

/* The router's backward against central differences of
 * sum(dw . weights) + daux * aux + dz * z over random logits (apart enough
 * that a step of h moves no choice), in every score mode. */
START_TEST(moe_router_gradients_match_finite_differences) {
  enum { N = 6, E = 8, K = 3 };
  float logits[N * E], dw[N * K], dlogits[N * E];
  for (int i = 0; i < N * E; i++) logits[i] = (float)(i % E) * 0.37f + (float)((i * 7919) % 13) * 0.11f - 1.5f;
  for (int i = 0; i < N * K; i++) dw[i] = 0.1f * (float)((i * 31) % 7) - 0.3f;
  const float bias[E] = {0.05f, -0.02f, 0.0f, 0.03f, 0.0f, -0.04f, 0.01f, 0.0f};
  enum { MODES = 6 };
  const loom_moe_router modes[MODES] = {
      {.experts = E, .topk = K, .score = LOOM_MOE_SCORE_SOFTMAX, .aux_loss_coeff = 0.5f, .z_loss_coeff = 0.2f},
      {.experts = E, .topk = K, .score = LOOM_MOE_SCORE_SOFTMAX, .pre_softmax = true, .aux_loss_coeff = 0.5f, .z_loss_coeff = 0.2f},
      {.experts = E, .topk = K, .score = LOOM_MOE_SCORE_SIGMOID, .expert_bias = bias, .aux_loss_coeff = 0.5f, .z_loss_coeff = 0.2f},
      /* group-limited, the weights scaled (DeepSeek-V3's routing) */
      {.experts = E, .topk = K, .score = LOOM_MOE_SCORE_SIGMOID, .expert_bias = bias, .aux_loss_coeff = 0.5f,
       .z_loss_coeff = 0.2f, .groups = 4, .group_topk = 2, .topk_scaling = 2.5f},
      {.experts = E, .topk = K, .score = LOOM_MOE_SCORE_SOFTMAX, .aux_loss_coeff = 0.5f, .z_loss_coeff = 0.2f, .groups = 4,
       .group_topk = 2, .topk_scaling = 0.7f},
      {.experts = E, .topk = K, .score = LOOM_MOE_SCORE_SOFTMAX, .pre_softmax = true, .aux_loss_coeff = 0.5f,
       .z_loss_coeff = 0.2f, .groups = 2, .group_topk = 1, .topk_scaling = 1.5f}};
  int experts[N * K];
  float weights[N * K];
  int64_t load[E], aux_load[E];
  double score_sum[E];
  loom_moe_routing r = {.experts = experts, .weights = weights, .load = load, .aux_load = aux_load, .score_sum = score_sum};
  for (int m = 0; m < MODES; m++) {
    const loom_moe_router *c = &modes[m];
    loom_moe_route(c, logits, N, &r);
    loom_moe_route_backward(c, logits, N, N, &r, dw, 1.5f, 2.0f, dlogits);
    double worst = 0.0, biggest = 0.0;
    for (int i = 0; i < N * E; i++) {
      double f[2];
      for (int side = 0; side < 2; side++) {
        float x[N * E];
        memcpy(x, logits, sizeof x);
        x[i] += side ? -1e-3f : 1e-3f;
        loom_moe_route(c, x, N, &r);
        f[side] = 1.5 * r.aux_loss + 2.0 * r.z_loss;
        for (int j = 0; j < N * K; j++) f[side] += (double)dw[j] * weights[j];
      }
      const double fd = (f[0] - f[1]) / 2e-3;
      worst = fmax(worst, fabs(fd - dlogits[i]));
      biggest = fmax(biggest, fabs(fd));
    }
    ck_assert_msg(biggest > 1e-3 && worst <= 2e-3 * biggest, "mode %d: worst %g of the largest grad %g", m, worst, biggest);
  }
}
END_TEST

/* DeepSeek-V3's expert bias (Megatron-Core's get_updated_expert_bias):
 * each expert's bias moves by the rate toward the mean load, and not at
 * all at it; then a bias that has grown on an idle expert turns a choice
 * toward it (ties still to the lower index). */
START_TEST(moe_expert_bias_steps_toward_the_mean_load) {
  enum { E = 4 };
  float bias[E] = {0.5f, 0.0f, -0.25f, 0.0f};
  const int64_t load[E] = {9, 1, 3, 3}; /* mean 4 */
  loom_moe_expert_bias_update(bias, load, E, 0.125f);
  const float want[E] = {0.375f, 0.125f, -0.125f, 0.125f};
  for (int e = 0; e < E; e++) ck_assert_msg(bias[e] == want[e], "expert %d: bias %g, want %g", e, (double)bias[e], (double)want[e]);
  const int64_t even[E] = {2, 2, 2, 2};
  loom_moe_expert_bias_update(bias, even, E, 0.125f);
  for (int e = 0; e < E; e++) ck_assert_msg(bias[e] == want[e], "expert %d moved at the mean load", e);
  /* Sigmoid scores 0.6, 0.5, 0.5, 0.4: top 1 is expert 0 unbiased, expert 3 once its bias passes 0.2. */
  const float logits[E] = {0.405465f, 0.0f, 0.0f, -0.405465f};
  const float lift[E] = {0.0f, 0.0f, 0.0f, 0.25f}, tie[E] = {0.0f, 0.25f, 0.25f, 0.0f}, even_logits[E] = {0};
  int chosen[1];
  float weight[1];
  int64_t l[E], aux[E];
  double ss[E];
  loom_moe_routing r = {.experts = chosen, .weights = weight, .load = l, .aux_load = aux, .score_sum = ss};
  loom_moe_router c = {.experts = E, .topk = 1, .score = LOOM_MOE_SCORE_SIGMOID};
  loom_moe_route(&c, logits, 1, &r);
  ck_assert_int_eq(chosen[0], 0);
  c.expert_bias = lift;
  loom_moe_route(&c, logits, 1, &r);
  ck_assert_int_eq(chosen[0], 3);
  ck_assert_float_eq_tol(weight[0], 0.4f, 1e-5f); /* the weight is the unbiased score */
  c.expert_bias = tie;
  loom_moe_route(&c, even_logits, 1, &r);
  ck_assert_int_eq(chosen[0], 1); /* 0.75 against 0.75: the lower index */
}
END_TEST

/* Dispatch: 5 tokens' top-2 choices over 4 experts. Dropless, every
 * choice has a row, expert by expert in token order, and each row is its
 * token's; with capacity 2 (factor 0.8: ceil(5 * 2 / 4 * 0.8)) expert 1's
 * four choices keep their two highest weights (an equal weight: the
 * earlier token), or under the position policy its two earliest tokens; the
 * rows of two expert-parallel ranks are their experts'. */
START_TEST(moe_dispatch_places_every_choice) {
  enum { N = 5, K = 2, E = 4 };
  const int experts[N * K] = {1, 0, 1, 3, 2, 1, 1, 0, 3, 2};
  const float weights[N * K] = {0.6f, 0.4f, 0.7f, 0.3f, 0.55f, 0.45f, 0.7f, 0.3f, 0.5f, 0.5f};
  int64_t counts[E], rows_to[2];
  int rows[N * K], slots[N * K];
  loom_moe_dispatch d = {.counts = counts, .rows = rows, .slots = slots};
  loom_moe_dispatch_config c = {.experts = E, .topk = K};
  loom_moe_dispatch_plan(&c, experts, weights, N, &d);
  ck_assert(d.rows_total == N * K && d.dropped == 0);
  ck_assert(counts[0] == 2 && counts[1] == 4 && counts[2] == 2 && counts[3] == 2);
  const int want_rows[N * K] = {0, 3, 0, 1, 2, 3, 2, 4, 1, 4}; /* expert 0: tokens 0, 3; 1: 0, 1, 2, 3; 2: 2, 4; 3: 1, 4 */
  for (int i = 0; i < N * K; i++) {
    ck_assert_int_eq(rows[i], want_rows[i]);
    ck_assert_int_eq(rows[slots[i]], i / K); /* each choice's row holds its token */
  }
  loom_moe_rank_rows(&d, E, 2, rows_to);
  ck_assert(rows_to[0] == 6 && rows_to[1] == 4);
  c.capacity_factor = 0.8;
  ck_assert_int_eq(loom_moe_capacity(&c, N), 2);
  loom_moe_dispatch_plan(&c, experts, weights, N, &d);
  /* Expert 1's choices: token 0 (0.6), 1 (0.7), 2 (0.45), 3 (0.7): 0.7 twice, tokens 1 and 3 kept. */
  ck_assert(d.dropped == 2 && counts[1] == 2 && slots[0] == -1 && slots[5] == -1 && slots[2] >= 0 && slots[6] >= 0);
  ck_assert(rows[slots[2]] == 1 && rows[slots[6]] == 3 && slots[2] < slots[6]); /* kept in token order */
  c.drop_by_position = true;
  loom_moe_dispatch_plan(&c, experts, weights, N, &d);
  ck_assert(d.dropped == 2 && slots[0] >= 0 && slots[2] >= 0 && slots[5] == -1 && slots[6] == -1);
  ck_assert_int_eq(d.rows_total, 8);
}
END_TEST

START_TEST(flops_follow_megatron) {
  const char *const names[] = {"gpt2-small", "llama3-8b", "llama3-70b", "llama-tiny"};
  for (int i = 0; i < 4; i++) {
    loom_gpt_config c;
    ck_assert_int_eq(loom_cli_preset(names[i], &c), 0);
    const double L = c.layers, h = c.hidden, f = c.ffn, V = c.vocab, T = c.seq, G = loom_gpt_kv_heads(&c), H = c.heads;
    const double gated = c.mlp == LOOM_MLP_SWIGLU ? 1.5 : 1.0;
    /* Megatron's current code: causal attention halved (s / 2h). */
    const double want = 12.0 * L * h * h * ((1.0 + G / H + T / h / 2.0) + f / h * gated) + 6.0 * V * h;
    const double got = loom_gpt_train_flops(&c, c.seq, 1.0, LOOM_FLOPS_MEGATRON);
    ck_assert_msg(fabs(got - want) <= 1e-12 * want, "%s: %g FLOPs per token, want %g", names[i], got, want);
  }
  /* Llama 3 8B at 8192 tokens: 6 x 7.5B matmul parameters (of 8.0B) plus causal attention. */
  loom_gpt_config c;
  loom_cli_preset("llama3-8b", &c);
  ck_assert_double_eq_tol(loom_gpt_train_flops(&c, 8192, 1.0, LOOM_FLOPS_MEGATRON) / 1e9,
                          6.0 * 7.50 + 6.0 * 32 * 4096 * 8192 / 1e9, 0.2);
  /* SC21's formula for Table 1's 145.6B row: 96 B s l h^2 (1 + s/6h + V/16lh) per step. */
  loom_gpt_config g = {.layers = 80, .hidden = 12288, .heads = 96, .ffn = 4 * 12288, .vocab = 51200, .seq = 2048};
  loom_gpt_config_finish(&g);
  const double B = 2304, s = 2048, l = 80, hh = 12288, VV = 51200;
  const double sc21 = 96.0 * B * s * l * hh * hh * (1.0 + s / (6.0 * hh) + VV / (16.0 * l * hh));
  const double got = loom_gpt_train_flops(&g, 2048, B * s, LOOM_FLOPS_SC21);
  ck_assert_msg(fabs(got - sc21) <= 1e-9 * sc21, "SC21: %g FLOPs per step, want %g", got, sc21);
}
END_TEST

/* Mixtral 8x7B's counts as Mistral AI publishes them (46.7B parameters,
 * 12.9B active per token; to the parameter, from its safetensors index:
 * 46,702,792,704 and, less six of eight experts in each of 32 layers,
 * 12,879,925,248), and its FLOPs as Megatron-LM's formula counts a MoE
 * layer's MLP: its top-k experts', 3 x 2 x h x (k x fe) x 3/2 under SwiGLU. */
START_TEST(mixtral_counts_as_published) {
  loom_gpt_config c;
  ck_assert_int_eq(loom_cli_preset("mixtral-8x7b", &c), 0);
  ck_assert_uint_eq(loom_gpt_param_count(&c, NULL, 1), 46702792704u);
  ck_assert_uint_eq(loom_gpt_active_param_count(&c), 12879925248u);
  const double L = c.layers, h = c.hidden, V = c.vocab, T = 4096, G = loom_gpt_kv_heads(&c), H = c.heads;
  const double mlp = 2.0 * 14336 * 1.5; /* top 2 experts of 14336, gated */
  const double want = 12.0 * L * h * h * ((1.0 + G / H + T / h / 2.0) + mlp / h) + 6.0 * V * h;
  const double got = loom_gpt_train_flops(&c, (int)T, 1.0, LOOM_FLOPS_MEGATRON);
  ck_assert_msg(fabs(got - want) <= 1e-12 * want, "%g FLOPs per token, want %g", got, want);
  /* Qwen1.5-MoE-A2.7B, counted by hand from its config.json: per layer q, k, v (with biases) and o, 16,783,360; two
   * norms, 4,096; the router, 122,880; 60 experts of 3 x 2048 x 1408, 519,045,120; the shared expert, 34,603,008, and
   * its gate, 2,048; 24 layers, an untied head and embedding of 151,936 x 2048 each and the final norm: 14,315,784,192
   * (Qwen's "14.3B"), of which 4 of the 60 experts active: 2,689,173,504 (Qwen's "2.7B activated"). */
  loom_gpt_config qwen;
  ck_assert_int_eq(loom_cli_preset("qwen1.5-moe-a2.7b", &qwen), 0);
  ck_assert_uint_eq(loom_gpt_param_count(&qwen, NULL, 1), 14315784192u);
  ck_assert_uint_eq(loom_gpt_active_param_count(&qwen), 2689173504u);
  loom_gpt_config dense;
  ck_assert_int_eq(loom_cli_preset("llama-tiny", &dense), 0);
  ck_assert_uint_eq(loom_gpt_active_param_count(&dense), loom_gpt_param_count(&dense, NULL, 1));
}
END_TEST

/* Qwen3's counts by hand from the Qwen team's config.json files (heads 128
 * wide, QK-norm's two [128] weights per layer, untied, vocab 151936):
 * - Qwen3-8B: per layer q and o 2 x 4096 x 4096, k and v 2 x 4096 x 1024,
 *   QK-norm 256, two norms 8,192, the MLP 3 x 4096 x 12288: 192,946,432;
 *   36 layers, the embedding and head 2 x 151936 x 4096 and the final norm:
 *   8,190,735,360 (Qwen's "8.2B");
 * - Qwen3-32B: q and o 2 x 5120 x 8192 (64 heads of 128 over hidden
 *   5120), k and v 2 x 5120 x 1024, QK-norm 256, norms 10,240, the MLP
 *   3 x 5120 x 25600: 487,598,336 per layer, 64 layers: 32,762,123,264
 *   ("32.8B");
 * - Qwen3-30B-A3B: attention 18,874,368 per layer, QK-norm and norms 4,352,
 *   the router 128 x 2048 and 128 experts of 3 x 2048 x 768: 623,120,640;
 *   48 layers: 30,532,122,624 ("30.5B"), of which 8 experts a token:
 *   3,353,032,704 active ("3.3B");
 * - Qwen3-235B-A22B: 2,487,755,008 per layer (64 heads of 128 over hidden
 *   4096, 4 kv heads, 128 experts of 1536), 94 layers: 235,093,634,560
 *   ("235B"), 22,190,763,520 active ("22B").
 * Megatron's FLOPs scale the attention's terms by heads x kv_channels / hidden. */
START_TEST(qwen3_counts_as_published) {
  static const struct {
    const char *name;
    uint64_t total, active;
  } published[] = {{"qwen3-8b", 8190735360u, 8190735360u},
                   {"qwen3-32b", 32762123264u, 32762123264u},
                   {"qwen3-30b-a3b", 30532122624u, 3353032704u},
                   {"qwen3-235b-a22b", 235093634560u, 22190763520u}};
  for (size_t i = 0; i < sizeof published / sizeof published[0]; i++) {
    loom_gpt_config c;
    ck_assert_int_eq(loom_cli_preset(published[i].name, &c), 0);
    ck_assert_int_eq(loom_gpt_head_dim(&c), 128);
    ck_assert_uint_eq(loom_gpt_param_count(&c, NULL, 1), published[i].total);
    ck_assert_uint_eq(loom_gpt_active_param_count(&c), published[i].active);
  }
  /* A sliding window of W keys back counts T W - W^2 / 2 of causal attention's pairs, T^2 / 2 at W = T. */
  ck_assert_double_eq(loom_attention_keys(4096, 0), 4096.0);
  ck_assert_double_eq(loom_attention_keys(4096, 4096), 4096.0);
  ck_assert_double_eq(loom_attention_keys(4096, 128), 2.0 * 128 - 128.0 * 128 / 4096);
  loom_gpt_config c;
  ck_assert_int_eq(loom_cli_preset("qwen3-32b", &c), 0);
  const double L = c.layers, h = c.hidden, f = c.ffn, V = c.vocab, T = 4096, G = loom_gpt_kv_heads(&c), H = c.heads;
  const double ratio = H * 128.0 / h; /* Megatron's query_projection_to_hidden_size_ratio: 1.6 */
  const double want = 12.0 * L * h * h * ((1.0 + G / H + T / h / 2.0) * ratio + f / h * 1.5) + 6.0 * V * h;
  const double got = loom_gpt_train_flops(&c, (int)T, 1.0, LOOM_FLOPS_MEGATRON);
  ck_assert_msg(fabs(got - want) <= 1e-12 * want, "%g FLOPs per token, want %g", got, want);
}
END_TEST

/* GPT-OSS's presets against OpenAI's model card (116.83B and 20.91B total;
 * 5.13B and 3.61B active, which leave out the embedding table), by hand:
 * - attention: q and o 2 x 2880 x 4096 (64 heads of 64), k and v
 *   2 x 2880 x 512, their biases 4096 + 2 x 512 + 2880, sinks 64:
 *   26,550,144 per layer; norms 2 x 2880;
 * - an expert: gate and up 2 x 2880 x 2880 and down 2880 x 2880, biases
 *   5760 + 2880: 24,891,840; the router E x 2880 + E;
 * - gpt-oss-20b: 24 layers of 32 experts (823,186,976 each), the embedding
 *   and head 2 x 201088 x 2880 and the final norm: 20,914,757,184, of
 *   which 4 experts a token: 4,187,440,704 active (3,608,307,264 without
 *   the embedding table: the card's 3.61B);
 * - gpt-oss-120b: 36 layers of 128 experts (3,213,080,192 each):
 *   116,829,156,672, 5,711,982,912 active (5,132,849,472 without the
 *   embedding table: the card's 5.13B). */
START_TEST(gpt_oss_counts_as_published) {
  static const struct {
    const char *name;
    uint64_t total, active;
    int layers;
  } published[] = {{"gpt-oss-20b", 20914757184u, 4187440704u, 24}, {"gpt-oss-120b", 116829156672u, 5711982912u, 36}};
  for (size_t i = 0; i < sizeof published / sizeof published[0]; i++) {
    loom_gpt_config c;
    ck_assert_int_eq(loom_cli_preset(published[i].name, &c), 0);
    ck_assert_int_eq(c.layers, published[i].layers);
    ck_assert_uint_eq(loom_gpt_param_count(&c, NULL, 1), published[i].total);
    ck_assert_uint_eq(loom_gpt_active_param_count(&c), published[i].active);
    /* windowed from the first layer, alternating: Hugging Face's layer_types */
    for (int l = 0; l < c.layers; l++) ck_assert_int_eq(loom_gpt_layer_window(&c, l), l % 2 ? 0 : 127);
  }
}
END_TEST

/* DeepSeek-V3 counted by hand from its config.json: the embedding and the
 * untied head, 129280 x 7168 each (926,679,040); a layer's attention
 * q_a_proj 1536 x 7168 (11,010,048), q_a_layernorm 1536, q_b_proj
 * 128 x 192 x 1536 (37,748,736), kv_a_proj_with_mqa 576 x 7168 (4,128,768),
 * kv_a_layernorm 512, kv_b_proj 128 x 256 x 512 (16,777,216), o_proj
 * 7168 x 16384 (117,440,512): 187,107,328, and its two norms 14,336; the
 * first 3 layers' dense MLP 3 x 7168 x 18432 (396,361,728); the other 58
 * layers' router 256 x 7168 (1,835,008), 256 experts of 3 x 7168 x 2048
 * (11,274,289,152) and the shared one (44,040,192); the final norm 7168.
 * 2 x 926,679,040 + 7168 + 3 x 583,483,392 + 58 x 11,507,286,016 =
 * 671,026,404,352: the published 671,026,419,200 less the routers'
 * e_score_correction_bias (58 x 256), which loom keeps as routing state
 * (model.moe.expert_bias), not a parameter. Active, 8 experts of the 256:
 * 58 x 585,318,400 in place of the MoE layers', 37,552,282,624 (the
 * published 37B). Its MTP module (num_nextn_predict_layers 1): a MoE
 * layer's 11,507,286,016, enorm, hnorm and shared_head.norm 3 x 7168 and
 * eh_proj 7168 x 14336 (102,760,448): 11,610,067,968, 682,636,472,320 in
 * all (the published 685B also counts the module's copies of the
 * embedding and the head, 1,853,358,080); active 585,318,400 +
 * 102,781,952, 38,240,382,976. */
START_TEST(deepseek_v3_counts_as_published) {
  loom_gpt_config c;
  ck_assert_int_eq(loom_cli_preset("deepseek-v3", &c), 0);
  ck_assert_int_eq(c.mtp_layers, 1);
  ck_assert_uint_eq(loom_gpt_param_count(&c, NULL, 1), 682636472320u);
  ck_assert_uint_eq(loom_gpt_active_param_count(&c), 38240382976u);
  c.mtp_layers = 0;
  ck_assert_uint_eq(loom_gpt_param_count(&c, NULL, 1), 671026404352u);
  ck_assert_uint_eq(loom_gpt_active_param_count(&c), 37552282624u);
  ck_assert_int_eq(loom_gpt_moe_layers(&c, 0, c.layers), 58);
  ck_assert(!loom_gpt_layer_is_moe(&c, 2) && loom_gpt_layer_is_moe(&c, 3));
  /* FLOPs per token as Megatron-LM's formula counts MLA (its q term with the q latent's norm, the kv latent's, the RoPE
   * key's and o's, and the core attention's q and v halves per key) and the MLPs (3 matrices each, top 8 and shared) */
  const double L = 61, h = 7168, H = 128, T = 4096, V = 129280;
  const double attention = 1536 * (h + H * 192 + 1) + 512 * (h + H * 256 + 1) + h * 64 + H * 128 * h;
  const double core = T * H * 192 / 2 + T * H * 128 / 2, mlp = 3 * h * (3 * 18432 + 58 * (8 * 2048 + 2048));
  const double want = 6 * L * (attention + core) + 6 * mlp + 6 * V * h;
  const double got = loom_gpt_train_flops(&c, (int)T, 1.0, LOOM_FLOPS_MEGATRON);
  ck_assert_msg(fabs(got - want) <= 1e-12 * want, "%g FLOPs per token, want %g", got, want);
  /* with its MTP module: a MoE layer more, Megatron's 3h + 2h^2 for the module's norms and eh_proj, the head again */
  c.mtp_layers = 1;
  const double mtp = 6 * (attention + core) + 6 * 3 * h * (8 * 2048 + 2048) + 6 * (3 * h + 2 * h * h) + 6 * V * h;
  const double got_mtp = loom_gpt_train_flops(&c, (int)T, 1.0, LOOM_FLOPS_MEGATRON);
  ck_assert_msg(fabs(got_mtp - (want + mtp)) <= 1e-12 * want, "%g FLOPs per token with MTP, want %g", got_mtp, want + mtp);
}
END_TEST

int main(void) {
  Suite *s = suite_create("model");
  TCase *tc = tcase_create("model");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, gradients_match_finite_differences, 0, FAMILIES);
  tcase_add_loop_test(tc, gradients_match_finite_differences_with_dropout, 0, FAMILIES);
  tcase_add_loop_test(tc, cpu_backend_matches_reference, 0, FAMILIES);
  tcase_add_loop_test(tc, initial_loss_is_log_vocab, 0, FAMILIES);
  tcase_add_test(tc, bf16_activations_are_smaller);
  tcase_add_loop_test(tc, overfits_one_batch, 0, FAMILIES);
  tcase_add_test(tc, init_is_keyed_by_name_and_index);
  tcase_add_test(tc, llama_names_and_shapes);
  tcase_add_test(tc, flops_follow_megatron);
  tcase_add_test(tc, mixtral_counts_as_published);
  tcase_add_test(tc, qwen3_counts_as_published);
  tcase_add_test(tc, gpt_oss_counts_as_published);
  tcase_add_test(tc, deepseek_v3_counts_as_published);
  tcase_add_loop_test(tc, mtp_gradients_match_finite_differences, 0, 3);
  tcase_add_test(tc, moe_router_routes_as_megatron);
  tcase_add_test(tc, moe_router_limits_the_groups);
  tcase_add_test(tc, moe_router_gradients_match_finite_differences);
  tcase_add_test(tc, router_bias_gradients_match_finite_differences);
  tcase_add_test(tc, moe_expert_bias_steps_toward_the_mean_load);
  tcase_add_test(tc, dense_layers_among_moe_layers_count_by_kind);
  tcase_add_test(tc, moe_dispatch_places_every_choice);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
