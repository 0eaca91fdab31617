/* Schedules as data: every generated schedule verifies deadlock-free with
 * each forward before its backward (and each weight half after its input
 * half); 1F1B keeps at most min(p - r, m) activations live on rank r, GPipe
 * m, ZB-H1 min(p, m) and ZB-V 2 min(p, m) half-stage chunks; the simulated
 * bubble equals the theory; bad requests are refused; and a broken
 * schedule is caught. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "schedule/verify.h"
#include "cli/names.h"
#include "test_util.h"

START_TEST(every_schedule_verifies) {
  for (int kind = 0; kind < 3; kind++)
    for (int p = 1; p <= 8; p++)
      for (int m = 1; m <= 16; m++)
        for (int v = 1; v <= 3; v++) {
          if (kind != LOOM_SCHEDULE_INTERLEAVED && v != 1) continue;
          if (kind == LOOM_SCHEDULE_INTERLEAVED && m % p != 0) continue;
          loom_schedule s;
          loom_error err = {0};
          ck_assert_msg(loom_schedule_build(&s, (loom_schedule_kind)kind, p, v, m, &err) == LOOM_OK, "%s", err.msg);
          loom_schedule_report rep;
          const loom_status st = loom_schedule_verify(&s, &rep);
          ck_assert_msg(st == LOOM_OK, "%s p=%d v=%d m=%d: %s", loom_schedule_kind_name(s.kind), p, v, m, rep.why);
          for (int r = 0; r < p; r++) {
            if (kind == LOOM_SCHEDULE_1F1B) ck_assert_int_le(rep.peak_live[r], p - r < m ? p - r : m);
            if (kind == LOOM_SCHEDULE_GPIPE) ck_assert_int_eq(rep.peak_live[r], m);
          }
          if (kind != LOOM_SCHEDULE_INTERLEAVED)
            ck_assert_double_eq_tol(rep.bubble, loom_schedule_theory_bubble(&s), 1e-9);
          else
            ck_assert_double_le(rep.bubble, (double)(p - 1) / (m + p - 1) + 1e-9); /* never worse than 1F1B */
          loom_schedule_report_free(&rep);
          loom_schedule_free(&s);
        }
}
END_TEST

/* The counts read off a shape one rank at a time, never stored, are the
 * built schedule's events' peaks: its verifier's peak_live, each chunk's
 * slots and deferred weight passes; its send buffers stay within the bound
 * the counted way gives. */
START_TEST(counted_shapes_match_built_schedules) {
  const loom_schedule_kind kinds[] = {LOOM_SCHEDULE_1F1B, LOOM_SCHEDULE_GPIPE, LOOM_SCHEDULE_INTERLEAVED,
                                      LOOM_SCHEDULE_ZB_H1, LOOM_SCHEDULE_ZB_V, LOOM_SCHEDULE_FORWARD_ONLY};
  int compared = 0;
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
    for (int p = 1; p <= 6; p++)
      for (int v = 1; v <= 3; v++)
        for (int m = 1; m <= 14; m++) {
          loom_schedule s;
          loom_error err = {0};
          if (loom_schedule_build(&s, kinds[k], p, v, m, &err) != LOOM_OK) continue; /* a shape the kind refuses */
          int live[6], slots[18], deferred[18], sends[6], built_live[6], built_slots[18], built_deferred[18], built_sends[6];
          ck_assert_msg(loom_schedule_counted_peaks(kinds[k], p, v, m, live, slots, deferred, sends, &err) == LOOM_OK, "%s", err.msg);
          ck_assert_int_eq(loom_schedule_shape_peaks(kinds[k], p, v, m, built_live, built_slots, built_deferred, built_sends, &err),
                           LOOM_OK);
          loom_schedule_report rep;
          ck_assert_int_eq(loom_schedule_verify(&s, &rep), LOOM_OK);
          int held = 0; /* send buffers over the ranks */
          for (int r = 0; r < p; r++) {
            ck_assert_int_eq(live[r], rep.peak_live[r]);
            ck_assert_int_eq(built_live[r], rep.peak_live[r]);
            if (kinds[k] == LOOM_SCHEDULE_1F1B) ck_assert_int_eq(live[r], p - r < m ? p - r : m);
            const loom_schedule_peaks all = loom_schedule_rank_peaks(&s, r, -1);
            held += all.sends;
            ck_assert_int_eq(built_sends[r], all.sends);
            ck_assert_msg(all.sends <= sends[r], "%s p %d v %d m %d rank %d: %d send buffers over the bound %d",
                          loom_schedule_kind_name(kinds[k]), p, v, m, r, all.sends, sends[r]);
            for (int c = 0; c < v; c++) {
              const loom_schedule_peaks one = loom_schedule_rank_peaks(&s, r, c);
              ck_assert_int_eq(slots[r * v + c], one.live);
              ck_assert_int_eq(deferred[r * v + c], one.deferred);
              ck_assert_int_eq(built_slots[r * v + c], one.live);
              ck_assert_int_eq(built_deferred[r * v + c], one.deferred);
            }
            compared++;
          }
          ck_assert_int_eq(held > 0, p > 1 || v > 1); /* a schedule of more than one stage sends */
          loom_schedule_report_free(&rep);
          loom_schedule_free(&s);
        }
  ck_assert_int_gt(compared, 2000);
  loom_error err = {0};
  int live[2], slots[2], deferred[2], sends[2];
  ck_assert_int_eq(loom_schedule_shape_peaks(LOOM_SCHEDULE_ZB_V, 2, 1, 4, live, slots, deferred, sends, &err), LOOM_ERR_USAGE);
  ck_assert_str_eq(err.msg, "parallel.virtual_chunks = 1: schedule = zb_v runs two chunks per rank (a V); set parallel.virtual_chunks = 2");
}
END_TEST

static void expect_refused(loom_schedule_kind kind, int p, int v, int m, const char *message) {
  loom_schedule s;
  loom_error err = {0};
  ck_assert_int_eq(loom_schedule_build(&s, kind, p, v, m, &err), LOOM_ERR_USAGE);
  ck_assert_str_eq(err.msg, message);
}

START_TEST(bad_requests_are_refused) {
  expect_refused(LOOM_SCHEDULE_INTERLEAVED, 4, 2, 6, "micro-batches = 6: not a multiple of parallel.pp (4); the interleaved "
                                                     "schedule moves micro-batches through the chunks in groups of pp");
  expect_refused(LOOM_SCHEDULE_1F1B, 4, 1, 0, "micro-batches = 0: a step needs at least 1");
  expect_refused(LOOM_SCHEDULE_INTERLEAVED, 4, 0, 8, "parallel.virtual_chunks = 0: must be at least 1");
  expect_refused(LOOM_SCHEDULE_1F1B, 4, 2, 8, "parallel.virtual_chunks = 2: needs schedule = interleaved (or zb_v with 2); 1f1b runs one chunk per rank");
  expect_refused(LOOM_SCHEDULE_ZB_H1, 4, 2, 8, "parallel.virtual_chunks = 2: needs schedule = interleaved (or zb_v with 2); zb_h1 runs one chunk per rank");
  expect_refused(LOOM_SCHEDULE_ZB_V, 4, 3, 8, "parallel.virtual_chunks = 3: schedule = zb_v runs two chunks per rank (a V); set parallel.virtual_chunks = 2");
  expect_refused(LOOM_SCHEDULE_GPIPE, 0, 1, 8, "parallel.pp = 0: must be at least 1");
}
END_TEST

/* Index of rank r's first action of this kind and micro-batch. */
static int find(const loom_schedule *s, int r, loom_action_kind kind, int mb) {
  for (int i = 0; i < s->count[r]; i++)
    if (s->actions[r][i].kind == kind && s->actions[r][i].mb == mb) return i;
  ck_abort_msg("action not found");
  return -1;
}

/* Verifying s fails, saying `why`; then s is freed. */
static void expect_unverified(loom_schedule *s, const char *why) {
  loom_schedule_report rep;
  ck_assert_int_eq(loom_schedule_verify(s, &rep), LOOM_ERR_RUNTIME);
  ck_assert_str_eq(rep.why, why);
  loom_schedule_report_free(&rep);
  loom_schedule_free(s);
}

START_TEST(broken_schedules_are_caught) {
  loom_schedule s;
  loom_schedule_report rep;
  loom_error err = {0};
  /* Rank 1 receives micro-batch 0's grad before sending its activation on: a wait cycle. */
  ck_assert_int_eq(loom_schedule_build(&s, LOOM_SCHEDULE_1F1B, 3, 1, 4, &err), LOOM_OK);
  const int send = find(&s, 1, LOOM_ACT_SEND_ACT, 0), recv = find(&s, 1, LOOM_ACT_RECV_GRAD, 0);
  const loom_action tmp = s.actions[1][send];
  s.actions[1][send] = s.actions[1][recv];
  s.actions[1][recv] = tmp;
  ck_assert_int_eq(loom_schedule_verify(&s, &rep), LOOM_ERR_RUNTIME);
  ck_assert_msg(strncmp(rep.why, "deadlock:", 9) == 0, "%s", rep.why);
  ck_assert_ptr_nonnull(strstr(rep.why, "rank 1: recv grad of micro-batch 0 chunk 0 from rank 2 waits"));
  loom_schedule_report_free(&rep);
  loom_schedule_free(&s);
  /* A backward moved before its forward. */
  ck_assert_int_eq(loom_schedule_build(&s, LOOM_SCHEDULE_GPIPE, 1, 1, 2, &err), LOOM_OK);
  const int f = find(&s, 0, LOOM_ACT_FORWARD, 1), b = find(&s, 0, LOOM_ACT_BACKWARD, 1);
  const loom_action t2 = s.actions[0][f];
  s.actions[0][f] = s.actions[0][b];
  s.actions[0][b] = t2;
  expect_unverified(&s, "rank 0: backward of micro-batch 1 chunk 0 comes before its forward");
  /* A send addressed to the wrong rank. */
  ck_assert_int_eq(loom_schedule_build(&s, LOOM_SCHEDULE_1F1B, 3, 1, 2, &err), LOOM_OK);
  s.actions[0][find(&s, 0, LOOM_ACT_SEND_ACT, 1)].peer = 2;
  expect_unverified(&s, "rank 0: send activation of micro-batch 1 chunk 0 to rank 2 addressed to the wrong rank");
}
END_TEST

/* ZB-H1 and ZB-V for p 1..8 x m 1..16: deadlock-free, every weight half
 * after its input half, the simulated bubble equal to the papers' formula
 * (loom_schedule_theory_bubble) and the activations within 1F1B's peak:
 * min(p, m) micro-batches on every rank for ZB-H1 (1F1B's first rank's),
 * 2 min(p, m) half-stage chunks for ZB-V. With m >= p ZB-H1 idles (p-1)
 * units per rank where 1F1B idles 3(p-1), a third; ZB-V, with m >= 2p-1,
 * idles (p-1)/2. */
START_TEST(zero_bubble_schedules_verify) {
  const loom_schedule_kind kinds[2] = {LOOM_SCHEDULE_ZB_H1, LOOM_SCHEDULE_ZB_V};
  int checked = 0;
  for (int k = 0; k < 2; k++)
    for (int p = 1; p <= 8; p++)
      for (int m = 1; m <= 16; m++) {
        const int v = kinds[k] == LOOM_SCHEDULE_ZB_V ? 2 : 1, bound = v * (p < m ? p : m);
        loom_schedule s;
        loom_error err = {0};
        ck_assert_msg(loom_schedule_build(&s, kinds[k], p, v, m, &err) == LOOM_OK, "%s", err.msg);
        loom_schedule_report rep;
        ck_assert_msg(loom_schedule_verify(&s, &rep) == LOOM_OK, "%s p=%d m=%d: %s", loom_schedule_kind_name(s.kind), p, m,
                      rep.why);
        int weights = 0;
        for (int r = 0; r < p; r++) {
          ck_assert_msg(rep.peak_live[r] <= bound, "%s p=%d m=%d rank %d holds %d", loom_schedule_kind_name(s.kind), p, m,
                        r, rep.peak_live[r]);
          ck_assert_int_le(rep.peak_deferred[r], rep.peak_live[r]);
          for (int i = 0; i < s.count[r]; i++) weights += s.actions[r][i].kind == LOOM_ACT_BACKWARD_WEIGHT;
        }
        ck_assert_int_eq(weights, p * v * m); /* one W per (micro-batch, chunk), and no whole backward */
        const double theory = loom_schedule_theory_bubble(&s);
        ck_assert_msg(fabs(rep.bubble - theory) < 1e-9, "%s p=%d m=%d: bubble %g, theory %g",
                      loom_schedule_kind_name(s.kind), p, m, rep.bubble, theory);
        const bool v_shape = kinds[k] == LOOM_SCHEDULE_ZB_V;
        if (m >= (v_shape ? 2 * p - 1 : p)) { /* idle time per rank, in units of one stage's F (= B = W) */
          const double idle = rep.compute_end - 3.0 * m, want = v_shape ? (p - 1.0) / 2.0 : p - 1.0;
          ck_assert_double_eq_tol(idle, want, 1e-9);
        }
        checked++;
        loom_schedule_report_free(&rep);
        loom_schedule_free(&s);
      }
  ck_assert_int_eq(checked, 2 * 8 * 16);
}
END_TEST

/* The V's layout: rank r holds stage r and 2p-1-r, and placing a stage inverts it. */
START_TEST(v_shape_layout) {
  for (int p = 1; p <= 8; p++)
    for (int stage = 0; stage < 2 * p; stage++) {
      int rank, chunk;
      loom_stage_place(true, p, stage, &rank, &chunk);
      ck_assert_int_eq(loom_stage_of(true, p, rank, chunk), stage);
      ck_assert_int_eq(rank, stage < p ? stage : 2 * p - 1 - stage);
      loom_stage_place(false, p, stage, &rank, &chunk);
      ck_assert_int_eq(loom_stage_of(false, p, rank, chunk), stage);
      ck_assert_int_eq(rank, stage % p);
    }
}
END_TEST

/* A weight half run before its input half, or never, is caught. */
START_TEST(broken_split_backward_is_caught) {
  loom_schedule s;
  loom_schedule_report rep;
  loom_error err = {0};
  ck_assert_int_eq(loom_schedule_build(&s, LOOM_SCHEDULE_ZB_H1, 2, 1, 2, &err), LOOM_OK);
  const int b = find(&s, 1, LOOM_ACT_BACKWARD_INPUT, 0), w = find(&s, 1, LOOM_ACT_BACKWARD_WEIGHT, 0);
  ck_assert_int_lt(b, w);
  const loom_action t = s.actions[1][b];
  s.actions[1][b] = s.actions[1][w];
  s.actions[1][w] = t;
  ck_assert_int_eq(loom_schedule_verify(&s, &rep), LOOM_ERR_RUNTIME);
  ck_assert_str_eq(rep.why, "rank 1: backward (weight grads) of micro-batch 0 chunk 0 comes before its input-grad backward");
  loom_schedule_report_free(&rep);
  loom_schedule_free(&s);
  ck_assert_int_eq(loom_schedule_build(&s, LOOM_SCHEDULE_ZB_H1, 2, 1, 2, &err), LOOM_OK);
  s.actions[1][find(&s, 1, LOOM_ACT_BACKWARD_WEIGHT, 0)].kind = LOOM_ACT_REDUCE_DP; /* the weight half left out */
  ck_assert_int_eq(loom_schedule_verify(&s, &rep), LOOM_ERR_RUNTIME);
  ck_assert_str_eq(rep.why, "rank 1 never runs the weight-grad backward of micro-batch 0 chunk 0");
  loom_schedule_report_free(&rep);
  loom_schedule_free(&s);
}
END_TEST

/* Drops event e of rank r, as a schedule whose generator forgot it. */
static void drop_event(loom_schedule *s, int r, int e) {
  const int n = s->event_at[r][s->count[r]];
  memmove(&s->events[r][e], &s->events[r][e + 1], (size_t)(n - e - 1) * sizeof s->events[r][0]);
  for (int i = 0; i <= s->count[r]; i++)
    if (s->event_at[r][i] > e) s->event_at[r][i]--;
}

/* The event of rank r's action i of this kind and direction, or -1. */
static int event_of(const loom_schedule *s, int r, int i, loom_buffer_kind kind, bool acquire) {
  for (int e = s->event_at[r][i]; e < s->event_at[r][i + 1]; e++)
    if (s->events[r][e].kind == kind && s->events[r][e].acquire == acquire) return e;
  return -1;
}

/* The verifier holds the buffer events to the actions: a slot never given back, a slot used before it is taken
 * and a send with no buffer are each refused, naming the action. */
START_TEST(broken_buffer_events_are_caught) {
  loom_schedule s;
  loom_schedule_report rep;
  loom_error err = {0};
  ck_assert_int_eq(loom_schedule_build(&s, LOOM_SCHEDULE_1F1B, 2, 1, 4, &err), LOOM_OK);
  ck_assert_int_eq(loom_schedule_verify(&s, &rep), LOOM_OK);
  ck_assert_int_eq(rep.peak_live[1], 1);
  loom_schedule_report_free(&rep);
  /* Rank 1's slot of micro-batch 2 never given back. */
  const int release = event_of(&s, 1, find(&s, 1, LOOM_ACT_SEND_GRAD, 2), LOOM_BUFFER_SLOT, false);
  ck_assert_int_ge(release, 0);
  drop_event(&s, 1, release);
  expect_unverified(&s, "rank 1 still holds the activation slot of micro-batch 2 chunk 0 at the step's end");
  /* Actions holding a slot the events do not: micro-batch 1's recv lands in a slot not yet taken. */
  ck_assert_int_eq(loom_schedule_build(&s, LOOM_SCHEDULE_1F1B, 2, 1, 4, &err), LOOM_OK);
  const int recv = find(&s, 1, LOOM_ACT_RECV_ACT, 1);
  drop_event(&s, 1, event_of(&s, 1, recv, LOOM_BUFFER_SLOT, true));
  expect_unverified(&s, "rank 1: recv activation of micro-batch 1 chunk 0 from rank 0 uses the activation slot of "
                     "micro-batch 1 chunk 0, which its buffer events do not hold");
  /* A send with no buffer taken. */
  ck_assert_int_eq(loom_schedule_build(&s, LOOM_SCHEDULE_1F1B, 2, 1, 4, &err), LOOM_OK);
  const int send = find(&s, 0, LOOM_ACT_SEND_ACT, 3);
  drop_event(&s, 0, event_of(&s, 0, send, LOOM_BUFFER_SEND, true));
  expect_unverified(&s, "rank 0: send activation of micro-batch 3 chunk 0 to rank 1 uses the send buffer of "
                     "micro-batch 3 chunk 0, which its buffer events do not hold");
}
END_TEST

/* Moves rank r's event e to the end of action i's events (i before e's own action). */
static void move_event(loom_schedule *s, int r, int e, int i) {
  const loom_buffer_event moved = s->events[r][e];
  drop_event(s, r, e);
  const int at = s->event_at[r][i + 1], n = s->event_at[r][s->count[r]];
  memmove(&s->events[r][at + 1], &s->events[r][at], (size_t)(n - at) * sizeof s->events[r][0]);
  s->events[r][at] = moved;
  for (int k = i + 1; k <= s->count[r]; k++) s->event_at[r][k]++;
}

static double unit_cost(void *ctx, int rank, const loom_action *a) {
  (void)ctx, (void)rank;
  return a->kind == LOOM_ACT_BACKWARD ? 2.0 : loom_action_computes(a) ? 1.0 : 0.0;
}
static double slow_flight(void *ctx, int rank, const loom_action *a) {
  (void)ctx, (void)rank, (void)a;
  return 10.0;
}

/* When rank r's forward of micro-batch mb starts, in a simulation with these costs. */
static double forward_start(const loom_schedule *s, const loom_action_costs *costs, int r, int mb) {
  loom_schedule_report rep;
  ck_assert_msg(loom_schedule_simulate(s, costs, &LOOM_SENDS_BUFFERED, &rep) == LOOM_OK, "%s", rep.why);
  const int i = find(s, r, LOOM_ACT_FORWARD, mb);
  double start = -1.0;
  for (int k = 0; k < rep.span_count[r]; k++)
    if (rep.spans[r][k].action == i) start = rep.spans[r][k].start;
  loom_schedule_report_free(&rep);
  ck_assert_double_ge(start, 0.0);
  return start;
}

/* The cost model reads the buffer events too: a rank waits where its events
 * give a send buffer back until that send's recv is done. With 1F1B on two
 * ranks, forwards of 1, messages 10 in flight, rank 0 sends micro-batch 0
 * at 1 and runs its next forward at once; given back right after the send,
 * the buffer holds rank 0 until rank 1 receives it, at 11. */
START_TEST(send_releases_cost_their_wait) {
  loom_schedule s;
  loom_error err = {0};
  const loom_action_costs costs = {unit_cost, slow_flight, NULL};
  ck_assert_int_eq(loom_schedule_build(&s, LOOM_SCHEDULE_1F1B, 2, 1, 4, &err), LOOM_OK);
  ck_assert_double_eq(forward_start(&s, &costs, 0, 1), 1.0);
  const int send = find(&s, 0, LOOM_ACT_SEND_ACT, 0);
  int release = -1;
  for (int e = s.event_at[0][send]; e < s.event_at[0][s.count[0]] && release < 0; e++) {
    const loom_buffer_event *b = &s.events[0][e];
    if (b->kind == LOOM_BUFFER_SEND && !b->acquire && b->mb == 0 && !b->grad) release = e;
  }
  ck_assert_int_ge(release, s.event_at[0][send + 1]); /* given back later than the send itself */
  move_event(&s, 0, release, send);
  ck_assert_double_eq(forward_start(&s, &costs, 0, 1), 11.0);
  loom_schedule_free(&s);
}
END_TEST

/* How many shapes of this kind (pp 2..8, vpp 1..3, m 1..16) fail under
 * `model`, of *shapes built; *why gets the reason at (p, v, m) = at, or
 * with at NULL the first failure's. */
static int failures(loom_schedule_kind kind, const loom_send_model *model, const int at[3], char *why, size_t n,
                    int *shapes) {
  int bad = 0;
  *shapes = 0;
  for (int p = 2; p <= 8; p++)
    for (int v = 1; v <= 3; v++)
      for (int m = 1; m <= 16; m++) {
        char problem[256];
        if (loom_schedule_shape_problem(kind, p, v, m, problem, sizeof problem)) continue;
        loom_schedule s;
        loom_error err = {0};
        ck_assert_int_eq(loom_schedule_build(&s, kind, p, v, m, &err), LOOM_OK);
        loom_schedule_report rep;
        const bool failed = loom_schedule_verify_sends(&s, model, &rep) != LOOM_OK;
        if (at ? p == at[0] && v == at[1] && m == at[2] : failed && !bad)
          snprintf(why, n, "p=%d v=%d m=%d: %.400s", p, v, m, failed ? rep.why : "verified");
        bad += failed;
        (*shapes)++;
        loom_schedule_report_free(&rep);
        loom_schedule_free(&s);
      }
  return bad;
}

/* Every training kind at pp 2..8, vpp 1..3, m 1..16 (the shapes each
 * kind takes) verifies under rendezvous sends, the semantics NCCL's
 * transfers have: a send completes only when its recv is posted, matched
 * in issue order per channel with no tags. */
START_TEST(every_schedule_verifies_with_rendezvous_sends) {
  const char *const *kinds = loom_schedule_train_kind_names();
  int nkinds = 0;
  for (; kinds[nkinds]; nkinds++) {
    loom_schedule_kind kind;
    ck_assert_int_eq(loom_cli_schedule_kind(kinds[nkinds], &kind), 0);
    char why[512] = "";
    int shapes;
    ck_assert_msg(failures(kind, &LOOM_SENDS_RENDEZVOUS, NULL, why, sizeof why, &shapes) == 0, "%s %s", kinds[nkinds], why);
    ck_assert_msg(shapes >= 78, "%s: %d shapes", kinds[nkinds], shapes);
  }
  ck_assert_int_eq(nkinds, 5); /* 1f1b, gpipe, interleaved, zb_h1, zb_v */
}
END_TEST

/* Moves rank r's action `from`, with its buffer events, to index `to`. */
static void move_action(loom_schedule *s, int r, int from, int to) {
  const int n = s->count[r], events = s->event_at[r][n];
  loom_action *acts = malloc((size_t)n * sizeof *acts);
  loom_buffer_event *ev = malloc((size_t)events * sizeof *ev);
  int *at = malloc(((size_t)n + 1) * sizeof *at);
  ck_assert(acts && ev && at);
  at[0] = 0;
  for (int k = 0; k < n; k++) {
    /* The action that lands at k. */
    const int i = k == to ? from : from < to ? (k >= from && k < to ? k + 1 : k) : (k > to && k <= from ? k - 1 : k);
    acts[k] = s->actions[r][i];
    const int count = s->event_at[r][i + 1] - s->event_at[r][i];
    memcpy(ev + at[k], s->events[r] + s->event_at[r][i], (size_t)count * sizeof *ev);
    at[k + 1] = at[k] + count;
  }
  memcpy(s->actions[r], acts, (size_t)n * sizeof *acts);
  memcpy(s->events[r], ev, (size_t)events * sizeof *ev);
  memcpy(s->event_at[r], at, ((size_t)n + 1) * sizeof *at);
  free(acts), free(ev), free(at);
}

/* The two ways a pipeline over NCCL broke before its transfers had
 * channels of their own, each seen to fail the verifier: all of a rank's
 * transfers on one stream, grouped up to each recv, deadlock interleaved
 * schedules (a send waits for its recv, and holds up the recvs queued
 * behind it); one channel per pair of ranks for both kinds of message
 * delivers ZB-V's messages to the wrong recvs (no tags to tell them apart). */
START_TEST(nccl_findings_fail_the_rendezvous_verifier) {
  const loom_send_model shared = {.name = "shared", .rendezvous = true, .shared_stream = true};
  const loom_send_model untyped = {.name = "untyped", .rendezvous = true};
  char why[512] = "";
  int shapes;
  ck_assert_int_gt(failures(LOOM_SCHEDULE_INTERLEAVED, &shared, (const int[]){2, 2, 4}, why, sizeof why, &shapes), 0);
  ck_assert_str_eq(why, "p=2 v=2 m=4: deadlock: rank 0: recv activation of micro-batch 2 chunk 1 from rank 1 waits; rank 1: recv "
                        "activation of micro-batch 3 chunk 0 from rank 0 waits;");
  /* The model tells schedules apart: 1F1B was clean even then. */
  ck_assert_int_eq(failures(LOOM_SCHEDULE_1F1B, &shared, (const int[]){2, 1, 4}, why, sizeof why, &shapes), 0);
  ck_assert_int_gt(failures(LOOM_SCHEDULE_ZB_V, &untyped, (const int[]){2, 2, 3}, why, sizeof why, &shapes), 0);
  ck_assert_str_eq(why, "p=2 v=2 m=3: rank 1: recv grad of micro-batch 0 chunk 1 from rank 0 would meet the activation of micro-batch 2 "
                        "to stage 1: sends between two ranks meet their recvs in issue order, without tags");
  /* loom_schedule_verify, which plans and runs go through, names the model that failed. */
  loom_schedule s;
  loom_error err = {0};
  ck_assert_int_eq(loom_schedule_build(&s, LOOM_SCHEDULE_1F1B, 2, 1, 2, &err), LOOM_OK);
  /* Rank 0 sends micro-batch 1's activation before micro-batch 0's: buffered
   * sends still match them by tag, rendezvous ones by order. */
  move_action(&s, 0, find(&s, 0, LOOM_ACT_SEND_ACT, 0), find(&s, 0, LOOM_ACT_SEND_ACT, 1));
  ck_assert_int_lt(find(&s, 0, LOOM_ACT_SEND_ACT, 1), find(&s, 0, LOOM_ACT_SEND_ACT, 0));
  loom_schedule_report rep;
  ck_assert_msg(loom_schedule_verify_sends(&s, &LOOM_SENDS_BUFFERED, &rep) == LOOM_OK, "%s", rep.why);
  loom_schedule_report_free(&rep);
  ck_assert_int_eq(loom_schedule_verify(&s, &rep), LOOM_ERR_RUNTIME);
  ck_assert_msg(strncmp(rep.why, "with rendezvous sends (NCCL's): ", 32) == 0, "%s", rep.why);
  loom_schedule_report_free(&rep);
  loom_schedule_free(&s);
}
END_TEST

/* 1F1B's shape: rank r warms up with min(p - r - 1, m) forwards. */
START_TEST(one_f_one_b_warmup) {
  loom_schedule s;
  loom_error err = {0};
  ck_assert_int_eq(loom_schedule_build(&s, LOOM_SCHEDULE_1F1B, 4, 1, 8, &err), LOOM_OK);
  for (int r = 0; r < 4; r++) {
    int forwards = 0;
    for (int i = 0; i < s.count[r] && s.actions[r][i].kind != LOOM_ACT_BACKWARD; i++)
      forwards += s.actions[r][i].kind == LOOM_ACT_FORWARD;
    ck_assert_int_eq(forwards, 4 - r - 1 + 1); /* warmup, then the steady state's first forward */
  }
  loom_schedule_free(&s);
}
END_TEST

int main(void) {
  Suite *s = suite_create("schedule");
  TCase *tc = tcase_create("schedule");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, every_schedule_verifies);
  tcase_add_test(tc, counted_shapes_match_built_schedules);
  tcase_add_test(tc, bad_requests_are_refused);
  tcase_add_test(tc, broken_schedules_are_caught);
  tcase_add_test(tc, one_f_one_b_warmup);
  tcase_add_test(tc, zero_bubble_schedules_verify);
  tcase_add_test(tc, v_shape_layout);
  tcase_add_test(tc, broken_split_backward_is_caught);
  tcase_add_test(tc, broken_buffer_events_are_caught);
  tcase_add_test(tc, send_releases_cost_their_wait);
  tcase_add_test(tc, every_schedule_verifies_with_rendezvous_sends);
  tcase_add_test(tc, nccl_findings_fail_the_rendezvous_verifier);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
