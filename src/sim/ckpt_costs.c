/* What checkpoints and restarts cost (see ckpt_costs.h). */
#include <math.h>
#include "layers/gpt_params.h"
#include "plan/memory.h"
#include "sim/ckpt_costs.h"

/* Bytes a checkpoint holds per parameter: its fp32 value and Adam's two moments. */
#define CKPT_BYTES_PER_PARAM 12.0

static loom_status need(const char *profile, const char *field, int has, loom_error *err) {
  return has ? LOOM_OK
             : loom_fail(err, LOOM_ERR_USAGE, "%s: reliability.%s is missing; goodput (--mtbf-hours) needs it (docs/launching.md)",
                         profile, field);
}

loom_status loom_ckpt_costs_model(const loom_plan *plan, const loom_profile *prof, int gpus, double step_s,
                                  double mtbf_node_hours, loom_goodput_model *m, loom_ckpt_costs *c, loom_error *err) {
  static const Loom__Reliability none = LOOM__RELIABILITY__INIT;
  const Loom__Reliability *r = prof->reliability ? prof->reliability : &none;
  const char *name = prof->name ? prof->name : "the cluster profile";
  loom_status st = mtbf_node_hours > 0 ? LOOM_OK : need(name, "mtbf_node_hours (or --mtbf-hours)", r->has_mtbf_node_hours, err);
  if (st == LOOM_OK) st = need(name, "relaunch_s", r->has_relaunch_s, err);
  if (st == LOOM_OK) st = need(name, "store_write_gbs", r->has_store_write_gbs, err);
  if (st == LOOM_OK) st = need(name, "store_read_gbs", r->has_store_read_gbs, err);
  if (st == LOOM_OK) st = need(name, "host_copy_gbs", r->has_host_copy_gbs, err);
  if (st != LOOM_OK) return st;
  const Loom__Parallel *l = plan->parallel;
  *c = (loom_ckpt_costs){.nodes = (gpus + prof->devices_per_node - 1) / prof->devices_per_node,
                         .mtbf_node_hours = mtbf_node_hours > 0 ? mtbf_node_hours : r->mtbf_node_hours};
  loom_gpt_config cfg;
  loom_plan_model_config(plan, &cfg);
  c->total_bytes = CKPT_BYTES_PER_PARAM * (double)loom_gpt_param_count(&cfg, NULL, 1);
  c->rank_bytes = loom_plan_checkpoint_shard_bytes(plan);
  for (int q = 0; q < l->pp; q++) c->read_bytes += loom_plan_rank_checkpoint_bytes(plan, q) * l->tp * l->cp * l->dp;
  const double host = r->host_copy_gbs * 1e9, link = prof->inter_node->bandwidth_gbs * prof->inter_node->efficiency * 1e9;
  c->write_s = c->total_bytes / (r->store_write_gbs * 1e9);
  *m = (loom_goodput_model){
      .step_s = step_s,
      .mtbf_s = c->mtbf_node_hours * 3600.0 / c->nodes,
      .relaunch_s = r->relaunch_s,
      .save_stall_s = c->rank_bytes / host,
      .restore_s = fmax(c->read_bytes / (r->store_read_gbs * 1e9), c->rank_bytes / host),
      .local_stall_s = c->rank_bytes / host + c->rank_bytes / link,
      .local_restore_s = c->rank_bytes / link + c->rank_bytes / host,
      .unrecoverable = r->has_unrecoverable_share ? r->unrecoverable_share : 0.0,
      .min_persistent_s = c->write_s};
  return LOOM_OK;
}
