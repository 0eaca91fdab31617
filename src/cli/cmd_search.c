/* `loom plan search`: ranks every layout of a model on N GPUs of a cluster
 * by `loom sim`'s predicted throughput; prints the top k, writes the best as
 * a plan, and draws the candidates' throughput against memory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli/flag_defs.h"
#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "sim/ckpt_costs.h"
#include "cli/sim_cli.h"
#include "core/log.h"
#include "core/timer.h"
#include "plan/plan_io.h"
#include "sim/search.h"

/* Layout flags the search chooses itself. */
static const char *const CHOSEN[] = {"--tp", "--pp", "--dp", "--ep", "--etp", "--cp", "--cp-comm-type", "--tp-comm-overlap",
                                     "--overlap-param-gather", "--vpp", "--zero", "--sequence-parallel", "--micro-batch",
                                     "--micro-batches", "--schedule", "--recompute", "--recompute-method",
                                     "--recompute-num-layers", "--layer-split", NULL};

/* A MoE model's rows have ep and etp columns after dp; a search that tried context parallelism a cp column
 * ("ag": the all-gather variant). */
static void print_row(int rank, const loom_candidate *c, bool moe, bool cp, bool goodput) {
  char rc[32], ep[24] = "", ring[16] = "", kept[48] = "";
  if (moe) snprintf(ep, sizeof ep, " %3d %3d", c->ep > 1 ? c->ep : 1, c->etp > 1 ? c->etp : 1);
  if (cp) snprintf(ring, sizeof ring, " %3d%s", c->cp > 1 ? c->cp : 1, c->cp_all_gather ? " ag" : "   ");
  if (goodput) snprintf(kept, sizeof kept, " %7.2f%% %10.4g", 100.0 * c->goodput, c->goodput * c->tokens_per_s);
  char zero[8];
  snprintf(zero, sizeof zero, "%d%s", c->zero, c->param_gather_overlap ? " pg" : "");
  printf("  %4d %3d %4d %5d%s%s %4d %6d %-12s %-9s %3s %5s %10.4g %10.4g %8.1f %6.1f%% %6.1f%% %9.2f%s\n", rank, c->tp, c->pp,
         c->dp, ep, ring, c->vpp, c->micro_batch, loom_schedule_kind_name(c->schedule), loom_candidate_recompute(c, rc, sizeof rc),
         c->sequence_parallel ? (c->tp_comm_overlap ? "ov" : "yes") : "no", zero, c->step_s, c->tokens_per_s, c->tflops_per_gpu, 100.0 * c->mfu,
         100.0 * c->bubble, (double)c->memory / 1073741824.0, kept);
}

/* --mtbf-hours: each predicted layout's goodput (the better of persistent checkpoints alone and with in-memory
 * copies, each at its best interval), and the ranking by tokens/s kept. */
static int more_kept_first(const void *a, const void *b) {
  const loom_candidate *x = a, *y = b;
  const double kx = x->goodput * x->tokens_per_s, ky = y->goodput * y->tokens_per_s;
  if (kx != ky) return kx < ky ? 1 : -1;
  return x->order - y->order;
}

static loom_status rank_by_goodput(const loom_plan *base, const loom_profile *prof, double mtbf_hours,
                                   loom_search_result *r, loom_error *err) {
  for (int i = 0; i < r->nranked; i++) {
    loom_candidate *c = &r->ranked[i];
    loom_plan *plan = NULL;
    loom_goodput_model m;
    loom_ckpt_costs costs;
    loom_goodput_prediction g;
    loom_status st = loom_candidate_plan(base, c, &plan, err);
    if (st == LOOM_OK) st = loom_ckpt_costs_model(plan, prof, c->tp * c->pp * c->dp * (c->cp > 1 ? c->cp : 1), c->step_s,
                                                  mtbf_hours, &m, &costs, err);
    if (st == LOOM_OK) st = loom_goodput_predict(&m, 0, &g, err);
    loom_plan_free(plan);
    if (st != LOOM_OK) return loom_error_prefix(err, st, "loom plan search");
    c->goodput = fmax(g.persistent.goodput, g.local_goodput);
  }
  if (r->nranked > 1) qsort(r->ranked, (size_t)r->nranked, sizeof *r->ranked, more_kept_first);
  return LOOM_OK;
}

/* Throughput (TFLOP/s per GPU) against the most memory a rank needs, every
 * candidate that fits a dot, the device's memory a line, the best larger. */
static loom_status draw(const char *path, const loom_search_result *r, const loom_profile *prof, loom_error *err) {
  FILE *fp = fopen(path, "w");
  if (!fp) return loom_fail(err, LOOM_ERR_IO, "--svg %s: cannot open for writing", path);
  const double W = 720, H = 440, left = 70, top = 40, w = W - left - 30, h = H - top - 60;
  double xmax = (double)prof->device->memory_bytes * 1.25, ymax = 1.0;
  for (int i = 0; i < r->nranked; i++) ymax = r->ranked[i].tflops_per_gpu > ymax ? r->ranked[i].tflops_per_gpu : ymax;
  ymax *= 1.1;
  fprintf(fp, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"11\">\n"
              "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
              "<text x=\"%.0f\" y=\"22\" font-size=\"14\">plan search on %s: %d layouts predicted (best ringed); not drawn: %d slower "
              "than one with no more memory, %d over memory</text>\n",
          W, H, left, prof->name ? prof->name : "cluster", r->nranked, r->bounded, r->nunfit);
  fprintf(fp, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#999\"/>\n", left, top, w, h);
  const double mem_x = left + w * (double)prof->device->memory_bytes / xmax;
  fprintf(fp, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#E45756\" stroke-dasharray=\"4 3\"/>"
              "<text x=\"%.1f\" y=\"%.0f\" fill=\"#E45756\">device memory</text>\n", mem_x, top, mem_x, top + h, mem_x + 4, top + 14);
  for (int i = r->nranked - 1; i >= 0; i--) {
    char rc[32];
    const double x = left + w * fmin((double)r->ranked[i].memory / xmax, 1.0), y = top + h - h * r->ranked[i].tflops_per_gpu / ymax;
    fprintf(fp, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%s\" fill=\"%s\" fill-opacity=\"0.6\"><title>tp %d pp %d dp %d vpp %d "
                "micro %d %s recompute %s sp %d zero %d</title></circle>\n", x, y, i == 0 ? "6" : "2.5", i == 0 ? "#54A24B" : "#4C78A8",
            r->ranked[i].tp, r->ranked[i].pp, r->ranked[i].dp, r->ranked[i].vpp, r->ranked[i].micro_batch,
            loom_schedule_kind_name(r->ranked[i].schedule), loom_candidate_recompute(&r->ranked[i], rc, sizeof rc),
            r->ranked[i].sequence_parallel, r->ranked[i].zero);
  }
  for (int t = 0; t <= 4; t++) {
    fprintf(fp, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.0f</text>\n", left - 6, top + h - h * t / 4 + 4, ymax * t / 4);
    fprintf(fp, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.0f</text>\n", left + w * t / 4, top + h + 16, xmax * t / 4 / 1073741824.0);
  }
  fprintf(fp, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">most memory one rank needs (GiB)</text>\n", left + w / 2, top + h + 36);
  fprintf(fp, "<text x=\"16\" y=\"%.0f\" transform=\"rotate(-90 16 %.0f)\" text-anchor=\"middle\">model TFLOP/s per GPU</text>\n</svg>\n",
          top + h / 2, top + h / 2);
  return fclose(fp) == 0 ? LOOM_OK : loom_fail(err, LOOM_ERR_WRITE, "--svg %s: write failed", path);
}

/* A progress line on stderr once a search has run a second, then each
 * second: rewritten in place on a terminal, one line each otherwise. */
typedef struct {
  double start, last;
  bool shown, tty;
} progress_line;

static void show_progress(const loom_search_result *r, void *ctx) {
  progress_line *p = ctx;
  const double now = loom_now_s();
  if (now - p->start < 1.0 || now - p->last < 1.0) return;
  p->last = now, p->shown = true;
  fprintf(stderr, "%sloom plan search: %d layouts considered, %d fit, %d predicted, %d bounded (%.0f s)%s",
          p->tty ? "\r" : "", r->considered, r->fit, r->nranked, r->bounded, now - p->start, p->tty ? "" : "\n");
  fflush(stderr);
}

/* The search's report: what was considered and dropped, the ranked table, and why nothing fits where nothing
 * does (an error). */
static loom_status report(const loom_plan *base, const loom_profile *prof, const char *cluster, int gpus,
                          const loom_sim_assumptions *assume, const loom_search_result *res, int top, bool goodput,
                          loom_error *err) {
  const loom_search_result r = *res;
  loom_status st = LOOM_OK;
  printf("loom plan search: %s (%lld parameters) on %d GPUs of %s, global batch %d, %s: %d layouts considered, %d fit "
         "(%d predicted, %d bounded slower than a predicted layout that needs no more memory), %d over memory\n",
         base->name ? base->name : "model", (long long)base->estimates->total_parameters, gpus,
         prof->name ? prof->name : cluster, base->batch->global_batch,
         base->precision == LOOM__PRECISION__PRECISION_BF16 ? "bf16" : "fp32", r.considered, r.fit, r.nranked, r.bounded,
         r.nunfit);
  if (assume->moe_rank_imbalance != 1.0)
    printf("  experts: dropless, each layout's busiest ep rank at %.3gx an even share of the rows, or ep times where "
           "that is less (--moe-rank-imbalance)\n", assume->moe_rank_imbalance);
  printf("  dropped:");
  for (int i = 0; i < r.ndropped; i++) printf("%s %d (%s)", i ? "," : "", r.dropped[i].count, r.dropped[i].reason);
  printf("%s\n", r.ndropped ? "" : " none");
  const bool moe = base->model->moe != NULL, cp = !moe && loom_plan_train_seq(base) / 2 >= LOOM_SEARCH_CP_MIN_ROWS;
  if (goodput)
    printf("  ranked by tokens/s kept: tokens/s x the goodput under the failure rate (--mtbf-hours), the better of "
           "persistent checkpoints alone and with in-memory copies, each at its best interval\n");
  printf("  %4s %3s %4s %5s%s%s %4s %6s %-12s %-9s %3s %5s %10s %10s %8s %7s %7s %9s%s\n", "rank", "tp", "pp", "dp",
         moe ? "  ep etp" : "", cp ? "  cp   " : "", "vpp", "micro", "schedule", "recompute", "sp", "zero", "step (s)", "tokens/s", "TFLOP/s", "MFU",
         "bubble", "mem GiB", goodput ? "  goodput     kept/s" : "");
  bool overlapped = false, gathered = false;
  for (int i = 0; i < r.nranked && i < top; i++)
    print_row(i + 1, &r.ranked[i], moe, cp, goodput), overlapped |= r.ranked[i].tp_comm_overlap, gathered |= r.ranked[i].param_gather_overlap;
  if (overlapped) printf("  (sp ov: sequence parallel with --tp-comm-overlap)\n");
  if (gathered) printf("  (zero pg: with --overlap-param-gather)\n");
  if (r.pruned)
    printf("  pruned: %d grid%s of tp x cp x pp not enumerated: even %s leanest layout (micro-batch 1, the least of every "
           "ZeRO stage, recompute and sequence parallelism, the widest ep) needs %.1f GiB or more, over the device's %.1f GiB\n", r.pruned,
           r.pruned == 1 ? "" : "s", r.pruned == 1 ? "its" : "their", (double)r.pruned_least_bytes / 1073741824.0,
           (double)prof->device->memory_bytes / 1073741824.0);
  if (r.considered == 0 && r.pruned)
    st = loom_fail(err, LOOM_ERR_RUNTIME, "loom plan search: no layout fits: the leanest layout of every grid of %d GPUs "
                   "needs at least %.1f GiB of the device's %.1f GiB; add GPUs, or use a smaller model, batch or sequence",
                   gpus, (double)r.pruned_least_bytes / 1073741824.0, (double)prof->device->memory_bytes / 1073741824.0);
  else if (r.considered == 0)
    st = loom_fail(err, LOOM_ERR_USAGE, "loom plan search: no layout of %d GPUs splits --global-batch %d into whole "
                   "replicas (dp must divide it); choose a batch or a GPU count with common factors", gpus,
                   base->batch->global_batch);
  else if (r.nranked == 0) st = loom_fail(err, LOOM_ERR_RUNTIME, "loom plan search: no layout fits; add GPUs or use a smaller model");
  return st;
}

int loom_cmd_plan_search(int argc, char **argv) {
  loom_plan_flags pf = loom_plan_flags_defaults();
  const char *cluster = NULL, *out = NULL, *svg = NULL, *flops = "megatron";
  float imbalance = 1.0f, mtbf_hours = 0.0f;
  int gpus = 0, top = 10;
  enum { EXTRA = 8 };
  loom_flag table[LOOM_PLAN_FLAG_COUNT + EXTRA];
  loom_plan_flags_table(&pf, table);
  const loom_flag extra[EXTRA] = {
      {"--gpus", FLAG_INT, &gpus, "GPUs to lay the model out on (required)", 1, 1 << 20, NULL, false, NULL},
      loom_sim_cluster_flag(&cluster),
      {"--top", FLAG_INT, &top, "candidates to print", 1, 1000, NULL, false, NULL},
      loom_flag_def_as("-o", &out, "write the best plan here (.txtpb or .pb)"),
      loom_flag_def_as("--svg", &svg, "draw the predicted layouts' throughput against their memory"),
      loom_sim_flops_flag(&flops),
      loom_sim_imbalance_flag(&imbalance),
      loom_flag_def_as("--mtbf-hours", &mtbf_hours, "rank by tokens/s kept under this failure rate (a node's mean time "
                       "between failures; the profile's reliability section gives what a restart costs)"),
  };
  memcpy(table + LOOM_PLAN_FLAG_COUNT, extra, sizeof extra);
  loom_error err = {0};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse("loom plan search", "loom plan search --gpus N --cluster NAME|FILE --global-batch B [--model M | model flags] [-o BEST.txtpb]",
                                  table, LOOM_PLAN_FLAG_COUNT + EXTRA, argc, argv, pos, 0, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  for (int i = 0; CHOSEN[i]; i++)
    if (loom_flags_find(table, LOOM_PLAN_FLAG_COUNT, CHOSEN[i])->set)
      return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom plan search: %s is what the search chooses; leave it out", CHOSEN[i]), &err);
  if (!gpus || !cluster || !pf.global_batch)
    return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom plan search: --gpus, --cluster and --global-batch are required"), &err);
  loom_sim_assumptions assume;
  loom_profile *prof = NULL;
  loom_plan *base = NULL;
  st = loom_sim_flag_values(cluster, flops, imbalance, &prof, &assume, &err);
  pf.dp = 1, pf.micro_batch = 1; /* the base plan carries the model, batch and precision only */
  if (!pf.name && loom_flags_find(table, LOOM_PLAN_FLAG_COUNT, "--model")->set) pf.name = pf.model.preset; /* the best plan is named after its model */
  if (st == LOOM_OK) st = loom_plan_flags_build("loom plan search", &pf, table, &base, &err);
  if (st == LOOM_OK) st = loom_error_prefix(&err, loom_sim_check_imbalance(base, assume.moe_rank_imbalance, &err), "loom plan search");
  loom_search_result r = {0};
  progress_line line = {.start = loom_now_s(), .tty = isatty(STDERR_FILENO)};
  const loom_search_options opt = {.keep = top, .progress = show_progress, .ctx = &line};
  if (st == LOOM_OK) st = loom_plan_search(base, gpus, prof, &assume, &opt, &r, &err);
  if (line.shown && line.tty) fputs("\n", stderr);
  if (st == LOOM_OK && mtbf_hours > 0) st = rank_by_goodput(base, prof, mtbf_hours, &r, &err);
  if (st == LOOM_OK) st = report(base, prof, cluster, gpus, &assume, &r, top, mtbf_hours > 0, &err);
  if (st == LOOM_OK && out) {
    loom_plan *best = NULL;
    st = loom_candidate_plan(base, &r.ranked[0], &best, &err);
    if (st == LOOM_OK) st = loom_plan_write(out, best, &err);
    if (st == LOOM_OK) loom_log_info("wrote the best plan to %s", out);
    if (best) loom_plan_free(best);
  }
  if (st == LOOM_OK && svg) st = draw(svg, &r, prof, &err);
  if (st == LOOM_OK && svg) loom_log_info("wrote %s", svg);
  loom_search_result_free(&r);
  loom_plan_free(base);
  loom_profile_free(prof);
  return loom_report(st, &err);
}
