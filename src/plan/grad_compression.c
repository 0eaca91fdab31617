/* Which grads a compression method compresses, and what that costs. */
#include <stdio.h>
#include "backend/ops.h"
#include "plan/grad_compression.h"

void loom_compression_describe(const loom_compression *c, char *out, size_t len) {
  if (c->kind == LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD) snprintf(out, len, "PowerSGD rank %d", c->rank);
  else if (c->kind == LOOM__COMPRESSION_KIND__COMPRESSION_SIGN) snprintf(out, len, "scaled sign");
  else snprintf(out, len, "none");
}

bool loom_compression_compresses(const loom_compression *c, const loom_tensor *t, int *rows, int *cols) {
  if (t->ndim != 2) return false;
  const int64_t n = t->shape[0], m = t->shape[1];
  if (c->kind == LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD && (c->rank < 1 || (n + m) * c->rank >= n * m)) return false;
  if (c->kind != LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD && c->kind != LOOM__COMPRESSION_KIND__COMPRESSION_SIGN)
    return false;
  if (rows) *rows = (int)n;
  if (cols) *cols = (int)m;
  return true;
}

int64_t loom_compression_sent_words(const loom_compression *c, const loom_tensor *t) {
  int n, m;
  if (!loom_compression_compresses(c, t, &n, &m)) return (int64_t)loom_tensor_numel(t);
  if (c->kind == LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD) return ((int64_t)n + m) * c->rank;
  return (int64_t)loom_sign_message_words(loom_tensor_numel(t));
}

int64_t loom_compression_state_words(const loom_compression *c, const loom_tensor *t) {
  int n, m;
  if (!loom_compression_compresses(c, t, &n, &m)) return 0;
  const int64_t error = (int64_t)n * m;
  if (c->kind == LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD) return error + ((int64_t)n + m) * c->rank;
  return error + (int64_t)(1 + c->dp) * (int64_t)loom_sign_message_words(loom_tensor_numel(t));
}
