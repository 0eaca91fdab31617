/* Plans from outside, text (LOOM_FUZZ_TEXT 1) or binary: decoding, then the
 * one validation, then what `plan show` prints of a valid plan. */
#include <stdlib.h>
#include "plan/plan.h"
#include "plan/textformat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  loom_plan *plan;
  loom_error err;
  if (loom_plan_decode((const char *)data, size, LOOM_FUZZ_TEXT, "fuzz", &plan, &err) != LOOM_OK) return 0;
  char lines[4096];
  if (loom_plan_validate(plan, &(loom_plan_limits){0}, lines, sizeof lines) == 0) {
    loom_plan_estimate(plan);
    free(loom_text_print(&plan->base));
  }
  loom_plan_free(plan);
  return 0;
}
