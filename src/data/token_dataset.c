/* The token-file dataset: fixed windows over one or two llm.c token files. */
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "data/shuffle.h"
#include "data/token_file.h"

typedef struct {
  loom_token_file train_file, heldout_file; /* heldout_file empty when split from train */
  const loom_token_file *train_src, *heldout_src;
  int64_t train_first, train_windows;       /* window ranges in their source */
  int64_t heldout_first, heldout_windows;
  loom_data_order order;
  uint64_t seed;
  int T;
  int64_t perm_epoch; /* epoch whose permutation `perm` holds, -1 if none */
  int64_t *perm;
} token_ds;

/* The train windows in a Fisher-Yates order keyed by (seed, epoch). */
static void shuffle_epoch(token_ds *d, int64_t epoch) {
  loom_shuffle_identity(d->perm, d->train_windows, d->seed, loom_hash_u64(loom_hash_str("data/shuffle"), (uint64_t)epoch));
  d->perm_epoch = epoch;
}

static void token_window(loom_dataset *ds, loom_split split, int64_t g, int T, int *window, unsigned char *scored) {
  token_ds *d = ds->impl;
  LOOM_CHECK(T == d->T, "token dataset opened for another sequence length");
  const loom_token_file *src;
  int64_t w;
  if (split == LOOM_SPLIT_HELDOUT) {
    LOOM_CHECK(d->heldout_windows > 0, "this token dataset has no held-out split");
    src = d->heldout_src;
    w = d->heldout_first + g % d->heldout_windows;
  } else {
    src = d->train_src;
    const int64_t epoch = g / d->train_windows, k = g % d->train_windows;
    if (d->order == LOOM_ORDER_SHUFFLED && d->perm_epoch != epoch) shuffle_epoch(d, epoch);
    w = d->train_first + (d->order == LOOM_ORDER_SHUFFLED ? d->perm[k] : k);
  }
  const uint16_t *start = src->tokens + w * T;
  for (int t = 0; t <= T; t++) window[t] = start[t];
  memset(scored, 1, (size_t)T + 1);
}

static int64_t token_samples(const loom_dataset *ds, loom_split split) {
  const token_ds *d = ds->impl;
  return split == LOOM_SPLIT_HELDOUT ? d->heldout_windows : d->train_windows;
}

static void token_free(loom_dataset *ds) {
  token_ds *d = ds->impl;
  loom_token_file_free(&d->train_file);
  loom_token_file_free(&d->heldout_file);
  free(d->perm);
  free(d);
  free(ds);
}

static int64_t windows_in(const loom_token_file *f, int T) {
  return f->count > (size_t)T ? (int64_t)((f->count - 1) / (size_t)T) : 0;
}

loom_status loom_dataset_open_tokens(loom_dataset **out, const char *path, const char *heldout_path,
                                     int vocab, int T, loom_data_order order, uint64_t seed,
                                     bool hold_out_tail, loom_error *err) {
  *out = NULL;
  token_ds *d = loom_xcalloc(1, sizeof *d, "token dataset");
  d->order = order;
  d->seed = seed;
  d->T = T;
  d->perm_epoch = -1;
  loom_status st = loom_token_file_load(&d->train_file, path, vocab, err);
  if (st == LOOM_OK && heldout_path) st = loom_token_file_load(&d->heldout_file, heldout_path, vocab, err);
  if (st != LOOM_OK) goto fail;
  d->train_src = d->heldout_src = &d->train_file;
  const int64_t windows = windows_in(&d->train_file, T);
  if (heldout_path) {
    d->train_windows = windows;
    d->heldout_src = &d->heldout_file;
    d->heldout_windows = windows_in(&d->heldout_file, T);
    if (d->heldout_windows < 1) {
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: %zu tokens is too few for one window of --seq %d plus 1",
                     heldout_path, d->heldout_file.count, T);
      goto fail;
    }
  } else if (hold_out_tail) {
    d->heldout_windows = windows / 20 > 0 ? windows / 20 : 1;
    d->train_windows = windows - d->heldout_windows;
    d->heldout_first = d->train_windows;
  } else {
    d->train_windows = windows;
  }
  if (d->train_windows < 1) {
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: %zu tokens is too few for --seq %d (need %s of seq+1 tokens)",
                   path, d->train_file.count, T, heldout_path || !hold_out_tail ? "one window" : "two windows: train and held-out");
    goto fail;
  }
  if (order == LOOM_ORDER_SHUFFLED) d->perm = loom_xmalloc((size_t)d->train_windows * sizeof(int64_t), "shuffle");
  loom_dataset *ds = loom_xcalloc(1, sizeof *ds, "dataset");
  *ds = (loom_dataset){.name = "tokens", .window = token_window, .samples = token_samples, .free = token_free, .impl = d};
  *out = ds;
  return LOOM_OK;
fail:
  loom_token_file_free(&d->train_file);
  loom_token_file_free(&d->heldout_file);
  free(d);
  return st;
}

