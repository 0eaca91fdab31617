/* Megatron-LM's flag names, as a team moving to loom types them: those
 * loom implements are aliases of its own flags (the parser takes either,
 * --help shows both); any other Megatron-LM flag is refused by name, never
 * ignored. */
#ifndef LOOM_MEGATRON_FLAGS_H
#define LOOM_MEGATRON_FLAGS_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
  const char *megatron; /* "--tensor-model-parallel-size" */
  const char *loom;     /* the loom flag it sets ("--tp"); NULL: a switch that says what loom does anyway */
  const char *value;    /* a Megatron switch: the value it gives loom's flag ("" for a loom switch); NULL: takes one */
} loom_megatron_alias;

/* NULL-terminated. */
extern const loom_megatron_alias LOOM_MEGATRON_ALIASES[];
/* The alias named by name[0..len), or NULL. */
const loom_megatron_alias *loom_megatron_alias_of(const char *name, size_t len);
/* Whether name[0..len) is one of Megatron-LM's flags (its arguments.py). */
bool loom_megatron_flag(const char *name, size_t len);

#endif
