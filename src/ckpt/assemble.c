/* Filling wanted checkpoint pieces from stored ones by global offsets. */
#include <stdlib.h>
#include <string.h>
#include "ckpt/assemble.h"
#include "core/fault.h"
#include "core/rng.h"

/* Global columns [*c0, *c1) that t holds in global row r (empty if none). */
static void row_span(const loom_shard_tensor *t, int64_t r, int64_t *c0, int64_t *c1) {
  const int64_t cols = t->local[1], at = (r - t->offset[0]) * cols; /* block index of (r, first column) */
  int64_t lo = at > t->first ? at : t->first, hi = at + cols < t->first + t->count ? at + cols : t->first + t->count;
  *c0 = t->offset[1] + (lo - at);
  *c1 = t->offset[1] + (hi - at);
  if (r < t->offset[0] || r >= t->offset[0] + t->local[0] || hi <= lo) *c0 = *c1 = 0;
}

/* Index into t->data of global element (r, c), which t holds. */
static int64_t index_of(const loom_shard_tensor *t, int64_t r, int64_t c) {
  return (r - t->offset[0]) * t->local[1] + (c - t->offset[1]) - t->first;
}

/* Rows of t's block, clipped to [0, rows). */
static void row_range(const loom_shard_tensor *t, int64_t rows, int64_t *r0, int64_t *r1) {
  *r0 = t->offset[0];
  *r1 = t->offset[0] + t->local[0] < rows ? t->offset[0] + t->local[0] : rows;
}

/* Copies what stored piece `have` holds of w; returns the elements copied. */
static int64_t copy_overlap(const loom_shard_tensor *have, loom_shard_tensor *w) {
  int64_t r0, r1, copied = 0;
  row_range(w, have->global[0], &r0, &r1);
  if (have->offset[0] > r0) r0 = have->offset[0];
  if (have->offset[0] + have->local[0] < r1) r1 = have->offset[0] + have->local[0];
  for (int64_t r = r0; r < r1; r++) {
    int64_t a0, a1, b0, b1;
    row_span(have, r, &a0, &a1);
    row_span(w, r, &b0, &b1);
    const int64_t c0 = a0 > b0 ? a0 : b0, c1 = a1 < b1 ? a1 : b1;
    if (c1 <= c0) continue;
    memcpy(w->data + index_of(w, r, c0), have->data + index_of(have, r, c0), (size_t)(c1 - c0) * sizeof(float));
    copied += c1 - c0;
  }
  return copied;
}

/* Elements of w in rows below `rows`: what a checkpoint of that many rows must supply. */
static int64_t needed(const loom_shard_tensor *w, int64_t rows) {
  int64_t r0, r1, n = 0;
  row_range(w, rows, &r0, &r1);
  for (int64_t r = r0; r < r1; r++) {
    int64_t c0, c1;
    row_span(w, r, &c0, &c1);
    n += c1 - c0;
  }
  return n;
}

/* Whether the blocks of a and b share an element (their runs may still miss each other). */
static bool blocks_overlap(const loom_shard_tensor *a, const loom_shard_tensor *b) {
  for (int d = 0; d < 2; d++)
    if (a->offset[d] >= b->offset[d] + b->local[d] || b->offset[d] >= a->offset[d] + a->local[d]) return false;
  return a->count > 0 && b->count > 0;
}

/* Zeroes what w holds in rows at or past `rows` (vocab padding the checkpoint lacks). */
static void zero_rows_from(loom_shard_tensor *w, int64_t rows) {
  for (int64_t r = rows > w->offset[0] ? rows : w->offset[0]; r < w->offset[0] + w->local[0]; r++) {
    int64_t c0, c1;
    row_span(w, r, &c0, &c1);
    if (c1 > c0) memset(w->data + index_of(w, r, c0), 0, (size_t)(c1 - c0) * sizeof(float));
  }
}

static bool same_piece(const loom_shard_tensor *a, const loom_shard_tensor *b) {
  return a->global[0] == b->global[0] && a->offset[0] == b->offset[0] && a->offset[1] == b->offset[1] &&
         a->local[0] == b->local[0] && a->local[1] == b->local[1] && a->first == b->first && a->count == b->count;
}

static bool same_name(const loom_shard_tensor *a, const loom_shard_tensor *b) { return strcmp(a->name, b->name) == 0; }

/* Whether stored piece h has the shape of w's tensor: equal, or for a vocab-padded tensor equal in its valid rows. */
static bool shape_fits(const loom_shard_tensor *h, const loom_ckpt_want *w) {
  const bool padded = w->valid_rows < w->t.global[0] || h->global[0] > w->t.global[0];
  return h->ndim == 2 && h->global[1] == w->t.global[1] &&
         (h->global[0] == w->t.global[0] || (w->padded && padded && h->global[0] >= w->valid_rows));
}

/* Open addressing on the name hash; several wants may share a name. */
struct loom_want_index {
  const loom_ckpt_want *want;
  int *slot; /* want index + 1, 0 when empty */
  size_t mask;
};

/* The probe sequence of a name: start at its hash, step while slots are full. */
static size_t first_slot(const loom_want_index *ix, const char *name) { return loom_hash_str(name) & ix->mask; }
static size_t next_slot(const loom_want_index *ix, size_t h) { return (h + 1) & ix->mask; }

loom_want_index *loom_want_index_build(const loom_ckpt_want *want, int nwant) {
  loom_want_index *ix = calloc(1, sizeof *ix);
  size_t cap = 16;
  while (cap < 2 * (size_t)nwant) cap *= 2;
  ix->want = want;
  ix->mask = cap - 1;
  ix->slot = calloc(cap, sizeof *ix->slot);
  for (int i = 0; i < nwant; i++) {
    size_t h = first_slot(ix, want[i].t.name);
    while (ix->slot[h]) h = next_slot(ix, h);
    ix->slot[h] = i + 1;
  }
  return ix;
}

bool loom_want_index_needs(const loom_want_index *ix, const loom_shard_tensor *stored) {
  for (size_t h = first_slot(ix, stored->name); ix->slot[h]; h = next_slot(ix, h)) {
    const loom_ckpt_want *w = &ix->want[ix->slot[h] - 1];
    if (same_name(stored, &w->t) && blocks_overlap(stored, &w->t)) return true;
  }
  return false;
}

void loom_want_index_free(loom_want_index *ix) {
  if (!ix) return;
  free(ix->slot);
  free(ix);
}

struct loom_assembly {
  loom_ckpt_want *want;
  int nwant;
  loom_want_index *index;       /* stored pieces find their wants by name */
  int64_t *copied, *stored_rows; /* [nwant]: elements filled; the store's rows of each want's tensor */
};

loom_assembly *loom_assembly_begin(loom_ckpt_want *want, int nwant) {
  loom_assembly *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  *a = (loom_assembly){want, nwant, loom_want_index_build(want, nwant), calloc((size_t)nwant + 1, sizeof(int64_t)),
                       calloc((size_t)nwant + 1, sizeof(int64_t))};
  if (a->index && a->copied && a->stored_rows) return a;
  loom_want_index_free(a->index);
  free(a->copied);
  free(a->stored_rows);
  free(a);
  return NULL;
}

loom_status loom_assembly_add(loom_assembly *a, const loom_piece_source *src, loom_error *err) {
  const loom_want_index *wx = a->index;
  loom_ckpt_want *want = a->want;
  loom_status st = LOOM_OK;
  for (int j = 0; st == LOOM_OK && j < src->count; j++) {
    loom_shard_tensor have = src->pieces[j];
    bool loaded = false;
    for (size_t h = first_slot(wx, have.name); st == LOOM_OK && wx->slot[h]; h = next_slot(wx, h)) {
      const int i = wx->slot[h] - 1;
      if (!same_name(&have, &want[i].t)) continue;
      if (!shape_fits(&have, &want[i])) {
        st = loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s is [%lld, %lld] there, [%lld, %lld] in this model", src->where,
                       have.name, (long long)have.global[0], (long long)have.global[1], (long long)want[i].t.global[0],
                       (long long)want[i].t.global[1]);
        break;
      }
      a->stored_rows[i] = have.global[0];
      if (!blocks_overlap(&have, &want[i].t)) continue;
      if (same_piece(&have, &want[i].t)) { /* the same plan's piece: read straight into place */
        st = src->load(src, j, want[i].t.data, err);
        a->copied[i] += have.count;
        continue;
      }
      if (!loaded) {
        have.data = loom_fault_malloc(have.count ? (size_t)have.count * sizeof(float) : 1);
        st = have.data ? src->load(src, j, have.data, err) : loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", src->where);
        loaded = true;
      }
      if (st == LOOM_OK) a->copied[i] += copy_overlap(&have, &want[i].t);
    }
    if (loaded) free(have.data);
  }
  return st;
}

loom_status loom_assembly_finish(loom_assembly *a, loom_status st, const char *what, loom_error *err) {
  for (int i = 0; st == LOOM_OK && i < a->nwant; i++) zero_rows_from(&a->want[i].t, a->stored_rows[i]);
  for (int i = 0; st == LOOM_OK && i < a->nwant; i++) {
    const loom_ckpt_want *w = &a->want[i];
    const int64_t need = a->stored_rows[i] ? needed(&w->t, a->stored_rows[i]) : w->t.count;
    if (a->copied[i] != need)
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s holds %lld of the %lld elements of %s this rank needs%s", what,
                     (long long)a->copied[i], (long long)need, w->t.name,
                     a->copied[i] > need ? " (pieces overlap)" : a->stored_rows[i] ? "" : " (no such tensor)");
  }
  loom_want_index_free(a->index);
  free(a->copied);
  free(a->stored_rows);
  free(a);
  return st;
}

static loom_status load_shard_piece(const loom_piece_source *s, int i, float *dst, loom_error *err) {
  return loom_shard_index_load(s->ctx, i, dst, err);
}

loom_status loom_ckpt_assemble(const char *dir, char *const *paths, int npaths, loom_ckpt_want *want, int nwant,
                               loom_error *err) {
  loom_assembly *a = loom_assembly_begin(want, nwant);
  if (!a) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory loading the checkpoint", dir);
  loom_status st = LOOM_OK;
  for (int f = 0; st == LOOM_OK && f < npaths; f++) {
    loom_shard_index ix;
    st = loom_shard_index_open(paths[f], &ix, err);
    const loom_piece_source src = {.where = paths[f], .count = ix.count, .pieces = ix.tensors, .load = load_shard_piece,
                                   .ctx = &ix};
    if (st == LOOM_OK) st = loom_assembly_add(a, &src, err);
    if (ix.fp) loom_shard_index_close(&ix);
  }
  char what[4200];
  snprintf(what, sizeof what, "%s: the checkpoint", dir);
  return loom_assembly_finish(a, st, what, err);
}
