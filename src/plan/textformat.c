/* Descriptor-driven protobuf text format. */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "core/fault.h"
#include "core/strbuf.h"
#include "plan/textformat.h"

/* ---- printing ---- */

/* protoc's SimpleFtoa / SimpleDtoa: the shortest of %.{6,9}g (float) or
 * %.{15,17}g (double) that reads back to the same value. */
static void put_real(loom_strbuf *b, double v, int is_float) {
  if (isnan(v)) { loom_strbuf_printf(b, "nan"); return; }
  if (isinf(v)) { loom_strbuf_printf(b, v > 0 ? "inf" : "-inf"); return; }
  char text[64];
  snprintf(text, sizeof text, "%.*g", is_float ? FLT_DIG : DBL_DIG, v);
  const int exact = is_float ? strtof(text, NULL) == (float)v : strtod(text, NULL) == v;
  if (!exact) snprintf(text, sizeof text, "%.*g", is_float ? FLT_DIG + 3 : DBL_DIG + 2, v);
  loom_strbuf_printf(b, "%s", text);
}

/* protoc's CEscape: the common escapes, other unprintable bytes in octal. */
static void put_escaped(loom_strbuf *b, const uint8_t *s, size_t n) {
  loom_strbuf_printf(b, "\"");
  for (size_t i = 0; i < n; i++) {
    switch (s[i]) {
    case '\n': loom_strbuf_printf(b, "\\n"); break;
    case '\r': loom_strbuf_printf(b, "\\r"); break;
    case '\t': loom_strbuf_printf(b, "\\t"); break;
    case '\"': loom_strbuf_printf(b, "\\\""); break;
    case '\'': loom_strbuf_printf(b, "\\'"); break;
    case '\\': loom_strbuf_printf(b, "\\\\"); break;
    default:
      if (s[i] < 0x20 || s[i] >= 0x7f) loom_strbuf_printf(b, "\\%03o", s[i]);
      else loom_strbuf_printf(b, "%c", s[i]);
    }
  }
  loom_strbuf_printf(b, "\"");
}

static void print_message(loom_strbuf *b, const ProtobufCMessage *msg, int depth);

static void print_value(loom_strbuf *b, const ProtobufCFieldDescriptor *f, const void *v, int depth) {
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32: loom_strbuf_printf(b, "%" PRId32, *(const int32_t *)v); break;
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64: loom_strbuf_printf(b, "%" PRId64, *(const int64_t *)v); break;
  case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32: loom_strbuf_printf(b, "%" PRIu32, *(const uint32_t *)v); break;
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: loom_strbuf_printf(b, "%" PRIu64, *(const uint64_t *)v); break;
  case PROTOBUF_C_TYPE_BOOL: loom_strbuf_printf(b, "%s", *(const protobuf_c_boolean *)v ? "true" : "false"); break;
  case PROTOBUF_C_TYPE_FLOAT: put_real(b, *(const float *)v, 1); break;
  case PROTOBUF_C_TYPE_DOUBLE: put_real(b, *(const double *)v, 0); break;
  case PROTOBUF_C_TYPE_ENUM: {
    const ProtobufCEnumValue *e = protobuf_c_enum_descriptor_get_value(f->descriptor, *(const int *)v);
    if (e) loom_strbuf_printf(b, "%s", e->name);
    else loom_strbuf_printf(b, "%d", *(const int *)v);
    break;
  }
  case PROTOBUF_C_TYPE_STRING: {
    const char *s = *(char *const *)v;
    put_escaped(b, (const uint8_t *)s, strlen(s));
    break;
  }
  case PROTOBUF_C_TYPE_BYTES: {
    const ProtobufCBinaryData *d = v;
    put_escaped(b, d->data, d->len);
    break;
  }
  case PROTOBUF_C_TYPE_MESSAGE:
    loom_strbuf_printf(b, "{\n");
    print_message(b, *(ProtobufCMessage *const *)v, depth + 1);
    loom_strbuf_printf(b, "%*s}", 2 * depth, "");
    break;
  }
}

static size_t value_size(const ProtobufCFieldDescriptor *f) {
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_DOUBLE: return 8;
  case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
  case PROTOBUF_C_TYPE_ENUM: return sizeof(int);
  case PROTOBUF_C_TYPE_STRING: case PROTOBUF_C_TYPE_MESSAGE: return sizeof(void *);
  case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
  default: return 4;
  }
}

/* Whether an optional field is set, by protobuf-c's own rule for packing. */
static int is_set(const ProtobufCFieldDescriptor *f, const char *base) {
  if (f->label == PROTOBUF_C_LABEL_REQUIRED) return 1;
  if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE) {
    const void *p = *(void *const *)(base + f->offset);
    return p != NULL && p != f->default_value;
  }
  return *(const protobuf_c_boolean *)(base + f->quantifier_offset);
}

static int by_id(const void *a, const void *b) {
  return (int)(*(const ProtobufCFieldDescriptor *const *)a)->id - (int)(*(const ProtobufCFieldDescriptor *const *)b)->id;
}

static void print_message(loom_strbuf *b, const ProtobufCMessage *msg, int depth) {
  const ProtobufCMessageDescriptor *d = msg->descriptor;
  const ProtobufCFieldDescriptor **order = malloc(d->n_fields * sizeof *order);
  for (unsigned i = 0; i < d->n_fields; i++) order[i] = &d->fields[i];
  qsort(order, d->n_fields, sizeof *order, by_id);
  const char *base = (const char *)msg;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = order[i];
    const char *sep = f->type == PROTOBUF_C_TYPE_MESSAGE ? " " : ": ";
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      const size_t n = *(const size_t *)(base + f->quantifier_offset);
      const char *items = *(char *const *)(base + f->offset);
      for (size_t k = 0; k < n; k++) {
        loom_strbuf_printf(b, "%*s%s%s", 2 * depth, "", f->name, sep);
        print_value(b, f, items + k * value_size(f), depth);
        loom_strbuf_printf(b, "\n");
      }
    } else if (is_set(f, base)) {
      loom_strbuf_printf(b, "%*s%s%s", 2 * depth, "", f->name, sep);
      print_value(b, f, base + f->offset, depth);
      loom_strbuf_printf(b, "\n");
    }
  }
  free(order);
}

char *loom_text_print(const ProtobufCMessage *msg) {
  loom_strbuf b = {0};
  loom_strbuf_printf(&b, "%s", "");
  print_message(&b, msg, 0);
  return b.buf;
}

/* ---- parsing ---- */

typedef struct {
  const char *p, *end;
  int line;
  loom_error *err;
  int failed;
  loom_status status; /* of the first failure: bad text, or out of memory */
} lexer;

static int fail(lexer *lx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(lexer *lx, const char *fmt, ...) {
  if (lx->failed) return 0;
  char what[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  loom_fail(lx->err, LOOM_ERR_FORMAT, "line %d: %s", lx->line, what);
  lx->failed = 1;
  lx->status = LOOM_ERR_FORMAT;
  return 0;
}

static int out_of_memory(lexer *lx) {
  if (lx->failed) return 0;
  loom_fail(lx->err, LOOM_ERR_NOMEM, "line %d: out of memory parsing the text", lx->line);
  lx->failed = 1;
  lx->status = LOOM_ERR_NOMEM;
  return 0;
}

static void skip_space(lexer *lx) {
  while (lx->p < lx->end) {
    if (*lx->p == '\n') lx->line++;
    if (*lx->p == '#') {
      while (lx->p < lx->end && *lx->p != '\n') lx->p++;
      continue;
    }
    if (!isspace((unsigned char)*lx->p)) break;
    lx->p++;
  }
}

static int peek(lexer *lx, char c) {
  skip_space(lx);
  return lx->p < lx->end && *lx->p == c;
}

static int accept(lexer *lx, char c) {
  if (!peek(lx, c)) return 0;
  lx->p++;
  return 1;
}

/* An identifier or a number-like word into out; 0 if none. */
static int word(lexer *lx, char *out, size_t n) {
  skip_space(lx);
  size_t k = 0;
  while (lx->p < lx->end && (isalnum((unsigned char)*lx->p) || strchr("_.+-", *lx->p))) {
    if (k + 1 < n) out[k++] = *lx->p;
    lx->p++;
  }
  out[k] = '\0';
  return k > 0;
}

/* A quoted string (adjacent pieces concatenate), unescaped into a new buffer. */
static int quoted(lexer *lx, char **out, size_t *len) {
  size_t cap = 64, n = 0;
  char *s = loom_fault_malloc(cap);
  if (!s) return out_of_memory(lx);
  int pieces = 0;
  while (peek(lx, '"') || peek(lx, '\'')) {
    const char q = *lx->p++;
    pieces++;
    while (lx->p < lx->end && *lx->p != q) {
      if (*lx->p == '\n') { free(s); return fail(lx, "newline inside a string"); }
      int c = (unsigned char)*lx->p++;
      if (c == '\\' && lx->p < lx->end) {
        c = (unsigned char)*lx->p++;
        if (c >= '0' && c <= '7') {
          int v = c - '0';
          for (int d = 0; d < 2 && lx->p < lx->end && *lx->p >= '0' && *lx->p <= '7'; d++) v = v * 8 + (*lx->p++ - '0');
          c = v;
        } else {
          const char *from = "nrt\"'\\", *to = "\n\r\t\"'\\";
          const char *at = strchr(from, c);
          if (!at) { free(s); return fail(lx, "unknown escape \\%c in a string", c); }
          c = to[at - from];
        }
      }
      if (n + 2 > cap) {
        char *bigger = loom_fault_realloc(s, cap *= 2);
        if (!bigger) {
          free(s);
          return out_of_memory(lx);
        }
        s = bigger;
      }
      s[n++] = (char)c;
    }
    if (lx->p >= lx->end) { free(s); return fail(lx, "unterminated string"); }
    lx->p++;
  }
  if (!pieces) { free(s); return fail(lx, "expected a quoted string"); }
  s[n] = '\0';
  *out = s;
  *len = n;
  return 1;
}

static int parse_integer(lexer *lx, const char *w, const char *field, int64_t lo, uint64_t hi, int64_t *sv, uint64_t *uv) {
  char *end;
  errno = 0;
  if (w[0] == '-') {
    const long long v = strtoll(w, &end, 0);
    if (*end || errno || v < lo) return fail(lx, "field '%s': '%s' is not an integer in range", field, w);
    *sv = v;
    *uv = (uint64_t)v;
    return 1;
  }
  const unsigned long long v = strtoull(w, &end, 0);
  if (!*w || *end || errno || v > hi) return fail(lx, "field '%s': '%s' is not an integer in range", field, w);
  *uv = v;
  *sv = (int64_t)v;
  return 1;
}

static int parse_message_body(lexer *lx, ProtobufCMessage *msg, char close);

/* A new message of type d, or NULL when out of memory. */
static ProtobufCMessage *new_message(const ProtobufCMessageDescriptor *d) {
  ProtobufCMessage *m = loom_fault_calloc(1, d->sizeof_message);
  if (m) d->message_init(m);
  return m;
}

/* Parses one value of field f into slot (its storage in the message or array). */
static int parse_value(lexer *lx, const ProtobufCFieldDescriptor *f, void *slot) {
  if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
    const char close = accept(lx, '{') ? '}' : accept(lx, '<') ? '>' : 0;
    if (!close) return fail(lx, "field '%s': expected '{'", f->name);
    ProtobufCMessage *sub = new_message(f->descriptor);
    if (!sub) return out_of_memory(lx);
    *(ProtobufCMessage **)slot = sub;
    return parse_message_body(lx, sub, close);
  }
  if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_BYTES) {
    char *s = NULL;
    size_t n = 0;
    if (!quoted(lx, &s, &n)) return 0;
    if (f->type == PROTOBUF_C_TYPE_STRING) *(char **)slot = s;
    else *(ProtobufCBinaryData *)slot = (ProtobufCBinaryData){n, (uint8_t *)s};
    return 1;
  }
  char w[128];
  if (!word(lx, w, sizeof w)) return fail(lx, "field '%s': expected a value", f->name);
  int64_t sv;
  uint64_t uv;
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
    if (!parse_integer(lx, w, f->name, INT32_MIN, INT32_MAX, &sv, &uv)) return 0;
    *(int32_t *)slot = (int32_t)sv;
    return 1;
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    if (!parse_integer(lx, w, f->name, INT64_MIN, INT64_MAX, &sv, &uv)) return 0;
    *(int64_t *)slot = sv;
    return 1;
  case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
    if (!parse_integer(lx, w, f->name, 0, UINT32_MAX, &sv, &uv)) return 0;
    *(uint32_t *)slot = (uint32_t)uv;
    return 1;
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
    if (!parse_integer(lx, w, f->name, 0, UINT64_MAX, &sv, &uv)) return 0;
    *(uint64_t *)slot = uv;
    return 1;
  case PROTOBUF_C_TYPE_BOOL:
    if (strcmp(w, "true") == 0 || strcmp(w, "True") == 0 || strcmp(w, "t") == 0 || strcmp(w, "1") == 0) *(protobuf_c_boolean *)slot = 1;
    else if (strcmp(w, "false") == 0 || strcmp(w, "False") == 0 || strcmp(w, "f") == 0 || strcmp(w, "0") == 0) *(protobuf_c_boolean *)slot = 0;
    else return fail(lx, "field '%s': expected true or false, got '%s'", f->name, w);
    return 1;
  case PROTOBUF_C_TYPE_FLOAT:
  case PROTOBUF_C_TYPE_DOUBLE: {
    char *end;
    double v = strtod(w, &end);
    if (end != w && (*end == 'f' || *end == 'F') && end[1] == '\0') end++;
    if (strcmp(w, "inf") == 0 || strcmp(w, "infinity") == 0) v = INFINITY, end = w + strlen(w);
    if (strcmp(w, "-inf") == 0 || strcmp(w, "-infinity") == 0) v = -INFINITY, end = w + strlen(w);
    if (strcmp(w, "nan") == 0) v = NAN, end = w + strlen(w);
    if (end == w || *end) return fail(lx, "field '%s': '%s' is not a number", f->name, w);
    if (f->type == PROTOBUF_C_TYPE_FLOAT) *(float *)slot = (float)v;
    else *(double *)slot = v;
    return 1;
  }
  case PROTOBUF_C_TYPE_ENUM: {
    const ProtobufCEnumValue *e = protobuf_c_enum_descriptor_get_value_by_name(f->descriptor, w);
    if (!e) {
      char *end;
      const long v = strtol(w, &end, 10);
      e = *end ? NULL : protobuf_c_enum_descriptor_get_value(f->descriptor, (int)v);
    }
    if (!e) return fail(lx, "field '%s': '%s' is not a value of %s", f->name, w,
                        ((const ProtobufCEnumDescriptor *)f->descriptor)->name);
    *(int *)slot = e->value;
    return 1;
  }
  default: return fail(lx, "field '%s': unsupported type", f->name);
  }
}

/* Appends one element to a repeated field and returns its storage (NULL:
 * out of memory, the field as it was). */
static void *grow(char *base, const ProtobufCFieldDescriptor *f) {
  size_t *n = (size_t *)(base + f->quantifier_offset);
  char **items = (char **)(base + f->offset);
  const size_t size = value_size(f);
  char *bigger = loom_fault_realloc(*items, (*n + 1) * size);
  if (!bigger) return NULL;
  *items = bigger;
  memset(*items + *n * size, 0, size);
  return *items + (*n)++ * size;
}

static int parse_element(lexer *lx, const ProtobufCFieldDescriptor *f, char *base) {
  void *slot = grow(base, f);
  return slot ? parse_value(lx, f, slot) : out_of_memory(lx);
}

static int parse_field(lexer *lx, ProtobufCMessage *msg, char *seen) {
  const ProtobufCMessageDescriptor *d = msg->descriptor;
  char name[128];
  if (!word(lx, name, sizeof name)) return fail(lx, "expected a field name");
  const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, name);
  if (!f) return fail(lx, "unknown field '%s' in %s", name, d->name);
  const int has_colon = accept(lx, ':');
  if (!has_colon && f->type != PROTOBUF_C_TYPE_MESSAGE) return fail(lx, "field '%s': expected ':'", name);
  char *base = (char *)msg;
  if (f->label == PROTOBUF_C_LABEL_REPEATED) {
    if (accept(lx, '[')) {
      if (accept(lx, ']')) return 1;
      do {
        if (!parse_element(lx, f, base)) return 0;
      } while (accept(lx, ','));
      return accept(lx, ']') ? 1 : fail(lx, "field '%s': expected ']'", name);
    }
    return parse_element(lx, f, base);
  }
  const size_t index = (size_t)(f - d->fields);
  if (seen[index]) return fail(lx, "field '%s' is given twice", name);
  seen[index] = 1;
  if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE && f->label == PROTOBUF_C_LABEL_OPTIONAL)
    *(protobuf_c_boolean *)(base + f->quantifier_offset) = 1;
  return parse_value(lx, f, base + f->offset);
}

static int parse_message_body(lexer *lx, ProtobufCMessage *msg, char close) {
  char *seen = loom_fault_calloc(msg->descriptor->n_fields + 1, 1);
  if (!seen) return out_of_memory(lx);
  int ok = 1;
  while (ok) {
    skip_space(lx);
    if (close ? accept(lx, close) : lx->p >= lx->end) break;
    if (lx->p >= lx->end) {
      ok = fail(lx, "expected '%c' before the end of the text", close);
      break;
    }
    ok = parse_field(lx, msg, seen);
    if (ok && !accept(lx, ',')) accept(lx, ';');
  }
  free(seen);
  return ok;
}

loom_status loom_text_parse(const ProtobufCMessageDescriptor *desc, const char *text, size_t len,
                            ProtobufCMessage **out, loom_error *err) {
  lexer lx = {.p = text, .end = text + len, .line = 1, .err = err};
  ProtobufCMessage *msg = new_message(desc);
  *out = NULL;
  if (!msg) return loom_fail(err, LOOM_ERR_NOMEM, "out of memory parsing the text");
  if (!parse_message_body(&lx, msg, 0)) {
    protobuf_c_message_free_unpacked(msg, NULL);
    return lx.status;
  }
  *out = msg;
  return LOOM_OK;
}
