/* A Hugging Face directory's tokenizer and generation files (see hf_tokenizer.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/hf_tokenizer.h"
#include "core/read_file.h"
#include "core/strbuf.h"
#include "core/write_file.h"

#define MAX_TOKENIZER_FILE ((size_t)1 << 30)

loom_status loom_hf_tokenizer_open(loom_hf_tokenizer *t, const char *path, int vocab, loom_error *err) {
  *t = (loom_hf_tokenizer){.bos = -1, .eos = -1};
  loom_status st = loom_bpe_load(&t->bpe, path, err);
  if (st != LOOM_OK) return st;
  if (loom_bpe_format_of(t->bpe) == LOOM_BPE_TIKTOKEN)
    st = loom_fail(err, LOOM_ERR_USAGE, "--tokenizer %s: transformers reads a tiktoken rank file only by converting it; give "
                   "the tokenizer's tokenizer.json or GPT-2 files", path);
  else if (loom_bpe_vocab(t->bpe) > vocab)
    st = loom_fail(err, LOOM_ERR_USAGE, "--tokenizer %s: its ids reach %d, past the model's vocab of %d", path,
                   loom_bpe_vocab(t->bpe), vocab);
  if (st != LOOM_OK) {
    loom_hf_tokenizer_close(t);
    return st;
  }
  t->bos = loom_bpe_bos(t->bpe), t->eos = loom_bpe_eod(t->bpe);
  return LOOM_OK;
}

void loom_hf_tokenizer_close(loom_hf_tokenizer *t) {
  loom_bpe_free(t->bpe);
  t->bpe = NULL;
}

static loom_status write_buffer(const char *dir, const char *name, const void *data, size_t len, loom_error *err) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  const loom_chunk chunk = {data, len};
  return loom_write_file_atomic(path, &chunk, 1, err);
}

/* Copies a file into dir under another name; GPT-2's merges gain the
 * "#version" line transformers' GPT2Tokenizer skips as the first, where
 * the file has none (loom reads the merges either way). */
static loom_status copy_file(const char *dir, const char *from, const char *name, bool merges, loom_error *err) {
  char *text = NULL;
  size_t len = 0;
  loom_status st = loom_read_small_file(from, "tokenizer file", MAX_TOKENIZER_FILE, &text, &len, err);
  if (st != LOOM_OK) return st;
  static const char VERSION[] = "#version: 0.2\n";
  const bool header = merges && !(len >= 8 && memcmp(text, "#version", 8) == 0);
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  const loom_chunk chunks[2] = {{VERSION, header ? sizeof VERSION - 1 : 0}, {text, len}};
  st = loom_write_file_atomic(path, chunks, 2, err);
  free(text);
  return st;
}

/* A JSON string member: "key": "text", escaped. */
static void json_member(loom_strbuf *b, const char *key, const unsigned char *text, size_t len) {
  loom_strbuf_printf(b, ",\n  \"%s\": \"", key);
  for (size_t i = 0; i < len; i++) {
    if (text[i] == '"' || text[i] == '\\') loom_strbuf_printf(b, "\\%c", text[i]);
    else if (text[i] < 0x20) loom_strbuf_printf(b, "\\u%04x", text[i]);
    else loom_strbuf_append(b, &text[i], 1);
  }
  loom_strbuf_append(b, "\"", 1);
}

/* A special token's text as a member, where the tokenizer has one. */
static void token_member(loom_strbuf *b, const loom_bpe *t, const char *key, int id) {
  size_t len;
  const unsigned char *text = id >= 0 ? loom_bpe_token_bytes(t, id, &len) : NULL;
  if (text) json_member(b, key, text, len);
}

static loom_status tokenizer_files(const char *dir, const loom_hf_tokenizer *tok, int seq, loom_error *err) {
  const bool gpt2 = loom_bpe_format_of(tok->bpe) == LOOM_BPE_GPT2_FILES;
  loom_status st = gpt2 ? copy_file(dir, loom_bpe_file(tok->bpe, 0), "vocab.json", false, err)
                        : copy_file(dir, loom_bpe_file(tok->bpe, 0), "tokenizer.json", false, err);
  if (st == LOOM_OK && gpt2) st = copy_file(dir, loom_bpe_file(tok->bpe, 1), "merges.txt", true, err);
  loom_strbuf b = {0};
  loom_strbuf_printf(&b, "{\n  \"tokenizer_class\": \"%s\"", gpt2 ? "GPT2Tokenizer" : "PreTrainedTokenizerFast");
  token_member(&b, tok->bpe, "bos_token", tok->bos);
  token_member(&b, tok->bpe, "eos_token", tok->eos);
  if (gpt2) token_member(&b, tok->bpe, "unk_token", tok->eos); /* GPT-2's unknown token is its end of text */
  loom_strbuf_printf(&b, ",\n  \"model_max_length\": %d,\n  \"clean_up_tokenization_spaces\": false,\n"
                     "  \"model_input_names\": [\"input_ids\", \"attention_mask\"]\n}\n", seq);
  if (st == LOOM_OK) st = write_buffer(dir, "tokenizer_config.json", b.buf, b.len, err);
  free(b.buf);
  return st;
}

loom_status loom_hf_write_tokenizer(const char *dir, const loom_hf_tokenizer *tok, int seq, loom_error *err) {
  loom_strbuf b = {0};
  loom_strbuf_printf(&b, "{\n  \"_from_model_config\": true");
  if (tok && tok->bos >= 0) loom_strbuf_printf(&b, ",\n  \"bos_token_id\": %d", tok->bos);
  if (tok && tok->eos >= 0) loom_strbuf_printf(&b, ",\n  \"eos_token_id\": %d", tok->eos);
  loom_strbuf_printf(&b, "\n}\n");
  loom_status st = write_buffer(dir, "generation_config.json", b.buf, b.len, err);
  free(b.buf);
  if (st == LOOM_OK && tok) st = tokenizer_files(dir, tok, seq, err);
  return st;
}
