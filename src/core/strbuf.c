/* Growing strings. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include "core/check.h"
#include "core/strbuf.h"

void loom_strbuf_printf(loom_strbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (b->len + (size_t)n + 1 > b->cap) {
    b->cap = (b->len + (size_t)n + 1) * 2;
    b->buf = realloc(b->buf, b->cap);
    LOOM_CHECK(b->buf != NULL, "out of memory building text");
  }
  va_start(ap, fmt);
  vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}
