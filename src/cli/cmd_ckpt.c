/* `loom ckpt`: verify, reshard and export checkpoints.
 *   loom ckpt verify DIR
 *   loom ckpt reshard DIR (--plan FILE | --tp N --pp N --dp N [--vpp N] [--zero 0-3] [--layer-split L]) -o OUT
 *   loom ckpt export [DIR] --format llmc|safetensors|hf [--dtype fp32|bf16] [--max-shard-size 5GB] -o OUT [model flags]
 * export writes the model of checkpoint DIR, or without DIR a model built
 * from the model flags and --seed (or loaded with --init-from). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "ckpt/checkpoint.h"
#include "ckpt/export.h"
#include "cli/flag_defs.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "cli/train_flags.h"
#include "core/log.h"
#include "core/write_file.h"
#include "cli/plan_flags.h"
#include "plan/plan.h"


/* `loom ckpt verify DIR`: every checksum and shape of the latest checkpoint. */
static int verify(int argc, char **argv) {
  loom_error err = {0};
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

/* The layout a plan file gives, validated as every plan is. */
static loom_status layout_from_plan(const char *path, int *tp, int *pp, int *dp, int *vpp, int *zero, int *counts,
                                    int *ncounts, loom_gpt_config *model, loom_error *err) {
  loom_plan *plan;
  loom_status st = loom_plan_read(path, &plan, err);
  if (st != LOOM_OK) return st;
  st = loom_plan_flags_refuse("loom ckpt reshard", plan, &(loom_plan_limits){0}, NULL, path, err);
  if (st == LOOM_OK) {
    *tp = plan->parallel->tp, *pp = plan->parallel->pp, *dp = plan->parallel->dp;
    *vpp = plan->parallel->virtual_chunks, *zero = plan->parallel->zero_stage;
    *ncounts = plan->n_stages <= LOOM_PLAN_MAX_STAGES ? loom_plan_layer_counts(plan, counts) : 0;
    loom_plan_model_config(plan, model);
  }
  loom_plan_free(plan);
  return st;
}

static int reshard(int argc, char **argv) {
  const char *plan = NULL, *out = NULL, *split = NULL;
  int tp = 1, pp = 1, dp = 1, vpp = 1, zero = 0;
  loom_flag table[] = {
      loom_flag_def_as("--plan", &plan, "the new plan (instead of the layout flags)"),
      loom_flag_def("--tp", &tp),
      loom_flag_def_as("--pp", &pp, "pipeline stages"),
      loom_flag_def_as("--dp", &dp, "data-parallel replicas"),
      loom_flag_def_as("--vpp", &vpp, "model chunks per pipeline rank"),
      loom_flag_def_as("--zero", &zero, "ZeRO stage of the new layout"),
      loom_flag_def_as("--layer-split", &split, "layers per stage, e.g. 3,4,4,3"),
      loom_flag_def_as("-o", &out, "output checkpoint directory, new or empty (required)"),
  };
  const int n = (int)(sizeof table / sizeof table[0]);
  loom_error err = {0};
  bool help;
  const char *pos[1];
  int npos, counts[LOOM_PLAN_MAX_STAGES], ncounts = 0;
  loom_gpt_config model = {0}; /* --plan's */
  loom_status st = loom_cli_parse("loom ckpt reshard", "loom ckpt reshard DIR (--plan FILE | --tp N --pp N --dp N ...) -o OUT",
                                  table, n, argc, argv, pos, 1, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  char latest[4200];
  if (out) snprintf(latest, sizeof latest, "%s/latest", out);
  if (npos != 1) st = loom_fail(&err, LOOM_ERR_USAGE, "loom ckpt reshard: expected one checkpoint directory");
  else if (!out) st = loom_fail(&err, LOOM_ERR_USAGE, "loom ckpt reshard: -o OUT is required");
  else if (access(latest, F_OK) == 0)
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom ckpt reshard: %s already holds a checkpoint; choose a new directory", out);
  else if (plan && (table[1].set || table[2].set || table[3].set || table[4].set || table[5].set || split))
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom ckpt reshard: --plan fixes the layout; drop the layout flags");
  else if (plan) st = layout_from_plan(plan, &tp, &pp, &dp, &vpp, &zero, counts, &ncounts, &model, &err);
  else if (split && (ncounts = loom_plan_flags_parse_split(split, counts, LOOM_PLAN_MAX_STAGES)) < 0)
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom ckpt reshard: --layer-split %s: expected layer counts like 3,4,4,3", split);
  const loom_path_use uses[] = {{"the checkpoint", npos == 1 ? pos[0] : NULL, LOOM_PATH_INPUT}, {"-o", out, LOOM_PATH_OUTPUT},
                                {"--plan", plan, LOOM_PATH_INPUT}};
  if (st == LOOM_OK) st = loom_paths_distinct("loom ckpt reshard", uses, 3, &err);
  char model_from[4200] = "";
  if (plan) snprintf(model_from, sizeof model_from, "the plan %s", plan);
  if (st == LOOM_OK)
    st = loom_ckpt_reshard(pos[0], out, tp, pp, dp, vpp, zero, ncounts ? counts : NULL, ncounts, plan ? &model : NULL,
                           model_from, &err);
  if (st == LOOM_OK)
    printf("%s: resharded %s onto tp %d x pp %d x dp %d (vpp %d, zero %d): %d shards\n", out, pos[0], tp, pp, dp, vpp,
           zero, tp * pp * dp);
  return loom_report(st, &err);
}

/* Writes the model: the checkpoint's, a model file's or a fresh one, streamed tensor by tensor. */
static const char *const DTYPE_CHOICES[] = {"fp32", "bf16", NULL};

typedef struct {
  const char *format, *out, *dtype, *max_shard, *tokenizer;
  int64_t seed;
  bool force;
} export_flags;

static loom_status export_model(const char *dir, const loom_gpt_config *cfg, const char *init_from, const export_flags *x,
                                uint64_t max_shard, loom_error *err) {
  loom_model_source src;
  loom_status st = loom_model_source_open(&src, dir, init_from, cfg, (uint64_t)x->seed, err);
  if (st != LOOM_OK) return st;
  const bool bf16 = strcmp(x->dtype, "bf16") == 0;
  loom_hf_tokenizer tok = {0};
  const loom_export_options o = {.format = loom_model_format_of(x->format), .dtype = bf16 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32,
                                 .max_shard_bytes = max_shard, .tok = x->tokenizer ? &tok : NULL};
  const bool fresh = !dir && !init_from; /* a fresh model's expert bias is its zeros */
  st = loom_model_export_check(&src.cfg, o.format, "-o", x->out, x->force, fresh || src.expert_bias, err);
  if (st == LOOM_OK && x->tokenizer) st = loom_hf_tokenizer_open(&tok, x->tokenizer, src.cfg.vocab, err);
  if (st == LOOM_OK) st = loom_model_export(&src, &o, x->out, err);
  if (st == LOOM_OK)
    loom_log_info("wrote %s (%s, %s, %zu parameters%s%s)", x->out, LOOM_MODEL_FORMAT_WHAT[o.format], bf16 ? "bf16" : "fp32",
                  loom_gpt_param_count(&src.cfg, NULL, 1), x->tokenizer ? ", tokenizer: " : "",
                  x->tokenizer ? loom_bpe_describe(tok.bpe) : "");
  loom_hf_tokenizer_close(&tok);
  loom_model_source_free(&src);
  return st;
}

static int export_cmd(int argc, char **argv) {
  loom_model_flags mf = {.preset = "gpt-tiny"};
  export_flags x = {.dtype = "fp32", .seed = 1337};
  enum { REST = 7 };
  loom_flag table[LOOM_MODEL_FLAG_COUNT + REST];
  loom_model_flags_table(&mf, table);
  const loom_flag rest[REST] = {
      {"--format", FLAG_STRING, &x.format, "output format (required)", LOOM_NO_RANGE, LOOM_MODEL_FORMAT_NAMES, false, NULL},
      loom_flag_def_as("-o", &x.out, "output file (required)"),
      {"--dtype", FLAG_STRING, &x.dtype, "value type: fp32, or bf16 rounded to nearest even", LOOM_NO_RANGE, DTYPE_CHOICES, false, NULL},
      loom_flag_def_as("--seed", &x.seed, "init seed when not --init-from"),
      loom_flag_def_as("--force", &x.force, "replace an output that exists"),
      {"--max-shard-size", FLAG_STRING, &x.max_shard, "hf: the most weight data a file holds, as save_pretrained's "
       "max_shard_size (5GB, 500MB, 2GiB); more is written as shards with model.safetensors.index.json (default 5GB)",
       LOOM_NO_RANGE, NULL, false, NULL},
      loom_flag_def_as("--tokenizer", &x.tokenizer, "hf: the model's tokenizer (GPT-2 files or tokenizer.json), written beside "
       "it with tokenizer_config.json"),
  };
  memcpy(table + LOOM_MODEL_FLAG_COUNT, rest, sizeof rest);
  const int n = LOOM_MODEL_FLAG_COUNT + REST;
  loom_error err = {0};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse("loom ckpt export", "loom ckpt export [CKPT_DIR] --format llmc|safetensors|hf [--dtype fp32|bf16] -o OUT [model flags]",
                                  table, n, argc, argv, pos, 1, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (!x.format || !x.out) st = loom_fail(&err, LOOM_ERR_USAGE, "loom ckpt export: %s is required", x.format ? "-o OUT" : "--format");
  const loom_path_use uses[] = {{"the checkpoint", npos == 1 ? pos[0] : NULL, LOOM_PATH_INPUT},
                                {"--init-from", mf.init_from, LOOM_PATH_INPUT}, {"--tokenizer", x.tokenizer, LOOM_PATH_INPUT},
                                {"-o", x.out, LOOM_PATH_REPLACED}};
  if (st == LOOM_OK) st = loom_paths_distinct("loom ckpt export", uses, 4, &err);
  const int64_t shard_bytes = x.max_shard ? loom_cli_parse_bytes(x.max_shard) : 0;
  if (st == LOOM_OK && shard_bytes < 0)
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom ckpt export: --max-shard-size " LOOM_QUOTE_FMT " is not a size like 5GB or 500MB",
                   LOOM_QUOTE(x.max_shard));
  const char *hf_only = x.max_shard ? "--max-shard-size shards" : x.tokenizer ? "--tokenizer goes into" : NULL;
  if (st == LOOM_OK && hf_only && strcmp(x.format, "hf") != 0)
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom ckpt export: %s a Hugging Face directory; --format %s writes one file", hf_only,
                   x.format);
  for (int i = 0; st == LOOM_OK && npos == 1 && i < LOOM_MODEL_FLAG_COUNT; i++)
    if (table[i].set)
      st = loom_fail(&err, LOOM_ERR_USAGE, "loom ckpt export: %s cannot be combined with a checkpoint, which fixes the model",
                     table[i].name);
  loom_gpt_config cfg;
  int T;
  if (st == LOOM_OK && npos == 0) st = loom_model_flags_resolve("loom ckpt export", &mf, table, &cfg, &T, &err);
  if (st == LOOM_OK)
    st = export_model(npos ? pos[0] : NULL, &cfg, mf.init_from, &x, (uint64_t)shard_bytes, &err);
  return loom_report(st, &err);
}

int loom_cmd_ckpt(int argc, char **argv) {
  const char *sub = argc >= 1 ? argv[0] : "";
  if (strcmp(sub, "verify") == 0) return verify(argc - 1, argv + 1);
  if (strcmp(sub, "reshard") == 0) return reshard(argc - 1, argv + 1);
  if (strcmp(sub, "export") == 0) return export_cmd(argc - 1, argv + 1);
  loom_error err = {0};
  loom_fail(&err, LOOM_ERR_USAGE, "loom ckpt: expected 'verify DIR', 'reshard DIR ... -o OUT' or 'export [DIR] --format F -o OUT'");
  return loom_report(LOOM_ERR_USAGE, &err);
}
