/* `loom plan new|show|check`: author partition plans from the same model and
 * layout flags as `loom train`, print their rank grid, stage table, memory
 * and bubble, and check every rule before a GPU hour is spent. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cli/flag_defs.h"
#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "cli/sim_cli.h"
#include "core/check.h"
#include "core/log.h"
#include "plan/memory.h"
#include "plan/plan.h"

/* ---- new ---- */

static int plan_new(int argc, char **argv) {
  loom_plan_flags pf = loom_plan_flags_defaults();
  const char *out = NULL;
  loom_flag table[LOOM_PLAN_FLAG_COUNT + 1];
  loom_plan_flags_table(&pf, table);
  table[LOOM_PLAN_FLAG_COUNT] = loom_flag_def_as("-o", &out, "output plan: .txtpb (text), .pb (binary) or - (text on standard output) (required)");
  loom_error err = {0};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse("loom plan new", "loom plan new -o PLAN [flags]", table, LOOM_PLAN_FLAG_COUNT + 1, argc,
                                  argv, pos, 0, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (!out) return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom plan new: -o PLAN is required"), &err);
  loom_plan *plan;
  st = loom_plan_flags_build("loom plan new", &pf, table, &plan, &err);
  if (st != LOOM_OK) return loom_report(st, &err);
  st = loom_plan_flags_refuse("loom plan new", plan, &(loom_plan_limits){0}, table, NULL, &err);
  if (st == LOOM_OK) st = loom_plan_write(out, plan, &err);
  if (st == LOOM_OK && strcmp(out, "-") != 0)
    loom_log_info("wrote %s (%lld parameters, %lld ranks)", out, (long long)plan->estimates->total_parameters,
                  (long long)loom_plan_ranks(plan));
  loom_plan_free(plan);
  return loom_report(st, &err);
}

/* ---- show ---- */

/* GiB for real models, MiB for small ones: the unit the table prints in. */
static double g_unit = 1073741824.0;
static double gib(int64_t bytes) { return (double)bytes / g_unit; }

static void show(const loom_plan *p) {
  const Loom__Parallel *l = p->parallel;
  const Loom__Model *m = p->model;
  const long long ranks = (long long)loom_plan_ranks(p);
  char zero[16] = "";
  if (l->zero_stage) snprintf(zero, sizeof zero, ", ZeRO-%d", l->zero_stage);
  loom_gpt_config cfg;
  loom_plan_model_config(p, &cfg);
  char active[64] = "";
  if (loom_gpt_is_moe(&cfg)) snprintf(active, sizeof active, " (%zu active per token)", loom_gpt_active_param_count(&cfg));
  printf("plan%s%s: %d layers, hidden %d, heads %d, ffn %d, vocab %d, seq %d: %lld parameters%s\n", p->name ? " " : "",
         p->name ? p->name : "", m->layers, m->hidden, m->heads, m->ffn, m->vocab, m->seq,
         (long long)p->estimates->total_parameters, active);
  const int etp = l->etp > 1 ? l->etp : 1;
  char split[32] = "";
  if (etp > 1) snprintf(split, sizeof split, "etp %d x ", etp);
  if (l->ep > 1 || etp > 1)
    printf("experts: %sep %d x expert-data-parallel %d in each MoE layer, %d of %d experts on each rank%s\n", split, l->ep,
           loom_plan_expert_replicas(p), cfg.moe.experts / l->ep, cfg.moe.experts,
           etp > 1 ? ", each split over the tp group" : "");
  char arch[256];
  if (*loom_gpt_config_architecture(&cfg, l->tp, arch, sizeof arch)) printf("architecture: %s\n", arch);
  char cp[96] = "";
  if (l->cp > 1) snprintf(cp, sizeof cp, " x cp %d", l->cp);
  printf("layout: tp %d x pp %d x dp %d%s = %lld ranks (tp fastest, then %sdp, then pp), %d chunks per pipeline rank%s%s\n",
         l->tp, l->pp, l->dp, cp, ranks, l->cp > 1 ? "cp, then " : "", l->virtual_chunks,
         l->sequence_parallel ? ", sequence parallel" : "", zero);
  const loom_plan_overlap overlap = loom_plan_overlaps(p);
  printf("overlap: tp collectives %s, dp grads %s%s%s\n", overlap.tp_comm ? "beside their GEMMs (--tp-comm-overlap)" : "between GEMMs",
         overlap.grad_reduce ? "reduced in buckets during backward" : "reduced after backward",
         overlap.param_gather ? ", ZeRO's weight gather beside the next forward (--overlap-param-gather)" : "",
         overlap.p2p ? "" : ", each pipeline send waited for (--no-overlap-p2p-communication)");
  if (p->fp8 != LOOM__FP8_FORMAT__FP8_NONE)
    printf("fp8: the linear layers' GEMMs in fp8 (%s, --fp8-format), as `loom sim` costs them; `loom train` refuses it\n",
           p->fp8 == LOOM__FP8_FORMAT__FP8_HYBRID ? "hybrid: e4m3 forward, e5m2 grads" : "e4m3");
  if (l->cp > 1)
    printf("context: each sequence of %d split over cp %d, %d rows per rank (chunks r and %d - r), keys and values %s\n",
           loom_plan_train_seq(p), l->cp, loom_plan_train_seq(p) / l->cp, 2 * l->cp - 1,
           l->cp_comm_type == LOOM__CP_COMM_TYPE__CP_COMM_ALL_GATHER ? "all-gathered" : "round a ring");
  const int mb = loom_plan_micro_batches(p);
  printf("batch: %d sequences per step = %d micro-batches of %d x dp %d | schedule %s | bubble %.1f%%\n",
         p->batch->global_batch, mb, p->batch->micro_batch, l->dp, loom_schedule_kind_name(p->schedule), 100.0 * p->estimates->bubble);
  const int T = loom_plan_train_seq(p);
  const double per_token = loom_gpt_train_flops(&cfg, T, 1.0, LOOM_FLOPS_MEGATRON);
  printf("model FLOPs: %.1f GFLOP per token of a %d-token sequence (Megatron's count, causal attention halved), %.4g PFLOP per step\n",
         per_token / 1e9, T, per_token * (double)p->batch->global_batch * T / 1e15);
  printf("precision: %s, grads reduced over %s in %s\n",
         p->precision == LOOM__PRECISION__PRECISION_BF16 ? "bf16 mixed precision (fp32 master weights)" : "fp32",
         l->cp > 1 ? "dp x cp" : "dp", p->grad_reduce == LOOM__PRECISION__PRECISION_BF16 ? "bf16" : "fp32");
  /* What the grads send over dp: in all, and from the pipeline rank that sends the most. Psi counts in the
   * run's precision, as DeepSpeed's volumes do (its grads and weights are fp16). */
  const double psi_bytes = (double)loom_dtype_size(loom_plan_compute_dtype(p)), f32 = (double)loom_dtype_size(LOOM_DTYPE_F32);
  const loom_compression gc = loom_plan_compression(p);
  double sent = 0.0, whole = 0.0, *rank_bytes = loom_xcalloc((size_t)l->pp, sizeof(double), "dp traffic"),
         *rank_words = loom_xcalloc((size_t)l->pp, sizeof(double), "dp traffic"), experts_most = 0.0;
  double *expert_bytes = loom_xcalloc((size_t)l->pp, sizeof(double), "dp traffic");
  for (size_t k = 0; k < p->n_stages; k++) {
    const Loom__Stage *st = p->stages[k];
    const loom_stage_range range = loom_plan_stage_range(p, loom_plan_stage_index(p, st->pp_rank, st->chunk));
    const loom_compression_cost c = loom_plan_compression_cost(p, &range);
    sent += c.sent_words, whole += c.whole_words;
    rank_bytes[st->pp_rank] += (double)p->estimates->stages[k]->dp_bytes_sent;
    rank_words[st->pp_rank] += c.whole_words;
    expert_bytes[st->pp_rank] += (double)p->estimates->stages[k]->edp_bytes_sent;
  }
  for (int r = 0; r < l->pp; r++) experts_most = expert_bytes[r] > experts_most ? expert_bytes[r] : experts_most;
  if (experts_most > 0.0)
    printf("expert traffic: a rank sends up to %.2f MiB per step over its experts' data-parallel group of %d (their grads%s)\n",
           experts_most / 1048576.0, loom_plan_expert_replicas(p),
           l->zero_stage ? " and weights, sharded as ZeRO shards them" : "");
  free(expert_bytes);
  if (gc.kind != LOOM__COMPRESSION_KIND__COMPRESSION_NONE) {
    char method[64];
    loom_compression_describe(&gc, method, sizeof method);
    printf("grad compression: %s with error feedback: the grads of one tp rank's model send %.0f words per step over "
           "dp instead of %.0f (%.1fx fewer bytes)\n", method, sent, whole, sent > 0 ? whole / sent : 0.0);
  }
  if (l->dp > 1) {
    int most = 0;
    for (int r = 1; r < l->pp; r++) most = rank_bytes[r] > rank_bytes[most] ? r : most;
    printf("dp traffic: a rank sends up to %.2f MiB per step over dp, %.2f x its fp32 shard, %.2f Psi for a shard of "
           "Psi parameters in the run's precision (ring collectives, %d micro-batches; plain data parallelism and "
           "ZeRO-1/2 at one micro-batch send 2(d-1)/d Psi, ZeRO-3 3(d-1)/d Psi)\n", rank_bytes[most] / 1048576.0,
           rank_words[most] > 0 ? rank_bytes[most] / (f32 * rank_words[most]) : 0.0,
           rank_words[most] > 0 ? rank_bytes[most] / (psi_bytes * rank_words[most]) : 0.0, mb);
  }
  free(rank_bytes);
  free(rank_words);
  printf("\nrank grid (global rank: tp,%s dp, pp):\n", l->cp > 1 ? " cp," : "");
  const int shown = ranks < 64 ? (int)ranks : 64;
  for (int r = 0; r < shown; r++) {
    const loom_grid_coords c = loom_parallel_coords(r, (loom_grid_coords){l->tp, l->cp, l->dp, l->pp});
    char at[16] = "";
    if (l->cp > 1) snprintf(at, sizeof at, " cp %d", c.cp);
    printf("  %4d: tp %d%s dp %d pp %d%s", r, c.tp, at, c.dp, c.pp, (r + 1) % 4 == 0 || r + 1 == shown ? "\n" : "");
  }
  if (shown < ranks) printf("  ... %lld more ranks, same pattern\n", ranks - shown);
  int64_t most = 0;
  for (size_t k = 0; k < p->n_stages; k++) most = p->estimates->stages[k]->activations > most ? p->estimates->stages[k]->activations : most;
  g_unit = most >= 1073741824 ? 1073741824.0 : 1048576.0;
  const bool bf16 = p->precision == LOOM__PRECISION__PRECISION_BF16;
  printf("\nstages, memory per rank in %s (%s; grads and Adam's moments fp32; activations for the micro-batches in flight):\n",
         g_unit > 1048576.0 ? "GiB" : "MiB", bf16 ? "bf16 mixed precision: bf16 weights, an fp32 master copy" : "fp32 weights");
  printf("  %-7s %-5s %-10s %-15s %8s %8s %8s %9s %9s %9s %9s %9s %8s %7s %8s\n", "pp_rank", "chunk", "layers",
         "parameters", "weights", "master", "grads", "adam", "adam z", "transit", "acts", "acts rc", "B->W", "p2p", "cmp");
  for (size_t k = 0; k < p->n_stages; k++) {
    const Loom__Stage *s = p->stages[k];
    const Loom__StageEstimate *x = p->estimates->stages[k];
    char layers[32];
    snprintf(layers, sizeof layers, "[%d,%d)%s%s", s->layer_begin, s->layer_end, s->embedding ? "E" : "", s->head ? "H" : "");
    printf("  %-7d %-5d %-10s %-15lld %8.2f %8.2f %8.2f %9.2f %9.2f %9.2f %9.2f %9.2f %8.2f %7.3f %8.2f\n", s->pp_rank,
           s->chunk, layers, (long long)x->parameters, gib(x->weights), gib(x->master_weights), gib(x->grads),
           gib(x->optimizer), gib(x->optimizer_zero1), gib(x->zero_transient), gib(x->activations),
           gib(x->activations_recompute), gib(x->weight_grad_states), gib(x->p2p_buffers), gib(x->grad_compression));
  }
  printf("  (E: holds the embedding, H: the LM head; weights, master and grads as the plan's ZeRO stage keeps them; "
         "adam z: Adam sharded by ZeRO over dp%s %d; transit: ZeRO's slices, and under ZeRO-2/3 the gathered weights and "
         "grads of the layers in flight; rc: with full recompute; B->W: what zero-bubble backwards keep from B to W; "
         "cmp: compression's error feedback and factors or messages)\n", l->cp > 1 ? " x cp" : "", loom_plan_grad_replicas(p));
  printf("\nper pipeline rank, all its chunks (the memory model: what `loom train` allocates and reports, and what "
         "--device-memory checks):\n");
  for (int q = 0; q < l->pp; q++) {
    const loom_memory mem = loom_plan_rank_memory(p, q);
    printf("  pp_rank %-4d %9.2f", q, gib((int64_t)loom_memory_total(&mem)));
    const char *sep = " =";
    for (int k = 0; k < LOOM_MEM_KINDS; k++) {
      if (mem.bytes[k] <= 0) continue;
      printf("%s %s %.2f", sep, loom_memory_kind_name((loom_memory_kind)k), gib((int64_t)mem.bytes[k]));
      sep = " +";
    }
    printf("\n");
  }
}

static int plan_show(int argc, char **argv) {
  loom_flag table[1];
  loom_error err = {0};
  bool help;
  const char *pos[2];
  int npos;
  loom_status st = loom_cli_parse("loom plan show", "loom plan show PLAN", table, 0, argc, argv, pos, 1, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (npos != 1) return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom plan show: expected one plan file"), &err);
  loom_plan *plan;
  st = loom_plan_read(pos[0], &plan, &err);
  if (st != LOOM_OK) return loom_report(st, &err);
  char lines[4096];
  if (loom_plan_check_rules(plan, 0, 0, lines, sizeof lines) > 0) {
    fputs(lines, stderr);
    loom_plan_free(plan);
    return 1;
  }
  loom_plan_estimate(plan);
  show(plan);
  loom_plan_free(plan);
  return 0;
}

/* ---- check ---- */

static int plan_check(int argc, char **argv) {
  const char *memory = NULL;
  int world = 0;
  loom_flag table[] = {
      {"--device-memory", FLAG_STRING, &memory, "memory of one device, e.g. 80GiB (default: the plan's cluster)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--world", FLAG_INT, &world, "ranks the job will have (0: unchecked)", 0, 1 << 24, NULL, false, NULL},
  };
  loom_error err = {0};
  bool help;
  const char *pos[2];
  int npos;
  loom_status st = loom_cli_parse("loom plan check", "loom plan check PLAN [flags]", table, 2, argc, argv, pos, 1, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (npos != 1) return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom plan check: expected one plan file"), &err);
  const int64_t device = memory ? loom_cli_parse_bytes(memory) : 0;
  if (device < 0)
    return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom plan check: --device-memory " LOOM_QUOTE_FMT " is not a size like 80GiB",
                                           LOOM_QUOTE(memory)), &err);
  loom_plan *plan;
  st = loom_plan_read(pos[0], &plan, &err);
  if (st != LOOM_OK) return loom_report(st, &err);
  const int64_t limit = device ? device : plan->cluster && plan->cluster->has_device_memory_bytes ? plan->cluster->device_memory_bytes : 0;
  char lines[8192];
  const loom_plan_limits limits = {.world = world, .device_memory = limit};
  const int bad = loom_plan_validate(plan, &limits, lines, sizeof lines);
  fputs(lines, stdout);
  if (bad == 0) printf("%s: ok (every rule holds; schedule verified deadlock-free)\n", pos[0]);
  loom_plan_free(plan);
  return bad ? 1 : 0;
}

int loom_cmd_plan(int argc, char **argv) {
  if (argc >= 1 && strcmp(argv[0], "new") == 0) return plan_new(argc - 1, argv + 1);
  if (argc >= 1 && strcmp(argv[0], "show") == 0) return plan_show(argc - 1, argv + 1);
  if (argc >= 1 && strcmp(argv[0], "check") == 0) return plan_check(argc - 1, argv + 1);
  if (argc >= 1 && strcmp(argv[0], "search") == 0) return loom_cmd_plan_search(argc - 1, argv + 1);
  loom_log_error("plan: expected 'new', 'show', 'check' or 'search' (loom plan new --help)");
  return 2;
}
