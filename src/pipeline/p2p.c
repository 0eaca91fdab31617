/* Point-to-point transfers between pipeline stages. */
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "pipeline/p2p.h"

static int key_of(const loom_p2p *x, bool grad, int chunk, int mb) { return ((grad ? 1 : 0) * x->v + chunk) * x->m + mb; }

void loom_p2p_init(loom_p2p *x, loom_comm *group, const loom_ops *ops, size_t floats, bool bf16, int p, int v, int m,
                   int n) {
  *x = (loom_p2p){.group = group, .ops = ops, .floats = floats, .bf16 = bf16, .p = p, .v = v, .n = n,
                  .words = bf16 ? loom_bf16_words(floats) : floats};
  x->buf = loom_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *x->buf, "send buffers");
  x->req = loom_xcalloc((size_t)(n > 0 ? n : 1), sizeof *x->req, "send buffers");
  for (int i = 0; i < n; i++) x->buf[i] = loom_xzalloc(x->ops->mem, x->words * sizeof(float), "send buffer");
  if (bf16 && p > 1) x->staging = loom_xzalloc(x->ops->mem, x->words * sizeof(float), "receive buffer");
  x->m = m;
  loom_pool_init(&x->pool, 1, &x->n, 2 * v * m);
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
  free(x->buf);
  free(x->req);
  loom_pool_free(&x->pool);
  memset(x, 0, sizeof *x);
}

void loom_p2p_reset(loom_p2p *x) {
  for (int i = 0; i < x->n; i++) LOOM_CHECK(x->req[i] == NULL, "a send not given back by its schedule's events");
  loom_pool_reset(&x->pool);
}

int loom_p2p_tag(const loom_p2p *x, int mb, int dst_stage, bool grad) {
  return (mb * x->v + dst_stage / x->p) * 2 + (grad ? 1 : 0);
}

void loom_p2p_acquire(loom_p2p *x, bool grad, int chunk, int mb) { loom_pool_take(&x->pool, 0, key_of(x, grad, chunk, mb)); }

void loom_p2p_release(loom_p2p *x, bool grad, int chunk, int mb) {
  const int key = key_of(x, grad, chunk, mb), k = loom_pool_held(&x->pool, 0, key);
  LOOM_CHECK(x->req[k] != NULL, "a send buffer given back before its send");
  loom_comm_wait(x->group, x->req[k]);
  x->req[k] = NULL;
  loom_pool_return(&x->pool, 0, key);
}

void loom_p2p_send(loom_p2p *x, bool grad, int chunk, int mb, const float *data, int peer, int dst_stage) {
  const int k = loom_pool_held(&x->pool, 0, key_of(x, grad, chunk, mb));
  if (x->bf16) x->ops->to_bf16(x->ops, (uint16_t *)x->buf[k], data, x->floats);
  else x->ops->mem->copy(x->ops->mem, x->buf[k], data, x->floats * sizeof(float));
  x->req[k] = loom_comm_isend(x->group, x->buf[k], x->words, peer, loom_p2p_tag(x, mb, dst_stage, grad));
  if (peer != loom_comm_rank(x->group)) x->bytes_sent += (int64_t)(x->words * sizeof(float)); /* what leaves the rank */
}

void loom_p2p_recv(loom_p2p *x, bool grad, int mb, int dst_stage, float *dst, int peer) {
  const int tag = loom_p2p_tag(x, mb, dst_stage, grad);
  if (!x->bf16) {
    loom_comm_recv(x->group, dst, x->floats, peer, tag);
    return;
  }
  /* bf16 words travel as fp32 ones: only their bytes matter to a send. */
  loom_comm_recv(x->group, (float *)x->staging, x->words, peer, tag);
  x->ops->from_bf16(x->ops, dst, x->staging, x->floats);
}
