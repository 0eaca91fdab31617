#!/bin/sh
# Checkpoints in host memory with peer replicas (--local-save-every), on one
# host: a rank killed mid-run; the restart loads the newest complete
# in-memory set, and its losses and final weights equal an uninterrupted
# run's bit for bit. A copy damaged in memory (a flipped byte) is refused
# and its replica used; when both holders of a shard fail their checks (a
# stale copy, a truncated replica) the persistent checkpoint is loaded, and
# the run says so each time.
# Usage: tests/local_ckpt.sh MPIEXEC LOOM WORKDIR
set -u
MPIEXEC=$1 LOOM=$2 WORK=$3
rm -rf "$WORK" && mkdir -p "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. "$(dirname "$0")/lib.sh"
# Slow steps (each forward 20 ms longer) give the writer thread time to finish a local save before the kill.
MODEL="--layers 2 --hidden 32 --heads 4 --seq 16 --micro-batch 2 --global-batch 8 --eval-every 0 --dropout 0.1 --steps 12
       --log-every 1 --dp 2"
np() { "$MPIEXEC" --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 "$LOOM" train $MODEL "$@"; }
losses() { grep -o '"step": [0-9]*, "loss": [0-9.e+-]*' "$1"; }

np --metrics "$WORK/full.jsonl" --save "$WORK/full.bin" > "$WORK/full.txt" 2>&1 || fail "reference run: $(tail -3 "$WORK/full.txt")"

# Attempt 1: persistent saves at 4 and 8, in-memory ones at 3, 6 and 9; rank 1 killed before step 11.
SAVES="--save-every 4 --local-save-every 3"
LOOM_FAULT=kill:1:11,slow:*:*:20 np --ckpt "$WORK/ck" $SAVES --local-dir "$WORK/shm" --metrics "$WORK/run.jsonl" \
  > "$WORK/first.txt" 2>&1 && fail "the run with a rank killed at step 11 succeeded"
host=$(ls "$WORK/shm")
[ -f "$WORK/shm/$host/step_00000009/manifest.pb" ] || fail "no complete in-memory step 9: $(find "$WORK/shm" | sort)"
[ "$(cat "$WORK/ck/latest")" = step_00000008 ] || fail "the persistent checkpoint is not at step 8"
[ ! -e "$WORK/shm/$host/step_00000003" ] || fail "step 3's copies outlived two newer in-memory steps"

# resume CASE: the restart over a copy of attempt 1's files, which the caller has changed; its losses and final
# weights must equal the uninterrupted run's to the last bit.
resume() {
  rm -rf "$WORK/$1" && mkdir "$WORK/$1" && cp -a "$WORK/ck" "$WORK/shm" "$WORK/run.jsonl" "$WORK/$1/" || fail "copy for $1"
  "$2" "$WORK/$1/shm/$host"
  np --ckpt "$WORK/$1/ck" $SAVES --local-dir "$WORK/$1/shm" --metrics "$WORK/$1/run.jsonl" --resume \
    --save "$WORK/$1/final.bin" > "$WORK/$1.txt" 2>&1 || fail "$1: the restart failed: $(tail -3 "$WORK/$1.txt")"
  [ "$(losses "$WORK/$1/run.jsonl")" = "$(losses "$WORK/full.jsonl")" ] || fail "$1: losses differ from the uninterrupted run's"
  cmp -s "$WORK/full.bin" "$WORK/$1/final.bin" || fail "$1: the final weights differ from the uninterrupted run's"
  [ ! -e "$WORK/$1/shm/$host" ] || fail "$1: the in-memory copies outlived the finished run"
}
said() { grep -q -- "$2" "$WORK/$1.txt" || fail "$1: no line matching '$2': $(grep 'resume\|local' "$WORK/$1.txt")"; }

untouched() { :; }
resume memory untouched
said memory "^resume: step 9 from the in-memory copies (the persistent checkpoint holds step 8): .*shard 0: its own copy"

# The goodput ledger against a hand count: attempt 1 reached step 10 (rank 1 was killed before step 11) and attempt 2
# resumed from step 9, so 1 step was lost; the kept step time is attempt 1's up to its save of step 9 and all of
# attempt 2's, the lost time attempt 1's after that save.
g=$(grep '^{"goodput": ' "$WORK/memory/run.jsonl")
[ -n "$g" ] || fail "memory: no goodput line in the metrics file"
echo "$g" | grep -q '"attempts": 2, .*"lost_steps": 1, ' || fail "memory: expected 2 attempts and 1 lost step: $g"
field() { echo "$g" | sed "s/.*\"$1\": \([0-9.e+-]*\).*/\1/"; }
ledger=$WORK/memory/ck/goodput.jsonl
at() { grep "\"attempt\": $1, \"event\": \"$2\", \"step\": $3," "$ledger" | sed 's/.*"step_s": \([0-9.]*\).*/\1/'; }
saved9=$(at 1 save 9) last1=$(at 1 last 10) end2=$(at 2 end 12)
[ -n "$saved9" ] && [ -n "$last1" ] && [ -n "$end2" ] || fail "memory: the ledger lacks attempt 1's save of step 9, its last step 10 or attempt 2's end: $(cat "$ledger")"
awk -v k="$(field kept_s)" -v l="$(field lost_s)" -v s="$saved9" -v a="$last1" -v e="$end2" \
  'BEGIN { dk = k - (s + e); dl = l - (a - s); exit !(dk < 1e-5 && dk > -1e-5 && dl < 1e-5 && dl > -1e-5 && k > 0 && l > 0) }' ||
  fail "memory: kept $(field kept_s) s and lost $(field lost_s) s, by hand $saved9 + $end2 and $last1 - $saved9"
said memory "^goodput: [0-9.]*% of [0-9.]* s wall over 2 attempts kept as training steps"

flip() { printf '\377' | dd of="$1" bs=1 seek="$2" conv=notrunc status=none; }
flipped() { flip "$1/step_00000009/rank_00000.shard" 200; } # shard 0: rank 0 writes every weight at dp 2
resume flipped flipped
said flipped "^local checkpoint: step 9, the copy of shard 0 on .* (rank 0) refused: its CRC-32C is not the manifest's"
said flipped "^resume: step 9 from the in-memory copies .*shard 0: the replica on its host"

# Both holders of shard 0 fail: its own copy is step 6's (stale), its replica cut short.
both() {
  cp "$1/step_00000006/rank_00000.shard" "$1/step_00000009/rank_00000.shard"
  truncate -s 100 "$1/step_00000009/replicas/rank_00000.shard"
}
resume both both
said both "^local checkpoint: step 9, the copy of shard 0 on .* refused: .*(a stale copy)"
said both "^local checkpoint: step 9, the replica of shard 0 on .* (rank 1) refused: .*(truncated or overwritten)"
said both "^resume: the in-memory copies are older; loading the persistent checkpoint at step 8"
grep -q "from the in-memory copies" "$WORK/both.txt" && fail "both: loaded in-memory copies after both holders failed"
# A --local-dir without room for the copies is refused before the first step, in one line.
mkdir -p "$WORK/small"
if mount -t tmpfs -o size=64k tmpfs "$WORK/small" 2> /dev/null; then
  np --ckpt "$WORK/smallck" $SAVES --local-dir "$WORK/small" > "$WORK/small.txt" 2>&1
  code=$?
  umount "$WORK/small"
  [ $code = 2 ] || fail "a --local-dir without room: exit $code, expected 2: $(tail -3 "$WORK/small.txt")"
  grep -q "^loom: --local-dir $WORK/small: the in-memory checkpoints need [0-9.e+-]* GB on this host (2 ranks x 7 copies of a [0-9.e+-]* GB shard) and it has [0-9.e+-]* GB free" "$WORK/small.txt" ||
    grep -q "\] loom: --local-dir $WORK/small: the in-memory checkpoints need" "$WORK/small.txt" || fail "no refusal line: $(grep loom: "$WORK/small.txt")"
else
  echo "note: no tmpfs mount here (not root?): the --local-dir space check did not run"
fi
echo "ok: in-memory resume bit for bit; a damaged copy gives way to its replica, both to the persistent checkpoint"
