/* The tokenizer's tables, shared by the encoder (bpe.c), the file loaders
 * (bpe_load.c) and the trainer's writer (bpe_train.c). Not a public header. */
#ifndef LOOM_BPE_IMPL_H
#define LOOM_BPE_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include "data/bpe.h"

#define BPE_UNUSED UINT32_MAX
#define BPE_TEMPLATE_MAX 16 /* ids a post-processor may add around one text */

typedef struct {
  int32_t id;
  uint32_t off, len; /* its text in the pool */
  bool special;      /* matched only when the encoder allows special tokens */
} bpe_special;

struct loom_bpe {
  int vocab;                   /* one more than the largest id */
  uint32_t *off, *len;         /* [vocab] each token's bytes in pool; len BPE_UNUSED if unused */
  unsigned char *pool;
  size_t pool_len, pool_cap;
  int32_t *str_slots;          /* open addressing: token ids keyed by their bytes, -1 empty */
  size_t str_mask;
  uint64_t *pair_keys;         /* open addressing: (left << 32 | right) + 1, 0 empty */
  int32_t *pair_rank, *pair_merged;
  size_t pair_mask, pair_count;
  int32_t pair_rank_max;       /* the highest rank a pair merges at (ranks are 0 or more) */
  int32_t byte_token[256];     /* the token of each single byte */
  bool whole_word_first;       /* a piece that is a token is that token (tiktoken; HF ignore_merges) */
  bool add_prefix_space;       /* HF ByteLevel add_prefix_space */
  pcre2_code *pattern;
  bpe_special *specials;
  int nspecials;
  int eod;
  /* The post-processor's template (a tokenizer.json TemplateProcessing):
   * template_ids[0..template_before) before each text, the next
   * template_after after it; template_names says which, for logs. */
  int32_t template_ids[BPE_TEMPLATE_MAX];
  int template_before, template_after;
  char template_names[200];
  loom_bpe_format format;
  char files[2][4096];         /* what it was read from (loom_bpe_file) */
  char describe[160];
};

/* The tables' hashes, shared with the trainer's. */
uint64_t bpe_hash_bytes(const void *bytes, size_t n);
uint64_t bpe_mix(uint64_t h);

/* Building a tokenizer: tokens first, then bpe_index_tokens, then merges and
 * specials, then bpe_finish. Each returns false on what it names. */
loom_bpe *bpe_new(int vocab);
/* Token id gets bytes; false if id is out of range or already set. */
bool bpe_set_token(loom_bpe *t, int id, const void *bytes, size_t len);
/* Indexes the tokens by their bytes; false (with *dup the id) if two share bytes. */
bool bpe_index_tokens(loom_bpe *t, int *dup);
/* The id of a byte string, or -1. */
int bpe_lookup(const loom_bpe *t, const void *bytes, size_t len);
/* Pair (left, right) merges at rank into the token of their joined bytes;
 * false if no token has those bytes. A pair seen before keeps its first rank. */
bool bpe_add_merge(loom_bpe *t, int left, int right, int32_t rank);
/* Every split of every token into two tokens merges at the token's rank
 * (tiktoken's rule: a pair's rank is that of its concatenation). */
void bpe_merges_from_ranks(loom_bpe *t);
bool bpe_add_special(loom_bpe *t, int id, const char *text, size_t len, bool special);
/* Compiles the split pattern and checks every byte has a token. */
loom_status bpe_finish(loom_bpe *t, const char *pattern, const char *what, loom_error *err);

/* Splits text by the pattern (no special tokens), calling fn on each piece;
 * bytes the pattern leaves (invalid UTF-8) are pieces of their own. */
typedef void (*bpe_piece_fn)(void *ctx, const unsigned char *piece, size_t len);
void bpe_split(loom_bpe_encoder *e, const unsigned char *text, size_t len, bpe_piece_fn fn, void *ctx);

/* The loaders by format (loom_bpe_load picks by path): a tokenizer.json, and
 * a tiktoken rank file whose encoding is the base name of `name`. */
loom_status bpe_load_tokenizer_json(loom_bpe **out, const char *path, loom_error *err);
loom_status bpe_load_tiktoken(loom_bpe **out, const char *path, const char *name, loom_error *err);

/* The split patterns of the named encodings. */
#define BPE_PATTERN_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define BPE_PATTERN_CL100K                                                                            \
  "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|" \
  "\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"

#endif
