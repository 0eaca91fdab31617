#!/bin/sh
# launch/loom-run: the world size from a plan, GPU and CPU placement, the
# variables passed to every rank, a hostfile, --dry-run's exact command, bad
# options refused with exit 2, a real run on this machine, the stop on a
# signal, and restarts after a rank is killed.
# Usage: tests/launch.sh LOOM_RUN LOOM WORKDIR
set -u
RUN=$1 LOOM=$2 WORK=$3
rm -rf "$WORK" && mkdir -p "$WORK" # a run before this one leaves its outputs, which loom will not replace
. "$(dirname "$0")/lib.sh"
export LOOM MPIRUN=mpirun
unset OMP_NUM_THREADS
cores=$(nproc)
root=""
[ "$(id -u)" = 0 ] && root="OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
PLANS="$(dirname "$0")/../examples/plans"

# A plan gives -n (tp 2 x pp 2 = 4); more ranks than cores oversubscribe unbound.
got=$(env -i PATH="$PATH" LOOM="$LOOM" "$RUN" --dry-run --gpus-per-node 0 train --plan "$PLANS/tiny-tp2-pp2.txtpb" --steps 2)
if [ "$cores" -lt 4 ]; then place="--oversubscribe --bind-to none"; else place="--bind-to core"; fi
want="${root}mpirun -np 4 $place -x OMP_NUM_THREADS $LOOM train --plan $PLANS/tiny-tp2-pp2.txtpb --steps 2"
[ "$got" = "$want" ] || fail "plan dry run: got '$got', want '$want'"
# GPU nodes: one rank per GPU, a hostfile, NCCL and LOOM variables passed, numa binding.
printf 'node01 slots=8\nnode02 slots=8\n' > "$WORK/hosts"
got=$(env -i PATH="$PATH" LOOM="$LOOM" NCCL_IB_HCA=mlx5 LOOM_TEST_X=1 "$RUN" --dry-run --gpus-per-node 8 -n 16 --hostfile "$WORK/hosts" train --tp 8 --pp 2)
want="${root}mpirun -np 16 --hostfile $WORK/hosts --map-by ppr:8:node --bind-to numa -x LOOM_TEST_X -x NCCL_IB_HCA $LOOM train --tp 8 --pp 2"
[ "$got" = "$want" ] || fail "GPU dry run: got '$got', want '$want'"

# A hostfile path with a space stays one argument (quoted in the dry run).
cp "$WORK/hosts" "$WORK/my hosts"
got=$(env -i PATH="$PATH" LOOM="$LOOM" "$RUN" --dry-run --gpus-per-node 8 -n 16 --hostfile "$WORK/my hosts" train)
want="${root}mpirun -np 16 --hostfile '$WORK/my hosts' --map-by ppr:8:node --bind-to numa $LOOM train"
[ "$got" = "$want" ] || fail "hostfile with a space: got '$got', want '$want'"

# Bad options: one line, exit 2.
expect() {
  code=$1 msg=$2; shift 2
  "$RUN" "$@" > "$WORK/out.txt" 2>&1
  got=$?
  [ "$got" = "$code" ] && grep -qxF "$msg" "$WORK/out.txt" || fail "loom-run $*: exit $got, '$(cat "$WORK/out.txt")'; want $code, '$msg'"
}
expect 2 "loom-run: expected a loom command, e.g. 'loom-run train --plan PLAN' (loom-run --help)" --dry-run
expect 2 "loom-run: -n x: expected a positive number" -n x train
expect 2 "loom-run: unknown option --frobnicate (loom-run --help)" --frobnicate train
expect 2 "loom-run: --hostfile /nonexistent/hosts: cannot read it as a file" --hostfile /nonexistent/hosts train
expect 2 "loom-run: --hostfile $WORK: cannot read it as a file" --hostfile "$WORK" train
# Hostfiles checked by loom-run itself: no host, a bad line, a host that does not resolve.
printf '# nothing here\n\n' > "$WORK/empty_hosts"
expect 2 "loom-run: --hostfile $WORK/empty_hosts: names no host (one per line: HOST slots=N)" --hostfile "$WORK/empty_hosts" train
printf 'localhost slots=two\n' > "$WORK/bad_hosts"
expect 2 "loom-run: --hostfile $WORK/bad_hosts: line 1: localhost slots=two: expected HOST [slots=N] [max_slots=N]" \
  --hostfile "$WORK/bad_hosts" train
printf 'localhost slots=2\nno-such-host.invalid slots=2\n' > "$WORK/unknown_hosts"
expect 2 "loom-run: --hostfile $WORK/unknown_hosts: host no-such-host.invalid does not resolve (getent ahosts no-such-host.invalid finds no address)" \
  --hostfile "$WORK/unknown_hosts" train
expect 2 "loom-run: --gpus-per-node abc: expected a number (0 on CPU machines)" --gpus-per-node abc train
expect 2 "loom-run: --bind socket: expected core, numa or none" --bind socket train
expect 2 "loom-run: --plan /nonexistent.txtpb: cannot read its world size (loom plan check /nonexistent.txtpb says why)" \
  --dry-run train --plan /nonexistent.txtpb
LOOM=/nonexistent/loom expect 2 "loom-run: no loom binary: build it (scripts/setup.sh) or set LOOM=/path/to/loom" train

# A real run: the plan's 4 ranks train on this machine.
"$RUN" --gpus-per-node 0 train --plan "$PLANS/tiny-tp2-pp2.txtpb" --steps 2 --eval-every 0 > "$WORK/run.txt" 2>&1 ||
  fail "loom-run train: $(cat "$WORK/run.txt")"
grep -q "parallel: 4 ranks, tp 2 x pp 2" "$WORK/run.txt" || fail "run layout: $(cat "$WORK/run.txt")"
# A signal to loom-run (as Slurm or a person sends it to the launcher): the
# ranks checkpoint after the step they are in, and the job exits 0 with the
# line that says how to resume (mpirun alone exits 1 and loses the line).
# SIGHUP (the terminal closed) is a stop like SIGTERM: it once killed
# loom-run alone and left mpirun and the ranks training with no one watching.
for sig in TERM HUP; do
  rm -rf "$WORK/sig"
  "$RUN" --gpus-per-node 0 -n 2 train --dp 2 --layers 1 --hidden 16 --heads 2 --seq 16 --micro-batch 2 --steps 1000000 \
    --eval-every 0 --log-every 1000 --ckpt "$WORK/sig" > "$WORK/sig.txt" 2>&1 &
  job=$!
  wait_for "$WORK/sig.txt" "^step " 180
  kill -$sig $job
  wait $job
  code=$?
  [ "$code" = 0 ] || fail "SIG$sig to loom-run: exit $code: $(tail -5 "$WORK/sig.txt")"
  grep -q "stopped by a signal after step [0-9]*; resume with --resume" "$WORK/sig.txt" || fail "SIG$sig: no stop line: $(tail -5 "$WORK/sig.txt")"
  [ -f "$WORK/sig/latest" ] || fail "no checkpoint after SIG$sig"
  ! pgrep -f "$WORK/sig" > /dev/null || fail "SIG$sig left ranks running: $(pgrep -af "$WORK/sig")"
done

# --max-restarts: a rank killed with SIGKILL mid-run; the job restarts from
# the latest checkpoint and finishes every step with the uninterrupted run's
# losses and grad norms bit for bit (the metrics file keeps one line per
# step across the restart) and its final weights byte for byte.
SMALL="--tp 2 --layers 1 --hidden 16 --heads 2 --seq 16 --micro-batch 2 --steps 24 --eval-every 0 --log-every 1 --save-every 5"
rm -rf "$WORK/whole" "$WORK/restarted" "$WORK/whole.jsonl" "$WORK/restarted.jsonl"
# shellcheck disable=SC2086 # SMALL's words are flags
"$RUN" --gpus-per-node 0 -n 2 train $SMALL --ckpt "$WORK/whole" --metrics "$WORK/whole.jsonl" --save "$WORK/whole.bin" \
  > "$WORK/whole.txt" 2>&1 || fail "uninterrupted run: $(tail -5 "$WORK/whole.txt")"
# shellcheck disable=SC2086
LOOM_FAULT=slow:*:*:40 "$RUN" --gpus-per-node 0 --max-restarts 2 -n 2 train $SMALL --ckpt "$WORK/restarted" \
  --metrics "$WORK/restarted.jsonl" --save "$WORK/restarted.bin" > "$WORK/restarted.txt" 2>&1 &
job=$!
wait_for "$WORK/restarted.jsonl" '"step": 12,' 180
pkill -KILL -n -f "$LOOM train $SMALL --ckpt $WORK/restarted" || fail "no rank to kill"
wait $job
code=$?
[ "$code" = 0 ] || fail "restarted run: exit $code: $(tail -5 "$WORK/restarted.txt")"
grep -q "^loom-run: restart 1 of 2 after rank [01] on .* was killed by signal 9: resuming from $WORK/restarted/step_000000[01][05]$" \
  "$WORK/restarted.txt" || fail "no restart line: $(grep loom-run "$WORK/restarted.txt")"
numbers() { grep -o '"step": [0-9]*, "loss": [0-9.e+-]*, "lr": [0-9.e+-]*, "grad_norm": [0-9.e+-]*' "$1"; }
numbers "$WORK/whole.jsonl" > "$WORK/whole.numbers"
numbers "$WORK/restarted.jsonl" > "$WORK/restarted.numbers"
[ "$(wc -l < "$WORK/whole.numbers")" = 24 ] || fail "uninterrupted run: $(wc -l < "$WORK/whole.numbers") steps in its metrics"
cmp -s "$WORK/whole.numbers" "$WORK/restarted.numbers" ||
  fail "the restarted run's steps differ: $(diff "$WORK/whole.numbers" "$WORK/restarted.numbers" | head -4)"
cmp -s "$WORK/whole.bin" "$WORK/restarted.bin" || fail "the restarted run's final weights differ"
# A refusal of the input (exit 2) is not restarted.
"$RUN" --gpus-per-node 0 --max-restarts 2 -n 2 train --tp 3 > "$WORK/refused.txt" 2>&1
code=$?
[ "$code" = 2 ] && ! grep -q "restart" "$WORK/refused.txt" || fail "refused run: exit $code: $(cat "$WORK/refused.txt")"
# A rank that dies saving step 10 on every launch (abort: signal 6) spends
# the restarts, each resuming from step 5, and the launcher says so.
rm -rf "$WORK/spent"
# shellcheck disable=SC2086
LOOM_FAULT=kill_in_save:1:10 "$RUN" --gpus-per-node 0 --max-restarts 1 -n 2 train $SMALL --ckpt "$WORK/spent" > "$WORK/spent.txt" 2>&1
code=$?
[ "$code" != 0 ] &&
  grep -q "^loom-run: restart 1 of 1 after rank 1 on .* was killed by signal 6: resuming from $WORK/spent/step_00000005$" "$WORK/spent.txt" &&
  grep -q "^loom-run: the job failed (rank 1 on .* was killed by signal 6) and all 1 restarts are spent$" "$WORK/spent.txt" ||
  fail "failing run: exit $code: $(grep loom-run "$WORK/spent.txt")"
echo "ok"
