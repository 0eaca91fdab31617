/* Synthetic multi-digit addition, written as text. */
#include <stdlib.h>
#include "core/check.h"
#include "core/rng.h"
#include "data/addition.h"

typedef struct {
  int digits;
  uint64_t seed;
  int64_t limit; /* 10^digits */
} addition_ds;

static int64_t pow10i(int e) {
  int64_t r = 1;
  while (e-- > 0) r *= 10;
  return r;
}

static int line_length(int digits) { return 3 * digits + 4; }

int loom_addition_first_target(int digits) { return 2 * digits + 2; } /* after "a+b=" */

static int is_heldout(const addition_ds *d, int64_t a, int64_t b) {
  const uint64_t h = loom_hash_u64(loom_hash_u64(d->seed ^ 0xADD, (uint64_t)a), (uint64_t)b);
  return h % 10 == 0;
}

/* Problem k of sample g: draws pairs until one lands in the wanted split. */
static void draw_pair(const addition_ds *d, loom_split split, int64_t g, int k, int64_t *a, int64_t *b) {
  const uint64_t stream = loom_hash_u64(loom_hash_str("data/addition"), (uint64_t)split);
  for (uint64_t attempt = 0;; attempt++) {
    const uint64_t idx = (((uint64_t)g * 1024u + (uint64_t)k) * 64u + attempt) * 2u;
    *a = (int64_t)(loom_rng_u32(d->seed, stream, idx) % (uint64_t)d->limit);
    *b = (int64_t)(loom_rng_u32(d->seed, stream, idx + 1) % (uint64_t)d->limit);
    if (is_heldout(d, *a, *b) == (split == LOOM_SPLIT_HELDOUT)) return;
  }
}

/* Writes "a+b=rev(a+b)\n" with fixed widths; returns its length. */
static int write_line(int *out, int64_t a, int64_t b, int digits) {
  int n = 0;
  for (int i = digits - 1; i >= 0; i--, n++) out[n] = '0' + (int)(a / pow10i(i) % 10);
  out[n++] = '+';
  for (int i = digits - 1; i >= 0; i--, n++) out[n] = '0' + (int)(b / pow10i(i) % 10);
  out[n++] = '=';
  int64_t sum = a + b;
  for (int i = 0; i <= digits; i++, sum /= 10) out[n++] = '0' + (int)(sum % 10);
  out[n++] = '\n';
  return n;
}

static void addition_window(loom_dataset *ds, loom_split split, int64_t g, int T, int *window,
                            unsigned char *scored) {
  const addition_ds *d = ds->impl;
  const int len = line_length(d->digits), answer = loom_addition_first_target(d->digits);
  int line[64];
  for (int pos = 0, k = 0; pos <= T; k++) {
    int64_t a, b;
    draw_pair(d, split, g, k, &a, &b);
    write_line(line, a, b, d->digits);
    for (int i = 0; i < len && pos <= T; i++, pos++) {
      window[pos] = line[i];
      scored[pos] = i >= answer; /* the sum and its newline; the operands are random */
    }
  }
}

static void addition_free(loom_dataset *ds) {
  free(ds->impl);
  free(ds);
}

loom_dataset *loom_dataset_addition(int digits, uint64_t seed) {
  LOOM_CHECK(digits >= 1 && digits <= 9, "addition digits in [1, 9]");
  addition_ds *d = loom_xcalloc(1, sizeof *d, "addition dataset");
  d->digits = digits;
  d->seed = seed;
  d->limit = pow10i(digits);
  loom_dataset *ds = loom_xcalloc(1, sizeof *ds, "dataset");
  *ds = (loom_dataset){.name = "addition", .window = addition_window, .free = addition_free, .impl = d};
  return ds;
}

void loom_addition_score(const int *window, const int *predicted, int T, int digits,
                         int *problems, int *correct) {
  *problems = 0;
  *correct = 0;
  for (int e = 0; e + digits + 1 <= T; e++) {
    if (window[e] != '=') continue;
    /* Answer digits window[e+1 .. e+digits+1] are predicted at rows e .. e+digits. */
    int ok = 1;
    for (int i = 0; i <= digits; i++) ok &= predicted[e + i] == window[e + 1 + i];
    (*problems)++;
    *correct += ok;
  }
}
