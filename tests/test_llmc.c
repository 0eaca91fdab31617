/* llm.c's GPT-2 model format: the layout, a byte-identical export/import
 * round trip, and each malformed file's error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/llmc_model.h"
#include "test_util.h"

static loom_gpt_config cfg3(void) {
  loom_gpt_config c = {.layers = 3, .hidden = 16, .heads = 4, .vocab = 300, .seq = 8, .norm_eps = 1e-5f};
  loom_gpt_config_finish(&c);
  return c;
}

static const char *export_random(const char *name, uint64_t seed) {
  const loom_gpt_config c = cfg3();
  loom_gpt_params p;
  ck_assert_int_eq(loom_gpt_params_init(&p, &c, 0, 1, NULL, &loom_host_memory), LOOM_OK);
  loom_gpt_params_randomize(&p, seed);
  const char *path = tu_tmp_path(name);
  loom_error err = {0};
  ck_assert_int_eq(loom_llmc_save(path, &p, &err), LOOM_OK);
  loom_gpt_params_free(&p);
  return path;
}

START_TEST(layout_matches_llmc) {
  const loom_gpt_config c = cfg3();
  const char *path = export_random("layout.bin", 4);
  size_t n;
  char *raw = tu_read_bytes(path, &n);
  const int32_t *h = (const int32_t *)raw;
  ck_assert_int_eq(h[0], 20240326);
  ck_assert_int_eq(h[1], 3);
  ck_assert_int_eq(h[2], 8);   /* max seq */
  ck_assert_int_eq(h[3], 300); /* vocab */
  ck_assert_int_eq(h[4], 3);   /* layers */
  ck_assert_int_eq(h[5], 4);   /* heads */
  ck_assert_int_eq(h[6], 16);  /* hidden */
  ck_assert_int_eq(h[7], 384); /* padded vocab */
  loom_gpt_params p;
  loom_gpt_params_init(&p, &c, 0, 1, NULL, &loom_host_memory);
  loom_gpt_params_randomize(&p, 4);
  ck_assert_uint_eq(n, 1024 + p.params.numel * 4);
  /* After wte [Vp,C] and wpe [S,C] come ln_1.weight of all layers, then ln_1.bias, then c_attn.weight... */
  const float *body = (const float *)(raw + 1024);
  const size_t C = 16, after_embed = 384 * C + 8 * C;
  const float *qkv_l1 = body + after_embed + 2 * 3 * C + 1 * 3 * C * C; /* layer 1's c_attn.weight */
  const int k = loom_gpt_params_find(&p, "h.1.attn.c_attn.weight");
  ck_assert_mem_eq(qkv_l1, p.params.views[k].data, 3 * C * C * sizeof(float));
  loom_gpt_params_free(&p);
  free(raw);
}
END_TEST

START_TEST(export_import_is_byte_identical) {
  const char *a = export_random("a.bin", 9), *b = tu_tmp_path("b.bin");
  loom_gpt_config c;
  loom_error err = {0};
  ck_assert_int_eq(loom_llmc_read_config(a, &c, &err), LOOM_OK);
  loom_gpt_params p;
  loom_gpt_params_init(&p, &c, 0, 1, NULL, &loom_host_memory);
  ck_assert_int_eq(loom_llmc_load(a, &p, &err), LOOM_OK);
  ck_assert_int_eq(loom_llmc_save(b, &p, &err), LOOM_OK);
  size_t na, nb;
  void *ra = tu_read_bytes(a, &na), *rb = tu_read_bytes(b, &nb);
  ck_assert_uint_eq(na, nb);
  ck_assert_mem_eq(ra, rb, na);
  free(ra);
  free(rb);
  loom_gpt_params_free(&p);
}
END_TEST

/* Copies `src` with a modification and expects load to fail with `suffix`. */
static void expect_load_error(const char *name, const void *bytes, size_t n, const char *suffix) {
  const char *path = tu_tmp_path(name);
  tu_write_bytes(path, bytes, n);
  const loom_gpt_config c = cfg3();
  loom_gpt_params p;
  loom_gpt_params_init(&p, &c, 0, 1, NULL, &loom_host_memory);
  loom_error err = {0};
  ck_assert_int_eq(loom_llmc_load(path, &p, &err), LOOM_ERR_FORMAT);
  char expected[600];
  snprintf(expected, sizeof expected, "%s: %s", path, suffix);
  ck_assert_str_eq(err.msg, expected);
  loom_gpt_params_free(&p);
}

START_TEST(malformed_files_are_refused) {
  size_t n;
  char *good = tu_read_bytes(export_random("good.bin", 1), &n);
  char *bad = malloc(n + 8);
  int32_t *h = (int32_t *)bad;
  memcpy(bad, good, n);
  h[0] = 20240520;
  expect_load_error("magic.bin", bad, n, "bad magic 20240520 in model header (expected 20240326, llm.c's GPT-2 format)");
  memcpy(bad, good, n);
  h[1] = 5;
  expect_load_error("version.bin", bad, n, "unsupported model version 5 (expected 3: fp32 with padded vocab)");
  memcpy(bad, good, n);
  h[5] = 5; /* 16 hidden is not divisible by 5 heads */
  expect_load_error("heads.bin", bad, n, "bad model header: model.hidden = 16: must be divisible by model.heads (5); pick heads that divide hidden, or set model.kv_channels (each head's width)");
  memcpy(bad, good, n);
  h[3] = 2147483647; /* rounding it up to the padded vocab would overflow */
  expect_load_error("vocab.bin", bad, n, "bad model header: model.vocab = 2147483647: must be 2 to 16777216");
  memcpy(bad, good, n);
  h[6] = 1 << 30; /* 4 x hidden would overflow */
  expect_load_error("hidden.bin", bad, n, "bad model header: model.hidden = 1073741824: must be 1 to 1048576");
  memcpy(bad, good, n);
  h[7] = 200;
  expect_load_error("padded.bin", bad, n, "bad model header: padded vocab 200 must be a multiple of 128 and at least vocab 300");
  memcpy(bad, good, n);
  h[4] = 2;
  expect_load_error("shape.bin", bad, n,
                    "model (layers 2, hidden 16, heads 4, kv heads 4, ffn 64, vocab 300, seq 8, layernorm, gelu, learned "
                    "positions, biases, tied) does not match the run's (layers 3, hidden 16, heads 4, kv heads 4, ffn 64, "
                    "vocab 300, seq 8, layernorm, gelu, learned positions, biases, tied)");
  expect_load_error("trunc.bin", good, n - 4, "truncated model file: ends inside ln_f.bias");
  expect_load_error("trunc2.bin", good, 1024 + 100, "truncated model file: ends inside wte.weight");
  expect_load_error("header.bin", good, 100, "truncated model file: shorter than its 1024-byte header");
  memcpy(bad, good, n);
  memset(bad + n, 0, 8);
  expect_load_error("trailing.bin", bad, n + 8, "model file has trailing bytes after ln_f.bias");
  free(bad);
  free(good);
}
END_TEST

START_TEST(non_gpt2_ffn_cannot_be_exported) {
  loom_gpt_config c = cfg3();
  c.ffn = 24;
  loom_gpt_params p;
  loom_gpt_params_init(&p, &c, 0, 1, NULL, &loom_host_memory);
  loom_error err = {0};
  ck_assert_int_eq(loom_llmc_save("/tmp/never-written.bin", &p, &err), LOOM_ERR_USAGE);
  ck_assert_str_eq(err.msg, "/tmp/never-written.bin: llm.c's format needs ffn = 4 * hidden (got ffn 24, hidden 16)");
  loom_gpt_params_free(&p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("llmc");
  TCase *tc = tcase_create("llmc");
  tcase_add_test(tc, layout_matches_llmc);
  tcase_add_test(tc, export_import_is_byte_identical);
  tcase_add_test(tc, malformed_files_are_refused);
  tcase_add_test(tc, non_gpt2_ffn_cannot_be_exported);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
