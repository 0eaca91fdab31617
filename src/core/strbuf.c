/* Growing strings. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "core/strbuf.h"

/* Room for n more bytes and the NUL. */
static void reserve(loom_strbuf *b, size_t n) {
  if (b->len + n + 1 <= b->cap) return;
  b->cap = (b->len + n + 1) * 2;
  b->buf = realloc(b->buf, b->cap);
  LOOM_CHECK(b->buf != NULL, "out of memory building text");
}

void loom_strbuf_append(loom_strbuf *b, const void *data, size_t n) {
  reserve(b, n);
  if (n) memcpy(b->buf + b->len, data, n);
  b->len += n;
  b->buf[b->len] = '\0';
}

void loom_strbuf_printf(loom_strbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  reserve(b, (size_t)n);
  va_start(ap, fmt);
  vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

bool loom_str_ends_with(const char *s, const char *suffix) {
  const size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}
