#!/bin/sh
# PowerSGD at dp 2 on a real text (the GPL-3 as byte tokens), 300 steps of
# the default model at lr 1e-3, against the same run uncompressed:
# - rank 4's loss, as the mean of the last 10 steps, is within 5% of the
#   uncompressed run's, and it falls as far as that run's does;
# - the metrics say it sent at least 5x fewer bytes per step over dp;
# - a bad --grad-compression, or one the layout cannot use, is refused with
#   one line and exit code 2.
# The sanitized pass (LOOM_TEST_SANITIZED=1) trains 40 steps, not 300.
# Usage: tests/powersgd.sh MPIEXEC LOOM WORKDIR
set -u
MPIEXEC=$1 LOOM=$2 WORK=$3
. "$(dirname "$0")/lib.sh"
rm -rf "$WORK" && mkdir -p "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
TEXT=/usr/share/common-licenses/GPL-3
[ -f "$TEXT" ] || fail "no $TEXT to train on"
STEPS=300
[ "${LOOM_TEST_SANITIZED:-0}" = 1 ] && STEPS=40

refused() { # refused WHAT FLAGS...: exit code 2 and one line naming --grad-compression
  what=$1
  shift
  "$LOOM" plan new -o "$WORK/bad.txtpb" "$@" > "$WORK/bad.txt" 2>&1
  rc=$?
  [ $rc = 2 ] || fail "$what: exit code $rc, not 2: $(cat "$WORK/bad.txt")"
  [ "$(wc -l < "$WORK/bad.txt")" = 1 ] && grep -q -- "--grad-compression" "$WORK/bad.txt" ||
    fail "$what: not one line naming the flag: $(cat "$WORK/bad.txt")"
}
refused "an unknown method" --dp 2 --grad-compression topk
refused "rank 0" --dp 2 --grad-compression powersgd:0
refused "a rank past the int range" --dp 2 --grad-compression powersgd:99999999999
refused "one replica" --grad-compression powersgd:4
refused "ZeRO-1" --dp 2 --zero 1 --grad-compression powersgd:4

"$LOOM" data prepare "$TEXT" -o "$WORK/gpl.bin" > "$WORK/prepare.txt" 2>&1 || fail "data prepare: $(cat "$WORK/prepare.txt")"
for c in none powersgd:4; do
  name=$(echo $c | tr : _)
  "$MPIEXEC" --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 "$LOOM" train --data "$WORK/gpl.bin" --dp 2 \
    --grad-compression $c --steps $STEPS --lr 1e-3 --eval-every 0 --log-every 100 --metrics "$WORK/$name.jsonl" \
    > "$WORK/$name.txt" 2>&1 || fail "dp 2, --grad-compression $c: $(tail -3 "$WORK/$name.txt")"
done
grep "grad compression" "$WORK/powersgd_4.txt" || fail "the PowerSGD run did not report what it sends"
losses() { grep -o '"loss": [0-9.e+-]*' "$1" | cut -d' ' -f2; }
losses "$WORK/none.jsonl" > "$WORK/none.losses"
losses "$WORK/powersgd_4.jsonl" > "$WORK/psgd.losses"
paste "$WORK/none.losses" "$WORK/psgd.losses" | awk -v steps=$STEPS '
  NR == 1 { a0 = $1; b0 = $2 }
  NR > steps - 10 { a += $1; b += $2 }
  END { a /= 10; b /= 10
        printf "%d steps; loss over the last 10: uncompressed %.4f, PowerSGD rank 4 %.4f (%+.2f%%); from %.4f and %.4f\n",
               NR, a, b, 100 * (b - a) / a, a0, b0
        exit !(NR == steps && (b - a) / a <= 0.05 && (a - b) / a <= 0.05 && b < 0.9 * b0) }' ||
  fail "PowerSGD's loss is not within 5% of the uncompressed run's"
bytes() { grep -o "\"$2\": [0-9.e+-]*" "$1" | tail -1 | cut -d' ' -f2; }
sent=$(bytes "$WORK/powersgd_4.jsonl" dp_bytes) whole=$(bytes "$WORK/powersgd_4.jsonl" dp_bytes_uncompressed)
[ -n "$sent" ] && [ -n "$whole" ] || fail "no dp_bytes in the metrics"
awk -v s="$sent" -v w="$whole" 'BEGIN { printf "bytes per step over dp: %d instead of %d (%.1fx fewer)\n", s, w, w / s; exit !(s > 0 && w >= 5 * s) }' ||
  fail "PowerSGD sent $sent bytes per step of $whole: not 5x fewer"
echo "ok: PowerSGD stays within 5% of the uncompressed loss, sending 5x fewer bytes"
