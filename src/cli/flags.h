/* Table-driven flag parsing: one table per subcommand gives each flag's name,
 * type, destination, range and help, so --help and the parser can never
 * disagree. Errors are one line naming the flag and why. */
#ifndef LOOM_FLAGS_H
#define LOOM_FLAGS_H

#include <stdbool.h>
#include <stdio.h>
#include "core/status.h"

typedef enum { FLAG_INT, FLAG_INT64, FLAG_FLOAT, FLAG_STRING, FLAG_BOOL } loom_flag_kind;

typedef struct {
  const char *name;             /* "--lr" */
  loom_flag_kind kind;
  void *dst;                    /* int*, int64_t*, float*, const char**, bool* */
  const char *help;
  double min, max;              /* inclusive range for numbers; ignored if min > max */
  const char *const *choices;   /* NULL-terminated allowed strings, or NULL */
  bool set;                     /* filled by the parser: the user gave this flag */
  const char *field;            /* the plan field this flag sets ("parallel.tp"), or NULL */
} loom_flag;

#define LOOM_NO_RANGE 1, 0

/* Parses argv[0..argc) against flags. Non-flag words go to positional (at
 * most max_positional). Returns LOOM_ERR_USAGE with a message on bad input;
 * sets *help if -h/--help was given. */
loom_status loom_flags_parse(const char *cmd, loom_flag *flags, int nflags, int argc, char **argv,
                             const char **positional, int max_positional, int *npositional,
                             bool *help, loom_error *err);
void loom_flags_print_help(FILE *fp, const char *usage, const loom_flag *flags, int nflags);
/* The flag named `name` in the table (for checking .set). */
const loom_flag *loom_flags_find(const loom_flag *flags, int nflags, const char *name);
/* The index of value among a flag's choices (which the parser checked), 0 if absent. */
int loom_flag_choice_index(const char *const *choices, const char *value);

#endif
