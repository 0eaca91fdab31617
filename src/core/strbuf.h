/* A growing, NUL-terminated string: text built piece by piece (the text
 * format's printer, calibration notes). Out of memory ends the program, as
 * loom_xmalloc does. */
#ifndef LOOM_STRBUF_H
#define LOOM_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
  char *buf; /* NULL until the first append; the caller frees it */
  size_t len, cap;
} loom_strbuf;

/* Appends n bytes (which may hold NULs). */
void loom_strbuf_append(loom_strbuf *b, const void *data, size_t n);
void loom_strbuf_printf(loom_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Whether s ends with suffix (a file's extension). */
bool loom_str_ends_with(const char *s, const char *suffix);

#endif
