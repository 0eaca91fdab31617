/* `loom eval`: mean loss of a model over the first N sequential batches of a
 * token file, as llm.c's validation loop reads it. */
#include <stdlib.h>
#include <string.h>
#include "ckpt/llmc_model.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "core/check.h"
#include "core/log.h"
#include "data/dataset.h"
#include "layers/gpt.h"

typedef struct {
  const char *init_from, *data;
  int micro_batch, seq, batches;
} eval_flags;

/* Mean loss of `model` over the first f->batches sequential batches of data. */
static void eval_batches(loom_gpt *model, loom_dataset *data, const eval_flags *f, int T) {
  const size_t n = (size_t)T * f->micro_batch;
  int *tokens = loom_xmalloc(n * sizeof(int), "tokens"), *targets = loom_xmalloc(n * sizeof(int), "targets");
  double sum = 0.0;
  int64_t scored = 0;
  for (int k = 0; k < f->batches; k++) {
    const int64_t first = (int64_t)k * f->micro_batch;
    const int64_t counted = loom_dataset_batch(data, LOOM_SPLIT_TRAIN, first, T, f->micro_batch, tokens, targets);
    const loom_gpt_batch batch = {.tokens = tokens, .targets = targets, .sample_offset = first};
    sum += (double)loom_gpt_forward(model, &batch) * (double)counted;
    scored += counted;
  }
  printf("eval: mean loss %.6f over %d batches of %d x %d tokens\n", sum / (double)scored, f->batches,
         f->micro_batch, T);
  free(tokens);
  free(targets);
}

static loom_status eval_run(const eval_flags *f, loom_error *err) {
  loom_gpt model;
  loom_status st = loom_llmc_open_model(&model, f->init_from, loom_ops_cpu(), err);
  if (st != LOOM_OK) return st;
  const loom_gpt_config *cfg = &model.p.cfg;
  const int T = f->seq ? f->seq : cfg->seq;
  loom_dataset *data = NULL;
  if (T > cfg->seq)
    st = loom_fail(err, LOOM_ERR_USAGE, "loom eval: --seq %d exceeds the model's maximum sequence length %d", T, cfg->seq);
  if (st == LOOM_OK)
    st = loom_dataset_open_tokens(&data, f->data, NULL, cfg->vocab, T, LOOM_ORDER_SEQUENTIAL, 0, false, err);
  if (st == LOOM_OK && (int64_t)f->batches * f->micro_batch > loom_dataset_train_windows(data))
    st = loom_fail(err, LOOM_ERR_USAGE, "loom eval: --batches %d x --micro-batch %d needs %lld windows of seq+1 tokens; %s has %lld",
                   f->batches, f->micro_batch, (long long)f->batches * f->micro_batch, f->data,
                   (long long)loom_dataset_train_windows(data));
  if (st == LOOM_OK) st = loom_gpt_set_batch_shape(&model, T, f->micro_batch);
  if (st == LOOM_ERR_NOMEM) loom_fail(err, st, "loom eval: out of memory for activations");
  if (st == LOOM_OK) eval_batches(&model, data, f, T);
  loom_dataset_free(data);
  loom_gpt_free(&model);
  return st;
}

int loom_cmd_eval(int argc, char **argv) {
  eval_flags f = {.micro_batch = 4, .seq = 0, .batches = 10};
  loom_flag table[] = {
      {"--init-from", FLAG_STRING, &f.init_from, "llm.c model file to evaluate (required)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--data", FLAG_STRING, &f.data, "llm.c token file (required)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--micro-batch", FLAG_INT, &f.micro_batch, "sequences per batch", 1, 1 << 20, NULL, false, NULL},
      {"--seq", FLAG_INT, &f.seq, "sequence length (0: the model's)", 0, 1 << 20, NULL, false, NULL},
      {"--batches", FLAG_INT, &f.batches, "batches to average over", 1, 1e9, NULL, false, NULL},
  };
  const int n = sizeof table / sizeof table[0];
  loom_error err = {{0}};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse("loom eval", "loom eval --init-from MODEL --data TOKENS [flags]", table, n, argc, argv, pos, 0, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (st == LOOM_OK && (!f.init_from || !f.data))
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom eval: %s is required", f.init_from ? "--data" : "--init-from");
  if (st == LOOM_OK) st = eval_run(&f, &err);
  return loom_report(st, &err);
}
