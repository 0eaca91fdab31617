/* Documents from JSONL and text files. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "core/check.h"
#include "core/read_file.h"
#include "data/documents.h"

#define MAX_TEXT_FILE ((size_t)1 << 36)

loom_doc_reader loom_doc_reader_start(const char *const *inputs, int ninputs, bool jsonl) {
  return (loom_doc_reader){.inputs = inputs, .ninputs = ninputs, .jsonl = jsonl};
}

void loom_doc_where(const char *const *inputs, int file, int64_t line, char *buf, size_t cap) {
  if (line > 0) snprintf(buf, cap, "%s:%lld", inputs[file], (long long)line);
  else snprintf(buf, cap, "%s", inputs[file]);
}

int loom_doc_reader_next(loom_doc_reader *r, const char **raw, size_t *len, loom_status *st, loom_error *err) {
  while (r->file < r->ninputs) {
    const char *path = r->inputs[r->file];
    if (!r->jsonl) {
      free(r->buf);
      r->buf = NULL;
      *st = loom_read_small_file(path, "text file", MAX_TEXT_FILE, &r->buf, len, err);
      if (*st != LOOM_OK) return -1;
      r->doc_file = r->file++;
      r->doc_line = 0;
      r->bytes += (int64_t)*len;
      *raw = r->buf;
      return 1;
    }
    if (!r->fp) {
      *st = loom_open_for_reading(path, "JSONL file", &r->fp, err);
      if (*st != LOOM_OK) return -1;
      r->line = 0;
    }
    const ssize_t n = getline(&r->buf, &r->cap, r->fp);
    if (n < 0) {
      const bool failed = ferror(r->fp);
      fclose(r->fp);
      r->fp = NULL;
      if (failed) {
        *st = loom_fail(err, LOOM_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        return -1;
      }
      r->file++;
      continue;
    }
    r->line++;
    r->bytes += n;
    size_t k = (size_t)n;
    while (k && (r->buf[k - 1] == '\n' || r->buf[k - 1] == '\r' || r->buf[k - 1] == ' ' || r->buf[k - 1] == '\t')) k--;
    if (!k) continue;
    r->doc_file = r->file;
    r->doc_line = r->line;
    *raw = r->buf;
    *len = k;
    return 1;
  }
  return 0;
}

void loom_doc_reader_end(loom_doc_reader *r) {
  if (r->fp) fclose(r->fp);
  free(r->buf);
  r->fp = NULL;
  r->buf = NULL;
}

loom_status loom_document_text(const char *raw, size_t len, const char *json_key, const char *where, loom_json *json,
                               const char **text, size_t *text_len, loom_error *err) {
  if (!json_key) {
    *text = raw;
    *text_len = len;
    return LOOM_OK;
  }
  loom_status st = loom_json_parse(raw, len, where, json, err);
  if (st != LOOM_OK) return st;
  const loom_json *v = loom_json_get(json, json_key);
  if (!v || v->kind != LOOM_JSON_STRING)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: no string member \"%s\" in this JSON line", where, json_key);
  *text = v->string;
  *text_len = v->length;
  return LOOM_OK;
}
