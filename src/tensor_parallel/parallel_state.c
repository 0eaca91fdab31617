/* Rank coordinates, layout checks and group construction. */
#include <string.h>
#include "core/check.h"
#include "tensor_parallel/parallel_state.h"

loom_parallel loom_parallel_serial(void) {
  loom_parallel ps;
  memset(&ps, 0, sizeof ps);
  ps.tp = ps.pp = ps.dp = ps.world = 1;
  return ps;
}

void loom_parallel_coords(int rank, int tp, int pp, int dp, int *tp_rank, int *dp_rank, int *pp_rank) {
  (void)pp;
  *tp_rank = rank % tp;
  *dp_rank = rank / tp % dp;
  *pp_rank = rank / (tp * dp);
}

int loom_expert_coords_of(int rank, int tp, int dp, int etp, int ep, loom_expert_coords *c) {
  const int stage = tp * dp;
  if (etp < 1 || ep < 1 || stage % (etp * ep)) return -1;
  const int local = rank % stage; /* pp is slowest: the stage's ranks are consecutive */
  *c = (loom_expert_coords){.etp_rank = local % etp, .ep_rank = local / etp % ep, .edp_rank = local / (etp * ep),
                            .edp = stage / (etp * ep)};
  return 0;
}

loom_status loom_parallel_check(int tp, int pp, int dp, int world, bool sequence_parallel,
                                int heads, int hidden, int ffn, int T, loom_error *err) {
  if (hidden % tp)
    return loom_fail(err, LOOM_ERR_USAGE, "--hidden %d is not divisible by --tp %d; pick a tp that divides hidden",
                     hidden, tp);
  if (heads % tp)
    return loom_fail(err, LOOM_ERR_USAGE, "--heads %d is not divisible by --tp %d; each rank needs whole heads",
                     heads, tp);
  if (ffn % tp)
    return loom_fail(err, LOOM_ERR_USAGE, "--ffn %d is not divisible by --tp %d; pick a tp that divides ffn", ffn, tp);
  if (sequence_parallel && T % tp)
    return loom_fail(err, LOOM_ERR_USAGE,
                     "--seq %d is not divisible by --tp %d; sequence parallelism splits the sequence evenly", T, tp);
  if ((long long)tp * pp * dp != world)
    return loom_fail(err, LOOM_ERR_USAGE,
                     "world size %d != tp %d x pp %d x dp %d; launch tp*pp*dp ranks (mpirun -np %lld)",
                     world, tp, pp, dp, (long long)tp * pp * dp);
  return LOOM_OK;
}

void loom_parallel_init(loom_parallel *ps, loom_comm *world, int tp, int pp, int dp, bool sequence_parallel) {
  memset(ps, 0, sizeof *ps);
  ps->tp = tp;
  ps->pp = pp;
  ps->dp = dp;
  ps->ep = ps->edp = 1;
  ps->world_group = world;
  ps->rank = loom_comm_rank(world);
  ps->world = loom_comm_size(world);
  ps->sequence_parallel = sequence_parallel;
  loom_parallel_coords(ps->rank, tp, pp, dp, &ps->tp_rank, &ps->dp_rank, &ps->pp_rank);
  /* Each split's color names the coordinates the group shares. */
  ps->tp_group = loom_comm_split(world, ps->dp_rank + dp * ps->pp_rank, ps->tp_rank, "tp");
  ps->dp_group = loom_comm_split(world, ps->tp_rank + tp * ps->pp_rank, ps->dp_rank, "dp");
  ps->pp_group = loom_comm_split(world, ps->tp_rank + tp * ps->dp_rank, ps->pp_rank, "pp");
  const bool edge = ps->pp_rank == 0 || ps->pp_rank == pp - 1;
  loom_comm *embed = loom_comm_split(world, edge ? ps->tp_rank + tp * ps->dp_rank : tp * dp + ps->rank, ps->pp_rank, "embedding");
  if (edge) ps->embed_group = embed;
  else loom_comm_free(embed);
}

void loom_parallel_init_experts(loom_parallel *ps, int etp, int ep) {
  loom_expert_coords c = {0};
  etp = etp > 1 ? etp : 1;
  LOOM_CHECK(etp == 1 || etp == ps->tp, "etp is 1 or tp (the plan's rule)");
  LOOM_CHECK(loom_expert_coords_of(ps->rank, ps->tp, ps->dp, etp, ep, &c) == 0, "etp x ep divides tp x dp (the plan's rule)");
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
  loom_comm_free(ps->tp_group);
  loom_comm_free(ps->dp_group);
  loom_comm_free(ps->pp_group);
  loom_comm_free(ps->embed_group);
  memset(ps, 0, sizeof *ps);
}

loom_tp loom_tp_of(const loom_parallel *ps) {
  return (loom_tp){.group = ps->tp > 1 ? ps->tp_group : NULL, .rank = ps->tp_rank, .size = ps->tp,
                   .sequence_parallel = ps->sequence_parallel && ps->tp > 1, .ep_group = ps->ep_group,
                   .etp_group = ps->etp_group};
}
