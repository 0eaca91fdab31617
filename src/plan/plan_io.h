/* Reading and writing partition plans: text format (.txtpb) for authoring,
 * binary protobuf (.pb) for storage; the extension decides. */
#ifndef LOOM_PLAN_IO_H
#define LOOM_PLAN_IO_H

#include <stdbool.h>
#include <stddef.h>
#include "core/status.h"
#include "loom.pb-c.h"

/* The plan format this loom writes and the newest it reads. */
#define LOOM_PLAN_FORMAT_VERSION 1

typedef Loom__PartitionPlan loom_plan;

loom_status loom_plan_read(const char *path, loom_plan **out, loom_error *err);
/* Decodes a plan's bytes (text or binary) read from path, which messages name. */
loom_status loom_plan_decode(const char *data, size_t len, bool text, const char *path, loom_plan **out, loom_error *err);
/* path "-": standard output, text format. */
loom_status loom_plan_write(const char *path, const loom_plan *plan, loom_error *err);
void loom_plan_free(loom_plan *plan);
/* 1 if the path names a text plan (.txtpb, .textproto, .pbtxt), 0 if binary (.pb). */
int loom_plan_is_text(const char *path);

#endif
