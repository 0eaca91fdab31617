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
