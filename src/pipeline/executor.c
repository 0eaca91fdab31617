/* Running a schedule: slots, transfers, grad reductions and the step. */
#include <math.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include "core/check.h"
#include "core/fault.h"
#include "core/timer.h"
#include "pipeline/executor_state.h"
#include "pipeline/grad_sync.h"
#include "layers/run_buffers.h"
#include "plan/rank_sheet.h"
#include "schedule/verify.h"
#include "tensor_parallel/mappings.h"

static int stage_of(const loom_pipeline *pipe, int chunk) { return loom_virtual_stage(pipe->sched, pipe->ps->pp_rank, chunk); }
/* The chunk of this rank holding stage `stage`, or -1. */
int loom_pipeline_chunk_holding(const loom_pipeline *pipe, int stage) {
  int rank, chunk;
  loom_stage_place(pipe->sched->v_shape, pipe->ps->pp, stage, &rank, &chunk);
  return rank == pipe->ps->pp_rank ? chunk : -1;
}
static size_t act_floats(const loom_pipeline *pipe) {
  return loom_gpt_boundary_floats(&pipe->chunks[0].p.cfg, pipe->T, pipe->B, pipe->tp.size, pipe->tp.sequence_parallel);
}

static void hook_before(void *ctx, loom_gpt *m, bool backward, int layer);
static void hook_after(void *ctx, loom_gpt *m, bool backward, int layer);

/* Each chunk's layers with the sheet's slots and weight-grad states (the memory model's counts; evaluation keeps to
 * them too). */
static loom_status build_chunks(loom_pipeline *pipe, const loom_rank_sheet *sheet, const loom_ops *ops, uint64_t seed,
                                int zero_dp) {
  loom_status st = LOOM_OK;
  pipe->chunks = loom_xcalloc((size_t)pipe->v, sizeof *pipe->chunks, "chunks");
  for (int c = 0; c < pipe->v && st == LOOM_OK; c++) {
    const loom_sheet_chunk *k = &sheet->chunk[c];
    st = loom_gpt_init_stage(&pipe->chunks[c], &sheet->model, ops, seed, &pipe->tp, &k->range, k->recompute, zero_dp,
                             sheet->zero_stage);
    pipe->chunks[c].hooks = (loom_gpt_hooks){.ctx = pipe, .before = hook_before, .after = hook_after};
    if (st == LOOM_OK) st = loom_gpt_set_slots(&pipe->chunks[c], sheet->seq, sheet->micro_batch, k->slots);
    if (st == LOOM_OK && k->weight_states) st = loom_gpt_set_weight_states(&pipe->chunks[c], k->weight_states);
    if (st == LOOM_OK) pipe->chunks[c].w.block.ring.log = &pipe->ring_log;
  }
  return st;
}

/* What crosses data parallelism beside the grads: their bf16 twins, and grad compression's state. */
static loom_status build_dp(loom_pipeline *pipe, const loom_rank_sheet *sheet, const loom_ops *ops, uint64_t seed,
                            loom_error *err) {
  pipe->grads_bf16 = sheet->grad_dtype == LOOM_DTYPE_BF16;
  if (pipe->grads_bf16 && pipe->zero_stage < 2) { /* ZeRO-2/3's runtime keeps its own, a layer at a time */
    pipe->grad16 = loom_xcalloc((size_t)pipe->v, sizeof *pipe->grad16, "bf16 grads");
    for (int c = 0; c < pipe->v; c++) { /* ZeRO-1 pads */
      const size_t bytes = pipe->chunks[c].p.grads.capacity * sizeof(uint16_t);
      pipe->grad16[c] = loom_zalloc(ops->mem, bytes, loom_run_buffer_name(LOOM_BUF_GRAD_BF16));
      if (!pipe->grad16[c]) return loom_fail_nomem(err, "on pipeline stage %d", pipe->ps->pp_rank);
    }
  }
  if (sheet->compression.kind == LOOM__COMPRESSION_KIND__COMPRESSION_NONE) return LOOM_OK;
  pipe->compress = loom_xcalloc((size_t)pipe->v, sizeof *pipe->compress, "grad compression");
  loom_status st = LOOM_OK;
  for (int c = 0; c < pipe->v && st == LOOM_OK; c++)
    st = loom_grad_compress_init(&pipe->compress[c], &sheet->compression, &pipe->chunks[c].p, seed, ops);
  if (st != LOOM_OK) return loom_fail_nomem(err, "on pipeline stage %d", pipe->ps->pp_rank);
  return LOOM_OK;
}

static loom_status build(loom_pipeline *pipe, const loom_parallel *ps, const loom_rank_sheet *sheet, const loom_ops *ops,
                         uint64_t seed, size_t bucket_bytes, int zero_dp, loom_error *err) {
  LOOM_CHECK(ps->tp == sheet->size.tp && ps->pp == sheet->size.pp && ps->dp == sheet->size.dp && ps->cp == sheet->size.cp &&
                 ps->pp_rank == sheet->at.pp,
             "the grid is the sheet's");
  const int T = sheet->seq, B = sheet->micro_batch;
  pipe->ps = ps;
  pipe->sheet = sheet;
  pipe->tp = loom_tp_of(ps);
  pipe->v = sheet->chunks;
  pipe->S = ps->pp * pipe->v;
  pipe->m = sheet->micro_batches;
  pipe->zero_stage = sheet->zero_stage;
  pipe->bucket_bytes = bucket_bytes;
  pipe->T = T;
  pipe->B = B;
  pipe->sched = &sheet->schedule;
  loom_status st = build_chunks(pipe, sheet, ops, seed, zero_dp);
  if (st == LOOM_OK) {
    int nslots[LOOM_PLAN_MAX_CHUNKS], nwstates[LOOM_PLAN_MAX_CHUNKS];
    for (int c = 0; c < pipe->v; c++) nslots[c] = sheet->chunk[c].slots, nwstates[c] = sheet->chunk[c].weight_states;
    loom_pool_init(&pipe->slots, pipe->v, nslots, pipe->m);
    loom_pool_init(&pipe->wstates, pipe->v, nwstates, pipe->m);
  }
  if (st == LOOM_OK) {
    pipe->mem = ops->mem;
    st = loom_p2p_init(&pipe->p2p, ps->pp_group, ops, act_floats(pipe), sheet->model.bf16, ps->pp, pipe->v,
                       pipe->sched->v_shape, pipe->m, sheet->sends);
  }
  if (st == LOOM_OK && !(pipe->dout = loom_zalloc(ops->mem, act_floats(pipe) * sizeof(float), loom_run_buffer_name(LOOM_BUF_DOUT))))
    st = LOOM_ERR_NOMEM;
  if (st == LOOM_ERR_NOMEM) return loom_fail_nomem(err, "building pipeline stage %d", ps->pp_rank);
  if (st != LOOM_OK) return st;
  const size_t blocks = (size_t)loom_gpt_blocks(&sheet->model);
  pipe->bucket_req = loom_xcalloc(3 * (blocks + 1), sizeof *pipe->bucket_req, "bucket requests");
  pipe->bucket_at = loom_xcalloc(12 * (blocks + 1), sizeof *pipe->bucket_at, "bucket ranges");
  st = build_dp(pipe, sheet, ops, seed, err);
  if (st != LOOM_OK) return st;
  pipe->tokens = loom_xmalloc((size_t)T * B * sizeof(int), "tokens");
  pipe->targets = loom_xmalloc((size_t)T * B * sizeof(int), "targets");
  pipe->pred = loom_xmalloc((size_t)T * B * sizeof(int), "predictions");
  if (ps->cp > 1) { /* this rank's rows of them */
    const size_t rows = (size_t)loom_gpt_local_seq(&sheet->model, T);
    pipe->local_tokens = loom_xmalloc(rows * B * sizeof(int), "tokens");
    pipe->local_targets = loom_xmalloc(rows * B * sizeof(int), "targets");
    pipe->local_pred = loom_xmalloc(rows * B * sizeof(int), "predictions");
    /* multi-token prediction: each depth's tokens ahead and targets, shifted along the whole sequence, then this rank's rows */
    const size_t D = (size_t)sheet->model.mtp_layers;
    pipe->mtp = D ? loom_xmalloc(2 * D * ((size_t)T + rows) * B * sizeof(int), "MTP tokens") : NULL;
  }
  return LOOM_OK;
}

loom_status loom_pipeline_new(loom_pipeline **out, const loom_parallel *ps, const loom_rank_sheet *sheet, const loom_ops *ops,
                              uint64_t seed, size_t bucket_bytes, int zero_dp, loom_error *err) {
  loom_pipeline *pipe = loom_xcalloc(1, sizeof *pipe, "pipeline");
  const loom_status st = build(pipe, ps, sheet, ops, seed, bucket_bytes, zero_dp, err);
  if (st != LOOM_OK) loom_pipeline_free(pipe), pipe = NULL;
  *out = pipe;
  return st;
}

int loom_pipeline_chunk_count(const loom_pipeline *pipe) { return pipe->v; }
loom_gpt *loom_pipeline_chunk(const loom_pipeline *pipe, int c) {
  LOOM_CHECK(c >= 0 && c < pipe->v, "a chunk this rank holds");
  return &pipe->chunks[c];
}
int loom_pipeline_micro_batches(const loom_pipeline *pipe) { return pipe->m; }
const loom_schedule *loom_pipeline_schedule(const loom_pipeline *pipe) { return pipe->sched; }
const loom_compression *loom_pipeline_compression(const loom_pipeline *pipe) {
  return pipe->compress ? &pipe->compress[0].cfg : NULL;
}

loom_grad_compress *loom_pipeline_compression_state(const loom_pipeline *pipe, int c) {
  return pipe->compress ? &pipe->compress[c] : NULL;
}
uint16_t *loom_pipeline_grad16(const loom_pipeline *pipe, int c) { return pipe->grad16 ? pipe->grad16[c] : NULL; }
void loom_pipeline_set_tracing(loom_pipeline *pipe, bool on) { pipe->tracing = on; }
loom_pipeline_usage loom_pipeline_usage_of(const loom_pipeline *pipe) {
  return (loom_pipeline_usage){.slots = pipe->slots.most, .weight_states = pipe->wstates.most, .p2p_bytes = pipe->p2p.bytes_sent};
}

loom_status loom_pipeline_use_zero(loom_pipeline *pipe, loom_zero *zero) {
  if (pipe->zero_stage < 2) return LOOM_OK;
  pipe->zero = loom_xcalloc((size_t)pipe->v, sizeof *pipe->zero, "ZeRO runtimes");
  loom_status st = LOOM_OK;
  for (int c = 0; c < pipe->v && st == LOOM_OK; c++)
    st = loom_zero_runtime_init(&pipe->zero[c], &zero[c], &pipe->chunks[c], pipe->grads_bf16);
  return st;
}

size_t loom_pipeline_transient_bytes(const loom_pipeline *pipe) {
  size_t bytes = 0;
  for (int c = 0; pipe->zero && c < pipe->v; c++) bytes += pipe->zero[c].transient_bytes;
  return bytes;
}

void loom_pipeline_free(loom_pipeline *pipe) {
  if (!pipe) return;
  for (int c = 0; pipe->zero && c < pipe->v; c++) loom_zero_runtime_free(&pipe->zero[c]);
  free(pipe->zero);
  for (int c = 0; pipe->chunks && c < pipe->v; c++) loom_gpt_free(&pipe->chunks[c]);
  free(pipe->chunks);
  loom_pool_free(&pipe->slots);
  loom_pool_free(&pipe->wstates);
  loom_p2p_free(&pipe->p2p);
  if (pipe->dout) pipe->mem->release(pipe->mem, pipe->dout);
  free(pipe->tokens);
  free(pipe->targets);
  free(pipe->local_tokens);
  free(pipe->local_targets);
  free(pipe->local_pred);
  free(pipe->mtp);
  free(pipe->pred);
  free(pipe->trace);
  loom_ring_log_free(&pipe->ring_log);
  free(pipe->bucket_req);
  free(pipe->bucket_at);
  for (int c = 0; pipe->grad16 && c < pipe->v; c++) pipe->mem->release(pipe->mem, pipe->grad16[c]);
  free(pipe->grad16);
  for (int c = 0; pipe->compress && c < pipe->v; c++) loom_grad_compress_free(&pipe->compress[c]);
  free(pipe->compress);
  loom_schedule_free(&pipe->eval_sched);
  free(pipe);
}

/* The model's hooks: ZeRO-2/3's gathers and reduce-scatters, and the
 * buckets of a chunk's last backward. */
static void hook_before(void *ctx, loom_gpt *m, bool backward, int layer) {
  loom_pipeline *pipe = ctx;
  if (pipe->zero) loom_zero_runtime_before(&pipe->zero[m - pipe->chunks], backward, layer);
}

static void hook_after(void *ctx, loom_gpt *m, bool backward, int layer) {
  loom_pipeline *pipe = ctx;
  if (pipe->zero) loom_zero_runtime_after(&pipe->zero[m - pipe->chunks], backward, layer);
  if (backward && layer >= 0 && pipe->final_backward) loom_grad_sync_layer_done(pipe, m, layer);
}

static void trace_event(loom_pipeline *pipe, const loom_action *a, int i, double t0, double t1) {
  if (pipe->trace_count == pipe->trace_cap) {
    pipe->trace_cap = pipe->trace_cap ? 2 * pipe->trace_cap : 256;
    pipe->trace = realloc(pipe->trace, (size_t)pipe->trace_cap * LOOM_TRACE_FIELDS * sizeof *pipe->trace);
    LOOM_CHECK(pipe->trace != NULL, "out of memory tracing");
  }
  int64_t *e = pipe->trace + (size_t)pipe->trace_count++ * LOOM_TRACE_FIELDS;
  e[0] = a->kind, e[1] = a->mb, e[2] = a->chunk, e[3] = llround(t0 * 1e9), e[4] = llround(t1 * 1e9), e[5] = i;
}

/* Takes (acquire) or gives back the buffers action i of schedule s names:
 * the only places the executor's buffers change hands. */
static void apply_events(loom_pipeline *pipe, const loom_schedule *s, int i, bool acquire) {
  const int r = pipe->ps->pp_rank;
  for (int e = s->event_at[r][i]; e < s->event_at[r][i + 1]; e++) {
    const loom_buffer_event *x = &s->events[r][e];
    if (x->acquire != acquire) continue;
    if (x->kind == LOOM_BUFFER_SEND) {
      if (acquire) loom_p2p_acquire(&pipe->p2p, x->grad, x->chunk, x->mb);
      else loom_p2p_release(&pipe->p2p, x->grad, x->chunk, x->mb);
      continue;
    }
    loom_buffer_pool *pool = x->kind == LOOM_BUFFER_SLOT ? &pipe->slots : &pipe->wstates;
    if (acquire) loom_pool_take(pool, x->chunk, x->mb);
    else loom_pool_return(pool, x->chunk, x->mb);
  }
}

/* What one run of an action list needs beyond the pipeline: the schedule,
 * whether it trains (dropout, grads, slots held until backward) and where
 * its micro-batches start. */
typedef struct {
  const loom_schedule *sched;
  bool train;
  int step;
  int64_t sample_offset; /* global index of micro-batch 0's first sample */
  int first_mb;          /* the feed's index of micro-batch 0 (an evaluation's later rounds) */
  float dloss;           /* grad of the mean loss per scored target (training) */
  int64_t *tally;        /* forward-only with a score hook: problems, correct */
} run_spec;

typedef struct {
  double loss_sum; /* over the last stage's scored targets */
  int64_t scored;  /* targets fed to the last stage (forward-only) */
  double norm, compute, wait, dp_wait;
} run_totals;

/* One action as its handler sees it. */
typedef struct {
  loom_pipeline *pipe;
  const loom_pipeline_hooks *hooks;
  const run_spec *spec;
  const loom_action *a;
  loom_gpt *m;           /* the action's chunk, NULL for a step-wide action */
  int stage;             /* its virtual stage, -1 for a step-wide action */
  int slot;              /* the activation slot its events hold for it, -1 if none */
  const loom_gpt_batch *batch;
  run_totals *out;
} act;

static void on_recv_act(act *x) { loom_p2p_recv(&x->pipe->p2p, false, x->a->mb, x->stage, x->m->slots[x->slot].x0, x->a->peer); }

/* Context parallelism: whether this rank holds chunks of each sequence, and the global positions of its rows
 * (the model's, every chunk's alike). */
static bool split_sequence(const loom_pipeline *pipe) { return pipe->ps->cp > 1; }
static const int *row_positions(const loom_pipeline *pipe) { return pipe->chunks[0].cp_pos; }

/* This rank's rows of the micro-batch just fed (its row t is the
 * sequence's row at row_positions[t]); returns how many of their targets
 * are scored. */
static int64_t take_local_rows(loom_pipeline *pipe) {
  const int rows = pipe->T / pipe->ps->cp, B = pipe->B, D = pipe->chunks[0].p.cfg.mtp_layers;
  const int *pos = row_positions(pipe);
  const size_t whole = (size_t)pipe->T * B, local = (size_t)rows * B;
  int *mtp_whole = pipe->mtp ? pipe->mtp + 2 * (size_t)D * local : NULL; /* [D] tokens ahead, then [D] targets */
  for (int k = 0; k < D; k++)
    loom_mtp_shift(pipe->tokens, pipe->targets, pipe->T, B, k, mtp_whole + k * whole, mtp_whole + (D + k) * whole);
  int64_t scored = 0;
  for (int t = 0; t < rows; t++)
    for (int b = 0; b < B; b++) {
      const size_t from = (size_t)pos[t] * B + b, to = (size_t)t * B + b;
      pipe->local_tokens[to] = pipe->tokens[from];
      pipe->local_targets[to] = pipe->targets[from];
      scored += pipe->targets[from] >= 0;
      for (int k = 0; k < 2 * D; k++) pipe->mtp[k * local + to] = mtp_whole[k * whole + from];
    }
  return scored;
}

/* The greedy predictions of every rank's rows, in pred: each cp rank's
 * placed at their positions, then summed over the cp group (collective). */
static void gather_predictions(loom_pipeline *pipe) {
  const int rows = pipe->T / pipe->ps->cp, B = pipe->B;
  const int *pos = row_positions(pipe);
  memset(pipe->pred, 0, (size_t)pipe->T * B * sizeof(int));
  for (int t = 0; t < rows; t++)
    memcpy(pipe->pred + (size_t)pos[t] * B, pipe->local_pred + (size_t)t * B, (size_t)B * sizeof(int));
  loom_comm_allreduce_typed(pipe->ps->cp_group, pipe->pred, (size_t)pipe->T * B, LOOM_DTYPE_I32, LOOM_REDUCE_SUM);
}

static void on_forward(act *x) {
  loom_pipeline *pipe = x->pipe;
  const run_spec *spec = x->spec;
  loom_gpt *m = x->m;
  const int64_t counted = x->hooks->feed(x->hooks->ctx, spec->first_mb + x->a->mb, pipe->tokens, pipe->targets);
  const int64_t mine = split_sequence(pipe) ? take_local_rows(pipe) : counted; /* the targets this rank's loss is over */
  const float loss = loom_gpt_stage_forward(m, x->slot, x->batch, m->slots[x->slot].x0);
  if (m->p.range.last) {
    x->out->loss_sum += (double)loss * (double)mine;
    x->out->scored += counted;
  }
  double slow_ms;
  if (spec->train && loom_fault_fires(LOOM_FAULT_SLOW, spec->step + 1, &slow_ms)) { /* a throttled device */
    const double s = slow_ms / 1000.0;
    const struct timespec nap = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&nap, NULL);
  }
  if (spec->train || !m->p.range.last || !x->hooks->score) return;
  loom_gpt_predict(m, split_sequence(pipe) ? pipe->local_pred : pipe->pred);
  if (split_sequence(pipe)) gather_predictions(pipe);
  x->hooks->score(x->hooks->ctx, pipe->tokens, pipe->targets, pipe->pred, spec->tally);
}

static void on_send_act(act *x) {
  loom_p2p_send(&x->pipe->p2p, false, x->a->chunk, x->a->mb, loom_gpt_stage_output(x->m, x->slot), x->a->peer, x->stage + 1);
}

static void on_recv_grad(act *x) { loom_p2p_recv(&x->pipe->p2p, true, x->a->mb, x->stage, x->pipe->dout, x->a->peer); }

/* A whole backward, or a split one's weight half: both end the micro-batch's
 * backward on this chunk, and under data parallelism the chunk's grads are
 * final after its last one. */
static void on_backward(act *x) {
  loom_pipeline *pipe = x->pipe;
  loom_gpt *m = x->m;
  pipe->final_backward = x->a->mb == pipe->m - 1 && loom_grad_sync_buckets(pipe);
  if (x->a->kind == LOOM_ACT_BACKWARD)
    loom_gpt_stage_backward(m, x->slot, x->batch, m->p.range.last ? NULL : pipe->dout, x->spec->dloss);
  else loom_gpt_stage_backward_weight(m, x->slot, loom_pool_held(&pipe->wstates, x->a->chunk, x->a->mb), x->batch);
  pipe->final_backward = false;
}

static void on_backward_input(act *x) {
  loom_pipeline *pipe = x->pipe;
  const int wstate = loom_pool_held(&pipe->wstates, x->a->chunk, x->a->mb);
  loom_gpt_stage_backward_input(x->m, x->slot, wstate, x->batch, x->m->p.range.last ? NULL : pipe->dout, x->spec->dloss);
}

static void on_send_grad(act *x) {
  loom_p2p_send(&x->pipe->p2p, true, x->a->chunk, x->a->mb, x->m->slots[x->slot].dx0, x->a->peer, x->stage - 1);
}

static void on_reduce_tied(act *x) { loom_grad_sync_tied(x->pipe); }
static void on_reduce_dp(act *x) { x->out->dp_wait = loom_grad_sync_dp(x->pipe); }

static void on_optimizer_step(act *x) {
  for (int c = 0; c < x->pipe->v; c++) loom_gpt_sync_replicated_grads(&x->pipe->chunks[c]);
  x->out->norm = x->hooks->optimizer_step(x->hooks->ctx, x->pipe);
}

/* Each action kind's handler, by loom_action_kind. */
static void (*const HANDLERS[])(act *) = {
    [LOOM_ACT_FORWARD] = on_forward,           [LOOM_ACT_BACKWARD] = on_backward,
    [LOOM_ACT_RECV_ACT] = on_recv_act,         [LOOM_ACT_SEND_ACT] = on_send_act,
    [LOOM_ACT_RECV_GRAD] = on_recv_grad,       [LOOM_ACT_SEND_GRAD] = on_send_grad,
    [LOOM_ACT_REDUCE_TIED] = on_reduce_tied,   [LOOM_ACT_REDUCE_DP] = on_reduce_dp,
    [LOOM_ACT_OPTIMIZER_STEP] = on_optimizer_step, [LOOM_ACT_BACKWARD_INPUT] = on_backward_input,
    [LOOM_ACT_BACKWARD_WEIGHT] = on_backward,
};
_Static_assert(sizeof HANDLERS / sizeof HANDLERS[0] == LOOM_ACT_BACKWARD_WEIGHT + 1, "a handler for every action kind");

/* Runs this rank's actions of a verified schedule, adding to *totals;
 * buffers change hands at the schedule's events alone. */
static void run_actions(loom_pipeline *pipe, const loom_pipeline_hooks *hooks, const run_spec *spec, run_totals *totals) {
  const loom_parallel *ps = pipe->ps;
  const loom_schedule *sched = spec->sched;
  const int r = ps->pp_rank;
  const bool tracing = pipe->tracing && spec->train;
  run_totals out = *totals; /* an evaluation's rounds add up in one running sum, in micro-batch order */
  loom_pool_reset(&pipe->slots);
  loom_pool_reset(&pipe->wstates);
  loom_p2p_reset(&pipe->p2p);
  if (tracing) {
    pipe->trace_count = 0;
    loom_comm_barrier(ps->world_group); /* one start line for every rank's clock */
  }
  const double start = loom_now_s();
  pipe->ring_log = (loom_ring_log){.on = tracing, .origin = start, .spans = pipe->ring_log.spans, .cap = pipe->ring_log.cap};
  for (int i = 0; i < sched->count[r]; i++) {
    const loom_action *a = &sched->actions[r][i];
    const double t0 = loom_now_s() - start;
    apply_events(pipe, sched, i, true);
    const size_t local_mtp = (size_t)pipe->chunks[0].p.cfg.mtp_layers * (pipe->T / pipe->ps->cp) * pipe->B;
    const loom_gpt_batch batch = {.tokens = split_sequence(pipe) ? pipe->local_tokens : pipe->tokens,
                                  .targets = split_sequence(pipe) ? pipe->local_targets : pipe->targets,
                                  .mtp_tokens = pipe->mtp, .mtp_targets = pipe->mtp ? pipe->mtp + local_mtp : NULL,
                                  .sample_offset = spec->sample_offset + (int64_t)a->mb * pipe->B, .step = spec->step,
                                  .train = spec->train};
    act x = {.pipe = pipe, .hooks = hooks, .spec = spec, .a = a, .m = a->chunk >= 0 ? &pipe->chunks[a->chunk] : NULL,
             .stage = a->chunk >= 0 ? stage_of(pipe, a->chunk) : -1,
             .slot = loom_action_uses(a, LOOM_BUFFER_SLOT) ? loom_pool_held(&pipe->slots, a->chunk, a->mb) : -1, .batch = &batch,
             .out = &out};
    HANDLERS[a->kind](&x);
    apply_events(pipe, sched, i, false);
    const double t1 = loom_now_s() - start;
    if (loom_action_computes(a)) out.compute += t1 - t0;
    else if (!loom_action_uses(a, LOOM_BUFFER_SEND)) out.wait += t1 - t0; /* a send leaves at once */
    if (tracing) trace_event(pipe, a, i, t0, t1);
  }
  pipe->ring_log.on = false;
  *totals = out;
}

loom_pipeline_stats loom_pipeline_step(loom_pipeline *pipe, const loom_pipeline_hooks *hooks, int step,
                                       int64_t sample_offset) {
  const loom_parallel *ps = pipe->ps;
  /* The loss is the mean over every scored target of the global batch, all
   * data-parallel replicas' micro-batches included: count first. */
  int64_t scored = 0;
  for (int mb = 0; mb < pipe->m; mb++) scored += hooks->feed(hooks->ctx, mb, pipe->tokens, pipe->targets);
  loom_comm_allreduce_typed(ps->dp_group, &scored, 1, LOOM_DTYPE_I64, LOOM_REDUCE_SUM);
  pipe->overlapped = 0;
  for (int c = 0; c < pipe->v; c++) {
    loom_gpt_zero_grad(&pipe->chunks[c]);
    if (pipe->zero) loom_zero_zero_grad(pipe->zero[c].z);
    loom_gpt_sync_compute_weights(&pipe->chunks[c]); /* the master weights as the last step (or a load) left them */
  }
  const run_spec spec = {.sched = pipe->sched, .train = true, .step = step, .sample_offset = sample_offset,
                         .dloss = scored ? 1.0f / (float)scored : 0.0f};
  run_totals t = {0};
  run_actions(pipe, hooks, &spec, &t);
  /* The last stages know their replicas' losses (each cp rank its rows'); every rank reports the sum. */
  const bool last = loom_pipeline_chunk_holding(pipe, pipe->S - 1) >= 0;
  float loss = last ? (float)(scored ? t.loss_sum / (double)scored : 0.0) : 0.0f;
  loom_comm_allreduce(ps->pp_group, &loss, 1, LOOM_REDUCE_SUM);
  loom_comm_allreduce(ps->dp_cp_group, &loss, 1, LOOM_REDUCE_SUM);
  size_t grads = 0;
  for (int c = 0; c < pipe->v; c++) grads += pipe->chunks[c].p.grads.numel;
  return (loom_pipeline_stats){.loss = loss, .grad_norm = t.norm, .compute_s = t.compute, .wait_s = t.wait,
                               .dp_overlap = (double)pipe->overlapped / (double)grads, .dp_wait_s = t.dp_wait};
}

/* The forward-only schedule over m micro-batches (kept while m stays), verified. */
static loom_status eval_schedule(loom_pipeline *pipe, int m, loom_error *err) {
  if (pipe->eval_sched.count && pipe->eval_sched.m == m) return LOOM_OK;
  loom_schedule_free(&pipe->eval_sched);
  loom_status st = loom_schedule_build_eval(&pipe->eval_sched, pipe->sched->kind, pipe->ps->pp, pipe->v, m, err);
  if (st == LOOM_OK) {
    loom_schedule_report rep;
    st = loom_schedule_verify(&pipe->eval_sched, &rep);
    if (st != LOOM_OK) st = loom_fail(err, st, "the forward-only schedule failed verification: %s", rep.why);
    loom_schedule_report_free(&rep);
  }
  if (st == LOOM_OK) { /* room in the maps for m micro-batches; the buffers are training's */
    loom_pool_widen(&pipe->slots, m);
    loom_pool_widen(&pipe->wstates, m);
    loom_p2p_widen(&pipe->p2p, m);
  }
  return st;
}

/* Whether the built forward-only schedule needs no more buffers on any rank
 * than the memory model gave it for training: every rank asks of every
 * rank, so all pick the same rounds. */
static bool eval_fits(const loom_pipeline *pipe) {
  const loom_schedule *s = &pipe->eval_sched;
  for (int r = 0; r < s->p; r++) {
    if (loom_schedule_rank_peaks(s, r, -1).sends > pipe->sheet->rank_sends[r]) return false;
    for (int c = 0; c < pipe->v; c++)
      if (loom_schedule_rank_peaks(s, r, c).live > pipe->sheet->rank_slots[r * pipe->v + c]) return false;
  }
  return true;
}

/* Evaluation runs in rounds: the most micro-batches at once whose
 * forward-only schedule fits training's buffers on every rank (a pass over
 * one chunk per rank gets no reply that proves a send received, so a round
 * holds its sends to its end), so evaluating allocates nothing the memory
 * model does not count. Every rank reads the same schedules and counts, so
 * all choose the same rounds. */
static loom_status eval_round(loom_pipeline *pipe, int batches, int *round, loom_error *err) {
  if (pipe->eval_batches == batches) {
    *round = pipe->eval_round;
    return LOOM_OK;
  }
  if (batches < 1) return loom_fail(err, LOOM_ERR_USAGE, "evaluation needs at least one batch (got %d)", batches);
  for (int m = batches; m >= 1; m--) {
    const loom_status st = eval_schedule(pipe, m, err);
    if (st != LOOM_OK) return st;
    if (!eval_fits(pipe)) continue;
    pipe->eval_batches = batches, pipe->eval_round = *round = m;
    return LOOM_OK;
  }
  LOOM_CHECK(false, "one micro-batch of evaluation fits training's buffers");
  return LOOM_ERR_RUNTIME;
}

loom_status loom_pipeline_eval(loom_pipeline *pipe, const loom_pipeline_hooks *hooks, int batches, float *loss,
                               int64_t *tally, loom_error *err) {
  const loom_parallel *ps = pipe->ps;
  int round;
  loom_status st = eval_round(pipe, batches, &round, err);
  if (st != LOOM_OK) return st;
  int64_t local[2] = {0, 0};
  for (int c = 0; c < pipe->v; c++) loom_gpt_sync_compute_weights(&pipe->chunks[c]);
  run_totals t = {0};
  for (int first = 0; first < batches && st == LOOM_OK; first += round) {
    const int m = batches - first < round ? batches - first : round;
    st = eval_schedule(pipe, m, err);
    if (st != LOOM_OK) return st;
    const run_spec spec = {.sched = &pipe->eval_sched, .train = false, .tally = local, .first_mb = first,
                           .sample_offset = (int64_t)first * pipe->B};
    run_actions(pipe, hooks, &spec, &t);
  }
  const bool last = loom_pipeline_chunk_holding(pipe, pipe->S - 1) >= 0;
  float mean = last && t.scored ? (float)(t.loss_sum / (double)t.scored) : 0.0f;
  int64_t counts[2] = {last ? local[0] : 0, last ? local[1] : 0}; /* counts cross as integers, exact however many */
  if (ps->cp_group) loom_comm_allreduce(ps->cp_group, &mean, 1, LOOM_REDUCE_SUM); /* each cp rank's rows' loss; tallies alike */
  loom_comm_allreduce(ps->pp_group, &mean, 1, LOOM_REDUCE_SUM);
  loom_comm_allreduce_typed(ps->pp_group, counts, 2, LOOM_DTYPE_I64, LOOM_REDUCE_SUM);
  *loss = mean;
  if (tally) tally[0] = counts[0], tally[1] = counts[1];
  return LOOM_OK;
}
