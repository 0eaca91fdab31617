/* Parallel state: where this rank sits in the (tp, cp, dp, pp) grid and the
 * groups it talks to. Rank order puts tp fastest, then cp, then dp, then pp
 * (Megatron-Core's): rank = tp_rank + TP * (cp_rank + CP * (dp_rank + DP *
 * pp_rank)), so a tensor-parallel group is a run of consecutive ranks (one
 * node's GPUs in production). */
#ifndef LOOM_PARALLEL_STATE_H
#define LOOM_PARALLEL_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include "comm/comm.h"
#include "core/status.h"

typedef struct {
  int tp, pp, dp, cp;             /* group sizes */
  int rank, world;                /* global rank and world size */
  int tp_rank, pp_rank, dp_rank, cp_rank; /* this rank's coordinates */
  bool sequence_parallel;
  loom_comm *world_group;         /* not owned */
  loom_comm *tp_group, *dp_group, *pp_group;
  /* Context parallelism: the cp group splitting each sample's sequence
   * (NULL: cp 1), and the cp x dp ranks holding the same parameters, over
   * which grads are summed and ZeRO shards (dp_group itself when cp is 1). */
  loom_comm *cp_group, *dp_cp_group;
  int dp_cp_rank;
  /* The tp x cp ranks of one (dp, pp), where tp > 1 and cp > 1 (else NULL): a micro-batch's layer spread over
   * both (its tokens too under sequence parallelism, where a MoE layer routes its share and sums its load there). */
  loom_comm *tp_cp_group;
  loom_comm *embed_group;         /* first and last pipeline stage of this (tp, dp); NULL elsewhere */
  /* A MoE model's expert grid (loom_parallel_init_experts; ep 1: every
   * expert on every rank, no groups): the expert-parallel group whose ranks
   * hold different experts and exchange their tokens, and the
   * expert-data-parallel group of the ranks holding the same experts. */
  int ep, edp, ep_rank, edp_rank;
  int etp; /* 1, or tp: each expert split over the tp group's ranks */
  loom_comm *ep_group, *edp_group;
  loom_comm *etp_group; /* etp > 1: those ranks as a group of their own (its traffic counted apart from tp's) */
} loom_parallel;

/* What a tensor-parallel layer needs: its group, and whether activations
 * outside the parallel regions are split along the sequence. */
typedef struct {
  loom_comm *group; /* NULL when tp == 1 */
  int rank, size;
  bool sequence_parallel;
  loom_comm *kv_group; /* the ranks sharing this rank's replicated key/value heads (tp > kv_heads), else NULL; the model's */
  loom_comm *ep_group; /* a MoE model's expert-parallel group (NULL: every expert on this rank), not owned */
  loom_comm *etp_group; /* expert tensor parallelism: this group's ranks splitting each expert's MLP (NULL: whole), not owned */
  /* bf16 runs with tp > 1: where the regions' collectives pack what they
   * move, loom_tp_staging_elems of it (the model's); NULL: they move fp32. */
  uint16_t *staging;
  /* Context parallelism: the cp group whose ranks hold the other chunks of
   * the sequence (NULL: this rank holds all of it; not owned), and this
   * rank's place in it. The rows are its chunks (loom_cp_position). */
  loom_comm *cp_group;
  int cp_rank;
  /* The ranks sharing one micro-batch's tokens, each holding its own: the tp group under sequence parallelism, the
   * cp group, or both (tp_cp_group); NULL: this rank holds them all. A MoE layer's routing statistics sum there. */
  loom_comm *seq_group;
  /* Every rank holding a part of one micro-batch's layer, its weights' or its rows': tp x cp (NULL: this rank
   * alone). An FP8 operand's tensorwise amax is the max over it (the max of a replicated part is its own). */
  loom_comm *shard_group;
} loom_tp;

/* The cp group's size: 1 without one. */
static inline int loom_tp_cp(const loom_tp *tp) { return tp->cp_group ? loom_comm_size(tp->cp_group) : 1; }

/* The staging a bf16 region collective needs for rows of `width` values:
 * N rows brought together, n of them this rank's (N/tp under SP, else N). */
static inline size_t loom_tp_staging_elems(size_t N, size_t n, size_t width) { return (N + n) * width; }

loom_tp loom_tp_of(const loom_parallel *ps);

/* The grid of a single process: every size 1, no groups. */
loom_parallel loom_parallel_serial(void);
/* Coordinates of `rank` in a grid of tp x cp x dp x pp. */
typedef struct {
  int tp, cp, dp, pp;
} loom_grid_coords;
loom_grid_coords loom_parallel_coords(int rank, loom_grid_coords sizes);
/* And back: the rank at coordinates `at`. */
int loom_parallel_rank(loom_grid_coords at, loom_grid_coords sizes);
/* Where a rank sits among a Mixture-of-Experts layer's groups, as
 * Megatron-Core's expert rank generator places it: its pipeline stage's
 * tp x dp ranks regrouped with expert-tensor-parallel fastest, then
 * expert-parallel, then expert-data-parallel (edp = tp dp / (etp ep)), so
 * the ranks of an EP group stride by etp and its experts' replicas by
 * etp x ep. */
typedef struct {
  int etp_rank, ep_rank, edp_rank;
  int edp; /* the expert-data-parallel size */
} loom_expert_coords;
/* 0, or -1 where etp x ep does not divide tp x dp (the plan's rule). */
int loom_expert_coords_of(int rank, int tp, int dp, int etp, int ep, loom_expert_coords *c);
/* The expert-data-parallel size: tp dp / (etp ep) (0 where it does not divide). */
int loom_expert_data_size(int tp, int dp, int etp, int ep);

/* Builds this rank's groups by splitting `world` (collective over world):
 * a grid of tp x cp x dp x pp. */
void loom_parallel_init(loom_parallel *ps, loom_comm *world, int tp, int pp, int dp, int cp, bool sequence_parallel);
/* Adds the expert grid of expert-parallel size ep (ep 1: none) and expert
 * tensor parallelism etp (1, or tp: the tp group splits each expert) to ps
 * (collective over its world). */
void loom_parallel_init_experts(loom_parallel *ps, int etp, int ep);
void loom_parallel_free(loom_parallel *ps);

#endif
