/* ZeRO stage 1, the distributed optimizer (DeepSpeed ZeRO-1, Megatron's
 * distributed optimizer): over the data-parallel group, grads are
 * reduce-scattered so each replica holds the summed grads of its 1/dp slice
 * of the flat parameter buffer, keeps Adam moments for that slice only,
 * steps it, and all-gathers the parameters back. Every element is stepped
 * by exactly one replica with the same math as plain AdamW, so results match
 * plain data parallelism.
 *
 * The model's buffers are padded to a multiple of dp elements
 * (loom_gpt_params_init_for_zero), so the grads are reduce-scattered
 * straight out of the grad buffer and the weights all-gathered straight
 * into the parameters: no full-size scratch.
 *
 * In bf16 runs it is Megatron's distributed optimizer in full: the fp32
 * master weights exist only as each replica's slice (the model's params are
 * a layout without storage), and what is all-gathered is the slice rounded
 * to bf16, straight into the model's bf16 compute copy: half the bytes of
 * an fp32 gather, and 4 bytes per parameter fewer on every replica but 4/dp. */
#ifndef LOOM_ZERO1_H
#define LOOM_ZERO1_H

#include "comm/comm.h"
#include "optim/adamw.h"

typedef struct {
  loom_adamw_config cfg;
  size_t begin, end;   /* this replica's slice of the flat buffer */
  size_t shard;        /* slice length with padding: ceil(numel / dp) */
  float *m, *v;        /* [shard] Adam moments of the slice */
  float *master;       /* [shard] the slice's fp32 master weights when the model holds none, else NULL */
  float *slice;        /* [shard] this replica's slice in transit */
  const loom_allocator *mem; /* the parameters' backend memory, where all of the above lives */
  int step;
} loom_zero1;

/* Builds this replica's optimizer state, zeroed; for a model without master
 * weights (loom_gpt_params_have_master false) also the master slice, which
 * the caller fills (loom_gpt_params_randomize_slice, or a checkpoint) and
 * then publishes. */
loom_status loom_zero1_init(loom_zero1 *z, const loom_gpt_params *p, int dp_rank, int dp_size,
                            const loom_adamw_config *cfg);
void loom_zero1_free(loom_zero1 *z);
/* Reduce-scatters p's grads over dp (p built by loom_gpt_params_init_for_zero),
 * unless `summed` says they already hold the sum (grad compression sums
 * them whole); returns the squared norm of this replica's slice, each
 * element once over TP as in loom_grad_sumsq, and summed over dp
 * (collective over tp and dp). */
double loom_zero1_reduce(loom_zero1 *z, loom_gpt_params *p, loom_comm *dp, const loom_ops *ops, const loom_tp *tp,
                         bool skip_shared, bool summed);
/* Clips by grad_norm, steps this replica's slice with AdamW and all-gathers
 * the parameters (collective over dp). */
void loom_zero1_step(loom_zero1 *z, loom_gpt_params *p, float lr, double grad_norm, loom_comm *dp, const loom_ops *ops);
/* With a master slice: rounds it to bf16 and all-gathers every replica's
 * into p's compute copy (collective over dp); call after the slice was
 * loaded. A no-op when the model holds its master weights. */
void loom_zero1_publish(loom_zero1 *z, loom_gpt_params *p, loom_comm *dp, const loom_ops *ops);
/* Every replica's fp32 weights gathered into out[shard * dp] (backend
 * memory; the first numel are the weights): the master slices, or the
 * model's own params (collective over dp). */
void loom_zero1_gather_master(loom_zero1 *z, const loom_gpt_params *p, loom_comm *dp, float *out);
/* Optimizer-state bytes this replica holds: the moments, and the master slice if any. */
size_t loom_zero1_state_bytes(const loom_zero1 *z);

#endif
