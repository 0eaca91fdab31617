/* Greedy and temperature sampling over the last position's logits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "core/rng.h"
#include "pipeline/generate.h"

/* Draws from softmax(row / temperature) over the first V logits. */
static int draw(const float *row, int V, float temperature, uint64_t seed, uint64_t index) {
  float maxv = row[0];
  for (int v = 1; v < V; v++) maxv = row[v] > maxv ? row[v] : maxv;
  double sum = 0.0;
  for (int v = 0; v < V; v++) sum += exp((row[v] - maxv) / temperature);
  double r = loom_rng_uniform(seed, loom_hash_str("sample"), index) * sum;
  for (int v = 0; v < V; v++) {
    r -= exp((row[v] - maxv) / temperature);
    if (r <= 0.0) return v;
  }
  return V - 1;
}

loom_status loom_generate(loom_trainer *tr, const int *prompt, int len, const loom_generate_options *o,
                          void (*emit)(void *ctx, int token), void *ctx, loom_error *err) {
  if (tr->ps.world != 1 || tr->micro_batch != 1)
    return loom_fail(err, LOOM_ERR_USAGE, "generation runs on one rank with micro-batch 1 (this plan has %d ranks, "
                     "micro-batch %d)", tr->ps.world, tr->micro_batch);
  if (len < 1) return loom_fail(err, LOOM_ERR_USAGE, "generation needs a prompt of at least one token");
  loom_gpt *m = loom_pipeline_chunk(tr->pipe, 0);
  const loom_gpt_config *cfg = &m->p.cfg;
  const int T = tr->T, total = len + o->max_tokens;
  int *text = loom_xcalloc((size_t)total, sizeof(int), "generated text");
  int *window = loom_xcalloc((size_t)T, sizeof(int), "generation window");
  float *row = loom_xmalloc((size_t)cfg->vocab * sizeof(float), "next-token logits");
  memcpy(text, prompt, (size_t)len * sizeof(int));
  loom_gpt_sync_compute_weights(m);
  for (int n = len; n < total; n++) {
    /* The model is causal, so positions past the context never affect it. */
    const int start = n > T ? n - T : 0, ctx_len = n - start;
    memset(window, 0, (size_t)T * sizeof(int));
    memcpy(window, text + start, (size_t)ctx_len * sizeof(int));
    const loom_gpt_batch batch = {.tokens = window};
    loom_gpt_forward(m, &batch);
    /* The last position's logits come to the host, where the next token is chosen. */
    m->ops->mem->to_host(m->ops->mem, row, m->a->logits + (size_t)(ctx_len - 1) * cfg->padded_vocab, (size_t)cfg->vocab * sizeof(float));
    const int next = o->temperature <= 0.0f ? loom_row_argmax(row, cfg->vocab)
                                            : draw(row, cfg->vocab, o->temperature, o->seed, (uint64_t)n);
    text[n] = next;
    emit(ctx, next);
  }
  free(text);
  free(window);
  free(row);
  return LOOM_OK;
}
