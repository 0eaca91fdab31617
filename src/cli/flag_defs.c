/* The shared flags' one definition each. */
#include <string.h>
#include "cli/device.h"
#include "cli/flag_defs.h"
#include "core/check.h"
#include "backend/cpu/cpu_peak.h"
#include "plan/plan.h"

/* 2^53: the largest integer a seed written as JSON (a double) keeps. */
#define SEED_MAX 9007199254740991.0

static const loom_flag DEFS[] = {
    /* the layout, as plan fields */
    {"--tp", FLAG_INT, NULL, "tensor-parallel ranks", 1, LOOM_PLAN_MAX_TP, NULL, false, "parallel.tp"},
    {"--pp", FLAG_INT, NULL, "pipeline stages (world size = tp x cp x dp x pp)", 1, LOOM_PLAN_MAX_PP, NULL, false, "parallel.pp"},
    {"--dp", FLAG_INT, NULL, "data-parallel replicas, each taking its share of the global batch", 1, LOOM_PLAN_MAX_DP, NULL,
     false, "parallel.dp"},
    {"--vpp", FLAG_INT, NULL, "model chunks per pipeline rank (--schedule interleaved; zb_v: 2, its default)", 1,
     LOOM_PLAN_MAX_CHUNKS, NULL, false, "parallel.virtual_chunks"},
    {"--zero", FLAG_INT, NULL, "ZeRO stage over the dp replicas: 1 shards Adam state, 2 also the grads, 3 also the weights",
     0, 3, NULL, false, "parallel.zero_stage"},
    {"--micro-batches", FLAG_INT, NULL, "micro-batches per step and replica (0: global batch / (micro-batch x dp))", 0,
     LOOM_PLAN_MAX_MICRO_BATCHES, NULL, false, NULL},
    {"--schedule", FLAG_STRING, NULL, "pipeline schedule", LOOM_NO_RANGE, NULL, false, "schedule"},
    {"--layer-split", FLAG_STRING, NULL, "explicit layers per stage, e.g. 7,8,8,7 (default: --balance)", LOOM_NO_RANGE, NULL,
     false, "stages"},
    {"--plan", FLAG_STRING, NULL, "a partition plan (.txtpb or .pb)", LOOM_NO_RANGE, NULL, false, NULL},
    {"--name", FLAG_STRING, NULL, "a name for what is written", LOOM_NO_RANGE, NULL, false, NULL},
    /* where and how it runs */
    {"--device", FLAG_STRING, NULL, LOOM_DEVICE_HELP, LOOM_NO_RANGE, LOOM_DEVICE_CHOICES, false, NULL},
    {"--threads", FLAG_INT, NULL, "CPU threads per rank (0: the node's cores shared among its ranks)", 0, LOOM_MAX_THREADS,
     NULL, false, NULL},
    {"--seed", FLAG_INT64, NULL, "seed", 0, SEED_MAX, NULL, false, NULL},
    {"--steps", FLAG_INT, NULL, "optimizer steps", 1, 1e9, NULL, false, NULL},
    {"--seconds", FLAG_FLOAT, NULL, "the least time each measurement runs", 0.01, 60, NULL, false, NULL},
    {"--mem-mb", FLAG_FLOAT, NULL, "MiB of the memory bandwidth test's arrays", 1, 65536, NULL, false, NULL},
    /* inputs and outputs */
    {"-o", FLAG_STRING, NULL, "output", LOOM_NO_RANGE, NULL, false, NULL},
    {"--force", FLAG_BOOL, NULL, "replace outputs that exist", LOOM_NO_RANGE, NULL, false, NULL},
    {"--data", FLAG_STRING, NULL, "an llm.c token file, a Megatron indexed dataset PREFIX, or a blend \"W1 PREFIX1 W2 PREFIX2 ...\"",
     LOOM_NO_RANGE, NULL, false, NULL},
    {"--tokenizer", FLAG_STRING, NULL, "GPT-2 files' directory, tokenizer.json or NAME.tiktoken", LOOM_NO_RANGE, NULL, false,
     NULL},
    {"--json-key", FLAG_STRING, NULL, "read JSONL, each document in this member (default for *.jsonl: text)", LOOM_NO_RANGE,
     NULL, false, NULL},
    {"--allow-special", FLAG_BOOL, NULL, "special tokens written in the text become their ids", LOOM_NO_RANGE, NULL, false,
     NULL},
    {"--trace", FLAG_STRING, NULL, "write the timeline as Chrome-trace JSON (loom trace svg draws it)", LOOM_NO_RANGE, NULL,
     false, NULL},
    {"--svg", FLAG_STRING, NULL, "draw it as an SVG file", LOOM_NO_RANGE, NULL, false, NULL},
    {"--mtbf-hours", FLAG_FLOAT, NULL, "a node's mean time between failures that end a job, in hours", 1e-3, 1e9, NULL,
     false, NULL},
};

loom_flag loom_flag_def_as(const char *name, void *dst, const char *help) {
  for (size_t i = 0; i < sizeof DEFS / sizeof *DEFS; i++)
    if (strcmp(DEFS[i].name, name) == 0) {
      loom_flag f = DEFS[i];
      f.dst = dst;
      if (help) f.help = help;
      if (strcmp(name, "--schedule") == 0) f.choices = loom_schedule_train_kind_names(); /* not a constant expression */
      return f;
    }
  LOOM_CHECK(0, "a flag of flag_defs.c");
  return (loom_flag){0};
}

loom_flag loom_flag_def(const char *name, void *dst) { return loom_flag_def_as(name, dst, NULL); }
