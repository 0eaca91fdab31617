/* Table-driven CRC-32C, reflected polynomial 0x82F63B78. */
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

uint32_t loom_crc32c(uint32_t crc, const void *data, size_t n) {
  if (!ready) build_table();
  const uint8_t *p = data;
  crc = ~crc;
  for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}
