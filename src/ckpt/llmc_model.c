/* llm.c model file reader and writer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/llmc_model.h"
#include "core/fault.h"
#include "core/read_file.h"
#include "core/write_file.h"
#include "plan/plan.h"

enum { H_MAGIC, H_VERSION, H_SEQ, H_VOCAB, H_LAYERS, H_HEADS, H_HIDDEN, H_PADDED_VOCAB, H_INTS = 256 };

/* The tensors of a whole model of L layers in llm.c's order: wte, wpe, then
 * each block tensor kind across all layers, then ln_f. Our per-block order
 * matches llm.c's kinds. */
static int llmc_order(const loom_gpt_config *c, int *order) {
  const int L = c->layers, per = loom_gpt_block_tensors(c, 0); /* GPT-2: every layer alike */
  int n = 0;
  order[n++] = 0;
  order[n++] = 1;
  for (int j = 0; j < per; j++)
    for (int l = 0; l < L; l++) order[n++] = 2 + l * per + j;
  order[n++] = 2 + L * per;
  order[n++] = 3 + L * per;
  return n;
}

static loom_status read_header(FILE *fp, const char *path, int32_t *h, loom_gpt_config *cfg, loom_error *err) {
  if (fread(h, sizeof(int32_t), H_INTS, fp) != H_INTS)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: truncated model file: shorter than its 1024-byte header", path);
  if (h[H_MAGIC] != LOOM_LLMC_MAGIC)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: bad magic %d in model header (expected %d, llm.c's GPT-2 format)",
                     path, h[H_MAGIC], LOOM_LLMC_MAGIC);
  if (h[H_VERSION] != LOOM_LLMC_VERSION)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: unsupported model version %d (expected %d: fp32 with padded vocab)",
                     path, h[H_VERSION], LOOM_LLMC_VERSION);
  Loom__Model sizes = LOOM__MODEL__INIT;
  sizes.layers = h[H_LAYERS], sizes.hidden = h[H_HIDDEN], sizes.heads = h[H_HEADS], sizes.vocab = h[H_VOCAB];
  sizes.seq = h[H_SEQ];
  char why[256];
  if (loom_plan_check_model(&sizes, why, sizeof why))
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: bad model header: %.*s", path, (int)strcspn(why, "\n"), why);
  memset(cfg, 0, sizeof *cfg);
  cfg->seq = h[H_SEQ];
  cfg->vocab = h[H_VOCAB];
  cfg->layers = h[H_LAYERS];
  cfg->heads = h[H_HEADS];
  cfg->hidden = h[H_HIDDEN];
  cfg->norm_eps = 1e-5f;
  loom_gpt_config_finish(cfg);
  if (h[H_PADDED_VOCAB] < cfg->vocab || h[H_PADDED_VOCAB] % LOOM_VOCAB_ALIGN != 0)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: bad model header: padded vocab %d must be a multiple of %d and at least vocab %d",
                     path, h[H_PADDED_VOCAB], LOOM_VOCAB_ALIGN, cfg->vocab);
  cfg->padded_vocab = h[H_PADDED_VOCAB];
  return LOOM_OK;
}

loom_status loom_llmc_read_config(const char *path, loom_gpt_config *cfg, loom_error *err) {
  FILE *fp;
  const loom_status opened = loom_open_for_reading(path, "model file", &fp, err);
  if (opened != LOOM_OK) return opened;
  int32_t h[H_INTS];
  const loom_status st = read_header(fp, path, h, cfg, err);
  fclose(fp);
  return st;
}

loom_status loom_llmc_check_model(const char *path, const loom_gpt_config *file, const loom_gpt_config *run,
                                  loom_error *err) {
  if (loom_gpt_config_same_model(file, run)) return LOOM_OK;
  char mine[256], other[256];
  return loom_fail(err, LOOM_ERR_FORMAT, "%s: model (%s) does not match the run's (%s)", path,
                   loom_gpt_config_describe(file, mine, sizeof mine), loom_gpt_config_describe(run, other, sizeof other));
}

loom_status loom_llmc_load(const char *path, loom_gpt_params *p, loom_error *err) {
  FILE *fp;
  const loom_status opened = loom_open_for_reading(path, "model file", &fp, err);
  if (opened != LOOM_OK) return opened;
  int32_t h[H_INTS];
  loom_gpt_config cfg;
  loom_status st = read_header(fp, path, h, &cfg, err);
  if (st == LOOM_OK) st = loom_llmc_check_model(path, &cfg, &p->cfg, err);
  if (st == LOOM_OK && cfg.padded_vocab != p->cfg.padded_vocab) /* this reader copies whole tensors */
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: padded vocab %d, this model's is %d", path, cfg.padded_vocab, p->cfg.padded_vocab);
  int *order = malloc((size_t)p->params.count * sizeof(int));
  const int n = st == LOOM_OK ? llmc_order(&p->cfg, order) : 0;
  for (int i = 0; i < n && st == LOOM_OK; i++) {
    loom_tensor *t = &p->params.views[order[i]];
    if (fread(t->data, sizeof(float), loom_tensor_numel(t), fp) != loom_tensor_numel(t))
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: truncated model file: ends inside %s", path, t->name);
  }
  if (st == LOOM_OK && fgetc(fp) != EOF)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: model file has trailing bytes after ln_f.bias", path);
  free(order);
  fclose(fp);
  return st;
}

/* The file as chunks: the header, then each tensor in llm.c's order, fetched into scratch. */
typedef struct {
  const loom_model_source *src;
  const int32_t *header;
  const int *order;
  float *scratch;
  loom_dtype dtype;
} llmc_writer;

static int next_llmc_chunk(void *ctx, int i, loom_chunk *chunk, loom_status *st, loom_error *err) {
  const llmc_writer *w = ctx;
  if (i == 0) {
    *chunk = (loom_chunk){w->header, H_INTS * sizeof(int32_t)};
    return 1;
  }
  if (i > w->src->count) return 0;
  const int k = w->order[i - 1];
  *st = w->src->fetch(w->src, k, w->scratch, err);
  *chunk = (loom_chunk){w->scratch, loom_export_values(w->scratch, loom_tensor_numel(&w->src->specs[k]), w->dtype)};
  return *st == LOOM_OK;
}

loom_status loom_llmc_write(const char *path, const loom_model_source *src, loom_dtype dtype, loom_error *err) {
  const loom_gpt_config *c = &src->cfg;
  if (!loom_gpt_config_is_gpt2(c) || c->untied)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: llm.c's format holds GPT-2 models only (LayerNorm, GELU, learned positions, "
                     "biases, tied embeddings, dense MLPs)%s", path,
                     loom_gpt_is_moe(c) ? "" : "; export this model with --format hf");
  if (c->ffn != 4 * c->hidden)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: llm.c's format needs ffn = 4 * hidden (got ffn %d, hidden %d)",
                     path, c->ffn, c->hidden);
  int32_t h[H_INTS] = {0};
  h[H_MAGIC] = LOOM_LLMC_MAGIC;
  h[H_VERSION] = dtype == LOOM_DTYPE_BF16 ? LOOM_LLMC_VERSION_BF16 : LOOM_LLMC_VERSION;
  h[H_SEQ] = c->seq;
  h[H_VOCAB] = c->vocab;
  h[H_LAYERS] = c->layers;
  h[H_HEADS] = c->heads;
  h[H_HIDDEN] = c->hidden;
  h[H_PADDED_VOCAB] = c->padded_vocab;
  int *order = malloc((size_t)src->count * sizeof(int));
  float *scratch = malloc(loom_model_source_max_numel(src) * sizeof(float) + 1);
  loom_status st = LOOM_OK;
  if (!order || !scratch) {
    st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
  } else {
    llmc_order(c, order);
    llmc_writer w = {src, h, order, scratch, dtype};
    st = loom_write_file_atomic_stream(path, next_llmc_chunk, &w, err);
  }
  free(order);
  free(scratch);
  return st;
}

loom_status loom_llmc_save(const char *path, const loom_gpt_params *p, loom_error *err) {
  loom_model_source src;
  loom_model_source_of_params(&src, p);
  return loom_llmc_write(path, &src, LOOM_DTYPE_F32, err);
}

/* An llm.c file read tensor by tensor: where each canonical tensor starts. */
typedef struct {
  FILE *fp;
  char path[4096];
  long *at; /* [count] file offset of tensor k */
} llmc_source;

static void free_llmc_source(void *state) {
  llmc_source *l = state;
  if (l->fp) fclose(l->fp);
  free(l->at);
  free(l);
}

static loom_status fetch_llmc(const loom_model_source *s, int k, float *dst, loom_error *err) {
  const llmc_source *l = s->state;
  const size_t n = loom_tensor_numel(&s->specs[k]);
  if (fseek(l->fp, l->at[k], SEEK_SET) != 0 || fread(dst, sizeof(float), n, l->fp) != n)
    return loom_fail(err, LOOM_ERR_IO, "%s: cannot read %s: %s", l->path, s->specs[k].name, strerror(errno));
  return LOOM_OK;
}

loom_status loom_llmc_source(loom_model_source *s, const char *path, loom_error *err) {
  memset(s, 0, sizeof *s);
  llmc_source *l = loom_fault_calloc(1, sizeof *l);
  if (!l) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
  snprintf(l->path, sizeof l->path, "%s", path);
  s->state = l;
  s->free_state = free_llmc_source;
  s->fetch = fetch_llmc;
  const loom_status opened = loom_open_for_reading(path, "model file", &l->fp, err);
  if (opened != LOOM_OK) {
    loom_model_source_free(s);
    return opened;
  }
  int32_t h[H_INTS];
  loom_status st = read_header(l->fp, path, h, &s->cfg, err);
  if (st == LOOM_OK) st = loom_model_source_make_table(s, path, err);
  l->at = loom_fault_calloc((size_t)s->count + 1, sizeof *l->at);
  int *order = loom_fault_malloc(((size_t)s->count + 1) * sizeof(int));
  if (st == LOOM_OK && (!l->at || !order)) st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
  if (st == LOOM_OK) {
    long at = H_INTS * (long)sizeof(int32_t);
    const int n = llmc_order(&s->cfg, order);
    for (int i = 0; i < n; i++) {
      l->at[order[i]] = at;
      at += (long)loom_tensor_bytes(&s->specs[order[i]]);
    }
    /* The body must be exactly the tensors the header promises. */
    if (fseek(l->fp, 0, SEEK_END) != 0 || ftell(l->fp) != at)
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: model file is %ld bytes; its header promises %ld", path, ftell(l->fp), at);
  }
  free(order);
  if (st != LOOM_OK) loom_model_source_free(s);
  return st;
}
