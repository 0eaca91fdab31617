/* `loom schedule show`: builds a pipeline schedule, verifies it and draws it
 * as a rank x time grid, with its peak activations and bubble. */
#include <string.h>
#include "cli/names.h"
#include "cli/flag_defs.h"
#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "schedule/render.h"
#include "schedule/verify.h"

/* sends: one model's name, or NULL for every model loom runs. */
static loom_status show(loom_schedule_kind kind, int p, int v, int m, const char *sends, loom_error *err) {
  loom_schedule s;
  loom_status st = loom_error_prefix(err, loom_schedule_build(&s, kind, p, v, m, err), "loom schedule show");
  if (st != LOOM_OK) return st;
  loom_schedule_report rep;
  const loom_send_model *model = NULL;
  if (sends) loom_cli_send_model(sends, &model); /* the flag's choices guarantee a known model */
  st = model ? loom_schedule_verify_sends(&s, model, &rep) : loom_schedule_verify(&s, &rep);
  printf("schedule %s: pp %d, micro-batches %d, vpp %d: %s%s%s\n", loom_schedule_kind_name(kind), p, m, v,
         rep.ok ? "verified deadlock-free, every forward before its backward, with " : rep.why,
         rep.ok ? (model ? model->name : "buffered (MPI) and rendezvous (NCCL)") : "", rep.ok ? " sends" : "");
  if (st == LOOM_OK) {
    loom_schedule_render(stdout, &s, &rep);
    printf("peak live activations (micro-batch x chunk) per rank:");
    for (int r = 0; r < p; r++) printf(" %d", rep.peak_live[r]);
    if (loom_schedule_kind_splits_backward(kind)) {
      printf("\npeak deferred weight grads (B done, W not) per rank:");
      for (int r = 0; r < p; r++) printf(" %d", rep.peak_deferred[r]);
    }
    printf("\nbubble: %.1f%% simulated (per stage: forward 1, backward 2, or B 1 and W 1); theory %.1f%%\n",
           100.0 * rep.bubble, 100.0 * loom_schedule_theory_bubble(&s));
  } else {
    loom_fail(err, st, "loom schedule show: %s", rep.why);
  }
  loom_schedule_report_free(&rep);
  loom_schedule_free(&s);
  return st;
}

int loom_cmd_schedule(int argc, char **argv) {
  int p = 4, v = 1, m = 8;
  const char *kind_name = "1f1b", *sends = NULL;
  loom_flag micro = loom_flag_def_as("--micro-batches", &m, "micro-batches per step");
  micro.field = "micro-batches"; /* the schedule's own rules name it so */
  loom_flag table[] = {
      loom_flag_def_as("--pp", &p, "pipeline stages (ranks)"),
      loom_flag_def_as("--vpp", &v, "model chunks per rank (interleaved; zb_v: 2, its default)"),
      micro,
      loom_flag_def_as("--schedule", &kind_name, "schedule kind"),
      {"--sends", FLAG_STRING, &sends, "verify under one send model: buffered (MPI's) or rendezvous (NCCL's: a send "
       "completes when its recv is posted, matched in issue order); default both", LOOM_NO_RANGE, loom_send_model_names(), false, NULL},
  };
  const int n = sizeof table / sizeof table[0];
  loom_error err = {0};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse("loom schedule", "loom schedule show [flags]", table, n, argc, argv, pos, 1, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (npos != 1 || strcmp(pos[0], "show") != 0)
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom schedule: expected 'show'");
  loom_schedule_kind kind = LOOM_SCHEDULE_1F1B;
  loom_cli_schedule_kind(kind_name, &kind); /* the flag's choices guarantee a known kind */
  if (kind == LOOM_SCHEDULE_ZB_V && !loom_flags_find(table, n, "--vpp")->set) v = 2; /* a V's two chunks */
  if (st == LOOM_OK) st = show(kind, p, v, m, sends, &err);
  if (st != LOOM_OK) { /* the schedule's rules name the plan's fields: say this command's flags */
    char named[sizeof err.msg];
    loom_flags_name_fields(table, n, err.msg, named, sizeof named);
    snprintf(err.msg, sizeof err.msg, "%s", named);
  }
  return loom_report(st, &err);
}
