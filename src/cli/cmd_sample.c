/* `loom sample`: continue a prompt with a trained model, byte tokens in and
 * out, greedily or at a temperature. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/llmc_model.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "pipeline/trainer.h"
#include "core/check.h"
#include "core/rng.h"
#include "data/byte_tokenizer.h"
#include "layers/gpt.h"

typedef struct {
  const char *init_from, *prompt;
  int max_tokens;
  float temperature;
  int64_t seed;
} sample_flags;

/* Draws from softmax(row / temperature) over the first V logits. */
static int draw(const float *row, int V, float temperature, uint64_t seed, uint64_t index) {
  float maxv = row[0];
  for (int v = 1; v < V; v++) maxv = row[v] > maxv ? row[v] : maxv;
  double sum = 0.0;
  for (int v = 0; v < V; v++) sum += exp((row[v] - maxv) / temperature);
  double r = loom_rng_uniform(seed, loom_hash_str("sample"), index) * sum;
  for (int v = 0; v < V; v++) {
    r -= exp((row[v] - maxv) / temperature);
    if (r <= 0.0) return v;
  }
  return V - 1;
}

static loom_status sample_run(const sample_flags *f, loom_error *err) {
  loom_gpt model;
  loom_status st = loom_llmc_open_model(&model, f->init_from, loom_ops_cpu(), err);
  if (st != LOOM_OK) return st;
  const loom_gpt_config cfg = model.p.cfg;
  if (cfg.vocab < LOOM_BYTE_VOCAB)
    st = loom_fail(err, LOOM_ERR_USAGE, "loom sample: %s has vocab %d; the byte tokenizer needs at least %d",
                   f->init_from, cfg.vocab, LOOM_BYTE_VOCAB);
  else if ((st = loom_gpt_set_batch_shape(&model, cfg.seq, 1)) != LOOM_OK)
    loom_fail(err, st, "loom sample: out of memory for activations");
  if (st != LOOM_OK) {
    loom_gpt_free(&model);
    return st;
  }
  const int len = (int)strlen(f->prompt), T = cfg.seq, total = len + f->max_tokens;
  int *text = loom_xcalloc((size_t)total, sizeof(int), "sample text");
  int *window = loom_xcalloc((size_t)T, sizeof(int), "sample window");
  for (int i = 0; i < len; i++) text[i] = (unsigned char)f->prompt[i];
  fputs(f->prompt, stdout);
  for (int n = len; n < total; n++) {
    /* The model is causal, so positions past the context never affect it. */
    const int start = n > T ? n - T : 0, ctx = n - start;
    memset(window, 0, (size_t)T * sizeof(int));
    memcpy(window, text + start, (size_t)ctx * sizeof(int));
    const loom_gpt_batch batch = {.tokens = window};
    loom_gpt_forward(&model, &batch);
    const float *row = model.a->logits + (size_t)(ctx - 1) * cfg.padded_vocab;
    float best;
    int next;
    if (f->temperature <= 0.0f) model.ops->argmax(&best, &next, row, 1, cfg.vocab, cfg.padded_vocab);
    else next = draw(row, cfg.vocab, f->temperature, (uint64_t)f->seed, (uint64_t)n);
    text[n] = next;
    loom_byte_print(stdout, next);
    fflush(stdout);
  }
  fputc('\n', stdout);
  free(text);
  free(window);
  loom_gpt_free(&model);
  return LOOM_OK;
}

int loom_cmd_sample(int argc, char **argv) {
  sample_flags f = {.max_tokens = 64, .temperature = 0.0f, .seed = 1337};
  loom_flag table[] = {
      {"--init-from", FLAG_STRING, &f.init_from, "llm.c model file (required)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--prompt", FLAG_STRING, &f.prompt, "text to continue (required)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--max-tokens", FLAG_INT, &f.max_tokens, "tokens to generate", 1, 1e6, NULL, false, NULL},
      {"--temperature", FLAG_FLOAT, &f.temperature, "sampling temperature (0: greedy)", 0, 100, NULL, false, NULL},
      {"--seed", FLAG_INT64, &f.seed, "sampling seed", 0, 9007199254740991.0, NULL, false, NULL},
  };
  const int n = sizeof table / sizeof table[0];
  loom_error err = {{0}};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse("loom sample", "loom sample --init-from MODEL --prompt TEXT [flags]", table, n, argc, argv, pos, 0, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (st == LOOM_OK && (!f.init_from || !f.prompt))
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom sample: %s is required", f.init_from ? "--prompt" : "--init-from");
  if (st == LOOM_OK && f.prompt[0] == '\0')
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom sample: --prompt must not be empty");
  if (st == LOOM_OK) st = sample_run(&f, &err);
  return loom_report(st, &err);
}
