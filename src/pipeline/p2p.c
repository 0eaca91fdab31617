/* Point-to-point transfers between pipeline stages. */
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "layers/run_buffers.h"
#include "pipeline/p2p.h"
#include "schedule/schedule.h"

static int key_of(const loom_p2p *x, bool grad, int chunk, int mb) { return ((grad ? 1 : 0) * x->v + chunk) * x->m + mb; }

/* Splits the channels from the pipeline group, every rank in one order:
 * for each boundary between stages s and s + 1, an activation channel from
 * s's rank to s + 1's and a grad channel back, each ordered pair of ranks
 * and kind once, none from a rank to itself. In a channel the sender is
 * rank 0 and the receiver rank 1. */
static void open_channels(loom_p2p *x) {
  const int p = x->p, S = p * x->v;
  x->to = loom_xcalloc(2 * (size_t)p, sizeof *x->to, "pipeline channels");
  x->from = loom_xcalloc(2 * (size_t)p, sizeof *x->from, "pipeline channels");
  if (p == 1) return;
  const int me = loom_comm_rank(x->group);
  char *made = loom_xcalloc(2 * (size_t)p * p, 1, "pipeline channels"); /* [grad][src][dst] */
  for (int s = 0; s + 1 < S; s++)
    for (int grad = 0; grad < 2; grad++) {
      int lo, hi, chunk;
      loom_stage_place(x->v_shape, p, s, &lo, &chunk);
      loom_stage_place(x->v_shape, p, s + 1, &hi, &chunk);
      const int src = grad ? hi : lo, dst = grad ? lo : hi;
      if (src == dst || made[((size_t)grad * p + src) * p + dst]++) continue;
      const bool member = me == src || me == dst;
      loom_comm *ch = loom_comm_split(x->group, member ? 0 : LOOM_COMM_NO_COLOR, me == src ? 0 : 1, grad ? "pp-grad" : "pp-act");
      if (me == src) x->to[grad * p + dst] = ch;
      if (me == dst) x->from[grad * p + src] = ch;
    }
  free(made);
}

loom_status loom_p2p_init(loom_p2p *x, loom_comm *group, const loom_ops *ops, size_t floats, bool bf16, int p, int v,
                          bool v_shape, int m, int n) {
  *x = (loom_p2p){.group = group, .ops = ops, .floats = floats, .bf16 = bf16, .p = p, .v = v, .v_shape = v_shape, .n = n,
                  .words = bf16 ? loom_bf16_words(floats) : floats};
  x->buf = loom_xcalloc((size_t)(n > 0 ? n : 1), sizeof *x->buf, "send buffers");
  x->req = loom_xcalloc((size_t)(n > 0 ? n : 1), sizeof *x->req, "send buffers");
  x->sent = loom_xcalloc((size_t)(n > 0 ? n : 1), sizeof *x->sent, "send buffers");
  x->m = m;
  loom_pool_init(&x->pool, 1, &x->n, 2 * v * m);
  open_channels(x); /* collective over the group: before anything here can fail */
  for (int i = 0; i < n; i++)
    if (!(x->buf[i] = loom_zalloc(x->ops->mem, x->words * sizeof(float), loom_run_buffer_name(LOOM_BUF_SEND)))) return LOOM_ERR_NOMEM;
  if (bf16 && p > 1 && !(x->staging = loom_zalloc(x->ops->mem, x->words * sizeof(float), loom_run_buffer_name(LOOM_BUF_RECEIVE))))
    return LOOM_ERR_NOMEM;
  return LOOM_OK;
}

void loom_p2p_widen(loom_p2p *x, int m) {
  if (m <= x->m) return;
  x->m = m;
  loom_pool_widen(&x->pool, 2 * x->v * m);
}

void loom_p2p_free(loom_p2p *x) {
  for (int i = 0; i < x->n; i++) {
    if (x->req[i]) loom_comm_wait(x->group, x->req[i]);
    x->ops->mem->release(x->ops->mem, x->buf[i]);
  }
  if (x->staging) x->ops->mem->release(x->ops->mem, x->staging);
  for (int i = 0; x->to && i < 2 * x->p; i++) loom_comm_free(x->to[i]), loom_comm_free(x->from[i]);
  free(x->to);
  free(x->from);
  free(x->buf);
  free(x->req);
  free(x->sent);
  loom_pool_free(&x->pool);
  memset(x, 0, sizeof *x);
}

void loom_p2p_reset(loom_p2p *x) {
  for (int i = 0; i < x->n; i++) LOOM_CHECK(!x->sent[i], "a send not given back by its schedule's events");
  loom_pool_reset(&x->pool);
}

int loom_p2p_tag(const loom_p2p *x, int mb, int dst_stage, bool grad) {
  return (mb * x->v + dst_stage / x->p) * 2 + (grad ? 1 : 0);
}

void loom_p2p_acquire(loom_p2p *x, bool grad, int chunk, int mb) { loom_pool_take(&x->pool, 0, key_of(x, grad, chunk, mb)); }

void loom_p2p_release(loom_p2p *x, bool grad, int chunk, int mb) {
  const int key = key_of(x, grad, chunk, mb), k = loom_pool_held(&x->pool, 0, key);
  LOOM_CHECK(x->sent[k], "a send buffer given back before its send");
  if (x->req[k]) loom_comm_wait(x->group, x->req[k]);
  x->req[k] = NULL;
  x->sent[k] = false;
  loom_pool_return(&x->pool, 0, key);
}

void loom_p2p_send(loom_p2p *x, bool grad, int chunk, int mb, const float *data, int peer, int dst_stage) {
  const int k = loom_pool_held(&x->pool, 0, key_of(x, grad, chunk, mb));
  if (x->bf16) x->ops->to_bf16(x->ops, (uint16_t *)x->buf[k], data, x->floats);
  else x->ops->mem->copy(x->ops->mem, x->buf[k], data, x->floats * sizeof(float));
  x->sent[k] = true;
  if (peer == loom_comm_rank(x->group)) return; /* the recv copies it from here */
  loom_comm *ch = x->to[(grad ? x->p : 0) + peer];
  LOOM_CHECK(ch != NULL, "a send between stages that do not border");
  x->req[k] = loom_comm_isend(ch, x->buf[k], x->words, 1, loom_p2p_tag(x, mb, dst_stage, grad));
  loom_comm_flush(ch); /* each transfer its own group, as the verifier proved the schedule */
  x->bytes_sent += (int64_t)(x->words * sizeof(float)); /* what leaves the rank */
}

void loom_p2p_recv(loom_p2p *x, bool grad, int mb, int dst_stage, float *dst, int peer) {
  const void *from;
  if (peer == loom_comm_rank(x->group)) { /* from this rank's own chunk: its send buffer */
    int rank, chunk;
    loom_stage_place(x->v_shape, x->p, grad ? dst_stage + 1 : dst_stage - 1, &rank, &chunk);
    const int k = loom_pool_held(&x->pool, 0, key_of(x, grad, chunk, mb));
    LOOM_CHECK(x->sent[k], "a message received from this rank before it was sent");
    from = x->buf[k];
  } else {
    loom_comm *ch = x->from[(grad ? x->p : 0) + peer];
    LOOM_CHECK(ch != NULL, "a recv between stages that do not border");
    /* bf16 words travel as fp32 ones: only their bytes matter to a send. */
    float *into = x->bf16 ? (float *)x->staging : dst;
    loom_comm_recv(ch, into, x->words, 0, loom_p2p_tag(x, mb, dst_stage, grad));
    if (!x->bf16) return;
    from = into;
  }
  if (x->bf16) x->ops->from_bf16(x->ops, dst, from, x->floats);
  else x->ops->mem->copy(x->ops->mem, dst, from, x->floats * sizeof(float));
}
