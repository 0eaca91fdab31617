/* What checkpoints and restarts of a plan cost on a cluster profile (its
 * reliability section): the inputs of the goodput model (goodput_model.h).
 *
 * A checkpoint holds each parameter's fp32 value and Adam's two moments,
 * 12 bytes; a rank's shard is what it holds of them (the memory model's
 * master weights, or its fp32 weights, and optimizer state), and the
 * busiest rank's copy to host memory is an asynchronous save's stall. A
 * restore reads what every rank holds from the store; an in-memory save
 * also sends the shard to the peer over the inter-node link, and an
 * in-memory restore takes the lost node's shards back over it. */
#ifndef LOOM_CKPT_COSTS_H
#define LOOM_CKPT_COSTS_H

#include "plan/plan.h"
#include "sim/goodput_model.h"
#include "sim/profile.h"

typedef struct {
  int nodes;
  double mtbf_node_hours;
  double total_bytes;  /* the checkpoint */
  double rank_bytes;   /* the busiest rank's shard */
  double read_bytes;   /* what every rank loads at a restore, together */
  double write_s;      /* the store's write of a whole checkpoint (behind an asynchronous save) */
} loom_ckpt_costs;

/* The goodput model of a plan of `gpus` ranks whose step takes step_s; mtbf_node_hours <= 0 takes the profile's.
 * Refuses a profile without the reliability figures it needs, naming them. */
loom_status loom_ckpt_costs_model(const loom_plan *plan, const loom_profile *prof, int gpus, double step_s,
                                  double mtbf_node_hours, loom_goodput_model *m, loom_ckpt_costs *c, loom_error *err);

#endif
