#!/bin/sh
# Installs the Debian packages named on the command line that are missing,
# printing one line; apt's and dpkg's own output goes to the log named by
# LOOM_SETUP_LOG (default: build/packages.log, never $TMPDIR, which the test
# suite leaves as it found it), shown only on failure.
# Usage: scripts/packages.sh PACKAGE...
set -eu
missing=""
for p in "$@"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done
[ -n "$missing" ] || exit 0
root=$(cd "$(dirname "$0")/.." && pwd)
[ -n "${LOOM_SETUP_LOG:-}" ] || mkdir -p "$root/build"
log=${LOOM_SETUP_LOG:-$root/build/packages.log}
echo "packages: installing$missing (log: $log)"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# shellcheck disable=SC2086 # one word per package
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing; } \
  >> "$log" 2>&1; then
  tail -n 30 "$log"
  echo "packages: apt-get failed installing$missing (last lines above; all of it in $log)"
  exit 1
fi
