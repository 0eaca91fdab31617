/* Corpus preparation: read documents in batches, tokenize each batch across
 * worker threads, write the batch in input order. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/check.h"
#include "core/json.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/write_file.h"
#include "data/documents.h"
#include "data/indexed.h"
#include "data/prepare.h"
#include "data/token_file.h"

#define BATCH_BYTES_PER_WORKER ((size_t)4 << 20)

typedef struct {
  size_t off, len; /* the raw line or text in the batch buffer */
  int file;
  int64_t line;    /* 1-based line of a JSONL document, 0 for a whole text file */
} doc_ref;

typedef struct {
  char *buf;
  size_t len, cap;
  doc_ref *docs;
  size_t count, doc_cap;
} batch;

typedef struct {
  const loom_prepare_options *o;
  const batch *b;
  size_t first, last;       /* this worker's documents */
  loom_bpe_encoder *enc;
  loom_ids ids;
  size_t *ends;             /* [last - first]: end of each document's ids */
  size_t ends_cap;
  loom_status st;
  loom_error err;
} worker;

static void batch_add(batch *b, const char *text, size_t len, int file, int64_t line) {
  if (b->len + len > b->cap) {
    b->cap = (b->len + len) * 2;
    b->buf = realloc(b->buf, b->cap);
    LOOM_CHECK(b->buf != NULL, "out of memory reading documents");
  }
  memcpy(b->buf + b->len, text, len);
  if (b->count == b->doc_cap) {
    b->doc_cap = b->doc_cap ? b->doc_cap * 2 : 1024;
    b->docs = realloc(b->docs, b->doc_cap * sizeof *b->docs);
    LOOM_CHECK(b->docs != NULL, "out of memory reading documents");
  }
  b->docs[b->count++] = (doc_ref){b->len, len, file, line};
  b->len += len;
}

static void *work(void *arg) {
  worker *w = arg;
  w->ids.count = 0;
  w->st = LOOM_OK;
  const size_t n = w->last - w->first;
  if (n > w->ends_cap) {
    w->ends_cap = n * 2;
    w->ends = realloc(w->ends, w->ends_cap * sizeof *w->ends);
    LOOM_CHECK(w->ends != NULL, "out of memory tokenizing");
  }
  const int eod = w->o->tokenizer ? loom_bpe_eod(w->o->tokenizer) : -1;
  for (size_t i = 0; i < n; i++) {
    loom_json json = {0};
    const char *text;
    size_t len;
    const doc_ref *d = &w->b->docs[w->first + i];
    char where[4200];
    if (w->o->json_key) loom_doc_where(w->o->inputs, d->file, d->line, where, sizeof where);
    w->st = loom_document_text(w->b->buf + d->off, d->len, w->o->json_key, where, &json, &text, &len, &w->err);
    if (w->st != LOOM_OK) {
      loom_json_free(&json);
      return NULL;
    }
    const size_t before = w->ids.count;
    if (w->enc && w->o->add_special_tokens) {
      loom_bpe_encode_templated(w->enc, text, len, &w->ids);
    } else if (w->enc) {
      loom_bpe_encode(w->enc, text, len, &w->ids);
    } else {
      for (size_t k = 0; k < len; k++) loom_ids_push(&w->ids, (unsigned char)text[k]);
    }
    if (w->o->append_eod && w->ids.count > before) loom_ids_push(&w->ids, eod);
    w->ends[i] = w->ids.count;
    loom_json_free(&json);
  }
  return NULL;
}

typedef struct {
  const loom_prepare_options *o;
  loom_indexed_writer indexed;
  bool indexed_open;
  uint16_t *llmc;
  size_t llmc_count, llmc_cap;
} output;

static loom_status write_batch(output *out, worker *workers, int nworkers, loom_prepare_stats *stats, loom_error *err) {
  for (int k = 0; k < nworkers; k++) {
    worker *w = &workers[k];
    size_t start = 0;
    for (size_t i = 0; i < w->last - w->first; i++) {
      const size_t count = w->ends[i] - start;
      const int32_t *ids = w->ids.ids + start;
      start = w->ends[i];
      if (count == 0) {
        stats->empty++;
        continue;
      }
      stats->documents++;
      stats->tokens += (int64_t)count;
      if (out->indexed_open) {
        loom_status st = loom_indexed_add(&out->indexed, ids, count, err);
        if (st != LOOM_OK) return st;
        loom_indexed_end_document(&out->indexed);
        continue;
      }
      if (out->llmc_count + count > out->llmc_cap) {
        out->llmc_cap = (out->llmc_count + count) * 2;
        out->llmc = realloc(out->llmc, out->llmc_cap * sizeof *out->llmc);
        LOOM_CHECK(out->llmc != NULL, "out of memory holding tokens");
      }
      for (size_t t = 0; t < count; t++) out->llmc[out->llmc_count++] = (uint16_t)ids[t];
    }
  }
  return LOOM_OK;
}

/* Tokenizes a batch across the workers, split by bytes, and writes it. */
static loom_status run_batch(const batch *b, worker *workers, int nworkers, output *out, loom_prepare_stats *stats, loom_error *err) {
  size_t doc = 0, done_bytes = 0;
  for (int k = 0; k < nworkers; k++) {
    workers[k].b = b;
    workers[k].first = doc;
    const size_t target = b->len * (size_t)(k + 1) / (size_t)nworkers;
    while (doc < b->count && (done_bytes < target || k == nworkers - 1)) done_bytes += b->docs[doc++].len;
    workers[k].last = doc;
  }
  pthread_t threads[256];
  for (int k = 1; k < nworkers; k++) LOOM_CHECK(pthread_create(&threads[k], NULL, work, &workers[k]) == 0, "cannot start a worker thread");
  work(&workers[0]);
  for (int k = 1; k < nworkers; k++) pthread_join(threads[k], NULL);
  for (int k = 0; k < nworkers; k++) /* workers hold documents in order: the first failure is the earliest */
    if (workers[k].st != LOOM_OK) {
      *err = workers[k].err;
      return workers[k].st;
    }
  return write_batch(out, workers, nworkers, stats, err);
}

static void show_progress(const loom_prepare_stats *s, double total_mb, double t0, bool last) {
  const double mb = (double)s->bytes / 1e6, secs = loom_now_s() - t0, rate = secs > 0 ? mb / secs : 0;
  const double eta = rate > 0 ? (total_mb - mb) / rate : 0;
  loom_log_status("prepare: %lld documents, %.1f of %.1f MB, %.1f MB/s, ETA %dm%02ds", (long long)s->documents, mb, total_mb, rate,
                  (int)eta / 60, (int)eta % 60);
  if (last) loom_log_status_end();
}

/* The temporary files this process writes its outputs through (PATH.tmp
 * of each), removed if a signal ends it (a handler may only unlink and _exit). */
static char g_tmp[2][4200];

static void remove_temporaries(int sig) {
  for (int i = 0; i < 2; i++)
    if (g_tmp[i][0]) unlink(g_tmp[i]);
  _exit(128 + sig);
}

/* outputs: one path or two, NULL-ended. */
static void on_signal_remove_temporaries(const char *const *outputs) {
  for (int i = 0; i < 2 && outputs[i]; i++)
    if (snprintf(g_tmp[i], sizeof g_tmp[i], "%s.tmp", outputs[i]) >= (int)sizeof g_tmp[i]) g_tmp[i][0] = '\0'; /* no such path was made */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = remove_temporaries;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
}

static loom_status open_output(output *out, const loom_prepare_options *o, loom_error *err) {
  const int vocab = o->tokenizer ? loom_bpe_vocab(o->tokenizer) : 256;
  if (o->llmc_output) {
    if (vocab > 65536)
      return loom_fail(err, LOOM_ERR_USAGE, "%s: llm.c token files hold uint16 ids, but the tokenizer has %d tokens (write an indexed dataset with --output-prefix)",
                       o->llmc_output, vocab);
    on_signal_remove_temporaries((const char *const[]){o->llmc_output, NULL});
    return loom_output_check("-o", o->llmc_output, false, o->force, err);
  }
  const char *base = strrchr(o->output_prefix, '/');
  if (!*(base ? base + 1 : o->output_prefix))
    return loom_fail(err, LOOM_ERR_USAGE, "--output-prefix " LOOM_QUOTE_FMT ": names no file (it would write hidden .bin and .idx files); "
                     "give a name such as data/corpus", LOOM_QUOTE(o->output_prefix));
  char bin[4200], idx[4200];
  snprintf(bin, sizeof bin, "%s.bin", o->output_prefix);
  snprintf(idx, sizeof idx, "%s.idx", o->output_prefix);
  loom_status st = loom_output_check("--output-prefix", bin, false, o->force, err);
  if (st == LOOM_OK) st = loom_output_check("--output-prefix", idx, false, o->force, err);
  if (st != LOOM_OK) return st;
  on_signal_remove_temporaries((const char *const[]){bin, idx, NULL});
  st = loom_indexed_writer_open(&out->indexed, o->output_prefix, loom_indexed_dtype_for_vocab(vocab), err);
  if (st != LOOM_OK) loom_indexed_writer_free(&out->indexed);
  out->indexed_open = st == LOOM_OK;
  return st;
}

/* Reads the documents of every input in batches, running each full batch. */
static loom_status read_inputs(const loom_prepare_options *o, worker *workers, output *out, loom_prepare_stats *stats, double total_mb,
                               loom_error *err) {
  batch b = {0};
  const size_t batch_bytes = BATCH_BYTES_PER_WORKER * (size_t)o->workers;
  const double t0 = loom_now_s();
  loom_doc_reader r = loom_doc_reader_start(o->inputs, o->ninputs, o->json_key != NULL);
  loom_status st = LOOM_OK;
  const char *raw;
  size_t len;
  int got;
  while ((got = loom_doc_reader_next(&r, &raw, &len, &st, err)) >= 0) {
    if (got) batch_add(&b, raw, len, r.doc_file, r.doc_line);
    stats->bytes = r.bytes;
    if (b.len >= batch_bytes || (!got && b.count)) {
      st = run_batch(&b, workers, o->workers, out, stats, err);
      b.len = b.count = 0;
      if (st != LOOM_OK) break;
      if (o->progress) show_progress(stats, total_mb, t0, !got);
    }
    if (!got) break;
  }
  loom_doc_reader_end(&r);
  free(b.buf);
  free(b.docs);
  return st;
}

loom_status loom_prepare(const loom_prepare_options *o, loom_prepare_stats *stats, loom_error *err) {
  memset(stats, 0, sizeof *stats);
  LOOM_CHECK(o->workers >= 1 && o->workers <= 256, "prepare workers out of range");
  LOOM_CHECK(!o->output_prefix != !o->llmc_output, "prepare writes one output");
  if (o->append_eod && (!o->tokenizer || loom_bpe_eod(o->tokenizer) < 0))
    return loom_fail(err, LOOM_ERR_USAGE, "--append-eod: the tokenizer has no end-of-document token (<|endoftext|> or <|end_of_text|>)");
  double total_mb = 0;
  for (int f = 0; f < o->ninputs; f++) {
    struct stat sb;
    if (stat(o->inputs[f], &sb) != 0) return loom_fail(err, LOOM_ERR_IO, "%s: cannot open: %s", o->inputs[f], strerror(errno));
    total_mb += (double)sb.st_size / 1e6;
  }
  output out = {.o = o};
  loom_status st = open_output(&out, o, err);
  worker *workers = loom_xcalloc((size_t)o->workers, sizeof *workers, "workers");
  for (int k = 0; k < o->workers; k++) {
    workers[k].o = o;
    workers[k].enc = o->tokenizer ? loom_bpe_encoder_new(o->tokenizer, o->allow_special) : NULL;
  }
  const double t0 = loom_now_s();
  if (st == LOOM_OK) st = read_inputs(o, workers, &out, stats, total_mb, err);
  stats->seconds = loom_now_s() - t0;
  if (st == LOOM_OK && out.indexed_open) st = loom_indexed_writer_finish(&out.indexed, err);
  if (st == LOOM_OK && o->llmc_output) st = loom_token_file_write(o->llmc_output, out.llmc, out.llmc_count, err);
  if (out.indexed_open) loom_indexed_writer_free(&out.indexed);
  free(out.llmc);
  for (int k = 0; k < o->workers; k++) {
    loom_bpe_encoder_free(workers[k].enc);
    loom_ids_free(&workers[k].ids);
    free(workers[k].ends);
  }
  free(workers);
  return st;
}
