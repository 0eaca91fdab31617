/* Byte-level BPE tokenizers, as GPT-2, tiktoken and Hugging Face define them.
 *
 * Text is split into pieces by a pre-tokenizer regex (PCRE2 with JIT and
 * Unicode properties; bytes that are not valid UTF-8 become pieces of their
 * own, so every input round-trips). Each piece starts as one token per byte
 * and merges the adjacent pair of lowest rank, leftmost first, until no pair
 * merges; a heap keeps that O(n log n) per piece, and a per-encoder cache
 * skips pieces already seen.
 *
 * Three file formats load into the same tables (bpe_load.c):
 *   - GPT-2's files: a directory with encoder.json + vocab.bpe, or
 *     vocab.json + merges.txt;
 *   - a Hugging Face tokenizer.json whose model is BPE with a ByteLevel
 *     and/or Split pre-tokenizer (GPT-2, Llama 3), with its added tokens;
 *   - a tiktoken rank file (base64 token, rank per line) named after its
 *     encoding (r50k_base, gpt2, p50k_base, cl100k_base), which fixes the
 *     split pattern and the special tokens. */
#ifndef LOOM_BPE_H
#define LOOM_BPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core/status.h"
#include "core/strbuf.h"

typedef struct loom_bpe loom_bpe;

/* Loads a tokenizer from a directory of GPT-2 files, a tokenizer.json or a
 * .tiktoken rank file; every malformed part is one line naming the file. */
loom_status loom_bpe_load(loom_bpe **out, const char *path, loom_error *err);
void loom_bpe_free(loom_bpe *t);

/* The form a tokenizer was read from, and its files: [0] the vocabulary
 * (encoder.json or vocab.json, the tokenizer.json, the rank file), [1]
 * GPT-2's merges (vocab.bpe or merges.txt; NULL for the other forms). */
typedef enum { LOOM_BPE_GPT2_FILES, LOOM_BPE_TOKENIZER_JSON, LOOM_BPE_TIKTOKEN } loom_bpe_format;
loom_bpe_format loom_bpe_format_of(const loom_bpe *t);
const char *loom_bpe_file(const loom_bpe *t, int i);

/* One more than the largest token id. */
int loom_bpe_vocab(const loom_bpe *t);
/* The end-of-document token (<|endoftext|>, <|end_of_text|>), or -1. */
int loom_bpe_eod(const loom_bpe *t);
/* The format and size, for logs: "GPT-2 files, 50257 tokens". */
const char *loom_bpe_describe(const loom_bpe *t);
/* The bytes of token id (special tokens: their text); NULL if id is unused. */
const unsigned char *loom_bpe_token_bytes(const loom_bpe *t, int id, size_t *len);

/* A growing list of token ids. */
typedef struct {
  int32_t *ids;
  size_t count, cap;
} loom_ids;
void loom_ids_push(loom_ids *v, int32_t id);
void loom_ids_free(loom_ids *v);

/* Encoding state for one thread: the piece cache and scratch space. The
 * tokenizer itself is read-only and shared. With allow_special, special
 * tokens written in the text become their ids (tiktoken's allowed_special
 * "all", Hugging Face's default); without, they are encoded as text, as
 * Megatron's GPT-2 tokenizer and tiktoken's encode_ordinary do. Added tokens
 * that are not special always match. */
typedef struct loom_bpe_encoder loom_bpe_encoder;
loom_bpe_encoder *loom_bpe_encoder_new(const loom_bpe *t, bool allow_special);
void loom_bpe_encoder_free(loom_bpe_encoder *e);
/* Appends the ids of text[0..len) to out. */
void loom_bpe_encode(loom_bpe_encoder *e, const char *text, size_t len, loom_ids *out);

/* A tokenizer.json's post-processor, as Hugging Face applies it with
 * add_special_tokens=True: a TemplateProcessing's special tokens around
 * each text (Llama 3's <|begin_of_text|> before it). ByteLevel's changes no
 * id; other kinds are refused when loading. loom_bpe_encode leaves the
 * template out (add_special_tokens=False); this one puts it in. */
void loom_bpe_encode_templated(loom_bpe_encoder *e, const char *text, size_t len, loom_ids *out);
/* What the template adds, for logs: "<|begin_of_text|> (128000) before each
 * text"; NULL when the tokenizer has no template. */
const char *loom_bpe_template_describe(const loom_bpe *t);
/* The beginning-of-text token: the template's first before each text
 * (Llama 3's <|begin_of_text|>), else GPT-2's <|endoftext|> for GPT-2's
 * files (its tokenizer's bos), else -1. */
int loom_bpe_bos(const loom_bpe *t);

/* Appends the bytes of ids[0..n) to out; an id outside the vocabulary is an error. */
loom_status loom_bpe_decode(const loom_bpe *t, const int32_t *ids, size_t n, loom_strbuf *out, loom_error *err);

/* Training a byte-level BPE on a corpus (documents as data/documents.h
 * reads them): the 256 bytes, up to vocab_size - 257 merges of the most
 * frequent pairs within GPT-2-pattern words (each occurring at least twice),
 * and <|endoftext|> last. Writes encoder.json + vocab.bpe and tokenizer.json
 * into out_dir. */
#define LOOM_BPE_MAX_TRAIN_VOCAB 4000000

typedef struct {
  const char *const *inputs;
  int ninputs;
  const char *json_key; /* JSONL member of each document's text, or NULL for text files */
  int vocab_size;
  const char *out_dir;
} loom_bpe_train_options;

typedef struct {
  int64_t documents, bytes, words, distinct_words;
  int merges, vocab;
} loom_bpe_train_stats;

loom_status loom_bpe_train(const loom_bpe_train_options *o, loom_bpe_train_stats *stats, loom_error *err);

/* GPT-2's printable stand-in for each byte (its bytes_to_unicode table), as
 * used by the vocabulary files: a code point below 324. */
unsigned loom_bpe_byte_char(unsigned char byte);

#endif
