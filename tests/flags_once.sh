#!/bin/sh
# Every flag name is defined once across the CLI's tables (src/cli/*.c): a
# flag several commands take is defined in cli/flag_defs.c and bound with
# loom_flag_def, so its type and bounds cannot differ between commands; and
# every name bound so has a definition there.
# Usage: flags_once.sh SRC_DIR
set -eu
cli=$1/src/cli
fail=0
# Definitions: a table entry's opening, {"--name", FLAG_KIND.
defined=$(grep -ohE '\{"-[-a-zA-Z0-9]+", FLAG_' "$cli"/*.c | sed 's/^{"//; s/", FLAG_$//' | sort)
[ -n "$defined" ] || { echo "FAIL: no flag definitions found under $cli"; exit 1; }
twice=$(printf '%s\n' "$defined" | uniq -d)
for name in $twice; do
  echo "FAIL: $name is defined more than once: $(grep -lE "\{\"$name\", FLAG_" "$cli"/*.c | tr '\n' ' ')"
  fail=1
done
# Bindings: loom_flag_def("--name", ...) and loom_flag_def_as("--name", ...).
bound=$(grep -ohE 'loom_flag_def(_as)?\("-[-a-zA-Z0-9]+"' "$cli"/*.c | sed 's/.*("//; s/"$//' | sort -u)
for name in $bound; do
  grep -qE "\{\"$name\", FLAG_" "$cli"/flag_defs.c || { echo "FAIL: $name is bound but not defined in flag_defs.c"; fail=1; }
done
[ "$fail" = 0 ] && echo "flags_once: $(printf '%s\n' "$defined" | wc -l) definitions, $(printf '%s\n' "$bound" | wc -l) shared, none twice"
exit $fail
