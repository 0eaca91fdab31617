/* The cluster profiles built into loom: the .txtpb files of examples/clusters, compiled
 * in by scripts/embed_text.cmake (see CMakeLists.txt). */
#ifndef LOOM_PROFILE_BUILTIN_H
#define LOOM_PROFILE_BUILTIN_H

typedef struct {
  const char *name; /* the file's base name: "a100-80gb" */
  const char *text; /* its text format */
} loom_builtin_profile;

extern const loom_builtin_profile LOOM_BUILTIN_PROFILES[];
extern const int LOOM_BUILTIN_PROFILE_COUNT;

#endif
