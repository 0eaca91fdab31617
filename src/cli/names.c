/* Names into enums: the CLI's side of every name table. */
#include <string.h>
#include "cli/names.h"
#include "plan/plan_io.h"

/* The index of name in a NULL-terminated list, or -1. */
static int index_in(const char *const *names, const char *name) {
  for (int i = 0; names[i]; i++)
    if (strcmp(names[i], name) == 0) return i;
  return -1;
}

int loom_cli_schedule_kind(const char *name, loom_schedule_kind *kind) {
  const ProtobufCEnumDescriptor *d = &loom__schedule_kind__descriptor; /* every kind the plan can hold */
  for (unsigned i = 0; i < d->n_values; i++)
    if (strcmp(loom_schedule_kind_name((loom_schedule_kind)d->values[i].value), name) == 0) {
      *kind = (loom_schedule_kind)d->values[i].value;
      return 0;
    }
  return -1;
}

int loom_cli_send_model(const char *name, const loom_send_model **model) {
  const int i = index_in(loom_send_model_names(), name);
  if (i < 0) return -1;
  *model = LOOM_SEND_MODELS[i];
  return 0;
}

int loom_cli_preset(const char *name, loom_gpt_config *cfg) {
  const int i = index_in(LOOM_GPT_PRESET_NAMES, name);
  return i < 0 ? -1 : loom_gpt_config_preset(cfg, i);
}

int loom_cli_flops_formula(const char *name, loom_flops_formula *formula) {
  const int i = index_in(LOOM_FLOPS_FORMULA_NAMES, name);
  if (i < 0) return -1;
  *formula = (loom_flops_formula)i;
  return 0;
}
