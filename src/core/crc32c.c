/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): the SSE4.2 crc32
 * instruction where the CPU has it, 8 bytes per step (about 20x the table),
 * else a byte-wise table, which is also the tests' reference. */
#include <stdio.h>
#include <string.h>
#include "core/crc32c.h"

static uint32_t table[256];
static int ready;

static void build_table(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  ready = 1;
}

uint32_t loom_crc32c_table(uint32_t crc, const void *data, size_t n) {
  if (!ready) build_table();
  const uint8_t *p = data;
  crc = ~crc;
  for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *data, size_t n) {
  const uint8_t *p = data;
  uint64_t c = ~crc;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    memcpy(&word, p, 8); /* unaligned-safe */
    c = __builtin_ia32_crc32di(c, word);
  }
  uint32_t c32 = (uint32_t)c;
  for (; n > 0; p++, n--) c32 = __builtin_ia32_crc32qi(c32, *p);
  return ~c32;
}

uint32_t loom_crc32c(uint32_t crc, const void *data, size_t n) {
  static int has_sse42 = -1;
  if (has_sse42 < 0) has_sse42 = __builtin_cpu_supports("sse4.2");
  return has_sse42 ? crc32c_sse42(crc, data, n) : loom_crc32c_table(crc, data, n);
}
#else
uint32_t loom_crc32c(uint32_t crc, const void *data, size_t n) { return loom_crc32c_table(crc, data, n); }
#endif

uint32_t loom_crc32c_file(const char *path) {
  uint32_t crc = 0;
  FILE *fp = fopen(path, "rb");
  char buf[1 << 16];
  for (size_t got; fp && (got = fread(buf, 1, sizeof buf, fp)) > 0;) crc = loom_crc32c(crc, buf, got);
  if (fp) fclose(fp);
  return crc;
}
