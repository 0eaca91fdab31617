/* Loading byte-level BPE tokenizers: GPT-2 files, Hugging Face's
 * tokenizer.json and tiktoken rank files. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "core/check.h"
#include "core/json.h"
#include "core/read_file.h"
#include "data/bpe_impl.h"

#define MAX_TOKENIZER_FILE ((size_t)512 << 20)
#define MAX_VOCAB (1 << 24) /* past every real vocabulary (o200k, 256k), and its tables stay under 300 MB */

/* ---- GPT-2's byte stand-ins ---- */

/* Decodes the stand-in characters of a vocabulary string back to bytes;
 * false if a character is not one of the 256 stand-ins. */
static bool unmap_bytes(const char *s, size_t len, unsigned char *out, size_t *n) {
  static int byte_of[324];
  static bool ready;
  if (!ready) { /* benign race: every thread writes the same table */
    for (int c = 0; c < 324; c++) byte_of[c] = -1;
    for (int b = 0; b < 256; b++) byte_of[loom_bpe_byte_char((unsigned char)b)] = b;
    ready = true;
  }
  *n = 0;
  for (size_t i = 0; i < len;) {
    const unsigned char c = (unsigned char)s[i];
    unsigned cp;
    if (c < 0x80) {
      cp = c, i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < len) {
      cp = (unsigned)(c & 0x1F) << 6 | ((unsigned char)s[i + 1] & 0x3F), i += 2;
    } else {
      return false;
    }
    if (cp >= 324 || byte_of[cp] < 0) return false;
    out[(*n)++] = (unsigned char)byte_of[cp];
  }
  return true;
}

/* Sets token id from its vocabulary string. */
static loom_status set_mapped_token(loom_bpe *t, const char *key, long long id, const char *what, loom_error *err) {
  const size_t len = strlen(key);
  unsigned char stack[512];
  unsigned char *bytes = len <= sizeof stack ? stack : loom_xmalloc(len, "token");
  size_t n;
  loom_status st = LOOM_OK;
  if (!unmap_bytes(key, len, bytes, &n) || n == 0)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: token \"%.40s\" is not written in GPT-2's byte characters", what, key);
  else if (!bpe_set_token(t, (int)id, bytes, n))
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: token id %lld is used twice", what, id);
  if (bytes != stack) free(bytes);
  return st;
}

/* A vocabulary object {"token": id, ...} into a new tokenizer with room for extra_vocab ids. */
static loom_status load_vocab(loom_bpe **out, const loom_json *vocab, int extra_vocab, const char *what, loom_error *err) {
  *out = NULL;
  if (!vocab || vocab->kind != LOOM_JSON_OBJECT || vocab->count == 0)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: the vocabulary is not a non-empty object of token ids", what);
  long long max_id = extra_vocab - 1;
  for (size_t i = 0; i < vocab->count; i++) {
    long long id;
    if (!loom_json_int(&vocab->items[i], 0, MAX_VOCAB - 1, &id))
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: token \"%.40s\" has no id in [0, %d)", what, vocab->keys[i], MAX_VOCAB);
    if (id > max_id) max_id = id;
  }
  loom_bpe *t = bpe_new((int)max_id + 1);
  for (size_t i = 0; i < vocab->count; i++) {
    long long id;
    loom_json_int(&vocab->items[i], 0, MAX_VOCAB - 1, &id);
    loom_status st = set_mapped_token(t, vocab->keys[i], id, what, err);
    if (st != LOOM_OK) {
      loom_bpe_free(t);
      return st;
    }
  }
  int dup;
  if (!bpe_index_tokens(t, &dup)) {
    loom_bpe_free(t);
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: token id %d has the same bytes as another", what, dup);
  }
  *out = t;
  return LOOM_OK;
}

/* One merge "A B" (rank r) by its two vocabulary strings. */
static loom_status add_mapped_merge(loom_bpe *t, const char *a, size_t alen, const char *b, size_t blen, int32_t rank,
                                    const char *what, loom_error *err) {
  unsigned char stack[1024];
  unsigned char *left = alen + blen <= sizeof stack ? stack : loom_xmalloc(alen + blen, "merge");
  unsigned char *right = left + alen;
  size_t ln, rn;
  int l = -1, r = -1;
  if (unmap_bytes(a, alen, left, &ln) && unmap_bytes(b, blen, right, &rn)) {
    l = bpe_lookup(t, left, ln);
    r = bpe_lookup(t, right, rn);
  }
  if (left != stack) free(left);
  const int al = alen < 40 ? (int)alen : 40, bl = blen < 40 ? (int)blen : 40;
  if (l < 0 || r < 0)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: merge %d (\"%.*s %.*s\") names a token not in the vocabulary", what, rank + 1, al, a, bl, b);
  if (!bpe_add_merge(t, l, r, rank))
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: merge %d (\"%.*s %.*s\") makes a token not in the vocabulary", what, rank + 1, al, a, bl, b);
  return LOOM_OK;
}

/* ---- GPT-2 files: encoder.json + vocab.bpe ---- */

static loom_status load_merges_text(loom_bpe *t, const char *path, loom_error *err) {
  char *text;
  size_t len;
  loom_status st = loom_read_small_file(path, "merges file", MAX_TOKENIZER_FILE, &text, &len, err);
  if (st != LOOM_OK) return st;
  int32_t rank = 0;
  size_t line_no = 0;
  for (char *line = text; st == LOOM_OK && line < text + len;) {
    char *end = memchr(line, '\n', (size_t)(text + len - line));
    if (!end) end = text + len;
    line_no++;
    size_t n = (size_t)(end - line);
    if (n && line[n - 1] == '\r') n--;
    if (n && !(line_no == 1 && strncmp(line, "#version", 8) == 0)) {
      const char *space = memchr(line, ' ', n);
      if (!space || space == line || space == line + n - 1 || memchr(space + 1, ' ', (size_t)(line + n - space - 1)))
        st = loom_fail(err, LOOM_ERR_FORMAT, "%s: line %zu is not two tokens separated by one space", path, line_no);
      else
        st = add_mapped_merge(t, line, (size_t)(space - line), space + 1, (size_t)(line + n - space - 1), rank++, path, err);
    }
    line = end + 1;
  }
  free(text);
  return st;
}

static loom_status load_json_file(const char *path, const char *what, loom_json *out, loom_error *err) {
  char *text;
  size_t len;
  loom_status st = loom_read_small_file(path, what, MAX_TOKENIZER_FILE, &text, &len, err);
  if (st != LOOM_OK) return st;
  st = loom_json_parse(text, len, path, out, err);
  free(text);
  return st;
}

static loom_status load_gpt2_files(loom_bpe **out, const char *vocab_path, const char *merges_path, loom_error *err) {
  loom_json vocab;
  loom_status st = load_json_file(vocab_path, "vocabulary file", &vocab, err);
  if (st != LOOM_OK) return st;
  loom_bpe *t;
  st = load_vocab(&t, &vocab, 0, vocab_path, err);
  loom_json_free(&vocab);
  if (st == LOOM_OK) st = load_merges_text(t, merges_path, err);
  if (st == LOOM_OK) {
    const int eot = bpe_lookup(t, "<|endoftext|>", 13);
    if (eot >= 0) (void)bpe_add_special(t, eot, "<|endoftext|>", 13, true); /* the vocabulary's own token */
    snprintf(t->describe, sizeof t->describe, "GPT-2 files, %d tokens", t->vocab);
    t->format = LOOM_BPE_GPT2_FILES;
    snprintf(t->files[0], sizeof t->files[0], "%s", vocab_path);
    snprintf(t->files[1], sizeof t->files[1], "%s", merges_path);
    st = bpe_finish(t, BPE_PATTERN_GPT2, vocab_path, err);
  }
  if (st != LOOM_OK) loom_bpe_free(t);
  else *out = t;
  return st;
}

/* ---- tokenizer.json ---- */

static bool is_type(const loom_json *v, const char *type) {
  const loom_json *ty = loom_json_get(v, "type");
  return ty && ty->kind == LOOM_JSON_STRING && strcmp(ty->string, type) == 0;
}

static bool flag(const loom_json *v, const char *key) {
  const loom_json *f = loom_json_get(v, key);
  return f && f->kind == LOOM_JSON_BOOL && f->boolean;
}

static bool set_or_empty(const loom_json *v, const char *key) {
  const loom_json *f = loom_json_get(v, key);
  return f && f->kind != LOOM_JSON_NULL && !(f->kind == LOOM_JSON_STRING && f->length == 0) && !(f->kind == LOOM_JSON_BOOL && !f->boolean);
}

/* The pattern of a Split pre-tokenizer (Isolated, not inverted). */
static loom_status split_pattern(const loom_json *split, const char *what, char **pattern, loom_error *err) {
  const loom_json *pat = loom_json_get(split, "pattern"), *behavior = loom_json_get(split, "behavior");
  const loom_json *regex = loom_json_get(pat, "Regex");
  if (!regex || regex->kind != LOOM_JSON_STRING)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: a Split pre-tokenizer needs a {\"Regex\": ...} pattern", what);
  if (!behavior || behavior->kind != LOOM_JSON_STRING || strcmp(behavior->string, "Isolated") != 0 || flag(split, "invert"))
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: only Split pre-tokenizers with behavior Isolated and invert false are supported", what);
  *pattern = regex->string;
  return LOOM_OK;
}

/* The split pattern of the pre-tokenizer: ByteLevel (GPT-2's pattern when
 * use_regex), Split, or a Sequence of a Split and a ByteLevel without regex. */
static loom_status pre_tokenizer(loom_bpe *t, const loom_json *pre, const char *what, char **pattern, loom_error *err) {
  static char whole[] = "[\\s\\S]+";
  static char gpt2[] = BPE_PATTERN_GPT2;
  const loom_json *byte_level = NULL, *split = NULL;
  if (pre && is_type(pre, "Sequence")) {
    const loom_json *list = loom_json_get(pre, "pretokenizers");
    for (size_t i = 0; list && list->kind == LOOM_JSON_ARRAY && i < list->count; i++) {
      const loom_json *p = &list->items[i];
      if (is_type(p, "ByteLevel") && !byte_level) byte_level = p;
      else if (is_type(p, "Split") && !split && !byte_level) split = p;
      else return loom_fail(err, LOOM_ERR_FORMAT, "%s: unsupported pre-tokenizer sequence (loom reads a Split then a ByteLevel)", what);
    }
  } else if (pre && is_type(pre, "ByteLevel")) {
    byte_level = pre;
  } else if (pre && is_type(pre, "Split")) {
    split = pre;
  }
  if (!byte_level && !split)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: the pre-tokenizer is not ByteLevel or Split (loom reads byte-level BPE)", what);
  if (byte_level) {
    t->add_prefix_space = flag(byte_level, "add_prefix_space");
    const loom_json *use_regex = loom_json_get(byte_level, "use_regex");
    const bool regex = !use_regex || (use_regex->kind == LOOM_JSON_BOOL && use_regex->boolean);
    if (regex && split) return loom_fail(err, LOOM_ERR_FORMAT, "%s: a Split and a ByteLevel with use_regex both split the text", what);
    *pattern = regex ? gpt2 : whole;
  }
  return split ? split_pattern(split, what, pattern, err) : LOOM_OK;
}

static loom_status load_merges_json(loom_bpe *t, const loom_json *merges, const char *what, loom_error *err) {
  if (!merges || merges->kind != LOOM_JSON_ARRAY) return loom_fail(err, LOOM_ERR_FORMAT, "%s: model.merges is not a list", what);
  for (size_t i = 0; i < merges->count; i++) {
    const loom_json *m = &merges->items[i];
    loom_status st;
    if (m->kind == LOOM_JSON_STRING) {
      const char *space = memchr(m->string, ' ', m->length);
      if (!space || space == m->string || memchr(space + 1, ' ', m->length - (size_t)(space - m->string) - 1))
        return loom_fail(err, LOOM_ERR_FORMAT, "%s: merge %zu is not two tokens separated by one space", what, i + 1);
      st = add_mapped_merge(t, m->string, (size_t)(space - m->string), space + 1, m->length - (size_t)(space - m->string) - 1,
                            (int32_t)i, what, err);
    } else if (m->kind == LOOM_JSON_ARRAY && m->count == 2 && m->items[0].kind == LOOM_JSON_STRING && m->items[1].kind == LOOM_JSON_STRING) {
      st = add_mapped_merge(t, m->items[0].string, m->items[0].length, m->items[1].string, m->items[1].length, (int32_t)i, what, err);
    } else {
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: merge %zu is neither \"A B\" nor [\"A\", \"B\"]", what, i + 1);
    }
    if (st != LOOM_OK) return st;
  }
  return LOOM_OK;
}

/* Added tokens: their ids and whether they are special. */
static loom_status load_added(loom_bpe *t, const loom_json *added, const char *what, loom_error *err) {
  for (size_t i = 0; added && added->kind == LOOM_JSON_ARRAY && i < added->count; i++) {
    const loom_json *a = &added->items[i], *content = loom_json_get(a, "content");
    long long id;
    if (!loom_json_int(loom_json_get(a, "id"), 0, t->vocab - 1, &id) || !content || content->kind != LOOM_JSON_STRING || content->length == 0)
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: added token %zu has no content or an id outside [0, %d)", what, i + 1, t->vocab);
    if (flag(a, "lstrip") || flag(a, "rstrip") || flag(a, "single_word"))
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: added token \"%.40s\" strips or matches single words, which loom does not support", what, content->string);
    size_t len;
    const unsigned char *have = loom_bpe_token_bytes(t, (int)id, &len);
    if (have && (len != content->length || memcmp(have, content->string, len) != 0))
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: added token %lld (\"%.40s\") is not the vocabulary's token %lld", what, id, content->string, id);
    (void)bpe_add_special(t, (int)id, content->string, content->length, flag(a, "special")); /* its bytes checked above */
  }
  return LOOM_OK;
}

/* Appends "NAME (ID)" to a template's list of names. */
static void name_token(char *names, size_t n, const unsigned char *text, size_t len, long long id) {
  const size_t used = strlen(names);
  snprintf(names + used, n - used, "%s%.*s (%lld)", used ? ", " : "", (int)(len < 40 ? len : 40), (const char *)text, id);
}

/* A TemplateProcessing's template for one text: special tokens (each one or
 * more ids of its special_tokens entry, whose tokens are the vocabulary's)
 * around the sequence "A", held once. Token type ids are not used. */
static loom_status template_processing(loom_bpe *t, const loom_json *pp, const char *what, loom_error *err) {
  const loom_json *single = loom_json_get(pp, "single"), *specials = loom_json_get(pp, "special_tokens");
  if (!single || single->kind != LOOM_JSON_ARRAY)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: the TemplateProcessing post-processor has no \"single\" template", what);
  char names[2][96] = {"", ""};
  int n = 0, before = -1;
  for (size_t i = 0; i < single->count; i++) {
    const loom_json *seq = loom_json_get(&single->items[i], "Sequence");
    const loom_json *sp = loom_json_get(&single->items[i], "SpecialToken"), *name = loom_json_get(sp, "id");
    if (seq) {
      const loom_json *id = loom_json_get(seq, "id");
      if (before >= 0 || !id || id->kind != LOOM_JSON_STRING || strcmp(id->string, "A") != 0)
        return loom_fail(err, LOOM_ERR_FORMAT, "%s: the post-processor's single template must hold the sequence \"A\" once",
                         what);
      before = n;
      continue;
    }
    if (!name || name->kind != LOOM_JSON_STRING)
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: item %zu of the post-processor's template is neither a SpecialToken nor a "
                       "Sequence", what, i + 1);
    const loom_json *entry = loom_json_get(specials, name->string), *ids = loom_json_get(entry, "ids");
    const loom_json *tokens = loom_json_get(entry, "tokens");
    if (!ids || ids->kind != LOOM_JSON_ARRAY || (tokens && (tokens->kind != LOOM_JSON_ARRAY || tokens->count != ids->count)))
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: the post-processor's special token \"%.40s\" has no ids (and tokens as "
                       "many) in its special_tokens", what, name->string);
    for (size_t k = 0; k < ids->count; k++) {
      long long id;
      size_t len;
      const loom_json *text = tokens ? &tokens->items[k] : NULL;
      const unsigned char *have = loom_json_int(&ids->items[k], 0, t->vocab - 1, &id) ? loom_bpe_token_bytes(t, (int)id, &len) : NULL;
      if (!have || (text && (text->kind != LOOM_JSON_STRING || text->length != len || memcmp(have, text->string, len) != 0)))
        return loom_fail(err, LOOM_ERR_FORMAT, "%s: the post-processor's special token \"%.40s\" has an id that is not its "
                         "token in the vocabulary", what, name->string);
      if (n == BPE_TEMPLATE_MAX)
        return loom_fail(err, LOOM_ERR_FORMAT, "%s: the post-processor's template adds more than %d ids", what, BPE_TEMPLATE_MAX);
      t->template_ids[n++] = (int32_t)id;
      name_token(names[before >= 0], sizeof names[0], have, len, id);
    }
  }
  if (before < 0)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: the post-processor's single template must hold the sequence \"A\" once", what);
  t->template_before = before, t->template_after = n - before;
  snprintf(t->template_names, sizeof t->template_names, "%s%s%s%s%s each text", names[0], *names[0] ? " before" : "",
           *names[0] && *names[1] ? " and " : "", names[1], *names[1] ? " after" : "");
  return LOOM_OK;
}

/* The post-processor: none, ByteLevel (which changes offsets only), a
 * TemplateProcessing, or a Sequence of those with one template at most. */
static loom_status post_processor(loom_bpe *t, const loom_json *pp, const char *what, loom_error *err) {
  if (!pp || pp->kind == LOOM_JSON_NULL || is_type(pp, "ByteLevel")) return LOOM_OK;
  if (is_type(pp, "TemplateProcessing")) return template_processing(t, pp, what, err);
  const loom_json *list = loom_json_get(pp, "processors");
  if (!is_type(pp, "Sequence") || !list || list->kind != LOOM_JSON_ARRAY) {
    const loom_json *type = loom_json_get(pp, "type");
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: post-processor %.40s is not supported (loom applies ByteLevel and "
                     "TemplateProcessing, alone or in a Sequence)", what,
                     type && type->kind == LOOM_JSON_STRING ? type->string : "without a type");
  }
  int templates = 0;
  for (size_t i = 0; i < list->count; i++) {
    const loom_json *p = &list->items[i];
    if (is_type(p, "Sequence") || (is_type(p, "TemplateProcessing") && templates++))
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: a post-processor Sequence may hold one TemplateProcessing, not nested "
                       "sequences or a second template", what);
    const loom_status st = post_processor(t, p, what, err);
    if (st != LOOM_OK) return st;
  }
  return LOOM_OK;
}

loom_status bpe_load_tokenizer_json(loom_bpe **out, const char *path, loom_error *err) {
  loom_json j;
  loom_status st = load_json_file(path, "tokenizer file", &j, err);
  if (st != LOOM_OK) return st;
  const loom_json *model = loom_json_get(&j, "model"), *added = loom_json_get(&j, "added_tokens");
  const loom_json *norm = loom_json_get(&j, "normalizer"), *decoder = loom_json_get(&j, "decoder");
  loom_bpe *t = NULL;
  int added_max = 0;
  long long id;
  for (size_t i = 0; added && added->kind == LOOM_JSON_ARRAY && i < added->count; i++)
    if (loom_json_int(loom_json_get(&added->items[i], "id"), 0, MAX_VOCAB - 1, &id) && id + 1 > added_max) added_max = (int)id + 1;
  char *pattern = NULL;
  if (!model || !is_type(model, "BPE"))
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: model.type is not BPE", path);
  else if (set_or_empty(model, "dropout") || flag(model, "byte_fallback") || set_or_empty(model, "continuing_subword_prefix") ||
           set_or_empty(model, "end_of_word_suffix"))
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: BPE with dropout, byte fallback or subword affixes is not byte-level BPE", path);
  else if (norm && norm->kind != LOOM_JSON_NULL)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: normalizers are not supported (this one is not null)", path);
  else if (decoder && decoder->kind != LOOM_JSON_NULL && !is_type(decoder, "ByteLevel"))
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: the decoder is not ByteLevel", path);
  if (st == LOOM_OK) st = load_vocab(&t, loom_json_get(model, "vocab"), added_max, path, err);
  if (st == LOOM_OK) st = pre_tokenizer(t, loom_json_get(&j, "pre_tokenizer"), path, &pattern, err);
  if (st == LOOM_OK) st = load_merges_json(t, loom_json_get(model, "merges"), path, err);
  if (st == LOOM_OK) st = load_added(t, added, path, err);
  if (st == LOOM_OK) st = post_processor(t, loom_json_get(&j, "post_processor"), path, err);
  if (st == LOOM_OK) {
    t->whole_word_first = flag(model, "ignore_merges");
    snprintf(t->describe, sizeof t->describe, "tokenizer.json, %d tokens", t->vocab);
    t->format = LOOM_BPE_TOKENIZER_JSON;
    snprintf(t->files[0], sizeof t->files[0], "%s", path);
    st = bpe_finish(t, pattern, path, err);
  }
  loom_json_free(&j);
  if (st != LOOM_OK) loom_bpe_free(t);
  else *out = t;
  return st;
}

/* ---- tiktoken rank files ---- */

typedef struct {
  const char *name, *pattern;
  int nspecial;
  struct {
    const char *text;
    int id;
  } special[5];
} tiktoken_encoding;

static const tiktoken_encoding TIKTOKEN_ENCODINGS[] = {
    {"r50k_base", BPE_PATTERN_GPT2, 1, {{"<|endoftext|>", 50256}}},
    {"gpt2", BPE_PATTERN_GPT2, 1, {{"<|endoftext|>", 50256}}},
    {"p50k_base", BPE_PATTERN_GPT2, 1, {{"<|endoftext|>", 50256}}},
    {"cl100k_base", BPE_PATTERN_CL100K, 5,
     {{"<|endoftext|>", 100257}, {"<|fim_prefix|>", 100258}, {"<|fim_middle|>", 100259}, {"<|fim_suffix|>", 100260}, {"<|endofprompt|>", 100276}}},
};

static int base64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Standard base64 with padding; false if malformed. */
static bool base64_decode(const char *s, size_t len, unsigned char *out, size_t *n) {
  if (len == 0 || len % 4) return false;
  *n = 0;
  for (size_t i = 0; i < len; i += 4) {
    int v[4];
    for (int k = 0; k < 4; k++) v[k] = s[i + k] == '=' && i + 4 == len && k >= 2 ? -2 : base64_value((unsigned char)s[i + k]);
    if (v[0] < 0 || v[1] < 0 || v[2] == -1 || v[3] == -1 || (v[2] == -2 && v[3] != -2)) return false;
    out[(*n)++] = (unsigned char)(v[0] << 2 | v[1] >> 4);
    if (v[2] >= 0) out[(*n)++] = (unsigned char)(v[1] << 4 | v[2] >> 2);
    if (v[3] >= 0) out[(*n)++] = (unsigned char)(v[2] << 6 | v[3]);
  }
  return true;
}

static const tiktoken_encoding *encoding_named(const char *path) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  const size_t stem = strcspn(base, ".");
  for (size_t i = 0; i < sizeof TIKTOKEN_ENCODINGS / sizeof *TIKTOKEN_ENCODINGS; i++)
    if (strlen(TIKTOKEN_ENCODINGS[i].name) == stem && strncmp(base, TIKTOKEN_ENCODINGS[i].name, stem) == 0) return &TIKTOKEN_ENCODINGS[i];
  return NULL;
}

loom_status bpe_load_tiktoken(loom_bpe **out, const char *path, const char *name, loom_error *err) {
  const tiktoken_encoding *enc = encoding_named(name);
  if (!enc)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: a tiktoken rank file is named after its encoding (r50k_base, gpt2, p50k_base, cl100k_base)", path);
  char *text;
  size_t len;
  loom_status st = loom_read_small_file(path, "tiktoken rank file", MAX_TOKENIZER_FILE, &text, &len, err);
  if (st != LOOM_OK) return st;
  /* Two passes: the largest rank sizes the tables, then the tokens fill them. */
  loom_bpe *t = NULL;
  for (int pass = 0; pass < 2 && st == LOOM_OK; pass++) {
    long long max_rank = 0;
    for (int i = 0; i < enc->nspecial; i++) max_rank = enc->special[i].id > max_rank ? enc->special[i].id : max_rank;
    size_t line_no = 0;
    for (char *line = text; st == LOOM_OK && line < text + len;) {
      char *end = memchr(line, '\n', (size_t)(text + len - line));
      if (!end) end = text + len;
      line_no++;
      const size_t n = (size_t)(end - line);
      const char *space = memchr(line, ' ', n);
      unsigned char bytes[3072];
      size_t nb;
      char *num_end;
      const long long rank = space ? strtoll(space + 1, &num_end, 10) : -1;
      if (n == 0) {
      } else if (!space || (size_t)(space - line) > 4 * sizeof bytes / 3 || !base64_decode(line, (size_t)(space - line), bytes, &nb)) {
        st = loom_fail(err, LOOM_ERR_FORMAT, "%s: line %zu is not a base64 token, a space and a rank", path, line_no);
      } else if (num_end != end || rank < 0 || rank >= MAX_VOCAB) {
        st = loom_fail(err, LOOM_ERR_FORMAT, "%s: line %zu: the rank is not an integer in [0, %d)", path, line_no, MAX_VOCAB);
      } else if (pass == 0) {
        max_rank = rank > max_rank ? rank : max_rank;
      } else if (!bpe_set_token(t, (int)rank, bytes, nb)) {
        st = loom_fail(err, LOOM_ERR_FORMAT, "%s: line %zu: rank %lld is used twice", path, line_no, rank);
      }
      line = end + 1;
    }
    if (pass == 0 && st == LOOM_OK) t = bpe_new((int)max_rank + 1);
  }
  free(text);
  int dup;
  if (st == LOOM_OK && !bpe_index_tokens(t, &dup)) st = loom_fail(err, LOOM_ERR_FORMAT, "%s: rank %d has the same bytes as another", path, dup);
  if (st == LOOM_OK) {
    bpe_merges_from_ranks(t);
    t->whole_word_first = true;
    for (int i = 0; st == LOOM_OK && i < enc->nspecial; i++)
      if (!bpe_add_special(t, enc->special[i].id, enc->special[i].text, strlen(enc->special[i].text), true))
        st = loom_fail(err, LOOM_ERR_FORMAT, "%s: rank %d is %s's special token %s, but the file gives it to another token",
                       path, enc->special[i].id, enc->name, enc->special[i].text);
  }
  if (st == LOOM_OK) {
    snprintf(t->describe, sizeof t->describe, "tiktoken %s, %d tokens", enc->name, t->vocab);
    t->format = LOOM_BPE_TIKTOKEN;
    snprintf(t->files[0], sizeof t->files[0], "%s", path);
    st = bpe_finish(t, enc->pattern, path, err);
  }
  if (st != LOOM_OK) loom_bpe_free(t);
  else *out = t;
  return st;
}

/* ---- by path ---- */

static bool exists(const char *dir, const char *name, char *path, size_t cap) {
  struct stat sb;
  snprintf(path, cap, "%s/%s", dir, name);
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

loom_status loom_bpe_load(loom_bpe **out, const char *path, loom_error *err) {
  *out = NULL;
  struct stat sb;
  if (stat(path, &sb) != 0)
    return loom_fail(err, LOOM_ERR_IO, "%s: %s", path, errno == ENOENT ? "no such tokenizer file or directory" : loom_errno_words(errno));
  if (S_ISDIR(sb.st_mode)) {
    char vocab[4096], merges[4096];
    if (exists(path, "tokenizer.json", vocab, sizeof vocab)) return bpe_load_tokenizer_json(out, vocab, err);
    if (exists(path, "encoder.json", vocab, sizeof vocab) && exists(path, "vocab.bpe", merges, sizeof merges))
      return load_gpt2_files(out, vocab, merges, err);
    if (exists(path, "vocab.json", vocab, sizeof vocab) && exists(path, "merges.txt", merges, sizeof merges))
      return load_gpt2_files(out, vocab, merges, err);
    return loom_fail(err, LOOM_ERR_USAGE, "%s: no tokenizer.json, encoder.json + vocab.bpe, or vocab.json + merges.txt in this directory", path);
  }
  if (loom_str_ends_with(path, ".json")) return bpe_load_tokenizer_json(out, path, err);
  return bpe_load_tiktoken(out, path, path, err);
}
