/* ZeRO stages 1, 2 and 3 over flat parameter buffers (DeepSpeed ZeRO,
 * Megatron's distributed optimizer).
 *
 * The flat buffer of a chunk is cut into buckets (loom_gpt_zero_buckets),
 * and each bucket into one piece per replica of its group, ceil(len / size)
 * elements: replica r owns piece r of every bucket (the last pieces may be
 * short or empty). The group is dp; under expert parallelism the experts'
 * buckets are sharded over the ranks holding the same experts instead (the
 * expert-data-parallel group, as Megatron-Core's distributed optimizer
 * shards them), the rest over dp. ZeRO-1 has one bucket, the whole buffer,
 * unless the experts are apart; otherwise there is one per layer (per run
 * of a layer's experts' or other tensors with the experts apart), plus the
 * tied wte alone (so the first and last stage own the same part of it),
 * wpe, and the final norm, so that a layer's grads are reduce-scattered,
 * and under ZeRO-3 its weights all-gathered, as balanced collectives while
 * the pass goes on. A replica keeps Adam moments for its pieces only and
 * steps them with the same math as plain AdamW: every element is stepped
 * exactly once.
 *
 * - ZeRO-1: grads are whole on every replica and reduce-scattered after the
 *   last backward; the updated weights are all-gathered back. With one
 *   bucket the model's buffers are padded to a multiple of dp
 *   (loom_gpt_params_init_for_zero), so both happen in place; else bucket
 *   by bucket, in rounds through a staging buffer.
 * - ZeRO-2: grads are never whole: each layer's are reduce-scattered as its
 *   backward ends, every micro-batch, and summed into this replica's piece
 *   (`grad`). The weights are whole and all-gathered after the step.
 * - ZeRO-3: as ZeRO-2, and the weights are never whole either: this replica
 *   holds the fp32 weights of its pieces (`master`), and a layer's weights
 *   are all-gathered before each use (the runtime's zero_runtime.c).
 *
 * In bf16 runs (and always under ZeRO-3) the fp32 weights exist only as the
 * pieces in `master`; what crosses dp to compute with is them rounded to
 * bf16. */
#ifndef LOOM_ZERO_H
#define LOOM_ZERO_H

#include "comm/comm.h"
#include "optim/adamw.h"

/* Flat elements [lo, hi) of a chunk whose state starts at `at` in a replica's arrays. */
typedef struct {
  size_t lo, hi, at;
} loom_flat_run;

/* One tensor's part of this replica's pieces: tensor k's flat elements [from, from + len), state at `at`. */
typedef struct {
  int k;
  size_t from, len, at;
} loom_zero_part;

/* The groups buckets are sharded over: the data-parallel replicas, and the
 * experts' (expert-data-parallel) replicas, the same as dp but under expert
 * parallelism. comm NULL: a layout built offline (a reshard), which never
 * communicates. */
enum { LOOM_ZERO_DENSE, LOOM_ZERO_EXPERTS, LOOM_ZERO_GROUPS };
typedef struct {
  int rank, size;
  loom_comm *comm;
} loom_zero_group;

/* A bucket: flat [lo, hi), tensors [k0, k1), cut into its group's size pieces of `shard`. */
typedef struct {
  size_t lo, hi, shard;
  int k0, k1;
  int group; /* LOOM_ZERO_DENSE or LOOM_ZERO_EXPERTS */
} loom_zero_bucket;

typedef struct {
  loom_adamw_config cfg;
  int stage;                 /* 1, 2 or 3 */
  loom_zero_group group[LOOM_ZERO_GROUPS];
  bool in_place;             /* ZeRO-1 as one bucket, reduced and gathered in place (loom_gpt_zero_in_place) */
  int nbuckets;
  loom_zero_bucket *buckets; /* [nbuckets] in buffer order */
  int *layer_first;          /* [layers + 1] local layer l's buckets are [layer_first[l], layer_first[l + 1]);
                              * NULL in place */
  loom_flat_run *runs;       /* [nbuckets] this replica's piece of each (possibly empty) */
  int nparts;
  loom_zero_part *parts;     /* [nparts] the pieces cut by tensor, in buffer order: what the step walks */
  size_t shard;              /* state elements: the buckets' shards summed */
  size_t max_shard;          /* the largest bucket's shard */
  loom_zero_cut cut;         /* the sizes this allocates by (loom_gpt_zero_cut, the memory model's): shard, max_shard agree */
  float *m, *v;              /* [shard] Adam moments of the pieces */
  float *master;             /* [shard] the pieces' fp32 weights when the model holds none, else NULL */
  float *grad;               /* [shard] ZeRO-2/3: the pieces' summed grads, else NULL */
  size_t slice_len;          /* in place: shard; else a round, max_shard up to LOOM_ZERO_GATHER_ROUND */
  float *slice;              /* [slice_len] a piece in transit */
  float *staging;            /* [cut.staging] a round of a bucket crossing its group (ZeRO-2's gathers, ZeRO-1 not
                              * in place), else NULL */
  const loom_allocator *mem; /* the parameters' backend memory, where all of the above lives */
  int step;
} loom_zero;

/* Builds this replica's optimizer state for ZeRO `stage` (1..3), zeroed;
 * for a model without master weights (loom_gpt_params_have_master false)
 * also the master pieces, which the caller fills (loom_zero_randomize, or
 * a checkpoint) and then publishes. p is built by
 * loom_gpt_params_init_for_zero for the same stage and dp; groups are this
 * rank's in the dense and the experts' groups (the same but where
 * loom_gpt_zero_experts_apart). */
loom_status loom_zero_init(loom_zero *z, const loom_gpt_params *p, const loom_zero_group groups[LOOM_ZERO_GROUPS],
                           int stage, const loom_adamw_config *cfg);
void loom_zero_free(loom_zero *z);
/* Draws the master pieces from (seed, canonical names), as
 * loom_gpt_params_randomize draws the whole model. */
void loom_zero_randomize(loom_zero *z, const loom_gpt_params *p, uint64_t seed);
/* This replica's piece of bucket b: its first element (lo + rank * shard in
 * the bucket's group, at most hi) and end. */
void loom_zero_piece(const loom_zero *z, int b, size_t *lo, size_t *hi);
/* Bucket b's group: its communicator, and its size. */
loom_comm *loom_zero_comm(const loom_zero *z, int b);
int loom_zero_group_size(const loom_zero *z, int b);
/* Zeroes the summed grads (ZeRO-2/3; a no-op under ZeRO-1). */
void loom_zero_zero_grad(loom_zero *z);
/* Adds a reduce-scattered piece of bucket b (its shard's worth, padding
 * past the piece ignored) into the summed grads. */
void loom_zero_add_grad(loom_zero *z, int b, const float *piece, const loom_ops *ops);
/* The summed grads of this replica's part of tensor k under ZeRO-2/3 (NULL
 * and 0 if it owns none); *lo gets its first flat element. */
float *loom_zero_tensor_grad(const loom_zero *z, int k, size_t *lo, size_t *len);
/* Makes the grads the sum over their groups: ZeRO-1 reduce-scatters p's
 * grads (unless `summed` says they hold the sum already: grad compression
 * sums them whole), in fp32 or, given grad16 (room for the padded grads;
 * in place only), as bf16 values, each partial sum rounded to bf16 as
 * NCCL's bf16 reduction rounds; ZeRO-2/3 have summed them during backward, and sum the
 * TP-replicated ones over TP under sequence parallelism. Returns the
 * squared norm of this replica's grads, each element once over TP as in
 * loom_grad_sumsq, summed over its groups; the tied copy's (skip_shared)
 * go to *uncounted instead, summed locally (collective over tp, dp and
 * the experts' groups). */
double loom_zero_reduce(loom_zero *z, loom_gpt_params *p, const loom_ops *ops, const loom_tp *tp, bool skip_shared,
                        bool summed, uint16_t *grad16, double *uncounted);
/* Clips by grad_norm and steps this replica's pieces with AdamW; then
 * ZeRO-1 and ZeRO-2 all-gather the weights (collective over the groups),
 * and ZeRO-3 leaves them to the next gather. */
void loom_zero_step(loom_zero *z, loom_gpt_params *p, float lr, double grad_norm, const loom_ops *ops);
/* With master pieces under ZeRO-1/2: rounds them to bf16 and all-gathers
 * every replica's into p's compute copy (collective over the groups); call
 * after the pieces were loaded. A no-op when the model holds its master
 * weights, and under ZeRO-3, which gathers before each use. */
void loom_zero_publish(loom_zero *z, loom_gpt_params *p, const loom_ops *ops);
/* All-gathers bucket b's weights over its group into out[shard * size]
 * (backend memory; the first hi - lo are the bucket's): the master pieces
 * rounded to bf16 when `type` is bf16, else as fp32 (the model's own where
 * it holds them). Non-blocking: `send` ([max_shard] of `type`) and out
 * must stay until the request completes (loom_comm_wait on
 * loom_zero_comm; NULL: done). */
loom_request *loom_zero_gather(loom_zero *z, const loom_gpt_params *p, int b, loom_dtype type, void *send, void *out,
                               const loom_ops *ops);
/* Every replica's fp32 weights gathered into out[numel] (backend memory),
 * in p's layout (collective over the groups). */
void loom_zero_gather_master(loom_zero *z, const loom_gpt_params *p, float *out);
/* Optimizer-state bytes this replica holds: the moments, and the master pieces if any. */
size_t loom_zero_state_bytes(const loom_zero *z);
/* Grad bytes it holds between steps: the summed pieces (ZeRO-2/3), else 0. */
size_t loom_zero_grad_bytes(const loom_zero *z);
/* Bytes of its buffers in transit: the slice, and ZeRO-2's staging. */
size_t loom_zero_transit_bytes(const loom_zero *z);

#endif
