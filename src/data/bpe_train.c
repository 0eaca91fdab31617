/* Training a byte-level BPE, as GPT-2's was trained: split the corpus with
 * GPT-2's pattern, count the words, then repeatedly merge the most frequent
 * adjacent pair (ties: the smaller pair of ids) until the vocabulary is full
 * or no pair occurs twice. Pair counts live in a hash map with the words each
 * pair occurs in; a max-heap with stale entries skipped picks the next merge,
 * so a merge costs the words it touches, not the corpus. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "core/strbuf.h"
#include "core/write_file.h"
#include "data/bpe_impl.h"
#include "data/documents.h"

typedef struct {
  int32_t *sym;
  int32_t len;
  int64_t count;
  int64_t stamp; /* the last merge that rewrote this word */
  uint64_t hash; /* of its bytes, while words are counted */
} word;

typedef struct {
  int32_t a, b;
  int64_t count;
  int32_t *words; /* words it may occur in (stale entries allowed) */
  int32_t nwords, cap;
} pair;

typedef struct {
  int64_t count;
  int32_t a, b;
} heap_entry;

typedef struct {
  word *words;
  int32_t nwords, wcap;
  uint64_t *word_hash;     /* open addressing over words by bytes, during counting */
  size_t word_mask;
  pair *pairs;
  int32_t npairs, pcap;
  int32_t *pair_slots;     /* open addressing: pair index, -1 empty */
  size_t pair_mask;
  heap_entry *heap;
  size_t heap_len, heap_cap;
} trainer;

/* ---- counting words ---- */

static bool same_word(const word *w, const unsigned char *p, size_t n) {
  if ((size_t)w->len != n) return false;
  for (size_t i = 0; i < n; i++)
    if (w->sym[i] != p[i]) return false;
  return true;
}

static void word_table_grow(trainer *t);

static void count_piece(void *ctx, const unsigned char *p, size_t n) {
  trainer *t = ctx;
  if (n < 2 || n > INT32_MAX) return; /* a single byte never merges */
  if ((size_t)t->nwords * 2 >= t->word_mask) word_table_grow(t);
  const uint64_t h = bpe_hash_bytes(p, n);
  size_t s = h & t->word_mask;
  for (; t->word_hash[s]; s = (s + 1) & t->word_mask) {
    word *w = &t->words[(t->word_hash[s] >> 32) - 1];
    if ((uint32_t)t->word_hash[s] == (uint32_t)h && same_word(w, p, n)) {
      w->count++;
      return;
    }
  }
  if (t->nwords == t->wcap) {
    t->wcap = t->wcap ? t->wcap * 2 : 4096;
    t->words = realloc(t->words, (size_t)t->wcap * sizeof *t->words);
    LOOM_CHECK(t->words != NULL, "out of memory counting words");
  }
  word *w = &t->words[t->nwords++];
  w->sym = loom_xmalloc(n * sizeof *w->sym, "word");
  for (size_t i = 0; i < n; i++) w->sym[i] = p[i]; /* byte b is token b until renumbered */
  *w = (word){.sym = w->sym, .len = (int32_t)n, .count = 1, .stamp = -1, .hash = h};
  t->word_hash[s] = (uint64_t)t->nwords << 32 | (uint32_t)h;
}

static void word_table_grow(trainer *t) {
  const size_t n = t->word_mask ? (t->word_mask + 1) * 2 : 1 << 16;
  free(t->word_hash);
  t->word_hash = loom_xcalloc(n, sizeof *t->word_hash, "word table");
  t->word_mask = n - 1;
  for (int32_t i = 0; i < t->nwords; i++) {
    const uint64_t h = t->words[i].hash;
    size_t s = h & t->word_mask;
    while (t->word_hash[s]) s = (s + 1) & t->word_mask;
    t->word_hash[s] = (uint64_t)(i + 1) << 32 | (uint32_t)h;
  }
}

/* ---- pairs ---- */

static void pair_table_grow(trainer *t) {
  const size_t n = t->pair_mask ? (t->pair_mask + 1) * 2 : 1 << 16;
  free(t->pair_slots);
  t->pair_slots = loom_xmalloc(n * sizeof *t->pair_slots, "pair table");
  memset(t->pair_slots, 0xff, n * sizeof *t->pair_slots);
  t->pair_mask = n - 1;
  for (int32_t i = 0; i < t->npairs; i++) {
    size_t s = bpe_mix((uint64_t)(uint32_t)t->pairs[i].a << 32 | (uint32_t)t->pairs[i].b) & t->pair_mask;
    while (t->pair_slots[s] >= 0) s = (s + 1) & t->pair_mask;
    t->pair_slots[s] = i;
  }
}

static pair *pair_get(trainer *t, int32_t a, int32_t b) {
  if ((size_t)t->npairs * 2 >= t->pair_mask) pair_table_grow(t);
  size_t s = bpe_mix((uint64_t)(uint32_t)a << 32 | (uint32_t)b) & t->pair_mask;
  for (; t->pair_slots[s] >= 0; s = (s + 1) & t->pair_mask) {
    pair *p = &t->pairs[t->pair_slots[s]];
    if (p->a == a && p->b == b) return p;
  }
  if (t->npairs == t->pcap) {
    t->pcap = t->pcap ? t->pcap * 2 : 4096;
    t->pairs = realloc(t->pairs, (size_t)t->pcap * sizeof *t->pairs);
    LOOM_CHECK(t->pairs != NULL, "out of memory counting pairs");
  }
  t->pairs[t->npairs] = (pair){.a = a, .b = b};
  t->pair_slots[s] = t->npairs;
  return &t->pairs[t->npairs++];
}

static bool heap_above(const heap_entry *x, const heap_entry *y) {
  if (x->count != y->count) return x->count > y->count;
  return x->a != y->a ? x->a < y->a : x->b < y->b;
}

static void heap_push(trainer *t, const pair *p) {
  if (t->heap_len == t->heap_cap) {
    t->heap_cap = t->heap_cap ? t->heap_cap * 2 : 4096;
    t->heap = realloc(t->heap, t->heap_cap * sizeof *t->heap);
    LOOM_CHECK(t->heap != NULL, "out of memory ranking pairs");
  }
  const heap_entry e = {p->count, p->a, p->b};
  size_t i = t->heap_len++;
  while (i > 0 && heap_above(&e, &t->heap[(i - 1) / 2])) {
    t->heap[i] = t->heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  t->heap[i] = e;
}

static heap_entry heap_pop(trainer *t) {
  const heap_entry top = t->heap[0], last = t->heap[--t->heap_len];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= t->heap_len) break;
    if (c + 1 < t->heap_len && heap_above(&t->heap[c + 1], &t->heap[c])) c++;
    if (!heap_above(&t->heap[c], &last)) break;
    t->heap[i] = t->heap[c];
    i = c;
  }
  if (t->heap_len) t->heap[i] = last;
  return top;
}

/* Adds (sign +1) or removes (-1) the pairs of word wi; touched pairs are re-ranked. */
static void count_pairs(trainer *t, int32_t wi, int sign) {
  const word *w = &t->words[wi];
  for (int32_t k = 0; k + 1 < w->len; k++) {
    pair *p = pair_get(t, w->sym[k], w->sym[k + 1]);
    p->count += sign * w->count;
    if (sign > 0) {
      if (p->nwords == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 4;
        p->words = realloc(p->words, (size_t)p->cap * sizeof *p->words);
        LOOM_CHECK(p->words != NULL, "out of memory indexing pairs");
      }
      if (!p->nwords || p->words[p->nwords - 1] != wi) p->words[p->nwords++] = wi;
    }
    heap_push(t, p);
  }
}

/* Replaces (a, b) by c in every word holding it. */
static void apply_merge(trainer *t, int32_t a, int32_t b, int32_t c, int64_t stamp) {
  pair *p = pair_get(t, a, b);
  const int32_t n = p->nwords;
  int32_t *list = loom_xmalloc((size_t)n * sizeof *list + 1, "merge words");
  memcpy(list, p->words, (size_t)n * sizeof *list);
  for (int32_t i = 0; i < n; i++) {
    word *w = &t->words[list[i]];
    if (w->stamp == stamp) continue;
    bool has = false;
    for (int32_t k = 0; k + 1 < w->len && !has; k++) has = w->sym[k] == a && w->sym[k + 1] == b;
    if (!has) continue;
    w->stamp = stamp;
    count_pairs(t, list[i], -1);
    int32_t out = 0;
    for (int32_t k = 0; k < w->len; k++) {
      if (k + 1 < w->len && w->sym[k] == a && w->sym[k + 1] == b) {
        w->sym[out++] = c;
        k++;
      } else {
        w->sym[out++] = w->sym[k];
      }
    }
    w->len = out;
    count_pairs(t, list[i], +1);
  }
  free(list);
}

/* ---- writing ---- */

/* A token's bytes in GPT-2's byte characters, JSON-escaped when json. */
static void put_mapped(loom_strbuf *out, const unsigned char *bytes, size_t len, bool json) {
  for (size_t i = 0; i < len; i++) {
    const unsigned cp = loom_bpe_byte_char(bytes[i]);
    char u[3];
    if (cp < 0x80) {
      if (json && (cp == '"' || cp == '\\')) loom_strbuf_append(out, "\\", 1);
      u[0] = (char)cp;
      loom_strbuf_append(out, u, 1);
    } else {
      u[0] = (char)(0xC0 | cp >> 6);
      u[1] = (char)(0x80 | (cp & 0x3F));
      loom_strbuf_append(out, u, 2);
    }
  }
}

static loom_status write_text(const char *dir, const char *name, const loom_strbuf *b, loom_error *err) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  const loom_chunk chunk = {b->buf, b->len};
  return loom_write_file_atomic(path, &chunk, 1, err);
}

/* encoder.json + vocab.bpe (GPT-2's files) and tokenizer.json (Hugging Face's). */
static loom_status write_tokenizer(const loom_bpe *bpe, const int32_t (*merges)[2], int nmerges, const char *dir, loom_error *err) {
  loom_strbuf vocab = {0}, bpe_file = {0}, hf = {0};
  loom_strbuf_printf(&vocab, "{");
  for (int id = 0; id < bpe->vocab; id++) {
    size_t len;
    const unsigned char *b = loom_bpe_token_bytes(bpe, id, &len);
    loom_strbuf_printf(&vocab, "%s\"", id ? ", " : "");
    put_mapped(&vocab, b, len, true);
    loom_strbuf_printf(&vocab, "\": %d", id);
  }
  loom_strbuf_printf(&vocab, "}");
  loom_strbuf_printf(&bpe_file, "#version: 0.2\n");
  loom_strbuf merges_json = {0};
  for (int m = 0; m < nmerges; m++) {
    loom_strbuf_printf(&merges_json, "%s\"", m ? ", " : "");
    for (int side = 0; side < 2; side++) {
      size_t len;
      const unsigned char *b = loom_bpe_token_bytes(bpe, merges[m][side], &len);
      put_mapped(&bpe_file, b, len, false);
      put_mapped(&merges_json, b, len, true);
      loom_strbuf_append(&bpe_file, side ? "\n" : " ", 1);
      if (!side) loom_strbuf_append(&merges_json, " ", 1);
    }
    loom_strbuf_append(&merges_json, "\"", 1);
  }
  const char *byte_level = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true}";
  loom_strbuf_printf(&hf,
                     "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n"
                     " \"added_tokens\": [{\"id\": %d, \"content\": \"<|endoftext|>\", \"single_word\": false, \"lstrip\": false, "
                     "\"rstrip\": false, \"normalized\": false, \"special\": true}],\n"
                     " \"normalizer\": null, \"pre_tokenizer\": %s, \"post_processor\": %s, \"decoder\": %s,\n"
                     " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": \"\", "
                     "\"end_of_word_suffix\": \"\", \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,\n  \"vocab\": %s,\n  \"merges\": [",
                     bpe->eod, byte_level, byte_level, byte_level, vocab.buf);
  if (merges_json.buf) loom_strbuf_append(&hf, merges_json.buf, merges_json.len);
  loom_strbuf_printf(&hf, "]}}\n");
  loom_strbuf_printf(&vocab, "\n");
  loom_status st = write_text(dir, "encoder.json", &vocab, err);
  if (st == LOOM_OK) st = write_text(dir, "vocab.bpe", &bpe_file, err);
  if (st == LOOM_OK) st = write_text(dir, "tokenizer.json", &hf, err);
  free(vocab.buf);
  free(bpe_file.buf);
  free(hf.buf);
  free(merges_json.buf);
  return st;
}

/* ---- training ---- */

static void trainer_free(trainer *t) {
  for (int32_t i = 0; i < t->nwords; i++) free(t->words[i].sym);
  for (int32_t i = 0; i < t->npairs; i++) free(t->pairs[i].words);
  free(t->words);
  free(t->word_hash);
  free(t->pairs);
  free(t->pair_slots);
  free(t->heap);
}

/* A tokenizer of the 256 bytes in GPT-2's order (printable characters first), splitting by GPT-2's pattern. */
static loom_bpe *byte_tokenizer(int vocab, int *id_of_byte, loom_error *err) {
  loom_bpe *t = bpe_new(vocab);
  int order[256], n = 0;
  for (unsigned cp = 0; cp < 324; cp++)
    for (int b = 0; b < 256; b++)
      if (loom_bpe_byte_char((unsigned char)b) == cp) order[n++] = b;
  for (int id = 0; id < 256; id++) {
    const unsigned char byte = (unsigned char)order[id];
    bpe_set_token(t, id, &byte, 1);
    id_of_byte[order[id]] = id;
  }
  int dup;
  bpe_index_tokens(t, &dup);
  if (bpe_finish(t, BPE_PATTERN_GPT2, "byte tokenizer", err) != LOOM_OK) {
    loom_bpe_free(t);
    return NULL;
  }
  return t;
}

loom_status loom_bpe_train(const loom_bpe_train_options *o, loom_bpe_train_stats *stats, loom_error *err) {
  memset(stats, 0, sizeof *stats);
  if (o->vocab_size < 257 || o->vocab_size > LOOM_BPE_MAX_TRAIN_VOCAB)
    return loom_fail(err, LOOM_ERR_USAGE, "--vocab-size %d: expected 257 (256 bytes and <|endoftext|>) to %d", o->vocab_size, LOOM_BPE_MAX_TRAIN_VOCAB);
  int id_of_byte[256];
  loom_bpe *bpe = byte_tokenizer(o->vocab_size, id_of_byte, err);
  if (!bpe) return LOOM_ERR_FORMAT;
  loom_bpe_encoder *enc = loom_bpe_encoder_new(bpe, false);
  trainer t = {0};
  loom_doc_reader r = loom_doc_reader_start(o->inputs, o->ninputs, o->json_key != NULL);
  loom_status st = LOOM_OK;
  const char *raw;
  size_t len;
  while (loom_doc_reader_next(&r, &raw, &len, &st, err) > 0) {
    char where[4200];
    loom_doc_where(o->inputs, r.doc_file, r.doc_line, where, sizeof where);
    loom_json json = {0};
    const char *text;
    size_t text_len;
    st = loom_document_text(raw, len, o->json_key, where, &json, &text, &text_len, err);
    if (st == LOOM_OK) bpe_split(enc, (const unsigned char *)text, text_len, count_piece, &t);
    loom_json_free(&json);
    if (st != LOOM_OK) break;
    stats->documents++;
  }
  stats->bytes = r.bytes;
  loom_doc_reader_end(&r);
  loom_bpe_encoder_free(enc);
  int32_t (*merges)[2] = loom_xmalloc((size_t)o->vocab_size * sizeof *merges, "merges");
  int nmerges = 0;
  if (st == LOOM_OK) {
    for (int32_t i = 0; i < t.nwords; i++) { /* bytes become their ids */
      stats->words += t.words[i].count;
      for (int32_t k = 0; k < t.words[i].len; k++) t.words[i].sym[k] = id_of_byte[t.words[i].sym[k]];
      count_pairs(&t, i, +1);
    }
    stats->distinct_words = t.nwords;
    const int room = o->vocab_size - 257;
    while (nmerges < room && t.heap_len) {
      const heap_entry e = heap_pop(&t);
      const pair *p = pair_get(&t, e.a, e.b);
      if (p->count != e.count) continue; /* stale: re-ranked since */
      if (e.count < 2) break;
      const int32_t c = 256 + nmerges;
      size_t la, lb;
      const unsigned char *ba = loom_bpe_token_bytes(bpe, e.a, &la), *bb = loom_bpe_token_bytes(bpe, e.b, &lb);
      unsigned char *joined = loom_xmalloc(la + lb, "merged token");
      memcpy(joined, ba, la);
      memcpy(joined + la, bb, lb);
      bpe_set_token(bpe, c, joined, la + lb);
      free(joined);
      merges[nmerges][0] = e.a;
      merges[nmerges][1] = e.b;
      apply_merge(&t, e.a, e.b, c, nmerges);
      nmerges++;
    }
  }
  trainer_free(&t);
  stats->merges = nmerges;
  if (st == LOOM_OK) {
    /* A smaller vocabulary when the corpus runs out of repeated pairs: <|endoftext|> follows the merges. */
    bpe->vocab = 256 + nmerges + 1;
    bpe_set_token(bpe, bpe->vocab - 1, "<|endoftext|>", 13);
    bpe->eod = bpe->vocab - 1;
    stats->vocab = bpe->vocab;
    st = loom_make_dirs(o->out_dir, "tokenizer directory", err);
  }
  if (st == LOOM_OK) st = write_tokenizer(bpe, (const int32_t(*)[2])merges, nmerges, o->out_dir, err);
  free(merges);
  loom_bpe_free(bpe);
  return st;
}
