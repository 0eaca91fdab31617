/* Which layers each pipeline stage holds. Every layer must be covered exactly
 * once; that is checked here, before any rank builds anything. */
#ifndef LOOM_LAYER_SPLIT_H
#define LOOM_LAYER_SPLIT_H

#include "core/status.h"

/* begin[stages + 1]: virtual stage s holds layers [begin[s], begin[s+1]).
 * counts (ncounts entries, or NULL) gives each stage's layer count; without
 * it layers are spread evenly, earlier stages taking the remainder. */
loom_status loom_layer_split(int layers, int stages, const int *counts, int ncounts, int *begin, loom_error *err);
/* Parses "7,8,8,7" into counts (at most max entries); returns how many, or -1. */
int loom_layer_split_parse(const char *text, int *counts, int max);

#endif
