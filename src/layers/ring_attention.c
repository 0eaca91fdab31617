/* Context parallelism's ring attention (see ring_attention.h). */
#include "layers/ring_attention.h"
#include <math.h>
#include <stdlib.h>
#include "backend/op_math.h"
#include "core/check.h"
#include "core/timer.h"

enum { RING_TAG_KV = 0x5249, RING_TAG_DKV = 0x5250 }; /* the cp group carries nothing else */

const char *const LOOM_RING_SPAN_NAMES[] = {"ring block", "ring wait", "ring grads home", "ring all-gather", NULL};

void loom_ring_log_free(loom_ring_log *log) {
  free(log->spans);
  *log = (loom_ring_log){0};
}

/* The clock for a span that starts now (0 when not tracing). */
static double tick(const loom_ring *r) { return r->log && r->log->on ? loom_now_s() : 0.0; }

/* A span from t0 to now, kept while tracing. */
static void note(const loom_ring *r, loom_ring_span_kind kind, double t0) {
  loom_ring_log *g = r->log;
  if (!g || !g->on) return;
  if (g->count == g->cap) {
    g->cap = g->cap ? 2 * g->cap : 256;
    g->spans = realloc(g->spans, (size_t)g->cap * 3 * sizeof *g->spans);
    LOOM_CHECK(g->spans != NULL, "out of memory tracing the ring");
  }
  int64_t *s = g->spans + 3 * (size_t)g->count++;
  s[0] = kind, s[1] = llround((t0 - g->origin) * 1e9), s[2] = llround((loom_now_s() - g->origin) * 1e9);
}

void loom_cp_positions(int cp, int rank, int T, int *pos) {
  for (int r = 0; r < T / cp; r++) pos[r] = loom_cp_position(cp, rank, T, r);
}

int loom_cp_runs(int cp, int rank, int T, int first, int rows, loom_cp_run runs[2]) {
  const int chunk = cp > 1 ? T / (2 * cp) : T, end = first + rows;
  int n = 0;
  for (int r = first; r < end && n < 2;) {
    const int stop = r < chunk && chunk < end ? chunk : end;
    runs[n++] = (loom_cp_run){.row = r - first, .rows = stop - r, .pos = cp > 1 ? loom_cp_position(cp, rank, T, r) : r};
    r = stop;
  }
  return n;
}


void loom_ring_pack_kv(const loom_ops *ops, float *kv, const float *qkv, int rows, const loom_attn_shape *s) {
  const size_t w3 = loom_attn_qkv_width(s), w = loom_attn_kv_width(s), q = (size_t)s->heads * s->head_dim;
  for (size_t i = 0; i < (size_t)rows * s->B; i++) ops->mem->copy(ops->mem, kv + i * w, qkv + i * w3 + q, w * sizeof(float));
}

void loom_ring_unpack_dkv(const loom_ops *ops, float *dqkv, const float *dkv, int rows, const loom_attn_shape *s) {
  const size_t w3 = loom_attn_qkv_width(s), w = loom_attn_kv_width(s), q = (size_t)s->heads * s->head_dim;
  for (size_t i = 0; i < (size_t)rows * s->B; i++) {
    float *d = dqkv + i * w3 + q;
    ops->add(ops, d, d, dkv + i * w, w);
  }
}

/* Posts the next block's transfer round the ring (from the previous rank into `into`, `from` to the next) and
 * hands it to the network, so that it moves while this rank computes. */
static void pass_on(const loom_ring *r, float *into, const float *from, size_t n, int tag, loom_request **recv,
                    loom_request **send) {
  const int cp = loom_comm_size(r->group), me = loom_comm_rank(r->group);
  *recv = loom_comm_irecv(r->group, into, n, (me - 1 + cp) % cp, tag);
  *send = loom_comm_isend(r->group, from, n, (me + 1) % cp, tag);
  loom_comm_flush(r->group);
}

static void settle(const loom_ring *r, loom_request *recv, loom_request *send) {
  loom_comm_wait(r->group, send);
  loom_comm_wait(r->group, recv);
}

/* Whether any of the n queries at q_pos sees any of the n keys at k_pos
 * (loom_attn_sees): under a sliding window a block wholly outside every
 * query's window is skipped. Each side is a few runs of consecutive
 * positions (a cp rank's chunks): a query run [qa, qb] sees a key run
 * [ka, kb] where ka <= qb and qa - kb <= window. */
static bool block_seen(const loom_attn_shape *s, const int *q_pos, const int *k_pos, int n) {
  if (s->window <= 0) return true;
  for (int i = 0; i < n;) {
    int qe = i + 1;
    while (qe < n && q_pos[qe] == q_pos[qe - 1] + 1) qe++;
    for (int j = 0; j < n;) {
      int ke = j + 1;
      while (ke < n && k_pos[ke] == k_pos[ke - 1] + 1) ke++;
      if (k_pos[j] <= q_pos[qe - 1] && q_pos[i] - k_pos[ke - 1] <= s->window) return true;
      j = ke;
    }
    i = qe;
  }
  return false;
}

/* The all-gather variant: every rank's block at once into kv[1]; returns a block's floats. */
static size_t gather_blocks(const loom_ring *r, const loom_attn_shape *s) {
  const size_t n = (size_t)r->rows * s->B * loom_attn_kv_width(s);
  const double t = tick(r);
  loom_comm_allgather(r->group, r->kv[0], r->kv[1], n);
  note(r, LOOM_RING_GATHER, t);
  return n;
}

/* Then each block's share of the attention. */
static void gathered_forward(const loom_ops *ops, const loom_ring *r, float *out, float *lse, const float *qkv,
                             const loom_attn_shape *s, const loom_dropout *drop) {
  const int cp = loom_comm_size(r->group);
  const size_t n = gather_blocks(r, s);
  const double t = tick(r);
  bool first = true; /* the first block computed writes the rows, whichever it is */
  for (int j = 0; j < cp; j++) {
    loom_cp_positions(cp, j, s->T, r->peer_pos);
    if (!block_seen(s, r->pos, r->peer_pos, r->rows)) continue;
    ops->attention_block_forward(ops, out, lse, qkv, r->kv[1] + j * n, r->rows, r->rows, r->pos, r->peer_pos, s, drop, first);
    first = false;
  }
  note(r, LOOM_RING_BLOCK, t);
}

static void gathered_backward(const loom_ops *ops, const loom_ring *r, float *dqkv, const float *dout, const float *out,
                              const float *qkv, const float *lse, const loom_attn_shape *s, const loom_dropout *drop) {
  const int cp = loom_comm_size(r->group);
  const size_t n = gather_blocks(r, s);
  double t = tick(r);
  loom_mem_zero(ops->mem, r->dkv[1], (size_t)cp * n);
  for (int j = 0; j < cp; j++) {
    loom_cp_positions(cp, j, s->T, r->peer_pos);
    if (block_seen(s, r->pos, r->peer_pos, r->rows))
      ops->attention_block_backward(ops, dqkv, r->dkv[1] + j * n, dout, out, qkv, r->kv[1] + j * n, r->rows, r->rows, r->pos,
                                    r->peer_pos, lse, s, drop);
  }
  note(r, LOOM_RING_BLOCK, t);
  t = tick(r);
  loom_comm_reduce_scatter(r->group, r->dkv[1], r->dkv[0], n); /* each block's grads, every rank's share in, home */
  note(r, LOOM_RING_GATHER, t);
  loom_ring_unpack_dkv(ops, dqkv, r->dkv[0], r->rows, s);
}

void loom_ring_attention_forward(const loom_ops *ops, const loom_ring *r, float *out, float *lse, const float *qkv,
                                 const loom_attn_shape *s, const loom_dropout *drop) {
  if (r->all_gather) {
    gathered_forward(ops, r, out, lse, qkv, s, drop);
    return;
  }
  const int cp = loom_comm_size(r->group), me = loom_comm_rank(r->group);
  const size_t n = (size_t)r->rows * s->B * loom_attn_kv_width(s);
  for (int j = 0; j < cp; j++) { /* step j: the block of the rank j back */
    const int cur = j & 1;
    loom_request *recv = NULL, *send = NULL;
    double t = tick(r);
    if (j + 1 < cp) pass_on(r, r->kv[1 - cur], r->kv[cur], n, RING_TAG_KV, &recv, &send);
    loom_cp_positions(cp, (me - j + cp) % cp, s->T, r->peer_pos);
    if (j == 0 || block_seen(s, r->pos, r->peer_pos, r->rows)) /* step 0, its own keys: every query sees itself */
      ops->attention_block_forward(ops, out, lse, qkv, r->kv[cur], r->rows, r->rows, r->pos, r->peer_pos, s, drop, j == 0);
    note(r, LOOM_RING_BLOCK, t);
    t = tick(r);
    settle(r, recv, send);
    if (j + 1 < cp) note(r, LOOM_RING_WAIT, t);
  }
}

void loom_ring_attention_backward(const loom_ops *ops, const loom_ring *r, float *dqkv, const float *dout, const float *out,
                                  const float *qkv, const float *lse, const loom_attn_shape *s, const loom_dropout *drop) {
  if (r->all_gather) {
    gathered_backward(ops, r, dqkv, dout, out, qkv, lse, s, drop);
    return;
  }
  const int cp = loom_comm_size(r->group), me = loom_comm_rank(r->group), prev = (me - 1 + cp) % cp, next = (me + 1) % cp;
  const size_t n = (size_t)r->rows * s->B * loom_attn_kv_width(s);
  /* The grads of the block in hand travel with it: at step j this rank receives what the ranks before it summed
   * for the block (into dkv[j & 1]) while its own queries' share computes (in dkv[2]), adds it, and passes the
   * sum on at the start of the next step; one more hop brings each block's sum home. Each step's transfers go
   * as one group (flushed together): the previous step's sum out and in, then this step's keys and values. So
   * between two ranks the messages go block j-1's sum, then block j, in that order on both sides, as NCCL's
   * rules need (sends meet receives in issue order, tags ignored; the two are the same size), and no transfer
   * waits on one queued behind it (an NCCL send holds its stream until matched). A buffer is received into
   * again only once its last sum has left (sent[]). */
  loom_request *sent[2] = {NULL, NULL};
  for (int j = 0; j < cp; j++) {
    const int cur = j & 1;
    float *sum = r->dkv[cur], *mine = j > 0 ? r->dkv[2] : sum;
    loom_request *recv = NULL, *send = NULL, *grads = NULL;
    double t = tick(r);
    if (j > 0) {
      loom_comm_wait(r->group, sent[cur]);
      sent[1 - cur] = loom_comm_isend(r->group, r->dkv[1 - cur], n, next, RING_TAG_DKV);
      grads = loom_comm_irecv(r->group, sum, n, prev, RING_TAG_DKV);
    }
    if (j + 1 < cp) pass_on(r, r->kv[1 - cur], r->kv[cur], n, RING_TAG_KV, &recv, &send);
    else loom_comm_flush(r->group);
    loom_mem_zero(ops->mem, mine, n);
    loom_cp_positions(cp, (me - j + cp) % cp, s->T, r->peer_pos);
    if (block_seen(s, r->pos, r->peer_pos, r->rows))
      ops->attention_block_backward(ops, dqkv, mine, dout, out, qkv, r->kv[cur], r->rows, r->rows, r->pos, r->peer_pos,
                                    lse, s, drop);
    note(r, LOOM_RING_BLOCK, t);
    t = tick(r);
    settle(r, recv, send);
    if (grads) loom_comm_wait(r->group, grads);
    if (j > 0) note(r, LOOM_RING_WAIT, t);
    if (j > 0) ops->add(ops, sum, sum, mine, n);
  }
  float *home = r->dkv[cp & 1];
  if (cp > 1) { /* the last sum on, and this rank's own block's sum in, from the last rank to hold it */
    const double t = tick(r);
    loom_comm_wait(r->group, sent[cp & 1]);
    sent[(cp - 1) & 1] = loom_comm_isend(r->group, r->dkv[(cp - 1) & 1], n, next, RING_TAG_DKV);
    loom_request *in = loom_comm_irecv(r->group, home, n, prev, RING_TAG_DKV);
    loom_comm_flush(r->group);
    loom_comm_wait(r->group, in);
    loom_comm_wait(r->group, sent[(cp - 1) & 1]);
    note(r, LOOM_RING_GRADS, t);
  }
  loom_ring_unpack_dkv(ops, dqkv, home, r->rows, s);
}
