/* fp8_math.h's conversions, for tests/fp8_reference.py to check against its
 * own decoding of the formats' definitions. `fp8_dump decode` prints every
 * code of E4M3 and E5M2 with its value's fp32 bits; `fp8_dump encode` reads
 * fp32 bit patterns (hex, one a line) and prints each one's E4M3 and E5M2
 * codes; `fp8_dump mx` reads amaxes (fp32 bits) and prints their MXFP8
 * E8M0 scale codes for E4M3 and E5M2 blocks. */
#include <stdio.h>
#include <string.h>
#include "backend/fp8_math.h"

static unsigned bits_of(float f) {
  unsigned u;
  memcpy(&u, &f, sizeof u);
  return u;
}

int main(int argc, char **argv) {
  const char *mode = argc == 2 ? argv[1] : "";
  if (!strcmp(mode, "decode")) {
    for (int c = 0; c < 256; c++)
      printf("%02x %08x %08x\n", c, bits_of(loom_fp8_decode((uint8_t)c, LOOM_FP8_E4M3)),
             bits_of(loom_fp8_decode((uint8_t)c, LOOM_FP8_E5M2)));
    for (int c = 0; c < 256; c++) printf("e8m0 %02x %08x\n", c, bits_of(loom_e8m0_decode((uint8_t)c)));
    return 0;
  }
  if (strcmp(mode, "encode") && strcmp(mode, "mx")) {
    fprintf(stderr, "usage: fp8_dump decode|encode|mx\n");
    return 2;
  }
  unsigned u;
  while (scanf("%x", &u) == 1) {
    float f;
    memcpy(&f, &u, sizeof f);
    if (!strcmp(mode, "encode")) printf("%02x %02x\n", loom_fp8_encode(f, LOOM_FP8_E4M3), loom_fp8_encode(f, LOOM_FP8_E5M2));
    else printf("%02x %02x\n", loom_mx_scale(f, LOOM_FP8_E4M3), loom_mx_scale(f, LOOM_FP8_E5M2));
  }
  return 0;
}
