/* Data: llm.c token files (reading, writing and every malformed case),
 * window order, the byte tokenizer, and the addition task's split and scoring. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include "data/addition.h"
#include "data/byte_tokenizer.h"
#include "data/dataset.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "test_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

/* Writes a token file with a chosen header and payload. */
static const char *write_tokens(const char *name, int32_t magic, int32_t version, int32_t count,
                                const uint16_t *tokens, size_t stored) {
  const char *path = tu_tmp_path(name);
  const size_t bytes = 1024 + stored * 2;
  char *buf = calloc(1, bytes);
  int32_t *h = (int32_t *)buf;
  h[0] = magic;
  h[1] = version;
  h[2] = count;
  memcpy(buf + 1024, tokens, stored * 2);
  tu_write_bytes(path, buf, bytes);
  free(buf);
  return path;
}

static void expect_error(const char *path, int vocab, loom_status want, const char *suffix) {
  loom_token_file f;
  loom_error err = {0};
  ck_assert_int_eq(loom_token_file_load(&f, path, vocab, &err), want);
  char expected[600];
  snprintf(expected, sizeof expected, "%s: %s", path, suffix);
  ck_assert_str_eq(err.msg, expected);
}

START_TEST(token_file_round_trip) {
  uint16_t tokens[100];
  for (int i = 0; i < 100; i++) tokens[i] = (uint16_t)(i * 7 % 50);
  const char *path = tu_tmp_path("round.bin");
  loom_error err = {0};
  ck_assert_int_eq(loom_token_file_write(path, tokens, 100, &err), LOOM_OK);
  size_t n;
  int32_t *raw = tu_read_bytes(path, &n);
  ck_assert_uint_eq(n, 1024 + 200);
  ck_assert_int_eq(raw[0], 20240520);
  ck_assert_int_eq(raw[1], 1);
  ck_assert_int_eq(raw[2], 100);
  free(raw);
  loom_token_file f;
  ck_assert_int_eq(loom_token_file_load(&f, path, 50, &err), LOOM_OK);
  ck_assert_uint_eq(f.count, 100);
  ck_assert_mem_eq(f.tokens, tokens, sizeof tokens);
  loom_token_file_free(&f);
}
END_TEST

START_TEST(token_file_errors) {
  const uint16_t ok[4] = {1, 2, 3, 4}, big[4] = {1, 2, 300, 4};
  expect_error(write_tokens("magic.bin", 1234, 1, 4, ok, 4), 256, LOOM_ERR_FORMAT,
               "bad magic 1234 in token file header (expected 20240520, llm.c's token format)");
  expect_error(write_tokens("version.bin", 20240520, 2, 4, ok, 4), 256, LOOM_ERR_FORMAT,
               "unsupported token file version 2 (expected 1)");
  expect_error(write_tokens("short.bin", 20240520, 1, 10, ok, 4), 256, LOOM_ERR_FORMAT,
               "truncated token file: header says 10 tokens but the file holds 4");
  expect_error(write_tokens("range.bin", 20240520, 1, 4, big, 4), 256, LOOM_ERR_FORMAT,
               "token 300 at position 2 is out of range for vocab 256");
  expect_error(write_tokens("negative.bin", 20240520, 1, -5, ok, 4), 256, LOOM_ERR_FORMAT,
               "negative token count -5 in header");
  /* A header claiming 2^31 - 1 tokens in a file of 4: refused from the file's
   * size before it sizes an allocation (under a 1 GiB address-space limit,
   * where ASan's shadow memory allows one, the 4 GiB allocation would fail). */
  if (!UNDER_ASAN) setrlimit(RLIMIT_AS, &(struct rlimit){1L << 30, 1L << 30});
  expect_error(write_tokens("claims.bin", 20240520, 1, 2147483647, ok, 4), 256, LOOM_ERR_FORMAT,
               "truncated token file: header says 2147483647 tokens but the file holds 4");
  const char *tiny = tu_tmp_path("header.bin");
  tu_write_bytes(tiny, "abc", 3);
  expect_error(tiny, 256, LOOM_ERR_FORMAT, "truncated token file: shorter than its 1024-byte header");
  loom_token_file f;
  loom_error err = {0};
  ck_assert_int_eq(loom_token_file_load(&f, "/nonexistent/x.bin", 256, &err), LOOM_ERR_IO);
  ck_assert_str_eq(err.msg, "/nonexistent/x.bin: cannot open token file: No such file or directory");
}
END_TEST

/* Sequential windows are consecutive T+1 slices at stride T, from the start;
 * shuffled windows are a permutation of them each epoch. */
START_TEST(window_orders) {
  enum { COUNT = 1 + 40 * 4, T = 4 }; /* 40 windows: 38 train, 2 held out */
  uint16_t tokens[COUNT];
  for (int i = 0; i < COUNT; i++) tokens[i] = (uint16_t)(i % 200);
  const char *path = tu_tmp_path("windows.bin");
  loom_error err = {0};
  ck_assert_int_eq(loom_token_file_write(path, tokens, COUNT, &err), LOOM_OK);
  loom_dataset *seq, *shuf;
  ck_assert_int_eq(loom_dataset_open_tokens(&seq, path, NULL, 256, T, LOOM_ORDER_SEQUENTIAL, 1, true, &err), LOOM_OK);
  ck_assert_int_eq(loom_dataset_open_tokens(&shuf, path, NULL, 256, T, LOOM_ORDER_SHUFFLED, 1, true, &err), LOOM_OK);
  ck_assert_int_eq(loom_dataset_samples(seq, LOOM_SPLIT_TRAIN), 38);
  int w[T + 1], seen[38] = {0};
  unsigned char scored[T + 1];
  for (int g = 0; g < 38 * 2; g++) {
    seq->window(seq, LOOM_SPLIT_TRAIN, g, T, w, scored);
    for (int t = 0; t <= T; t++) ck_assert_int_eq(scored[t], 1);
    for (int t = 0; t <= T; t++) ck_assert_int_eq(w[t], (g % 38) * T + t);
    shuf->window(shuf, LOOM_SPLIT_TRAIN, g, T, w, scored);
    ck_assert_int_eq(w[0] % T, 0);
    if (g < 38) seen[w[0] / T]++;
  }
  for (int k = 0; k < 38; k++) ck_assert_int_eq(seen[k], 1);
  seq->window(seq, LOOM_SPLIT_HELDOUT, 1, T, w, scored);
  ck_assert_int_eq(w[0], 39 * T);
  /* Batches are sequence-major: tokens[t * B + b]. */
  int tok[T * 3], tgt[T * 3];
  loom_dataset_batch(seq, LOOM_SPLIT_TRAIN, 5, T, 3, tok, tgt);
  ck_assert_int_eq(tok[2 * 3 + 1], 6 * T + 2);
  ck_assert_int_eq(tgt[2 * 3 + 1], 6 * T + 3);
  loom_dataset_free(seq);
  loom_dataset_free(shuf);
  /* Too short for the sequence length. */
  loom_dataset *ds;
  ck_assert_int_eq(loom_dataset_open_tokens(&ds, path, NULL, 256, 200, LOOM_ORDER_SEQUENTIAL, 1, true, &err), LOOM_ERR_FORMAT);
  char expected[600];
  snprintf(expected, sizeof expected, "%s: 161 tokens is too few for --seq 200 (need two windows: train and held-out of seq+1 tokens)", path);
  ck_assert_str_eq(err.msg, expected);
}
END_TEST

START_TEST(byte_tokenizer_prepares_token_files) {
  const char *txt = tu_tmp_path("in.txt"), *bin = tu_tmp_path("out.bin");
  const char text[] = "hello, loom\n\x01\xff";
  tu_write_bytes(txt, text, sizeof text - 1);
  loom_error err = {0};
  const char *inputs[] = {txt};
  loom_prepare_options o = {.inputs = inputs, .ninputs = 1, .llmc_output = bin, .workers = 1};
  loom_prepare_stats s;
  ck_assert_int_eq(loom_prepare(&o, &s, &err), LOOM_OK);
  ck_assert_int_eq(s.tokens, sizeof text - 1);
  loom_token_file f;
  ck_assert_int_eq(loom_token_file_load(&f, bin, LOOM_BYTE_VOCAB, &err), LOOM_OK);
  ck_assert_uint_eq(f.count, sizeof text - 1);
  for (size_t i = 0; i < f.count; i++) ck_assert_int_eq(f.tokens[i], (unsigned char)text[i]);
  loom_token_file_free(&f);
  inputs[0] = "/nonexistent/in.txt";
  o.force = true;
  ck_assert_int_eq(loom_prepare(&o, &s, &err), LOOM_ERR_IO);
}
END_TEST

/* Parses "aaa+bbb=ssss\n" lines back out of a window. */
static int parse_line(const int *w, int digits, long *a, long *b, long *rev_sum) {
  *a = *b = *rev_sum = 0;
  int i = 0;
  for (int k = 0; k < digits; k++) *a = *a * 10 + (w[i++] - '0');
  if (w[i++] != '+') return 0;
  for (int k = 0; k < digits; k++) *b = *b * 10 + (w[i++] - '0');
  if (w[i++] != '=') return 0;
  long place = 1;
  for (int k = 0; k <= digits; k++, place *= 10) *rev_sum += (w[i++] - '0') * place;
  return w[i] == '\n';
}

START_TEST(addition_task) {
  enum { T = 64, DIGITS = 3, LINE = 3 * DIGITS + 4 };
  loom_dataset *ds = loom_dataset_addition(DIGITS, 9);
  int w[T + 1], again[T + 1];
  unsigned char scored[T + 1], scored2[T + 1];
  char *heldout = calloc(1000 * 1000, 1);
  for (int split = 0; split < 2; split++)
    for (int g = 0; g < 300; g++) {
      ds->window(ds, (loom_split)split, g, T, w, scored);
      ds->window(ds, (loom_split)split, g, T, again, scored2);
      ck_assert_mem_eq(w, again, sizeof w); /* a pure function of (seed, g) */
      ck_assert_mem_eq(scored, scored2, sizeof scored);
      /* Only the sum's digits and its newline are targets. */
      for (int t = 0; t <= T; t++) ck_assert_int_eq(scored[t], t % LINE >= 2 * DIGITS + 2);
      for (int start = 0; start + LINE <= T + 1; start += LINE) {
        long a, b, s;
        ck_assert(parse_line(w + start, DIGITS, &a, &b, &s));
        ck_assert_int_eq(a + b, s);
        if (split == 1) heldout[a * 1000 + b] = 1;
        else ck_assert_msg(!heldout[a * 1000 + b], "train pair %ld+%ld is held out", a, b);
      }
    }
  /* Scoring: every answer digit must be predicted for a problem to count. */
  ds->window(ds, LOOM_SPLIT_HELDOUT, 0, T, w, scored);
  int pred[T], problems, correct;
  for (int t = 0; t < T; t++) pred[t] = w[t + 1]; /* a perfect model */
  loom_addition_score(w, pred, T, DIGITS, &problems, &correct);
  ck_assert_int_eq(problems, 5); /* '=' at 7, 20, 33, 46, 59: answers end by w[63] */
  ck_assert_int_eq(correct, 5);
  pred[20 + 2] = 'x';
  loom_addition_score(w, pred, T, DIGITS, &problems, &correct);
  ck_assert_int_eq(correct, 4);
  free(heldout);
  loom_dataset_free(ds);
}
END_TEST

int main(void) {
  Suite *s = suite_create("data");
  TCase *tc = tcase_create("data");
  tcase_add_test(tc, token_file_round_trip);
  tcase_add_test(tc, token_file_errors);
  tcase_add_test(tc, window_orders);
  tcase_add_test(tc, byte_tokenizer_prepares_token_files);
  tcase_add_test(tc, addition_task);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
