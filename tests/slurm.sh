#!/bin/sh
# launch/slurm/loom.sbatch without a Slurm cluster: srun and scontrol are
# stand-ins (srun runs its command under mpirun with SLURM_NTASKS ranks and
# records its options; scontrol records a requeue). A job preempted by
# SIGTERM checkpoints, exits 0 and requeues itself; the requeued job resumes
# and finishes with the losses of an uninterrupted run, and does not requeue.
# A plan that does not fit the job's tasks is refused before srun.
# Usage: tests/slurm.sh MPIEXEC SBATCH LOOM WORKDIR
set -u
MPIEXEC=$1 SBATCH=$2 LOOM=$3 WORK=$4
rm -rf "$WORK" && mkdir -p "$WORK/bin"
. "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cat > "$WORK/bin/srun" << 'SRUN'
#!/bin/sh
echo "$*" >> "$SRUN_LOG"
echo $$ > "$SRUN_LOG.pid" # exec keeps the pid: the job step to preempt
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
exec "$MPIEXEC" --oversubscribe --bind-to none -np "$SLURM_NTASKS" -x OMP_NUM_THREADS=1 "$@"
SRUN
printf '#!/bin/sh\necho "$*" >> "$SCONTROL_LOG"\n' > "$WORK/bin/scontrol"
chmod +x "$WORK/bin/srun" "$WORK/bin/scontrol"
PLAN="$(cd "$(dirname "$0")/.." && pwd)/examples/plans/tiny-tp2-pp2.txtpb"
export MPIEXEC PATH="$WORK/bin:$PATH" SRUN_LOG="$WORK/srun.log" SCONTROL_LOG="$WORK/scontrol.log" SLURM_SUBMIT_DIR="$WORK" \
  SLURM_JOB_ID=42 SLURM_JOB_NAME=tiny SLURM_NTASKS=4 LOOM="$LOOM" LOOM_PLAN="$PLAN" LOOM_SAVE_EVERY=5 \
  LOOM_ARGS="--eval-every 0 --metrics $WORK/m.jsonl"
losses() { grep -o '"step": [0-9]*, "loss": [0-9.e+-]*' "$1"; }

# The reference: the same 30 steps uninterrupted.
"$MPIEXEC" --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS=1 "$LOOM" train --plan "$PLAN" --steps 30 \
  --eval-every 0 --metrics "$WORK/ref.jsonl" > "$WORK/ref.txt" 2>&1 || fail "reference run: $(cat "$WORK/ref.txt")"

# Preempted: SIGTERM to the tasks and to the batch shell.
# One rank is slowed (a test fault) so the preemption lands mid-run.
LOOM_FAULT="slow:3:*:60" LOOM_STEPS=30 bash "$SBATCH" > "$WORK/job1.txt" 2>&1 &
job=$!
wait_for "$WORK/m.jsonl" '"step": 12,' 180
pkill -TERM -P "$(cat "$WORK/srun.log.pid")" || fail "no job step to preempt" # the tasks, as slurmstepd signals them
kill -TERM $job
wait $job
code=$?
# On failure, the ranks' own last lines (mpirun's banner after them says only which rank ended how).
[ $code = 0 ] || fail "preempted job exited $code: $(grep -v -e '^-----' -e '^ *$' "$WORK/job1.txt" | tail -25)"
grep -q "stopped by a signal after step" "$WORK/job1.txt" || fail "no checkpoint on SIGTERM: $(tail -5 "$WORK/job1.txt")"
grep -qx "requeue 42" "$WORK/scontrol.log" || fail "the preempted job did not requeue"
grep -q -- "--mpi=pmix" "$WORK/srun.log" || fail "srun without PMIx: $(cat "$WORK/srun.log")"
stopped=$(sed -n 's/^step_0*//p' "$WORK/checkpoints/tiny/latest")
[ "$stopped" -ge 12 ] || fail "checkpoint at step $stopped"

# The requeued job: resumes, finishes at 30, does not requeue again.
: > "$WORK/scontrol.log"
mv "$WORK/m.jsonl" "$WORK/m1.jsonl"
SLURM_RESTART_COUNT=1 LOOM_STEPS=30 bash "$SBATCH" > "$WORK/job2.txt" 2>&1 || fail "requeued job: $(tail -5 "$WORK/job2.txt")"
grep -q "resuming from step $stopped" "$WORK/job2.txt" || fail "no resume: $(head -3 "$WORK/job2.txt")"
[ ! -s "$WORK/scontrol.log" ] || fail "a finished job requeued"
exact_losses "$WORK/m.jsonl" "$WORK/ref.jsonl" $((30 - stopped)) || fail "resumed losses differ from the uninterrupted run"

# A plan that does not fit the job: refused before srun, exit 2.
SLURM_NTASKS=8 LOOM_STEPS=30 bash "$SBATCH" > "$WORK/job3.txt" 2>&1
[ $? = 2 ] && grep -q "needs 4 ranks but the job has 8 tasks" "$WORK/job3.txt" || fail "misfit plan: $(cat "$WORK/job3.txt")"
echo "ok: preempted at step $stopped, requeued, resumed to 30"
