/* Check macros for broken invariants (contract violations, not user input).
 * They stay on in release builds, print file:line, what failed and a hint,
 * then abort the program. */
#ifndef LOOM_CHECK_H
#define LOOM_CHECK_H

#include <stddef.h>
#include <stdnoreturn.h>

noreturn void loom_check_failed(const char *file, int line, const char *expr, const char *hint);

#define LOOM_CHECK(cond, hint)                                                  \
  do {                                                                          \
    if (!(cond)) loom_check_failed(__FILE__, __LINE__, #cond, (hint));         \
  } while (0)

/* Allocation that must not fail (invariant-sized buffers); names what it was for. */
void *loom_xmalloc(size_t bytes, const char *what);
void *loom_xcalloc(size_t count, size_t size, const char *what);
void *loom_xrealloc(void *p, size_t bytes, const char *what);

#endif
