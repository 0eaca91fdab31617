/* Rank coordinates, layout checks and group construction. */
#include <string.h>
#include "core/check.h"
#include "tensor_parallel/parallel_state.h"

loom_parallel loom_parallel_serial(void) {
  loom_parallel ps;
  memset(&ps, 0, sizeof ps);
  ps.tp = ps.pp = ps.dp = ps.cp = ps.world = 1;
  return ps;
}

loom_grid_coords loom_parallel_coords(int rank, loom_grid_coords n) {
  return (loom_grid_coords){.tp = rank % n.tp, .cp = rank / n.tp % n.cp, .dp = rank / (n.tp * n.cp) % n.dp,
                            .pp = rank / (n.tp * n.cp * n.dp)};
}

int loom_parallel_rank(loom_grid_coords at, loom_grid_coords n) {
  return at.tp + n.tp * (at.cp + n.cp * (at.dp + n.dp * at.pp));
}

int loom_expert_data_size(int tp, int dp, int etp, int ep) {
  const int stage = tp * dp;
  return etp < 1 || ep < 1 || stage % (etp * ep) ? 0 : stage / (etp * ep);
}

int loom_expert_coords_of(int rank, int tp, int dp, int etp, int ep, loom_expert_coords *c) {
  const int edp = loom_expert_data_size(tp, dp, etp, ep);
  if (!edp) return -1;
  const int local = rank % (tp * dp); /* pp is slowest: the stage's ranks are consecutive */
  *c = (loom_expert_coords){.etp_rank = local % etp, .ep_rank = local / etp % ep, .edp_rank = local / (etp * ep), .edp = edp};
  return 0;
}

void loom_parallel_init(loom_parallel *ps, loom_comm *world, int tp, int pp, int dp, int cp, bool sequence_parallel) {
  memset(ps, 0, sizeof *ps);
  ps->tp = tp;
  ps->pp = pp;
  ps->dp = dp;
  ps->cp = cp;
  ps->ep = ps->edp = 1;
  ps->world_group = world;
  ps->rank = loom_comm_rank(world);
  ps->world = loom_comm_size(world);
  ps->sequence_parallel = sequence_parallel;
  const loom_grid_coords at = loom_parallel_coords(ps->rank, (loom_grid_coords){tp, cp, dp, pp});
  ps->tp_rank = at.tp, ps->cp_rank = at.cp, ps->dp_rank = at.dp, ps->pp_rank = at.pp;
  /* Each split's color names the coordinates the group shares. */
  const int tcd = tp * cp * dp;
  ps->tp_group = loom_comm_split(world, at.cp + cp * (at.dp + dp * at.pp), at.tp, "tp");
  ps->dp_group = loom_comm_split(world, at.tp + tp * (at.cp + cp * at.pp), at.dp, "dp");
  ps->pp_group = loom_comm_split(world, at.tp + tp * (at.cp + cp * at.dp), at.pp, "pp");
  ps->dp_cp_rank = at.cp + cp * at.dp;
  if (cp > 1) {
    ps->cp_group = loom_comm_split(world, at.tp + tp * (at.dp + dp * at.pp), at.cp, "cp");
    ps->dp_cp_group = loom_comm_split(world, at.tp + tp * at.pp, ps->dp_cp_rank, "dp x cp");
  } else {
    ps->dp_cp_group = ps->dp_group;
  }
  if (cp > 1 && tp > 1)
    ps->tp_cp_group = loom_comm_split(world, at.dp + dp * at.pp, at.tp + tp * at.cp, "tp x cp");
  const bool edge = at.pp == 0 || at.pp == pp - 1;
  loom_comm *embed = loom_comm_split(world, edge ? at.tp + tp * (at.cp + cp * at.dp) : tcd + ps->rank, at.pp, "embedding");
  if (edge) ps->embed_group = embed;
  else loom_comm_free(embed);
}

void loom_parallel_init_experts(loom_parallel *ps, int etp, int ep) {
  loom_expert_coords c = {0};
  etp = etp > 1 ? etp : 1;
  LOOM_CHECK(ps->cp == 1 || (etp == 1 && ep <= 1), "context parallelism with experts split is refused (the plan's rule)");
  LOOM_CHECK(etp == 1 || etp == ps->tp, "etp is 1 or tp (the plan's rule)");
  /* The stage's tp x cp x dp ranks (Megatron-Core's expert grid regroups them all; cp runs with ep 1 so far). */
  LOOM_CHECK(loom_expert_coords_of(ps->rank, ps->tp, ps->cp * ps->dp, etp, ep, &c) == 0, "etp x ep divides tp x dp (the plan's rule)");
  ps->etp = etp, ps->ep = ep, ps->edp = c.edp, ps->ep_rank = c.ep_rank, ps->edp_rank = c.edp_rank;
  if (etp > 1) ps->etp_group = loom_comm_split(ps->tp_group, 0, ps->tp_rank, "etp");
  if (ep <= 1) return;
  /* Split by the other two coordinates, and the stage: an EP group holds one etp rank (its experts' slice) of one replica. */
  ps->ep_group = loom_comm_split(ps->world_group, c.etp_rank + etp * (c.edp_rank + c.edp * ps->pp_rank), c.ep_rank, "ep");
  ps->edp_group = loom_comm_split(ps->world_group, c.etp_rank + etp * (c.ep_rank + ep * ps->pp_rank), c.edp_rank, "edp");
}

void loom_parallel_free(loom_parallel *ps) {
  if (ps->ep_group) loom_comm_free(ps->ep_group);
  if (ps->edp_group) loom_comm_free(ps->edp_group);
  if (ps->etp_group) loom_comm_free(ps->etp_group);
  if (ps->cp_group) loom_comm_free(ps->cp_group);
  if (ps->tp_cp_group) loom_comm_free(ps->tp_cp_group);
  if (ps->dp_cp_group != ps->dp_group) loom_comm_free(ps->dp_cp_group);
  loom_comm_free(ps->tp_group);
  loom_comm_free(ps->dp_group);
  loom_comm_free(ps->pp_group);
  loom_comm_free(ps->embed_group);
  memset(ps, 0, sizeof *ps);
}

loom_tp loom_tp_of(const loom_parallel *ps) {
  return (loom_tp){.group = ps->tp > 1 ? ps->tp_group : NULL, .rank = ps->tp_rank, .size = ps->tp,
                   .sequence_parallel = ps->sequence_parallel && ps->tp > 1, .ep_group = ps->ep_group,
                   .etp_group = ps->etp_group, .cp_group = ps->cp_group, .cp_rank = ps->cp_rank,
                   .seq_group = !(ps->sequence_parallel && ps->tp > 1) ? ps->cp_group
                                : ps->tp_cp_group                      ? ps->tp_cp_group
                                                                       : ps->tp_group,
                   .shard_group = ps->tp_cp_group ? ps->tp_cp_group : ps->tp > 1 ? ps->tp_group : ps->cp_group};
}
