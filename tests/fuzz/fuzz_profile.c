/* Cluster profiles: the text format and every figure's range, then a
 * prediction on what passed (the cost model must take any valid profile). */
#include "sim/sim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static loom_plan *plan;
  loom_error err;
  if (!plan) {
    loom_plan_spec spec = {.model = {.layers = 4, .hidden = 64, .heads = 4, .vocab = 256, .seq = 32}, .tp = 2, .pp = 2,
                           .dp = 2, .vpp = 1, .micro_batch = 1, .global_batch = 8, .zero_stage = 1};
    loom_gpt_config_finish(&spec.model);
    if (loom_plan_build(&spec, &plan, &err) != LOOM_OK) __builtin_trap();
  }
  loom_profile *p = NULL;
  if (loom_profile_parse((const char *)data, size, "profile.txtpb", &p, &err) != LOOM_OK) return 0;
  loom_sim_result r;
  if (loom_sim_run(plan, p, &LOOM_SIM_ASSUME_BALANCED, &r, &err) == LOOM_OK) loom_sim_result_free(&r);
  loom_profile_free(p);
  return 0;
}
