/* `loom ckpt export --format llmc -o OUT`: writes a model (freshly initialised
 * from the model flags and --seed, or loaded with --init-from) as one file. */
#include <stdio.h>
#include <string.h>
#include "ckpt/checkpoint.h"
#include "ckpt/llmc_model.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "core/log.h"
#include "layers/gpt.h"

static const char *const FORMAT_CHOICES[] = {"llmc", NULL};

static loom_status export_model(const loom_gpt_config *cfg, const char *init_from, int64_t seed,
                                const char *out, loom_error *err) {
  loom_gpt_params p;
  loom_status st = loom_gpt_params_init(&p, cfg, 0, 1, NULL);
  if (st != LOOM_OK) return loom_fail(err, st, "loom ckpt export: out of memory building the model");
  loom_gpt_params_randomize(&p, (uint64_t)seed);
  if (init_from) st = loom_llmc_load(init_from, &p, err);
  if (st == LOOM_OK) st = loom_llmc_save(out, &p, err);
  if (st == LOOM_OK) loom_log_info("wrote %s (llm.c format, %zu parameters)", out, p.params.numel);
  loom_gpt_params_free(&p);
  return st;
}

/* `loom ckpt verify DIR`: every checksum and shape of the latest checkpoint. */
static int verify(int argc, char **argv) {
  loom_error err = {{0}};
  if (argc != 1 || argv[0][0] == '-') {
    loom_fail(&err, LOOM_ERR_USAGE, "loom ckpt verify: expected one checkpoint directory");
    return loom_report(LOOM_ERR_USAGE, &err);
  }
  int shards, tensors;
  const loom_status st = loom_ckpt_verify(argv[0], &shards, &tensors, &err);
  if (st == LOOM_OK) {
    printf("%s: ok (%d shards, %d tensors, every checksum and shape)\n", argv[0], shards, tensors);
    return 0;
  }
  loom_report(st, &err);
  return st == LOOM_ERR_FORMAT ? 1 : loom_status_exit_code(st); /* a damaged checkpoint fails the check */
}

int loom_cmd_ckpt(int argc, char **argv) {
  if (argc >= 1 && strcmp(argv[0], "verify") == 0) return verify(argc - 1, argv + 1);
  loom_model_flags mf = {.preset = "gpt-tiny"};
  const char *format = NULL, *out = NULL;
  int64_t seed = 1337;
  loom_flag table[LOOM_MODEL_FLAG_COUNT + 3];
  loom_model_flags_table(&mf, table);
  const loom_flag rest[3] = {
      {"--format", FLAG_STRING, &format, "output format (required)", LOOM_NO_RANGE, FORMAT_CHOICES, false},
      {"-o", FLAG_STRING, &out, "output file (required)", LOOM_NO_RANGE, NULL, false},
      {"--seed", FLAG_INT64, &seed, "init seed when not --init-from", 0, 9007199254740991.0, NULL, false},
  };
  memcpy(table + LOOM_MODEL_FLAG_COUNT, rest, sizeof rest);
  const int n = LOOM_MODEL_FLAG_COUNT + 3;
  loom_error err = {{0}};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse("loom ckpt", "loom ckpt export --format llmc -o OUT [model flags]", table, n, argc, argv, pos, 1, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (st == LOOM_OK && (npos != 1 || strcmp(pos[0], "export") != 0))
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom ckpt: expected 'export --format llmc -o OUT'");
  else if (st == LOOM_OK && (!format || !out))
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom ckpt export: %s is required", format ? "-o OUT" : "--format");
  loom_gpt_config cfg;
  int T;
  if (st == LOOM_OK) st = loom_model_flags_resolve("loom ckpt export", &mf, table, &cfg, &T, &err);
  if (st == LOOM_OK) st = export_model(&cfg, mf.init_from, seed, out, &err);
  return loom_report(st, &err);
}
