/* Gradient synchronisation of a pipeline's chunks (the executor's
 * REDUCE_TIED and REDUCE_DP actions, and the buckets a chunk's last
 * backward starts layer by layer). */
#ifndef LOOM_GRAD_SYNC_H
#define LOOM_GRAD_SYNC_H

#include "pipeline/executor.h"

/* Sums the tied wte grads of stage 0 and stage S-1 so both copies step alike. */
void loom_grad_sync_tied(loom_pipeline *pipe);
/* Whether this run's grads cross dp in buckets started during backward. */
bool loom_grad_sync_buckets(const loom_pipeline *pipe);
/* Called after each layer's backward on a chunk's last micro-batch: its
 * grads are final, so they join the open bucket, which is all-reduced once it
 * is big enough or the chunk's first layer is done. Layers finish last to
 * first, so a bucket is one contiguous range. */
void loom_grad_sync_layer_done(loom_pipeline *pipe, loom_gpt *m, int l);
/* Sums grads over the replicas at the step's REDUCE_DP; returns the seconds
 * spent waiting for the buckets. */
double loom_grad_sync_dp(loom_pipeline *pipe);

#endif
