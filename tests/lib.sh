# Helpers shared by the shell tests; sourced, not run.

fail() { echo "FAIL: $*"; exit 1; }

# wait_for FILE PATTERN SECONDS: waits until FILE holds a line matching the
# grep pattern, and fails the test, naming both, if it has not in time. The
# bound is generous because the sanitized pass runs ranks several times slower.
wait_for() {
  _tries=$(($3 * 10))
  while [ $_tries -gt 0 ]; do
    grep -q -- "$2" "$1" 2> /dev/null && return 0
    sleep 0.1
    _tries=$((_tries - 1))
  done
  fail "$1 has no line matching '$2' after $3 s"
}

# exact_losses A B [N]: the losses of metrics file A equal the last N (all
# without N) of B's, bit for bit, by the caller's losses(); either list
# empty fails, since two empty lists are equal.
exact_losses() {
  _a=$(losses "$1")
  _b=$(losses "$2")
  [ -z "${3:-}" ] || _b=$(echo "$_b" | tail -n "$3")
  [ -n "$_a" ] || fail "$1 holds no losses"
  [ -n "$_b" ] || fail "$2 holds no losses"
  [ "$_a" = "$_b" ]
}

# skip REASON: the checks left have not run here; said, and exit 77, which
# ctest shows as a skip (SKIP_RETURN_CODE), never as a pass.
skip() {
  echo "SKIP: $*"
  exit 77
}

# part quick|more: whether this run holds that part of a test split across
# tiers (tests/CMakeLists.txt registers it twice: LOOM_TEST_PART=quick in the
# quick tier, =more, the rest, in the full tier); unset, it holds both.
part() {
  [ "${LOOM_TEST_PART:-all}" = all ] || [ "$LOOM_TEST_PART" = "$1" ]
}
