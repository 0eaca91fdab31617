/* Failure path of the check macros and the checked allocators. */
#include <stdio.h>
#include <stdlib.h>
#include "core/check.h"

void loom_check_failed(const char *file, int line, const char *expr, const char *hint) {
  fprintf(stderr, "loom: internal check failed at %s:%d: %s (%s)\n", file, line, expr,
          hint ? hint : "no hint");
  fflush(stderr);
  abort();
}

void *loom_xrealloc(void *p, size_t bytes, const char *what) {
  void *grown = realloc(p, bytes ? bytes : 1);
  if (!grown) {
    fprintf(stderr, "loom: out of memory allocating %zu bytes for %s\n", bytes, what);
    exit(1);
  }
  return grown;
}

void *loom_xmalloc(size_t bytes, const char *what) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "loom: out of memory allocating %zu bytes for %s\n", bytes, what);
    exit(1);
  }
  return p;
}

void *loom_xcalloc(size_t count, size_t size, const char *what) {
  void *p = calloc(count ? count : 1, size ? size : 1);
  if (!p) {
    fprintf(stderr, "loom: out of memory allocating %zu x %zu bytes for %s\n", count, size, what);
    exit(1);
  }
  return p;
}
