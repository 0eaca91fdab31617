/* Integers from outside (flags, lists, expressions) are decimal digits
 * only: "0x2", "1e0", "+3", " 4" and "٣" are not integers, so every reader
 * of one agrees with what a person reading the command line sees. */
#ifndef LOOM_DECIMAL_H
#define LOOM_DECIMAL_H

#include <stdint.h>

typedef enum {
  LOOM_DECIMAL_OK = 0,
  LOOM_DECIMAL_NONE,  /* no integer there: not an optional '-' and digits */
  LOOM_DECIMAL_RANGE, /* an integer outside [lo, hi] (however many digits it has) */
} loom_decimal;

/* Reads an optional '-' and decimal digits from text. With end NULL the
 * whole text must be the integer; otherwise *end is set past its digits.
 * *out is set only on LOOM_DECIMAL_OK. */
loom_decimal loom_parse_decimal(const char *text, const char **end, int64_t lo, int64_t hi, int64_t *out);
/* A comma-separated list of at most max rising integers in [lo, hi] ("64,128,256") into out; their count, or -1 when
 * the text is not one (empty, a gap, a repeat or fall, too many). */
int loom_parse_rising_list(const char *text, int64_t lo, int64_t hi, int *out, int max);

#endif
