/* Megatron indexed datasets: the .idx bytes as Megatron's _IndexWriter lays
 * them out, a round trip, every malformed file refused with its message;
 * GPT samples across document boundaries; seeded permutations; --split as
 * Megatron rounds it; blending proportions and determinism. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "data/dataset.h"
#include "data/gpt_samples.h"
#include "data/indexed.h"
#include "data/shuffle.h"
#include "test_util.h"

/* Writes an indexed dataset of `docs` documents, document d holding tokens
 * base + d*1000 + 0, 1, ... (lengths 1 + (d * 7) % 13). */
static const char *write_dataset(const char *name, int docs, int dtype, int base) {
  const char *prefix = tu_tmp_path(name);
  loom_indexed_writer w;
  loom_error err = {0};
  ck_assert_int_eq(loom_indexed_writer_open(&w, prefix, dtype, &err), LOOM_OK);
  for (int d = 0; d < docs; d++) {
    int32_t ids[16];
    const int len = 1 + (d * 7) % 13;
    for (int k = 0; k < len; k++) ids[k] = base + d * 1000 % 60000 + k;
    ck_assert_int_eq(loom_indexed_add(&w, ids, (size_t)len, &err), LOOM_OK);
    loom_indexed_end_document(&w);
  }
  ck_assert_int_eq(loom_indexed_writer_finish(&w, &err), LOOM_OK);
  loom_indexed_writer_free(&w);
  return prefix;
}

static int64_t get_i64(const unsigned char *p) {
  int64_t v;
  memcpy(&v, p, 8);
  return v;
}

START_TEST(index_layout_and_round_trip) {
  for (int dtype = 0; dtype < 2; dtype++) {
    const int code = dtype ? LOOM_INDEXED_DTYPE_INT32 : LOOM_INDEXED_DTYPE_UINT16, item = dtype ? 4 : 2;
    const char *prefix = write_dataset(dtype ? "i32" : "u16", 5, code, dtype ? 70000 : 0);
    char path[1100];
    size_t n;
    snprintf(path, sizeof path, "%s.idx", prefix);
    unsigned char *idx = tu_read_bytes(path, &n);
    ck_assert_uint_eq(n, 34 + 12 * 5 + 8 * 6);
    ck_assert_int_eq(memcmp(idx, "MMIDIDX\0\0", 9), 0);
    ck_assert_int_eq(get_i64(idx + 9), 1);
    ck_assert_int_eq(idx[17], code);
    ck_assert_int_eq(get_i64(idx + 18), 5);
    ck_assert_int_eq(get_i64(idx + 26), 6);
    int64_t at = 0;
    for (int d = 0; d < 5; d++) {
      int32_t len;
      memcpy(&len, idx + 34 + 4 * d, 4);
      ck_assert_int_eq(len, 1 + (d * 7) % 13);
      ck_assert_int_eq(get_i64(idx + 34 + 20 + 8 * d), at);
      at += len * item;
    }
    for (int k = 0; k <= 5; k++) ck_assert_int_eq(get_i64(idx + 34 + 60 + 8 * k), k);
    free(idx);
    loom_indexed ix;
    loom_error err = {0};
    ck_assert_int_eq(loom_indexed_open(&ix, prefix, 200000, &err), LOOM_OK);
    ck_assert_int_eq(ix.sequences, 5);
    for (int d = 0; d < 5; d++) {
      int got[16];
      const int64_t len = loom_indexed_length(&ix, d);
      loom_indexed_read(&ix, d, 0, len, got);
      for (int k = 0; k < len; k++) ck_assert_int_eq(got[k], (dtype ? 70000 : 0) + d * 1000 + k);
    }
    loom_indexed_close(&ix);
  }
}
END_TEST

/* Copies PREFIX's pair, overwrites bytes of the .idx (or the .bin with
 * bin) at `at` or truncates it, and expects the open to fail with
 * "COPY.<ext>: want". */
static void corrupt_and_expect(const char *prefix, bool bin, size_t at, const void *bytes, size_t nbytes, size_t truncate_to,
                               int vocab, const char *ext, const char *want) {
  const char *copy = tu_tmp_path("bad");
  for (int f = 0; f < 2; f++) {
    const bool this_bin = f == 1;
    char from[1100], to[1100];
    snprintf(from, sizeof from, "%s.%s", prefix, this_bin ? "bin" : "idx");
    snprintf(to, sizeof to, "%s.%s", copy, this_bin ? "bin" : "idx");
    size_t n;
    unsigned char *data = tu_read_bytes(from, &n);
    if (this_bin == bin && nbytes) memcpy(data + at, bytes, nbytes);
    tu_write_bytes(to, data, this_bin == bin && truncate_to ? truncate_to : n);
    free(data);
  }
  loom_indexed ix;
  loom_error err = {0};
  ck_assert_int_ne(loom_indexed_open(&ix, copy, vocab, &err), LOOM_OK);
  char expected[1400];
  snprintf(expected, sizeof expected, "%s.%s: %s", copy, ext, want);
  ck_assert_str_eq(err.msg, expected);
}

START_TEST(malformed_indexes_refused) {
  /* lengths 1, 8, 2, 9: 20 uint16 tokens, an index of 34 + 12*4 + 8*5 = 122 bytes */
  const char *prefix = write_dataset("good", 4, LOOM_INDEXED_DTYPE_UINT16, 0);
  loom_indexed ix;
  loom_error err = {0};
  ck_assert_int_eq(loom_indexed_open(&ix, prefix, 5000, &err), LOOM_OK); /* the original opens */
  ck_assert_int_eq(ix.sequences, 4);
  loom_indexed_close(&ix);
  const int64_t two = 2, seven = 7, many = 1000, wrapping = (int64_t)1 << 62;
  const unsigned char float_code = 6;
  const int32_t long_len = 99;
  corrupt_and_expect(prefix, false, 0, "XMIDIDX", 7, 0, 5000, "idx", "not a Megatron indexed dataset index (no MMIDIDX header)");
  corrupt_and_expect(prefix, false, 9, &two, 8, 0, 5000, "idx", "index version 2, loom reads version 1");
  corrupt_and_expect(prefix, false, 17, &float_code, 1, 0, 5000, "idx", "dtype code 6 is not an integer token type (1-5, 8)");
  corrupt_and_expect(prefix, false, 18, &many, 8, 0, 5000, "idx", "122 bytes do not hold 1000 sequences and 5 document indices (12074 bytes)");
  corrupt_and_expect(prefix, false, 0, NULL, 0, 100, 5000, "idx", "100 bytes do not hold 4 sequences and 5 document indices (122 bytes)");
  /* A count whose byte size wraps 64 bits: refused by its range, never printed as a wrapped size. */
  corrupt_and_expect(prefix, false, 18, &wrapping, 8, 0, 5000, "idx",
                     "its header counts 4611686018427387904 sequences and 5 document indices; an index holds 0 to 2^40 sequences and 1 to 2^40 indices");
  corrupt_and_expect(prefix, false, 34 + 4, &long_len, 4, 0, 5000, "idx",
                     "sequence 2 has length 2 at pointer 18, expected a length >= 0 at 200");
  corrupt_and_expect(prefix, false, 34 + 48 + 8, &seven, 8, 0, 5000, "idx", "document index 1 is 7; they must rise from 0 to the 4 sequences");
  corrupt_and_expect(prefix, true, 0, NULL, 0, 38, 5000, "bin", "38 bytes, but the index describes 40 (truncated or not this index's data)");
  corrupt_and_expect(prefix, true, 0, NULL, 0, 0, 3000, "bin", "token 11 is 3000, outside the vocabulary [0, 3000)");
  const char *missing = tu_tmp_path("missing");
  ck_assert_int_eq(loom_indexed_open(&ix, missing, 5000, &err), LOOM_ERR_IO);
  ck_assert_ptr_nonnull(strstr(err.msg, "missing.idx: cannot open"));
}
END_TEST

/* The concatenation of sequences [first, first + n) of ix in order. */
static int *concatenated(const loom_indexed *ix, int64_t first, int64_t n, const int64_t *order, int64_t *total) {
  *total = 0;
  for (int64_t i = 0; i < n; i++) *total += loom_indexed_length(ix, first + i);
  int *all = malloc((size_t)*total * sizeof *all);
  int64_t at = 0;
  for (int64_t i = 0; i < n; i++) {
    const int64_t seq = first + (order ? order[i] : i), len = loom_indexed_length(ix, seq);
    loom_indexed_read(ix, seq, 0, len, all + at);
    at += len;
  }
  return all;
}

START_TEST(samples_cross_documents) {
  const char *prefix = write_dataset("samples", 40, LOOM_INDEXED_DTYPE_UINT16, 0);
  loom_indexed ix;
  loom_error err = {0};
  ck_assert_int_eq(loom_indexed_open(&ix, prefix, 60000, &err), LOOM_OK);
  const int T = 8;
  int64_t total;
  int *all = concatenated(&ix, 5, 30, NULL, &total);
  /* In order: sample j is tokens [jT, jT + T] of the documents laid end to end. */
  gpt_samples s;
  ck_assert(gpt_samples_init(&s, &ix, 5, 30, T, false, 1, 2));
  ck_assert_int_eq(s.samples, (total - 1) / T);
  ck_assert_int_gt(s.samples, 10);
  int window[T + 1];
  for (int64_t j = 0; j < s.samples; j++) {
    gpt_samples_window(&s, j, window);
    for (int k = 0; k <= T; k++) ck_assert_int_eq(window[k], all[j * T + k]);
  }
  gpt_samples_window(&s, s.samples, window); /* epoch 2 starts over */
  for (int k = 0; k <= T; k++) ck_assert_int_eq(window[k], all[k]);
  gpt_samples_free(&s);
  free(all);
  /* Shuffled: each epoch's samples are the windows of its own document order, each once. */
  ck_assert(gpt_samples_init(&s, &ix, 5, 30, T, true, 7, 3));
  for (int64_t epoch = 0; epoch < 2; epoch++) {
    gpt_samples_window(&s, epoch * s.samples, window);
    const gpt_epoch *e = s.cache[0].epoch == epoch ? &s.cache[0] : &s.cache[1];
    ck_assert_int_eq(e->epoch, epoch);
    all = concatenated(&ix, 5, 30, e->order, &total);
    int seen[64] = {0};
    for (int64_t j = 0; j < s.samples; j++) {
      gpt_samples_window(&s, epoch * s.samples + j, window);
      int64_t match = -1;
      for (int64_t w = 0; w < s.samples && match < 0; w++)
        if (memcmp(window, all + w * T, sizeof window) == 0) match = w;
      ck_assert_int_ge(match, 0);
      seen[match]++;
    }
    for (int64_t w = 0; w < s.samples; w++) ck_assert_int_eq(seen[w], 1);
    free(all);
  }
  gpt_samples_free(&s);
  ck_assert(!gpt_samples_init(&s, &ix, 0, 1, T, false, 1, 2)); /* one token: no sample */
  gpt_samples_free(&s);
  loom_indexed_close(&ix);
}
END_TEST

START_TEST(permutations_are_bijections) {
  for (int64_t n = 1; n < 300; n += 7) {
    char *hit = calloc((size_t)n, 1);
    for (int64_t x = 0; x < n; x++) {
      const int64_t y = loom_permute_index(x, n, 11, 22);
      ck_assert(y >= 0 && y < n);
      ck_assert(!hit[y]);
      hit[y] = 1;
    }
    free(hit);
  }
  int moved = 0, differs = 0;
  for (int64_t x = 0; x < 1000; x++) {
    moved += loom_permute_index(x, 1000, 11, 22) != x;
    differs += loom_permute_index(x, 1000, 11, 22) != loom_permute_index(x, 1000, 12, 22);
  }
  ck_assert_int_gt(moved, 900);
  ck_assert_int_gt(differs, 900);
}
END_TEST

START_TEST(split_as_megatron_rounds) {
  int64_t b[4];
  loom_error err = {0};
  ck_assert_int_eq(loom_data_split_bounds("969,30,1", 1000, b, &err), LOOM_OK);
  ck_assert(b[0] == 0 && b[1] == 969 && b[2] == 999 && b[3] == 1000);
  ck_assert_int_eq(loom_data_split_bounds("98,2,0", 50, b, &err), LOOM_OK);
  ck_assert(b[0] == 0 && b[1] == 49 && b[2] == 50 && b[3] == 50);
  /* 1/3 each of 10: round(3.33) three times is 9, one short, taken off every bound after the first */
  ck_assert_int_eq(loom_data_split_bounds("1,1,1", 10, b, &err), LOOM_OK);
  ck_assert(b[0] == 0 && b[1] == 4 && b[2] == 7 && b[3] == 10);
  ck_assert_int_eq(loom_data_split_bounds("1,1", 5, b, &err), LOOM_OK); /* 2.5 rounds to even: 2 */
  ck_assert(b[1] == 3 && b[2] == 5 && b[3] == 5);
  ck_assert_int_eq(loom_data_split_bounds("0,0,0", 5, b, &err), LOOM_ERR_USAGE);
  ck_assert_str_eq(err.msg, "--split \"0,0,0\": expected up to 3 comma-separated shares >= 0, not all 0 (train,held-out,test)");
  ck_assert_int_eq(loom_data_split_bounds("9,1,x", 5, b, &err), LOOM_ERR_USAGE);
  ck_assert_int_eq(loom_data_split_bounds("1,2,3,4", 5, b, &err), LOOM_ERR_USAGE);
  ck_assert_int_eq(loom_data_split_bounds("-1,2", 5, b, &err), LOOM_ERR_USAGE);
}
END_TEST

static loom_dataset *open_blend(const char *spec, uint64_t seed, int T) {
  loom_dataset *ds;
  loom_error err = {0};
  const loom_data_options o = {.data = spec, .split = "90,10,0", .vocab = 200000, .T = T, .shuffle = true, .seed = seed, .hold_out = true};
  ck_assert_msg(loom_dataset_open(&ds, &o, &err) == LOOM_OK, "%s", err.msg);
  return ds;
}

START_TEST(blending_follows_weights) {
  const char *a = write_dataset("blend_a", 300, LOOM_INDEXED_DTYPE_INT32, 0);
  const char *b = write_dataset("blend_b", 200, LOOM_INDEXED_DTYPE_INT32, 100000);
  char spec[2400];
  snprintf(spec, sizeof spec, "0.7 %s 0.3 %s", a, b);
  const int T = 4, N = 10000;
  loom_dataset *ds = open_blend(spec, 5, T), *again = open_blend(spec, 5, T), *other = open_blend(spec, 6, T);
  int from_b = 0, same = 0, differ = 0;
  int w1[T + 1], w2[T + 1], w3[T + 1];
  unsigned char scored[T + 1];
  for (int64_t g = 0; g < N; g++) {
    ds->window(ds, LOOM_SPLIT_TRAIN, g, T, w1, scored);
    again->window(again, LOOM_SPLIT_TRAIN, g, T, w2, scored);
    other->window(other, LOOM_SPLIT_TRAIN, g, T, w3, scored);
    from_b += w1[0] >= 100000; /* B's tokens start at 100000 */
    same += memcmp(w1, w2, sizeof w1) == 0;
    differ += memcmp(w1, w3, sizeof w1) != 0;
  }
  ck_assert_msg(abs(from_b - 3000) <= 100, "B drew %d of %d", from_b, N);
  ck_assert_int_eq(same, N);
  ck_assert_int_gt(differ, N / 2);
  /* Random access equals sequential access (the cursor walks back from its checkpoints). */
  for (int64_t g = N - 1; g >= 0; g -= 997) {
    ds->window(ds, LOOM_SPLIT_TRAIN, g, T, w1, scored);
    loom_dataset *fresh = open_blend(spec, 5, T);
    for (int64_t k = 0; k <= g; k++) fresh->window(fresh, LOOM_SPLIT_TRAIN, k, T, w2, scored);
    ck_assert_int_eq(memcmp(w1, w2, sizeof w1), 0);
    loom_dataset_free(fresh);
  }
  char line[2048];
  ds->describe(ds, N, line, sizeof line);
  ck_assert_ptr_nonnull(strstr(line, "weight 0.7000, 7000 of 10000 samples (70.00%)"));
  ck_assert_ptr_nonnull(strstr(line, "weight 0.3000, 3000 of 10000 samples (30.00%)"));
  /* The held-out split draws from both too, from other documents than train's. */
  int heldout_b = 0;
  for (int64_t g = 0; g < 1000; g++) {
    ds->window(ds, LOOM_SPLIT_HELDOUT, g, T, w1, scored);
    heldout_b += w1[0] >= 100000;
  }
  ck_assert_msg(abs(heldout_b - 300) <= 10, "held-out B drew %d of 1000", heldout_b);
  loom_dataset_free(ds);
  loom_dataset_free(again);
  loom_dataset_free(other);
}
END_TEST

START_TEST(batches_do_not_depend_on_micro_batching) {
  const char *a = write_dataset("micro", 100, LOOM_INDEXED_DTYPE_UINT16, 0);
  const int T = 6;
  loom_dataset *ds = open_blend(a, 9, T);
  int whole[T * 8], whole_t[T * 8], half[2][T * 4], half_t[2][T * 4];
  loom_dataset_batch(ds, LOOM_SPLIT_TRAIN, 16, T, 8, whole, whole_t);
  loom_dataset_batch(ds, LOOM_SPLIT_TRAIN, 20, T, 4, half[1], half_t[1]); /* out of order on purpose */
  loom_dataset_batch(ds, LOOM_SPLIT_TRAIN, 16, T, 4, half[0], half_t[0]);
  for (int t = 0; t < T; t++)
    for (int b = 0; b < 8; b++) {
      ck_assert_int_eq(whole[t * 8 + b], half[b / 4][t * 4 + b % 4]);
      ck_assert_int_eq(whole_t[t * 8 + b], half_t[b / 4][t * 4 + b % 4]);
    }
  loom_dataset_free(ds);
}
END_TEST

START_TEST(bad_specs_refused) {
  const char *a = write_dataset("spec", 10, LOOM_INDEXED_DTYPE_UINT16, 0);
  char spec[2400];
  loom_dataset *ds;
  loom_error err = {0};
  loom_data_options o = {.split = "90,10,0", .vocab = 60000, .T = 4, .hold_out = true};
  snprintf(spec, sizeof spec, "0.5 %s 0.5", a);
  o.data = spec;
  ck_assert_int_eq(loom_dataset_open(&ds, &o, &err), LOOM_ERR_USAGE);
  ck_assert_ptr_nonnull(strstr(err.msg, "expected PREFIX or \"W1 PREFIX1 W2 PREFIX2 ...\""));
  snprintf(spec, sizeof spec, "-1 %s 1 %s", a, a);
  ck_assert_int_eq(loom_dataset_open(&ds, &o, &err), LOOM_ERR_USAGE);
  ck_assert_ptr_nonnull(strstr(err.msg, "weight \"-1\""));
  snprintf(spec, sizeof spec, "1 %s 1 %s_nothing", a, a);
  ck_assert_int_eq(loom_dataset_open(&ds, &o, &err), LOOM_ERR_USAGE);
  ck_assert_ptr_nonnull(strstr(err.msg, "_nothing.idx (a blend names Megatron indexed datasets by prefix)"));
  o.data = a;
  o.split = "100,0,0";
  ck_assert_int_eq(loom_dataset_open(&ds, &o, &err), LOOM_ERR_USAGE);
  ck_assert_ptr_nonnull(strstr(err.msg, "--split 100,0,0 leaves no held-out sample"));
  o.hold_out = false;
  ck_assert_int_eq(loom_dataset_open(&ds, &o, &err), LOOM_OK);
  loom_dataset_free(ds);
  o.T = 1000;
  ck_assert_int_eq(loom_dataset_open(&ds, &o, &err), LOOM_ERR_USAGE);
  ck_assert_ptr_nonnull(strstr(err.msg, "holds no sample of --seq 1000 plus 1"));
}
END_TEST

int main(void) {
  Suite *s = suite_create("indexed");
  TCase *tc = tcase_create("indexed");
  tcase_add_test(tc, index_layout_and_round_trip);
  tcase_add_test(tc, malformed_indexes_refused);
  tcase_add_test(tc, samples_cross_documents);
  tcase_add_test(tc, permutations_are_bijections);
  tcase_add_test(tc, split_as_megatron_rounds);
  tcase_add_test(tc, blending_follows_weights);
  tcase_add_test(tc, batches_do_not_depend_on_micro_batching);
  tcase_add_test(tc, bad_specs_refused);
  tcase_set_timeout(tc, 120);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
