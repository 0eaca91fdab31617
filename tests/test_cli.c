#define _GNU_SOURCE /* memmem */
/* The loom program end to end: every bad-input case gives its one-line
 * message and exit code, and the subcommands work together (data prepare,
 * train with metrics and save, eval, sample, ckpt export, init-from). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cli/megatron_flags.h"
#include "cli/train_flags.h"
#include "ckpt/manifest.h"
#include "test_util.h"

static const char *g_loom;
static const char *g_env[4]; /* NAME=VALUE settings for the next runs' environment, NULL-ended */
static uid_t g_uid;          /* run as this user when nonzero (a test run as root checking permissions) */

typedef struct {
  int code;
  char out[65536], err[4096];
} result;

static void slurp(const char *path, char *buf, size_t cap) {
  FILE *fp = fopen(path, "rb");
  size_t n = fp ? fread(buf, 1, cap - 1, fp) : 0;
  buf[n] = '\0';
  if (fp) fclose(fp);
}

/* Runs loom with a NULL-terminated argument array. */
static result *run_argv(const char *const *args) {
  static result r;
  const char *argv[64] = {g_loom};
  int argc = 1;
  while (argc < 63 && (argv[argc] = args[argc - 1]) != NULL) argc++;
  argv[argc] = NULL;
  const char *out = tu_tmp_path("stdout"), *err = tu_tmp_path("stderr");
  const pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    dup2(open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
    dup2(open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644), 2);
    setenv("OMP_NUM_THREADS", "1", 1);
    for (int i = 0; g_env[i]; i++) putenv((char *)g_env[i]);
    if (g_uid && (setgid(g_uid) != 0 || setuid(g_uid) != 0)) _exit(126);
    execv(g_loom, (char *const *)argv);
    _exit(127);
  }
  int status;
  waitpid(pid, &status, 0);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  slurp(out, r.out, sizeof r.out);
  slurp(err, r.err, sizeof r.err);
  return &r;
}

/* Runs loom with a NULL-terminated argument list. */
static result *run(const char *first, ...) {
  const char *args[64] = {first};
  int n = 1;
  va_list ap;
  va_start(ap, first);
  while (n < 63 && (args[n] = va_arg(ap, const char *)) != NULL) n++;
  va_end(ap);
  args[n] = NULL;
  return run_argv(args);
}

/* stderr must be exactly one line, `line`, and the exit code `code`. */
static void expect_fail(const result *r, int code, const char *line) {
  char want[1024];
  snprintf(want, sizeof want, "%s\n", line);
  ck_assert_str_eq(r->err, want);
  ck_assert_int_eq(r->code, code);
}

/* One line on stderr containing `part`, and the exit code `code`. */
static void expect_fail_with(const result *r, int code, const char *part) {
  const char *nl = strchr(r->err, '\n');
  ck_assert_msg(nl && nl[1] == '\0' && strstr(r->err, part), "want one line with '%s', got '%s'", part, r->err);
  ck_assert_int_eq(r->code, code);
}

/* One row of a refusal table: stderr exactly `line` and the exit code
 * `code`; a failing row is printed and the table goes on (tu_rows_done). */
static void refusal_row(tu_rows *t, const result *r, int code, const char *line) {
  char want[4096];
  snprintf(want, sizeof want, "%s\n", line);
  tu_row(t, r->code == code && strcmp(r->err, want) == 0, "exit %d (want %d), stderr '%s' (want '%s')", r->code, code,
         r->err, line);
}

static const char *const TINY[] = {"--layers", "1", "--hidden", "16", "--heads", "2", "--seq", "16", "--micro-batch", "2"};

START_TEST(bad_flags) {
  tu_rows t = {0};
  refusal_row(&t, run("frobnicate", NULL), 2, "loom: unknown command 'frobnicate' (commands: plan, sim, train, preflight, eval, sample, bench, data, ckpt, schedule, trace)");
  refusal_row(&t, run("train", "--lr", "abc", NULL), 2, "loom train: --lr expects a number, got 'abc'");
  refusal_row(&t, run("train", "--rope-theta", "500", NULL), 2,
              "loom train: --rope-theta sets RoPE's base, but this model has learned positions; add --position rope");
  refusal_row(&t, run("train", "--recompute-method", "block", NULL), 2,
              "loom train: --recompute-method and --recompute-num-layers shape full recompute; add --recompute full "
              "(Megatron-LM's --recompute-granularity full)");
  refusal_row(&t, run("train", "--recompute", "full", "--recompute-method", "block", NULL), 2,
              "loom train: --recompute-method block needs --recompute-num-layers, the layers of each stage that recompute");
  refusal_row(&t, run("train", "--recompute", "full", "--recompute-num-layers", "2", "--dp", "2", "--zero", "3", NULL), 2,
              "loom train: stages[0].recompute_group = 2 with --zero 3: ZeRO-3 gathers one layer's weights at a time, and "
              "recomputing a group of layers needs all of theirs; use groups of 1");
  refusal_row(&t, run("train", "--tensorboard-dir", "/etc/passwd", NULL), 2,
              "loom train: --tensorboard-dir /etc/passwd: is a file, not a directory of event files");
  refusal_row(&t, run("train", "--qkv-bias", NULL), 2,
              "loom train: --qkv-bias keeps q, k and v's biases where the others are dropped, but this model has biases on "
              "every linear; add --no-bias");
  refusal_row(&t, run("train", "--model", "llama-tiny", "--kv-heads", "3", NULL), 2,
              "loom train: --kv-heads 3: must divide --heads (4), each key/value head serving a group of query heads");
  refusal_row(&t, run("train", "--lr", NULL), 2, "loom train: --lr needs a value");
  /* --flag=value is the same flag: checked alike, and given once. */
  refusal_row(&t, run("train", "--steps=0", NULL), 2, "loom train: --steps must be in [1, 1000000000], got 0");
  refusal_row(&t, run("train", "--steps=2", "--steps", "3", NULL), 2, "loom train: --steps given more than once");
  refusal_row(&t, run("train", "--resume=yes", NULL), 2, "loom train: --resume takes no value");
  refusal_row(&t, run("train", "--frobnicate=2", NULL), 2, "loom train: unknown flag --frobnicate (see loom train --help)");
  /* nan passes every range comparison, and inf means nothing to any flag. */
  refusal_row(&t, run("train", "--lr", "nan", NULL), 2, "loom train: --lr expects a finite number, got 'nan'");
  refusal_row(&t, run("train", "--grad-clip", "inf", NULL), 2, "loom train: --grad-clip expects a finite number, got 'inf'");
  refusal_row(&t, run("train", "--steps", "NaN", NULL), 2, "loom train: --steps expects an integer in decimal digits, got 'NaN'");
  refusal_row(&t, run("train", "--steps", "0", NULL), 2, "loom train: --steps must be in [1, 1000000000], got 0");
  refusal_row(&t, run("train", "--steps", "1.5", NULL), 2, "loom train: --steps expects an integer in decimal digits, got '1.5'");
  refusal_row(&t, run("train", "--bogus", NULL), 2, "loom train: unknown flag --bogus (see loom train --help)");
  refusal_row(&t, run("train", "--lr", "1", "--lr", "2", NULL), 2, "loom train: --lr given more than once");
  refusal_row(&t, run("train", "extra", NULL), 2, "loom train: unexpected argument 'extra' (see loom train --help)");
  refusal_row(&t, run("train", "--model", "gpt-huge", NULL), 2, "loom train: --model must be one of gpt-tiny, gpt2-small, gpt-1.3b, gpt-13b, gpt50b, gpt-175b, llama-tiny, llama3-8b, llama3-70b, moe-tiny, mixtral-8x7b, mixtral-8x22b, qwen1.5-moe-a2.7b, qwen3-8b, qwen3-32b, qwen3-30b-a3b, qwen3-235b-a22b, gpt-oss-20b, gpt-oss-120b, deepseek-v3, deepseek-v3-tiny, got 'gpt-huge'");
  /* Mixture of Experts: its flags need one, its rules by flag name. */
  refusal_row(&t, run("train", "--moe-router-topk", "2", NULL), 2,
              "loom train: --moe-router-topk configures a Mixture of Experts, but this model is dense; add --num-experts");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--moe-router-topk", "9", NULL), 2,
              "loom train: --moe-router-topk 9: a token's experts must be at most --num-experts (8)");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--moe-shared-expert-intermediate-size", "3", "--tp", "2", NULL), 2,
              "loom train: --moe-shared-expert-intermediate-size 3: must be divisible by --tp (2), the shared expert split as the "
              "dense MLP is; pick a tp that divides it");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--moe-expert-capacity-factor", "0", NULL), 2,
              "loom train: --moe-expert-capacity-factor must be in [1e-06, 1024], got 0");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--moe-router-score-function", "sigmoid", "--moe-router-pre-softmax", NULL),
              2, "loom train: --moe-router-pre-softmax true: orders a softmax before the top-k, but --moe-router-score-function is sigmoid");
  /* multi-head latent attention's sizes and companions */
  refusal_row(&t, run("train", "--model", "llama-tiny", "--multi-latent-attention", "--kv-lora-rank", "100", NULL), 2,
              "loom train: --kv-lora-rank 100: the compressed keys and values must be narrower than the hidden state "
              "(--hidden 64); DeepSeek-V3's is 512 of 7168");
  refusal_row(&t, run("train", "--model", "llama-tiny", "--multi-latent-attention", "--qk-pos-emb-head-dim", "5", NULL), 2,
              "loom train: --qk-pos-emb-head-dim 5: RoPE turns pairs of dims, so it must be even (DeepSeek-V3's 64)");
  refusal_row(&t, run("train", "--model", "llama-tiny", "--kv-lora-rank", "8", NULL), 2,
              "loom train: --kv-lora-rank sizes multi-head latent attention, but this model's attention is not; add "
              "--multi-latent-attention");
  refusal_row(&t, run("train", "--model", "llama-tiny", "--multi-latent-attention", "--kv-heads", "2", NULL), 2,
              "loom train: --multi-latent-attention: every head has its own key and value, of the widths --qk-head-dim "
              "and --v-head-dim, its latents normalised; drop --kv-heads, --kv-channels and --qk-layernorm");
  /* multi-token prediction's */
  refusal_row(&t, run("train", "--model", "llama-tiny", "--mtp-num-layers", "4", "--seq", "4", NULL), 2,
              "loom train: --mtp-num-layers 4: module 4 predicts the token 5 ahead, which a sequence of --seq 4 never has; the "
              "model is too short for it (seq must exceed mtp_num_layers)");
  refusal_row(&t, run("train", "--mtp-num-layers", "1", NULL), 2,
              "loom train: --mtp-num-layers 1: the modules embed the tokens ahead without a learned position table; set "
              "--position POSITION_ROPE (DeepSeek-V3's)");
  refusal_row(&t, run("train", "--model", "llama-tiny", "--mtp-loss-scaling-factor", "0.2", NULL), 2,
              "loom train: --mtp-loss-scaling-factor weighs the multi-token prediction loss, but this model has no MTP "
              "modules; add --mtp-num-layers");
  refusal_row(&t, run("train", "--model", "llama-tiny", "--mtp-num-layers", "5000", NULL), 2,
              "loom train: --mtp-num-layers must be in [0, 4096], got 5000");
  /* group-limited routing's counts */
  refusal_row(&t, run("train", "--model", "moe-tiny", "--moe-router-num-groups", "3", "--moe-router-group-topk", "1", NULL), 2,
              "loom train: --moe-router-num-groups 3: must divide the experts (8) into equal groups");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--moe-router-num-groups", "4", "--moe-router-group-topk", "5", NULL), 2,
              "loom train: --moe-router-group-topk 5: a token's experts come from that many of the 4 groups; give 1 to 4");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--moe-router-num-groups", "4", NULL), 2,
              "loom train: --moe-router-num-groups 4: needs --moe-router-group-topk, how many of the groups a token's "
              "experts come from (DeepSeek-V3's 8 groups, 4 of them)");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--moe-router-num-groups", "8", "--moe-router-group-topk", "1", NULL), 2,
              "loom train: --moe-router-topk 2: more experts than the 1 chosen groups of 1 hold");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--moe-router-num-groups", "4", "--moe-router-group-topk", "3", NULL), 2,
              "loom train: --moe-router-group-topk 3: each chosen group is scored by its best topk / group_topk scores, but "
              "topk is 2; give at most 2");
  refusal_row(&t, run("train", "--moe-router-num-groups", "2", NULL), 2,
              "loom train: --moe-router-num-groups configures a Mixture of Experts, but this model is dense; add --num-experts");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--moe-layer-freq", "([1]*1)", NULL), 2,
              "loom train: --moe-layer-freq ([1]*1): gives 1 entries for the model's 2 layers (give N, one MoE layer in every "
              "N, or Megatron's list form such as ([0]*3+[1]*58))");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--moe-layer-freq", "([0]*2)", NULL), 2,
              "loom train: --moe-layer-freq: no layer is a Mixture of Experts; make one a MoE layer, or give the model no "
              "experts");
  refusal_row(&t, run("train", "--moe-layer-freq", "1", NULL), 2,
              "loom train: --moe-layer-freq configures a Mixture of Experts, but this model is dense; add --num-experts");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--moe-router-enable-expert-bias", NULL), 2,
              "loom train: --moe-router-enable-expert-bias true: DeepSeek-V3's aux-loss-free balancing biases sigmoid scores, "
              "but --moe-router-score-function is softmax; set it to sigmoid, as Megatron-Core requires");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
                      "--save", "m.safetensors", NULL), 2,
              "loom train: --save m.safetensors: this model routes with an expert bias (--moe-router-enable-expert-bias), which "
              "only a loom checkpoint holds so far; keep its checkpoint (--ckpt) and evaluate or sample from that (--init-from DIR)");
  /* Expert parallelism's rules. */
  refusal_row(&t, run("train", "--model", "moe-tiny", "--ep", "2", NULL), 2,
              "loom train: --ep 2: must divide --tp x --dp (1), the ranks of a stage a MoE layer regroups; pick such an ep");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--dp", "2", "--ep", "3", NULL), 2,
              "loom train: --ep 3: must divide --num-experts (8), each rank holding as many; pick such an ep");
  refusal_row(&t, run("train", "--dp", "2", "--expert-model-parallel-size", "2", NULL), 2,
              "loom train: --ep 2: expert parallelism splits a Mixture of Experts' experts, but the model is dense; give it "
              "--num-experts or drop ep");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--dp", "2", "--ep", "2", "--grad-compression", "sign", NULL), 2,
              "loom train: --ep 2: gradient compression does not yet cross the expert-data-parallel group; drop "
              "grad_compression or ep");
  /* Expert tensor parallelism's: 1 or tp, with sequence parallelism, on a MoE model, ep then dividing dp. */
  refusal_row(&t, run("train", "--model", "moe-tiny", "--tp", "2", "--sequence-parallel", "--etp", "4", NULL), 2,
              "loom train: --etp 4: must be 1 or --tp (2): the experts split over the tp group or not at all (another size "
              "is not supported yet)");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--tp", "2", "--expert-tensor-parallel-size", "2", NULL), 2,
              "loom train: --etp 2: the experts' rows are gathered over the tp group from its ranks' shares of the sequence; "
              "set --sequence-parallel (as Megatron-Core requires)");
  refusal_row(&t, run("train", "--tp", "2", "--sequence-parallel", "--etp", "2", NULL), 2,
              "loom train: --etp 2: expert tensor parallelism splits a Mixture of Experts' experts, but the model is dense; "
              "give it --num-experts or drop etp");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--tp", "2", "--sequence-parallel", "--etp", "2", "--ep", "2", NULL), 2,
              "loom train: --ep 2 with --etp 2: etp x ep (4) must divide --tp x --dp (2), the ranks of a stage a MoE layer "
              "regroups, so ep divides dp; pick such an ep");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--tp", "2", "--ep", "2", NULL), 2,
              "loom train: --ep 2 with --tp 2: each rank of an expert-parallel group sends its own tokens, so the tp ranks "
              "must split the sequence; set --sequence-parallel (as Megatron-Core requires)");
  /* Context parallelism's: 2 cp chunks of the sequence, each rank's rows split by tp under SP, dense models, every rank launched. */
  refusal_row(&t, run("train", "--cp", "3", NULL), 2,
              "loom train: --cp 3: the sequence (64) must be divisible by 2 x cp (6), each rank holding two equal chunks of "
              "it (the load-balanced causal split); pick such a seq or cp");
  refusal_row(&t, run("train", "--seq", "20", "--tp", "4", "--sequence-parallel", "--context-parallel-size", "2", NULL), 2,
              "loom train: --cp 2 with sequence parallelism: each rank's 10 rows (seq / cp) must be divisible by --tp (4); "
              "pick such a seq, cp or tp");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--cp", "2", "--ep", "2", "--dp", "2", NULL), 2,
              "loom train: --cp 2: context parallelism with the experts split (--ep 2, --etp 1) is not supported yet; keep "
              "every expert whole on every rank (ep 1, etp 1) or drop cp");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--cp", "2", "--moe-expert-capacity-factor", "1.5", NULL), 2,
              "loom train: --cp 2: context parallelism with a capacity factor (--moe-expert-capacity-factor 1.5) is not "
              "supported yet: its ranks hold the sequence's chunks out of order, which decides the drops; run dropless "
              "(capacity_factor 0) or drop cp");
  refusal_row(&t, run("train", "--cp-comm-type", "all_gather", NULL), 2,
              "loom train: --cp-comm-type all_gather: says how context parallelism exchanges keys and values, but --cp is 1; "
              "set --cp 2 or more, or drop cp_comm_type");
  refusal_row(&t, run("train", "--cp", "2", "--cp-comm-type", "a2a", NULL), 2,
              "loom train: --cp-comm-type must be one of p2p, all_gather, got 'a2a'");
  refusal_row(&t, run("train", "--cp", "2", NULL), 2,
              "loom train: parallel: tp 1 x pp 1 x dp 1 x cp 2 = 2 ranks, but the world has 1; launch 2 ranks or change the "
              "layout");
  /* The overlap switches': tp comm overlap over a tp group with SP; grad reduce on or off, not both. */
  refusal_row(&t, run("train", "--tp-comm-overlap", NULL), 2,
              "loom train: --tp-comm-overlap true: overlaps the tensor-parallel group's collectives, but --tp is 1; raise "
              "--tp or drop tp_comm");
  refusal_row(&t, run("train", "--tp", "2", "--tp-comm-overlap", NULL), 2,
              "loom train: --tp-comm-overlap true: overlaps sequence parallelism's all-gathers and reduce-scatters with their "
              "GEMMs; set --sequence-parallel (as Megatron-Core requires)");
  refusal_row(&t, run("train", "--dp", "2", "--overlap-param-gather", NULL), 2,
              "loom train: --overlap-param-gather true: overlaps ZeRO-1/2's all-gather of the stepped weights, but --zero is "
              "0; use zero_stage 1 or 2, or drop param_gather");
  refusal_row(&t, run("train", "--dp", "2", "--zero", "1", "--overlap-param-gather", "--no-overlap-grad-reduce", NULL), 2,
              "loom train: --overlap-param-gather true: needs the grads reduced during backward too (as Megatron-Core "
              "requires); drop --no-overlap-grad-reduce or param_gather");
  /* fp8 GEMMs: beside bf16 only; the recipe's settings range-checked. */
  refusal_row(&t, run("train", "--model", "moe-tiny", "--dp", "2", "--ep", "2", "--zero", "1", "--precision", "bf16",
                      "--grad-reduce-dtype", "bf16", NULL), 2,
              "loom train: --grad-reduce-dtype PRECISION_BF16: ZeRO-1 with the experts apart (--ep 2) reduce-scatters bucket by "
              "bucket in fp32 in this loom; set grad_reduce PRECISION_FP32, --zero 0, or ep 1");
  refusal_row(&t, run("train", "--no-overlap-p2p-communication", NULL), 2,
              "loom train: --no-overlap-p2p-communication: waiting for each pipeline send needs transfers between stages, but "
              "--pp is 1; raise --pp or drop it");
  refusal_row(&t, run("train", "--fp8-format", "hybrid", NULL), 2,
              "loom train: --fp8-format FP8_HYBRID: fp8 GEMMs run beside bf16 mixed precision (as Transformer Engine's); set "
              "precision PRECISION_BF16");
  refusal_row(&t, run("train", "--precision", "bf16", "--fp8-format", "e4m3", "--fp8-amax-history-len", "0", NULL), 2,
              "loom train: --fp8-amax-history-len 0: delayed scaling keeps 1 to 1048576 steps of amax");
  refusal_row(&t, run("train", "--precision", "bf16", "--fp8-format", "e4m3", "--fp8-recipe", "current", NULL), 2,
              "loom train: --fp8-recipe must be one of delayed, tensorwise, blockwise, mxfp8, got 'current'");
  refusal_row(&t, run("train", "--precision", "bf16", "--fp8-format", "e5m2", NULL), 2,
              "loom train: --fp8-format must be one of none, hybrid, e4m3, got 'e5m2'");
  refusal_row(&t, run("train", "--overlap-grad-reduce", "--no-overlap-grad-reduce", NULL), 2,
              "loom train: --overlap-grad-reduce and --no-overlap-grad-reduce contradict; give one");
  refusal_row(&t, run("train", "--data-order", "random", NULL), 2, "loom train: --data-order must be one of sequential, shuffled, got 'random'");
  refusal_row(&t, run("train", "--hidden", "100", "--heads", "3", NULL), 2,
              "loom train: --hidden 100: must be divisible by --heads (3); pick heads that divide hidden, or set --kv-channels (each head's width)");
  /* Qwen3's attention pieces, each refused where it cannot run. */
  refusal_row(&t, run("train", "--kv-channels", "300", NULL), 2, "loom train: --kv-channels must be in [1, 256], got 300");
  refusal_row(&t, run("train", "--model", "llama-tiny", "--kv-channels", "15", NULL), 2,
              "loom train: --position POSITION_ROPE: needs an even head size, but the heads are 15 wide");
  refusal_row(&t, run("train", "--window-size", "8,1", NULL), 2,
              "loom train: --window-size '8,1': the right half must be 0: loom's attention is causal, no query sees a later key");
  refusal_row(&t, run("train", "--window-size", "abc", NULL), 2,
              "loom train: --window-size 'abc': give LEFT,RIGHT as Megatron does (128,0: each query sees the 128 keys before "
              "it), LEFT from 1 to 1048576 or -1 for none");
  refusal_row(&t, run("train", "--window-size", "64", NULL), 2,
              "loom train: --window-size 64: a query's window must be shorter than the sequence (--seq 64), past which it "
              "changes nothing; drop it or make it shorter");
  refusal_row(&t, run("train", "--window-attn-skip-freq", "2", NULL), 2,
              "loom train: --window-attn-skip-freq says which layers skip the window, but there is no window; add --window-size");
  refusal_row(&t, run("train", "--window-size", "16,0", "--window-attn-skip-freq", "[1,0,1]", NULL), 2,
              "loom train: --window-attn-skip-freq '[1,0,1]': more entries than the model's layers (give N, one "
              "full-attention layer after N - 1 windowed ones, or a list such as ([1,0]*12), 1 for a windowed layer)");
  refusal_row(&t, run("train", "--model", "llama-tiny", "--rope-type", "yarn", NULL), 2,
              "loom train: --rope-type yarn and --rotary-scaling-factor go together, on a model with --position rope");
  refusal_row(&t, run("train", "--rope-type", "yarn", "--rotary-scaling-factor", "4", NULL), 2,
              "loom train: --rope-type yarn and --rotary-scaling-factor go together, on a model with --position rope");
  refusal_row(&t, run("train", "--quick-geglu", NULL), 2,
              "loom train: --quick-geglu, --activation-func-clamp-value, --glu-linear-offset: shape SwiGLU's gated unit, but "
              "--mlp is not MLP_SWIGLU");
  refusal_row(&t, run("train", "--out-bias", NULL), 2,
              "loom train: --out-bias keeps the attention output's bias where the others are dropped, but this model has "
              "biases on every linear; add --no-bias");
  refusal_row(&t, run("train", "--qk-layernorm", NULL), 2,
              "loom train: --qk-layernorm true: normalises q and k with RMSNorm, as the model's other norms; set --norm "
              "NORM_RMSNORM (Qwen3's and Megatron-Core's pairing)");
  refusal_row(&t, run("ckpt", "export", "--model", "llama-tiny", "--kv-channels", "24", "--qkv-bias", "--format", "hf", "-o",
                      tu_tmp_path("qwen2_hf"), NULL), 2,
              "loom: -o: this model (grouped-query attention, 2 kv heads, heads of 24, rmsnorm, swiglu, rope theta 10000, biases "
              "on q, k and v only, untied head) has no Hugging Face class (Qwen2ForCausalLM): its heads are not hidden / heads "
              "wide, which Qwen2's classes take (--kv-channels: LlamaForCausalLM, or Qwen3's with --qk-layernorm); save it as a "
              "loom checkpoint or a safetensors file");
  refusal_row(&t, run("train", "--micro-batch", "4", "--global-batch", "10", NULL), 2,
              "loom train: --global-batch 10: must be a positive multiple of --micro-batch x --dp (4); round it to a multiple");
  refusal_row(&t, run("train", "--data", "x.bin", "--synthetic", "addition", NULL), 2, "loom train: give --data or --synthetic, not both");
  refusal_row(&t, run("train", "--eval-data", "x.bin", NULL), 2, "loom train: --eval-data needs --data");
  refusal_row(&t, run("train", "--data", "x.bin", "--split", "98,2,0", NULL), 2,
              "loom train: --split applies to indexed datasets (--data PREFIX or a blend)");
  refusal_row(&t, run("train", "--data", "0.5 a 0.5", NULL), 2, "loom: --data \"0.5 a 0.5\": expected PREFIX or \"W1 PREFIX1 W2 PREFIX2 ...\" (at most 64 datasets)");
  refusal_row(&t, run("train", "--vocab", "100", NULL), 2, "loom train: --synthetic addition needs --vocab of at least 256 (byte tokens), got 100");
  refusal_row(&t, run("train", "--dropout", "1", NULL), 2, "loom train: --dropout must be in [0, 0.99], got 1");
  refusal_row(&t, run("train", "--data", "/nonexistent.bin", NULL), 2, "loom: /nonexistent.bin: cannot open token file: No such file or directory");
  refusal_row(&t, run("train", "--metrics", "/nonexistent/m.jsonl", "--steps", "1", NULL), 2,
              "loom train: --metrics /nonexistent/m.jsonl: /nonexistent: No such file or directory");
  refusal_row(&t, run("eval", "--data", "x.bin", NULL), 2, "loom eval: --init-from is required");
  refusal_row(&t, run("sample", "--init-from", "m.bin", NULL), 2, "loom sample: --prompt is required");
  refusal_row(&t, run("data", "prepare", NULL), 2, "loom data prepare: expected one or more input files");
  refusal_row(&t, run("data", "prepare", "in.txt", NULL), 2, "loom data prepare: give --output-prefix P or -o OUT.bin (one of them)");
  refusal_row(&t, run("data", NULL), 2, "loom data: expected 'prepare', 'encode', 'decode' or 'tokenizer train'");
  refusal_row(&t, run("data", "prepare", "in.txt", "-o", "a.bin", "--output-prefix", "p", NULL), 2,
              "loom data prepare: give --output-prefix P or -o OUT.bin (one of them)");
  refusal_row(&t, run("data", "prepare", "in.txt", "-o", "a.bin", "--workers", "0", NULL), 2, "loom data prepare: --workers must be in [1, 256], got 0");
  refusal_row(&t, run("data", "encode", "x.txt", NULL), 2, "loom data encode: --tokenizer is required");
  refusal_row(&t, run("data", "decode", "--tokenizer", "/nonexistent", "x", NULL), 2, "loom: /nonexistent: no such tokenizer file or directory");
  refusal_row(&t, run("data", "tokenizer", "fit", NULL), 2, "loom data tokenizer: expected 'train CORPUS... --vocab-size N -o DIR'");
  refusal_row(&t, run("data", "tokenizer", "train", "x.txt", "-o", "d", NULL), 2, "loom data tokenizer train: --vocab-size and -o are required");
  refusal_row(&t, run("data", "tokenizer", "train", "x.txt", "--vocab-size", "100", "-o", "d", NULL), 2,
              "loom data tokenizer: --vocab-size must be in [257, 4000000], got 100");
  refusal_row(&t, run("ckpt", "export", "--format", "llmc", NULL), 2, "loom ckpt export: -o OUT is required");
  refusal_row(&t, run("ckpt", "export", "--format", "onnx", NULL), 2, "loom ckpt export: --format must be one of llmc, safetensors, hf, got 'onnx'");
  refusal_row(&t, run("ckpt", "export", "/nonexistent-ck", "--format", "llmc", "-o", "m.bin", NULL), 2,
              "loom: /nonexistent-ck/latest: no checkpoint to load (No such file or directory)");
  refusal_row(&t, run("ckpt", "export", "ck", "--layers", "3", "--format", "llmc", "-o", "m.bin", NULL), 2,
              "loom ckpt export: --layers cannot be combined with a checkpoint, which fixes the model");
  refusal_row(&t, run("ckpt", "export", "--model", "moe-tiny", "--moe-shared-expert-intermediate-size", "64", "--qkv-bias",
                      "--format", "hf", "-o", tu_tmp_path("moe_hf"), NULL), 2,
              "loom: -o: this Mixture of Experts has no Hugging Face class (Qwen2MoeForCausalLM): its shared expert has no "
              "gate, which Qwen2-MoE's has (--moe-shared-expert-gate); save it as a loom checkpoint or a safetensors file");
  refusal_row(&t, run("ckpt", "export", "--model", "moe-tiny", "--moe-router-pre-softmax", "--format", "hf", "-o", tu_tmp_path("moe_hf"), NULL),
              2, "loom: -o: this Mixture of Experts has no Hugging Face class (MixtralForCausalLM): its router is not Mixtral's (a "
              "softmax over every expert, its top-k renormalised); save it as a loom checkpoint or a safetensors file");
  refusal_row(&t, run("ckpt", "export", "--model", "moe-tiny", "--moe-router-bias", "--format", "hf", "-o",
                      tu_tmp_path("moe_hf"), NULL),
              2, "loom: -o: this Mixture of Experts has no Hugging Face class (MixtralForCausalLM): its router has a bias "
              "(--moe-router-bias), which this class's has not; save it as a loom checkpoint or a safetensors file");
  refusal_row(&t, run("ckpt", "export", "--model", "moe-tiny", "--format", "llmc", "-o", "moe.bin", NULL), 2,
              "loom: moe.bin: llm.c's format holds GPT-2 models only (LayerNorm, GELU, learned positions, biases, tied "
              "embeddings, dense MLPs)");
  refusal_row(&t, run("ckpt", NULL), 2, "loom ckpt: expected 'verify DIR', 'reshard DIR ... -o OUT' or 'export [DIR] --format F -o OUT'");
  refusal_row(&t, run("ckpt", "reshard", "ck", "--tp", "2", NULL), 2, "loom ckpt reshard: -o OUT is required");
  refusal_row(&t, run("ckpt", "reshard", "ck", "--plan", "p.txtpb", "--tp", "2", "-o", "out", NULL), 2,
              "loom ckpt reshard: --plan fixes the layout; drop the layout flags");
  refusal_row(&t, run("ckpt", "reshard", "/nonexistent-ck", "--tp", "2", "-o", "out", NULL), 2,
              "loom: /nonexistent-ck/latest: no checkpoint to load (No such file or directory)");
  refusal_row(&t, run("bench", NULL), 2, "loom bench: expected the benchmark name 'step' or 'ckpt'");
  refusal_row(&t, run("trace", "svg", "/nonexistent.json", "-o", "x.svg", NULL), 2,
              "loom: /nonexistent.json: cannot open trace: No such file or directory");
  refusal_row(&t, run("schedule", "show", "--schedule", "interleaved", "--vpp", "2", "--pp", "4", "--micro-batches", "6", NULL), 2,
              "loom schedule show: --micro-batches 6: not a multiple of --pp (4); the interleaved schedule moves "
              "micro-batches through the chunks in groups of pp");
  refusal_row(&t, run("schedule", "show", "--vpp", "2", NULL), 2,
              "loom schedule show: --vpp 2: needs --schedule interleaved (or zb_v with 2); 1f1b runs one chunk per rank");
  const result *shown = run("schedule", "show", "--pp", "2", "--micro-batches", "3", NULL);
  ck_assert_int_eq(shown->code, 0);
  ck_assert_ptr_nonnull(strstr(shown->out, "verified deadlock-free"));
  ck_assert_ptr_nonnull(strstr(shown->out, "rank 1 | .  F0 B0 B0 F1 B1 B1 F2 B2 B2 "));
  ck_assert_ptr_nonnull(strstr(shown->out, "bubble: 25.0% simulated (per stage: forward 1, backward 2, or B 1 and W 1); theory 25.0%"));
  /* ZB-H1 draws each backward as B and W; rank 1 defers one W. */
  shown = run("schedule", "show", "--pp", "2", "--micro-batches", "3", "--schedule", "zb_h1", NULL);
  ck_assert_int_eq(shown->code, 0);
  ck_assert_ptr_nonnull(strstr(shown->out, "rank 1 | .  F0 B0 F1 B1 W0 F2 B2 W1 W2 "));
  ck_assert_ptr_nonnull(strstr(shown->out, "peak deferred weight grads (B done, W not) per rank: 1 2"));
  ck_assert_ptr_nonnull(strstr(shown->out, "bubble: 10.0% simulated (per stage: forward 1, backward 2, or B 1 and W 1); theory 10.0%"));
  /* Layouts that cannot be split are refused before anything is built. */
  /* The zero-bubble schedules: ZB-V's two chunks (its default), and no ZeRO-2/3. */
  refusal_row(&t, run("schedule", "show", "--schedule", "zb_v", "--vpp", "3", NULL), 2,
              "loom schedule show: --vpp 3: --schedule zb_v runs two chunks per rank (a V); set --vpp 2");
  refusal_row(&t, run("train", "--pp", "2", "--schedule", "zb_v", "--vpp", "1", NULL), 2,
              "loom train: --vpp 1: --schedule zb_v runs two chunks per rank (a V); set --vpp 2");
  refusal_row(&t, run("train", "--pp", "2", "--dp", "2", "--zero", "2", "--schedule", "zb_h1", NULL), 2,
              "loom train: --schedule zb_h1 with --zero 2: ZeRO-2/3 reduce-scatter each layer's grads as its backward "
              "ends, but zero-bubble schedules run a layer's weight grads long after; use --zero 0 or 1, or --schedule 1f1b");
  shown = run("schedule", "show", "--pp", "2", "--micro-batches", "4", "--schedule", "zb_v", NULL);
  ck_assert_int_eq(shown->code, 0);
  ck_assert_ptr_nonnull(strstr(shown->out, "schedule zb_v: pp 2, micro-batches 4, vpp 2: verified deadlock-free"));
  refusal_row(&t, run("train", "--hidden", "6", "--heads", "6", "--tp", "4", NULL), 2,
              "loom train: --heads 6: must be divisible by --tp (4) so each rank holds whole heads; pick a tp that divides heads");
  refusal_row(&t, run("train", "--hidden", "8", "--heads", "2", "--tp", "4", NULL), 2,
              "loom train: --heads 2: must be divisible by --tp (4) so each rank holds whole heads; pick a tp that divides heads");
  refusal_row(&t, run("train", "--ffn", "30", "--tp", "4", NULL), 2,
              "loom train: --ffn 30: must be divisible by --tp (4); pick a tp that divides ffn");
  refusal_row(&t, run("train", "--seq", "30", "--tp", "4", "--sequence-parallel", NULL), 2,
              "loom train: --seq 30: must be divisible by --tp (4) under sequence parallelism; pick seq or tp to divide");
  refusal_row(&t, run("train", "--tp", "2", NULL), 2,
              "loom train: parallel: tp 2 x pp 1 x dp 1 = 2 ranks, but the world has 1; launch 2 ranks or change the layout");
  /* Pipeline layouts: checked before anything is built. */
  refusal_row(&t, run("train", "--pp", "2", NULL), 2,
              "loom train: parallel: tp 1 x pp 2 x dp 1 = 2 ranks, but the world has 1; launch 2 ranks or change the layout");
  refusal_row(&t, run("train", "--vpp", "2", "--layers", "2", NULL), 2,
              "loom train: --vpp 2: needs --pp 2 or more; with one pipeline rank its chunks would only pass activations to themselves");
  refusal_row(&t, run("train", "--vpp", "2", "--schedule", "interleaved", NULL), 2,
              "loom train: --vpp 2: needs --pp 2 or more; with one pipeline rank its chunks would only pass activations to themselves");
  refusal_row(&t, run("train", "--layer-split", "1,2,3", NULL), 2,
              "loom train: stages: the layer split has 3 entries but there are 1 stages (--pp x --vpp); give one count per stage");
  refusal_row(&t, run("train", "--layer-split", "1", NULL), 2,
              "loom train: stages: cover layers [0, 1) but --layers 2; every layer must be covered exactly once");
  refusal_row(&t, run("train", "--dp", "2", "--global-batch", "24", "--micro-batch", "16", NULL), 2,
              "loom train: --global-batch 24: must be a positive multiple of --micro-batch x --dp (32); round it to a multiple");
  refusal_row(&t, run("train", "--layer-split", "1,x", NULL), 2,
              "loom train: --layer-split '1,x' is not a comma-separated list of layer counts");
  refusal_row(&t, run("train", "--micro-batches", "3", "--global-batch", "16", NULL), 2,
              "loom train: --global-batch 16 != --micro-batches 3 x --micro-batch 16");
  /* Plans: authored, shown, checked, refused when they do not fit the launch. */
  const char *plan = tu_tmp_path("p.txtpb");
  const result *rp = run("plan", "new", "--layers", "4", "--hidden", "32", "--heads", "4", "--seq", "32", "--tp", "2",
                         "--micro-batch", "2", "--global-batch", "8", "-o", plan, NULL);
  ck_assert_msg(rp->code == 0, "%s", rp->err);
  rp = run("plan", "show", plan, NULL);
  ck_assert_int_eq(rp->code, 0);
  ck_assert_ptr_nonnull(strstr(rp->out, "layout: tp 2 x pp 1 x dp 1 = 2 ranks"));
  ck_assert_ptr_nonnull(strstr(rp->out, "[0,4)EH"));
  /* --buffers lists the rank sheet's rows: they add up to the rank's total (each row printed to 0.001 MiB). */
  rp = run("plan", "show", plan, "--buffers", NULL);
  ck_assert_int_eq(rp->code, 0);
  const char *rank = strstr(rp->out, "  pp_rank 0 ");
  double total = -1.0, rows = 0.0, mib;
  int nrows = 0;
  ck_assert_msg(rank && sscanf(rank, "  pp_rank 0 %lf", &total) == 1, "%s", rp->out);
  for (const char *at = strchr(rank, '\n'); at && strncmp(at + 1, "    ", 4) == 0; at = strchr(at + 1, '\n')) {
    const char *eq = strstr(at + 1, " = ");
    ck_assert_msg(eq && sscanf(eq, " = %lf", &mib) == 1, "a row without its size: %.80s", at + 1);
    rows += mib, nrows++;
  }
  ck_assert_msg(nrows >= 8 && total > 0 && fabs(rows - total) <= 0.005 + 0.0005 * nrows, "%d rows sum to %g, the rank %g",
                nrows, rows, total);
  ck_assert_ptr_nonnull(strstr(rp->out, "transfers received grad"));
  rp = run("plan", "check", plan, "--world", "2", NULL);
  ck_assert_int_eq(rp->code, 0);
  /* An fp8 plan: shown as what runs in FP8 and how it is scaled, its fields in the plan text. */
  const char *fp8 = tu_tmp_path("fp8.txtpb");
  rp = run("plan", "new", "--precision", "bf16", "--fp8-format", "hybrid", "-o", fp8, NULL);
  ck_assert_msg(rp->code == 0, "%s", rp->err);
  rp = run("plan", "show", fp8, NULL);
  ck_assert_ptr_nonnull(strstr(rp->out, "fp8: the layers' linears in hybrid FP8 (E4M3 forward, E5M2 grads), delayed scaling "
                                        "(amax history 1, most_recent, margin 0)"));
  rp = run("plan", "new", "--precision", "bf16", "--fp8-format", "hybrid", "-o", "-", NULL);
  ck_assert_ptr_nonnull(strstr(rp->out, "fp8: FP8_HYBRID"));
  unlink(fp8);
  /* A plan whose sends are waited for says so; loom sim states the experts' load it assumes, in text and JSON. */
  rp = run("plan", "new", "--pp", "2", "--no-overlap-p2p-communication", "-o", "-", NULL);
  ck_assert_ptr_nonnull(strstr(rp->out, "p2p: false"));
  rp = run("sim", "--cluster", "h100-sxm", "--model", "moe-tiny", "--dp", "2", "--ep", "2", "--moe-rank-imbalance", "1.5", NULL);
  ck_assert_msg(rp->code == 0, "%s", rp->err);
  ck_assert_ptr_nonnull(strstr(rp->out, "experts          dropless, the busiest ep rank at 1.5x an even share of the rows"));
  rp = run("sim", "--cluster", "h100-sxm", "--model", "moe-tiny", "--dp", "2", "--ep", "2", "--moe-rank-imbalance", "1.5", "--json", NULL);
  ck_assert_ptr_nonnull(strstr(rp->out, "\"moe_rank_imbalance\": 1.5,"));
  rp = run("plan", "check", plan, "--world", "3", NULL);
  ck_assert_int_eq(rp->code, 1);
  ck_assert_ptr_nonnull(strstr(rp->out, "parallel: tp 2 x pp 1 x dp 1 = 2 ranks, but the world has 3; launch 2 ranks or change the layout"));
  char line[1024];
  snprintf(line, sizeof line, "loom train: %s: parallel: tp 2 x pp 1 x dp 1 = 2 ranks, but the world has 1; launch 2 ranks "
           "or change the layout (loom plan check lists every problem)", plan);
  refusal_row(&t, run("train", "--plan", plan, NULL), 2, line);
  refusal_row(&t, run("train", "--plan", plan, "--hidden", "64", NULL), 2,
              "loom train: --hidden cannot be combined with --plan: the plan fixes the model and layout");
  refusal_row(&t, run("plan", "check", "/nonexistent.txtpb", NULL), 2, "loom: /nonexistent.txtpb: cannot open plan: No such file or directory");
  refusal_row(&t, run("plan", "new", "--tp", "2", NULL), 2, "loom plan new: -o PLAN is required");
  refusal_row(&t, run("train", "--resume", NULL), 2, "loom train: --resume, --async-save, --save-every and --keep need --ckpt DIR");
  refusal_row(&t, run("train", "--keep", "2", NULL), 2, "loom train: --resume, --async-save, --save-every and --keep need --ckpt DIR");
  refusal_row(&t, run("train", "--async-save", NULL), 2,
              "loom train: --resume, --async-save, --save-every and --keep need --ckpt DIR");
  refusal_row(&t, run("train", "--watchdog-timeout", "-1", NULL), 2, "loom train: --watchdog-timeout must be in [0, 1000000], got -1");
  refusal_row(&t, run("train", "--ckpt", "/nonexistent-dir/ck", "--resume", NULL), 2,
              "loom: /nonexistent-dir/ck/latest: no checkpoint to load (No such file or directory)");
  /* --device cuda where no GPU is usable (as here): refused, exit 2, the reason given. A GPU machine trains. */
  const result *dev = run("train", "--device", "cuda", "--steps", "1", "--eval-every", "0", NULL);
  if (dev->code != 0) {
    ck_assert_int_eq(dev->code, 2);
    ck_assert_msg(strncmp(dev->err, "loom train: --device cuda: ", 27) == 0, "%s", dev->err);
  }
  refusal_row(&t, run("train", "--device", "tpu", NULL), 2, "loom train: --device must be one of auto, cpu, cuda, guarded, got 'tpu'");
  /* Too big for this machine: refused before allocating (numbers depend on the machine). */
  const result *r = run("train", "--model", "gpt2-small", "--micro-batch", "1024", NULL);
  ck_assert_int_eq(r->code, 2);
  ck_assert_msg(strncmp(r->err, "loom train: --micro-batch 1024: this run needs ", 47) == 0, "%s", r->err);
  ck_assert_ptr_nonnull(strstr(r->err, ": activations for seq 1024 "));
  ck_assert_ptr_nonnull(strstr(r->err, " GiB is available; lower --micro-batch or --seq\n"));
  /* When the model's state is what does not fit, the advice is about the layout, not the batch. */
  r = run("train", "--model", "gpt-175b", "--micro-batch", "1", "--seq", "8", NULL); /* 2.5 TiB of state */
  ck_assert_int_eq(r->code, 2);
  ck_assert_msg(strncmp(r->err, "loom train: --tp 1: this run needs ", 35) == 0 &&
                strstr(r->err, "the model's state dominates: spread it over more ranks (tp or pp)"), "%s", r->err);
  r = run("train", "--help", NULL);
  ck_assert_int_eq(r->code, 0);
  ck_assert_ptr_nonnull(strstr(r->out, "--micro-batch N"));
  tu_rows_done(&t);
}
END_TEST

/* Counts lines of a file that contain every given key. */
/* `loom train FLAGS --print-plan` is byte for byte `loom plan new FLAGS -o -`:
 * the run executes the plan plan new would write. */
START_TEST(train_runs_the_plan_plan_new_writes) {
  static const char *const SETS[][12] = {
      {"--tp", "2", "--pp", "2", "--micro-batches", "4", NULL},
      {NULL},
      {"--model", "gpt50b", "--tp", "8", "--pp", "8", "--dp", "8", "--micro-batch", "1", "--global-batch", "1536"},
      {"--pp", "4", "--vpp", "2", "--schedule", "interleaved", "--layers", "8", "--micro-batches", "8", "--recompute", "full"},
      {"--dp", "4", "--zero", "1", "--sequence-parallel", "--tp", "2", "--micro-batch", "4", "--global-batch", "64", NULL},
      {"--pp", "2", "--layer-split", "3,1", "--layers", "4", "--schedule", "gpipe", "--seq", "32", "--dropout", "0.1"},
  };
  for (size_t k = 0; k < sizeof SETS / sizeof SETS[0]; k++) {
    const char *train[20] = {"train"}, *plan_new[20] = {"plan", "new"};
    int n = 0;
    for (; n < 12 && SETS[k][n]; n++) train[1 + n] = plan_new[2 + n] = SETS[k][n];
    train[1 + n] = "--print-plan", train[2 + n] = NULL;
    plan_new[2 + n] = "-o", plan_new[3 + n] = "-", plan_new[4 + n] = NULL;
    const result *a = run_argv(train);
    ck_assert_msg(a->code == 0, "set %zu: %s", k, a->err);
    char printed[sizeof a->out];
    memcpy(printed, a->out, sizeof printed);
    const result *b = run_argv(plan_new);
    ck_assert_msg(b->code == 0, "set %zu: %s", k, b->err);
    ck_assert_msg(strlen(printed) > 200 && strstr(printed, "estimates {"), "set %zu printed no plan", k); /* something to compare */
    ck_assert_msg(strcmp(printed, b->out) == 0, "set %zu: train --print-plan and plan new -o - differ", k);
  }
}
END_TEST

/* Field names read as flag names: what plan check prints, train and plan new say with flags. */
static void fields_to_flags(const char *in, char *out, size_t cap) {
  static const char *const MAP[][2] = {{"model.heads = ", "--heads "}, {"parallel.tp", "--tp"}, {"model.hidden", "--hidden"}};
  snprintf(out, cap, "%s", in);
  for (size_t k = 0; k < sizeof MAP / sizeof MAP[0]; k++) {
    char *at;
    while ((at = strstr(out, MAP[k][0]))) {
      char rest[1024];
      snprintf(rest, sizeof rest, "%s", at + strlen(MAP[k][0]));
      snprintf(at, cap - (size_t)(at - out), "%s%s", MAP[k][1], rest);
    }
  }
}

/* One bad layout, one rule, in the same words through every command. */
START_TEST(one_rule_in_every_command) {
  const result *r = run("train", "--heads", "6", "--hidden", "96", "--tp", "4", NULL);
  ck_assert_int_eq(r->code, 2);
  char from_train[1024];
  snprintf(from_train, sizeof from_train, "%s", r->err + strlen("loom train: "));
  r = run("plan", "new", "--heads", "6", "--hidden", "96", "--tp", "4", "-o", "-", NULL);
  ck_assert_int_eq(r->code, 2);
  ck_assert_str_eq(r->err + strlen("loom plan new: "), from_train);
  /* plan check reads a plan file that plan new would refuse: write a good one and break it. */
  const char *good = tu_tmp_path("rule.txtpb");
  r = run("plan", "new", "--heads", "4", "--hidden", "96", "--tp", "4", "-o", good, NULL);
  ck_assert_msg(r->code == 0, "%s", r->err);
  size_t n;
  char *text = tu_read_bytes(good, &n);
  char *heads = strstr(text, "heads: 4");
  ck_assert_ptr_nonnull(heads);
  heads[7] = '6';
  tu_write_bytes(good, text, n);
  free(text);
  r = run("plan", "check", good, NULL);
  ck_assert_int_eq(r->code, 1);
  char checked[1024], first[1024];
  ck_assert_uint_lt(strlen(r->out), sizeof first);
  memcpy(first, r->out, strlen(r->out) + 1);
  fields_to_flags(first, checked, sizeof checked);
  ck_assert_str_eq(checked, from_train);
  ck_assert_ptr_nonnull(strstr(from_train, "--heads 6: must be divisible by --tp (4)"));
}
END_TEST

static int lines_with(const char *path, const char *key1, const char *key2) {
  char buf[65536];
  slurp(path, buf, sizeof buf);
  int n = 0;
  for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) n += strstr(line, key1) && strstr(line, key2);
  return n;
}

START_TEST(subcommands_work_together) {
  const char *txt = tu_tmp_path("corpus.txt"), *tokens = tu_tmp_path("corpus.bin");
  char corpus[4000];
  for (int i = 0; i < 3999; i++) corpus[i] = "the quick brown fox jumps over the lazy dog. "[i % 45];
  tu_write_bytes(txt, corpus, 3999);
  result *r = run("data", "prepare", txt, "-o", tokens, NULL);
  ck_assert_msg(r->code == 0, "%s", r->err);
  /* A tokenizer file sizing tables past any real vocabulary is refused before it allocates them. */
  const char *ranks = tu_tmp_path("gpt2.tiktoken");
  tu_write_bytes(ranks, "QQ== 434444444\n", 15);
  char want[1200];
  snprintf(want, sizeof want, "loom: %s: line 1: the rank is not an integer in [0, 16777216)", ranks);
  expect_fail(run("data", "encode", "--tokenizer", ranks, txt, NULL), 2, want);

  /* Train on the synthetic task with metrics, eval and save. */
  const char *metrics = tu_tmp_path("m.jsonl"), *model = tu_tmp_path("model.bin");
  r = run("train", TINY[0], TINY[1], TINY[2], TINY[3], TINY[4], TINY[5], TINY[6], TINY[7], TINY[8], TINY[9],
          "--steps", "3", "--eval-every", "2", "--metrics", metrics, "--save", model, NULL);
  ck_assert_msg(r->code == 0, "%s", r->err);
  ck_assert_ptr_nonnull(strstr(r->out, "step     3/3 | loss"));
  ck_assert_msg(strstr(r->out, " tok/s/dev | ") && strstr(r->out, " TFLOP/s/dev | MFU ") && strstr(r->out, " | skipped 0\n"),
                "%s", r->out);
  ck_assert_ptr_nonnull(strstr(r->out, "MFU: the share of the job's dense peak"));
  ck_assert_int_eq(lines_with(metrics, "\"step\"", "\"loss\""), 3);
  ck_assert_int_eq(lines_with(metrics, "\"tflops_per_device\"", "\"max_allocated_bytes\""), 3);
  ck_assert_int_eq(lines_with(metrics, "\"mfu\"", "\"skipped_iterations\": 0"), 3);
  ck_assert_int_eq(lines_with(metrics, "\"tokens_per_s\"", "\"grad_norm\""), 3);
  ck_assert_int_eq(lines_with(metrics, "\"eval_loss\"", "\"eval_accuracy\""), 2);

  /* Train on the token file, starting from the saved model. */
  r = run("train", "--init-from", model, "--data", tokens, "--data-order", "shuffled", "--micro-batch", "2",
          "--steps", "2", "--eval-every", "0", NULL);
  ck_assert_msg(r->code == 0, "%s", r->err);
  expect_fail(run("train", "--init-from", model, "--layers", "3", NULL), 2,
              "loom train: --layers cannot be combined with --init-from: the model file fixes the model");

  r = run("eval", "--init-from", model, "--data", tokens, "--micro-batch", "2", "--seq", "16", "--batches", "3", NULL);
  ck_assert_msg(r->code == 0, "%s", r->err);
  ck_assert_ptr_nonnull(strstr(r->out, "eval: mean loss "));
  char line[512];
  snprintf(line, sizeof line, "loom eval: --batches 1000 x --micro-batch 2 needs 2000 windows of seq+1 tokens; %s has 249", tokens);
  expect_fail(run("eval", "--init-from", model, "--data", tokens, "--micro-batch", "2", "--seq", "16", "--batches", "1000", NULL), 2, line);
  expect_fail(run("eval", "--init-from", model, "--data", tokens, "--seq", "17", NULL), 2,
              "loom eval: --seq 17 exceeds the model's maximum sequence length 16");

  r = run("sample", "--init-from", model, "--prompt", "12+34=", "--max-tokens", "5", NULL);
  ck_assert_msg(r->code == 0, "%s", r->err);
  ck_assert_int_eq(strncmp(r->out, "12+34=", 6), 0);
  expect_fail(run("sample", "--init-from", model, "--prompt", "1", "--tp", "2", NULL), 2,
              "loom sample: generation runs on one rank; drop --tp, --pp, --dp and --cp");
  /* Resuming at or past --steps says there is nothing to train, and exits 0. */
  const char *ck = tu_tmp_path("nothing");
  r = run("train", "--layers", "1", "--hidden", "16", "--heads", "2", "--seq", "16", "--steps", "2", "--ckpt", ck, "--eval-every", "0", NULL);
  ck_assert_msg(r->code == 0, "%s", r->err);
  r = run("train", "--layers", "1", "--hidden", "16", "--heads", "2", "--seq", "16", "--steps", "2", "--ckpt", ck, "--resume",
          "--eval-every", "0", NULL);
  ck_assert_msg(r->code == 0 && strstr(r->out, "nothing to train: the checkpoint is at step 2 and --steps is 2"), "%s%s", r->out,
                r->err);
  /* A step directory given where the checkpoint is expected says so. */
  char step_dir[4200], line2[4400];
  loom_ckpt_step_dir(ck, 2, step_dir, sizeof step_dir);
  snprintf(line2, sizeof line2, "loom: %s: is one step of a checkpoint; give the checkpoint directory that holds it and its latest",
           step_dir);
  expect_fail(run("ckpt", "verify", step_dir, NULL), 2, line2);
  /* Resharding onto a plan of another model names both models, and writes nothing. */
  const char *other = tu_tmp_path("other.txtpb"), *out = tu_tmp_path("resharded");
  r = run("plan", "new", "--layers", "4", "--hidden", "32", "--heads", "2", "--seq", "16", "--pp", "2", "-o", other, NULL);
  ck_assert_msg(r->code == 0, "%s", r->err);
  snprintf(line2, sizeof line2, "loom: %s/step_00000002: checkpoint of another model (layers 1, hidden 16, heads 2, kv heads 2, "
           "ffn 64, vocab 256, seq 16, layernorm, gelu, learned positions, biases, tied); the plan %s has layers 4, hidden 32, "
           "heads 2, kv heads 2, ffn 128, vocab 256, seq 16, layernorm, gelu, learned positions, biases, tied", ck, other);
  expect_fail(run("ckpt", "reshard", ck, "--plan", other, "-o", out, NULL), 2, line2);
  ck_assert_int_ne(access(out, F_OK), 0);
  loom_ckpt_remove(ck);
  /* A directory where a model file is expected is named as such. */
  const char *adir = tu_tmp_path("a_directory");
  ck_assert_int_eq(mkdir(adir, 0755), 0);
  snprintf(line2, sizeof line2, "loom: %s: is a directory without config.json: neither a Hugging Face model nor an llm.c file",
           adir);
  expect_fail(run("sample", "--init-from", adir, "--prompt", "x", NULL), 2, line2);
  rmdir(adir);
  /* A checkpoint directory that cannot be written is refused before step 1. */
  r = run("train", "--ckpt", tokens, "--steps", "2", "--eval-every", "0", NULL);
  ck_assert_int_eq(r->code, 2);
  ck_assert_msg(strstr(r->err, "cannot write there") && strstr(r->err, tokens) && !strstr(r->out, "step "), "%s", r->err);

  /* A model file that is not one is refused with the file's name. */
  snprintf(line, sizeof line, "loom: %s: bad magic 20240520 in model header (expected 20240326, llm.c's GPT-2 format)", tokens);
  expect_fail(run("sample", "--init-from", tokens, "--prompt", "x", NULL), 2, line);

  /* A model holding a NaN or an infinity is refused as it loads, naming the
   * tensor and element, by every command that loads one (not blamed on the
   * learning rate at step 1, nor evaluated as "mean loss nan"). */
  size_t n;
  char *bytes = tu_read_bytes(model, &n);
  float *weights = (float *)(bytes + 1024);
  const float last = weights[(n - 1024) / 4 - 1];
  weights[(n - 1024) / 4 - 1] = NAN; /* the last element of the last tensor, ln_f's bias */
  const char *poisoned = tu_tmp_path("nan.bin");
  tu_write_bytes(poisoned, bytes, n);
  snprintf(line, sizeof line, "loom: %s: tensor ln_f.bias holds a NaN at element %d; a model with non-finite weights cannot "
           "be trained or evaluated", poisoned, 15);
  expect_fail(run("train", "--init-from", poisoned, "--micro-batch", "2", "--steps", "3", "--eval-every", "0", NULL), 2, line);
  weights[(n - 1024) / 4 - 1] = last;
  weights[0] = -INFINITY;
  tu_write_bytes(poisoned, bytes, n);
  free(bytes);
  snprintf(line, sizeof line, "loom: %s: tensor wte.weight holds an infinity at element 0; a model with non-finite weights "
           "cannot be trained or evaluated", poisoned);
  expect_fail(run("sample", "--init-from", poisoned, "--prompt", "1+1=", NULL), 2, line);
  expect_fail(run("eval", "--init-from", poisoned, "--data", tokens, NULL), 2, line);

  const char *exported = tu_tmp_path("exported.bin");
  r = run("ckpt", "export", "--format", "llmc", "-o", exported, TINY[0], TINY[1], TINY[2], TINY[3], TINY[4], TINY[5], NULL);
  ck_assert_msg(r->code == 0, "%s", r->err);
  r = run("train", "--init-from", exported, "--micro-batch", "2", "--steps", "1", "--eval-every", "0", NULL);
  ck_assert_msg(r->code == 0, "%s", r->err);
}
END_TEST

/* Copies dir's file `name` into the directory `to` with the first `from` replaced by `with`. */
static void copy_edited(const char *dir, const char *to, const char *name, const char *from, const char *with) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  size_t n;
  char *data = tu_read_bytes(path, &n);
  char *at = from ? memmem(data, n, from, strlen(from)) : NULL;
  ck_assert_msg(!from || at, "no %s in %s", from, path);
  const size_t cut = at ? (size_t)(at - data) : n, skip = at ? strlen(from) : 0, add = at ? strlen(with) : 0;
  char *out = malloc(n - skip + add + 1);
  memcpy(out, data, cut);
  if (add) memcpy(out + cut, with, add);
  memcpy(out + cut + add, data + cut + skip, n - cut - skip);
  mkdir(to, 0755);
  snprintf(path, sizeof path, "%s/%s", to, name);
  tu_write_bytes(path, out, n - skip + add);
  free(out);
  free(data);
}

/* A Hugging Face directory with one thing wrong: config.json edited (file
 * "config.json") or the safetensors header (same length, so the data stays put). */
static void expect_hf_refused(const char *good, const char *file, const char *from, const char *with, const char *why) {
  char bad[512]; /* tu_tmp_path's buffers are reused */
  snprintf(bad, sizeof bad, "%s", tu_tmp_path("hf_bad"));
  const bool config = strcmp(file, "config.json") == 0;
  copy_edited(good, bad, "config.json", config ? from : NULL, with);
  copy_edited(good, bad, "model.safetensors", config ? NULL : from, with);
  char line[2400];
  snprintf(line, sizeof line, "loom: %s/%s: %s", bad, file, why);
  expect_fail(run("ckpt", "export", "--init-from", bad, "--format", "hf", "-o", tu_tmp_path("hf_out"), NULL), 2, line);
  ck_assert_int_ne(access(tu_tmp_path("hf_out"), F_OK), 0);
  expect_fail(run("train", "--init-from", bad, "--steps", "1", "--eval-every", "0", NULL), 2, line);
}

/* `--init-from DIR` reads a Hugging Face directory, and every mismatch in
 * it is one line naming the file and what is wrong, before anything runs. */
START_TEST(sim_and_search_refuse_bad_input) {
  expect_fail(run("sim", "--model", "gpt-tiny", NULL), 2, "loom sim: --cluster is required (built in: a100-80gb, h100-sxm, h200)");
  expect_fail(run("sim", "--cluster", "tpu-v9", NULL), 2,
              "loom: --cluster tpu-v9: not a built-in profile (a100-80gb, h100-sxm, h200) nor a profile file");
  expect_fail(run("sim", "--cluster", "/nonexistent/p.txtpb", NULL), 2,
              "loom: /nonexistent/p.txtpb: cannot open cluster profile: No such file or directory");
  const char *bad = tu_tmp_path("bad_profile.txtpb");
  const char text[] = "name: \"x\"\ndevice { peak_tflops_bf16: -5 }\n";
  tu_write_bytes(bad, text, sizeof text - 1);
  expect_fail_with(run("sim", "--cluster", bad, NULL), 2, "device.peak_tflops_bf16 = -5 must be >= 1e-06");
  unlink(bad);
  expect_fail(run("sim", "--cluster", "a100-80gb", "--plan", "x.txtpb", "--tp", "2", NULL), 2,
              "loom sim: --tp cannot be combined with --plan: the plan fixes the model and layout");
  expect_fail(run("sim", "--cluster", "a100-80gb", "--flops", "palm", NULL), 2,
              "loom sim: --flops must be one of megatron, sc21, nemo, got 'palm'");
  expect_fail(run("sim", "--cluster", "a100-80gb", "--precision", "bf16", "--fp8-format", "hybrid", NULL), 2,
              "loom sim: --fp8-format: the profile a100-80gb prices no fp8 GEMMs (device.peak_tflops_fp8 and a PRECISION_FP8 "
              "gemm entry); drop --fp8-format or use a profile that gives them");
  expect_fail(run("sim", "--cluster", "a100-80gb", "--moe-rank-imbalance", "2", NULL), 2,
              "loom sim: --moe-rank-imbalance 2: the plan's model has no experts");
  expect_fail(run("sim", "--cluster", "a100-80gb", "--model", "moe-tiny", "--dp", "2", "--ep", "2", "--moe-rank-imbalance", "3", NULL), 2,
              "loom sim: --moe-rank-imbalance 3: the busiest of ep 2 ranks takes at most 2 times an even share of the rows "
              "(every row of its group)");
  expect_fail(run("sim", "--cluster", "a100-80gb", "--model", "moe-tiny", "--moe-expert-capacity-factor", "1.5",
                  "--moe-rank-imbalance", "1.5", NULL), 2,
              "loom sim: --moe-rank-imbalance 1.5: the plan's capacity factor 1.5 already costs each expert at its capacity; "
              "drop one of them");
  expect_fail_with(run("sim", "--cluster", "a100-80gb", "--model", "moe-tiny", "--moe-rank-imbalance", "0.5", NULL), 2,
                   "--moe-rank-imbalance");
  /* Goodput needs the profile's reliability figures: the A100 profile states none. */
  expect_fail(run("sim", "--cluster", "a100-80gb", "--goodput", NULL), 2,
              "loom sim: a100-80gb: reliability.mtbf_node_hours (or --mtbf-hours) is missing; goodput (--mtbf-hours) needs it "
              "(docs/launching.md)");
  expect_fail(run("sim", "--cluster", "a100-80gb", "--mtbf-hours", "5000", NULL), 2,
              "loom sim: a100-80gb: reliability.relaunch_s is missing; goodput (--mtbf-hours) needs it (docs/launching.md)");
  expect_fail_with(run("sim", "--cluster", "h100-sxm", "--mtbf-hours", "0", NULL), 2, "--mtbf-hours");
  expect_fail(run("plan", "search", "--gpus", "8", "--cluster", "a100-80gb", "--global-batch", "64", "--moe-rank-imbalance",
                  "1.5", NULL), 2, "loom plan search: --moe-rank-imbalance 1.5: the plan's model has no experts");
  expect_fail_with(run("sim", "--cluster", "a100-80gb", "--hidden", "100", "--heads", "3", NULL), 2, "--hidden 100: must be divisible by --heads (3)");
  expect_fail(run("sim", "--cluster", "a100-80gb", "--svg", "x.svg", NULL), 2, "loom sim: --svg draws a --sweep-gpus curve; give both");
  expect_fail(run("sim", "--cluster", "a100-80gb", "--sweep-gpus", "64,32", NULL), 2,
              "loom sim: --sweep-gpus '64,32': expected up to 64 rising GPU counts like 64,128,256");
  expect_fail(run("sim", "--cluster", "a100-80gb", "--tp", "2", "--heads", "4", "--sweep-gpus", "2,3", NULL), 2,
              "loom sim: --sweep-gpus 3 is not whole tp 2 x cp 1 x pp 1 groups");
  expect_fail(run("sim", "calibrate", NULL), 2, "loom sim calibrate: -o PROFILE.txtpb is required");
  const char *cal = tu_tmp_path("cal.txtpb");
  expect_fail(run("sim", "calibrate", "-o", cal, NULL), 2,
              "loom sim calibrate: one rank measures no link; launch 2 or more ranks with mpirun, or give "
              "--links-from PROFILE for a one-rank device");
  ck_assert_int_ne(access(cal, F_OK), 0); /* nothing written */
  /* --device cuda without a GPU: refused with the reason (on the emulated GPU of a sanitized build, one rank is refused
   * for its links instead); a device it cannot measure, refused by name. */
  const result *gpu = run("sim", "calibrate", "-o", cal, "--device", "cuda", NULL);
  ck_assert_int_eq(gpu->code, 2);
  ck_assert_msg(strncmp(gpu->err, "loom sim calibrate: --device cuda: ", 35) == 0 || strstr(gpu->err, "one rank measures no link"),
                "%s", gpu->err);
  expect_fail(run("sim", "calibrate", "-o", cal, "--device", "guarded", NULL), 2,
              "loom sim calibrate: --device guarded: it measures cpu or cuda");
  expect_fail(run("sim", "calibrate", "-o", cal, "--max-mb", "0.1", NULL), 2,
              "loom sim calibrate: --max-mb 0.1: at least 0.25 (two message sizes, 64 and 256 KiB), or 0 for the device's default");
  expect_fail(run("sim", "calibrate", "-o", cal, "--gemm-dims", "64,32", NULL), 2,
              "loom sim calibrate: --gemm-dims 64,32: expected 1 to 6 rising sizes from 1 to 65536, like 64,256,1024");
  ck_assert_int_ne(access(cal, F_OK), 0);
  /* loom sim profile: each fitted curve beside the measurements it was fitted to, with their sources. */
  const result *prof = run("sim", "profile", "--cluster", "h100-sxm", NULL);
  ck_assert_msg(prof->code == 0, "%s", prof->err);
  ck_assert_msg(strstr(prof->out, "gemm PRECISION_BF16: ") && strstr(prof->out, "fitted to 10 measurements") &&
                    strstr(prof->out, "torch-perf#79") && strstr(prof->out, "COLLECTIVE_ALL_GATHER: 370 GB/s"),
                "%s", prof->out);
  expect_fail(run("sim", "profile", NULL), 2, "loom sim profile: --cluster is required (built in: a100-80gb, h100-sxm, h200)");
  expect_fail(run("plan", "search", "--gpus", "8", "--cluster", "a100-80gb", "--global-batch", "64", "--tp", "2", NULL), 2,
              "loom plan search: --tp is what the search chooses; leave it out");
  expect_fail(run("plan", "search", "--cluster", "a100-80gb", "--global-batch", "64", NULL), 2,
              "loom plan search: --gpus, --cluster and --global-batch are required");
  expect_fail(run("plan", "search", "--gpus", "0", "--cluster", "a100-80gb", "--global-batch", "64", NULL), 2,
              "loom plan search: --gpus must be in [1, 1048576], got 0");
  /* Ranked by tokens/s kept under a failure rate: a goodput column, the kept tokens/s never rising down the table. */
  const result *kept = run("plan", "search", "--gpus", "8", "--cluster", "h100-sxm", "--global-batch", "64", "--mtbf-hours",
                           "2", "--top", "6", NULL);
  ck_assert_msg(kept->code == 0 && strstr(kept->out, "  goodput     kept/s\n"), "%s%s", kept->out, kept->err);
  double last = INFINITY;
  int rows = 0;
  for (const char *line = strstr(kept->out, "kept/s\n"); line && (line = strchr(line, '\n')) && line[1] == ' '; line++) {
    const char *eol = strchr(line + 1, '\n'), *pct = NULL;
    for (const char *c = line + 1; c < eol; c++)
      if (*c == '%') pct = c; /* the last % on the row: the goodput's */
    if (!pct || !strchr(" 0123456789", line[5])) break;
    const double g = strtod(pct - 7, NULL), value = strtod(pct + 1, NULL);
    ck_assert_msg(g > 0 && g <= 100 && value <= last * (1 + 1e-9), "row %d: goodput %g%%, kept %g after %g", rows, g, value, last);
    last = value, rows++;
  }
  ck_assert_int_ge(rows, 2);
  /* A model too big for any layout of one GPU: a clear refusal, not an empty table. */
  expect_fail_with(run("plan", "search", "--model", "gpt-175b", "--gpus", "1", "--cluster", "a100-80gb", "--global-batch", "8", NULL),
                   1, "no layout fits: the leanest layout of every grid of 1 GPUs needs at least 2615.1 GiB of the device's "
                   "80.0 GiB; add GPUs, or use a smaller model, batch or sequence");
}
END_TEST

/* The value an alias's test gives a flag of this kind (a choice where it has them). */
static const char *sample_value(const loom_flag *f) {
  if (f->choices) return f->choices[1] ? f->choices[1] : f->choices[0];
  return f->kind == FLAG_STRING ? "some/path" : f->kind == FLAG_FLOAT ? "2.5" : "2";
}

/* Every Megatron-LM alias sets the loom flag it names to what loom's own
 * name would (table-driven over LOOM_MEGATRON_ALIASES, on loom train's
 * table); a switch of Megatron's takes no value; Megatron's flags loom does
 * not implement are refused by name, never ignored. */
START_TEST(megatron_flag_names) {
  /* What each Megatron-LM flag means in loom, written here from Megatron-LM's arguments.py. */
  static const loom_megatron_alias WANT[] = {
      {"--tensor-model-parallel-size", "--tp", NULL}, {"--pipeline-model-parallel-size", "--pp", NULL},
      {"--num-layers-per-virtual-pipeline-stage", "--layers-per-virtual-stage", NULL},
      {"--micro-batch-size", "--micro-batch", NULL}, {"--global-batch-size", "--global-batch", NULL},
      {"--seq-length", "--seq", NULL}, {"--num-layers", "--layers", NULL}, {"--hidden-size", "--hidden", NULL},
      {"--num-attention-heads", "--heads", NULL}, {"--num-query-groups", "--kv-heads", NULL},
      {"--ffn-hidden-size", "--ffn", NULL}, {"--rotary-base", "--rope-theta", NULL}, {"--train-iters", "--steps", NULL},
      {"--lr-warmup-iters", "--warmup", NULL}, {"--clip-grad", "--grad-clip", NULL}, {"--save-interval", "--save-every", NULL},
      {"--eval-interval", "--eval-every", NULL}, {"--eval-iters", "--eval-batches", NULL},
      {"--log-interval", "--log-every", NULL}, {"--data-path", "--data", NULL},
      {"--recompute-granularity", "--recompute", NULL}, {"--use-distributed-optimizer", "--zero", "1"},
      {"--bf16", "--precision", "bf16"}, {"--swiglu", "--mlp", "swiglu"},
      {"--untie-embeddings-and-output-weights", "--untied", ""}, {"--disable-bias-linear", "--no-bias", ""},
      {"--add-qkv-bias", "--qkv-bias", ""}, {"--expert-model-parallel-size", "--ep", NULL},
      {"--expert-tensor-parallel-size", "--etp", NULL}, {"--context-parallel-size", "--cp", NULL}, {"--group-query-attention", NULL, NULL}, {"--moe-grouped-gemm", NULL, NULL}, {"--use-flash-attn", NULL, NULL}, {"--use-mcore-models", NULL, NULL},
      {"--log-throughput", NULL, NULL}, {"--log-timers-to-tensorboard", NULL, NULL},
      {"--log-memory-to-tensorboard", NULL, NULL},
  };
  const int nwant = (int)(sizeof WANT / sizeof WANT[0]);
  int in_table = 0;
  for (const loom_megatron_alias *a = LOOM_MEGATRON_ALIASES; a->megatron; a++) in_table++;
  ck_assert_int_eq(in_table, nwant);
  int checked = 0;
  for (int w = 0; w < nwant; w++) {
    const loom_megatron_alias *a = loom_megatron_alias_of(WANT[w].megatron, strlen(WANT[w].megatron));
    ck_assert_msg(a != NULL, "%s is not taken", WANT[w].megatron);
    ck_assert_msg(!a->loom == !WANT[w].loom && (!a->loom || strcmp(a->loom, WANT[w].loom) == 0), "%s sets %s, not %s",
                  a->megatron, a->loom ? a->loom : "nothing", WANT[w].loom ? WANT[w].loom : "nothing");
    ck_assert_msg(!a->value == !WANT[w].value && (!a->value || strcmp(a->value, WANT[w].value) == 0), "%s's value", a->megatron);
    ck_assert(loom_megatron_flag(a->megatron, strlen(a->megatron))); /* a name Megatron-LM has */
    loom_train_flags mine = loom_train_flags_defaults(), theirs = loom_train_flags_defaults();
    loom_flag tm[LOOM_TRAIN_FLAG_COUNT], tt[LOOM_TRAIN_FLAG_COUNT];
    loom_train_flags_table(&mine, tm);
    loom_train_flags_table(&theirs, tt);
    loom_error err = {0};
    bool help;
    const char *pos[1];
    int npos;
    if (!a->loom) { /* a switch that says what loom does anyway: taken, nothing set */
      char *argv[] = {(char *)a->megatron};
      ck_assert_msg(loom_flags_parse("t", tt, LOOM_TRAIN_FLAG_COUNT, 1, argv, pos, 0, &npos, &help, &err) == LOOM_OK, "%s",
                    err.msg);
      for (int k = 0; k < LOOM_TRAIN_FLAG_COUNT; k++) ck_assert(!tt[k].set);
      continue;
    }
    const loom_flag *f = loom_flags_find(tm, LOOM_TRAIN_FLAG_COUNT, a->loom);
    ck_assert_msg(f != NULL, "%s names %s, which loom train does not have", a->megatron, a->loom);
    const char *value = a->value ? a->value : sample_value(f);
    char *loom_argv[] = {(char *)a->loom, (char *)value}, *megatron_argv[] = {(char *)a->megatron, (char *)value};
    const int loom_argc = f->kind == FLAG_BOOL ? 1 : 2, megatron_argc = a->value ? 1 : 2;
    ck_assert_msg(loom_flags_parse("t", tm, LOOM_TRAIN_FLAG_COUNT, loom_argc, loom_argv, pos, 0, &npos, &help, &err) == LOOM_OK,
                  "%s %s: %s", a->loom, value, err.msg);
    ck_assert_msg(loom_flags_parse("t", tt, LOOM_TRAIN_FLAG_COUNT, megatron_argc, megatron_argv, pos, 0, &npos, &help, &err) ==
                      LOOM_OK, "%s: %s", a->megatron, err.msg);
    ck_assert_msg(memcmp(&mine, &theirs, sizeof mine) == 0, "%s does not set what %s %s sets", a->megatron, a->loom, value);
    const loom_flag *g = loom_flags_find(tt, LOOM_TRAIN_FLAG_COUNT, a->loom);
    ck_assert_msg(g->set, "%s leaves %s unset", a->megatron, a->loom);
    checked++;
  }
  ck_assert_int_ge(checked, 20);
  /* Through the program: the same run either way, a Megatron switch given a value, a flag loom lacks, help. */
  expect_fail(run("train", "--bf16=yes", NULL), 2, "loom train: --bf16 takes no value");
  expect_fail(run("train", "--fp16", NULL), 2,
              "loom train: --fp16 is Megatron-LM's flag, which loom does not implement (see loom train --help for the "
              "Megatron-LM names it takes)");
  expect_fail(run("train", "--tp", "2", "--tensor-model-parallel-size", "2", NULL), 2, "loom train: --tp given more than once");
  expect_fail(run("train", "--made-up-flag", NULL), 2, "loom train: unknown flag --made-up-flag (see loom train --help)");
  result *h = run("train", "--help", NULL);
  ck_assert_ptr_nonnull(strstr(h->out, "--tp N"));
  ck_assert_ptr_nonnull(strstr(h->out, "[Megatron-LM: --tensor-model-parallel-size]"));
  ck_assert_ptr_nonnull(strstr(h->out, "[Megatron-LM: --bf16, for bf16]"));
  /* Megatron's interleaving by layers per chunk: 4 layers, pp 2, 1 a chunk -> vpp 2, interleaved. */
  char plan[1024], text[4096] = "";
  snprintf(plan, sizeof plan, "%s", tu_tmp_path("megatron.txtpb"));
  result *p = run("plan", "new", "--num-layers", "4", "--pipeline-model-parallel-size", "2",
                  "--num-layers-per-virtual-pipeline-stage", "1", "--micro-batches", "2", "-o", plan, NULL);
  ck_assert_msg(p->code == 0, "%s", p->err);
  slurp(plan, text, sizeof text);
  ck_assert_msg(strstr(text, "SCHEDULE_INTERLEAVED") && strstr(text, "virtual_chunks: 2"), "%s", text);
  expect_fail(run("plan", "new", "--num-layers", "4", "--pp", "2", "--vpp", "2", "--layers-per-virtual-stage", "1", "-o", plan,
                  NULL), 2, "loom plan new: --layers-per-virtual-stage sets --vpp; give one of them");
  expect_fail(run("plan", "new", "--num-layers", "4", "--pp", "2", "--num-layers-per-virtual-pipeline-stage", "3", "-o", plan,
                  NULL), 2,
              "loom plan new: --layers-per-virtual-stage 3: the 4 layers do not split into 2 stages of chunks of 3 layers "
              "each");
}
END_TEST

/* WSD's flags make sense together, and a checkpoint resumes only under the schedule it was trained with. */
START_TEST(wsd_flags_and_resume) {
  expect_fail(run("train", "--lr-decay-style", "WSD", NULL), 2,
              "loom train: --lr-decay-style WSD needs --lr-wsd-decay-iters, the steps that anneal");
  expect_fail(run("train", "--lr-wsd-decay-iters", "5", NULL), 2,
              "loom train: --lr-wsd-decay-iters and --lr-wsd-decay-style shape WSD's annealing; add --lr-decay-style WSD");
  expect_fail(run("train", "--steps", "10", "--warmup", "4", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "7", NULL), 2,
              "loom train: --warmup 4 + --lr-wsd-decay-iters 7 exceed --steps 10: WSD's warmup and annealing must fit in the "
              "run");
  char ckpt[1024];
  snprintf(ckpt, sizeof ckpt, "%s", tu_tmp_path("wsd_ckpt"));
  result *r = run("train", "--steps", "4", "--warmup", "1", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "2",
                  "--lr-wsd-decay-style", "cosine", "--eval-every", "0", "--ckpt", ckpt, "--save-every", "2", NULL);
  ck_assert_msg(r->code == 0, "%s", r->err);
  expect_fail_with(run("train", "--steps", "6", "--warmup", "1", "--eval-every", "0", "--ckpt", ckpt, "--resume", NULL), 2,
                   "trained with --lr-decay-style WSD and cosine; resume with the same schedule");
  r = run("train", "--steps", "6", "--warmup", "1", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "2",
          "--lr-wsd-decay-style", "cosine", "--eval-every", "0", "--ckpt", ckpt, "--resume", NULL);
  ck_assert_msg(r->code == 0, "%s", r->err);
}
END_TEST

START_TEST(hf_directories_refuse_bad_input) {
  char good[1024];
  snprintf(good, sizeof good, "%s", tu_tmp_path("hf_good"));
  /* The shard size: a size, and only for a directory. */
  expect_fail(run("ckpt", "export", "--model", "llama-tiny", "--format", "hf", "-o", good, "--max-shard-size", "5XB", NULL), 2,
              "loom ckpt export: --max-shard-size '5XB' is not a size like 5GB or 500MB");
  expect_fail(run("ckpt", "export", "--model", "llama-tiny", "--format", "llmc", "-o", tu_tmp_path("one.bin"),
                  "--max-shard-size", "5GB", NULL), 2,
              "loom ckpt export: --max-shard-size shards a Hugging Face directory; --format llmc writes one file");
  result *r = run("ckpt", "export", "--model", "llama-tiny", "--layers", "1", "--format", "hf", "-o", good, NULL);
  ck_assert_msg(r->code == 0, "%s", r->err);
  static const struct {
    const char *file, *from, *with, *why;
  } CASES[] = {
      {"config.json", "LlamaForCausalLM", "GemmaForCausalLM",
       "unknown architecture \"GemmaForCausalLM\": loom reads GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, "
       "Qwen2ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, "
       "GptOssForCausalLM and DeepseekV3ForCausalLM"},
      {"config.json", "[\"LlamaForCausalLM\"]", "[\"Qwen2ForCausalLM\"]",
       "field \"attention_bias\" is not Qwen2's: its q, k and v projections always have biases and its other linears never "
       "(transformers' Qwen2 reads no such field)"},
      {"config.json", "[\"LlamaForCausalLM\"]", "[\"MistralForCausalLM\"], \"sliding_window\": 1",
       "field \"sliding_window\" is 1: a query would see its own key alone; loom's windows reach at least one key back"},
      {"config.json", "\"vocab_size\"", "\"sliding_window\": 4096, \"vocab_size\"",
       "field \"sliding_window\" is unknown to loom; remove it if it does not change the model"},
      {"config.json", "\"hidden_size\"", "\"hidden_sizes\"",
       "field \"hidden_sizes\" is unknown to loom; remove it if it does not change the model"},
      {"config.json", "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3",
       "model.kv_heads = 3: must divide model.heads (4), each key/value head serving a group of query heads"},
      {"config.json", "\"num_hidden_layers\": 1", "\"num_hidden_layers\": 1.5",
       "field \"num_hidden_layers\" must be an integer from 1 to 4096"},
      {"config.json", "\"rope_scaling\": null", "\"rope_scaling\": {\"factor\": 8}",
       "field \"rope_scaling\" must name its rope_type"},
      {"config.json", "\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 8}",
       "rope_scaling's rope_type \"longrope\": loom computes Llama 3.1's \"llama3\" and \"yarn\" scaling only (not linear, "
       "dynamic, longrope or su)"},
      {"config.json", "\"rope_scaling\": null",
       "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 8, \"original_max_position_embeddings\": 16}",
       "rope_scaling: field \"factor\" must be max_position_embeddings / original_max_position_embeddings, which "
       "transformers takes in its place"},
      {"config.json", "\"rope_scaling\": null",
       "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 4}",
       "rope_scaling: field \"original_max_position_embeddings\" is missing"},
      {"config.json", "\"rope_scaling\": null",
       "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, \"high_freq_factor\": 1, "
       "\"original_max_position_embeddings\": 8192}",
       "model.rope_scaling: low_freq_factor 4 and high_freq_factor 1 must be finite with 0 < low < high (Llama 3.1's: 1 "
       "and 4)"},
      {"config.json", "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"",
       "field \"hidden_act\" must be \"silu\" (loom computes no other)"},
      {"config.json", "\"vocab_size\": 256,", "\"vocab_size\": 256", "bad JSON at byte 90: expected ',' or '}'"},
      {"model.safetensors", "\"model.norm.weight\"", "\"model.norx.weight\"", "missing tensor model.norm.weight"},
      {"config.json", "\"attention_dropout\": 0.0", "\"attention_dropout\": 0.5",
       "field \"attention_dropout\" must be 0: it drops attention probabilities alone, and loom's dropout also drops the "
       "embeddings and residual branches; remove it and train with --dropout"},
      {"config.json", "\"rope_scaling\": null",
       "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 1e300, \"low_freq_factor\": 1, \"high_freq_factor\": 4, "
       "\"original_max_position_embeddings\": 8192}",
       "rope_scaling: field \"factor\" is 1e+300, outside [1.17549e-38, 3.40282e+38], the range of loom's float32"},
      {"config.json", "\"attention_dropout\": 0.0", "\"attention_dropout\": 1.5",
       "field \"attention_dropout\" must be a dropout probability in [0, 1) (loom trains with --dropout)"},
      {"model.safetensors", "\"dtype\":\"F32\"", "\"dtype\":\"I32\"",
       "tensor model.embed_tokens.weight has dtype I32; loom reads F32, BF16 and F16"},
      {"model.safetensors", "[256,64]", "[512,32]",
       "tensor model.embed_tokens.weight has shape [512, 32]; the config's model needs [256, 64]"},
      {"model.safetensors", "[256,64]", "[255,64]", "tensor model.embed_tokens.weight: 65536 bytes of data for its shape's 65280"},
  };
  for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
    expect_hf_refused(good, CASES[i].file, CASES[i].from, CASES[i].with, CASES[i].why);
  /* Qwen2's own fields: a window reaching back at least one key, one position axis, an attention kind per layer. */
  char qwen[1024];
  snprintf(qwen, sizeof qwen, "%s", tu_tmp_path("hf_qwen2"));
  r = run("ckpt", "export", "--model", "llama-tiny", "--layers", "1", "--qkv-bias", "--format", "hf", "-o", qwen, NULL);
  ck_assert_msg(r->code == 0, "%s", r->err);
  static const struct {
    const char *from, *with, *why;
  } QWEN2[] = {
      {"\"use_sliding_window\": false,\n  \"sliding_window\": null", "\"use_sliding_window\": true,\n  \"sliding_window\": 1",
       "field \"sliding_window\" is 1: a query would see its own key alone; loom's windows reach at least one key back"},
      {"\"max_window_layers\": 1", "\"max_window_layers\": 1, \"use_mrope\": true",
       "field \"use_mrope\" must be false: loom computes RoPE over one position axis"},
      {"\"max_window_layers\": 1", "\"max_window_layers\": 1, \"layer_types\": [\"full_attention\", \"full_attention\"]",
       "field \"layer_types\" must be a list of one attention kind per layer"},
      {"\"max_window_layers\": 1", "\"max_window_layers\": 1, \"layer_types\": [\"chunked_attention\"]",
       "field \"layer_types\" must hold \"full_attention\" or \"sliding_attention\" per layer"},
      {"\"use_sliding_window\": false,\n  \"sliding_window\": null",
       "\"use_sliding_window\": true,\n  \"sliding_window\": 8, \"layer_types\": [\"sliding_attention\", \"full_attention\"]",
       "field \"layer_types\" must be a list of one attention kind per layer"},
  };
  for (size_t i = 0; i < sizeof QWEN2 / sizeof QWEN2[0]; i++)
    expect_hf_refused(qwen, "config.json", QWEN2[i].from, QWEN2[i].with, QWEN2[i].why);
  /* Two tensors sharing bytes (the same length of header, so only the offsets change). */
  expect_hf_refused(good, "model.safetensors", "[65536,65792]", "[65280,65536]",
                    "tensors model.embed_tokens.weight and model.layers.0.input_layernorm.weight overlap in the data "
                    "(data_offsets [0, 65536] and [65280, 65536])");
  /* A config claiming more than its weights hold (4000 layers, 16 GiB of state): refused from the
   * weights' header before a byte of the model is built, not after allocating it or by the memory check. */
  char bad_model[512];
  snprintf(bad_model, sizeof bad_model, "%s", tu_tmp_path("hf_bad"));
  copy_edited(good, bad_model, "model.safetensors", NULL, NULL);
  copy_edited(good, bad_model, "config.json", "\"num_hidden_layers\": 1", "\"num_hidden_layers\": 4000");
  expect_fail_with(run("train", "--init-from", bad_model, "--steps", "1", NULL), 2,
                   "model.safetensors: missing tensor model.layers.1.input_layernorm.weight");
  /* A member named twice (Python keeps the last, others the first): refused. A byte order mark: read past, as Python's utf-8-sig. */
  char bad[512];
  snprintf(bad, sizeof bad, "%s", tu_tmp_path("hf_bad"));
  copy_edited(good, bad, "model.safetensors", NULL, NULL);
  copy_edited(good, bad, "config.json", "\"vocab_size\": 256,", "\"vocab_size\": 256, \"vocab_size\": 128,");
  expect_fail_with(run("train", "--init-from", bad, "--steps", "1", NULL), 2, "the member \"vocab_size\" appears twice in one object");
  copy_edited(good, bad, "config.json", "{", "\xEF\xBB\xBF{");
  r = run("train", "--init-from", bad, "--steps", "1", "--eval-every", "0", NULL);
  ck_assert_msg(r->code == 0, "%s", r->err);
  /* A file cut short: the last tensor's bytes lie past its end. */
  char path[4200];
  snprintf(path, sizeof path, "%s/model.safetensors", good);
  size_t n;
  char *data = tu_read_bytes(path, &n);
  tu_write_bytes(path, data, n - 4);
  free(data);
  r = run("ckpt", "export", "--init-from", good, "--format", "hf", "-o", tu_tmp_path("hf_out"), NULL);
  ck_assert_int_eq(r->code, 2);
  ck_assert_msg(strstr(r->err, "model.safetensors: tensor lm_head.weight: data_offsets must be [begin, end] inside the"),
                "%s", r->err);
}
END_TEST

/* The hostile pass: well-formed input that means something wrong, and
 * outputs checked before any work rather than after it. */
/* Whether every folder down to path lets other users through (o+x). */
static bool traversable_by_others(const char *path) {
  char at[1024];
  snprintf(at, sizeof at, "%s", path);
  for (char *slash; (slash = strrchr(at, '/')) != NULL; *slash = '\0') {
    struct stat sb;
    if (slash != at && stat(at, &sb) == 0 && S_ISDIR(sb.st_mode) && !(sb.st_mode & S_IXOTH)) return false;
    if (slash == at) break;
  }
  return true;
}

START_TEST(outputs_are_checked_before_the_work) {
  static const char *const M[] = {"--layers", "1", "--hidden", "16", "--heads", "2", "--seq", "16", "--micro-batch", "2",
                                  "--eval-every", "0"};
#define TRAIN(...) run("train", M[0], M[1], M[2], M[3], M[4], M[5], M[6], M[7], M[8], M[9], M[10], M[11], __VA_ARGS__, NULL)
  tu_rows t = {0};
  char ck[512], line[2048];
  snprintf(ck, sizeof ck, "%s", tu_tmp_path("ow"));
  /* --ckpt over a checkpoint: refused without --resume or --force (a second run once replaced the first's steps). */
  result *r = TRAIN("--steps", "2", "--ckpt", ck);
  ck_assert_msg(r->code == 0, "%s", r->err);
  snprintf(line, sizeof line, "loom train: --ckpt %s already holds a checkpoint; add --resume to continue it, or --force to "
           "train afresh there (its steps are then replaced as the new run saves)", ck);
  refusal_row(&t, TRAIN("--steps", "3", "--ckpt", ck), 2, line);
  tu_row(&t, TRAIN("--steps", "3", "--ckpt", ck, "--force")->code == 0, "--force over a checkpoint");
  /* Every output: an existing one is not replaced, an empty name or an unwritable place is refused, a name never contradicts its format. */
  const char *model = tu_tmp_path("m.bin");
  tu_write_bytes(model, "x", 1);
  snprintf(line, sizeof line, "loom train: --save %s: a file exists there; add --force to replace it", model);
  refusal_row(&t, TRAIN("--steps", "1", "--save", model), 2, line);
  tu_row(&t, TRAIN("--steps", "1", "--save", model, "--force")->code == 0, "--save --force");
  snprintf(line, sizeof line, "loom train: --metrics %s: a file exists there; add --force to replace it", model);
  refusal_row(&t, TRAIN("--steps", "1", "--metrics", model), 2, line);
  snprintf(line, sizeof line, "loom train: --trace %s: a file exists there; add --force to replace it", model);
  refusal_row(&t, TRAIN("--steps", "1", "--trace", model), 2, line);
  refusal_row(&t, TRAIN("--steps", "1", "--save", ""), 2, "loom train: --save '': an empty path names no file");
  refusal_row(&t, TRAIN("--steps", "1", "--save", "/proc/m.bin"), 2, "loom train: --save /proc/m.bin: cannot write there: No such file or directory");
  refusal_row(&t, TRAIN("--steps", "1", "--save", "m.safetensors"), 2,
              "loom train: --save m.safetensors: the name contradicts what is written (llm.c format): this is an llm.c file, not safetensors; rename it");
  r = TRAIN("--steps", "1", "--norm", "rmsnorm", "--save", "m");
  tu_row(&t, r->code == 2 && strncmp(r->err, "loom train: --save: this model (", 32) == 0 && strstr(r->err, ") has no Hugging Face class"),
         "--save of a model with no Hugging Face class: exit %d, '%s'", r->code, r->err);
  snprintf(line, sizeof line, "loom: -o %s: the name contradicts what is written (safetensors, Hugging Face names): safetensors "
           "files end in .safetensors; rename it", model);
  refusal_row(&t, run("ckpt", "export", "--format", "safetensors", "-o", model, NULL), 2, line);
  /* A full disk under --metrics: said at once, the run finishes, and exits 1 (a failed run, not bad input). */
  r = TRAIN("--steps", "2", "--metrics", "/dev/full");
  tu_row(&t, r->code == 1 && strstr(r->err, "loom: --metrics /dev/full: writing step 1 failed (No space left on device); metrics stop recording here") &&
             strstr(r->err, "loom: --metrics /dev/full: stopped recording at step 1 (No space left on device)") && strstr(r->out, "step     2/2"),
         "metrics on a full disk: exit %d, '%s'", r->code, r->err);
  /* Resumed onto a device: nothing to keep lines of (it once read /dev/full forever), and the full disk is said. */
  r = TRAIN("--steps", "4", "--ckpt", ck, "--resume", "--metrics", "/dev/full");
  tu_row(&t, r->code == 1 && strstr(r->err, "stopped recording at step 4"), "resume with metrics on a full disk: exit %d, '%s'",
         r->code, r->err);
  /* Inputs that would block: a FIFO is refused without opening it for reading. */
  const char *fifo = tu_tmp_path("fifo");
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  snprintf(line, sizeof line, "loom: %s: is a named pipe (FIFO), not a token file", fifo);
  refusal_row(&t, TRAIN("--steps", "1", "--data", fifo), 2, line);
  const char *fifo_plan = tu_tmp_path("fifo.txtpb");
  ck_assert_int_eq(mkfifo(fifo_plan, 0600), 0);
  snprintf(line, sizeof line, "loom: %s: is a named pipe (FIFO), not a plan", fifo_plan);
  refusal_row(&t, run("plan", "show", fifo_plan, NULL), 2, line);
  /* What the environment says is checked: thread counts, and the launcher's world against the communicator's. */
  g_env[0] = "OMP_NUM_THREADS=100000";
  r = TRAIN("--steps", "1");
  tu_row(&t, r->code == 2 && strstr(r->err, "loom: OMP_NUM_THREADS=100000: thread counts must be whole numbers in [1, 4096] (") == r->err,
         "OMP_NUM_THREADS=100000: exit %d, '%s'", r->code, r->err);
  g_env[0] = "OMPI_COMM_WORLD_SIZE=2";
  /* MPI starts here (a singleton), and Open MPI unloads its plugins before
   * LeakSanitizer can name what they hold, as under mpirun (tests/CMakeLists.txt). */
  g_env[1] = "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0";
  refusal_row(&t, TRAIN("--steps", "1", "--dp", "2"), 2, "loom: this process is rank 0 of 1, but OMPI_COMM_WORLD_SIZE=2 says "
              "otherwise; start every rank with mpirun or srun, or unset it to run alone");
  g_env[1] = NULL;
  g_env[0] = "LOOM_CPU_GEMM=mkl";
  refusal_row(&t, TRAIN("--steps", "1"), 2, "loom train: LOOM_CPU_GEMM must be openblas or onednn, got 'mkl'");
  g_env[0] = "LOOM_CPU_BF16_GEMM=amx";
  refusal_row(&t, TRAIN("--steps", "1"), 2, "loom train: LOOM_CPU_BF16_GEMM must be native or widen, got 'amx'");
  g_env[0] = NULL;
  /* Permission, said as such (as root, the runs below are made as nobody):
   * an unreadable latest or manifest, a checkpoint directory nobody may write. */
  if (getuid() == 0) {
    /* nobody must reach the checkpoint: under a private $TMPDIR (0700) it cannot, so these runs get a world-traversable
     * folder of their own beside it (in /tmp), removed again; where none can be made the rows are skipped, said so. */
    char dir[512];
    if (traversable_by_others(tu_tmp_path(""))) snprintf(dir, sizeof dir, "%s/nobody", tu_tmp_path(""));
    else snprintf(dir, sizeof dir, "/tmp/loom_test_nobody_XXXXXX");
    const bool own = strncmp(dir, "/tmp/loom_test_nobody_", 22) == 0;
    if ((own ? mkdtemp(dir) != NULL : mkdir(dir, 0755) == 0) && chmod(dir, 0755) == 0 && traversable_by_others(dir)) {
      char own_ck[600], latest[700], unmade[600];
      snprintf(own_ck, sizeof own_ck, "%s/ck", dir);
      r = TRAIN("--steps", "2", "--ckpt", own_ck);
      ck_assert_msg(r->code == 0, "%s", r->err);
      ck_assert_int_eq(chmod(own_ck, 0777), 0); /* nobody may write there, but not read latest */
      snprintf(latest, sizeof latest, "%s/latest", own_ck);
      ck_assert_int_eq(chmod(latest, 0600), 0);
      g_uid = 65534;
      r = TRAIN("--steps", "4", "--ckpt", own_ck, "--resume");
      tu_row(&t, r->code == 2 && strstr(r->err, "latest: cannot open checkpoint's latest file: permission denied"),
             "an unreadable latest as nobody: exit %d, '%s'", r->code, r->err);
      snprintf(unmade, sizeof unmade, "%s/nobody_may_make_this", dir);
      r = TRAIN("--steps", "1", "--ckpt", unmade); /* in root's 0755 folder */
      tu_row(&t, r->code != 0 && strstr(r->err, "Permission denied"), "an unwritable --ckpt as nobody: exit %d, '%s'", r->code, r->err);
      g_uid = 0;
      tu_remove_tree(dir);
    } else {
      printf("SKIP rows: no folder nobody can reach (%s: %s); the permission rows did not run\n", dir, strerror(errno));
      if (own) rmdir(dir);
    }
  }
  tu_rows_done(&t);
#undef TRAIN
}
END_TEST

/* One row: exit `code` and one stderr line holding `part`. */
static void part_row(tu_rows *t, const result *r, int code, const char *part) {
  const char *nl = strchr(r->err, '\n');
  tu_row(t, r->code == code && nl && nl[1] == '\0' && strstr(r->err, part), "exit %d (want %d), stderr '%s' (want one line with '%s')",
         r->code, code, r->err, part);
}

/* Well-formed input that means something wrong: refused, naming what and why. */
START_TEST(meaningful_nonsense_is_refused) {
  tu_rows t = {0};
  /* A tiktoken rank on a special token's id: "he" and <|endoftext|> would encode alike. */
  const char *ranks = tu_tmp_path("gpt2.tiktoken"), *txt = tu_tmp_path("t.txt");
  tu_write_bytes(ranks, "aGU= 50256\n", 11);
  tu_write_bytes(txt, "he", 2);
  part_row(&t, run("data", "encode", "--tokenizer", ranks, txt, NULL), 2,
           "rank 50256 is gpt2's special token <|endoftext|>, but the file gives it to another token");
  /* A token file whose header counts fewer tokens than it holds; decode's error names its file. */
  const char *tokens = tu_tmp_path("t.bin");
  ck_assert_int_eq(run("data", "prepare", txt, "-o", tokens, NULL)->code, 0);
  size_t n;
  char *bytes = tu_read_bytes(tokens, &n);
  char *longer = malloc(n + 2);
  memcpy(longer, bytes, n);
  longer[n] = longer[n + 1] = 0;
  tu_write_bytes(tokens, longer, n + 2);
  part_row(&t, run("train", "--data", tokens, "--steps", "1", NULL), 2, "header says 2 tokens but the file holds 6 bytes of them (3 tokens)");
  free(longer);
  free(bytes);
  /* Held-out data of another kind than the training data. */
  part_row(&t, run("train", "--data", tokens, "--eval-data", "a b", "--steps", "1", NULL), 2,
           "--eval-data a b: is an indexed dataset, but --data");
  /* A symbolic-link loop, said as one. */
  const char *loop = tu_tmp_path("loop");
  ck_assert_int_eq(symlink(loop, loop), 0);
  part_row(&t, run("data", "decode", "--tokenizer", loop, txt, NULL), 2, "a loop of symbolic links");
  /* Empty lists and names that write hidden files. */
  part_row(&t, run("data", "prepare", txt, "--output-prefix", "", NULL), 2, "--output-prefix '': names no file");
  part_row(&t, run("sim", "--cluster", "a100-80gb", "--model", "gpt-tiny", "--sweep-gpus", "", NULL), 2, "--sweep-gpus '': expected");
  /* A plan's cluster block is range-checked like every other field. */
  const char *plan = tu_tmp_path("c.txtpb");
  ck_assert_int_eq(run("plan", "new", "-o", plan, NULL)->code, 0);
  bytes = tu_read_bytes(plan, &n);
  char *with = malloc(n + 64);
  memcpy(with, bytes, n);
  n += (size_t)snprintf(with + n, 64, "cluster { nodes: 0 device_memory_bytes: -1 }\n");
  tu_write_bytes(plan, with, n);
  free(with);
  free(bytes);
  const result *r = run("plan", "check", plan, NULL);
  tu_row(&t, r->code == 1 && strstr(r->out, "cluster.nodes = 0: must be 1 to") && strstr(r->out, "cluster.device_memory_bytes = -1"),
         "plan check of a bad cluster block: exit %d, '%s'", r->code, r->out);
  /* A search whose batch no layout splits says so; a trace's spans are bounded. */
  part_row(&t, run("plan", "search", "--model", "gpt-tiny", "--gpus", "3", "--global-batch", "16", "--cluster", "a100-80gb", NULL), 2,
           "no layout of 3 GPUs splits --global-batch 16 into whole replicas");
  const char *trace = tu_tmp_path("t.json");
  const char span[] = "{\"traceEvents\": [\n{\"name\": \"F0\", \"cat\": \"forward\", \"ph\": \"X\", \"ts\": 1e308, \"dur\": 1e308, \"pid\": 0, \"tid\": 0}\n]}\n";
  tu_write_bytes(trace, span, strlen(span));
  part_row(&t, run("trace", "svg", trace, "-o", tu_tmp_path("t.svg"), NULL), 2, "a span is microseconds within a day");
  /* Bench reports what it measured, named by the length it ran. */
  r = run("bench", "step", "--model", "gpt-tiny", "--seq", "32", "--steps", "1", "--precision", "fp32", NULL);
  tu_row(&t, r->code == 0 && strstr(r->out, "RESULT seq32_fp32_peak_frac=") && strstr(r->out, "seq32_fp32_roofline_frac=") &&
             strstr(r->out, "    roofline: GEMMs ") && !strstr(r->out, "seq256") && !strstr(r->out, "=0.000"),
         "bench step --seq 32: exit %d, '%s'", r->code, r->out);
  /* bench ckpt saves three ways, trains during the asynchronous and in-memory writes, restores from the store and from
   * memory, and leaves nothing in $TMPDIR. */
  r = run("bench", "ckpt", "--model", "gpt-tiny", "--steps", "1", NULL);
  const char *tmpdir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  bool left = false;
  DIR *d = opendir(tmpdir);
  for (struct dirent *e; d && (e = readdir(d));) left |= strncmp(e->d_name, "loom_bench_ckpt_", 16) == 0;
  if (d) closedir(d);
  tu_row(&t, r->code == 0 && strstr(r->out, "RESULT ckpt_sync_stall_s=") && strstr(r->out, " ckpt_async_over_sync=") &&
             strstr(r->out, "asynchronous save: the step loop stalled ") && strstr(r->out, " ckpt_local_stall_s=") &&
             strstr(r->out, "in-memory save (--local-save-every, into ") && strstr(r->out, " ckpt_local_restore_s=") &&
             strstr(r->out, " ckpt_setup_s=") && !left,
         "bench ckpt: exit %d, '%s', %s left in %s", r->code, r->out, left ? "a directory" : "nothing", tmpdir);
  tu_rows_done(&t);
}
END_TEST


/* The losses a --metrics file holds, as text, one after another ("" for none). */
static void metrics_losses(const char *path, char *out, size_t cap) {
  size_t n;
  char *text = tu_read_bytes(path, &n), *at = text;
  out[0] = '\0';
  for (size_t len = 0; (at = strstr(at, "\"loss\": ")) != NULL; at += 8) {
    const size_t w = strcspn(at + 8, ",}");
    if (len + w + 2 < cap) len += (size_t)snprintf(out + len, cap - len, "%.*s ", (int)w, at + 8);
  }
  free(text);
}

/* Hostile pass, round 3: each finding's one line and exit code, or its now-correct behaviour. */
START_TEST(hostile_round_3) {
  tu_rows t = {0};
  /* Integers are decimal digits only; a huge one is out of range, not "not an integer". */
  refusal_row(&t, run("train", "--tp", "0x2", NULL), 2, "loom train: --tp expects an integer in decimal digits, got '0x2'");
  refusal_row(&t, run("train", "--tp", "1e0", NULL), 2, "loom train: --tp expects an integer in decimal digits, got '1e0'");
  refusal_row(&t, run("train", "--tp", "+2", NULL), 2, "loom train: --tp expects an integer in decimal digits, got '+2'");
  refusal_row(&t, run("train", "--steps", "99999999999999999999", NULL), 2,
              "loom train: --steps must be in [1, 1000000000], got 99999999999999999999");
  refusal_row(&t, run("train", "--model", "moe-tiny", "--moe-layer-freq", "99999999999999999999", NULL), 2,
              "loom train: --moe-layer-freq 99999999999999999999: an integer must be in [1, 4096] (1: every layer a Mixture "
              "of Experts) (give N, one MoE layer in every N, or Megatron's list form such as ([0]*3+[1]*58))");
  /* A value longer than a message: a bounded prefix of it is quoted, and the reason still ends the one line. */
  static char longest[2048];
  memset(longest, 0, sizeof longest);
  strcpy(longest, "[1");
  for (int i = 0; i < 600; i++) strcat(longest, ",1");
  strcat(longest, "]");
  part_row(&t, run("train", "--model", "moe-tiny", "--moe-layer-freq", longest, NULL), 2,
           "1,1,1...: more entries than the model's layers (give N, one MoE layer in every N");
  part_row(&t, run("train", "--grad-compression", longest, NULL), 2, "...': expected none, sign or powersgd:RANK");
  /* A run in which no position has a target is refused before step 1. */
  refusal_row(&t, run("train", "--seq", "4", NULL), 2,
              "loom train: no position has a target, so the run cannot learn: the addition task with --digits 2 puts its "
              "first target (the sum) at position 6, past the sequence of 4; give --seq 6 or more, or fewer --digits");
  refusal_row(&t, run("train", "--seq", "16", "--digits", "8", NULL), 2,
              "loom train: no position has a target, so the run cannot learn: the addition task with --digits 8 puts its "
              "first target (the sum) at position 18, past the sequence of 16; give --seq 18 or more, or fewer --digits");
  tu_row(&t, run("train", "--seq", "6", "--steps", "1", "--eval-every", "0", NULL)->code == 0, "--seq 6 has a target");
  /* One path, one output, checked before any work: nothing is written. */
  char a[512], b[600], line[2048];
  snprintf(a, sizeof a, "%s", tu_tmp_path("one.json"));
  /* The same file spelled another way: TMP/../NAME/./one.json. */
  char dir[512];
  snprintf(dir, sizeof dir, "%s", a);
  *strrchr(dir, '/') = '\0';
  snprintf(b, sizeof b, "%s/../%s/./one.json", dir, strrchr(dir, '/') + 1);
  snprintf(line, sizeof line, "loom train: --metrics and --trace both name %s: one path, one output", a);
  refusal_row(&t, run("train", "--steps", "1", "--metrics", a, "--trace", b, NULL), 2, line);
  snprintf(a, sizeof a, "%s", tu_tmp_path("D"));
  snprintf(line, sizeof line, "loom train: --save and --ckpt both name %s: one path, one output", a);
  refusal_row(&t, run("train", "--steps", "1", "--save", a, "--ckpt", a, NULL), 2, line);
  snprintf(b, sizeof b, "%s/ck", a);
  snprintf(line, sizeof line, "loom train: --ckpt %s lies inside --save %s, which is replaced whole when it is written", b, a);
  refusal_row(&t, run("train", "--steps", "1", "--save", a, "--ckpt", b, NULL), 2, line);
  snprintf(b, sizeof b, "%s", tu_tmp_path("m.bin"));
  ck_assert_int_eq(run("ckpt", "export", "--model", "gpt-tiny", "--layers", "1", "--format", "llmc", "-o", b, NULL)->code, 0);
  snprintf(line, sizeof line, "loom train: --metrics and --init-from both name %s: one path, one use (an output would "
           "overwrite what the run reads)", b);
  refusal_row(&t, run("train", "--steps", "1", "--init-from", b, "--metrics", b, "--force", NULL), 2, line);
  tu_row(&t, access(a, F_OK) != 0, "a refused run wrote %s", a);
  /* The tools' outputs against their inputs: an export over the checkpoint it reads, a reshard onto its source. */
  snprintf(a, sizeof a, "%s", tu_tmp_path("tool_ck"));
  ck_assert_int_eq(run("train", "--steps", "1", "--eval-every", "0", "--ckpt", a, NULL)->code, 0);
  snprintf(line, sizeof line, "loom ckpt export: the checkpoint and -o both name %s: one path, one use (an output would "
           "overwrite what the run reads)", a);
  refusal_row(&t, run("ckpt", "export", a, "--format", "hf", "-o", a, "--force", NULL), 2, line);
  snprintf(b, sizeof b, "%s/latest", a);
  tu_row(&t, access(b, F_OK) == 0, "the refused export left the checkpoint in place");
  /* The checkpoint directory is held for the run's life: a second run is refused, told who holds it. */
  snprintf(a, sizeof a, "%s", tu_tmp_path("held"));
  ck_assert_int_eq(mkdir(a, 0755), 0);
  snprintf(b, sizeof b, "%s/.lock", a);
  const int fd = open(b, O_RDWR | O_CREAT, 0644);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(flock(fd, LOCK_EX), 0);
  ck_assert_int_eq(write(fd, "loom train, pid 1 on elsewhere\n", 31), 31);
  snprintf(line, sizeof line, "loom: --ckpt %s: another run holds this checkpoint directory (loom train, pid 1 on elsewhere); "
           "two runs on one directory would overwrite each other's steps", a);
  refusal_row(&t, run("train", "--steps", "1", "--eval-every", "0", "--ckpt", a, NULL), 2, line);
  close(fd);
  tu_row(&t, run("train", "--steps", "1", "--eval-every", "0", "--ckpt", a, NULL)->code == 0, "the lock released");
  tu_row(&t, access(b, F_OK) != 0, "the run left its lock file behind");
  /* Everything a checkpoint holds survives reshard: an expert-bias run resumed from its resharded copy trains as from the original. */
  char ck[512], copy[512], m1[512], m2[512], l1[4096], l2[4096];
  snprintf(ck, sizeof ck, "%s", tu_tmp_path("bias_ck"));
  snprintf(copy, sizeof copy, "%s", tu_tmp_path("bias_copy"));
  snprintf(m1, sizeof m1, "%s", tu_tmp_path("bias_1.jsonl"));
  snprintf(m2, sizeof m2, "%s", tu_tmp_path("bias_2.jsonl"));
#define BIAS "--model", "moe-tiny", "--layers", "2", "--eval-every", "0", "--moe-router-score-function", "sigmoid", \
             "--moe-router-enable-expert-bias"
  ck_assert_int_eq(run("train", BIAS, "--steps", "3", "--ckpt", ck, NULL)->code, 0);
  ck_assert_int_eq(run("ckpt", "reshard", ck, "-o", copy, "--tp", "1", NULL)->code, 0);
  ck_assert_int_eq(run("train", BIAS, "--steps", "5", "--ckpt", ck, "--resume", "--metrics", m1, NULL)->code, 0);
  result *r = run("train", BIAS, "--steps", "5", "--ckpt", copy, "--resume", "--metrics", m2, NULL);
  metrics_losses(m1, l1, sizeof l1);
  metrics_losses(m2, l2, sizeof l2);
  tu_row(&t, r->code == 0 && l1[0] && strcmp(l1, l2) == 0 && !strstr(r->out, "holds no expert bias"),
         "the resharded checkpoint's expert bias: losses '%s' against the original's '%s'", l2, l1);
  r = run("train", "--model", "moe-tiny", "--layers", "2", "--eval-every", "0", "--moe-router-score-function", "sigmoid",
          "--steps", "6", "--ckpt", ck, "--resume", NULL);
  tu_row(&t, r->code == 0 && strstr(r->out, "its expert bias (model.moe.expert_bias) is dropped: this run routes without one"),
         "a resume that drops the expert bias says so: '%s'", r->out);
#undef BIAS
  tu_rows_done(&t);
}
END_TEST

/* Hostile pass, round 3, on Hugging Face directories: an ambiguous one, a
 * weight_map that points elsewhere, a config's dropout, an export over an export. */
START_TEST(hf_directories_mean_one_thing) {
  tu_rows t = {0};
  char sharded[512], path[1200], line[2400];
  snprintf(sharded, sizeof sharded, "%s", tu_tmp_path("hf_sharded"));
  result *r = run("ckpt", "export", "--model", "llama-tiny", "--layers", "1", "--format", "hf", "-o", sharded,
                  "--max-shard-size", "100KB", NULL);
  ck_assert_msg(r->code == 0, "%s", r->err);
  snprintf(path, sizeof path, "%s/model-00004-of-00004.safetensors", sharded);
  ck_assert_msg(access(path, F_OK) == 0, "the export is not in 4 shards");
  /* Both forms in one directory: transformers reads model.safetensors, loom read the shards; now refused, naming both. */
  snprintf(path, sizeof path, "%s/model.safetensors", sharded);
  tu_write_bytes(path, "x", 1);
  snprintf(line, sizeof line, "loom: %s: holds both model.safetensors and model.safetensors.index.json (with its shards): "
           "transformers reads model.safetensors and ignores the shards, so which weights are meant is ambiguous; remove "
           "the one that is stale", sharded);
  refusal_row(&t, run("train", "--init-from", sharded, "--steps", "1", NULL), 2, line);
  unlink(path);
  /* An index entry whose shard lacks the tensor: said so, naming that shard, not "missing". */
  char bad[512];
  snprintf(bad, sizeof bad, "%s", tu_tmp_path("hf_bad_index"));
  for (int i = 1; i <= 4; i++) { /* model.norm.weight is in the third, renamed there (the index still lists it) */
    char shard[64];
    snprintf(shard, sizeof shard, "model-%05d-of-00004.safetensors", i);
    copy_edited(sharded, bad, shard, i == 3 ? "\"model.norm.weight\"" : NULL, "\"model.norx.weight\"");
  }
  copy_edited(sharded, bad, "config.json", NULL, NULL);
  copy_edited(sharded, bad, "model.safetensors.index.json", NULL, NULL);
  r = run("train", "--init-from", bad, "--steps", "1", NULL);
  part_row(&t, r, 2, "the index puts tensor model.norm.weight in model-00003-of-00004.safetensors, which does not hold it");
  /* A config's dropout is applied (--print-plan shows it) or refused by name. */
  char gpt2[512];
  snprintf(gpt2, sizeof gpt2, "%s", tu_tmp_path("hf_gpt2"));
  ck_assert_int_eq(run("ckpt", "export", "--model", "gpt-tiny", "--layers", "1", "--format", "hf", "-o", gpt2, NULL)->code, 0);
  snprintf(bad, sizeof bad, "%s", tu_tmp_path("hf_gpt2_drop"));
  copy_edited(gpt2, bad, "model.safetensors", NULL, NULL);
  copy_edited(gpt2, bad, "config.json", "\"resid_pdrop\": 0,\n  \"embd_pdrop\": 0,\n  \"attn_pdrop\": 0",
              "\"resid_pdrop\": 0.25,\n  \"embd_pdrop\": 0.25,\n  \"attn_pdrop\": 0.25");
  r = run("train", "--init-from", bad, "--print-plan", NULL);
  tu_row(&t, r->code == 0 && strstr(r->out, "dropout: 0.25"), "GPT-2's pdrop fields applied: exit %d, '%s'", r->code, r->err);
  r = run("train", "--init-from", bad, "--dropout", "0", "--print-plan", NULL);
  tu_row(&t, r->code == 0 && !strstr(r->out, "dropout: 0.25"), "--dropout replaces the config's: exit %d", r->code);
  copy_edited(gpt2, bad, "config.json", "\"attn_pdrop\": 0", "\"attn_pdrop\": 0.5");
  snprintf(line, sizeof line, "loom: %s/config.json: field \"attn_pdrop\" is 0.5 where \"embd_pdrop\" is 0: loom drops "
           "embeddings, attention and residuals with one probability; make them equal, or remove them and train with "
           "--dropout", bad);
  refusal_row(&t, run("train", "--init-from", bad, "--steps", "1", NULL), 2, line);
  /* A MoE config's load-balancing loss as transformers trains it: only with output_router_logits. */
  char moe[512];
  snprintf(moe, sizeof moe, "%s", tu_tmp_path("hf_moe"));
  ck_assert_int_eq(run("ckpt", "export", "--model", "moe-tiny", "--layers", "1", "--format", "hf", "-o", moe, NULL)->code, 0);
  r = run("train", "--init-from", moe, "--print-plan", NULL);
  tu_row(&t, r->code == 0 && strstr(r->out, "aux_loss_coeff: 0.01"), "the exported aux loss read back: '%s'", r->err);
  snprintf(bad, sizeof bad, "%s", tu_tmp_path("hf_moe_no_logits"));
  copy_edited(moe, bad, "model.safetensors", NULL, NULL);
  copy_edited(moe, bad, "config.json", "\"output_router_logits\": true", "\"output_router_logits\": false");
  r = run("train", "--init-from", bad, "--print-plan", NULL);
  tu_row(&t, r->code == 0 && !strstr(r->out, "aux_loss_coeff: 0.01"), "output_router_logits false trains without the aux loss");
  /* An export replaces the whole previous one: no shard of the sharded export survives an unsharded one over it. */
  r = run("ckpt", "export", "--model", "llama-tiny", "--layers", "1", "--format", "hf", "-o", sharded, "--force", NULL);
  ck_assert_msg(r->code == 0, "%s", r->err);
  DIR *d = opendir(sharded);
  int files = 0, stale = 0;
  for (struct dirent *e; d && (e = readdir(d));) {
    files += e->d_name[0] != '.';
    stale += strncmp(e->d_name, "model-", 6) == 0 || strstr(e->d_name, "index.json") != NULL;
  }
  if (d) closedir(d);
  tu_row(&t, files > 0 && stale == 0, "export over a sharded export: %d files, %d of them stale", files, stale);
  tu_row(&t, run("train", "--init-from", sharded, "--steps", "1", "--eval-every", "0", NULL)->code == 0,
         "the replaced export trains");
  tu_rows_done(&t);
}
END_TEST

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_cli PATH_TO_LOOM\n");
    return 2;
  }
  g_loom = argv[1];
  /* Two cases, which ctest runs side by side (CK_RUN_CASE): refusals, and commands working together. */
  Suite *s = suite_create("cli");
  TCase *refusals = tcase_create("refusals"), *commands = tcase_create("commands");
  tcase_set_timeout(refusals, 300);
  tcase_set_timeout(commands, 300);
  tcase_add_test(refusals, bad_flags);
  tcase_add_test(refusals, outputs_are_checked_before_the_work);
  tcase_add_test(refusals, meaningful_nonsense_is_refused);
  tcase_add_test(refusals, sim_and_search_refuse_bad_input);
  tcase_add_test(commands, hostile_round_3);
  tcase_add_test(commands, hf_directories_mean_one_thing);
  tcase_add_test(commands, subcommands_work_together);
  tcase_add_test(commands, train_runs_the_plan_plan_new_writes);
  tcase_add_test(commands, one_rule_in_every_command);
  tcase_add_test(commands, hf_directories_refuse_bad_input);
  tcase_add_test(commands, megatron_flag_names);
  tcase_add_test(commands, wsd_flags_and_resume);
  suite_add_tcase(s, refusals);
  suite_add_tcase(s, commands);
  return tu_run(s);
}
