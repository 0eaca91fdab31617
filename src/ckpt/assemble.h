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

/* paths: the checkpoint's shard files; dir names the checkpoint in errors. */
loom_status loom_ckpt_assemble(const char *dir, char *const *paths, int npaths, loom_ckpt_want *want, int nwant,
                               loom_error *err);

#endif
