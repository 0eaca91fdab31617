/* `loom sim`: predicts a plan's training step on a cluster profile (step
 * time, throughput, TFLOP/s per GPU and MFU, bubble, time by kind, memory
 * and bytes per link), as text, JSON or a Chrome trace. `loom sim calibrate`
 * (cmd_calibrate.c) measures this machine into a profile. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/decimal.h"
#include "cli/names.h"
#include "cli/flag_defs.h"
#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "cli/sim_cli.h"
#include "core/log.h"
#include "sim/ckpt_costs.h"
#include "sim/profile_report.h"
#include "sim/sim.h"

loom_flag loom_sim_cluster_flag(const char **dst) {
  return (loom_flag){"--cluster", FLAG_STRING, dst, "a built-in cluster profile (examples/clusters) or a profile file (required)",
                     LOOM_NO_RANGE, NULL, false, NULL};
}

loom_flag loom_sim_flops_flag(const char **dst) {
  return (loom_flag){"--flops", FLAG_STRING, dst, "model FLOPs definition: megatron (current code), sc21 (Narayanan et al. 2021) or nemo (NeMo's and Megatron Bridge's published TFLOP/s: attention whole, not causal)",
                     LOOM_NO_RANGE, LOOM_FLOPS_FORMULA_NAMES, false, NULL};
}

loom_flag loom_sim_imbalance_flag(float *dst) {
  return (loom_flag){"--moe-rank-imbalance", FLAG_FLOAT, dst,
                     "a dropless MoE run's busiest expert-parallel rank: its experts' rows over an even share (1: balanced, "
                     "as NVIDIA's MoE benchmarks force; at most ep; loom train's closing \"experts:\" line measures it)",
                     1, 65536, NULL, false, NULL};
}

loom_status loom_sim_flag_values(const char *cluster, const char *flops, float imbalance, loom_profile **prof,
                                 loom_sim_assumptions *assume, loom_error *err) {
  *assume = LOOM_SIM_ASSUME_BALANCED;
  loom_cli_flops_formula(flops, &assume->formula); /* the flag's choices guarantee a known name */
  assume->moe_rank_imbalance = imbalance;
  return loom_profile_load(cluster, prof, err);
}

static const char *link_name(loom_link_kind k) { return k == LOOM_LINK_INTER ? "inter-node" : "intra-node"; }

static void print_text(const loom_plan *plan, const loom_profile *prof, const loom_sim_result *r) {
  const Loom__Parallel *l = plan->parallel;
  const double gib = 1073741824.0;
  const char *chunks = l->virtual_chunks == 1 ? "" : loom_schedule_kind_v_shape(plan->schedule) ? " (V-shaped chunks)"
                                                                                                  : " (interleaved chunks)";
  char cp[32] = "";
  if (l->cp > 1) snprintf(cp, sizeof cp, " x cp %d", l->cp);
  printf("loom sim: %s on %s (%s, %d per node): tp %d x pp %d x dp %d%s = %d GPUs, %d micro-batches of %d, %s%s\n",
         plan->name ? plan->name : "plan", prof->name ? prof->name : "cluster",
         prof->device->name ? prof->device->name : "device", prof->devices_per_node, l->tp, l->pp, l->dp, cp, r->gpus,
         r->costs.m, plan->batch->micro_batch, loom_schedule_kind_name(plan->schedule), chunks);
  printf("  step time        %.4g s, %.4g tokens/s\n", r->step_s, r->tokens_per_s);
  printf("  model FLOPs      %.4g per step (%s formula): %.1f TFLOP/s per GPU, MFU %.1f%% of %.1f TFLOP/s%s\n",
         r->model_flops, loom_flops_formula_name(r->assumed.formula), r->tflops_per_gpu, 100.0 * r->mfu, r->peak_flops / 1e12,
         plan->fp8 != LOOM__FP8_FORMAT__FP8_NONE ? " (bf16's; the linear layers' GEMMs in fp8, --fp8-format)" : "");
  printf("  pipeline bubble  %.1f%% (theory %.1f%%)\n", 100.0 * r->bubble, 100.0 * r->theory_bubble);
  const Loom__Moe *moe = plan->model->moe;
  if (moe && moe->experts > 1 && moe->has_capacity_factor)
    printf("  experts          each at its capacity, %.3gx an even share of the rows (the capacity factor)\n", moe->capacity_factor);
  else if (moe && moe->experts > 1)
    printf("  experts          dropless, the busiest ep rank at %.3gx an even share of the rows (--moe-rank-imbalance)\n",
           r->assumed.moe_rank_imbalance);
  printf("  time by kind     compute %.4g s | exposed TP%s %.4g s | exposed DP %.4g s | optimizer %.4g s | idle %.4g s "
         "(mean over pipeline ranks); messages between stages in flight %.4g s\n",
         r->compute_s, l->cp > 1 ? " and CP ring" : "", r->tp_s, r->dp_s, r->optimizer_s, r->idle_s, r->p2p_s);
  printf("  memory per rank ");
  for (int q = 0; q < l->pp && q < 16; q++) printf(" pp %d: %.2f GiB%s", q, (double)r->rank_memory_bytes[q] / gib, q + 1 < l->pp ? "," : "");
  if (l->pp > 16) printf(" ... (%d pipeline ranks)", l->pp);
  printf("; most %.2f GiB of %.2f GiB%s\n", (double)r->max_rank_memory_bytes / gib, (double)prof->device->memory_bytes / gib,
         r->max_rank_memory_bytes > prof->device->memory_bytes ? ": DOES NOT FIT" : "");
  double tp = 0, p2p = 0, dp = 0, etp = 0, edp = 0, ring_bytes = 0;
  for (int q = 0; q < l->pp; q++) {
    tp += r->costs.tp_bytes[q] / l->pp, p2p += r->costs.p2p_bytes[q] / l->pp, dp += r->costs.dp_bytes[q] / l->pp;
    etp += r->costs.etp_bytes[q] / l->pp, edp += r->costs.edp_bytes[q] / l->pp, ring_bytes += r->costs.cp_bytes[q] / l->pp;
  }
  char experts[96] = ""; /* a MoE model's: over the tp ranks splitting its experts, and over their replicas */
  if (etp > 0 || edp > 0) snprintf(experts, sizeof experts, " | experts' TP %.4g GB, experts' DP %.4g GB", etp / 1e9, edp / 1e9);
  char ring[64] = ""; /* context parallelism's keys and values round the cp group */
  if (ring_bytes > 0) snprintf(ring, sizeof ring, " | CP ring %.4g GB (%s)", ring_bytes / 1e9, link_name(r->costs.cp_link));
  printf("  bytes per step   one rank sends: TP %.4g GB (%s) | between stages %.4g GB (%s) | DP %.4g GB (%s)%s%s\n", tp / 1e9,
         link_name(r->costs.tp_link), p2p / 1e9, link_name(r->costs.p2p_link), dp / 1e9, link_name(r->costs.dp_link), ring,
         experts);
}

static void print_json(const loom_plan *plan, const loom_profile *prof, const loom_sim_result *r) {
  const Loom__Parallel *l = plan->parallel;
  printf("{\"cluster\": \"%s\", \"gpus\": %d, \"tp\": %d, \"pp\": %d, \"dp\": %d, \"vpp\": %d, \"micro_batch\": %d, "
         "\"micro_batches\": %d, \"schedule\": \"%s\", \"step_time_s\": %.9g, \"tokens_per_s\": %.9g, "
         "\"flops_formula\": \"%s\", \"moe_rank_imbalance\": %.6g, \"model_flops_per_step\": %.9g, \"tflops_per_gpu\": %.6g, \"mfu\": %.6g, "
         "\"bubble\": %.6g, \"theory_bubble\": %.6g, \"time_s\": {\"compute\": %.9g, \"exposed_tp\": %.9g, "
         "\"p2p_in_flight\": %.9g, \"exposed_dp\": %.9g, \"optimizer\": %.9g, \"idle\": %.9g}, "
         "\"max_rank_memory_bytes\": %lld, \"device_memory_bytes\": %lld, \"rank_memory_bytes\": [",
         prof->name ? prof->name : "", r->gpus, l->tp, l->pp, l->dp, l->virtual_chunks, plan->batch->micro_batch,
         r->costs.m, loom_schedule_kind_name(plan->schedule), r->step_s, r->tokens_per_s, loom_flops_formula_name(r->assumed.formula),
         r->assumed.moe_rank_imbalance, r->model_flops, r->tflops_per_gpu, r->mfu, r->bubble, r->theory_bubble, r->compute_s, r->tp_s, r->p2p_s, r->dp_s,
         r->optimizer_s, r->idle_s, (long long)r->max_rank_memory_bytes, (long long)prof->device->memory_bytes);
  for (int q = 0; q < l->pp; q++) printf("%s%lld", q ? ", " : "", (long long)r->rank_memory_bytes[q]);
  printf("], \"bytes_per_step\": [");
  for (int q = 0; q < l->pp; q++)
    printf("%s{\"pp_rank\": %d, \"tp\": %.6g, \"tp_link\": \"%s\", \"p2p\": %.6g, \"p2p_link\": \"%s\", \"dp\": %.6g, "
           "\"dp_link\": \"%s\"}", q ? ", " : "", q, r->costs.tp_bytes[q], link_name(r->costs.tp_link), r->costs.p2p_bytes[q],
           link_name(r->costs.p2p_link), r->costs.dp_bytes[q], link_name(r->costs.dp_link));
  printf("]}\n");
}

/* ---- --goodput: failures, checkpoints and restarts ---- */

/* The failure simulation's length: about this many failures, enough for a standard error near 0.1% of goodput. */
#define GOODPUT_FAILURES 20000

typedef struct {
  loom_goodput_model m;
  loom_ckpt_costs c;
  loom_goodput_prediction g;
} goodput_report;

static loom_status predict_goodput(const loom_plan *plan, const loom_profile *prof, const loom_sim_result *r,
                                   double mtbf_hours, goodput_report *out, loom_error *err) {
  loom_status st = loom_ckpt_costs_model(plan, prof, r->gpus, r->step_s, mtbf_hours, &out->m, &out->c, err);
  if (st == LOOM_OK) st = loom_goodput_predict(&out->m, GOODPUT_FAILURES, &out->g, err);
  return loom_error_prefix(err, st, "loom sim");
}

static void print_goodput(const goodput_report *report, bool json) {
  const loom_goodput_model m = report->m;
  const loom_ckpt_costs c = report->c;
  const loom_goodput_prediction g = report->g;
  const loom_goodput_level *p = &g.persistent;
  if (json) {
    printf("{\"goodput\": {\"nodes\": %d, \"mtbf_node_hours\": %.9g, \"job_mtbf_s\": %.9g, \"checkpoint_bytes\": %.9g, "
           "\"rank_bytes\": %.9g, \"save_stall_s\": %.9g, \"restore_s\": %.9g, \"relaunch_s\": %.9g, \"store_write_s\": %.9g, "
           "\"persistent\": {\"save_every_steps\": %lld, \"young_s\": %.9g, \"daly_s\": %.9g, \"optimum_s\": %.9g, "
           "\"goodput\": %.9g, \"simulated\": %.9g, \"simulated_se\": %.9g}",
           c.nodes, c.mtbf_node_hours, m.mtbf_s, c.total_bytes, c.rank_bytes, m.save_stall_s, m.restore_s, m.relaunch_s,
           c.write_s, (long long)p->interval_steps, p->young_s, p->daly_s, p->optimum_s, p->goodput, p->simulated,
           p->simulated_se);
    printf(", \"in_memory\": {\"local_stall_s\": %.9g, \"local_restore_s\": %.9g, \"unrecoverable_share\": %.9g, "
           "\"local_save_every_steps\": %lld, \"save_every_steps\": %lld, \"goodput\": %.9g, \"simulated\": %.9g, "
           "\"simulated_se\": %.9g}}}\n", m.local_stall_s, m.local_restore_s, m.unrecoverable, (long long)g.local_steps,
           (long long)(g.local_steps * g.persistent_every), g.local_goodput, g.local_simulated, g.local_simulated_se);
    return;
  }
  printf("  goodput          a node fails every %.4g h, so this job of %d node%s every %.4g h; a checkpoint is %.4g GB (12 "
         "bytes a parameter), %.4g GB on the busiest rank, written to the store in %.3g s\n", c.mtbf_node_hours, c.nodes,
         c.nodes == 1 ? "" : "s", m.mtbf_s / 3600.0, c.total_bytes / 1e9, c.rank_bytes / 1e9, c.write_s);
  printf("    persistent     stall %.3g s (--async-save), restore %.3g s, relaunch %.4g s: save every %lld steps (%.4g h; "
         "Young %.4g h, Daly %.4g h): goodput %.2f%% (simulated %.2f%% +- %.2f%%)\n", m.save_stall_s, m.restore_s,
         m.relaunch_s, (long long)p->interval_steps, (double)p->interval_steps * m.step_s / 3600.0, p->young_s / 3600.0,
         p->daly_s / 3600.0, 100.0 * p->goodput, 100.0 * p->simulated, 100.0 * p->simulated_se);
  if (g.persistent_every == 1) /* every save best made persistent: the copies in memory buy nothing */
    printf("    in memory      stall %.3g s, restore %.3g s: no gain here, every save is best made persistent (the store "
           "takes one in %.3g s, a restore from it %.3g s)\n", m.local_stall_s, m.local_restore_s, c.write_s, m.restore_s);
  else
    printf("    in memory      stall %.3g s, restore %.3g s, %.3g%% of failures beyond the replicas: --local-save-every %lld "
           "--save-every %lld: goodput %.2f%% (simulated %.2f%% +- %.2f%%)\n", m.local_stall_s, m.local_restore_s,
           100.0 * m.unrecoverable, (long long)g.local_steps, (long long)(g.local_steps * g.persistent_every),
           100.0 * g.local_goodput, 100.0 * g.local_simulated, 100.0 * g.local_simulated_se);
}

/* ---- --sweep-gpus: one plan's scaling curve at its global batch ---- */

typedef struct {
  int gpus, dp, m;
  double step_s, tokens_per_s, tflops_per_gpu, mfu, bubble;
  int64_t memory;
} sweep_point;

/* The plan on `gpus` GPUs: its tp x pp groups, dp the rest, the same global batch. */
static loom_status predict_at(loom_plan *plan, const loom_profile *prof, const loom_sim_assumptions *assume, int gpus,
                              sweep_point *pt, loom_error *err) {
  Loom__Parallel *l = plan->parallel;
  const int group = l->tp * l->cp * l->pp;
  if (gpus % group)
    return loom_fail(err, LOOM_ERR_USAGE, "loom sim: --sweep-gpus %d is not whole tp %d x cp %d x pp %d groups", gpus, l->tp,
                     l->cp, l->pp);
  l->dp = gpus / group;
  char lines[1024];
  if (loom_plan_check_rules(plan, 0, 0, lines, sizeof lines) > 0) {
    lines[strcspn(lines, "\n")] = '\0';
    return loom_fail(err, LOOM_ERR_USAGE, "loom sim: --sweep-gpus %d (dp %d): %s", gpus, l->dp, lines);
  }
  loom_plan_estimate(plan);
  loom_sim_result r;
  loom_status st = loom_error_prefix(err, loom_sim_run(plan, prof, assume, &r, err), "loom sim");
  if (st != LOOM_OK) return st;
  *pt = (sweep_point){gpus, l->dp, r.costs.m, r.step_s, r.tokens_per_s, r.tflops_per_gpu, r.mfu, r.bubble, r.max_rank_memory_bytes};
  loom_sim_result_free(&r);
  return LOOM_OK;
}

/* Tokens/s against GPUs on log-log axes, with perfect scaling from the first point dashed. */
static loom_status draw_sweep(const char *path, const sweep_point *pts, int n, const loom_profile *prof, loom_error *err) {
  FILE *fp = fopen(path, "w");
  if (!fp) return loom_fail(err, LOOM_ERR_IO, "--svg %s: cannot open for writing", path);
  const double W = 720, H = 440, left = 80, top = 40, w = W - left - 30, h = H - top - 60;
  const double x0 = log((double)pts[0].gpus), x1 = log((double)pts[n - 1].gpus) + 1e-9;
  const double ideal_last = pts[0].tokens_per_s * pts[n - 1].gpus / pts[0].gpus;
  const double y0 = log(pts[0].tokens_per_s) - 0.1, y1 = log(fmax(ideal_last, pts[n - 1].tokens_per_s)) + 0.1;
#define SX(g) (left + w * (log((double)(g)) - x0) / (x1 - x0 > 0 ? x1 - x0 : 1.0))
#define SY(v) (top + h - h * (log(v) - y0) / (y1 - y0))
  fprintf(fp, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"11\">\n"
              "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
              "<text x=\"%.0f\" y=\"22\" font-size=\"14\">predicted scaling on %s at a fixed global batch (dashed: perfect)</text>\n"
              "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#999\"/>\n",
          W, H, left, prof->name ? prof->name : "cluster", left, top, w, h);
  fprintf(fp, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999\" stroke-dasharray=\"4 3\"/>\n",
          SX(pts[0].gpus), SY(pts[0].tokens_per_s), SX(pts[n - 1].gpus), SY(ideal_last));
  fprintf(fp, "<polyline fill=\"none\" stroke=\"#4C78A8\" stroke-width=\"2\" points=\"");
  for (int i = 0; i < n; i++) fprintf(fp, "%.1f,%.1f ", SX(pts[i].gpus), SY(pts[i].tokens_per_s));
  fprintf(fp, "\"/>\n");
  for (int i = 0; i < n; i++) {
    fprintf(fp, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#4C78A8\"/><text x=\"%.1f\" y=\"%.1f\">%.3g tok/s, MFU %.0f%%</text>\n",
            SX(pts[i].gpus), SY(pts[i].tokens_per_s), SX(pts[i].gpus) + 5, SY(pts[i].tokens_per_s) - 6, pts[i].tokens_per_s, 100 * pts[i].mfu);
    fprintf(fp, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%d</text>\n", SX(pts[i].gpus), top + h + 16, pts[i].gpus);
  }
#undef SX
#undef SY
  fprintf(fp, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">GPUs</text>\n"
              "<text x=\"16\" y=\"%.0f\" transform=\"rotate(-90 16 %.0f)\" text-anchor=\"middle\">tokens/s (log)</text>\n</svg>\n",
          left + w / 2, top + h + 36, top + h / 2, top + h / 2);
  return fclose(fp) == 0 ? LOOM_OK : loom_fail(err, LOOM_ERR_WRITE, "--svg %s: write failed", path);
}

static loom_status sweep(loom_plan *plan, const loom_profile *prof, const loom_sim_assumptions *assume, const char *list,
                         const char *svg, loom_error *err) {
  sweep_point pts[64];
  int counts[64];
  const int n = loom_parse_rising_list(list, 1, 1L << 24, counts, 64);
  if (n < 0)
    return loom_fail(err, LOOM_ERR_USAGE, "loom sim: --sweep-gpus " LOOM_QUOTE_FMT ": expected up to 64 rising GPU counts like "
                     "64,128,256", LOOM_QUOTE(list));
  for (int i = 0; i < n; i++) {
    const loom_status st = predict_at(plan, prof, assume, counts[i], &pts[i], err);
    if (st != LOOM_OK) return st;
  }
  printf("loom sim: scaling of tp %d x pp %d at global batch %d on %s\n", plan->parallel->tp, plan->parallel->pp,
         plan->batch->global_batch, prof->name ? prof->name : "cluster");
  printf("  %6s %5s %6s %10s %12s %9s %6s %7s %10s %9s\n", "GPUs", "dp", "micro", "step (s)", "tokens/s", "TFLOP/s", "MFU",
         "bubble", "scaling", "mem GiB");
  for (int i = 0; i < n; i++)
    printf("  %6d %5d %6d %10.4g %12.4g %9.1f %5.1f%% %6.1f%% %9.1f%% %9.2f\n", pts[i].gpus, pts[i].dp, pts[i].m, pts[i].step_s,
           pts[i].tokens_per_s, pts[i].tflops_per_gpu, 100 * pts[i].mfu, 100 * pts[i].bubble,
           100 * (pts[i].tokens_per_s / pts[i].gpus) / (pts[0].tokens_per_s / pts[0].gpus), (double)pts[i].memory / 1073741824.0);
  if (!svg) return LOOM_OK;
  const loom_status st = draw_sweep(svg, pts, n, prof, err);
  if (st == LOOM_OK) loom_log_info("wrote %s", svg);
  return st;
}

/* `loom sim profile --cluster NAME|FILE`: the profile as the cost model reads it, its fits beside their measurements. */
static int sim_profile(int argc, char **argv) {
  const char *cluster = NULL;
  loom_flag table[1] = {loom_sim_cluster_flag(&cluster)};
  loom_error err = {0};
  bool help;
  int npos;
  loom_status st = loom_cli_parse("loom sim profile", "loom sim profile --cluster NAME|FILE", table, 1, argc, argv, NULL, 0,
                                  &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (!cluster)
    return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom sim profile: --cluster is required (built in: %s)",
                                 loom_profile_builtin_names()), &err);
  loom_profile *prof = NULL;
  if ((st = loom_profile_load(cluster, &prof, &err)) != LOOM_OK) return loom_report(st, &err);
  loom_profile_report(prof, stdout);
  loom_profile_free(prof);
  return 0;
}

int loom_cmd_sim(int argc, char **argv) {
  if (argc >= 1 && strcmp(argv[0], "calibrate") == 0) return loom_cmd_sim_calibrate(argc - 1, argv + 1);
  if (argc >= 1 && strcmp(argv[0], "profile") == 0) return sim_profile(argc - 1, argv + 1);
  loom_plan_flags pf = loom_plan_flags_defaults();
  const char *file = NULL, *cluster = NULL, *trace = NULL, *flops = "megatron", *gpus = NULL, *svg = NULL;
  float imbalance = 1.0f, mtbf_hours = 0.0f;
  bool json = false, with_goodput = false;
  enum { EXTRA = 10 };
  loom_flag table[LOOM_PLAN_FLAG_COUNT + EXTRA];
  loom_plan_flags_table(&pf, table);
  const loom_flag extra[EXTRA] = {
      loom_flag_def_as("--plan", &file, "a partition plan (.txtpb or .pb) instead of the model and layout flags"),
      loom_sim_cluster_flag(&cluster),
      {"--json", FLAG_BOOL, &json, "print the prediction as one JSON object (with --goodput, a second line holds its own)",
       LOOM_NO_RANGE, NULL, false, NULL},
      loom_flag_def_as("--trace", &trace, "write the predicted timeline as Chrome-trace JSON (loom trace svg draws it)"),
      loom_sim_flops_flag(&flops),
      loom_sim_imbalance_flag(&imbalance),
      {"--sweep-gpus", FLAG_STRING, &gpus, "predict the plan on each of these GPU counts (dp scaled, the global batch kept): 64,128,256", LOOM_NO_RANGE, NULL, false, NULL},
      loom_flag_def_as("--svg", &svg, "with --sweep-gpus: draw the scaling curve"),
      {"--goodput", FLAG_BOOL, &with_goodput, "also predict goodput under the profile's failure rate, with the checkpoint "
       "intervals that maximise it (persistent alone, and with in-memory copies)", LOOM_NO_RANGE, NULL, false, NULL},
      loom_flag_def_as("--mtbf-hours", &mtbf_hours, "with --goodput, or alone: a node's mean time between failures, in "
                       "place of the profile's reliability.mtbf_node_hours"),
  };
  memcpy(table + LOOM_PLAN_FLAG_COUNT, extra, sizeof extra);
  loom_error err = {0};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse("loom sim", "loom sim --cluster NAME|FILE (--plan PLAN | [model and layout flags]) [--json] [--trace FILE]\n"
                                  "       loom sim profile --cluster NAME|FILE   (the profile's curves and their measurements)\n"
                                  "       mpirun -np N loom sim calibrate -o PROFILE.txtpb [--device cuda]   (measures this machine)",
                                  table, LOOM_PLAN_FLAG_COUNT + EXTRA, argc, argv, pos, 0, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (!cluster) return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom sim: --cluster is required (built in: %s)", loom_profile_builtin_names()), &err);
  loom_sim_assumptions assume;
  loom_profile *prof = NULL;
  st = loom_sim_flag_values(cluster, flops, imbalance, &prof, &assume, &err);
  loom_plan *plan = NULL;
  if (st == LOOM_OK) st = loom_plan_flags_or_file("loom sim", file, &pf, table, &plan, &err);
  loom_sim_result res;
  if (svg && !gpus && st == LOOM_OK) st = loom_fail(&err, LOOM_ERR_USAGE, "loom sim: --svg draws a --sweep-gpus curve; give both");
  if (st == LOOM_OK) st = loom_plan_flags_refuse("loom sim", plan, &(loom_plan_limits){0}, table, file, &err);
  if (st == LOOM_OK && gpus) {
    st = sweep(plan, prof, &assume, gpus, svg, &err);
  } else if (st == LOOM_OK) {
    loom_plan_estimate(plan); /* a plan file's own estimates may be stale */
    st = loom_error_prefix(&err, loom_sim_run(plan, prof, &assume, &res, &err), "loom sim");
    goodput_report report;
    const bool failures = with_goodput || mtbf_hours > 0;
    if (st == LOOM_OK && failures && (st = predict_goodput(plan, prof, &res, mtbf_hours, &report, &err)) != LOOM_OK)
      loom_sim_result_free(&res);
    if (st == LOOM_OK) {
      if (json) print_json(plan, prof, &res);
      else print_text(plan, prof, &res);
      if (failures) print_goodput(&report, json);
      if (st == LOOM_OK && trace) st = loom_sim_write_trace(&res, trace, &err);
      if (st == LOOM_OK && trace) loom_log_info("wrote %s", trace);
      loom_sim_result_free(&res);
    }
  }
  loom_plan_free(plan);
  loom_profile_free(prof);
  return loom_report(st, &err);
}
