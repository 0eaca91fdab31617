/* The cost model: what each action of a plan's schedule costs on a cluster
 * profile. Forward and backward of a (rank, chunk) for one micro-batch come
 * from its GEMMs (through the profile's efficiency model), its memory-bound
 * ops (bytes over bandwidth), a fixed cost per op, and its tensor-parallel
 * collectives (exposed: they sit between the GEMMs that need them);
 * backward adds the forward again under full recompute. A split backward's
 * weight half (W) is its weight-grad GEMMs and the embedding's grads; the
 * input half (B) is the rest, recompute included. Under context
 * parallelism a layer's attention adds the ring's hops, each hidden behind
 * a block's share of the attention as far as it can be (but the grads'
 * last hop home). The plan's overlaps (--tp-comm-overlap, --overlap-grad-
 * reduce) hide a collective behind the compute beside it, which runs
 * slower by the profile's overlap_sm_share meanwhile. Transfers between
 * stages, the tied-embedding reduction, the data-parallel reduction (as
 * much of it as backward cannot hide) and the optimizer step complete the
 * step. Collectives cost as rings (or trees, for a latency-bound
 * all-reduce) at nccl-tests' bus bandwidth on the link the rank order puts
 * them on. */
#ifndef LOOM_SIM_COST_H
#define LOOM_SIM_COST_H

#include "comm/comm.h"
#include "plan/plan.h"
#include "schedule/schedule.h"
#include "sim/profile.h"

typedef enum { LOOM_LINK_INTRA = 0, LOOM_LINK_INTER, LOOM_LINK_KINDS } loom_link_kind;

typedef struct {
  int p, v, m;
  /* [p * v], (rank, chunk) at rank * v + chunk: seconds for one micro-batch,
   * and the part of each that is tensor-parallel (or ZeRO-3) communication. */
  double *forward, *backward, *forward_comm, *backward_comm;
  double *weight;   /* [p * v] the part of backward a split one runs as its weight half */
  double p2p;       /* seconds for one activation or grad to cross between stages */
  bool p2p_waited;  /* --no-overlap-p2p-communication: the sender waits for each of them */
  double tied;      /* the tied-embedding grads' all-reduce */
  double *dp;       /* [p] data-parallel traffic of a step, whole (the experts' over their replicas too) */
  double *dp_exposed; /* [p] what of it backward does not hide */
  double *optimizer;  /* [p] the optimizer step, with ZeRO's weight gather */
  /* Bytes one rank of each pipeline rank sends per step: tensor-parallel,
   * between stages, data-parallel; and the link each kind crosses. */
  double *tp_bytes, *p2p_bytes, *dp_bytes; /* [p] */
  double *etp_bytes; /* [p] sent over the tp group's ranks splitting a MoE model's experts (expert tensor parallelism) */
  double *edp_bytes; /* [p] sent over the experts' data-parallel group (expert parallelism); dp_bytes is the rest's */
  double *cp_bytes;  /* [p] sent round the context-parallel ring (keys and values, and their grads) */
  /* Bytes one rank of each pipeline rank moves per step in its memory-bound
   * passes (norms, activations, residual adds, the loss's passes over the
   * logits, the optimizer's over its state), read and written: what a
   * roofline holds against memory bandwidth. [p] */
  double *memory_bytes;
  loom_link_kind tp_link, p2p_link, dp_link, cp_link;
} loom_sim_costs;

/* What a prediction takes as given beyond the plan and the profile. */
typedef struct {
  loom_flops_formula formula; /* the model FLOPs its TFLOP/s and MFU count */
  /* A dropless MoE run's busiest expert-parallel rank: the rows its experts
   * take in a layer over an even share of the group's (1: balanced, as
   * NVIDIA's published MoE benchmarks force their routing to be; at most
   * ep, every row of the group). Its expert GEMMs and its all-to-alls take
   * that many times the rows, and every rank waits for it. loom train's
   * closing "experts:" line measures it on a run. */
  double moe_rank_imbalance;
} loom_sim_assumptions;
#define LOOM_SIM_ASSUME_BALANCED ((loom_sim_assumptions){.formula = LOOM_FLOPS_MEGATRON, .moe_rank_imbalance = 1.0})

/* Costs every action of the plan (checked, with estimates) on the profile,
 * under the assumptions (loom_sim_costs_build: LOOM_SIM_ASSUME_BALANCED's). */
void loom_sim_costs_build_assuming(const loom_plan *plan, const loom_profile *prof, const loom_sim_assumptions *a,
                                   loom_sim_costs *c);
void loom_sim_costs_build(const loom_plan *plan, const loom_profile *prof, loom_sim_costs *c);
void loom_sim_costs_free(loom_sim_costs *c);
/* The seconds rank r is busy with action a (a send: none, it leaves at
 * once; with p2p_waited, its message's crossing when it leaves the rank). */
double loom_sim_action_seconds(const loom_sim_costs *c, int rank, const loom_action *a);
/* The seconds a send's message takes to arrive. */
double loom_sim_flight_seconds(const loom_sim_costs *c, int rank, const loom_action *a);
/* A lower bound on the replay's step time under any schedule of the plan's
 * (one whose backward is split if splits_backward), from the costs alone:
 * no rank starts before the first micro-batch's activation reaches it
 * (every stage on it lies at or past its first), then runs its actions one
 * after another, and its last backward's grad must still reach stage 0
 * before rank 0 can step. Plan search replays only the layouts whose bound
 * could still beat what it has. */
double loom_sim_step_lower_bound(const loom_sim_costs *c, bool splits_backward);

/* Seconds for a collective over n ranks, per_node of them in each node, on
 * `bytes` (the whole buffer: what an all-reduce reduces, an all-gather's
 * output); *sent (if not NULL) gets the bytes each rank sends. */
double loom_collective_seconds(const loom_profile *prof, loom_collective kind, double bytes, int n, int per_node,
                               double *sent);
/* The latency steps of a collective over n ranks: a ring's, or a tree's
 * 2 log2 n for an all-reduce when fewer (NCCL picks it for small messages). */
double loom_collective_latency_steps(loom_collective kind, int n);
/* Members in one node of a group of n ranks spaced stride apart, nodes of
 * devices_per_node (groups start on a node's first device). */
int loom_group_per_node(int n, int stride, int devices_per_node);

#endif
