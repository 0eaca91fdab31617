/* Byte-level BPE: the tables, splitting, merging and decoding. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "data/bpe_impl.h"

/* ---- hashing ---- */

uint64_t bpe_mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  return h ^ (h >> 33);
}

uint64_t bpe_hash_bytes(const void *bytes, size_t n) {
  const unsigned char *p = bytes;
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ n;
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = bpe_mix(h ^ w);
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  memcpy(&w, p, n);
  return bpe_mix(h ^ w ^ (uint64_t)n << 56);
}

static size_t table_size(size_t entries) {
  size_t n = 16;
  while (n < entries * 2) n *= 2;
  return n;
}

/* ---- building ---- */

loom_bpe *bpe_new(int vocab) {
  loom_bpe *t = loom_xcalloc(1, sizeof *t, "tokenizer");
  t->vocab = vocab;
  t->off = loom_xmalloc((size_t)vocab * sizeof *t->off, "tokenizer offsets");
  t->len = loom_xmalloc((size_t)vocab * sizeof *t->len, "tokenizer lengths");
  for (int i = 0; i < vocab; i++) t->len[i] = BPE_UNUSED;
  t->eod = -1;
  return t;
}

static uint32_t pool_add(loom_bpe *t, const void *bytes, size_t len) {
  LOOM_CHECK(t->pool_len + len < UINT32_MAX, "tokenizer text over 4 GiB");
  if (t->pool_len + len > t->pool_cap) {
    t->pool_cap = (t->pool_len + len) * 2 + 1024;
    t->pool = realloc(t->pool, t->pool_cap);
    LOOM_CHECK(t->pool != NULL, "out of memory loading a tokenizer");
  }
  if (len) memcpy(t->pool + t->pool_len, bytes, len);
  t->pool_len += len;
  return (uint32_t)(t->pool_len - len);
}

bool bpe_set_token(loom_bpe *t, int id, const void *bytes, size_t len) {
  if (id < 0 || id >= t->vocab || t->len[id] != BPE_UNUSED || len == 0 || len >= UINT32_MAX) return false;
  t->off[id] = pool_add(t, bytes, len);
  t->len[id] = (uint32_t)len;
  return true;
}

/* bpe_lookup with the bytes' hash already in hand. */
static int lookup_hashed(const loom_bpe *t, const void *bytes, size_t len, uint64_t hash) {
  if (!t->str_slots) return -1;
  for (size_t s = hash & t->str_mask;; s = (s + 1) & t->str_mask) {
    const int32_t id = t->str_slots[s];
    if (id < 0) return -1;
    if (t->len[id] == len && memcmp(t->pool + t->off[id], bytes, len) == 0) return id;
  }
}

int bpe_lookup(const loom_bpe *t, const void *bytes, size_t len) { return lookup_hashed(t, bytes, len, bpe_hash_bytes(bytes, len)); }

bool bpe_index_tokens(loom_bpe *t, int *dup) {
  const size_t n = table_size((size_t)t->vocab);
  t->str_slots = loom_xmalloc(n * sizeof *t->str_slots, "tokenizer index");
  memset(t->str_slots, 0xff, n * sizeof *t->str_slots);
  t->str_mask = n - 1;
  for (int id = 0; id < t->vocab; id++) {
    if (t->len[id] == BPE_UNUSED) continue;
    const unsigned char *b = t->pool + t->off[id];
    const uint64_t hash = bpe_hash_bytes(b, t->len[id]);
    if (lookup_hashed(t, b, t->len[id], hash) >= 0) {
      *dup = id;
      return false;
    }
    size_t s = hash & t->str_mask;
    while (t->str_slots[s] >= 0) s = (s + 1) & t->str_mask;
    t->str_slots[s] = id;
  }
  return true;
}

static size_t pair_slot(const loom_bpe *t, uint64_t key) {
  size_t s = bpe_mix(key) & t->pair_mask;
  while (t->pair_keys[s] && t->pair_keys[s] != key) s = (s + 1) & t->pair_mask;
  return s;
}

static void pair_grow(loom_bpe *t) {
  const size_t old = t->pair_keys ? t->pair_mask + 1 : 0;
  uint64_t *keys = t->pair_keys;
  int32_t *rank = t->pair_rank, *merged = t->pair_merged;
  const size_t n = old ? old * 2 : 1024;
  t->pair_keys = loom_xcalloc(n, sizeof *t->pair_keys, "tokenizer merges");
  t->pair_rank = loom_xmalloc(n * sizeof *t->pair_rank, "tokenizer merges");
  t->pair_merged = loom_xmalloc(n * sizeof *t->pair_merged, "tokenizer merges");
  t->pair_mask = n - 1;
  for (size_t i = 0; i < old; i++) {
    if (!keys[i]) continue;
    const size_t s = pair_slot(t, keys[i]);
    t->pair_keys[s] = keys[i];
    t->pair_rank[s] = rank[i];
    t->pair_merged[s] = merged[i];
  }
  free(keys);
  free(rank);
  free(merged);
}

static uint64_t pair_key(int left, int right) {
  return ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
}

static void pair_put(loom_bpe *t, int left, int right, int32_t rank, int merged) {
  if (!t->pair_keys || (t->pair_count + 1) * 2 > t->pair_mask + 1) pair_grow(t);
  const uint64_t key = pair_key(left, right);
  const size_t s = pair_slot(t, key);
  if (t->pair_keys[s]) return; /* the first rank of a pair stands */
  LOOM_CHECK(rank >= 0, "merge ranks are not negative");
  if (rank > t->pair_rank_max) t->pair_rank_max = rank;
  t->pair_keys[s] = key;
  t->pair_rank[s] = rank;
  t->pair_merged[s] = merged;
  t->pair_count++;
}

bool bpe_add_merge(loom_bpe *t, int left, int right, int32_t rank) {
  const size_t a = t->len[left], b = t->len[right];
  unsigned char stack[256];
  unsigned char *joined = a + b <= sizeof stack ? stack : loom_xmalloc(a + b, "merge");
  memcpy(joined, t->pool + t->off[left], a);
  memcpy(joined + a, t->pool + t->off[right], b);
  const int merged = bpe_lookup(t, joined, a + b);
  if (joined != stack) free(joined);
  if (merged < 0) return false;
  pair_put(t, left, right, rank, merged);
  return true;
}

void bpe_merges_from_ranks(loom_bpe *t) {
  for (int id = 0; id < t->vocab; id++) {
    if (t->len[id] == BPE_UNUSED) continue;
    const unsigned char *b = t->pool + t->off[id];
    for (uint32_t k = 1; k < t->len[id]; k++) {
      const int left = bpe_lookup(t, b, k), right = bpe_lookup(t, b + k, t->len[id] - k);
      if (left >= 0 && right >= 0) pair_put(t, left, right, id, id);
    }
  }
}

bool bpe_add_special(loom_bpe *t, int id, const char *text, size_t len, bool special) {
  if (t->len[id] != BPE_UNUSED && (t->len[id] != len || memcmp(t->pool + t->off[id], text, len) != 0)) return false;
  t->specials = realloc(t->specials, (size_t)(t->nspecials + 1) * sizeof *t->specials);
  LOOM_CHECK(t->specials != NULL, "out of memory loading a tokenizer");
  t->specials[t->nspecials++] = (bpe_special){.id = id, .off = pool_add(t, text, len), .len = (uint32_t)len, .special = special};
  if (t->len[id] == BPE_UNUSED) {
    t->off[id] = t->specials[t->nspecials - 1].off;
    t->len[id] = (uint32_t)len;
  }
  if ((len == 13 && memcmp(text, "<|endoftext|>", 13) == 0) || (len == 15 && memcmp(text, "<|end_of_text|>", 15) == 0))
    t->eod = id;
  return true;
}

/* Unicode's White_Space, which \\s means to Python's regex and Rust's regex (the
 * original GPT-2 and tiktoken) and to Oniguruma (Hugging Face's tokenizers).
 * PCRE2's \\s also matches U+180E, white space before Unicode 6.3, so
 * patterns are rewritten to spell the set out. */
#define WHITE_SPACE "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* The pattern with \\s and \\S written as White_Space classes; NULL (with
 * *why) for a \\S inside a class, which has no such spelling. */
static char *spell_white_space(const char *pattern, const char **why) {
  loom_strbuf out = {0};
  bool in_class = false;
  for (const char *p = pattern; *p; p++) {
    if (p[0] == '\\' && (p[1] == 's' || p[1] == 'S')) {
      if (in_class && p[1] == 'S') {
        free(out.buf);
        *why = "\\S inside a character class is not supported";
        return NULL;
      }
      loom_strbuf_printf(&out, "%s%s%s", in_class ? "" : p[1] == 's' ? "[" : "[^", WHITE_SPACE, in_class ? "" : "]");
      p++;
      continue;
    }
    if (p[0] == '\\' && p[1]) { /* any other escape passes through whole */
      loom_strbuf_append(&out, p, 2);
      p++;
      continue;
    }
    if (!in_class && p[0] == '[') {
      in_class = true;
      loom_strbuf_append(&out, p, 1);
      if (p[1] == '^') loom_strbuf_append(&out, ++p, 1);
      if (p[1] == ']') loom_strbuf_append(&out, ++p, 1); /* a leading ] is a literal */
      continue;
    }
    const char *posix_end = in_class && p[0] == '[' && p[1] == ':' ? strstr(p + 2, ":]") : NULL;
    if (posix_end) { /* [:alpha:] inside a class */
      loom_strbuf_append(&out, p, (size_t)(posix_end + 2 - p));
      p = posix_end + 1;
      continue;
    }
    if (in_class && p[0] == ']') in_class = false;
    loom_strbuf_append(&out, p, 1);
  }
  if (!out.buf) loom_strbuf_append(&out, "", 0);
  return out.buf;
}

loom_status bpe_finish(loom_bpe *t, const char *pattern, const char *what, loom_error *err) {
  for (int b = 0; b < 256; b++) {
    const unsigned char byte = (unsigned char)b;
    t->byte_token[b] = bpe_lookup(t, &byte, 1);
    if (t->byte_token[b] < 0) return loom_fail(err, LOOM_ERR_FORMAT, "%s: byte 0x%02x has no token", what, b);
  }
  const char *why = NULL;
  char *spelled = spell_white_space(pattern, &why);
  if (!spelled) return loom_fail(err, LOOM_ERR_FORMAT, "%s: split pattern: %s", what, why);
  int code;
  PCRE2_SIZE at;
  t->pattern = pcre2_compile((PCRE2_SPTR)spelled, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                             &code, &at, NULL);
  free(spelled);
  if (!t->pattern) {
    PCRE2_UCHAR msg[160];
    pcre2_get_error_message(code, msg, sizeof msg);
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: split pattern does not compile at offset %zu: %s", what, (size_t)at, (char *)msg);
  }
  pcre2_jit_compile(t->pattern, PCRE2_JIT_COMPLETE); /* without JIT the interpreter still matches */
  return LOOM_OK;
}

void loom_bpe_free(loom_bpe *t) {
  if (!t) return;
  free(t->off);
  free(t->len);
  free(t->pool);
  free(t->str_slots);
  free(t->pair_keys);
  free(t->pair_rank);
  free(t->pair_merged);
  free(t->specials);
  if (t->pattern) pcre2_code_free(t->pattern);
  free(t);
}

int loom_bpe_vocab(const loom_bpe *t) { return t->vocab; }
int loom_bpe_eod(const loom_bpe *t) { return t->eod; }
const char *loom_bpe_describe(const loom_bpe *t) { return t->describe; }

const unsigned char *loom_bpe_token_bytes(const loom_bpe *t, int id, size_t *len) {
  if (id < 0 || id >= t->vocab || t->len[id] == BPE_UNUSED) return NULL;
  *len = t->len[id];
  return t->pool + t->off[id];
}

unsigned loom_bpe_byte_char(unsigned char byte) {
  /* Printable Latin-1 stands for itself; the other 68 bytes take 256, 257, ... in order. */
  if ((byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE)) return byte;
  unsigned n = 0;
  for (unsigned b = 0; b < byte; b++)
    if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) n++;
  return 256 + n;
}

/* ---- ids ---- */

void loom_ids_push(loom_ids *v, int32_t id) {
  if (v->count == v->cap) {
    v->cap = v->cap ? v->cap * 2 : 256;
    v->ids = realloc(v->ids, v->cap * sizeof *v->ids);
    LOOM_CHECK(v->ids != NULL, "out of memory holding token ids");
  }
  v->ids[v->count++] = id;
}

void loom_ids_free(loom_ids *v) {
  free(v->ids);
  *v = (loom_ids){0};
}

/* ---- encoding ---- */

/* A queued pair: its rank in the high 32 bits and its first symbol's
 * position in the low, so integer order is BPE's order (lowest rank, then
 * leftmost). A pair that merged away is found stale when popped: the pair
 * now at its position has another rank (pairs of one rank merge alike). */
typedef uint64_t queued_pair;

/* A long piece's queue by rank: the pairs it starts with sorted by rank
 * (then position, as found), and those its merges make listed per rank.
 * Popping rank by rank, each in position order, is the heap's order as long
 * as every pair a merge makes ranks above the rank being merged, as a
 * merge table's later merges do; the first that does not sends what is
 * left to the heap. Sequential where the heap jumps about: a piece of
 * megabytes merges several times faster. */
typedef struct {
  int32_t start; /* where the rank's first pairs begin in first[] (and, one rank on, end) */
  int32_t later; /* the last pair of the rank its merges made, in later[]; -1 none */
} rank_slot;

typedef struct {
  int32_t pos, next; /* next: the rank's pair made before it, -1 none */
} later_pair;

typedef struct {
  bool on, fell_back;
  int32_t rank;       /* the rank being merged */
  rank_slot *ranks;   /* [ranks + 1] */
  int32_t *first;     /* [n] */
  later_pair *later;  /* the pairs merges made */
  size_t later_len, later_cap;
  int32_t *items;     /* one rank's positions in order */
  size_t ranks_cap, n_cap, items_cap;
} rank_buckets;

enum { BUCKETS_MIN_PIECE = 1 << 16 }; /* shorter pieces take the heap: a pass over every rank would cost more */

typedef struct {
  uint64_t hash; /* 0: empty */
  uint32_t key_off, key_len, ids_off, ids_len;
} cache_slot;

#define CACHE_SLOTS (1u << 16)      /* pieces remembered before the cache starts over */
#define CACHE_POOL (8u << 20)       /* bytes of keys and ids remembered */
#define CACHE_MAX_PIECE 256         /* longer pieces are merged every time */

struct loom_bpe_encoder {
  const loom_bpe *t;
  bool allow_special;
  pcre2_match_data *match;
  int32_t *sym, *next, *prev; /* the piece's symbols as a linked list */
  queued_pair *heap;          /* a binary min-heap */
  size_t cap, heap_cap, heap_len;
  rank_buckets b;             /* a long piece's queue while its ranks only rise */
  cache_slot *cache;
  unsigned cache_used;
  unsigned char *cache_pool;
  size_t cache_pool_len;
  bool first_byte[256];        /* a special token that may match starts with this byte */
};

loom_bpe_encoder *loom_bpe_encoder_new(const loom_bpe *t, bool allow_special) {
  loom_bpe_encoder *e = loom_xcalloc(1, sizeof *e, "tokenizer encoder");
  e->t = t;
  e->allow_special = allow_special;
  e->match = pcre2_match_data_create_from_pattern(t->pattern, NULL);
  LOOM_CHECK(e->match != NULL, "out of memory for a regex match");
  e->cache = loom_xcalloc(CACHE_SLOTS, sizeof *e->cache, "tokenizer cache");
  e->cache_pool = loom_xmalloc(CACHE_POOL, "tokenizer cache");
  for (int i = 0; i < t->nspecials; i++)
    if (allow_special || !t->specials[i].special) e->first_byte[t->pool[t->specials[i].off]] = true;
  return e;
}

void loom_bpe_encoder_free(loom_bpe_encoder *e) {
  if (!e) return;
  pcre2_match_data_free(e->match);
  free(e->sym);
  free(e->next);
  free(e->prev);
  free(e->heap);
  free(e->b.ranks);
  free(e->b.first);
  free(e->b.later);
  free(e->b.items);
  free(e->cache);
  free(e->cache_pool);
  free(e);
}

static void sift_down(queued_pair *heap, size_t len, size_t i) {
  const queued_pair x = heap[i];
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= len) break;
    if (c + 1 < len && heap[c + 1] < heap[c]) c++;
    if (heap[c] >= x) break;
    heap[i] = heap[c];
    i = c;
  }
  heap[i] = x;
}

static void heap_reserve(loom_bpe_encoder *e, size_t need) {
  if (need <= e->heap_cap) return;
  e->heap_cap = need > 2 * e->heap_cap ? need : 2 * e->heap_cap;
  e->heap = realloc(e->heap, e->heap_cap * sizeof *e->heap);
  LOOM_CHECK(e->heap != NULL, "out of memory merging a long piece");
}

/* Appends without ordering: a heapify must follow. */
static void heap_append(loom_bpe_encoder *e, queued_pair x) {
  heap_reserve(e, e->heap_len + 1);
  e->heap[e->heap_len++] = x;
}

static void heap_push(loom_bpe_encoder *e, queued_pair x) {
  heap_reserve(e, e->heap_len + 1);
  size_t i = e->heap_len++;
  while (i > 0 && x < e->heap[(i - 1) / 2]) {
    e->heap[i] = e->heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  e->heap[i] = x;
}

static queued_pair heap_pop(loom_bpe_encoder *e) {
  const queued_pair top = e->heap[0];
  e->heap[0] = e->heap[--e->heap_len];
  if (e->heap_len) sift_down(e->heap, e->heap_len, 0);
  return top;
}

/* The merge table's slot of the pair starting at symbol pos, or -1 if there is no pair or it does not merge. */
static ptrdiff_t pair_at(const loom_bpe_encoder *e, int32_t pos) {
  if (pos < 0 || e->next[pos] < 0 || !e->t->pair_keys) return -1;
  const size_t s = pair_slot(e->t, pair_key(e->sym[pos], e->sym[e->next[pos]]));
  return e->t->pair_keys[s] ? (ptrdiff_t)s : -1;
}

static queued_pair queued(int32_t rank, int32_t pos) { return (uint64_t)(uint32_t)rank << 32 | (uint32_t)pos; }

static void *grow(void *p, size_t *cap, size_t need, size_t size) {
  if (need <= *cap) return p;
  *cap = need > 2 * *cap ? need : 2 * *cap;
  p = realloc(p, *cap * size);
  LOOM_CHECK(p != NULL, "out of memory merging a long piece");
  return p;
}

/* Queues the pair starting at symbol pos if it merges. */
static void offer_pair(loom_bpe_encoder *e, int32_t pos) {
  const ptrdiff_t s = pair_at(e, pos);
  if (s < 0) return;
  const int32_t rank = e->t->pair_rank[s];
  rank_buckets *b = &e->b;
  if (!b->on || b->fell_back || rank <= b->rank) { /* the heap, or from now on the heap */
    b->fell_back = b->on;
    heap_push(e, queued(rank, pos));
    return;
  }
  b->later = grow(b->later, &b->later_cap, b->later_len + 1, sizeof *b->later);
  b->later[b->later_len] = (later_pair){pos, b->ranks[rank].later};
  b->ranks[rank].later = (int32_t)b->later_len++;
}

/* Room for a piece of n symbols; a piece far longer than those before gets exactly its size. */
static void reserve_scratch(loom_bpe_encoder *e, size_t n) {
  if (n <= e->cap) return;
  e->cap = n < (1u << 20) ? 2 * n : n;
  e->sym = realloc(e->sym, e->cap * sizeof *e->sym);
  e->next = realloc(e->next, e->cap * sizeof *e->next);
  e->prev = realloc(e->prev, e->cap * sizeof *e->prev);
  LOOM_CHECK(e->sym && e->next && e->prev, "out of memory merging a long piece");
}

/* Merges the pair at pos if the pair there is still one of this rank, and
 * queues the pairs it makes with its neighbours. */
static void merge_if_current(loom_bpe_encoder *e, int32_t pos, int32_t rank) {
  if (e->sym[pos] < 0) return; /* merged into the symbol on its left */
  const ptrdiff_t s = pair_at(e, pos);
  if (s < 0 || e->t->pair_rank[s] != rank) return; /* stale: a neighbour merged since */
  const int32_t nx = e->next[pos];
  e->sym[pos] = e->t->pair_merged[s];
  e->sym[nx] = -1;
  e->next[pos] = e->next[nx];
  if (e->next[nx] >= 0) e->prev[e->next[nx]] = pos;
  offer_pair(e, e->prev[pos]);
  offer_pair(e, pos);
}

static int by_position(const void *a, const void *b) {
  const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* Rank r's queued positions, in order, into b->items; returns how many. */
static size_t rank_items(rank_buckets *b, int32_t r) {
  const size_t begin = (size_t)b->ranks[r].start, end = (size_t)b->ranks[r + 1].start;
  size_t n = end - begin;
  for (int32_t k = b->ranks[r].later; k >= 0; k = b->later[k].next) n++;
  if (n == 0) return 0;
  b->items = grow(b->items, &b->items_cap, n, sizeof *b->items);
  memcpy(b->items, b->first + begin, (end - begin) * sizeof *b->items);
  size_t i = end - begin;
  for (int32_t k = b->ranks[r].later; k >= 0; k = b->later[k].next) b->items[i++] = b->later[k].pos;
  if (i > end - begin) qsort(b->items, n, sizeof *b->items, by_position);
  return n;
}

/* Merges the piece rank by rank; returns false if it handed over to the
 * heap (what is left appended there, to be heapified). */
static bool merge_by_rank(loom_bpe_encoder *e, size_t n) {
  rank_buckets *b = &e->b;
  const int32_t ranks = e->t->pair_rank_max + 1;
  b->ranks = grow(b->ranks, &b->ranks_cap, (size_t)ranks + 1, sizeof *b->ranks);
  b->first = grow(b->first, &b->n_cap, n, sizeof *b->first);
  for (int32_t r = 0; r <= ranks; r++) b->ranks[r] = (rank_slot){0, -1};
  b->later_len = 0;
  /* The first pairs by rank, a counting sort that keeps position order within a rank. */
  int32_t *rank_at = e->prev; /* borrowed for the sort: prev is set again below */
  for (size_t i = 0; i + 1 < n; i++) {
    const ptrdiff_t s = pair_at(e, (int32_t)i);
    rank_at[i] = s < 0 ? -1 : e->t->pair_rank[s];
    if (s >= 0) b->ranks[rank_at[i] + 1].start++;
  }
  for (int32_t r = 0; r < ranks; r++) b->ranks[r + 1].start += b->ranks[r].start;
  for (size_t i = 0; i + 1 < n; i++)
    if (rank_at[i] >= 0) b->first[b->ranks[rank_at[i]].start++] = (int32_t)i;
  for (int32_t r = ranks; r > 0; r--) b->ranks[r].start = b->ranks[r - 1].start; /* each rank's start back */
  b->ranks[0].start = 0;
  for (size_t i = 0; i < n; i++) e->prev[i] = (int32_t)i - 1;
  b->on = true, b->fell_back = false;
  for (int32_t r = 0; r < ranks; r++) {
    const size_t count = rank_items(b, r);
    b->rank = r;
    for (size_t j = 0; j < count; j++) {
      merge_if_current(e, b->items[j], r);
      if (!b->fell_back) continue;
      /* A merge made a pair of this rank or lower: the heap takes what is left. */
      for (size_t k = j + 1; k < count; k++) heap_append(e, queued(r, b->items[k]));
      for (int32_t q = r + 1; q < ranks; q++) {
        for (int32_t i = b->ranks[q].start; i < b->ranks[q + 1].start; i++) heap_append(e, queued(q, b->first[i]));
        for (int32_t k = b->ranks[q].later; k >= 0; k = b->later[k].next) heap_append(e, queued(q, b->later[k].pos));
      }
      b->on = false;
      return false;
    }
  }
  b->on = false;
  return true;
}

/* Merges one piece from its bytes, appending its tokens: the lowest-ranked
 * pair first (the leftmost among equals), in O(n log n) by a heap, or for a
 * long piece rank by rank while that order holds. */
static void merge_piece(loom_bpe_encoder *e, const unsigned char *p, size_t n, loom_ids *out) {
  LOOM_CHECK(n < INT32_MAX, "a piece over 2 GiB");
  reserve_scratch(e, n);
  for (size_t i = 0; i < n; i++) {
    e->sym[i] = e->t->byte_token[p[i]];
    e->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    e->prev[i] = (int32_t)i - 1;
  }
  e->heap_len = 0;
  if (n >= BUCKETS_MIN_PIECE && e->t->pair_keys && merge_by_rank(e, n)) goto done;
  if (e->heap_len == 0) /* every merging pair (else what merge_by_rank left) */
    for (size_t i = 0; i + 1 < n; i++) {
      const ptrdiff_t s = pair_at(e, (int32_t)i);
      if (s >= 0) heap_append(e, queued(e->t->pair_rank[s], (int32_t)i));
    }
  for (size_t i = e->heap_len / 2; i-- > 0;) sift_down(e->heap, e->heap_len, i); /* heapified at once */
  while (e->heap_len) {
    const queued_pair top = heap_pop(e);
    merge_if_current(e, (int32_t)(uint32_t)top, (int32_t)(top >> 32));
  }
done:
  for (int32_t i = 0; i >= 0; i = e->next[i]) loom_ids_push(out, e->sym[i]);
}

static void encode_piece(loom_bpe_encoder *e, const unsigned char *p, size_t n, loom_ids *out) {
  if (n == 0) return;
  const loom_bpe *t = e->t;
  if (n == 1) {
    loom_ids_push(out, t->byte_token[p[0]]);
    return;
  }
  const uint64_t hash = bpe_hash_bytes(p, n); /* one hash for the vocabulary and the cache */
  if (t->whole_word_first) {
    const int id = lookup_hashed(t, p, n, hash);
    if (id >= 0) {
      loom_ids_push(out, id);
      return;
    }
  }
  if (n > CACHE_MAX_PIECE) {
    merge_piece(e, p, n, out);
    return;
  }
  const uint64_t h = hash | 1;
  size_t s = h & (CACHE_SLOTS - 1);
  for (; e->cache[s].hash; s = (s + 1) & (CACHE_SLOTS - 1)) {
    const cache_slot *c = &e->cache[s];
    if (c->hash == h && c->key_len == n && memcmp(e->cache_pool + c->key_off, p, n) == 0) {
      const int32_t *ids = (const int32_t *)(e->cache_pool + c->ids_off);
      for (uint32_t i = 0; i < c->ids_len; i++) loom_ids_push(out, ids[i]);
      return;
    }
  }
  const size_t first = out->count;
  merge_piece(e, p, n, out);
  const size_t count = out->count - first;
  const size_t padded = (n + 3) & ~(size_t)3;
  if (e->cache_pool_len + padded + count * 4 > CACHE_POOL || e->cache_used + 1 > CACHE_SLOTS / 2) {
    memset(e->cache, 0, CACHE_SLOTS * sizeof *e->cache); /* full: start over */
    e->cache_used = 0;
    e->cache_pool_len = 0;
    s = h & (CACHE_SLOTS - 1);
  }
  const size_t key_off = e->cache_pool_len, ids_off = key_off + padded, need = ids_off + count * 4;
  if (need > CACHE_POOL) return;
  memcpy(e->cache_pool + key_off, p, n);
  memcpy(e->cache_pool + ids_off, out->ids + first, count * 4);
  e->cache[s] = (cache_slot){h, (uint32_t)key_off, (uint32_t)n, (uint32_t)ids_off, (uint32_t)count};
  e->cache_pool_len = need;
  e->cache_used++;
}

typedef struct {
  loom_bpe_encoder *e;
  loom_ids *out;
} encode_ctx;

static void encode_piece_fn(void *ctx, const unsigned char *p, size_t n) {
  encode_ctx *c = ctx;
  encode_piece(c->e, p, n, c->out);
}

void bpe_split(loom_bpe_encoder *e, const unsigned char *text, size_t len, bpe_piece_fn fn, void *ctx) {
  size_t at = 0;
  while (at < len) {
    const int rc = pcre2_match(e->t->pattern, text, len, at, 0, e->match, NULL);
    if (rc < 0) {
      fn(ctx, text + at, len - at);
      return;
    }
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->match);
    if (ov[0] > at) fn(ctx, text + at, ov[0] - at);
    if (ov[1] == ov[0]) { /* an empty match: take one byte so the scan moves */
      fn(ctx, text + ov[0], 1);
      at = ov[0] + 1;
    } else {
      fn(ctx, text + ov[0], ov[1] - ov[0]);
      at = ov[1];
    }
  }
}

static void split_text(loom_bpe_encoder *e, const unsigned char *text, size_t len, loom_ids *out) {
  encode_ctx c = {e, out};
  bpe_split(e, text, len, encode_piece_fn, &c);
}

/* A stretch of text between special tokens. */
static void encode_text(loom_bpe_encoder *e, const unsigned char *text, size_t len, loom_ids *out) {
  if (len == 0) return;
  if (!e->t->add_prefix_space || text[0] == ' ') {
    split_text(e, text, len, out);
    return;
  }
  unsigned char *spaced = loom_xmalloc(len + 1, "prefix space");
  spaced[0] = ' ';
  memcpy(spaced + 1, text, len);
  split_text(e, spaced, len + 1, out);
  free(spaced);
}

/* The longest special token the encoder matches at text[at], or NULL. */
static const bpe_special *special_at(const loom_bpe_encoder *e, const unsigned char *text, size_t len, size_t at) {
  const loom_bpe *t = e->t;
  const bpe_special *best = NULL;
  for (int i = 0; i < t->nspecials; i++) {
    const bpe_special *s = &t->specials[i];
    if ((s->special && !e->allow_special) || s->len > len - at || (best && s->len <= best->len)) continue;
    if (memcmp(t->pool + s->off, text + at, s->len) == 0) best = s;
  }
  return best;
}

void loom_bpe_encode(loom_bpe_encoder *e, const char *text, size_t len, loom_ids *out) {
  const unsigned char *p = (const unsigned char *)text;
  size_t start = 0;
  for (size_t at = 0; at < len; at++) {
    if (!e->first_byte[p[at]]) continue;
    const bpe_special *s = special_at(e, p, len, at);
    if (!s) continue;
    encode_text(e, p + start, at - start, out);
    loom_ids_push(out, s->id);
    at += s->len - 1;
    start = at + 1;
  }
  encode_text(e, p + start, len - start, out);
}

void loom_bpe_encode_templated(loom_bpe_encoder *e, const char *text, size_t len, loom_ids *out) {
  const loom_bpe *t = e->t;
  for (int i = 0; i < t->template_before; i++) loom_ids_push(out, t->template_ids[i]);
  loom_bpe_encode(e, text, len, out);
  for (int i = 0; i < t->template_after; i++) loom_ids_push(out, t->template_ids[t->template_before + i]);
}

int loom_bpe_bos(const loom_bpe *t) {
  if (t->template_before) return t->template_ids[0];
  return t->format == LOOM_BPE_GPT2_FILES ? t->eod : -1;
}

loom_bpe_format loom_bpe_format_of(const loom_bpe *t) { return t->format; }

const char *loom_bpe_file(const loom_bpe *t, int i) { return t->files[i][0] ? t->files[i] : NULL; }

const char *loom_bpe_template_describe(const loom_bpe *t) {
  return t->template_before + t->template_after ? t->template_names : NULL;
}

loom_status loom_bpe_decode(const loom_bpe *t, const int32_t *ids, size_t n, loom_strbuf *out, loom_error *err) {
  for (size_t i = 0; i < n; i++) {
    size_t len;
    const unsigned char *b = loom_bpe_token_bytes(t, ids[i], &len);
    if (!b)
      return loom_fail(err, LOOM_ERR_FORMAT, "token %zu is id %d, which names no token of this tokenizer (ids below %d, some unused)",
                       i + 1, ids[i], t->vocab);
    loom_strbuf_append(out, b, len);
  }
  if (!out->buf) loom_strbuf_append(out, "", 0);
  return LOOM_OK;
}
