/* Recursive-descent JSON (RFC 8259) into a tree of loom_json values. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/json.h"

typedef struct {
  const char *s;
  size_t len, at;
  const char *what;
  loom_error *err;
} reader;

static loom_status fail_at(reader *r, const char *why) {
  return loom_fail(r->err, LOOM_ERR_FORMAT, "%s: bad JSON at byte %zu: %s", r->what, r->at, why);
}

static void skip_space(reader *r) {
  while (r->at < r->len && (r->s[r->at] == ' ' || r->s[r->at] == '\t' || r->s[r->at] == '\n' || r->s[r->at] == '\r'))
    r->at++;
}

static bool take(reader *r, const char *word) {
  const size_t n = strlen(word);
  if (r->len - r->at < n || memcmp(r->s + r->at, word, n) != 0) return false;
  r->at += n;
  return true;
}

static int compare_keys(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* An object naming a member twice is refused: readers disagree on which
 * value counts (Python keeps the last, many C readers the first), so no
 * choice of ours could be the writer's intent. Sorted copies of the keys
 * keep a 128k-entry vocabulary linear-logarithmic. */
static loom_status refuse_duplicate_keys(reader *r, const loom_json *v) {
  if (v->count < 2) return LOOM_OK;
  char **sorted = malloc(v->count * sizeof *sorted);
  if (!sorted) return loom_fail(r->err, LOOM_ERR_NOMEM, "%s: out of memory reading JSON", r->what);
  memcpy(sorted, v->keys, v->count * sizeof *sorted);
  qsort(sorted, v->count, sizeof *sorted, compare_keys);
  loom_status st = LOOM_OK;
  for (size_t i = 1; i < v->count && st == LOOM_OK; i++)
    if (strcmp(sorted[i - 1], sorted[i]) == 0)
      st = loom_fail(r->err, LOOM_ERR_FORMAT, "%s: bad JSON before byte %zu: the member \"%.80s\" appears twice in one object",
                     r->what, r->at, sorted[i]);
  free(sorted);
  return st;
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Four hex digits of a \u escape. */
static long read_u16(reader *r) {
  if (r->len - r->at < 4) return -1;
  long v = 0;
  for (int i = 0; i < 4; i++) {
    const int d = hex_digit(r->s[r->at + i]);
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  r->at += 4;
  return v;
}

static size_t put_utf8(char *out, unsigned long cp) {
  if (cp < 0x80) return out[0] = (char)cp, 1;
  if (cp < 0x800) return out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), 2;
  if (cp < 0x10000)
    return out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | (cp >> 6 & 0x3F)), out[2] = (char)(0x80 | (cp & 0x3F)), 3;
  out[0] = (char)(0xF0 | cp >> 18), out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
  out[2] = (char)(0x80 | (cp >> 6 & 0x3F)), out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* A string after its opening quote; decoded it is never longer than its text. */
static loom_status read_string(reader *r, char **out, size_t *out_len) {
  const size_t start = r->at;
  size_t end = start;
  while (end < r->len && r->s[end] != '"') end += r->s[end] == '\\' ? 2 : 1;
  if (end >= r->len) return fail_at(r, "unterminated string");
  char *buf = malloc(end - start + 1);
  if (!buf) return loom_fail(r->err, LOOM_ERR_NOMEM, "%s: out of memory reading JSON", r->what);
  size_t n = 0;
  while (r->at < end) {
    const unsigned char c = (unsigned char)r->s[r->at++];
    if (c < 0x20) {
      free(buf);
      r->at--;
      return fail_at(r, "control character in a string");
    }
    if (c != '\\') {
      buf[n++] = (char)c;
      continue;
    }
    const char e = r->s[r->at++];
    const char *simple = strchr("\"\\/bfnrt", e);
    if (e && simple) {
      buf[n++] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
      continue;
    }
    long cp = e == 'u' ? read_u16(r) : -1;
    if (cp >= 0xD800 && cp < 0xDC00) { /* a surrogate pair */
      const long lo = take(r, "\\u") ? read_u16(r) : -1;
      cp = lo >= 0xDC00 && lo < 0xE000 ? 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00) : -1;
    } else if (cp >= 0xDC00 && cp < 0xE000) {
      cp = -1;
    }
    if (cp < 0) {
      free(buf);
      return fail_at(r, "bad escape in a string");
    }
    n += put_utf8(buf + n, (unsigned long)cp);
  }
  buf[n] = '\0';
  r->at = end + 1;
  *out = buf;
  if (out_len) *out_len = n;
  return LOOM_OK;
}

static loom_status read_number(reader *r, loom_json *v) {
  const size_t start = r->at;
  if (r->at < r->len && r->s[r->at] == '-') r->at++;
  const size_t digits = r->at;
  while (r->at < r->len && r->s[r->at] >= '0' && r->s[r->at] <= '9') r->at++;
  if (r->at == digits || (r->s[digits] == '0' && r->at > digits + 1)) return fail_at(r, "bad number");
  if (r->at < r->len && r->s[r->at] == '.') {
    const size_t frac = ++r->at;
    while (r->at < r->len && r->s[r->at] >= '0' && r->s[r->at] <= '9') r->at++;
    if (r->at == frac) return fail_at(r, "bad number");
  }
  if (r->at < r->len && (r->s[r->at] == 'e' || r->s[r->at] == 'E')) {
    r->at++;
    if (r->at < r->len && (r->s[r->at] == '+' || r->s[r->at] == '-')) r->at++;
    const size_t exp = r->at;
    while (r->at < r->len && r->s[r->at] >= '0' && r->s[r->at] <= '9') r->at++;
    if (r->at == exp) return fail_at(r, "bad number");
  }
  char buf[64];
  const size_t n = r->at - start;
  if (n >= sizeof buf) return fail_at(r, "number too long");
  memcpy(buf, r->s + start, n);
  buf[n] = '\0';
  v->kind = LOOM_JSON_NUMBER;
  v->number = strtod(buf, NULL);
  if (!isfinite(v->number)) return fail_at(r, "number out of range");
  return LOOM_OK;
}

static loom_status read_value(reader *r, loom_json *v, int depth);

/* Items of an array or members of an object, after the opening bracket. */
static loom_status read_items(reader *r, loom_json *v, int depth, bool object) {
  const char close = object ? '}' : ']';
  size_t cap = 0;
  skip_space(r);
  if (r->at < r->len && r->s[r->at] == close) {
    r->at++;
    return LOOM_OK;
  }
  for (;;) {
    if (v->count == cap) {
      cap = cap ? 2 * cap : 8;
      loom_json *items = realloc(v->items, cap * sizeof *items);
      char **keys = object ? realloc(v->keys, cap * sizeof *keys) : NULL;
      if (items) v->items = items;
      if (keys) v->keys = keys;
      if (!items || (object && !keys)) return loom_fail(r->err, LOOM_ERR_NOMEM, "%s: out of memory reading JSON", r->what);
    }
    loom_json *item = &v->items[v->count];
    memset(item, 0, sizeof *item);
    if (object) v->keys[v->count] = NULL;
    v->count++; /* counted before it is filled, so loom_json_free frees what a failure left */
    skip_space(r);
    if (object) {
      if (!take(r, "\"")) return fail_at(r, "expected a member name");
      loom_status st = read_string(r, &v->keys[v->count - 1], NULL);
      if (st != LOOM_OK) return st;
      skip_space(r);
      if (!take(r, ":")) return fail_at(r, "expected ':'");
    }
    loom_status st = read_value(r, item, depth + 1);
    if (st != LOOM_OK) return st;
    skip_space(r);
    if (take(r, ",")) continue;
    if (r->at < r->len && r->s[r->at] == close) {
      r->at++;
      return object ? refuse_duplicate_keys(r, v) : LOOM_OK;
    }
    return fail_at(r, object ? "expected ',' or '}'" : "expected ',' or ']'");
  }
}

static loom_status read_value(reader *r, loom_json *v, int depth) {
  if (depth > LOOM_JSON_MAX_DEPTH) return fail_at(r, "nested too deeply");
  skip_space(r);
  if (r->at >= r->len) return fail_at(r, "unexpected end");
  const char c = r->s[r->at];
  if (c == '{' || c == '[') {
    r->at++;
    v->kind = c == '{' ? LOOM_JSON_OBJECT : LOOM_JSON_ARRAY;
    return read_items(r, v, depth, c == '{');
  }
  if (c == '"') {
    r->at++;
    v->kind = LOOM_JSON_STRING;
    return read_string(r, &v->string, &v->length);
  }
  if (take(r, "true") || take(r, "false")) {
    v->kind = LOOM_JSON_BOOL;
    v->boolean = c == 't';
    return LOOM_OK;
  }
  if (take(r, "null")) {
    v->kind = LOOM_JSON_NULL;
    return LOOM_OK;
  }
  return read_number(r, v);
}

loom_status loom_json_parse(const char *text, size_t len, const char *what, loom_json *out, loom_error *err) {
  memset(out, 0, sizeof *out);
  reader r = {text, len, 0, what, err};
  if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) r.at = 3; /* a UTF-8 byte order mark, as Python's utf-8-sig reads it */
  loom_status st = read_value(&r, out, 0);
  skip_space(&r);
  if (st == LOOM_OK && r.at != len) st = fail_at(&r, "text after the value");
  if (st != LOOM_OK) loom_json_free(out);
  return st;
}

void loom_json_free(loom_json *v) {
  for (size_t i = 0; i < v->count; i++) {
    loom_json_free(&v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->string);
  memset(v, 0, sizeof *v);
}

const loom_json *loom_json_get(const loom_json *v, const char *key) {
  if (!v || v->kind != LOOM_JSON_OBJECT) return NULL;
  for (size_t i = 0; i < v->count; i++)
    if (strcmp(v->keys[i], key) == 0) return &v->items[i];
  return NULL;
}

bool loom_json_int(const loom_json *v, long long min, long long max, long long *out) {
  if (!v || v->kind != LOOM_JSON_NUMBER || v->number != floor(v->number) || v->number < (double)min ||
      v->number > (double)max)
    return false;
  *out = (long long)v->number;
  return true;
}
