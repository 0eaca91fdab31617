/* Optimizer pieces: the LR schedule, clipping, where weight decay applies,
 * and gradient accumulation giving the same update for any split of the
 * global batch into micro-batches. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pipeline/trainer.h"
#include "data/addition.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "pipeline/executor_state.h" /* executor_keeps_to_its_events breaks a running schedule */
#include "test_util.h"

START_TEST(lr_warmup_then_cosine) {
  const loom_lr_schedule s = {.max_lr = 1.0f, .min_lr = 0.1f, .warmup_steps = 10, .total_steps = 110};
  ck_assert_float_eq_tol(loom_lr_at(&s, 0), 0.1f, 1e-7);
  ck_assert_float_eq_tol(loom_lr_at(&s, 4), 0.5f, 1e-7);
  ck_assert_float_eq_tol(loom_lr_at(&s, 9), 1.0f, 1e-7);
  ck_assert_float_eq_tol(loom_lr_at(&s, 10), 1.0f, 1e-6);
  ck_assert_float_eq_tol(loom_lr_at(&s, 59), 0.55f, 2e-2); /* halfway through the cosine */
  ck_assert_float_eq_tol(loom_lr_at(&s, 109), 0.1f, 1e-6);
  ck_assert_float_eq_tol(loom_lr_at(&s, 500), 0.1f, 1e-6);
  for (int i = 11; i < 110; i++) ck_assert(loom_lr_at(&s, i) <= loom_lr_at(&s, i - 1));
}
END_TEST

static loom_gpt_config small(void) {
  loom_gpt_config c = {.layers = 2, .hidden = 16, .heads = 2, .vocab = 256, .seq = 16, .norm_eps = 1e-5f};
  loom_gpt_config_finish(&c);
  return c;
}

/* Clipping scales grads to the max norm inside the update; decay skips biases and norm weights. */
/* WSD at every phase boundary, in each of its four annealing shapes:
 * 1000 steps, warmup 10, the last 200 annealing from 1.0 to 0.1. The
 * coefficients at a quarter, half and all of the annealing are worked out
 * here from Megatron-LM's formulas. */
START_TEST(lr_wsd_phases) {
  static const double QUARTER[4] = {1.681792830507429 - 1.0, 0.75, 0.8535533905932737, 0.5};  /* 2*0.5^0.25-1, ... */
  static const double HALF[4] = {0.41421356237309515, 0.5, 0.5, 0.29289321881345254};        /* 2*sqrt(0.5)-1, ... */
  for (int shape = LOOM_WSD_EXPONENTIAL; shape <= LOOM_WSD_MINUS_SQRT; shape++) {
    const loom_lr_schedule s = {.max_lr = 1.0f, .min_lr = 0.1f, .warmup_steps = 10, .total_steps = 1000,
                                .decay = LOOM_LR_WSD, .wsd_decay_steps = 200, .wsd_shape = (loom_wsd_shape)shape};
    ck_assert_float_eq_tol(loom_lr_at(&s, 0), 0.1f, 1e-7);   /* warmup's first step */
    ck_assert_float_eq_tol(loom_lr_at(&s, 9), 1.0f, 1e-7);   /* warmup's last */
    ck_assert_float_eq_tol(loom_lr_at(&s, 10), 1.0f, 1e-7);  /* stable from here */
    ck_assert_float_eq_tol(loom_lr_at(&s, 799), 1.0f, 1e-7); /* the last stable step: 999 - 200 */
    ck_assert_float_lt(loom_lr_at(&s, 800), 1.0f);           /* the annealing's first */
    ck_assert_float_eq_tol(loom_lr_at(&s, 849), (float)(0.1 + 0.9 * QUARTER[shape]), 1e-6);
    ck_assert_float_eq_tol(loom_lr_at(&s, 899), (float)(0.1 + 0.9 * HALF[shape]), 1e-6);
    ck_assert_float_eq_tol(loom_lr_at(&s, 999), 0.1f, 1e-6); /* min_lr at the run's last step */
    ck_assert_float_eq_tol(loom_lr_at(&s, 1200), 0.1f, 1e-6);
    for (int i = 801; i < 1000; i++) ck_assert(loom_lr_at(&s, i) < loom_lr_at(&s, i - 1));
  }
  ck_assert_str_eq(LOOM_LR_DECAY_NAMES[LOOM_LR_WSD], "WSD"); /* Megatron-LM's spelling */
  ck_assert_str_eq(LOOM_WSD_SHAPE_NAMES[LOOM_WSD_MINUS_SQRT], "minus_sqrt");
}
END_TEST

START_TEST(clipping_and_decay_follow_metadata) {
  const loom_gpt_config cfg = small();
  loom_gpt_params p;
  loom_adamw opt;
  ck_assert_int_eq(loom_gpt_params_init(&p, &cfg, 0, 1, NULL, &loom_host_memory), LOOM_OK);
  loom_gpt_params_randomize(&p, 1);
  loom_adamw_config oc = loom_adamw_defaults();
  oc.grad_clip = 1.0f;
  oc.weight_decay = 0.5f;
  ck_assert_int_eq(loom_adamw_init(&opt, &p, &oc), LOOM_OK);
  float *g = p.grads.base;
  for (size_t i = 0; i < p.grads.numel; i++) g[i] = 0.0f; /* zero grads: only decay moves weights */
  float *before = malloc(p.params.numel * sizeof(float));
  memcpy(before, p.params.base, p.params.numel * sizeof(float));
  loom_adamw_step(&opt, &p, 0.1f, 0.0, loom_ops_cpu());
  for (int i = 0; i < p.params.count; i++) {
    const loom_tensor *t = &p.params.views[i];
    const float *w = t->data, *w0 = before + loom_buffer_offset(&p.params, i);
    const int is_matrix = t->ndim == 2;
    ck_assert_int_eq(p.meta[i].weight_decay, is_matrix);
    for (size_t k = 0; k < loom_tensor_numel(t); k++) {
      const float want = is_matrix ? w0[k] * (1.0f - 0.1f * 0.5f) : w0[k];
      ck_assert_float_eq_tol(w[k], want, 1e-7);
    }
  }
  /* Clipping happens inside the update: a step on grads of norm N > clip
   * equals, bit for bit, a step without clipping on the grads scaled by
   * clip / N first; the grads themselves stay as they were. */
  for (size_t i = 0; i < p.grads.numel; i++) g[i] = (float)(i % 7) - 3.0f;
  const double norm = loom_grad_norm(&p, loom_ops_cpu(), NULL);
  ck_assert_double_gt(norm, 2.0 * oc.grad_clip);
  const float clip = loom_adamw_clip_scale(&oc, norm);
  ck_assert_float_eq(clip, (float)(oc.grad_clip / norm));
  ck_assert_float_eq(loom_adamw_clip_scale(&oc, 0.5 * oc.grad_clip), 1.0f);
  loom_gpt_params q;
  loom_adamw unclipped;
  loom_adamw_config none = oc;
  none.grad_clip = 0.0f;
  ck_assert_int_eq(loom_gpt_params_init(&q, &cfg, 0, 1, NULL, &loom_host_memory), LOOM_OK);
  ck_assert_int_eq(loom_adamw_init(&unclipped, &q, &none), LOOM_OK);
  memcpy(q.params.base, p.params.base, p.params.numel * sizeof(float));
  unclipped.step = opt.step;
  float *h = q.grads.base;
  for (size_t i = 0; i < q.grads.numel; i++) h[i] = g[i] * clip;
  loom_adamw_step(&opt, &p, 0.1f, norm, loom_ops_cpu());
  loom_adamw_step(&unclipped, &q, 0.1f, norm, loom_ops_cpu());
  ck_assert_mem_eq(p.params.base, q.params.base, p.params.numel * sizeof(float));
  ck_assert_mem_eq(opt.v.base, unclipped.v.base, p.params.numel * sizeof(float));
  ck_assert_double_eq(loom_grad_norm(&p, loom_ops_cpu(), NULL), norm);
  loom_adamw_free(&unclipped);
  loom_gpt_params_free(&q);
  free(before);
  loom_adamw_free(&opt);
  loom_gpt_params_free(&p);
}
END_TEST

static loom_lr_schedule schedule(int steps) {
  return (loom_lr_schedule){.max_lr = 1e-2f, .min_lr = 1e-3f, .warmup_steps = 2, .total_steps = steps};
}

/* Trains `steps` steps of global batch 8 split into micro-batches of `micro`
 * through the runtime, on one rank; returns the losses and leaves the final
 * weights in *weights (caller frees). */
static void train(int micro, int steps, float *losses, float **weights) {
  const loom_gpt_config cfg = small();
  const loom_plan_spec spec = {.model = cfg, .tp = 1, .pp = 1, .dp = 1, .vpp = 1, .micro_batch = micro,
                               .global_batch = 8, .schedule = LOOM_SCHEDULE_1F1B};
  loom_plan *plan;
  loom_error err = {0};
  ck_assert_msg(loom_plan_build(&spec, &plan, &err) == LOOM_OK, "%s", err.msg);
  loom_dataset *data = loom_dataset_addition(2, 5);
  const loom_trainer_options o = {.seed = 3, .weight_decay = loom_adamw_defaults().weight_decay,
                                  .grad_clip = loom_adamw_defaults().grad_clip, .lr = schedule(steps)};
  loom_trainer tr;
  ck_assert_msg(loom_trainer_init(&tr, NULL, plan, loom_ops_cpu(), data, &o, &err) == LOOM_OK, "%s", err.msg);
  for (int s = 0; s < steps; s++) losses[s] = loom_trainer_step(&tr, s).loss;
  const loom_gpt_params *p = &loom_pipeline_chunk(tr.pipe, 0)->p;
  *weights = malloc(p->params.numel * sizeof(float));
  memcpy(*weights, p->params.base, p->params.numel * sizeof(float));
  loom_trainer_free(&tr);
  loom_plan_free(plan);
  loom_dataset_free(data);
}

/* The same on the whole model with the tests' serial reference (no runtime). */
static void train_reference(int steps, float *losses, float **weights) {
  const loom_gpt_config cfg = small();
  loom_gpt m;
  loom_adamw opt;
  loom_dataset *data = loom_dataset_addition(2, 5);
  ck_assert_int_eq(loom_gpt_init(&m, &cfg, loom_ops_cpu(), 3, NULL), LOOM_OK);
  loom_gpt_set_batch_shape(&m, cfg.seq, 8);
  const loom_adamw_config oc = loom_adamw_defaults();
  loom_adamw_init(&opt, &m.p, &oc);
  tu_train_serial(&m, &opt, data, 8, schedule(steps), steps, losses, NULL);
  *weights = malloc(m.p.params.numel * sizeof(float));
  memcpy(*weights, m.p.params.base, m.p.params.numel * sizeof(float));
  loom_adamw_free(&opt);
  loom_gpt_free(&m);
  loom_dataset_free(data);
}

START_TEST(accumulation_is_split_invariant) {
  enum { STEPS = 5 };
  float l8[STEPS], l2[STEPS], l1[STEPS], ref[STEPS], *w8, *w2, *w1, *wr;
  train_reference(STEPS, ref, &wr);
  train(8, STEPS, l8, &w8);
  train(2, STEPS, l2, &w2);
  train(1, STEPS, l1, &w1);
  for (int s = 0; s < STEPS; s++) {
    ck_assert_msg(l8[s] == ref[s], "step %d: loss %g through the runtime, %g by the reference", s, (double)l8[s], (double)ref[s]);
    ck_assert_msg(fabs(l2[s] - l8[s]) <= 1e-5 * fabs(l8[s]), "step %d: loss %g (4 x 2) vs %g (1 x 8)", s, (double)l2[s], (double)l8[s]);
    ck_assert_msg(fabs(l1[s] - l8[s]) <= 1e-5 * fabs(l8[s]), "step %d: loss %g (8 x 1) vs %g (1 x 8)", s, (double)l1[s], (double)l8[s]);
  }
  const loom_gpt_config cfg = small();
  loom_gpt_params p;
  loom_gpt_params_init(&p, &cfg, 0, 1, NULL, &loom_host_memory);
  ck_assert_mem_eq(w8, wr, p.params.numel * sizeof(float));
  ck_assert_double_le(tu_max_abs_diff(w2, w8, p.params.numel), 1e-5);
  ck_assert_double_le(tu_max_abs_diff(w1, w8, p.params.numel), 1e-5);
  ck_assert(l8[STEPS - 1] < l8[0]);
  loom_gpt_params_free(&p);
  free(w8);
  free(w2);
  free(w1);
  free(wr);
}
END_TEST

/* The executor takes buffers only where its schedule's events say, and
 * holds no more than their verified peak: a schedule whose events were
 * changed after verification to keep micro-batch 0's slot past its backward
 * makes micro-batch 1's forward take a slot the pool does not have, and
 * the executor's check stops the run (SIGABRT) instead of running on. */
START_TEST(executor_keeps_to_its_events) {
  const loom_plan_spec spec = {.model = small(), .tp = 1, .pp = 1, .dp = 1, .vpp = 1, .micro_batch = 2, .global_batch = 8,
                               .schedule = LOOM_SCHEDULE_1F1B};
  loom_plan *plan;
  loom_error err = {0};
  ck_assert_msg(loom_plan_build(&spec, &plan, &err) == LOOM_OK, "%s", err.msg);
  loom_dataset *data = loom_dataset_addition(2, 5);
  const loom_trainer_options o = {.seed = 3, .lr = schedule(1)};
  loom_trainer tr;
  ck_assert_msg(loom_trainer_init(&tr, NULL, plan, loom_ops_cpu(), data, &o, &err) == LOOM_OK, "%s", err.msg);
  loom_schedule *s = &tr.sheet.schedule; /* the schedule the pipeline runs, broken on purpose */
  ck_assert_int_eq(tr.pipe->slots.cap[0], 1); /* one micro-batch at a time on one stage */
  int dropped = -1;
  for (int e = 0; e < s->event_at[0][s->count[0]] && dropped < 0; e++)
    if (s->events[0][e].kind == LOOM_BUFFER_SLOT && !s->events[0][e].acquire && s->events[0][e].mb == 0) dropped = e;
  ck_assert_int_ge(dropped, 0);
  const int n = s->event_at[0][s->count[0]];
  memmove(&s->events[0][dropped], &s->events[0][dropped + 1], (size_t)(n - dropped - 1) * sizeof s->events[0][0]);
  for (int i = 0; i <= s->count[0]; i++)
    if (s->event_at[0][i] > dropped) s->event_at[0][i]--;
  loom_trainer_step(&tr, 0); /* aborts at micro-batch 1's forward */
}
END_TEST

/* A device allocation that fails is a status, not an abort: with each of a
 * run's allocations failing in turn (a recording allocator's), building the
 * run returns LOOM_ERR_NOMEM with a message naming that buffer and its size,
 * and freeing what was built gives every other allocation back. In bf16
 * with two micro-batches in flight, so the bf16 copy, the slots' bf16 tables
 * and the receive staging are among them. */
START_TEST(allocation_failures_are_statuses) {
  loom_gpt_config model = small();
  const loom_plan_spec spec = {.model = model, .tp = 1, .pp = 1, .dp = 1, .vpp = 1, .micro_batch = 2, .global_batch = 4,
                               .schedule = LOOM_SCHEDULE_1F1B, .precision = LOOM__PRECISION__PRECISION_BF16};
  loom_plan *plan;
  loom_error err = {0};
  ck_assert_msg(loom_plan_build(&spec, &plan, &err) == LOOM_OK, "%s", err.msg);
  loom_dataset *data = loom_dataset_addition(2, 5);
  const loom_trainer_options o = {.seed = 3, .lr = schedule(1)};
  int failed = 0;
  for (int k = 1;; k++) {
    tu_recorder rec;
    loom_ops ops;
    tu_recorder_init(&rec, loom_ops_cpu(), &ops);
    rec.fail_at = k;
    loom_trainer tr;
    err = (loom_error){0};
    const loom_status st = loom_trainer_init(&tr, NULL, plan, &ops, data, &o, &err);
    const bool built = st == LOOM_OK;
    if (!built) {
      ck_assert_int_ge(rec.count, k);
      const tu_allocation *x = &rec.rows[k - 1];
      char want[160];
      snprintf(want, sizeof want, "out of memory for %s (%zu bytes) ", x->what, x->bytes);
      ck_assert_msg(st == LOOM_ERR_NOMEM && strncmp(err.msg, want, strlen(want)) == 0,
                    "allocation %d (%s, %zu bytes) failing gave status %d: %s", k, x->what, x->bytes, (int)st, err.msg);
      failed++;
    }
    loom_trainer_free(&tr);
    for (int i = 0; i < rec.count; i++)
      ck_assert_msg(!rec.rows[i].held, "allocation %d (%s) still held after allocation %d failed", i + 1, rec.rows[i].what, k);
    tu_recorder_free(&rec);
    if (built) break;
  }
  ck_assert_int_ge(failed, 10); /* parameters, grads, bf16 weights, Adam, slots and their tokens, scratch, transfers */
  loom_dataset_free(data);
  loom_plan_free(plan);
}
END_TEST

int main(void) {
  Suite *s = suite_create("optim");
  TCase *tc = tcase_create("optim");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, lr_warmup_then_cosine);
  tcase_add_test(tc, lr_wsd_phases);
  tcase_add_test(tc, clipping_and_decay_follow_metadata);
  tcase_add_test(tc, accumulation_is_split_invariant);
  tcase_add_test(tc, allocation_failures_are_statuses);
  tcase_add_test_raise_signal(tc, executor_keeps_to_its_events, SIGABRT);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
