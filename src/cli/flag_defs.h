/* The flags more than one command takes, each defined once: its name, type,
 * range, choices and plan field. A command's table binds a definition to
 * its own variable (and, where the flag means something narrower there, its
 * own help line); the kind and bounds stay the definition's, so --tp can
 * never take 4096 in one command and 1024 in another. Flags one command
 * alone takes stay in its table. tests/flags_once.sh checks that no flag
 * name is defined twice across the CLI. */
#ifndef LOOM_FLAG_DEFS_H
#define LOOM_FLAG_DEFS_H

#include "cli/flags.h"

/* The definition of `name`, bound to dst. */
loom_flag loom_flag_def(const char *name, void *dst);
/* The same with this command's help line. */
loom_flag loom_flag_def_as(const char *name, void *dst, const char *help);

#endif
