/* Which checkpoint pieces a rank writes and which it loads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/ckpt_tensors.h"
#include "core/fault.h"

enum { PARAM, ADAM_M, ADAM_V };
static const char *const KINDS[3] = {"param", "adam_m", "adam_v"};

loom_ckpt_chunk loom_ckpt_chunk_adamw(loom_gpt_params *p, loom_adamw *opt) {
  return (loom_ckpt_chunk){.p = p, .m = opt->m.base, .v = opt->v.base, .step = &opt->step};
}

loom_ckpt_chunk loom_ckpt_chunk_zero(loom_gpt_params *p, loom_zero *z) {
  return (loom_ckpt_chunk){.p = p, .m = z->m, .v = z->v, .master = z->master, .runs = z->runs, .nruns = z->nbuckets,
                           .step = &z->step};
}

/* Row blocks of tensor k that are contiguous in the global tensor: c_attn's
 * q, k and v rows each hold one run of a rank's rows. */
static int parts_of(const loom_gpt_params *p, int k) {
  const loom_shard_layout *l = &p->meta[k].layout;
  return l->partition_dim == 0 && l->parts > 1 ? l->parts : 1;
}

int loom_ckpt_max_pieces(const loom_ckpt_chunk *chunks, int n) {
  int count = 0;
  for (int c = 0; c < n; c++) count += chunks[c].compress ? 2 : 0; /* its error feedback and Q */
  for (int c = 0; c < n; c++)
    for (int k = 0; k < chunks[c].p->params.count; k++) count += 3 * parts_of(chunks[c].p, k); /* a tensor lies in one run at most */
  return count;
}

/* Appends the part of tensor k's row block b inside run r as a piece of kind `kind`. */
static int add_piece(const loom_ckpt_chunk *ch, int k, int b, const loom_flat_run *r, int kind, loom_shard_tensor *t) {
  const loom_gpt_params *p = ch->p;
  const loom_shard_layout *l = &p->meta[k].layout;
  int64_t rows, cols;
  loom_shard_local_shape(l, p->tp_rank, p->tp_size, &rows, &cols);
  const int64_t part_rows = rows / parts_of(p, k);
  const size_t at = loom_buffer_offset(&p->params, k); /* flat offset of the tensor in the chunk's buffer */
  const size_t lo = at + (size_t)(b * part_rows * cols), hi = lo + (size_t)(part_rows * cols);
  const size_t from = lo > r->lo ? lo : r->lo, to = hi < r->hi ? hi : r->hi;
  if (to <= from) return 0;
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s/%s", KINDS[kind], p->params.views[k].name);
  t->ndim = 2;
  t->global[0] = l->rows;
  t->global[1] = l->cols;
  loom_shard_locate(l, p->tp_rank, p->tp_size, b * part_rows, &t->offset[0], &t->offset[1]);
  t->local[0] = part_rows;
  t->local[1] = cols;
  t->first = (int64_t)(from - lo);
  t->count = (int64_t)(to - from);
  float *const held[3] = {ch->master, ch->m, ch->v};
  t->data = kind == PARAM && !ch->master ? (float *)p->params.base + from : held[kind] + r->at + (from - r->lo);
  return 1;
}

/* Appends tensor k of chunk ch as pieces of kind `kind`, one per row block
 * and run that holds any of the chunk's state of that kind (ZeRO holds pieces). */
static int add_pieces(const loom_ckpt_chunk *ch, int k, int kind, loom_shard_tensor *out) {
  const loom_gpt_params *p = ch->p;
  const loom_flat_run whole = {0, p->params.numel, 0};
  const bool all = !ch->runs || (kind == PARAM && !ch->master);
  if (kind != PARAM && !ch->m) return 0;
  const size_t lo = loom_buffer_offset(&p->params, k), hi = lo + loom_tensor_numel(&p->params.views[k]);
  int count = 0;
  for (int i = 0; i < (all ? 1 : ch->nruns); i++) {
    const loom_flat_run *r = all ? &whole : &ch->runs[i];
    if (r->hi <= lo || r->lo >= hi) continue;
    for (int b = 0; b < parts_of(p, k); b++) count += add_piece(ch, k, b, r, kind, out + count);
  }
  return count;
}

/* One whole buffer of grad compression's state as a piece of its own. */
static int compression_piece(const loom_ckpt_chunk *ch, int c, const char *what, float *data, size_t n, loom_shard_tensor *t) {
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, LOOM_CKPT_COMPRESSION_PREFIX "rank_%05d/chunk_%d/%s", ch->rank, c, what);
  t->ndim = 2;
  t->global[0] = t->local[0] = 1;
  t->global[1] = t->local[1] = (int64_t)n;
  t->count = (int64_t)n;
  t->data = data;
  return 1;
}

/* Chunk c's compression state: every rank's error feedback is its own, and PowerSGD's Q is each tp and pp
 * rank's own (its replicas agree on it). The sign method's buffers are one step's messages, not state. */
static int compression_pieces(const loom_ckpt_chunk *ch, int c, loom_shard_tensor *out) {
  const loom_grad_compress *s = ch->compress;
  if (!s || !s->count) return 0;
  int count = compression_piece(ch, c, "error", s->error, s->error_floats, out);
  if (s->cfg.kind == LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD) count += compression_piece(ch, c, "q", s->b, s->b_words, out + count);
  return count;
}

/* Whether this rank is the one that writes tensor k's state of `kind`:
 * every replica its own pieces of what ZeRO shards, else the first. An
 * expert of an expert-parallel run is on one rank of each EP group, and its
 * replicas are the expert-data-parallel group's (their tp ranks whichever). */
static bool writes(const loom_ckpt_chunk *ch, int k, int kind, int dp_rank, int edp_rank, bool zero) {
  const loom_gpt_params *p = ch->p;
  const loom_param_meta *m = &p->meta[k];
  const bool pieces = kind == PARAM ? ch->master != NULL : zero;
  if (m->expert && !m->tp_replicated) return edp_rank == 0 || pieces;
  if (!loom_shard_primary(&m->layout, p->tp_rank, p->tp_size)) return false; /* a replica: its first rank writes it */
  if (m->shared && loom_stage_holds_tied_copy(&p->range)) return false; /* written once, from the first stage */
  return dp_rank == 0 || pieces;
}

int loom_ckpt_save_pieces(const loom_ckpt_chunk *chunks, int n, int dp_rank, int edp_rank, bool zero, loom_shard_tensor *out) {
  int count = 0;
  for (int c = 0; c < n; c++)
    for (int kind = PARAM; kind <= ADAM_V; kind++)
      for (int k = 0; k < chunks[c].p->params.count; k++)
        if (writes(&chunks[c], k, kind, dp_rank, edp_rank, zero)) count += add_pieces(&chunks[c], k, kind, out + count);
  for (int c = 0; c < n; c++) count += compression_pieces(&chunks[c], c, out + count);
  return count;
}

int loom_ckpt_load_pieces(const loom_ckpt_chunk *chunks, int n, loom_ckpt_want *out) {
  int count = 0;
  loom_shard_tensor pieces[LOOM_SHARD_MAX_PARTS];
  for (int c = 0; c < n; c++) chunks[c].p->compute_fresh = false; /* the params are about to change: round them anew */
  for (int c = 0; c < n; c++)
    for (int kind = PARAM; kind <= ADAM_V; kind++)
      for (int k = 0; k < chunks[c].p->params.count; k++)
        for (int b = 0, got = add_pieces(&chunks[c], k, kind, pieces); b < got; b++) {
          const loom_param_meta *m = &chunks[c].p->meta[k];
          out[count].t = pieces[b];
          out[count].padded = m->init_rows > 0;
          out[count++].valid_rows = m->init_rows > 0 ? m->init_rows : m->layout.rows;
        }
  for (int c = 0; c < n; c++)
    for (int b = 0, got = compression_pieces(&chunks[c], c, pieces); b < got; b++)
      out[count++] = (loom_ckpt_want){.t = pieces[b], .valid_rows = 1};
  return count;
}

int64_t loom_ckpt_load_bytes(const loom_ckpt_chunk *chunks, int n) {
  loom_ckpt_want *want = calloc((size_t)loom_ckpt_max_pieces(chunks, n) + 1, sizeof *want);
  const int count = loom_ckpt_load_pieces(chunks, n, want);
  int64_t bytes = 0;
  for (int i = 0; i < count; i++) bytes += want[i].t.count * (int64_t)sizeof(float);
  free(want);
  return bytes;
}

static loom_shard_tensor *staged_piece(const loom_ckpt_staging *s, int i) {
  return (loom_shard_tensor *)((char *)s->first + (size_t)i * s->stride);
}

loom_status loom_ckpt_stage(loom_ckpt_staging *s, const loom_allocator *mem, loom_shard_tensor *first, size_t stride,
                            int count, bool fill, loom_error *err) {
  *s = (loom_ckpt_staging){.mem = mem, .first = first, .stride = stride};
  if (mem->host_addressable || count == 0) return LOOM_OK;
  s->backend = loom_fault_calloc((size_t)count, sizeof *s->backend);
  if (!s->backend) return loom_fail(err, LOOM_ERR_NOMEM, "out of memory staging checkpoint pieces");
  for (; s->count < count; s->count++) {
    loom_shard_tensor *t = staged_piece(s, s->count);
    const size_t bytes = (size_t)t->count * sizeof(float);
    float *host = loom_fault_malloc(bytes ? bytes : 1);
    if (!host) {
      loom_ckpt_unstage(s, false);
      return loom_fail(err, LOOM_ERR_NOMEM, "out of memory staging checkpoint piece %s", t->name);
    }
    if (fill) mem->to_host(mem, host, t->data, bytes);
    s->backend[s->count] = t->data;
    t->data = host;
  }
  return LOOM_OK;
}

void loom_ckpt_unstage(loom_ckpt_staging *s, bool copy_back) {
  for (int i = 0; i < s->count; i++) {
    loom_shard_tensor *t = staged_piece(s, i);
    if (copy_back) s->mem->from_host(s->mem, s->backend[i], t->data, (size_t)t->count * sizeof(float));
    free(t->data);
    t->data = s->backend[i];
  }
  free(s->backend);
  s->backend = NULL;
  s->count = 0;
}
