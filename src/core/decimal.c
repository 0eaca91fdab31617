/* Decimal integers, read digit by digit so no locale, base prefix or
 * exponent can change what a value means. */
#include "core/decimal.h"

loom_decimal loom_parse_decimal(const char *text, const char **end, int64_t lo, int64_t hi, int64_t *out) {
  const char *p = text;
  const int negative = *p == '-';
  p += negative;
  if (*p < '0' || *p > '9') return LOOM_DECIMAL_NONE;
  /* Accumulated as a magnitude past INT64_MAX's: anything larger is out of range whatever [lo, hi] says. */
  uint64_t magnitude = 0;
  int overflow = 0;
  for (; *p >= '0' && *p <= '9'; p++) {
    const unsigned digit = (unsigned)(*p - '0');
    if (magnitude > (UINT64_MAX - digit) / 10) overflow = 1;
    else magnitude = magnitude * 10 + digit;
  }
  if (end) *end = p;
  else if (*p != '\0') return LOOM_DECIMAL_NONE;
  if (overflow || magnitude > (uint64_t)INT64_MAX + (uint64_t)negative) return LOOM_DECIMAL_RANGE;
  const int64_t v = negative ? (magnitude == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)magnitude) : (int64_t)magnitude;
  if (v < lo || v > hi) return LOOM_DECIMAL_RANGE;
  *out = v;
  return LOOM_DECIMAL_OK;
}

int loom_parse_rising_list(const char *text, int64_t lo, int64_t hi, int *out, int max) {
  int n = 0;
  if (!*text) return -1;
  for (const char *p = text; *p; n++) {
    const char *end;
    int64_t v;
    if (n == max || loom_parse_decimal(p, &end, lo, hi, &v) != LOOM_DECIMAL_OK || (*end && *end != ',') ||
        (n && v <= out[n - 1]) || (*end == ',' && !end[1]))
      return -1;
    out[n] = (int)v;
    p = *end ? end + 1 : end;
  }
  return n;
}
