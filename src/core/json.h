/* A small JSON reader for the files loom reads from other tools (Hugging
 * Face's config.json, safetensors headers): the whole text parsed into a
 * tree of values, with every failure a message naming the byte offset.
 * Depth is bounded, so hostile input cannot exhaust the stack. */
#ifndef LOOM_JSON_H
#define LOOM_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include "core/status.h"

typedef enum { LOOM_JSON_NULL, LOOM_JSON_BOOL, LOOM_JSON_NUMBER, LOOM_JSON_STRING, LOOM_JSON_ARRAY, LOOM_JSON_OBJECT } loom_json_kind;

typedef struct loom_json {
  loom_json_kind kind;
  bool boolean;
  double number;
  char *string;            /* LOOM_JSON_STRING: NUL-terminated, escapes decoded (may hold \0 from \u0000) */
  size_t length;           /* LOOM_JSON_STRING: its bytes, \0s included */
  size_t count;            /* array items or object members */
  struct loom_json *items; /* [count]: array items, or object values */
  char **keys;             /* [count]: object keys, in file order */
} loom_json;

#define LOOM_JSON_MAX_DEPTH 64

/* Parses text[0..len) (one value, whitespace around it) into *out; `what`
 * names the text in messages. Free with loom_json_free. */
loom_status loom_json_parse(const char *text, size_t len, const char *what, loom_json *out, loom_error *err);
void loom_json_free(loom_json *v);
/* The value of an object's member `key`, or NULL (also when v is no object). */
const loom_json *loom_json_get(const loom_json *v, const char *key);
/* Whether v is a number that is an integer in [min, max]; *out gets it. */
bool loom_json_int(const loom_json *v, long long min, long long max, long long *out);

#endif
