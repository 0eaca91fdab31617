/* `loom sample`: continue a prompt with a trained model, greedily or at a
 * temperature, in byte tokens or a BPE tokenizer's (--tokenizer). The flags become a (1,1,1) plan of the
 * model file's shape, which the runtime builds and runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/run_files.h"
#include "cli/flag_defs.h"
#include "cli/commands.h"
#include "cli/data_cli.h"
#include "cli/device.h"
#include "cli/plan_flags.h"
#include "core/check.h"
#include "data/bpe.h"
#include "data/byte_tokenizer.h"
#include "pipeline/generate.h"

typedef struct {
  loom_plan_flags layout; /* the model, from --init-from */
  const char *prompt, *device, *tokenizer;
  loom_generate_options gen;
  int64_t seed;
  bool no_template; /* --no-add-special-tokens */
} sample_flags;

#define SAMPLE_FLAG_COUNT (LOOM_PLAN_FLAG_COUNT + 7)

static void print_byte_token(void *ctx, int token) {
  loom_byte_print(ctx, token);
  fflush(ctx);
}

static void print_bpe_token(void *ctx, int token) {
  size_t len;
  const unsigned char *bytes = loom_bpe_token_bytes(ctx, token, &len);
  if (bytes) fwrite(bytes, 1, len, stdout);
  else printf("<%d>", token); /* a padded id past the tokenizer's */
  fflush(stdout);
}

static loom_status sample_run(const loom_plan *plan, sample_flags *f, const loom_ops *ops, loom_error *err) {
  loom_bpe *bpe = NULL;
  loom_status st = f->tokenizer ? loom_bpe_load(&bpe, f->tokenizer, err) : LOOM_OK;
  const int vocab = bpe ? loom_bpe_vocab(bpe) : LOOM_BYTE_VOCAB;
  if (st == LOOM_OK && plan->model->vocab < vocab)
    st = loom_fail(err, LOOM_ERR_USAGE, "loom sample: %s has vocab %d; the %s tokenizer needs at least %d", f->layout.model.init_from,
                   plan->model->vocab, bpe ? "--tokenizer" : "byte", vocab);
  loom_trainer tr = {0};
  loom_run_files files = {0};
  const loom_trainer_options o = {.forward_only = true};
  if (st == LOOM_OK) st = loom_trainer_init(&tr, NULL, plan, ops, NULL, &o, err);
  if (st == LOOM_OK) loom_run_files_init(&files, &tr, NULL, 0, 0, NULL);
  if (st == LOOM_OK) st = loom_run_init_from(&files, f->layout.model.init_from, err);
  loom_ids prompt = {0};
  if (bpe) {
    loom_data_log_template(bpe, f->no_template);
    loom_bpe_encoder *e = loom_bpe_encoder_new(bpe, true);
    if (f->no_template) loom_bpe_encode(e, f->prompt, strlen(f->prompt), &prompt);
    else loom_bpe_encode_templated(e, f->prompt, strlen(f->prompt), &prompt);
    loom_bpe_encoder_free(e);
  } else {
    for (const char *c = f->prompt; *c; c++) loom_ids_push(&prompt, (unsigned char)*c);
  }
  f->gen.seed = (uint64_t)f->seed;
  if (st == LOOM_OK) {
    fputs(f->prompt, stdout);
    st = loom_generate(&tr, prompt.ids, (int)prompt.count, &f->gen, bpe ? print_bpe_token : print_byte_token, bpe ? (void *)bpe : stdout, err);
    fputc('\n', stdout);
  }
  loom_ids_free(&prompt);
  loom_bpe_free(bpe);
  loom_run_files_free(&files);
  loom_trainer_free(&tr);
  return st;
}

int loom_cmd_sample(int argc, char **argv) {
  sample_flags f = {.layout = loom_plan_flags_defaults(), .gen = {.max_tokens = 64}, .seed = 1337, .device = "auto"};
  f.layout.micro_batch = 1;
  loom_flag table[SAMPLE_FLAG_COUNT];
  loom_plan_flags_table(&f.layout, table);
  const loom_flag rest[] = {
      {"--prompt", FLAG_STRING, &f.prompt, "text to continue (required)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--max-tokens", FLAG_INT, &f.gen.max_tokens, "tokens to generate", 1, 1e6, NULL, false, NULL},
      {"--temperature", FLAG_FLOAT, &f.gen.temperature, "sampling temperature (0: greedy)", 0, 100, NULL, false, NULL},
      loom_flag_def_as("--seed", &f.seed, "sampling seed"),
      loom_flag_def("--device", &f.device),
      loom_flag_def_as("--tokenizer", &f.tokenizer, "the model's BPE tokenizer (GPT-2 files, tokenizer.json, NAME.tiktoken; default: bytes)"),
      loom_data_template_flag(&f.no_template),
  };
  _Static_assert(sizeof rest / sizeof rest[0] == SAMPLE_FLAG_COUNT - LOOM_PLAN_FLAG_COUNT, "SAMPLE_FLAG_COUNT");
  memcpy(table + LOOM_PLAN_FLAG_COUNT, rest, sizeof rest);
  loom_error err = {0};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse("loom sample", "loom sample --init-from MODEL --prompt TEXT [flags]", table,
                                  SAMPLE_FLAG_COUNT, argc, argv, pos, 0, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (!f.layout.model.init_from || !f.prompt)
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom sample: %s is required", f.layout.model.init_from ? "--prompt" : "--init-from");
  else if (f.prompt[0] == '\0')
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom sample: --prompt must not be empty");
  loom_plan *plan = NULL;
  if (st == LOOM_OK) st = loom_plan_flags_build("loom sample", &f.layout, table, &plan, &err);
  if (st == LOOM_OK && loom_plan_ranks(plan) != 1)
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom sample: generation runs on one rank; drop --tp, --pp, --dp and --cp");
  const loom_plan_limits limits = {.world = 1};
  if (st == LOOM_OK) st = loom_plan_flags_refuse("loom sample", plan, &limits, table, NULL, &err);
  const loom_ops *ops = NULL;
  char device[160];
  if (st == LOOM_OK) st = loom_device_setup("loom sample", f.device, &ops, device, sizeof device, &err);
  if (st == LOOM_OK) st = loom_device_match_plan("loom sample", ops, plan, &err);
  if (st == LOOM_OK) st = sample_run(plan, &f, ops, &err);
  loom_plan_free(plan);
  return loom_report(st, &err);
}
