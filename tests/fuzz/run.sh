#!/bin/sh
# Runs one libFuzzer harness for SECONDS from its seed corpus, keeping new
# inputs in a temporary directory (the committed seeds stay as they are).
# A crash leaves its input in the current directory and fails the test.
# Usage: run.sh HARNESS SEED_DIR SECONDS [libFuzzer flags...]
set -eu
harness=$1 seeds=$2 seconds=$3
shift 3
work=$(mktemp -d "${TMPDIR:-/tmp}/loom_fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 143' TERM INT
"$harness" -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1 "$@" "$work" "$seeds"
