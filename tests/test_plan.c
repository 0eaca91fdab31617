/* Partition plans: text and binary round trips, byte-for-byte against protoc
 * (the oracle), malformed and hostile inputs, every validation rule's exact
 * message, balancing, and the gpt50b parameter count.
 * Usage: test_plan PROTOC PROTO_DIR GPT50B_PLAN TINY_PLAN */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "layers/gpt.h"
#include "plan/plan.h"
#include "plan/textformat.h"
#include "schedule/verify.h"
#include "core/fault.h"
#include "cli/names.h"
#include "test_util.h"

static const char *g_protoc, *g_proto_dir, *g_gpt50b, *g_tiny;

static loom_plan_spec base_spec(void) {
  return (loom_plan_spec){.model = {.layers = 8, .hidden = 64, .heads = 4, .vocab = 256, .seq = 32}, .tp = 2, .pp = 2, .dp = 2,
                          .vpp = 1, .micro_batch = 2, .global_batch = 16, .schedule = LOOM__SCHEDULE_KIND__SCHEDULE_1F1B,
                          .balance = LOOM__BALANCE__BALANCE_UNIFORM, .name = "tiny \"quoted\" plan"};
}

static loom_plan *build(const loom_plan_spec *spec) {
  loom_plan *p;
  loom_error err = {0};
  ck_assert_msg(loom_plan_build(spec, &p, &err) == LOOM_OK, "%s", err.msg);
  return p;
}

/* Runs protoc with stdin from `in` and stdout to `out`; returns its exit code. */
static int protoc(const char *mode, const char *in, const char *out) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s --%s=loom.PartitionPlan -I %s %s/loom.proto < %s > %s 2>/dev/null", g_protoc, mode,
           g_proto_dir, g_proto_dir, in, out);
  return system(cmd);
}

static void expect_same_file(const char *a, const char *b) {
  size_t na, nb;
  char *ra = tu_read_bytes(a, &na), *rb = tu_read_bytes(b, &nb);
  ck_assert_msg(na == nb && memcmp(ra, rb, na) == 0, "%s and %s differ (%zu vs %zu bytes)", a, b, na, nb);
  free(ra);
  free(rb);
}

/* text -> ours binary == protoc --encode; ours text == protoc --decode; round trips are the identity. */
static void protoc_agrees(const loom_plan *plan, const char *tag) {
  char txt[200], pb[300], ptxt[300], ppb[300], back[300];
  snprintf(txt, sizeof txt, "%s", tu_tmp_path(tag));
  strcat(txt, ".txtpb");
  snprintf(pb, sizeof pb, "%s.pb", txt);
  snprintf(ppb, sizeof ppb, "%s.protoc.pb", txt);
  snprintf(ptxt, sizeof ptxt, "%s.protoc.txt", txt);
  snprintf(back, sizeof back, "%s.back.txtpb", txt);
  loom_error err = {0};
  ck_assert_int_eq(loom_plan_write(txt, plan, &err), LOOM_OK);
  ck_assert_int_eq(loom_plan_write(pb, plan, &err), LOOM_OK);
  ck_assert_int_eq(protoc("encode", txt, ppb), 0);
  expect_same_file(pb, ppb);
  ck_assert_int_eq(protoc("decode", pb, ptxt), 0);
  expect_same_file(txt, ptxt);
  /* text -> binary -> text */
  loom_plan *again;
  ck_assert_int_eq(loom_plan_read(pb, &again, &err), LOOM_OK);
  ck_assert_int_eq(loom_plan_write(back, again, &err), LOOM_OK);
  expect_same_file(txt, back);
  loom_plan_free(again);
  ck_assert_int_eq(loom_plan_read(txt, &again, &err), LOOM_OK);
  ck_assert_int_eq(loom_plan_write(back, again, &err), LOOM_OK);
  expect_same_file(txt, back);
  loom_plan_free(again);
}

START_TEST(bytes_equal_protoc) {
  loom_plan_spec spec = base_spec();
  loom_plan *p = build(&spec);
  protoc_agrees(p, "plan_a");
  loom_plan_free(p);
  /* Interleaved, sequence parallel, recompute, a cluster with doubles and a big int64. */
  spec.schedule = LOOM__SCHEDULE_KIND__SCHEDULE_INTERLEAVED;
  spec.vpp = 2;
  spec.sequence_parallel = true;
  spec.recompute = true;
  spec.model.dropout = 0.1f;
  spec.balance = LOOM__BALANCE__BALANCE_COMPUTE;
  p = build(&spec);
  p->cluster = malloc(sizeof *p->cluster);
  loom__cluster__init(p->cluster);
  p->cluster->has_nodes = p->cluster->has_device_memory_bytes = p->cluster->has_intra_node_gbps = 1;
  p->cluster->nodes = 64;
  p->cluster->device_memory_bytes = 85899345920LL;
  p->cluster->intra_node_gbps = 450.5;
  protoc_agrees(p, "plan_b");
  loom_plan_free(p);
  /* The Llama family's fields: kv heads, norm, MLP, positions, RoPE's base, no biases, untied. */
  loom_cli_preset("llama-tiny", &spec.model);
  spec.model.seq = 32;
  p = build(&spec);
  ck_assert(p->model->has_kv_heads && p->model->has_rope_theta && p->model->has_bias && p->model->has_tied_embeddings);
  protoc_agrees(p, "plan_c");
  loom_plan_free(p);
}
END_TEST

static void expect_text_error(const char *text, const char *message) {
  ProtobufCMessage *m = NULL;
  loom_error err = {0};
  ck_assert_int_eq(loom_text_parse(&loom__partition_plan__descriptor, text, strlen(text), &m, &err), LOOM_ERR_FORMAT);
  ck_assert_ptr_null(m);
  ck_assert_str_eq(err.msg, message);
}

/* The committed gpt50b plan is canonical text: it reads and writes back byte
 * for byte, protoc agrees, and it holds 51,982,647,296 parameters. */
START_TEST(committed_plan_round_trips) {
  loom_plan *p;
  loom_error err = {0};
  ck_assert_msg(loom_plan_read(g_gpt50b, &p, &err) == LOOM_OK, "%s", err.msg);
  const char *back = tu_tmp_path("gpt50b.txtpb");
  ck_assert_int_eq(loom_plan_write(back, p, &err), LOOM_OK);
  expect_same_file(g_gpt50b, back);
  protoc_agrees(p, "gpt50b_copy");
  ck_assert_int_eq(loom_plan_total_parameters(p), 51982647296LL);
  char lines[1024];
  ck_assert_int_eq(loom_plan_check_rules(p, 512, 85899345920LL, lines, sizeof lines), 0);
  loom_plan_free(p);
  /* The hand-written example (comments, one-line stages) encodes exactly as protoc encodes it. */
  ck_assert_msg(loom_plan_read(g_tiny, &p, &err) == LOOM_OK, "%s", err.msg);
  char ours[300], theirs[300];
  snprintf(ours, sizeof ours, "%s.pb", tu_tmp_path("tiny"));
  snprintf(theirs, sizeof theirs, "%s.protoc.pb", tu_tmp_path("tiny"));
  ck_assert_int_eq(loom_plan_write(ours, p, &err), LOOM_OK);
  ck_assert_int_eq(protoc("encode", g_tiny, theirs), 0);
  expect_same_file(ours, theirs);
  ck_assert_int_eq(loom_plan_check_rules(p, 4, 0, lines, sizeof lines), 0);
  loom_plan_free(p);
}
END_TEST

START_TEST(malformed_text_is_refused) {
  expect_text_error("model { layers: 2 }\nbogus: 3\n", "line 2: unknown field 'bogus' in loom.PartitionPlan");
  expect_text_error("model { layers: two }", "line 1: field 'layers': 'two' is not an integer in range");
  expect_text_error("model { layers: 99999999999 }", "line 1: field 'layers': '99999999999' is not an integer in range");
  expect_text_error("model { layers: 2", "line 1: expected '}' before the end of the text");
  expect_text_error("model { layers: 2 layers: 3 }", "line 1: field 'layers' is given twice");
  expect_text_error("name: \"abc", "line 1: unterminated string");
  expect_text_error("schedule: SCHEDULE_FAST", "line 1: field 'schedule': 'SCHEDULE_FAST' is not a value of loom.ScheduleKind");
  expect_text_error("model { tied_embeddings: maybe }", "line 1: field 'tied_embeddings': expected true or false, got 'maybe'");
  expect_text_error("model layers: 2", "line 1: field 'model': expected '{'");
  expect_text_error("format_version 1", "line 1: field 'format_version': expected ':'");
  /* Comments, <> braces, lists and separators are all fine. */
  ProtobufCMessage *m;
  loom_error err = {0};
  const char *ok = "# a plan\nmodel < layers: 2; hidden: 8, >\nstages [{ pp_rank: 0 }, { pp_rank: 1 }]\nname: 'a' \"b\"\n";
  ck_assert_int_eq(loom_text_parse(&loom__partition_plan__descriptor, ok, strlen(ok), &m, &err), LOOM_OK);
  loom_plan *p = (loom_plan *)m;
  ck_assert_int_eq(p->model->hidden, 8);
  ck_assert_uint_eq(p->n_stages, 2);
  ck_assert_str_eq(p->name, "ab");
  loom_plan_free(p);
}
END_TEST

START_TEST(bad_files_are_refused) {
  loom_plan *p;
  loom_error err = {0};
  const char *pb = tu_tmp_path("garbage.pb");
  tu_write_bytes(pb, "\xff\xff\xff\xff\x0f", 5);
  ck_assert_int_eq(loom_plan_read(pb, &p, &err), LOOM_ERR_FORMAT);
  char want[600];
  snprintf(want, sizeof want, "%s: not a binary PartitionPlan (protobuf decoding failed)", pb);
  ck_assert_str_eq(err.msg, want);
  const char *newer = tu_tmp_path("newer.txtpb");
  tu_write_bytes(newer, "format_version: 7\n", 18);
  ck_assert_int_eq(loom_plan_read(newer, &p, &err), LOOM_ERR_FORMAT);
  snprintf(want, sizeof want, "%s: format_version 7 is newer than this loom reads (1); use a newer loom", newer);
  ck_assert_str_eq(err.msg, want);
  ck_assert_int_eq(loom_plan_read("/tmp/plan.json", &p, &err), LOOM_ERR_USAGE);
  ck_assert_str_eq(err.msg, "/tmp/plan.json: a plan file ends in .txtpb (text) or .pb (binary)");
  ck_assert_int_eq(loom_plan_read("/nonexistent.txtpb", &p, &err), LOOM_ERR_IO);
}
END_TEST

/* A bounded fuzz: mutated binary and text plans decode or fail, never crash
 * (the ASan build of this test catches leaks and bad reads). */
START_TEST(decoder_survives_fuzzing) {
  loom_plan_spec spec = base_spec();
  loom_plan *p = build(&spec);
  const size_t n = loom__partition_plan__get_packed_size(p);
  uint8_t *good = malloc(n), *bad = malloc(n);
  loom__partition_plan__pack(p, good);
  char *text = loom_text_print(&p->base);
  const size_t tn = strlen(text);
  char *mut = malloc(tn + 1);
  for (uint32_t i = 0; i < 3000; i++) {
    memcpy(bad, good, n);
    const uint32_t r = i * 2654435761u;
    for (int k = 0; k < 1 + (int)(r % 4); k++) bad[(r >> (k * 5)) % n] ^= (uint8_t)(1u << ((r >> (k * 3)) % 8));
    const size_t len = i % 7 == 0 ? (r >> 8) % n : n; /* truncations too */
    Loom__PartitionPlan *q = loom__partition_plan__unpack(NULL, len, bad);
    if (q) loom__partition_plan__free_unpacked(q, NULL);
    memcpy(mut, text, tn + 1);
    mut[(r >> 3) % tn] = "{}<>:\"#\\x9-[],"[r % 15];
    ProtobufCMessage *m = NULL;
    loom_error err;
    if (loom_text_parse(&loom__partition_plan__descriptor, mut, (i % 5 == 0) ? (r >> 4) % tn : tn, &m, &err) == LOOM_OK)
      protobuf_c_message_free_unpacked(m, NULL);
  }
  free(good);
  free(bad);
  free(mut);
  free(text);
  loom_plan_free(p);
}
END_TEST

/* One row of a test's table of rules: the plan as it stands breaks a rule, with this message. */
static tu_rows g_rules;
static void expect_rule(loom_plan *p, const char *line) {
  char lines[4096];
  const int n = loom_plan_check_rules(p, 0, 0, lines, sizeof lines);
  tu_row(&g_rules, n >= 1 && strstr(lines, line) != NULL, "expected \"%s\" in:\n%s", line, n >= 1 ? lines : "(no rule broken)");
}

/* Megatron-LM's --moe-layer-freq in its every form, into the config's
 * pattern: an integer N (layer l a MoE layer where l % N == 0), and
 * Python's lists with repetitions and sums, quoted as shell scripts pass
 * them; malformed text and a wrong length refused with why. */
START_TEST(moe_layer_freq_parses_megatrons_forms) {
  static const struct {
    const char *text;
    const char *moe; /* per layer of 8: 1 MoE, 0 dense; NULL: refused */
    const char *why;
  } cases[] = {
      {"1", "11111111", NULL},          {"2", "10101010", NULL},          {"3", "10010010", NULL},
      {"([0]*3+[1]*5)", "00011111", NULL}, {"'([1]*8)'", "11111111", NULL}, {"\"[1,0,1,1,0,1,1,0]\"", "10110110", NULL},
      {"([1,1,0]*2+[0]+([1]*1))", "11011001", NULL}, {"( [0] * 2 + [1] * 6 )", "00111111", NULL},
      {"([1]*7)", NULL, "gives 7 entries for the model's 8 layers"}, {"([1]*9)", NULL, "more entries than the model's layers"},
      {"[1,2]", NULL, "each entry must be 1 (a Mixture of Experts) or 0 (dense)"}, {"0", NULL, "an integer must be in [1, 4096]"},
      {"([1]*8", NULL, "expected ')'"}, {"[1]*8]", NULL, "unexpected text after the list"}, {"x", NULL, "expected '[' or '('"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    loom_gpt_config c = {.layers = 8, .moe = {.experts = 4, .topk = 2}};
    char why[160] = "";
    const int rc = loom_gpt_parse_moe_layer_freq(&c, cases[i].text, why, sizeof why);
    if (!cases[i].moe) {
      ck_assert_msg(rc != 0 && strstr(why, cases[i].why), "%s: rc %d, why '%s'", cases[i].text, rc, why);
      continue;
    }
    ck_assert_msg(rc == 0, "%s: %s", cases[i].text, why);
    for (int l = 0; l < 8; l++)
      ck_assert_msg(loom_gpt_layer_is_moe(&c, l) == (cases[i].moe[l] == '1'), "%s: layer %d", cases[i].text, l);
    ck_assert(loom_gpt_has_dense_layers(&c) == (strchr(cases[i].moe, '0') != NULL));
  }
}
END_TEST

START_TEST(each_rule_has_its_message) {
  g_rules = (tu_rows){0};
  loom_plan_spec spec = base_spec();
  loom_plan *p = build(&spec);
  char lines[4096];
  ck_assert_int_eq(loom_plan_check_rules(p, 8, 0, lines, sizeof lines), 0);
  p->model->hidden = 66;
  expect_rule(p, "model.hidden = 66: must be divisible by model.heads (4); pick heads that divide hidden");
  p->model->hidden = 64;
  p->model->heads = 2;
  p->parallel->tp = 4;
  expect_rule(p, "model.heads = 2: must be divisible by parallel.tp (4) so each rank holds whole heads; pick a tp that divides heads");
  p->model->heads = 4;
  p->model->ffn = 250;
  expect_rule(p, "model.ffn = 250: must be divisible by parallel.tp (4); pick a tp that divides ffn");
  p->model->ffn = -4;
  expect_rule(p, "model.ffn = -4: must be 0 to 4194304");
  p->model->ffn = 256;
  p->model->dropout = NAN;
  expect_rule(p, "model.dropout = nan: must be in [0, 1)");
  p->model->dropout = 1.0f;
  expect_rule(p, "model.dropout = 1: must be in [0, 1)");
  p->model->dropout = 0.0f;
  p->model->norm_eps = -1.0f;
  expect_rule(p, "model.norm_eps = -1: must be a positive finite number (1e-5 is GPT-2's)");
  p->model->norm_eps = INFINITY;
  expect_rule(p, "model.norm_eps = inf: must be a positive finite number");
  p->model->norm_eps = 1e-5f;
  p->model->has_kv_heads = 1;
  p->model->kv_heads = 3;
  expect_rule(p, "model.kv_heads = 3: must divide model.heads (4), each key/value head serving a group of query heads");
  p->model->kv_heads = 0;
  expect_rule(p, "model.kv_heads = 0: must be 1 to 4096");
  p->model->kv_heads = 4;
  p->model->heads = 8;
  p->model->ffn = 192;
  p->parallel->tp = 6; /* neither divides the other */
  expect_rule(p, "model.kv_heads = 4 with parallel.tp = 6: tp must divide kv_heads (each rank holds kv_heads / tp) or be a "
                 "multiple of it (each head replicated over tp / kv_heads ranks)");
  p->parallel->tp = 8; /* replicated twice: fine */
  char none[4096];
  ck_assert_msg(loom_plan_check_rules(p, 0, 0, none, sizeof none) == 0, "%s", none);
  p->model->heads = 4;
  p->model->ffn = 256;
  p->parallel->tp = 4;
  p->model->has_kv_heads = 0;
  p->model->position = LOOM__POSITION__POSITION_ROPE;
  p->model->hidden = 60; /* head size 15 */
  expect_rule(p, "model.position = POSITION_ROPE: needs an even head size, but the heads are 15 wide");
  /* An explicit head width (--kv-channels): hidden need not divide by heads then, and it is the one RoPE turns. */
  p->model->has_kv_channels = 1, p->model->kv_channels = 24;
  char fine[4096];
  ck_assert_msg(loom_plan_check_rules(p, 0, 0, fine, sizeof fine) == 0, "%s", fine);
  p->model->kv_channels = 25;
  expect_rule(p, "model.position = POSITION_ROPE: needs an even head size, but the heads are 25 wide");
  p->model->kv_channels = 258;
  expect_rule(p, "model.kv_channels = 258: must be 1 to 256");
  p->model->has_kv_channels = 0, p->model->kv_channels = 0;
  p->model->hidden = 64;
  /* QK-norm is RMSNorm, as the model's norms must be. */
  p->model->has_qk_layernorm = p->model->qk_layernorm = 1;
  expect_rule(p, "model.qk_layernorm = true: normalises q and k with RMSNorm, as the model's other norms; set model.norm = NORM_RMSNORM");
  p->model->has_norm = 1, p->model->norm = LOOM__NORM__NORM_RMSNORM;
  ck_assert_msg(loom_plan_check_rules(p, 0, 0, fine, sizeof fine) == 0, "%s", fine);
  p->model->has_qk_layernorm = p->model->qk_layernorm = 0;
  p->model->has_norm = 0, p->model->norm = LOOM__NORM__NORM_LAYERNORM;
  p->model->rope_theta = 1.0f;
  expect_rule(p, "model.rope_theta = 1: must be a finite number above 1");
  p->model->rope_theta = NAN;
  expect_rule(p, "model.rope_theta = nan: must be a finite number above 1");
  p->model->rope_theta = 10000.0f;
  /* Llama 3.1's RoPE scaling: each field in range. */
  Loom__RopeScaling sc = LOOM__ROPE_SCALING__INIT;
  sc.factor = 8.0f, sc.low_freq_factor = 1.0f, sc.high_freq_factor = 4.0f, sc.original_max_position_embeddings = 8192;
  p->model->rope_scaling = &sc;
  sc.factor = 0.5f;
  expect_rule(p, "model.rope_scaling.factor = 0.5: must be a finite number of at least 1");
  sc.factor = 8.0f, sc.high_freq_factor = 1.0f;
  expect_rule(p, "model.rope_scaling: low_freq_factor 1 and high_freq_factor 1 must be finite with 0 < low < high");
  sc.high_freq_factor = 4.0f, sc.original_max_position_embeddings = 0;
  expect_rule(p, "model.rope_scaling.original_max_position_embeddings = 0: must be at least 1");
  sc.original_max_position_embeddings = 8192;
  p->model->position = LOOM__POSITION__POSITION_LEARNED;
  expect_rule(p, "model.rope_scaling: scales RoPE's frequencies, but model.position is not POSITION_ROPE");
  p->model->position = LOOM__POSITION__POSITION_ROPE;
  /* YaRN's betas (absent: 32 and 1) and attention factor. */
  sc.yarn = 1, sc.has_beta_slow = 1, sc.beta_slow = 40.0f;
  expect_rule(p, "model.rope_scaling: YaRN's beta_fast 32 and beta_slow 40 must be finite with beta_fast > beta_slow > 0");
  sc.has_beta_fast = 1, sc.beta_fast = INFINITY, sc.beta_slow = 1.0f;
  expect_rule(p, "model.rope_scaling: YaRN's beta_fast inf and beta_slow 1 must be finite with beta_fast > beta_slow > 0");
  sc.beta_fast = 32.0f, sc.has_attention_factor = 1, sc.attention_factor = 0.0f;
  expect_rule(p, "model.rope_scaling.attention_factor = 0: must be a finite number above 0");
  sc.attention_factor = 1.2f;
  ck_assert_msg(loom_plan_check_rules(p, 0, 0, fine, sizeof fine) == 0, "%s", fine);
  p->model->rope_scaling = NULL;
  /* Sliding windows: shorter than the sequence, one 1-or-0 entry per layer, the pattern only beside a window. */
  int32_t windowed[9] = {1, 0, 1, 0, 1, 0, 1, 0, 1};
  p->model->window_pattern = windowed, p->model->n_window_pattern = 8;
  expect_rule(p, "model.window_pattern: says which layers are windowed, but model.window_size sets no window");
  p->model->has_window_size = 1, p->model->window_size = p->model->seq;
  expect_rule(p, "model.window_size = 32: a query's window must be shorter than the sequence (model.seq 32)");
  p->model->window_size = 16, p->model->n_window_pattern = 9;
  expect_rule(p, "model.window_pattern: 9 entries, but model.layers = 8; give one per layer (1: a windowed layer, 0: full "
              "attention)");
  p->model->n_window_pattern = 8, windowed[5] = -1;
  expect_rule(p, "model.window_pattern[5] = -1: must be 1 (a windowed layer) or 0 (full attention)");
  windowed[5] = 0;
  ck_assert_msg(loom_plan_check_rules(p, 0, 0, fine, sizeof fine) == 0, "%s", fine);
  p->model->has_window_size = 0, p->model->window_pattern = NULL, p->model->n_window_pattern = 0;
  /* SwiGLU's gated unit. */
  p->model->has_glu_alpha = 1, p->model->glu_alpha = 1.702f;
  expect_rule(p, "model.glu_alpha, model.glu_clamp, model.glu_offset: shape SwiGLU's gated unit, but model.mlp is not "
              "MLP_SWIGLU");
  const Loom__Mlp mlp = p->model->mlp;
  p->model->mlp = LOOM__MLP__MLP_SWIGLU, p->model->glu_alpha = -1.0f;
  expect_rule(p, "model.glu_alpha = -1: must be a finite number of at least 0");
  p->model->glu_alpha = 1.702f, p->model->has_glu_clamp = 1, p->model->glu_clamp = NAN;
  expect_rule(p, "model.glu_clamp = nan: must be a finite number of at least 0");
  p->model->glu_clamp = 7.0f, p->model->has_glu_offset = 1, p->model->glu_offset = INFINITY;
  expect_rule(p, "model.glu_offset = inf: must be a finite number");
  p->model->glu_offset = 1.0f;
  ck_assert_msg(loom_plan_check_rules(p, 0, 0, fine, sizeof fine) == 0, "%s", fine);
  p->model->has_glu_alpha = p->model->has_glu_clamp = p->model->has_glu_offset = 0;
  p->model->mlp = mlp;
  /* Qwen2's biases on q, k and v alone mean something only without the others. */
  p->model->has_qkv_bias = p->model->qkv_bias = 1;
  expect_rule(p, "model.qkv_bias = true: keeps q, k and v's biases where the other linears have none, but model.bias is true");
  p->model->has_qkv_bias = p->model->qkv_bias = 0;
  /* A Mixture of Experts: sizes, then its rules. */
  Loom__Moe moe = LOOM__MOE__INIT;
  moe.experts = 8, moe.topk = 2;
  p->model->moe = &moe;
  p->model->has_bias = 1, p->model->bias = 0;
  moe.experts = 0;
  expect_rule(p, "model.moe.experts = 0: must be 1 to 4096");
  moe.experts = 8, moe.topk = 9;
  expect_rule(p, "model.moe.topk = 9: a token's experts must be at most model.moe.experts (8)");
  moe.topk = 2, moe.score = (Loom__MoeScore)2;
  expect_rule(p, "model.moe.score = 2: must be 0 to 1");
  moe.score = LOOM__MOE_SCORE__MOE_SCORE_SIGMOID, moe.pre_softmax = 1;
  expect_rule(p, "model.moe.pre_softmax = true: orders a softmax before the top-k, but model.moe.score is sigmoid");
  moe.pre_softmax = 0, moe.shared_ffn = 6; /* tp 4 */
  expect_rule(p, "model.moe.shared_ffn = 6: must be divisible by parallel.tp (4)");
  moe.shared_ffn = 0, moe.has_capacity_factor = 1, moe.capacity_factor = -1.0;
  expect_rule(p, "model.moe.capacity_factor = -1: must be a positive finite number up to 1024 (absent: dropless)");
  moe.capacity_factor = NAN;
  expect_rule(p, "model.moe.capacity_factor = nan: must be a positive finite number");
  moe.has_capacity_factor = 0, moe.aux_loss_coeff = -1.0f;
  expect_rule(p, "model.moe: aux_loss_coeff -1 and z_loss_coeff 0 must be finite and at least 0");
  moe.aux_loss_coeff = 0.0f, moe.z_loss_coeff = INFINITY;
  expect_rule(p, "model.moe: aux_loss_coeff 0 and z_loss_coeff inf must be finite and at least 0");
  moe.z_loss_coeff = 0.0f, moe.score = LOOM__MOE_SCORE__MOE_SCORE_SOFTMAX, moe.expert_bias = 1;
  expect_rule(p, "model.moe.expert_bias = true: DeepSeek-V3's aux-loss-free balancing biases sigmoid scores, but "
              "model.moe.score is softmax");
  moe.score = LOOM__MOE_SCORE__MOE_SCORE_SIGMOID, moe.has_bias_update_rate = 1, moe.bias_update_rate = NAN;
  expect_rule(p, "model.moe.bias_update_rate = nan: must be finite, from 0 to 1");
  moe.bias_update_rate = 2.0f;
  expect_rule(p, "model.moe.bias_update_rate = 2: must be finite, from 0 to 1");
  moe.expert_bias = 0, moe.has_bias_update_rate = 0;
  int32_t pattern[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  moe.layer_pattern = pattern, moe.n_layer_pattern = 9; /* 8 layers */
  expect_rule(p, "model.moe.layer_pattern: 9 entries, but model.layers = 8; give one per layer (1: a Mixture of Experts, 0: the dense MLP)");
  moe.n_layer_pattern = 8, pattern[3] = 2;
  expect_rule(p, "model.moe.layer_pattern[3] = 2: must be 1 (a Mixture of Experts) or 0 (the dense MLP)");
  for (int l = 0; l < 8; l++) pattern[l] = 0;
  expect_rule(p, "model.moe.layer_pattern: no layer is a Mixture of Experts; make one a MoE layer, or give the model no experts");
  moe.n_layer_pattern = 0;
  p->model->moe = NULL;
  p->model->has_bias = 0, p->model->bias = 1;
  p->model->position = (Loom__Position)7;
  expect_rule(p, "model.position = 7: must be 0 to 1");
  p->model->position = LOOM__POSITION__POSITION_LEARNED;
  p->model->norm = (Loom__Norm)-1;
  expect_rule(p, "model.norm = -1: must be 0 to 1");
  p->model->norm = LOOM__NORM__NORM_LAYERNORM;
  p->model->mlp = (Loom__Mlp)2;
  expect_rule(p, "model.mlp = 2: must be 0 to 1");
  p->model->mlp = LOOM__MLP__MLP_GELU;
  p->parallel->tp = 2;
  p->stages[1]->layer_begin = 3;
  expect_rule(p, "stages (pp_rank 1 chunk 0): layers [3, 8) should start at 4; every layer must be covered exactly once, in order");
  p->stages[1]->layer_begin = 4;
  p->stages[1]->layer_end = 7;
  expect_rule(p, "stages: cover layers [0, 7) but model.layers = 8; every layer must be covered exactly once");
  p->stages[1]->layer_end = 8;
  /* Multi-token prediction: its modules' blocks after the layers, on the last stage alone. */
  p->model->mtp_num_layers = 1, p->model->has_mtp_num_layers = 1, p->model->position = LOOM__POSITION__POSITION_ROPE;
  expect_rule(p, "stages: cover layers [0, 8) but model.layers = 8 and its MTP modules after them; every layer must be "
              "covered exactly once");
  p->stages[0]->layer_end = 5, p->stages[1]->layer_begin = 5, p->stages[1]->layer_end = 9;
  tu_row(&g_rules, loom_plan_check_rules(p, 0, 0, none, sizeof none) == 0, "the MTP block on the last stage: %s", none);
  p->stages[0]->layer_end = 9, p->stages[1]->layer_begin = 9;
  expect_rule(p, "stages (pp_rank 0 chunk 0): layers [0, 9) hold MTP modules (layers 8 on), which live on the last stage "
              "with the head; end this stage by layer 8");
  p->stages[0]->layer_end = 4, p->stages[1]->layer_begin = 4, p->stages[1]->layer_end = 8;
  p->model->mtp_num_layers = 0, p->model->has_mtp_num_layers = 0, p->model->position = LOOM__POSITION__POSITION_LEARNED;
  p->stages[1]->embedding = 1;
  expect_rule(p, "stages (pp_rank 1 chunk 0): embedding = true; only the first stage holds the embedding");
  p->stages[1]->embedding = 0;
  /* Megatron's block method: a count of the stage's first layers, with recompute on. */
  p->stages[1]->has_recompute_layers = 1, p->stages[1]->recompute_layers = 2;
  expect_rule(p, "stages[1].recompute_layers = 2: says how many layers recompute, but the stage has recompute off");
  p->stages[0]->recompute = p->stages[1]->recompute = 1, p->stages[1]->recompute_layers = 5;
  expect_rule(p, "stages[1].recompute_layers = 5: must be 1 to the stage's 4 layers (its first ones recompute)");
  p->stages[0]->recompute = p->stages[1]->recompute = 0, p->stages[1]->has_recompute_layers = 0;
  p->batch->global_batch = 10;
  expect_rule(p, "batch.global_batch = 10: must be a positive multiple of batch.micro_batch x parallel.dp (4); round it to a multiple");
  p->batch->global_batch = 12; /* 3 micro-batches: fine for 1F1B, not for interleaved on pp 2 */
  p->schedule = LOOM__SCHEDULE_KIND__SCHEDULE_INTERLEAVED;
  expect_rule(p, "micro-batches = 3: not a multiple of parallel.pp (2); the interleaved schedule moves micro-batches through the chunks in groups of pp (batch.global_batch = 12 over batch.micro_batch x parallel.dp = 4); use batch.global_batch = 16");
  p->schedule = LOOM__SCHEDULE_KIND__SCHEDULE_1F1B;
  p->parallel->virtual_chunks = 2;
  expect_rule(p, "parallel.virtual_chunks = 2: needs schedule = interleaved (or zb_v with 2); 1f1b runs one chunk per rank");
  expect_rule(p, "stages: 2 entries, but parallel.pp x parallel.virtual_chunks = 4; give one stage per pipeline rank and chunk");
  p->parallel->virtual_chunks = 1;
  p->parallel->zero_stage = 4;
  expect_rule(p, "parallel.zero_stage = 4: ZeRO stages are 0 (none) to 3");
  p->parallel->zero_stage = 3;
  ck_assert_int_eq(loom_plan_check_rules(p, 8, 0, lines, sizeof lines), 0);
  p->schedule = LOOM__SCHEDULE_KIND__SCHEDULE_ZB_H1;
  expect_rule(p, "schedule = zb_h1 with parallel.zero_stage = 3: ZeRO-2/3 reduce-scatter each layer's grads as its "
                 "backward ends, but zero-bubble schedules run a layer's weight grads long after; use parallel.zero_stage = 0 "
                 "or 1, or schedule = 1f1b");
  p->schedule = LOOM__SCHEDULE_KIND__SCHEDULE_ZB_V;
  expect_rule(p, "parallel.virtual_chunks = 1: schedule = zb_v runs two chunks per rank (a V); set parallel.virtual_chunks = 2");
  p->schedule = LOOM__SCHEDULE_KIND__SCHEDULE_1F1B;
  p->parallel->zero_stage = 0;
  ck_assert_int_eq(loom_plan_check_rules(p, 6, 0, lines, sizeof lines), 1);
  ck_assert_str_eq(lines, "parallel: tp 2 x pp 2 x dp 2 = 8 ranks, but the world has 6; launch 8 ranks or change the layout\n");
  ck_assert_int_eq(loom_plan_check_rules(p, 8, 1000, lines, sizeof lines), 2);
  /* Sizes below a GiB in MiB or KiB, never "0.0 GiB"; the advice follows the larger term. */
  ck_assert_msg(strstr(lines, "stages (pp_rank 0 chunk 0): needs ") && strstr(lines, " per rank, over the device's 1 KiB; ") &&
                !strstr(lines, "0.0 GiB"), "%s", lines);
  loom_plan_free(p);
  tu_rows_done(&g_rules);
}
END_TEST

/* Every size has bounds and every product of sizes is formed in 64 bits: an
 * overflowing layout or batch is refused by name, never wrapped into a small
 * or negative number (or a division by zero). */
static void expect_bound(loom_plan_spec spec, void (*edit)(loom_plan *), const char *line) {
  loom_plan *p = build(&spec);
  edit(p);
  char lines[4096];
  ck_assert_int_ge(loom_plan_validate(p, &(loom_plan_limits){0}, lines, sizeof lines), 1);
  ck_assert_msg(strstr(lines, line) != NULL, "expected \"%s\" in:\n%s", line, lines);
  loom_plan_free(p);
}
static void huge_dp(loom_plan *p) { p->parallel->dp = 2147483647; }
static void wrapping_micro_times_dp(loom_plan *p) { p->batch->micro_batch = 65536, p->parallel->dp = 65536; }
static void huge_vocab(loom_plan *p) { p->model->vocab = 2147483647; }
static void wrapping_rows(loom_plan *p) { p->batch->micro_batch = 1 << 20, p->model->seq = 1 << 20, p->batch->global_batch = 1 << 21; }
static void wrapping_ranks(loom_plan *p) { p->parallel->tp = 4096, p->parallel->pp = 4096, p->parallel->dp = 1 << 20; }
static void too_many_stages(loom_plan *p) { p->parallel->pp = 4096, p->parallel->virtual_chunks = 64; }

START_TEST(sizes_are_bounded) {
  const loom_plan_spec spec = base_spec();
  expect_bound(spec, huge_dp, "parallel.dp = 2147483647: must be 1 to 1048576");
  expect_bound(spec, wrapping_micro_times_dp, "batch.micro_batch x parallel.dp = 4294967296: must be at most 1073741824");
  expect_bound(spec, huge_vocab, "model.vocab = 2147483647: must be 2 to 16777216");
  expect_bound(spec, wrapping_rows, "batch.micro_batch x model.seq = 1099511627776: must be at most 2147483647");
  expect_bound(spec, wrapping_ranks, "parallel.tp x parallel.cp x parallel.dp x parallel.pp = 17592186044416: must be at most 2147483647");
  expect_bound(spec, too_many_stages, "parallel.pp x parallel.virtual_chunks = 262144: must be at most 4096");
}
END_TEST

/* --elastic: dp lowered to the ranks there are, the global batch kept; a
 * world of no whole tp x pp group, or a batch the new dp does not divide,
 * refused by name. */
START_TEST(fit_world_lowers_dp) {
  loom_plan_spec spec = base_spec(); /* tp 2 x pp 2 x dp 2, micro-batch 2, global batch 16 */
  loom_plan *p = build(&spec);
  loom_error err = {0};
  ck_assert_int_eq(loom_plan_fit_world(p, 8, &err), LOOM_OK);
  ck_assert_int_eq(p->parallel->dp, 2);
  ck_assert_int_eq(loom_plan_fit_world(p, 4, &err), LOOM_OK);
  ck_assert_int_eq(p->parallel->dp, 1);
  ck_assert_int_eq(p->batch->global_batch, 16);
  ck_assert_int_eq(loom_plan_micro_batches(p), 8);
  ck_assert_int_eq(p->estimates->stages[0]->optimizer_zero1, p->estimates->stages[0]->optimizer);
  char lines[1024];
  ck_assert_int_eq(loom_plan_validate(p, &(loom_plan_limits){.world = 4}, lines, sizeof lines), 0);
  ck_assert_int_eq(loom_plan_fit_world(p, 3, &err), LOOM_ERR_USAGE);
  ck_assert_str_eq(err.msg, "3 ranks cannot hold one tp 2 x cp 1 x pp 2 group of the plan");
  loom_plan_free(p);
  spec.dp = 4, spec.global_batch = 8; /* one micro-batch of 2 per replica */
  p = build(&spec);
  ck_assert_int_eq(loom_plan_fit_world(p, 10, &err), LOOM_ERR_USAGE);
  ck_assert_str_eq(err.msg, "10 ranks are not whole tp 2 x cp 1 x pp 2 groups; launch 8");
  ck_assert_int_eq(loom_plan_fit_world(p, 12, &err), LOOM_ERR_USAGE);
  ck_assert_str_eq(err.msg, "dp 3 on 12 ranks cannot keep batch.global_batch 8: not a multiple of batch.micro_batch x dp (6)");
  ck_assert_int_eq(p->parallel->dp, 4);
  loom_plan_free(p);
}
END_TEST

START_TEST(balancing_and_counts) {
  loom_plan_spec spec = base_spec();
  spec.model.layers = 30;
  spec.pp = 4;
  spec.dp = 1;
  spec.global_batch = 8;
  loom_plan *p = build(&spec);
  const int uniform[4] = {8, 8, 7, 7};
  for (int s = 0; s < 4; s++) ck_assert_int_eq(p->stages[s]->layer_end - p->stages[s]->layer_begin, uniform[s]);
  loom_plan_free(p);
  /* By parameters, the embedding and head stages take fewer layers. */
  spec.balance = LOOM__BALANCE__BALANCE_PARAMS;
  spec.model.vocab = 50257;
  spec.model.hidden = 256;
  spec.model.heads = 4;
  p = build(&spec);
  const int first = p->stages[0]->layer_end - p->stages[0]->layer_begin, last = p->stages[3]->layer_end - p->stages[3]->layer_begin;
  ck_assert_int_lt(first, 8);
  ck_assert_int_lt(last, 8);
  ck_assert_int_eq(p->stages[3]->layer_end, 30);
  char lines[1024];
  ck_assert_int_eq(loom_plan_check_rules(p, 8, 0, lines, sizeof lines), 0);
  loom_plan_free(p);
  /* The gpt50b model: the layers' table against GPT-2's closed form, 12 l h^2 + 13 l h + (V + s) h + 2 h. */
  const int64_t l = 64, h = 8192, V = 51200, s = 2048;
  spec = (loom_plan_spec){.model = {.layers = 64, .hidden = 8192, .heads = 64, .ffn = 32768, .vocab = 51200, .seq = 2048}, .tp = 1,
                          .pp = 1, .dp = 1, .vpp = 1, .micro_batch = 1, .global_batch = 1};
  p = build(&spec);
  ck_assert_int_eq(loom_plan_total_parameters(p), 12 * l * h * h + 13 * l * h + (V + s) * h + 2 * h);
  ck_assert_int_eq(loom_plan_total_parameters(p), 51982647296LL);
  loom_plan_free(p);
}
END_TEST

/* The estimates are Megatron's published formulas: activations of
 * s*b*h*(34 + 5*a*s/h) bytes per layer and micro-batch in flight without
 * tensor parallelism, and 18 bytes per parameter for mixed-precision Adam,
 * 6 + 12/dp with ZeRO-1. */
/* The plan's in-flight count is the verifier's peak_live for every kind, and
 * for 1F1B and GPipe also Megatron's closed forms: min(pp - rank, m) and m.
 * Under the zero-bubble kinds the weight-grad state estimate is what the
 * runtime allocates for the chunk's most W's waiting at once (and 0 under
 * the others), with and without recompute. */
START_TEST(in_flight_is_the_verifiers_peak) {
  static const int CASES[][3] = {{1, 1, 1}, {2, 1, 4}, {4, 1, 3}, {4, 1, 8}, {4, 2, 8}, {2, 3, 4}, {8, 2, 16}, {2, 2, 3}};
  const loom_schedule_kind kinds[5] = {LOOM_SCHEDULE_1F1B, LOOM_SCHEDULE_GPIPE, LOOM_SCHEDULE_INTERLEAVED,
                                       LOOM_SCHEDULE_ZB_H1, LOOM_SCHEDULE_ZB_V};
  int checked = 0, split = 0;
  for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++)
    for (int k = 0; k < 5; k++)
      for (int rc = 0; rc < 2; rc++) {
        const int pp = CASES[c][0], vpp = CASES[c][1], m = CASES[c][2];
        const bool chunked = kinds[k] == LOOM_SCHEDULE_INTERLEAVED || kinds[k] == LOOM_SCHEDULE_ZB_V;
        if (chunked != (vpp > 1) || (vpp > 1 && pp < 2)) continue;
        if ((kinds[k] == LOOM_SCHEDULE_INTERLEAVED && m % pp) || (kinds[k] == LOOM_SCHEDULE_ZB_V && vpp != 2)) continue;
        const loom_plan_spec spec = {.model = {.layers = pp * vpp * 2, .hidden = 64, .heads = 4, .vocab = 256, .seq = 16},
                                     .tp = 1, .pp = pp, .dp = 1, .vpp = vpp, .micro_batch = 1, .global_batch = m,
                                     .schedule = kinds[k], .recompute = rc};
        loom_plan *p = build(&spec);
        loom_gpt_config cfg;
        loom_plan_model_config(p, &cfg);
        loom_schedule s;
        loom_schedule_report rep;
        loom_error err = {0};
        ck_assert_int_eq(loom_schedule_build(&s, kinds[k], pp, vpp, m, &err), LOOM_OK);
        ck_assert_int_eq(loom_schedule_verify(&s, &rep), LOOM_OK);
        ck_assert_uint_eq(p->estimates->n_stages, (size_t)(pp * vpp));
        for (size_t i = 0; i < p->estimates->n_stages; i++) {
          const Loom__StageEstimate *x = p->estimates->stages[i];
          ck_assert_msg(x->has_in_flight && x->in_flight == rep.peak_live[x->pp_rank], "%s pp %d vpp %d m %d rank %d: %d vs %d",
                        loom_schedule_kind_name(kinds[k]), pp, vpp, m, x->pp_rank, x->in_flight, rep.peak_live[x->pp_rank]);
          const int closed = kinds[k] == LOOM_SCHEDULE_GPIPE ? m : kinds[k] == LOOM_SCHEDULE_1F1B ? (pp - x->pp_rank < m ? pp - x->pp_rank : m) : -1;
          if (closed >= 0) ck_assert_int_eq(x->in_flight, closed);
          ck_assert_int_gt(x->in_flight, 0);
          const loom_stage_range r = loom_plan_stage_range(p, loom_plan_stage_index(p, x->pp_rank, x->chunk));
          const int waiting = loom_schedule_rank_peaks(&s, x->pp_rank, x->chunk).deferred;
          const int redo = rc ? LOOM_RECOMPUTE_ALL : 0;
          const int64_t one = (int64_t)(loom_gpt_activation_bytes(&cfg, 16, 1, 1, false, &r, (loom_recompute){redo, 1}, 1, 1) -
                                        loom_gpt_activation_bytes(&cfg, 16, 1, 1, false, &r, (loom_recompute){redo, 1}, 1, 0));
          ck_assert_int_eq(x->weight_grad_states, one * waiting);
          if (loom_schedule_kind_splits_backward(kinds[k])) ck_assert(waiting > 0 && one > 0), split++;
          else ck_assert_int_eq(waiting, 0);
          checked++;
        }
        loom_schedule_report_free(&rep);
        loom_schedule_free(&s);
        loom_plan_free(p);
      }
  ck_assert_int_ge(checked, 40);
  ck_assert_int_ge(split, 20);
}
END_TEST

/* The activations a plan's stage estimate adds per layer, one micro-batch in flight (no pipeline). */
static double activations_per_layer(loom_plan_spec spec, bool recompute) {
  spec.tp = spec.pp = spec.dp = 1;
  spec.global_batch = spec.micro_batch;
  spec.recompute = recompute;
  double at[2];
  for (int i = 0; i < 2; i++) {
    spec.model.layers = 8 + i;
    loom_plan *p = build(&spec);
    ck_assert_int_eq(p->estimates->stages[0]->in_flight, 1);
    at[i] = (double)(recompute ? p->estimates->stages[0]->activations_recompute : p->estimates->stages[0]->activations);
    loom_plan_free(p);
  }
  return at[1] - at[0];
}

/* The memory model's activations per layer, read off the layers' tables,
 * against Megatron's closed form (Korthikanti et al.), a cross-check and not
 * a second source: s b h (10 + 24/t) 16-bit bytes per layer (34 at t 1,
 * 34/t under SP), twice that in fp32, within 10%. loom keeps flash
 * attention's contract (no s x s scores, as Megatron with flash attention),
 * its norm statistics and log-sum-exps in fp32, and neither dropout mask
 * (it redraws them from its counter-based RNG). With recompute, Megatron's
 * 2 s b h is each layer's input in 16 bits; loom keeps it in fp32. */
START_TEST(activations_cross_check_megatron) {
  loom_plan_spec spec = base_spec();
  const double s = spec.model.seq, b = spec.micro_batch, h = spec.model.hidden, sbh = s * b * h;
  for (int bf16 = 0; bf16 <= 1; bf16++) {
    spec.precision = bf16 ? LOOM__PRECISION__PRECISION_BF16 : LOOM__PRECISION__PRECISION_FP32;
    const double bytes = bf16 ? 1.0 : 2.0, per = activations_per_layer(spec, false), megatron = bytes * 34.0 * sbh;
    ck_assert_msg(fabs(per - megatron) <= 0.1 * megatron, "bf16 %d: %g bytes per layer, Megatron's %g", bf16, per, megatron);
    ck_assert_double_eq(activations_per_layer(spec, true), 4.0 * sbh);
  }
  /* Under tensor parallelism, a model of a single stage: 10 + 24/t, and 34/t with SP. */
  spec.precision = LOOM__PRECISION__PRECISION_BF16;
  for (int sp = 0; sp <= 1; sp++) {
    loom_gpt_config cfg = {.layers = 8, .hidden = 64, .heads = 4, .vocab = 256, .seq = 32, .bf16 = true};
    loom_gpt_config_finish(&cfg);
    const loom_stage_range two = {1, 3, false, false}, one = {1, 2, false, false};
    const double per = (double)loom_gpt_activation_bytes(&cfg, (int)s, (int)b, 2, sp, &two, (loom_recompute){0}, 1, 0) -
                       (double)loom_gpt_activation_bytes(&cfg, (int)s, (int)b, 2, sp, &one, (loom_recompute){0}, 1, 0);
    const double megatron = sp ? 34.0 * sbh / 2 : (10.0 + 24.0 / 2) * sbh;
    ck_assert_msg(fabs(per - megatron) <= 0.1 * megatron, "tp 2 sp %d: %g bytes per layer, Megatron's %g", sp, per, megatron);
  }
}
END_TEST

START_TEST(estimates_follow_megatron) {
  loom_plan_spec spec = base_spec();
  spec.tp = 1;
  spec.pp = 1;
  spec.dp = 4;
  spec.micro_batch = 2;
  spec.global_batch = 8; /* one micro-batch per replica: one in flight */
  spec.precision = LOOM__PRECISION__PRECISION_BF16;
  loom_plan *p = build(&spec);
  const Loom__StageEstimate *x = p->estimates->stages[0];
  const double n = (double)x->parameters;
  ck_assert_double_gt(n, 0.0);
  ck_assert_double_eq_tol((double)(x->weights + x->master_weights + x->grads + x->optimizer), 18.0 * n, 4.0);
  ck_assert_double_eq_tol((double)x->master_weights, 4.0 * n, 1.0);
  loom_plan_free(p);
  /* Under ZeRO-1, the distributed optimizer: the master weights and the moments are both 1/dp. */
  spec.zero_stage = 1;
  p = build(&spec);
  x = p->estimates->stages[0];
  ck_assert_double_eq_tol((double)x->master_weights, 4.0 * n / 4, 1.0);
  ck_assert_double_eq_tol((double)(x->weights + x->master_weights + x->grads + x->optimizer_zero1), (6.0 + 12.0 / 4) * n, 4.0);
  loom_plan_free(p);
  spec.zero_stage = 0;
  spec.precision = LOOM__PRECISION__PRECISION_FP32;
  p = build(&spec);
  const Loom__StageEstimate *y = p->estimates->stages[0];
  ck_assert_double_eq_tol((double)(y->weights + y->grads + y->optimizer), 16.0 * n, 4.0);
  ck_assert_int_eq(y->master_weights, 0);
  loom_plan_free(p);
  /* ZeRO-2 shards the grads too, ZeRO-3 the weights too (an fp32 master of this replica's pieces, nothing
   * whole); what crosses in transit is apart, and the run's per-chunk cost is their sum. */
  for (int zero = 2; zero <= 3; zero++)
    for (int bf16 = 0; bf16 <= 1; bf16++) {
      spec.zero_stage = zero;
      spec.precision = bf16 ? LOOM__PRECISION__PRECISION_BF16 : LOOM__PRECISION__PRECISION_FP32;
      p = build(&spec);
      x = p->estimates->stages[0];
      ck_assert_double_eq_tol((double)x->grads, 4.0 * n / 4, 1.0);
      ck_assert_double_eq_tol((double)x->optimizer_zero1, 8.0 * n / 4, 1.0);
      ck_assert_double_eq_tol((double)x->weights, zero == 3 ? 0.0 : (bf16 ? 2.0 : 4.0) * n, 1.0);
      ck_assert_double_eq_tol((double)x->master_weights, bf16 || zero == 3 ? 4.0 * n / 4 : 0.0, 1.0);
      ck_assert_msg(x->zero_transient > 0 && x->zero_transient < 4.0 * n, "ZeRO-%d transient %lld of %g", zero,
                    (long long)x->zero_transient, n);
      loom_plan_free(p);
    }
}
END_TEST

typedef struct {
  const char *path;
  loom_plan *plan;
} read_case;

static loom_status read_plan(void *ctx, loom_error *err) {
  read_case *c = ctx;
  return loom_plan_read(c->path, &c->plan, err);
}

static void no_plan(void *ctx, loom_status st, const loom_error *err, int k) {
  const read_case *c = ctx;
  (void)st;
  ck_assert_msg(c->plan == NULL && strstr(err->msg, c->path), "allocation %d: %s", k, err->msg);
}

/* Every allocation of the plan loader failing in turn, for a text and a
 * binary plan: each read refuses with one line saying it ran out of memory
 * and returns no plan, and the file is left as it was; then it loads. */
START_TEST(loader_survives_allocation_failure) {
  loom_plan *plan;
  loom_error err = {0};
  ck_assert_msg(loom_plan_read(g_tiny, &plan, &err) == LOOM_OK, "%s", err.msg);
  const char *pb = tu_tmp_path("alloc.pb");
  ck_assert_int_eq(loom_plan_write(pb, plan, &err), LOOM_OK);
  loom_plan_free(plan);
  const char *files[2] = {g_tiny, pb};
  for (int f = 0; f < 2; f++) {
    size_t size, after;
    char *before = tu_read_bytes(files[f], &size);
    read_case c = {files[f], NULL};
    ck_assert_int_ge(tu_each_allocation_failing(read_plan, no_plan, &c), 3);
    char lines[512];
    ck_assert_msg(loom_plan_validate(c.plan, &(loom_plan_limits){.world = 4}, lines, sizeof lines) == 0, "%s", lines);
    loom_plan_free(c.plan);
    char *now = tu_read_bytes(files[f], &after);
    ck_assert(after == size && memcmp(now, before, size) == 0);
    free(now);
    free(before);
  }
}
END_TEST

/* LOOM_FAULT's syntax: a bad spec is refused whole, with the reason. */
START_TEST(fault_specs_are_checked) {
  loom_error err = {0};
  const char *bad[] = {"nope:0:1", "alloc:0", "alloc:x:1", "alloc:0:1:fast", "slow:0:1:-3", "alloc:0:1:2:3"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(loom_fault_arm(bad[i], &err), LOOM_ERR_USAGE);
    ck_assert_msg(strstr(err.msg, bad[i]), "%s", err.msg);
  }
  ck_assert_ptr_nonnull(strstr(err.msg, "name:rank:step"));
  ck_assert_int_eq(loom_fault_arm("nope:0:1", &err), LOOM_ERR_USAGE);
  ck_assert_ptr_nonnull(strstr(err.msg, "known: setup, stall"));
  double arg;
  ck_assert(!loom_fault_fires(LOOM_FAULT_SLOW, 1, &arg)); /* nothing was armed by the bad specs */
  ck_assert_int_eq(loom_fault_arm("slow:0:*:40,nan_grad:3:2", &err), LOOM_OK);
  ck_assert(loom_fault_fires(LOOM_FAULT_SLOW, 9, &arg) && arg == 40.0);
  ck_assert(!loom_fault_fires(LOOM_FAULT_NAN_GRAD, 2, NULL)); /* rank 3's, not this one's (0) */
  loom_fault_set_rank(3);
  ck_assert(loom_fault_fires(LOOM_FAULT_NAN_GRAD, 2, NULL) && !loom_fault_fires(LOOM_FAULT_NAN_GRAD, 3, NULL));
  loom_fault_set_rank(0);
  loom_fault_disarm();
  ck_assert(!loom_fault_fires(LOOM_FAULT_SLOW, 9, NULL));
}
END_TEST

/* A binary plan whose enum holds a value the proto does not define decodes
 * (protobuf keeps unknown enum numbers) but is refused by the one
 * validation, before anything uses it. */
/* PowerSGD in a plan: protoc agrees on the new fields, each of its rules
 * has its message, and the estimate is each matrix's error feedback plus its
 * factors, worked out here by hand for the tiny plan's shards (tp 2, r 4). */
START_TEST(compression_rules_and_estimates) {
  g_rules = (tu_rows){0};
  loom_plan_spec spec = base_spec();
  loom_plan *p = build(&spec);
  ck_assert_ptr_null(p->grad_compression);
  ck_assert_int_eq(p->estimates->stages[0]->grad_compression, 0);
  loom_plan_free(p);
  spec.compression = LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD;
  spec.compression_rank = 4;
  p = build(&spec);
  protoc_agrees(p, "plan_powersgd");
  /* first stage: wte [128,64], wpe [32,64], and 4 layers of c_attn [96,64], attn proj [64,32], c_fc [128,64], mlp proj [64,128] */
  const int64_t layer = (96 * 64 + 160 * 4) + (64 * 32 + 96 * 4) + (128 * 64 + 192 * 4) + (64 * 128 + 192 * 4);
  const int64_t wte = 128 * 64 + 192 * 4, wpe = 32 * 64 + 96 * 4;
  ck_assert_int_eq(p->estimates->stages[0]->grad_compression, 4 * (4 * layer + wte + wpe));
  ck_assert_int_eq(p->estimates->stages[1]->grad_compression, 4 * (4 * layer + wte)); /* the last stage's tied wte */
  const loom_compression_cost c = loom_plan_compression_cost(p, &(loom_stage_range){0, 4, true, false});
  ck_assert_msg(c.whole_words > 5 * c.sent_words, "sends %g words of %g", c.sent_words, c.whole_words);
  char lines[4096];
  ck_assert_int_eq(loom_plan_check_rules(p, 8, 0, lines, sizeof lines), 0);
  p->grad_compression->rank = 0;
  expect_rule(p, "grad_compression = powersgd:0: PowerSGD's rank must be 1 to 1024 (4 is a common choice)");
  p->grad_compression->rank = 1025;
  expect_rule(p, "grad_compression = powersgd:1025: PowerSGD's rank must be 1 to 1024");
  p->grad_compression->rank = 4;
  p->parallel->zero_stage = 1; /* compression sums the grads whole; ZeRO-1 then steps its slice of them */
  ck_assert_int_eq(loom_plan_check_rules(p, 8, 0, lines, sizeof lines), 0);
  p->parallel->zero_stage = 2;
  expect_rule(p, "grad_compression = powersgd: compression sums whole grads, which ZeRO-2 never holds; use parallel.zero_stage 0 or 1, or drop grad_compression");
  p->parallel->zero_stage = 0;
  p->grad_reduce = LOOM__PRECISION__PRECISION_BF16;
  expect_rule(p, "grad_compression = powersgd: compression decides what crosses; set grad_reduce PRECISION_FP32 or drop grad_compression");
  p->grad_reduce = LOOM__PRECISION__PRECISION_FP32;
  p->parallel->dp = 1;
  expect_rule(p, "grad_compression = powersgd: parallel.dp x parallel.cp is 1, so no grads cross data parallelism to compress");
  p->parallel->dp = 2;
  p->grad_compression->kind = (Loom__CompressionKind)7;
  expect_rule(p, "grad_compression.kind = 7: loom knows COMPRESSION_NONE (0), COMPRESSION_POWERSGD (1) and COMPRESSION_SIGN (2)");
  p->grad_compression->kind = LOOM__COMPRESSION_KIND__COMPRESSION_NONE;
  expect_rule(p, "grad_compression.rank = 4: only COMPRESSION_POWERSGD has a rank; remove it or set the kind");
  p->grad_compression->kind = LOOM__COMPRESSION_KIND__COMPRESSION_SIGN;
  expect_rule(p, "grad_compression.rank = 4: only COMPRESSION_POWERSGD has a rank; remove it for COMPRESSION_SIGN");
  p->grad_compression->rank = 0;
  p->parallel->dp = 1;
  expect_rule(p, "grad_compression = sign: parallel.dp x parallel.cp is 1, so no grads cross data parallelism to compress");
  p->parallel->dp = 2;
  ck_assert_int_eq(loom_plan_check_rules(p, 8, 0, lines, sizeof lines), 0);
  p->grad_compression->kind = LOOM__COMPRESSION_KIND__COMPRESSION_NONE;
  ck_assert_int_eq(loom_plan_check_rules(p, 8, 0, lines, sizeof lines), 0);
  loom_plan_free(p);
  /* The sign method: every matrix as a mean and a bit per element, kept with its feedback and dp 2 + 1 messages. */
  spec.compression = LOOM__COMPRESSION_KIND__COMPRESSION_SIGN;
  spec.compression_rank = 0;
  p = build(&spec);
  protoc_agrees(p, "plan_sign");
  const int64_t words[] = {96 * 64, 64 * 32, 128 * 64, 64 * 128}; /* one layer's matrices */
  int64_t state = 128 * 64 + 3 * (1 + (128 * 64 + 31) / 32) + 32 * 64 + 3 * (1 + (32 * 64 + 31) / 32); /* wte, wpe */
  for (int l = 0; l < 4; l++)
    for (int k = 0; k < 4; k++) state += words[k] + 3 * (1 + (words[k] + 31) / 32);
  ck_assert_int_eq(p->estimates->stages[0]->grad_compression, 4 * state);
  loom_plan_free(p);
  tu_rows_done(&g_rules);
}
END_TEST

/* The bytes a rank sends over dp per step, for the first stage of the tiny
 * plan (tp 2, pp 2, dp 2), as ring collectives move them: an all-reduce
 * sends 2 (d-1)/d of its buffer, a reduce-scatter or all-gather (d-1)/d, an
 * all-gather of messages (d-1) of its own. */
static double dp_bytes(loom_plan_spec spec) {
  loom_plan *p = build(&spec);
  const double bytes = (double)p->estimates->stages[0]->dp_bytes_sent;
  loom_plan_free(p);
  return bytes;
}

START_TEST(dp_traffic_follows_ring_collectives) {
  loom_plan_spec spec = base_spec();
  loom_plan *p = build(&spec);
  loom_gpt_config cfg;
  loom_plan_model_config(p, &cfg);
  const loom_stage_range first = {0, 4, true, false};
  const double local = (double)loom_gpt_param_count(&cfg, &first, 2); /* one tp rank's shard */
  ck_assert_msg(local > 50000, "%g parameters", local);
  loom_plan_free(p);
  ck_assert_double_eq(dp_bytes(spec), 2 * 0.5 * 4 * local); /* fp32 all-reduce: 2 (d-1)/d Psi */
  spec.grad_reduce = LOOM__PRECISION__PRECISION_BF16;
  ck_assert_double_eq(dp_bytes(spec), 2 * 0.5 * 2 * local);
  spec.grad_reduce = LOOM__PRECISION__PRECISION_FP32;
  spec.zero_stage = 1; /* fp32 reduce-scatter and all-gather */
  ck_assert_double_eq(dp_bytes(spec), 0.5 * 4 * local + 0.5 * 4 * local);
  spec.precision = LOOM__PRECISION__PRECISION_BF16; /* the distributed optimizer gathers bf16 */
  ck_assert_double_eq(dp_bytes(spec), 0.5 * 4 * local + 0.5 * 2 * local);
  spec.grad_reduce = LOOM__PRECISION__PRECISION_BF16; /* and with bf16 grads (Megatron's default) reduce-scatters bf16 */
  ck_assert_double_eq(dp_bytes(spec), 0.5 * 2 * local + 0.5 * 2 * local);
  spec.zero_stage = 2; /* ZeRO-2 too, every micro-batch's */
  p = build(&spec);
  const double micro = loom_plan_micro_batches(p);
  loom_plan_free(p);
  ck_assert_double_eq(dp_bytes(spec), micro * 0.5 * 2 * local + 0.5 * 2 * local);
  spec.zero_stage = 1;
  spec.grad_reduce = LOOM__PRECISION__PRECISION_FP32;
  spec.precision = LOOM__PRECISION__PRECISION_FP32;
  /* ZeRO-2 reduce-scatters every micro-batch's grads and gathers the weights once: 2 (d-1)/d Psi at one
   * micro-batch. ZeRO-3 gathers them before each forward and each backward (the first stage's edges, wte
   * and wpe, forward only): 3 (d-1)/d Psi at one micro-batch. */
  p = build(&spec);
  const double m = loom_plan_micro_batches(p), edges = 128 * 64 + 32 * 64; /* one tp rank's wte rows (vocab padded to
                                                                                * 256) and wpe, by hand */
  loom_plan_free(p);
  ck_assert_double_ge(m, 2);
  spec.zero_stage = 2;
  ck_assert_double_eq(dp_bytes(spec), m * 0.5 * 4 * local + 0.5 * 4 * local);
  spec.zero_stage = 3;
  ck_assert_double_eq(dp_bytes(spec), m * 0.5 * 4 * local + m * 0.5 * 4 * (2 * local - edges));
  spec.zero_stage = 0;
  spec.compression = LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD;
  spec.compression_rank = 4;
  p = build(&spec);
  const loom_compression_cost psgd = loom_plan_compression_cost(p, &first);
  loom_plan_free(p);
  ck_assert_double_eq(dp_bytes(spec), 2 * 0.5 * 4 * psgd.sent_words);
  spec.compression = LOOM__COMPRESSION_KIND__COMPRESSION_SIGN;
  spec.compression_rank = 0;
  p = build(&spec);
  const loom_compression_cost sign = loom_plan_compression_cost(p, &first);
  loom_plan_free(p);
  ck_assert_msg(sign.message_words > 0 && sign.message_words < sign.sent_words, "%g of %g", sign.message_words,
                sign.sent_words);
  ck_assert_double_eq(dp_bytes(spec), 1 * 4 * sign.message_words + 2 * 0.5 * 4 * (sign.sent_words - sign.message_words));
  spec.compression = LOOM__COMPRESSION_KIND__COMPRESSION_NONE;
  spec.dp = 1;
  spec.global_batch = 8;
  ck_assert_double_eq(dp_bytes(spec), 0.0);
}
END_TEST

/* A rank holds all its chunks: the memory rule adds their needs up, and
 * refuses an interleaved plan each of whose chunks alone would fit. */
START_TEST(memory_check_sums_a_ranks_chunks) {
  loom_plan_spec spec = base_spec();
  spec.schedule = LOOM__SCHEDULE_KIND__SCHEDULE_INTERLEAVED;
  spec.vpp = 2;
  loom_plan *p = build(&spec);
  int64_t largest = 0, rank0 = 0;
  for (size_t k = 0; k < p->estimates->n_stages; k++) {
    const Loom__StageEstimate *x = p->estimates->stages[k];
    const int64_t need = x->weights + x->master_weights + x->grads + x->optimizer + x->zero_transient + x->grad_compression +
                         x->activations + x->p2p_buffers;
    largest = need > largest ? need : largest;
    if (x->pp_rank == 0) rank0 += need;
  }
  ck_assert_int_gt(rank0, largest);
  char lines[4096];
  ck_assert_int_ge(loom_plan_check_rules(p, 8, largest, lines, sizeof lines), 1);
  ck_assert_msg(strstr(lines, "stages (pp_rank 0, its 2 chunks): needs "), "%s", lines);
  ck_assert_int_eq(loom_plan_check_rules(p, 8, rank0 + (rank0 >> 2), lines, sizeof lines), 0);
  loom_plan_free(p);
}
END_TEST

/* The schedule a plan runs ties the embedding's grads across the first and
 * last stage only when the head is the embedding. */
START_TEST(untied_heads_have_nothing_to_tie) {
  for (int untied = 0; untied <= 1; untied++) {
    loom_plan_spec spec = base_spec();
    spec.model.untied = untied;
    loom_plan *p = build(&spec);
    loom_schedule s;
    loom_error err;
    ck_assert_int_eq(loom_plan_schedule(p, &s, &err), LOOM_OK);
    int tied = 0;
    for (int r = 0; r < s.p; r++)
      for (int i = 0; i < s.count[r]; i++) tied += s.actions[r][i].kind == LOOM_ACT_REDUCE_TIED;
    ck_assert_int_eq(tied, untied ? 0 : 2); /* pp 2: one on each end */
    loom_schedule_report rep;
    ck_assert_int_eq(loom_schedule_verify(&s, &rep), LOOM_OK);
    loom_schedule_report_free(&rep);
    loom_schedule_free(&s);
    loom_plan_free(p);
  }
}
END_TEST

START_TEST(undefined_enums_are_refused) {
  loom_plan_spec spec = base_spec();
  loom_plan *p = build(&spec);
  p->schedule = (Loom__ScheduleKind)9;
  const char *pb = tu_tmp_path("enum.pb");
  loom_error err = {0};
  ck_assert_int_eq(loom_plan_write(pb, p, &err), LOOM_OK);
  loom_plan_free(p);
  ck_assert_msg(loom_plan_read(pb, &p, &err) == LOOM_OK, "%s", err.msg);
  ck_assert_int_eq((int)p->schedule, 9);
  char lines[1024];
  ck_assert_int_ge(loom_plan_validate(p, &(loom_plan_limits){.world = 8}, lines, sizeof lines), 1);
  ck_assert_msg(strstr(lines, "schedule = 9: not a schedule kind this loom knows"), "%s", lines);
  loom_plan_free(p);
}
END_TEST

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: test_plan PROTOC PROTO_DIR GPT50B_PLAN TINY_PLAN\n");
    return 2;
  }
  g_tiny = argv[4];
  g_protoc = argv[1];
  g_proto_dir = argv[2];
  g_gpt50b = argv[3];
  Suite *s = suite_create("plan");
  TCase *tc = tcase_create("plan");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, moe_layer_freq_parses_megatrons_forms);
  tcase_add_test(tc, bytes_equal_protoc);
  tcase_add_test(tc, committed_plan_round_trips);
  tcase_add_test(tc, malformed_text_is_refused);
  tcase_add_test(tc, bad_files_are_refused);
  tcase_add_test(tc, decoder_survives_fuzzing);
  tcase_add_test(tc, each_rule_has_its_message);
  tcase_add_test(tc, compression_rules_and_estimates);
  tcase_add_test(tc, dp_traffic_follows_ring_collectives);
  tcase_add_test(tc, sizes_are_bounded);
  tcase_add_test(tc, fit_world_lowers_dp);
  tcase_add_test(tc, balancing_and_counts);
  tcase_add_test(tc, estimates_follow_megatron);
  tcase_add_test(tc, activations_cross_check_megatron);
  tcase_add_test(tc, in_flight_is_the_verifiers_peak);
  tcase_add_test(tc, loader_survives_allocation_failure);
  tcase_add_test(tc, fault_specs_are_checked);
  tcase_add_test(tc, undefined_enums_are_refused);
  tcase_add_test(tc, memory_check_sums_a_ranks_chunks);
  tcase_add_test(tc, untied_heads_have_nothing_to_tie);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
