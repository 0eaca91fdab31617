/* --data as Megatron reads it: one indexed dataset, or a blend
 * "W1 PREFIX1 W2 PREFIX2 ...", each split by --split into train, held-out
 * and test documents; or one llm.c token file. */
#include <ctype.h>
#include <fenv.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "data/gpt_samples.h"

#define MAX_PARTS 64
#define CHECKPOINT_EVERY 4096 /* blending counts kept every this many samples */

typedef struct {
  char *prefix;
  double weight;
  loom_indexed ix;
  gpt_samples split[2]; /* train, held-out */
  bool has[2];
} part;

/* Megatron's blending order for one split: sample g goes to the part whose
 * count lags its share the most. Counts before g are walked from the nearest
 * kept checkpoint, so sequential reads cost O(parts) each. */
typedef struct {
  int64_t pos, *counts;      /* counts of samples before pos */
  int64_t *kept;             /* [nkept * nparts]: counts at positions k * CHECKPOINT_EVERY */
  int64_t nkept, cap;
} blend_cursor;

typedef struct {
  part *parts[2][MAX_PARTS]; /* per split: the parts it draws from (held-out may be --eval-data's) */
  double weights[2][MAX_PARTS];
  int nparts[2];
  part *owned[2 * MAX_PARTS];
  int nowned;
  blend_cursor cursor[2];
  int T;
} blended;

static int pick(const blended *b, int split, const int64_t *counts, int64_t g) {
  const double at = g > 1 ? (double)g : 1.0;
  int best = 0;
  double best_err = -INFINITY;
  for (int i = 0; i < b->nparts[split]; i++) {
    const double e = b->weights[split][i] * at - (double)counts[i];
    if (e > best_err) best_err = e, best = i;
  }
  return best;
}

/* Moves the cursor to g: counts then holds each part's samples before g. */
static void seek(blended *b, int split, int64_t g) {
  blend_cursor *c = &b->cursor[split];
  const int n = b->nparts[split];
  if (g < c->pos || g - c->pos > CHECKPOINT_EVERY) {
    const int64_t k = g / CHECKPOINT_EVERY < c->nkept ? g / CHECKPOINT_EVERY : c->nkept - 1;
    memcpy(c->counts, c->kept + k * n, (size_t)n * sizeof *c->counts);
    c->pos = k * CHECKPOINT_EVERY;
  }
  while (c->pos < g) {
    c->counts[pick(b, split, c->counts, c->pos)]++;
    c->pos++;
    if (c->pos % CHECKPOINT_EVERY == 0 && c->pos / CHECKPOINT_EVERY == c->nkept) {
      if (c->nkept == c->cap) {
        c->cap *= 2;
        c->kept = realloc(c->kept, (size_t)(c->cap * n) * sizeof *c->kept);
        LOOM_CHECK(c->kept != NULL, "out of memory blending datasets");
      }
      memcpy(c->kept + c->nkept * n, c->counts, (size_t)n * sizeof *c->counts);
      c->nkept++;
    }
  }
}

static void blended_window(loom_dataset *ds, loom_split split, int64_t g, int T, int *window, unsigned char *scored) {
  blended *b = ds->impl;
  LOOM_CHECK(T == b->T, "dataset opened for another sequence length");
  LOOM_CHECK(b->nparts[split] > 0, "this dataset has no held-out split");
  int i = 0;
  int64_t k = g;
  if (b->nparts[split] > 1) {
    seek(b, (int)split, g);
    i = pick(b, (int)split, b->cursor[split].counts, g);
    k = b->cursor[split].counts[i];
  }
  gpt_samples_window(&b->parts[split][i]->split[split], k, window);
  memset(scored, 1, (size_t)T + 1);
}

static void blended_describe(loom_dataset *ds, int64_t samples, char *buf, size_t cap) {
  blended *b = ds->impl;
  const int n = b->nparts[LOOM_SPLIT_TRAIN];
  size_t at = 0;
  if (n > 1) seek(b, LOOM_SPLIT_TRAIN, samples);
  for (int i = 0; i < n && at < cap; i++) {
    const part *p = b->parts[LOOM_SPLIT_TRAIN][i];
    const int64_t got = n > 1 ? b->cursor[LOOM_SPLIT_TRAIN].counts[i] : samples;
    at += (size_t)snprintf(buf + at, cap - at, "%s%s: weight %.4f, %lld of %lld samples (%.2f%%), %.3g epochs of %lld", i ? "; " : "",
                           p->prefix, b->weights[LOOM_SPLIT_TRAIN][i], (long long)got, (long long)samples,
                           samples ? 100.0 * (double)got / (double)samples : 0.0,
                           (double)got / (double)p->split[LOOM_SPLIT_TRAIN].samples, (long long)p->split[LOOM_SPLIT_TRAIN].samples);
  }
}

static int64_t blended_samples(const loom_dataset *ds, loom_split split) {
  const blended *b = ds->impl;
  int64_t n = 0;
  for (int i = 0; i < b->nparts[split]; i++) n += b->parts[split][i]->split[split].samples;
  return n;
}

static void part_free(part *p) {
  if (!p) return;
  for (int s = 0; s < 2; s++)
    if (p->has[s]) gpt_samples_free(&p->split[s]);
  loom_indexed_close(&p->ix);
  free(p->prefix);
  free(p);
}

static void blended_free(loom_dataset *ds) {
  blended *b = ds->impl;
  for (int i = 0; i < b->nowned; i++) part_free(b->owned[i]);
  for (int s = 0; s < 2; s++) {
    free(b->cursor[s].counts);
    free(b->cursor[s].kept);
  }
  free(b);
  free(ds);
}

loom_status loom_data_split_bounds(const char *split, int64_t docs, int64_t bounds[4], loom_error *err) {
  double w[3] = {0, 0, 0}, sum = 0;
  const char *at = split;
  int n = 0;
  for (; n < 3; n++) {
    char *end;
    w[n] = strtod(at, &end);
    if (end == at || !(w[n] >= 0) || !isfinite(w[n])) break;
    sum += w[n];
    at = end;
    if (*at != ',') {
      n++;
      break;
    }
    at++;
  }
  if (*at || n == 0 || !(sum > 0))
    return loom_fail(err, LOOM_ERR_USAGE, "--split \"%s\": expected up to 3 comma-separated shares >= 0, not all 0 (train,held-out,test)", split);
  const int saved = fegetround();
  fesetround(FE_TONEAREST);
  bounds[0] = 0;
  for (int i = 0; i < 3; i++) bounds[i + 1] = bounds[i] + (int64_t)nearbyint(w[i] / sum * (double)docs);
  fesetround(saved);
  const int64_t diff = bounds[3] - docs;
  for (int i = 1; i < 4; i++) bounds[i] -= diff;
  return LOOM_OK;
}

/* Parses "PREFIX" or "W1 PREFIX1 W2 PREFIX2 ..." into words; weights default to 1. */
static loom_status parse_spec(const char *flag, const char *spec, char **prefixes, double *weights, int *n, loom_error *err) {
  char *words[2 * MAX_PARTS + 1];
  int nw = 0;
  char *copy = loom_xmalloc(strlen(spec) + 1, "data spec");
  strcpy(copy, spec);
  for (char *tok = strtok(copy, " \t\n"); tok; tok = strtok(NULL, " \t\n")) {
    if (nw == 2 * MAX_PARTS + 1) break;
    words[nw++] = tok;
  }
  loom_status st = LOOM_OK;
  *n = 0;
  if (nw == 1) {
    prefixes[0] = strdup(words[0]);
    weights[0] = 1;
    *n = 1;
  } else if (nw == 0 || nw % 2 || nw > 2 * MAX_PARTS) {
    st = loom_fail(err, LOOM_ERR_USAGE, "%s \"%s\": expected PREFIX or \"W1 PREFIX1 W2 PREFIX2 ...\" (at most %d datasets)", flag, spec, MAX_PARTS);
  } else {
    for (int i = 0; i < nw / 2 && st == LOOM_OK; i++) {
      char *end;
      weights[i] = strtod(words[2 * i], &end);
      if (*end || !(weights[i] > 0) || !isfinite(weights[i]))
        st = loom_fail(err, LOOM_ERR_USAGE, "%s: weight \"%s\" of %s is not a number > 0", flag, words[2 * i], words[2 * i + 1]);
      prefixes[i] = strdup(words[2 * i + 1]);
      *n = i + 1;
    }
  }
  free(copy);
  return st;
}

/* Opens the parts of spec; with split, each gets train and held-out ranges,
 * else all of it is held-out (--eval-data). */
static loom_status open_parts(blended *b, const char *flag, const char *spec, const loom_data_options *o, bool eval_only, loom_error *err) {
  char *prefixes[MAX_PARTS];
  double weights[MAX_PARTS];
  int n;
  loom_status st = parse_spec(flag, spec, prefixes, weights, &n, err);
  /* Scaled by the largest first, so weights near DBL_MAX sum without overflow. */
  double largest = 0, total = 0;
  for (int i = 0; i < n; i++) largest = weights[i] > largest ? weights[i] : largest;
  for (int i = 0; i < n; i++) total += weights[i] / largest;
  for (int i = 0; i < n; i++) {
    part *p = loom_xcalloc(1, sizeof *p, "dataset part");
    p->prefix = prefixes[i];
    p->weight = weights[i] / largest / total;
    b->owned[b->nowned++] = p;
    if (st == LOOM_OK && !(p->weight > 0))
      st = loom_fail(err, LOOM_ERR_USAGE, "%s: weight %g of %s is too small beside the others (%g) to be drawn from", flag,
                     weights[i], p->prefix, largest);
    if (st == LOOM_OK && !loom_indexed_exists(p->prefix))
      st = loom_fail(err, LOOM_ERR_USAGE, "%s: no %s.idx (a blend names Megatron indexed datasets by prefix)", flag, p->prefix);
    if (st == LOOM_OK) st = loom_indexed_open(&p->ix, p->prefix, o->vocab, err);
    int64_t bounds[4] = {0, 0, p->ix.sequences, p->ix.sequences};
    if (st == LOOM_OK && !eval_only) st = loom_data_split_bounds(o->split, p->ix.sequences, bounds, err);
    const uint64_t stream = loom_hash_u64(loom_hash_str(eval_only ? "data/eval" : "data/blend"), (uint64_t)i);
    for (int s = 0; s < 2 && st == LOOM_OK; s++) {
      if (eval_only && s == LOOM_SPLIT_TRAIN) continue;
      p->has[s] = gpt_samples_init(&p->split[s], &p->ix, bounds[s], bounds[s + 1] - bounds[s], o->T, o->shuffle,
                                   o->seed, loom_hash_u64(stream, (uint64_t)s));
      if (!p->has[s] && s == LOOM_SPLIT_TRAIN)
        st = loom_fail(err, LOOM_ERR_USAGE, "%s: its train split (%lld of %lld documents, %lld tokens) holds no sample of --seq %d plus 1",
                       p->prefix, (long long)p->split[s].docs, (long long)p->ix.sequences, (long long)p->split[s].tokens, o->T);
      if (p->has[s]) {
        b->parts[s][b->nparts[s]] = p;
        b->weights[s][b->nparts[s]++] = p->weight;
      }
    }
  }
  return st;
}

bool loom_data_is_indexed(const char *spec) {
  return strchr(spec, ' ') != NULL || loom_indexed_exists(spec);
}

loom_status loom_dataset_open(loom_dataset **out, const loom_data_options *o, loom_error *err) {
  *out = NULL;
  /* Held-out data of the training data's kind: a token file beside a token
   * file, indexed data beside indexed data (each read as its own kind). */
  if (o->eval_data && loom_data_is_indexed(o->eval_data) != loom_data_is_indexed(o->data)) {
    const bool indexed = loom_data_is_indexed(o->data);
    return loom_fail(err, LOOM_ERR_USAGE, "--eval-data %s: %s, but --data %s is %s; give held-out data of the same kind",
                     o->eval_data, indexed ? "not an indexed dataset (no PREFIX.idx) nor a blend" : "is an indexed dataset",
                     o->data, indexed ? "indexed" : "an llm.c token file");
  }
  if (!loom_data_is_indexed(o->data))
    return loom_dataset_open_tokens(out, o->data, o->eval_data, o->vocab, o->T, o->shuffle ? LOOM_ORDER_SHUFFLED : LOOM_ORDER_SEQUENTIAL,
                                    o->seed, true, err);
  blended *b = loom_xcalloc(1, sizeof *b, "dataset");
  b->T = o->T;
  loom_status st = open_parts(b, "--data", o->data, o, false, err);
  if (st == LOOM_OK && o->eval_data) {
    b->nparts[LOOM_SPLIT_HELDOUT] = 0;
    st = open_parts(b, "--eval-data", o->eval_data, o, true, err);
  }
  if (st == LOOM_OK && o->hold_out && b->nparts[LOOM_SPLIT_HELDOUT] == 0)
    st = loom_fail(err, LOOM_ERR_USAGE, "--split %s leaves no held-out sample of --seq %d plus 1 in %s (give --eval-data, another --split, or --eval-every 0)",
                   o->split, o->T, o->data);
  for (int s = 0; s < 2 && st == LOOM_OK; s++) {
    if (b->nparts[s] < 2) continue;
    double total = 0; /* the held-out split may lack a part: its weights renormalised */
    for (int i = 0; i < b->nparts[s]; i++) total += b->weights[s][i];
    for (int i = 0; i < b->nparts[s]; i++) b->weights[s][i] /= total;
    blend_cursor *c = &b->cursor[s];
    c->counts = loom_xcalloc((size_t)b->nparts[s], sizeof *c->counts, "blend counts");
    c->cap = 64;
    c->kept = loom_xcalloc((size_t)(c->cap * b->nparts[s]), sizeof *c->kept, "blend counts");
    c->nkept = 1;
  }
  loom_dataset *ds = loom_xcalloc(1, sizeof *ds, "dataset");
  *ds = (loom_dataset){.name = "indexed", .window = blended_window, .describe = blended_describe, .samples = blended_samples, .free = blended_free, .impl = b};
  if (st != LOOM_OK) {
    blended_free(ds);
    return st;
  }
  *out = ds;
  return LOOM_OK;
}
