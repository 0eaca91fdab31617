/* The flag parser and help printer. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/flags.h"
#include "cli/megatron_flags.h"
#include "core/decimal.h"

/* A bound as a person writes it: whole numbers in full (1048576, not 1.04858e+06). */
static const char *bound(double v, char *buf, size_t n) {
  if (v == floor(v) && fabs(v) < 1e18) snprintf(buf, n, "%.0f", v);
  else snprintf(buf, n, "%g", v);
  return buf;
}

static loom_status out_of_range(const char *cmd, const loom_flag *f, const char *text, loom_error *err) {
  char lo[32], hi[32];
  return loom_fail(err, LOOM_ERR_USAGE, "%s: %s must be in [%s, %s], got %.*s%s", cmd, f->name,
                   bound(f->min, lo, sizeof lo), bound(f->max, hi, sizeof hi), LOOM_QUOTE(text));
}

/* An integer flag takes decimal digits only (core/decimal.h). */
static loom_status parse_integer(const char *cmd, const loom_flag *f, const char *text, int64_t *out, loom_error *err) {
  const bool ranged = f->min <= f->max;
  const int64_t lo = f->kind == FLAG_INT ? INT32_MIN : INT64_MIN, hi = f->kind == FLAG_INT ? INT32_MAX : INT64_MAX;
  switch (loom_parse_decimal(text, NULL, ranged ? (int64_t)f->min : lo, ranged ? (int64_t)f->max : hi, out)) {
  case LOOM_DECIMAL_OK: return LOOM_OK;
  case LOOM_DECIMAL_NONE:
    return loom_fail(err, LOOM_ERR_USAGE, "%s: %s expects an integer in decimal digits, got " LOOM_QUOTE_FMT, cmd, f->name,
                     LOOM_QUOTE(text));
  case LOOM_DECIMAL_RANGE:
    if (ranged) return out_of_range(cmd, f, text, err);
    return loom_fail(err, LOOM_ERR_USAGE, "%s: %s is out of range, got %.*s%s", cmd, f->name, LOOM_QUOTE(text));
  }
  return LOOM_ERR_USAGE;
}

static loom_status parse_float(const char *cmd, const loom_flag *f, const char *text, double *out, loom_error *err) {
  char *end;
  errno = 0;
  const double v = strtod(text, &end);
  if (*text == '\0' || *end != '\0' || errno == ERANGE)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: %s expects a number, got " LOOM_QUOTE_FMT, cmd, f->name, LOOM_QUOTE(text));
  if (!isfinite(v)) /* nan passes every comparison below; no flag means anything by inf */
    return loom_fail(err, LOOM_ERR_USAGE, "%s: %s expects a finite number, got " LOOM_QUOTE_FMT, cmd, f->name, LOOM_QUOTE(text));
  if (f->min <= f->max && (v < f->min || v > f->max)) return out_of_range(cmd, f, text, err);
  *out = v;
  return LOOM_OK;
}

static loom_status check_choice(const char *cmd, const loom_flag *f, const char *text, loom_error *err) {
  if (!f->choices) return LOOM_OK;
  char list[400] = ""; /* the presets' names, the longest list, with room to grow: the message holds 512 */
  for (const char *const *c = f->choices; *c; c++) {
    if (strcmp(*c, text) == 0) return LOOM_OK;
    if (c != f->choices) strncat(list, ", ", sizeof list - strlen(list) - 1);
    strncat(list, *c, sizeof list - strlen(list) - 1);
  }
  return loom_fail(err, LOOM_ERR_USAGE, "%s: %s must be one of %s, got " LOOM_QUOTE_FMT, cmd, f->name, list, LOOM_QUOTE(text));
}

static loom_status assign(const char *cmd, loom_flag *f, const char *text, loom_error *err) {
  double v = 0.0;
  loom_status st = LOOM_OK;
  switch (f->kind) {
  case FLAG_STRING:
    st = check_choice(cmd, f, text, err);
    if (st == LOOM_OK) *(const char **)f->dst = text;
    break;
  case FLAG_INT:
  case FLAG_INT64: {
    int64_t n = 0;
    st = parse_integer(cmd, f, text, &n, err);
    if (st == LOOM_OK && f->kind == FLAG_INT) *(int *)f->dst = (int)n;
    else if (st == LOOM_OK) *(int64_t *)f->dst = n;
    break;
  }
  case FLAG_FLOAT:
    st = parse_float(cmd, f, text, &v, err);
    if (st == LOOM_OK) *(float *)f->dst = (float)v;
    break;
  case FLAG_BOOL: *(bool *)f->dst = true; break;
  }
  return st;
}

static loom_flag *find(loom_flag *flags, int nflags, const char *name, size_t len) {
  for (int k = 0; k < nflags; k++)
    if (strlen(flags[k].name) == len && strncmp(flags[k].name, name, len) == 0) return &flags[k];
  return NULL;
}

loom_status loom_flags_parse(const char *cmd, loom_flag *flags, int nflags, int argc, char **argv,
                             const char **positional, int max_positional, int *npositional,
                             bool *help, loom_error *err) {
  *npositional = 0;
  *help = false;
  for (int i = 0; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
      *help = true;
      return LOOM_OK;
    }
    if (arg[0] != '-' || arg[1] == '\0') {
      if (*npositional >= max_positional)
        return loom_fail(err, LOOM_ERR_USAGE, "%s: unexpected argument " LOOM_QUOTE_FMT " (see %s --help)", cmd, LOOM_QUOTE(arg), cmd);
      positional[(*npositional)++] = arg;
      continue;
    }
    /* --flag VALUE, or --flag=VALUE as argparse and Megatron's launchers write it. */
    const char *eq = strchr(arg, '=');
    const size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
    loom_flag *f = find(flags, nflags, arg, name_len);
    /* Megatron-LM's name for one of loom's flags, or a switch of its that says what loom does anyway. */
    const loom_megatron_alias *alias = f ? NULL : loom_megatron_alias_of(arg, name_len);
    if (alias && eq && (alias->value || !alias->loom))
      return loom_fail(err, LOOM_ERR_USAGE, "%s: %s takes no value", cmd, alias->megatron);
    if (alias && !alias->loom) continue;
    if (alias) f = find(flags, nflags, alias->loom, strlen(alias->loom));
    if (!f && loom_megatron_flag(arg, name_len))
      return loom_fail(err, LOOM_ERR_USAGE, "%s: %.*s is Megatron-LM's flag, which loom does not implement%s (see %s --help "
                       "for the Megatron-LM names it takes)", cmd, (int)name_len, arg, alias ? " here" : "", cmd);
    if (!f)
      return loom_fail(err, LOOM_ERR_USAGE, "%s: unknown flag %.*s%s (see %s --help)", cmd,
                       (int)(name_len < LOOM_QUOTE_MAX ? name_len : LOOM_QUOTE_MAX), arg, name_len > LOOM_QUOTE_MAX ? "..." : "", cmd);
    if (f->set) return loom_fail(err, LOOM_ERR_USAGE, "%s: %s given more than once", cmd, f->name);
    if (f->kind == FLAG_BOOL && eq) return loom_fail(err, LOOM_ERR_USAGE, "%s: %s takes no value", cmd, f->name);
    const bool fixed = alias && alias->value; /* a Megatron switch: its value is fixed */
    const char *value = fixed ? alias->value : "";
    if (!fixed && eq) {
      value = eq + 1;
    } else if (!fixed && f->kind != FLAG_BOOL) {
      if (i + 1 >= argc) return loom_fail(err, LOOM_ERR_USAGE, "%s: %s needs a value", cmd, arg);
      value = argv[++i];
    }
    loom_status st = assign(cmd, f, value, err);
    if (st != LOOM_OK) return st;
    f->set = true;
  }
  return LOOM_OK;
}

void loom_flags_print_help(FILE *fp, const char *usage, const loom_flag *flags, int nflags) {
  fprintf(fp, "usage: %s\n\nflags:\n", usage);
  for (int i = 0; i < nflags; i++) {
    const loom_flag *f = &flags[i];
    const char *arg = f->kind == FLAG_BOOL ? "" : f->kind == FLAG_STRING ? " S" : " N";
    char left[64];
    snprintf(left, sizeof left, "%s%s", f->name, arg);
    fprintf(fp, "  %-22s %s", left, f->help);
    switch (f->kind) {
    case FLAG_INT: fprintf(fp, " (default %d)", *(int *)f->dst); break;
    case FLAG_INT64: fprintf(fp, " (default %" PRId64 ")", *(int64_t *)f->dst); break;
    case FLAG_FLOAT: fprintf(fp, " (default %g)", (double)*(float *)f->dst); break;
    case FLAG_STRING:
      if (*(const char **)f->dst) fprintf(fp, " (default %s)", *(const char **)f->dst);
      break;
    case FLAG_BOOL: break;
    }
    for (const loom_megatron_alias *a = LOOM_MEGATRON_ALIASES; a->megatron; a++)
      if (a->loom && strcmp(a->loom, f->name) == 0)
        fprintf(fp, a->value && *a->value ? " [Megatron-LM: %s, for %s]" : " [Megatron-LM: %s]", a->megatron, a->value);
    fputc('\n', fp);
  }
}

int loom_flag_choice_index(const char *const *choices, const char *value) {
  for (int i = 0; choices[i]; i++)
    if (strcmp(choices[i], value) == 0) return i;
  return 0;
}

const loom_flag *loom_flags_find(const loom_flag *flags, int nflags, const char *name) {
  for (int i = 0; i < nflags; i++)
    if (strcmp(flags[i].name, name) == 0) return &flags[i];
  return NULL;
}
