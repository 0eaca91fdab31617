/* Context parallelism's attention, as Megatron-Core's ring ("p2p") runs it.
 *
 * The sequence of T rows is cut into 2 cp chunks and rank r of the cp
 * group holds chunks r and 2 cp - 1 - r (the load-balanced causal split:
 * every rank does the same causal work). Each rank's queries meet every
 * rank's keys and values: its own block first, then each peer's as the
 * blocks travel round the ring (rank r sends to r + 1, receives from
 * r - 1), the next block's transfer posted before the current block is
 * computed, so the two overlap. The blocks' softmaxes merge by their
 * log-sum-exps (ops.h's attention_block_forward). Backward passes the
 * blocks round again, each with its dk/dv accumulating as it goes (each
 * rank's share computed while the sum before it arrives, the new sum sent
 * beside the next block's compute), one more hop bringing them home. Only the key/value heads travel (grouped-query
 * and multi-query send their few heads).
 *
 * Megatron-Core's all-gather variant (--cp-comm-type all_gather, as Llama
 * 3 trained) runs behind the same calls: every rank's block all-gathered
 * before the attention (again in backward), each block's share computed
 * from it, and the blocks' grads reduce-scattered home after. */
#ifndef LOOM_RING_ATTENTION_H
#define LOOM_RING_ATTENTION_H

#include "backend/ops.h"
#include "comm/comm.h"

/* The global positions of rank r's rows out of cp: chunk r's, then chunk
 * 2 cp - 1 - r's, each T / (2 cp) rows (T a multiple of 2 cp). */
void loom_cp_positions(int cp, int rank, int T, int *pos);

/* Rows [row, row + rows) of a rank's share whose global positions run on
 * from pos. */
typedef struct {
  int row, rows, pos;
} loom_cp_run;
/* The runs of consecutive global positions among rows [first, first +
 * rows) of rank `rank`'s share of a sequence of T split over cp (cp 1:
 * the sequence itself, one run): at most two, as a run ends with the
 * rank's first chunk. Returns how many; their row counts from 0. */
int loom_cp_runs(int cp, int rank, int T, int first, int rows, loom_cp_run runs[2]);

/* Rows (a block's, [rows, B]) of k | v packed from qkv rows (the q | k | v layout of s) into kv (2 K D apart). */
void loom_ring_pack_kv(const loom_ops *ops, float *kv, const float *qkv, int rows, const loom_attn_shape *s);
/* And back: the packed grads dkv added into dqkv's k | v columns. */
void loom_ring_unpack_dkv(const loom_ops *ops, float *dqkv, const float *dkv, int rows, const loom_attn_shape *s);

/* What the ring did with its time, kept while `on` (traces): spans of
 * (kind, start, end), the times in nanoseconds from `origin` (a loom_now_s
 * time).
 * BLOCK: a block's attention (the next block in flight beside it, where
 * the ring posted one); WAIT: waiting for a block's transfer after it;
 * GRADS: the last hop bringing this rank's block's grads home; GATHER: the
 * all-gather variant's collectives. */
typedef enum { LOOM_RING_BLOCK = 0, LOOM_RING_WAIT, LOOM_RING_GRADS, LOOM_RING_GATHER, LOOM_RING_SPAN_KINDS } loom_ring_span_kind;
extern const char *const LOOM_RING_SPAN_NAMES[]; /* "ring block", ... by kind */
typedef struct {
  bool on;
  double origin;
  int64_t *spans; /* [count][3] */
  int count, cap;
} loom_ring_log;
void loom_ring_log_free(loom_ring_log *log);

/* What a ring call needs besides its tensors: the cp group (NULL: one
 * rank), this rank's positions (host, [rows]) and room for a peer's,
 * and (backend memory, a block [rows, B, 2 K D]) two travelling blocks of
 * keys and values and, backward, three of their grads (two travelling
 * sums, and this rank's share); all_gather: kv[0] and dkv[0] this rank's
 * block and its grads, kv[1] and dkv[1] every rank's, cp blocks each, no
 * dkv[2] (loom_ring_buffer_blocks). */
typedef struct {
  loom_comm *group;
  int rows;            /* this rank's rows: T / cp */
  const int *pos;      /* [rows] their global positions */
  int *peer_pos;       /* [rows] scratch: a block's positions */
  bool all_gather;     /* Megatron's all-gather variant, not the ring */
  float *kv[2], *dkv[3];
  loom_ring_log *log;  /* where its time goes while tracing (NULL: nowhere) */
} loom_ring;

/* Blocks buffer i of kv (0 or 1) and of dkv (0 to 2) holds, of a cp group's ring or all-gather. */
static inline int loom_ring_buffer_blocks(int cp, bool all_gather, int i) {
  return !all_gather ? 1 : i == 1 ? cp : i == 2 ? 0 : 1;
}

/* out[rows, B, H D] and lse[B, H, rows]: this rank's queries (qkv rows,
 * the whole sequence's attention by s->T) against every rank's keys and
 * values; kv[0] holds this rank's packed block on entry. */
void loom_ring_attention_forward(const loom_ops *ops, const loom_ring *r, float *out, float *lse, const float *qkv,
                                 const loom_attn_shape *s, const loom_dropout *drop);
/* dqkv += this rank's q grads and its own k and v's, every rank's queries'
 * share of them come home; kv[0] holds this rank's packed block on entry. */
void loom_ring_attention_backward(const loom_ops *ops, const loom_ring *r, float *dqkv, const float *dout, const float *out,
                                  const float *qkv, const float *lse, const loom_attn_shape *s, const loom_dropout *drop);

#endif
