/* `loom plan show`'s report, section by section. */
#include <stdio.h>
#include <stdlib.h>
#include "ckpt/local_ckpt.h"
#include "cli/plan_show.h"
#include "layers/gpt.h"
#include "plan/rank_sheet.h"

/* GiB for real models, MiB for small ones: the unit the tables print in. */
static double g_unit = 1073741824.0;
static double gib(double bytes) { return bytes / g_unit; }

static void show_model(const loom_plan *p, const loom_gpt_config *cfg) {
  const Loom__Parallel *l = p->parallel;
  const Loom__Model *m = p->model;
  char active[64] = "";
  if (loom_gpt_is_moe(cfg)) snprintf(active, sizeof active, " (%zu active per token)", loom_gpt_active_param_count(cfg));
  printf("plan%s%s: %d layers, hidden %d, heads %d, ffn %d, vocab %d, seq %d: %lld parameters%s\n", p->name ? " " : "",
         p->name ? p->name : "", m->layers, m->hidden, m->heads, m->ffn, m->vocab, m->seq,
         (long long)p->estimates->total_parameters, active);
  const int etp = l->etp > 1 ? l->etp : 1;
  char split[32] = "";
  if (etp > 1) snprintf(split, sizeof split, "etp %d x ", etp);
  if (l->ep > 1 || etp > 1)
    printf("experts: %sep %d x expert-data-parallel %d in each MoE layer, %d of %d experts on each rank%s\n", split, l->ep,
           loom_plan_expert_replicas(p), cfg->moe.experts / l->ep, cfg->moe.experts, etp > 1 ? ", each split over the tp group" : "");
  char arch[LOOM_ARCHITECTURE_LEN];
  if (*loom_gpt_config_architecture(cfg, l->tp, arch, sizeof arch)) printf("architecture: %s\n", arch);
}

static void show_layout(const loom_plan *p) {
  const Loom__Parallel *l = p->parallel;
  char cp[96] = "", zero[16] = "";
  if (l->cp > 1) snprintf(cp, sizeof cp, " x cp %d", l->cp);
  if (l->zero_stage) snprintf(zero, sizeof zero, ", ZeRO-%d", l->zero_stage);
  printf("layout: tp %d x pp %d x dp %d%s = %lld ranks (tp fastest, then %sdp, then pp), %d chunks per pipeline rank%s%s\n",
         l->tp, l->pp, l->dp, cp, (long long)loom_plan_ranks(p), l->cp > 1 ? "cp, then " : "", l->virtual_chunks,
         l->sequence_parallel ? ", sequence parallel" : "", zero);
  const loom_plan_overlap overlap = loom_plan_overlaps(p);
  printf("overlap: tp collectives %s, dp grads %s%s%s\n", overlap.tp_comm ? "beside their GEMMs (--tp-comm-overlap)" : "between GEMMs",
         overlap.grad_reduce ? "reduced in buckets during backward" : "reduced after backward",
         overlap.param_gather ? ", ZeRO's weight gather beside the next forward (--overlap-param-gather)" : "",
         overlap.p2p ? "" : ", each pipeline send waited for (--no-overlap-p2p-communication)");
  if (p->fp8 != LOOM__FP8_FORMAT__FP8_NONE) {
    char line[512];
    const loom_fp8_config c = loom_plan_fp8(p);
    loom_fp8_describe(&c, (int)p->model->layers, line, sizeof line);
    printf("%s\n", line);
  }
  if (l->cp > 1)
    printf("context: each sequence of %d split over cp %d, %d rows per rank (chunks r and %d - r), keys and values %s\n",
           loom_plan_train_seq(p), l->cp, loom_plan_train_seq(p) / l->cp, 2 * l->cp - 1,
           l->cp_comm_type == LOOM__CP_COMM_TYPE__CP_COMM_ALL_GATHER ? "all-gathered" : "round a ring");
}

static void show_batch(const loom_plan *p, const loom_gpt_config *cfg) {
  const int T = loom_plan_train_seq(p);
  printf("batch: %d sequences per step = %d micro-batches of %d x dp %d | schedule %s | bubble %.1f%%\n",
         p->batch->global_batch, loom_plan_micro_batches(p), p->batch->micro_batch, p->parallel->dp,
         loom_schedule_kind_name(p->schedule), 100.0 * p->estimates->bubble);
  const double per_token = loom_gpt_train_flops(cfg, T, 1.0, LOOM_FLOPS_MEGATRON);
  printf("model FLOPs: %.1f GFLOP per token of a %d-token sequence (Megatron's count, causal attention halved), %.4g PFLOP per step\n",
         per_token / 1e9, T, per_token * (double)p->batch->global_batch * T / 1e15);
  printf("precision: %s, grads reduced over %s in %s\n",
         loom_plan_compute_dtype(p) == LOOM_DTYPE_BF16 ? "bf16 mixed precision (fp32 master weights)" : "fp32",
         p->parallel->cp > 1 ? "dp x cp" : "dp", loom_plan_grad_reduce_dtype(p) == LOOM_DTYPE_BF16 ? "bf16" : "fp32");
  const double shard = loom_plan_checkpoint_shard_bytes(p);
  printf("checkpoint: a rank's shard up to %.2f GiB (its fp32 weights and Adam state); in host memory, "
         "--local-save-every keeps %.0f such copies a rank (%.2f GiB)\n", shard / 1073741824.0,
         loom_local_ckpt_host_bytes(1.0), loom_local_ckpt_host_bytes(shard) / 1073741824.0);
}

/* What the grads send over dp, as the plan's estimates count it. Psi counts in the run's precision, as
 * DeepSpeed's volumes do (its grads and weights are fp16). */
static void show_traffic(const loom_plan *p) {
  const Loom__Parallel *l = p->parallel;
  const loom_dp_traffic t = loom_plan_dp_traffic(p);
  if (t.expert_most > 0.0)
    printf("expert traffic: a rank sends up to %.2f MiB per step over its experts' data-parallel group of %d (their grads%s)\n",
           t.expert_most / 1048576.0, loom_plan_expert_replicas(p), l->zero_stage ? " and weights, sharded as ZeRO shards them" : "");
  const loom_compression gc = loom_plan_compression(p);
  if (gc.kind != LOOM__COMPRESSION_KIND__COMPRESSION_NONE) {
    char method[64];
    loom_compression_describe(&gc, method, sizeof method);
    printf("grad compression: %s with error feedback: the grads of one tp rank's model send %.0f words per step over "
           "dp instead of %.0f (%.1fx fewer bytes)\n", method, t.sent_words, t.whole_words,
           t.sent_words > 0 ? t.whole_words / t.sent_words : 0.0);
  }
  if (l->dp < 2) return;
  const double f32 = (double)loom_dtype_size(LOOM_DTYPE_F32), psi = (double)loom_dtype_size(loom_plan_compute_dtype(p));
  const double words = t.busiest_words;
  printf("dp traffic: a rank sends up to %.2f MiB per step over dp, %.2f x its fp32 shard, %.2f Psi for a shard of "
         "Psi parameters in the run's precision (ring collectives, %d micro-batches; plain data parallelism and "
         "ZeRO-1/2 at one micro-batch send 2(d-1)/d Psi, ZeRO-3 3(d-1)/d Psi)\n", t.busiest_bytes / 1048576.0,
         words > 0 ? t.busiest_bytes / (f32 * words) : 0.0, words > 0 ? t.busiest_bytes / (psi * words) : 0.0,
         loom_plan_micro_batches(p));
}

static void show_grid(const loom_plan *p) {
  const Loom__Parallel *l = p->parallel;
  const long long ranks = (long long)loom_plan_ranks(p);
  printf("\nrank grid (global rank: tp,%s dp, pp):\n", l->cp > 1 ? " cp," : "");
  const int shown = ranks < 64 ? (int)ranks : 64;
  for (int r = 0; r < shown; r++) {
    const loom_grid_coords c = loom_parallel_coords(r, (loom_grid_coords){l->tp, l->cp, l->dp, l->pp});
    char at[16] = "";
    if (l->cp > 1) snprintf(at, sizeof at, " cp %d", c.cp);
    printf("  %4d: tp %d%s dp %d pp %d%s", r, c.tp, at, c.dp, c.pp, (r + 1) % 4 == 0 || r + 1 == shown ? "\n" : "");
  }
  if (shown < ranks) printf("  ... %lld more ranks, same pattern\n", ranks - shown);
}

static void show_stages(const loom_plan *p) {
  int64_t most = 0;
  for (size_t k = 0; k < p->n_stages; k++) most = p->estimates->stages[k]->activations > most ? p->estimates->stages[k]->activations : most;
  g_unit = most >= 1073741824 ? 1073741824.0 : 1048576.0;
  printf("\nstages, memory per rank in %s (%s; grads and Adam's moments fp32; activations for the micro-batches in flight):\n",
         g_unit > 1048576.0 ? "GiB" : "MiB",
         loom_plan_compute_dtype(p) == LOOM_DTYPE_BF16 ? "bf16 mixed precision: bf16 weights, an fp32 master copy" : "fp32 weights");
  printf("  %-7s %-5s %-10s %-15s %8s %8s %8s %9s %9s %9s %9s %9s %8s %7s %8s\n", "pp_rank", "chunk", "layers",
         "parameters", "weights", "master", "grads", "adam", "adam z", "transit", "acts", "acts rc", "B->W", "p2p", "cmp");
  for (size_t k = 0; k < p->n_stages; k++) {
    const Loom__Stage *s = p->stages[k];
    const Loom__StageEstimate *x = p->estimates->stages[k];
    char layers[32];
    snprintf(layers, sizeof layers, "[%d,%d)%s%s", s->layer_begin, s->layer_end, s->embedding ? "E" : "", s->head ? "H" : "");
    printf("  %-7d %-5d %-10s %-15lld %8.2f %8.2f %8.2f %9.2f %9.2f %9.2f %9.2f %9.2f %8.2f %7.3f %8.2f\n", s->pp_rank,
           s->chunk, layers, (long long)x->parameters, gib((double)x->weights), gib((double)x->master_weights),
           gib((double)x->grads), gib((double)x->optimizer), gib((double)x->optimizer_zero1), gib((double)x->zero_transient),
           gib((double)x->activations), gib((double)x->activations_recompute), gib((double)x->weight_grad_states),
           gib((double)x->p2p_buffers), gib((double)x->grad_compression));
  }
  printf("  (E: holds the embedding, H: the LM head; weights, master and grads as the plan's ZeRO stage keeps them; "
         "adam z: Adam sharded by ZeRO over dp%s %d; transit: ZeRO's slices, and under ZeRO-2/3 the gathered weights and "
         "grads of the layers in flight; rc: with full recompute; B->W: what zero-bubble backwards keep from B to W; "
         "cmp: compression's error feedback and factors or messages)\n", p->parallel->cp > 1 ? " x cp" : "",
         loom_plan_grad_replicas(p));
}

/* One pipeline rank's memory by kind, and with `buffers` its buffer list, from its sheet. */
static void show_rank(const loom_rank_sheet *s, bool buffers) {
  const loom_memory mem = loom_rank_sheet_memory(s);
  printf("  pp_rank %-4d %9.2f", s->at.pp, gib(loom_memory_total(&mem)));
  const char *sep = " =";
  for (int k = 0; k < LOOM_MEM_KINDS; k++) {
    if (mem.bytes[k] <= 0) continue;
    printf("%s %s %.2f", sep, loom_memory_kind_name((loom_memory_kind)k), gib(mem.bytes[k]));
    sep = " +";
  }
  printf("\n");
  static const char *const LIFE[] = {"the run", "slot events", "weight-grad state events", "send events"};
  for (int i = 0; buffers && i < s->nbuffers; i++) {
    const loom_buffer_row *r = &s->buffers[i];
    char chunk[24] = "transfers";
    if (r->chunk >= 0) snprintf(chunk, sizeof chunk, "chunk %d", r->chunk);
    printf("    %-9s %-24s %4d x %12zu %-4s = %9.3f  (%s, held by %s)\n", chunk, loom_run_buffer_name(r->name), r->count,
           r->elements, loom_dtype_name(r->dtype), gib(loom_buffer_row_bytes(r)), loom_memory_kind_name(r->kind), LIFE[r->life]);
  }
}

loom_status loom_plan_show(const loom_plan *p, bool buffers, loom_error *err) {
  loom_gpt_config cfg;
  loom_plan_model_config(p, &cfg);
  show_model(p, &cfg);
  show_layout(p);
  show_batch(p, &cfg);
  show_traffic(p);
  show_grid(p);
  show_stages(p);
  printf("\nper pipeline rank, all its chunks (its rank sheet's buffer list: what `loom train` allocates and reports, and "
         "what --device-memory checks)%s:\n", buffers ? ", row by row" : "");
  for (int q = 0; q < p->parallel->pp; q++) {
    loom_rank_sheet sheet;
    const loom_status st = loom_rank_sheet_fill(&sheet, p, loom_plan_pipeline_rank(p, q), err);
    if (st == LOOM_OK) show_rank(&sheet, buffers);
    loom_rank_sheet_free(&sheet);
    if (st != LOOM_OK) return st;
  }
  return LOOM_OK;
}
