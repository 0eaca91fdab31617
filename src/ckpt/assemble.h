/* Loading by global offsets: fills the pieces a rank wants from whichever
 * shard files hold them, whatever plan wrote them. Only the pieces that
 * overlap what is wanted are read, each checked against its CRC; every
 * wanted element must be found exactly once (rows past the checkpoint's
 * vocab padding, and only those, start at zero). */
#ifndef LOOM_ASSEMBLE_H
#define LOOM_ASSEMBLE_H

#include "ckpt/ckpt_tensors.h"

/* The wanted pieces by name, to tell quickly whether a stored piece (from a
 * manifest's list) overlaps any of them: which shard files to open. */
typedef struct loom_want_index loom_want_index;
loom_want_index *loom_want_index_build(const loom_ckpt_want *want, int nwant);
bool loom_want_index_needs(const loom_want_index *ix, const loom_shard_tensor *stored);
void loom_want_index_free(loom_want_index *ix);

/* Stored pieces to fill wants from: a shard file's, or a whole model's
 * tensors (a model file, a model in memory). pieces[i].data is NULL; load
 * reads piece i's values. */
typedef struct loom_piece_source {
  const char *where; /* names the store in errors */
  int count;
  const loom_shard_tensor *pieces;
  loom_status (*load)(const struct loom_piece_source *s, int i, float *dst, loom_error *err);
  void *ctx;
} loom_piece_source;

/* Filling wants from any number of sources, one open at a time: begin
 * (NULL when out of memory), add each source, then finish, which checks that
 * every wanted element was found exactly once (what names the store) and
 * frees the assembly; st is the status so far. */
typedef struct loom_assembly loom_assembly;
loom_assembly *loom_assembly_begin(loom_ckpt_want *want, int nwant);
loom_status loom_assembly_add(loom_assembly *a, const loom_piece_source *src, loom_error *err);
loom_status loom_assembly_finish(loom_assembly *a, loom_status st, const char *what, loom_error *err);

/* paths: the checkpoint's shard files; dir names the checkpoint in errors. */
loom_status loom_ckpt_assemble(const char *dir, char *const *paths, int npaths, loom_ckpt_want *want, int nwant,
                               loom_error *err);

#endif
