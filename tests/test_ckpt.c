/* Checkpoint shard files: CRC-32C known answers, a round trip that keeps
 * names, shapes and offsets, and every kind of corruption refused with a
 * message naming the file (and tensor), never loaded silently. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/shard_file.h"
#include "core/crc32c.h"
#include "test_util.h"

START_TEST(crc32c_known_answers) {
  ck_assert_uint_eq(loom_crc32c(0, "123456789", 9), 0xE3069283u);
  ck_assert_uint_eq(loom_crc32c(0, "", 0), 0u);
  /* Continuing a CRC equals one pass over the whole. */
  ck_assert_uint_eq(loom_crc32c(loom_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
}
END_TEST

/* Two tensors: a row shard of a [6, 4] matrix and a whole vector. */
static const char *write_sample(const char *name, float *a, float *b) {
  for (int i = 0; i < 8; i++) a[i] = (float)i * 0.5f;
  for (int i = 0; i < 3; i++) b[i] = -1.0f - (float)i;
  loom_shard_tensor t[2] = {{.name = "h.0.attn.c_attn.weight", .ndim = 2, .global = {6, 4}, .offset = {2, 0},
                             .local = {2, 4}, .data = a},
                            {.name = "ln_f.bias", .ndim = 1, .global = {3}, .offset = {0}, .local = {3}, .data = b}};
  const char *path = tu_tmp_path(name);
  loom_error err = {{0}};
  int64_t bytes;
  uint32_t crc;
  ck_assert_int_eq(loom_shard_file_write(path, t, 2, &bytes, &crc, &err), LOOM_OK);
  /* The size and checksum it reports are the file's own, read back here. */
  FILE *fp = fopen(path, "rb");
  uint8_t disk[4096];
  const size_t got = fread(disk, 1, sizeof disk, fp);
  fclose(fp);
  ck_assert_int_eq(bytes, (int64_t)got);
  ck_assert_uint_eq(crc, loom_crc32c(0, disk, got));
  return path;
}

START_TEST(round_trip) {
  float a[8], b[3];
  const char *path = write_sample("shard.bin", a, b);
  loom_shard_file f;
  loom_error err = {{0}};
  ck_assert_int_eq(loom_shard_file_read(path, &f, &err), LOOM_OK);
  ck_assert_int_eq(f.count, 2);
  ck_assert_str_eq(f.tensors[0].name, "h.0.attn.c_attn.weight");
  ck_assert_int_eq(f.tensors[0].global[0], 6);
  ck_assert_int_eq(f.tensors[0].offset[0], 2);
  ck_assert_int_eq(f.tensors[0].local[1], 4);
  ck_assert_mem_eq(f.tensors[0].data, a, sizeof a);
  ck_assert_mem_eq(f.tensors[1].data, b, sizeof b);
  loom_shard_file_free(&f);
}
END_TEST

static void expect_refused(const char *path, const char *suffix) {
  loom_shard_file f;
  loom_error err = {{0}};
  ck_assert_int_eq(loom_shard_file_read(path, &f, &err), LOOM_ERR_FORMAT);
  char want[700];
  snprintf(want, sizeof want, "%s: %s", path, suffix);
  ck_assert_str_eq(err.msg, want);
}

START_TEST(corruption_is_refused) {
  float a[8], b[3];
  const char *good = write_sample("good.bin", a, b);
  size_t n;
  char *bytes = tu_read_bytes(good, &n);
  const char *bad = tu_tmp_path("bad.bin");
  /* A flipped byte in the first tensor's data. */
  bytes[n - 12 - 48 - 4] ^= 0x40; /* last data, 48 metadata bytes of ln_f.bias, first tensor's data */
  tu_write_bytes(bad, bytes, n);
  loom_shard_file f;
  loom_error err = {{0}};
  ck_assert_int_eq(loom_shard_file_read(bad, &f, &err), LOOM_ERR_FORMAT);
  ck_assert_ptr_nonnull(strstr(err.msg, "tensor h.0.attn.c_attn.weight fails its checksum"));
  ck_assert_ptr_nonnull(strstr(err.msg, "the file is corrupt"));
  bytes[n - 12 - 48 - 4] ^= 0x40; /* last data, 48 metadata bytes of ln_f.bias, first tensor's data */
  /* Truncated inside the last tensor's data, and inside the header. */
  tu_write_bytes(bad, bytes, n - 4);
  expect_refused(bad, "truncated checkpoint shard: ends inside ln_f.bias");
  tu_write_bytes(bad, bytes, 10);
  expect_refused(bad, "truncated checkpoint shard: ends inside its header");
  /* Another file type, a newer version, trailing garbage. */
  memcpy(bytes, "NOTLOOM!", 8);
  tu_write_bytes(bad, bytes, n);
  expect_refused(bad, "not a loom checkpoint shard (bad magic)");
  memcpy(bytes, "LOOMSHRD", 8);
  bytes[8] = 9;
  tu_write_bytes(bad, bytes, n);
  expect_refused(bad, "checkpoint shard version 9, this loom reads 1");
  bytes[8] = 1;
  char *longer = malloc(n + 3);
  memcpy(longer, bytes, n);
  memcpy(longer + n, "xyz", 3);
  tu_write_bytes(bad, longer, n + 3);
  expect_refused(bad, "trailing bytes after the last tensor");
  free(longer);
  free(bytes);
  ck_assert_int_eq(loom_shard_file_read("/nonexistent/shard.bin", &f, &err), LOOM_ERR_IO);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ckpt");
  TCase *tc = tcase_create("ckpt");
  tcase_add_test(tc, crc32c_known_answers);
  tcase_add_test(tc, round_trip);
  tcase_add_test(tc, corruption_is_refused);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
