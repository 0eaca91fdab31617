/* Checkpoint shard files: CRC-32C known answers, a round trip that keeps
 * names, shapes and offsets, every kind of corruption refused with a
 * message naming the file (and tensor), never loaded silently; and loading
 * by global offsets across plans (tp, pp, dp, ZeRO-1) against the naive
 * shard mapping of a whole model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ckpt/assemble.h"
#include "ckpt/shard_file.h"
#include "core/crc32c.h"
#include "plan/plan.h"
#include "core/fault.h"
#include "ckpt/manifest.h"
#include "test_util.h"

START_TEST(crc32c_known_answers) {
  ck_assert_uint_eq(loom_crc32c(0, "123456789", 9), 0xE3069283u);
  ck_assert_uint_eq(loom_crc32c(0, "", 0), 0u);
  /* Continuing a CRC equals one pass over the whole. */
  ck_assert_uint_eq(loom_crc32c(loom_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
  /* The fast path equals the table at every length and alignment. */
  uint8_t buf[300];
  for (int i = 0; i < 300; i++) buf[i] = (uint8_t)(i * 131 + 7);
  for (size_t at = 0; at < 9; at++)
    for (size_t n = 0; n + at <= 300; n += 13) ck_assert_uint_eq(loom_crc32c(5, buf + at, n), loom_crc32c_table(5, buf + at, n));
}
END_TEST

/* Two tensors: a row shard of a [6, 4] matrix and a whole vector. */
static const char *write_sample(const char *name, float *a, float *b) {
  for (int i = 0; i < 8; i++) a[i] = (float)i * 0.5f;
  for (int i = 0; i < 3; i++) b[i] = -1.0f - (float)i;
  /* Elements 1..8 of a row block, and a whole vector. */
  loom_shard_tensor t[2] = {{.name = "h.0.attn.c_attn.weight", .ndim = 2, .global = {6, 4}, .offset = {2, 0},
                             .local = {3, 4}, .first = 1, .count = 8, .data = a},
                            {.name = "ln_f.bias", .ndim = 1, .global = {3}, .offset = {0}, .local = {3}, .data = b}};
  loom_shard_set_whole(&t[1]);
  const char *path = tu_tmp_path(name);
  loom_error err = {0};
  int64_t bytes;
  uint32_t crc;
  const loom_shard_binding binding = {0x5eed, 3, 1};
  ck_assert_int_eq(loom_shard_file_write(path, &binding, t, 2, &bytes, &crc, &err), LOOM_OK);
  loom_shard_binding back;
  ck_assert_int_eq(loom_shard_read_binding(path, &back, &err), LOOM_OK);
  ck_assert(back.save_id == binding.save_id && back.step == binding.step && back.rank == binding.rank);
  /* The size and checksum it reports are the file's own, read back here. */
  FILE *fp = fopen(path, "rb");
  uint8_t disk[4096];
  const size_t got = fread(disk, 1, sizeof disk, fp);
  fclose(fp);
  ck_assert_int_eq(bytes, (int64_t)got);
  ck_assert_uint_eq(crc, loom_crc32c(0, disk, got));
  return path;
}

START_TEST(round_trip) {
  float a[8], b[3];
  const char *path = write_sample("shard.bin", a, b);
  loom_shard_file f;
  loom_error err = {0};
  ck_assert_int_eq(loom_shard_file_read(path, &f, &err), LOOM_OK);
  ck_assert_int_eq(f.count, 2);
  ck_assert_str_eq(f.tensors[0].name, "h.0.attn.c_attn.weight");
  ck_assert_int_eq(f.tensors[0].global[0], 6);
  ck_assert_int_eq(f.tensors[0].offset[0], 2);
  ck_assert_int_eq(f.tensors[0].local[1], 4);
  ck_assert_int_eq(f.tensors[0].first, 1);
  ck_assert_int_eq(f.tensors[0].count, 8);
  ck_assert_int_eq(f.tensors[1].count, 3);
  ck_assert_mem_eq(f.tensors[0].data, a, sizeof a);
  ck_assert_mem_eq(f.tensors[1].data, b, sizeof b);
  loom_shard_file_free(&f);
}
END_TEST

static void expect_refused(const char *path, const char *suffix) {
  loom_shard_file f;
  loom_error err = {0};
  ck_assert_int_eq(loom_shard_file_read(path, &f, &err), LOOM_ERR_FORMAT);
  char want[700];
  snprintf(want, sizeof want, "%s: %s", path, suffix);
  ck_assert_str_eq(err.msg, want);
}

/* The file header (magic, version, count, save id, step, rank), and the
 * bytes of the second piece (ln_f.bias): its header, then 3 values. */
enum { FILE_HEADER = 8 + 4 + 4 + 8 + 8 + 4, LAST_HEADER = 2 + 9 + 1 + 1 + 3 * 8 + 16 + 4, LAST_DATA = 12 };

START_TEST(corruption_is_refused) {
  float a[8], b[3];
  const char *good = write_sample("good.bin", a, b);
  size_t n;
  char *bytes = tu_read_bytes(good, &n);
  const char *bad = tu_tmp_path("bad.bin");
  loom_shard_file f;
  loom_error err = {0};
  /* A flipped byte in the first piece's values, then one in its name: the CRC covers both. */
  const size_t value = n - LAST_DATA - LAST_HEADER - 1, name = FILE_HEADER + 2 + 9; /* the c of c_attn */
  const size_t flips[2] = {value, name};
  const char *named[2] = {"tensor h.0.attn.c_attn.weight fails its checksum", "tensor h.0.attn.C_attn.weight fails its checksum"};
  for (int i = 0; i < 2; i++) {
    bytes[flips[i]] ^= 0x20;
    tu_write_bytes(bad, bytes, n);
    ck_assert_int_eq(loom_shard_file_read(bad, &f, &err), LOOM_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, named[i]) && strstr(err.msg, "the file is corrupt"), "%s", err.msg);
    bytes[flips[i]] ^= 0x20;
  }
  /* An element type this loom cannot read (the byte after ndim). */
  bytes[FILE_HEADER + 2 + 22 + 1] = 7;
  tu_write_bytes(bad, bytes, n);
  expect_refused(bad, "tensor h.0.attn.c_attn.weight has element type 7; this loom reads fp32 (0)");
  bytes[FILE_HEADER + 2 + 22 + 1] = 0;
  /* Bounds whose sums or products would overflow 64 bits (the fuzzer's find):
   * an offset at the top of int64, and a block of 2^40 x 2^40 elements. */
  const size_t dims = FILE_HEADER + 2 + 22 + 2; /* global[2], offset[2], local[2] follow ndim and the type */
  char *edited = malloc(n);
  const int64_t top = INT64_MAX, huge = (int64_t)1 << 40, zero = 0;
  memcpy(edited, bytes, n);
  memcpy(edited + dims + 16, &top, 8);
  tu_write_bytes(bad, edited, n);
  ck_assert_int_eq(loom_shard_file_read(bad, &f, &err), LOOM_ERR_FORMAT);
  ck_assert_msg(strstr(err.msg, "block [9223372036854775807, +") && strstr(err.msg, "lies outside its global size 6 in dim 0"),
                "%s", err.msg);
  memcpy(edited, bytes, n);
  for (int d = 0; d < 2; d++) {
    memcpy(edited + dims + 8 * d, &huge, 8);
    memcpy(edited + dims + 16 + 8 * d, &zero, 8);
    memcpy(edited + dims + 32 + 8 * d, &huge, 8);
  }
  tu_write_bytes(bad, edited, n);
  expect_refused(bad, "tensor h.0.attn.c_attn.weight: its block has more elements than fit in 64 bits");
  free(edited);
  /* Truncated inside the last tensor's data, and inside the header. */
  tu_write_bytes(bad, bytes, n - 4);
  expect_refused(bad, "truncated checkpoint shard: ends inside ln_f.bias");
  tu_write_bytes(bad, bytes, 10);
  expect_refused(bad, "truncated checkpoint shard: ends inside its header");
  /* Another file type, another version, trailing garbage. */
  memcpy(bytes, "NOTLOOM!", 8);
  tu_write_bytes(bad, bytes, n);
  expect_refused(bad, "not a loom checkpoint shard (bad magic)");
  memcpy(bytes, "LOOMSHRD", 8);
  bytes[8] = 9;
  tu_write_bytes(bad, bytes, n);
  expect_refused(bad, "checkpoint shard version 9, this loom reads 3");
  bytes[8] = 3;
  char *longer = malloc(n + 3);
  memcpy(longer, bytes, n);
  memcpy(longer + n, "xyz", 3);
  tu_write_bytes(bad, longer, n + 3);
  expect_refused(bad, "trailing bytes after the last tensor");
  free(longer);
  free(bytes);
  ck_assert_int_eq(loom_shard_file_read("/nonexistent/shard.bin", &f, &err), LOOM_ERR_IO);
}
END_TEST

/* One rank of a layout (one chunk): parameters and Adam moments, plain or
 * this replica's ZeRO pieces (one slice under ZeRO-1, one per bucket under 2 and 3). */
typedef struct {
  loom_gpt_params p;
  loom_adamw opt;
  loom_zero z;
  loom_ckpt_chunk ch;
  int zero;
  size_t moments; /* elements of m and v */
} test_rank;

typedef struct {
  int tp, pp, dp, zero;
} layout;

static const loom_gpt_config *tiny(void) {
  static loom_gpt_config cfg = {.layers = 4, .hidden = 16, .heads = 4, .ffn = 64, .vocab = 100, .seq = 8, .norm_eps = 1e-5f};
  loom_gpt_config_finish(&cfg);
  return &cfg;
}

/* Builds rank `rank` of lay (tp fastest, then dp, then pp). With a whole
 * model and its moments, fills it by the naive shard mapping (the expected
 * state); without, fills it with NaN (what a load must overwrite). */
static void make_rank(test_rank *r, layout lay, int rank, const loom_gpt_params *whole, const loom_buffer *wm,
                      const loom_buffer *wv) {
  const int tp_rank = rank % lay.tp, dp_rank = rank / lay.tp % lay.dp, pp_rank = rank / (lay.tp * lay.dp);
  /* The stage's layers, from the plan the layout makes (its even split). */
  const loom_gpt_config *t = tiny();
  const loom_plan_spec spec = {.model = *t, .tp = lay.tp, .pp = lay.pp, .dp = lay.dp, .vpp = 1, .micro_batch = 1, .global_batch = lay.dp};
  loom_plan *plan;
  loom_error err = {0};
  ck_assert_int_eq(loom_plan_build(&spec, &plan, &err), LOOM_OK);
  const loom_stage_range range = loom_plan_stage_range(plan, pp_rank);
  loom_plan_free(plan);
  const loom_gpt_config cfg = loom_gpt_config_for_tp(tiny(), lay.tp);
  const loom_adamw_config oc = loom_adamw_defaults();
  memset(r, 0, sizeof *r);
  r->zero = lay.zero;
  ck_assert_int_eq(loom_gpt_params_init(&r->p, &cfg, tp_rank, lay.tp, &range, &loom_host_memory), LOOM_OK);
  const size_t n = r->p.params.numel;
  float *m = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
  if (whole) {
    tu_slice_of(&r->p, &whole->params, whole, r->p.params.base);
    tu_slice_of(&r->p, wm, whole, m);
    tu_slice_of(&r->p, wv, whole, v);
  } else {
    for (size_t i = 0; i < n; i++) ((float *)r->p.params.base)[i] = m[i] = v[i] = NAN;
  }
  if (lay.zero) {
    const loom_zero_group dp = {dp_rank, lay.dp, NULL}, groups[LOOM_ZERO_GROUPS] = {dp, dp};
    ck_assert_int_eq(loom_zero_init(&r->z, &r->p, groups, lay.zero, &oc), LOOM_OK);
    for (int b = 0; b < r->z.nbuckets; b++) { /* this replica's piece of each bucket */
      const loom_flat_run *run = &r->z.runs[b];
      memcpy(r->z.m + run->at, m + run->lo, (run->hi - run->lo) * sizeof(float));
      memcpy(r->z.v + run->at, v + run->lo, (run->hi - run->lo) * sizeof(float));
    }
    r->moments = r->z.shard;
    r->ch = loom_ckpt_chunk_zero(&r->p, &r->z);
  } else {
    ck_assert_int_eq(loom_adamw_init(&r->opt, &r->p, &oc), LOOM_OK);
    memcpy(r->opt.m.base, m, n * sizeof(float));
    memcpy(r->opt.v.base, v, n * sizeof(float));
    r->moments = n;
    r->ch = loom_ckpt_chunk_adamw(&r->p, &r->opt);
  }
  free(m);
  free(v);
}

static void free_rank(test_rank *r) {
  loom_gpt_params_free(&r->p);
  if (r->zero) loom_zero_free(&r->z);
  else loom_adamw_free(&r->opt);
}

/* Every element of two ranks' state equal, bit for bit. */
static void assert_same_state(const test_rank *a, const test_rank *b) {
  ck_assert_mem_eq(a->p.params.base, b->p.params.base, a->p.params.numel * sizeof(float));
  const size_t moments = a->moments * sizeof(float);
  ck_assert_uint_eq(a->moments, b->moments);
  ck_assert_mem_eq(a->ch.m, b->ch.m, moments);
  ck_assert_mem_eq(a->ch.v, b->ch.v, moments);
}

/* The whole model and its moments, with distinct random values everywhere
 * but wte's padding rows (zero, as training keeps them). */
static void whole_state(loom_gpt_params *whole, loom_adamw *opt) {
  ck_assert_int_eq(loom_gpt_params_init(whole, tiny(), 0, 1, NULL, &loom_host_memory), LOOM_OK);
  const loom_adamw_config oc = loom_adamw_defaults();
  ck_assert_int_eq(loom_adamw_init(opt, whole, &oc), LOOM_OK);
  const size_t n = whole->params.numel;
  tu_fill(whole->params.base, n, 1, -1.0f, 1.0f);
  tu_fill(opt->m.base, n, 2, -1.0f, 1.0f);
  tu_fill(opt->v.base, n, 3, 0.0f, 1.0f);
  const size_t pad = (size_t)(whole->cfg.padded_vocab - whole->cfg.vocab) * (size_t)whole->cfg.hidden;
  const size_t at = (size_t)whole->cfg.vocab * (size_t)whole->cfg.hidden; /* wte is the first tensor */
  memset((float *)whole->params.base + at, 0, pad * sizeof(float));
  memset((float *)opt->m.base + at, 0, pad * sizeof(float));
  memset((float *)opt->v.base + at, 0, pad * sizeof(float));
}

/* Writes every rank of lay as one shard file each; returns the paths. */
static char **save_layout(layout lay, const loom_gpt_params *whole, const loom_adamw *opt, const char *tag) {
  const int world = lay.tp * lay.pp * lay.dp;
  char **paths = calloc((size_t)world, sizeof *paths);
  for (int rank = 0; rank < world; rank++) {
    test_rank r;
    make_rank(&r, lay, rank, whole, &opt->m, &opt->v);
    loom_shard_tensor *pieces = calloc((size_t)loom_ckpt_max_pieces(&r.ch, 1), sizeof *pieces);
    const int count = loom_ckpt_save_pieces(&r.ch, 1, rank / lay.tp % lay.dp, rank / lay.tp % lay.dp, lay.zero, pieces);
    char name[64];
    snprintf(name, sizeof name, "%s_%d.shard", tag, rank);
    paths[rank] = strdup(tu_tmp_path(name));
    int64_t bytes;
    uint32_t crc;
    loom_error err = {0};
    const loom_shard_binding binding = {1, 1, rank};
    ck_assert_int_eq(loom_shard_file_write(paths[rank], &binding, pieces, count, &bytes, &crc, &err), LOOM_OK);
    free(pieces);
    free_rank(&r);
  }
  return paths;
}

/* Loads rank `rank` of lay from those of the files that hold a piece it
 * wants (as a manifest's piece lists select them); *opened counts them.
 * Returns the status, err the message. */
static loom_status load_rank(test_rank *r, layout lay, int rank, char **paths, int npaths, int *opened, loom_error *err) {
  make_rank(r, lay, rank, NULL, NULL, NULL);
  loom_ckpt_want *want = calloc((size_t)loom_ckpt_max_pieces(&r->ch, 1), sizeof *want);
  const int nwant = loom_ckpt_load_pieces(&r->ch, 1, want);
  loom_want_index *ix = loom_want_index_build(want, nwant);
  char *needed[16];
  *opened = 0;
  for (int f = 0; f < npaths; f++) {
    loom_shard_index si;
    ck_assert_int_eq(loom_shard_index_open(paths[f], &si, err), LOOM_OK);
    int any = 0;
    for (int k = 0; k < si.count && !any; k++) any = loom_want_index_needs(ix, &si.tensors[k]);
    if (any) needed[(*opened)++] = paths[f];
    loom_shard_index_close(&si);
  }
  const loom_status st = loom_ckpt_assemble("ckpt", needed, *opened, want, nwant, err);
  loom_want_index_free(ix);
  free(want);
  return st;
}

/* A checkpoint of (tp 2, pp 2, dp 2) with ZeRO-1, and with ZeRO-3 (Adam
 * state in per-layer pieces), loads into other plans and ZeRO stages
 * exactly as the naive shard mapping of the whole model places every element. */
START_TEST(loads_onto_other_plans) {
  loom_gpt_params whole;
  loom_adamw opt;
  whole_state(&whole, &opt);
  const layout from = {2, 2, 2, _i ? 3 : 1};
  char **paths = save_layout(from, &whole, &opt, "from");
  const layout to[6] = {{4, 1, 1, 0}, {1, 4, 3, 1}, {1, 1, 1, 0}, {2, 2, 2, from.zero}, {1, 2, 3, 3}, {2, 1, 2, 2}};
  for (int k = 0; k < 6; k++)
    for (int rank = 0; rank < to[k].tp * to[k].pp * to[k].dp; rank++) {
      test_rank got, want;
      loom_error err = {0};
      int opened;
      ck_assert_msg(load_rank(&got, to[k], rank, paths, 8, &opened, &err) == LOOM_OK, "%s", err.msg);
      make_rank(&want, to[k], rank, &whole, &opt.m, &opt.v);
      assert_same_state(&got, &want);
      /* The whole model needs every file; a rank of the same plan fewer (its stage, its replicas, the tied wte). */
      if (k == 2) ck_assert_int_eq(opened, 8);
      if (k == 3) ck_assert_msg(opened < 8, "rank %d of the same plan opened all 8 shard files", rank);
      free_rank(&got);
      free_rank(&want);
    }
  /* A missing shard leaves elements unfound; a shard given twice holds them twice. */
  test_rank r;
  loom_error err = {0};
  int opened;
  ck_assert_int_eq(load_rank(&r, to[2], 0, paths, 7, &opened, &err), LOOM_ERR_FORMAT);
  ck_assert_msg(strstr(err.msg, "ckpt: the checkpoint holds ") && strstr(err.msg, "elements of"), "%s", err.msg);
  free_rank(&r);
  char *twice[9];
  memcpy(twice, paths, 8 * sizeof *paths);
  twice[8] = paths[0];
  ck_assert_int_eq(load_rank(&r, to[2], 0, twice, 9, &opened, &err), LOOM_ERR_FORMAT);
  ck_assert_msg(strstr(err.msg, "(pieces overlap)"), "%s", err.msg);
  free_rank(&r);
  for (int i = 0; i < 8; i++) free(paths[i]);
  free(paths);
  loom_adamw_free(&opt);
  loom_gpt_params_free(&whole);
}
END_TEST

/* A save of step 2 over a checkpoint of step 1. */
typedef struct {
  const char *dir;
  loom_ckpt_chunk ch;
  loom_parallel ps;
  loom_ckpt_run run;
} save_case;

/* A single-rank save of the whole test model into tmp/name. */
static save_case save_case_of(const char *name, loom_gpt_params *whole, loom_adamw *opt) {
  save_case c = {.dir = tu_tmp_path(name), .ch = loom_ckpt_chunk_adamw(whole, opt),
                 .run = {.cfg = *tiny(), .tp = 1, .pp = 1, .dp = 1, .vpp = 1, .micro_batch = 1, .global_batch = 1, .seed = 7}};
  loom_parallel_init(&c.ps, NULL, 1, 1, 1, 1, false);
  return c;
}

static loom_status save_step2(void *ctx, loom_error *err) {
  save_case *c = ctx;
  int64_t bytes;
  return loom_ckpt_save(c->dir, 2, 0, &c->ch, 1, &c->ps, &c->run, &bytes, err);
}

/* dir/latest names step `step`, and the checkpoint it names verifies. */
static void expect_latest(const char *dir, int step) {
  char path[4200], want[32];
  snprintf(path, sizeof path, "%s/latest", dir);
  snprintf(want, sizeof want, "step_%08d\n", step);
  size_t n;
  char *named = tu_read_bytes(path, &n);
  ck_assert_msg(n == strlen(want) && memcmp(named, want, n) == 0, "latest does not name step %d", step);
  free(named);
  int shards, tensors;
  loom_error err = {0};
  ck_assert_msg(loom_ckpt_verify(dir, &shards, &tensors, &err) == LOOM_OK, "%s", err.msg);
}

static void step1_intact(void *ctx, loom_status st, const loom_error *err, int k) {
  ck_assert_msg(st == LOOM_ERR_NOMEM, "allocation %d: %s", k, err->msg);
  const char *dir = ((save_case *)ctx)->dir;
  expect_latest(dir, 1);
  char partial[4200];
  loom_ckpt_step_dir(dir, 2, partial, sizeof partial);
  struct stat sb;
  ck_assert_msg(stat(partial, &sb) != 0, "allocation %d: the failed save left %s behind", k, partial);
}

/* Every allocation of the checkpoint writer failing in turn: each save
 * refuses with one line saying it ran out of memory, and the checkpoint
 * before it stays the latest, whole and loadable; then the save succeeds. */
START_TEST(writer_survives_allocation_failure) {
  loom_gpt_params whole;
  loom_adamw opt;
  whole_state(&whole, &opt);
  save_case c = save_case_of("alloc_ckpt", &whole, &opt);
  loom_error err = {0};
  int64_t bytes;
  ck_assert_msg(loom_ckpt_save(c.dir, 1, 0, &c.ch, 1, &c.ps, &c.run, &bytes, &err) == LOOM_OK, "%s", err.msg);
  ck_assert_int_ge(tu_each_allocation_failing(save_step2, step1_intact, &c), 5); /* the writer's own, each failed */
  expect_latest(c.dir, 2);
  loom_ckpt_remove(c.dir);
  loom_parallel_free(&c.ps);
  loom_adamw_free(&opt);
  loom_gpt_params_free(&whole);
}
END_TEST

static void copy_file(const char *from, const char *to) {
  size_t n;
  char *bytes = tu_read_bytes(from, &n);
  tu_write_bytes(to, bytes, n);
  free(bytes);
}

/* What verify refuses, resume refuses too, naming the file: a shard copied
 * in from another step (same size, every piece's CRC intact), a manifest
 * copied in from another step, and a flipped bit in the manifest. */
START_TEST(loads_refuse_what_verify_refuses) {
  loom_gpt_params whole;
  loom_adamw opt;
  whole_state(&whole, &opt);
  save_case c = save_case_of("stale", &whole, &opt);
  loom_error err = {0};
  int64_t bytes, step;
  char one[4200], two[4200], path[4300], keep[4400];
  loom_ckpt_step_dir(c.dir, 1, one, sizeof one);
  loom_ckpt_step_dir(c.dir, 2, two, sizeof two);
  const char *files[2] = {"rank_00000.shard", "manifest.pb"};
  for (int k = 0; k < 3; k++) {
    ck_assert_int_eq(loom_ckpt_save(c.dir, 1, 0, &c.ch, 1, &c.ps, &c.run, &bytes, &err), LOOM_OK);
    ((float *)whole.params.base)[0] += 1.0f; /* step 2 holds other values */
    ck_assert_int_eq(loom_ckpt_save(c.dir, 2, 0, &c.ch, 1, &c.ps, &c.run, &bytes, &err), LOOM_OK);
    snprintf(path, sizeof path, "%s/%s", two, k < 2 ? files[k] : "manifest.pb");
    snprintf(keep, sizeof keep, "%s.good", path);
    copy_file(path, keep);
    if (k < 2) {
      char from[4300];
      snprintf(from, sizeof from, "%s/%s", one, files[k]);
      copy_file(from, path);
    } else {
      size_t n;
      unsigned char *m = tu_read_bytes(path, &n);
      m[n / 2] ^= 0x10;
      tu_write_bytes(path, m, n);
      free(m);
    }
    loom_ckpt_run from;
    const loom_status st = loom_ckpt_resume(c.dir, &c.ch, 1, &c.run, &from, &step, &err);
    ck_assert_msg(st == LOOM_ERR_FORMAT, "case %d: resume accepted a tampered checkpoint (step %lld)", k, (long long)step);
    ck_assert_msg(strstr(err.msg, k == 0 ? "rank_00000.shard" : "manifest.pb") && !strchr(err.msg, '\n'), "case %d: %s", k,
                  err.msg);
    int shards, tensors;
    ck_assert_int_eq(loom_ckpt_verify(c.dir, &shards, &tensors, &err), LOOM_ERR_FORMAT);
    copy_file(keep, path); /* repaired, it loads again */
    unlink(keep);
    ck_assert_msg(loom_ckpt_resume(c.dir, &c.ch, 1, &c.run, &from, &step, &err) == LOOM_OK && step == 2, "%s", err.msg);
  }
  loom_ckpt_remove(c.dir);
  loom_parallel_free(&c.ps);
  loom_adamw_free(&opt);
  loom_gpt_params_free(&whole);
}
END_TEST

/* A manifest from outside with a valid checksum but sizes out of bounds (a
 * layout whose rank count wraps in int, or a zero tp that would divide), or
 * a model that breaks its own rules, is refused as it is decoded, naming the
 * field. */
START_TEST(manifest_sizes_are_bounded) {
  loom_gpt_params whole;
  loom_adamw opt;
  whole_state(&whole, &opt);
  save_case c = save_case_of("bounds", &whole, &opt);
  loom_error err = {0};
  int64_t bytes;
  ck_assert_int_eq(loom_ckpt_save(c.dir, 1, 0, &c.ch, 1, &c.ps, &c.run, &bytes, &err), LOOM_OK);
  char dir[4200], path[4300];
  loom_ckpt_step_dir(c.dir, 1, dir, sizeof dir);
  snprintf(path, sizeof path, "%s/manifest.pb", dir);
  size_t n;
  uint8_t *good = (uint8_t *)tu_read_bytes(path, &n);
  Loom__CheckpointManifest *mf;
  ck_assert_msg(loom_manifest_decode(good, n, 1, path, &mf, &err) == LOOM_OK, "%s", err.msg);
  const int32_t tps[2] = {0, 4096};
  const char *expected[2] = {"parallel.tp = 0: must be 1 to 4096",
                             "parallel.tp x parallel.cp x parallel.dp x parallel.pp = 4294967296: must be at most 2147483647"};
  for (int k = 0; k < 2; k++) {
    mf->parallel->tp = tps[k];
    mf->parallel->dp = 1 << 20;
    ck_assert(loom_manifest_seal(mf)); /* sealed again as a writer would: the checksum holds */
    uint8_t *bad = malloc(loom__checkpoint_manifest__get_packed_size(mf));
    const size_t len = loom__checkpoint_manifest__pack(mf, bad);
    Loom__CheckpointManifest *out;
    ck_assert_int_eq(loom_manifest_decode(bad, len, 1, path, &out, &err), LOOM_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, expected[k]) && strstr(err.msg, "manifest.pb"), "%s", err.msg);
    free(bad);
  }
  /* The model's own rules too: key/value heads that do not divide the query heads. */
  mf->parallel->tp = 1;
  mf->model->has_kv_heads = 1;
  mf->model->kv_heads = 3;
  ck_assert(loom_manifest_seal(mf));
  uint8_t *bad = malloc(loom__checkpoint_manifest__get_packed_size(mf));
  const size_t len = loom__checkpoint_manifest__pack(mf, bad);
  Loom__CheckpointManifest *out;
  ck_assert_int_eq(loom_manifest_decode(bad, len, 1, path, &out, &err), LOOM_ERR_FORMAT);
  ck_assert_msg(strstr(err.msg, "model.kv_heads = 3: must divide model.heads (4)"), "%s", err.msg);
  free(bad);
  /* A manifest re-sealed to claim a wider model than its shards hold passes
   * every check of the manifest alone; verify holds the shards to it. */
  int shards, tensors;
  ck_assert_msg(loom_ckpt_verify(c.dir, &shards, &tensors, &err) == LOOM_OK, "%s", err.msg);
  mf->model->has_kv_heads = 0;
  mf->model->hidden *= 2;
  ck_assert(loom_manifest_seal(mf));
  bad = malloc(loom__checkpoint_manifest__get_packed_size(mf));
  tu_write_bytes(path, bad, loom__checkpoint_manifest__pack(mf, bad));
  ck_assert_int_eq(loom_ckpt_verify(c.dir, &shards, &tensors, &err), LOOM_ERR_FORMAT);
  ck_assert_msg(strstr(err.msg, "elements of it; the manifest's model (hidden ") && strstr(err.msg, "step_00000001"), "%s", err.msg);
  free(bad);
  loom__checkpoint_manifest__free_unpacked(mf, NULL);
  free(good);
  loom_ckpt_remove(c.dir);
  loom_parallel_free(&c.ps);
  loom_adamw_free(&opt);
  loom_gpt_params_free(&whole);
}
END_TEST

/* FP8 delayed scaling's state from a manifest: copied where it fits the run
 * (its scales, and its history under the same length), the history
 * restarted under another length, the run's scales kept where none was
 * saved, and refused (one line naming what) for another operand count, a
 * scale not positive and finite, or a negative amax. */
START_TEST(fp8_state_is_checked) {
  enum { COUNT = 3, LEN = 2 };
  float saved_scale[COUNT] = {2.0f, 0.5f, 448.0f}, saved_hist[COUNT * LEN] = {1, 2, 3, 4, 5, 6};
  Loom__TrainState ts = LOOM__TRAIN_STATE__INIT;
  ts.n_fp8_scale = COUNT, ts.fp8_scale = saved_scale, ts.n_fp8_amax_history = COUNT * LEN, ts.fp8_amax_history = saved_hist;
  Loom__CheckpointManifest mf = LOOM__CHECKPOINT_MANIFEST__INIT;
  mf.state = &ts;
  float scale[COUNT], hist[COUNT * 4];
  loom_ckpt_run run = {.fp8_scale = scale, .fp8_history = hist, .fp8_count = COUNT};
  run.cfg.fp8 = (loom_fp8_config){.on = true, .history = LEN};
  loom_error err = {0};
  for (int i = 0; i < COUNT * 4; i++) hist[i] = -1.0f;
  ck_assert_int_eq(loom_manifest_fp8("ck", &mf, &run, &err), LOOM_OK);
  ck_assert(memcmp(scale, saved_scale, sizeof saved_scale) == 0 && memcmp(hist, saved_hist, sizeof saved_hist) == 0);
  run.cfg.fp8.history = 4; /* another length: the scales carry on, the history starts empty */
  ck_assert_int_eq(loom_manifest_fp8("ck", &mf, &run, &err), LOOM_OK);
  ck_assert(scale[2] == 448.0f && hist[0] == 0.0f && hist[COUNT * 4 - 1] == 0.0f);
  run.cfg.fp8.history = LEN;
  run.fp8_count = COUNT - 1;
  ck_assert_int_eq(loom_manifest_fp8("ck", &mf, &run, &err), LOOM_ERR_FORMAT);
  ck_assert_str_eq(err.msg, "ck: holds 3 FP8 scales with 6 amax history values, but this run's model has blocks x linears x "
                            "operands = 2 FP8 operands");
  run.fp8_count = COUNT;
  saved_scale[1] = NAN;
  ck_assert_int_eq(loom_manifest_fp8("ck", &mf, &run, &err), LOOM_ERR_FORMAT);
  ck_assert_str_eq(err.msg, "ck: FP8 scale 1 is nan; the checkpoint is damaged");
  saved_scale[1] = 0.5f, saved_hist[4] = -1.0f;
  ck_assert_int_eq(loom_manifest_fp8("ck", &mf, &run, &err), LOOM_ERR_FORMAT);
  ck_assert_str_eq(err.msg, "ck: FP8 amax history value 4 is -1; the checkpoint is damaged");
  ts.n_fp8_scale = ts.n_fp8_amax_history = 0; /* saved without it: the run's scales stand */
  scale[0] = 1.0f;
  ck_assert_int_eq(loom_manifest_fp8("ck", &mf, &run, &err), LOOM_OK);
  ck_assert(scale[0] == 1.0f);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ckpt");
  TCase *tc = tcase_create("ckpt");
  tcase_set_timeout(tc, 120); /* the allocation-failure loops run under ASan in scripts/test.sh */
  tcase_add_test(tc, crc32c_known_answers);
  tcase_add_test(tc, manifest_sizes_are_bounded);
  tcase_add_test(tc, round_trip);
  tcase_add_test(tc, fp8_state_is_checked);
  tcase_add_test(tc, corruption_is_refused);
  tcase_add_loop_test(tc, loads_onto_other_plans, 0, 2);
  tcase_add_test(tc, writer_survives_allocation_failure);
  tcase_add_test(tc, loads_refuse_what_verify_refuses);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
