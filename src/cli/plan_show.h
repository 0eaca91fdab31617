/* `loom plan show`'s report: what the plan and its estimates say, and each
 * pipeline rank's sheet (plan/rank_sheet.h): its memory by kind and, with
 * buffers, its buffer list. It prints; the plan, the estimates and the
 * sheets compute. */
#ifndef LOOM_PLAN_SHOW_H
#define LOOM_PLAN_SHOW_H

#include <stdbool.h>
#include "plan/plan.h"

/* Prints the report of a plan that passed its rules and has estimates. */
loom_status loom_plan_show(const loom_plan *plan, bool buffers, loom_error *err);

#endif
