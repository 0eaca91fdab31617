#!/bin/sh
# Two hosts on one machine: network namespaces joined by a veth pair, each
# with its own address and hostname. launch/loom-run starts a (tp 2, pp 2)
# job from a hostfile, Open MPI reaching the second host through an rsh agent
# that enters its namespace, with only TCP between ranks (no shared memory);
# one pipeline stage per host. Its losses must equal the serial run's. Then
# a host is lost mid-run under --max-restarts --exclude-failed-hosts: the job
# finishes on the other at a smaller dp, its losses the serial run's too.
# Skips (exit 77) where namespaces cannot be made.
# Usage: tests/two_hosts.sh LOOM_RUN LOOM WORKDIR
set -u
LOOM_RUN=$1 LOOM=$2 WORK=$3
# Open MPI's session directories go here, on both hosts: the lost host's
# daemon is killed, and would leave its own behind in /tmp at every run.
export TMPDIR="$WORK/tmp"
rm -rf "$WORK" && mkdir -p "$WORK" "$TMPDIR" # a down.HOST left by an earlier run would cut that host off
. "$(dirname "$0")/lib.sh"
skip() { echo "SKIP: $*"; exit 77; }
command -v ip > /dev/null || skip "no ip command (apt-get install iproute2)"
command -v unshare > /dev/null || skip "no unshare command (util-linux)"
# Hosts A and B, and C held as a spare, each joined to a bridge by a veth pair.
A=lh$$a B=lh$$b C=lh$$c BR=blh$$ NET=10.78.$(($$ % 200 + 20))
ip netns add $A 2> "$WORK/ns.err" || skip "cannot create network namespaces here: $(cat "$WORK/ns.err")"
trap 'ip netns del $A 2> /dev/null; ip netns del $B 2> /dev/null; ip netns del $C 2> /dev/null; ip link del $BR 2> /dev/null' EXIT INT TERM
ip netns add $B && ip netns add $C || fail "more namespaces"
ip link add $BR type bridge 2> "$WORK/br.err" && ip link set $BR up || skip "cannot create a bridge here: $(cat "$WORK/br.err")"
i=1
for ns in $A $B $C; do
  ip link add v$ns type veth peer name p$ns && ip link set v$ns netns $ns && ip link set p$ns master $BR &&
    ip link set p$ns up && ip -n $ns addr add $NET.$i/24 dev v$ns && ip -n $ns link set lo up && ip -n $ns link set v$ns up ||
    fail "veth pair of $ns"
  i=$((i + 1))
done

# The rsh agent Open MPI calls as "agent [options] HOST COMMAND...". A host
# with a file down.HOST is unreachable, as ssh finds a lost node.
cat > "$WORK/agent" << AGENT
#!/bin/sh
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
[ ! -e "$WORK/down.\$host" ] || { echo "agent: connect to host \$host: No route to host" >&2; exit 255; }
case \$host in $NET.1) ns=$A ;; $NET.2) ns=$B ;; $NET.3) ns=$C ;; *) echo "agent: unknown host \$host" >&2; exit 1 ;; esac
exec ip netns exec \$ns unshare --uts sh -c "hostname host-\$ns; exec sh -c \\"\\\$0\\"" "\$*"
AGENT
chmod +x "$WORK/agent"
printf '%s slots=2\n%s slots=2\n' $NET.1 $NET.2 > "$WORK/hosts"
export OMPI_MCA_plm_rsh_agent="$WORK/agent" OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=$NET.0/24 \
  OMPI_MCA_oob_tcp_if_include=$NET.0/24 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

# Ranks 0-1 (pipeline stage 0) on the first host, 2-3 (stage 1) on the second.
ip netns exec $A mpirun --hostfile "$WORK/hosts" -np 4 --bind-to none sh -c 'echo $OMPI_COMM_WORLD_RANK $(ip -4 -o addr show | grep -o "$0\.[0-9]*/" )' $NET \
  | sort > "$WORK/placement.txt" 2>&1
[ "$(tr '\n' ' ' < "$WORK/placement.txt")" = "0 $NET.1/ 1 $NET.1/ 2 $NET.2/ 3 $NET.2/ " ] || fail "placement: $(cat "$WORK/placement.txt")"

MODEL="--layers 2 --hidden 32 --heads 4 --seq 16 --micro-batch 2 --global-batch 8 --eval-every 0 --dropout 0.1 --steps 4"
before=$(ip -n $B -s link show v$B | awk '/RX:/ { getline; print $1 }')
ip netns exec $A "$LOOM_RUN" --hostfile "$WORK/hosts" -n 4 --bind none train $MODEL --tp 2 --pp 2 \
  --metrics "$WORK/two.jsonl" > "$WORK/two.txt" 2>&1 || fail "two-host run: $(tail -5 "$WORK/two.txt")"
after=$(ip -n $B -s link show v$B | awk '/RX:/ { getline; print $1 }')
[ $((after - before)) -gt 10000 ] || fail "only $((after - before)) bytes crossed the link"
"$LOOM" train $MODEL --metrics "$WORK/one.jsonl" > /dev/null 2>&1 || fail "serial run"
losses() { grep -o '"loss": [0-9.e+-]*' "$1" | sed 's/.*: //'; }
losses "$WORK/one.jsonl" > "$WORK/one.txt"
losses "$WORK/two.jsonl" > "$WORK/two_losses.txt"
[ "$(wc -l < "$WORK/two_losses.txt")" = 4 ] || fail "expected 4 losses: $(cat "$WORK/two.txt")"
paste "$WORK/one.txt" "$WORK/two_losses.txt" | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) { print "step " NR ": " $2 " vs serial " $1; bad = 1 } } END { exit bad }' ||
  fail "two-host losses differ from the serial run"

# One tp-2 replica per host (dp 2); the second host is lost mid-run: every
# process on it killed, and no longer reachable. loom-run restarts from the
# latest checkpoint on the first host alone, at dp 1 with the same global batch.
LOST="--layers 2 --hidden 32 --heads 4 --seq 16 --micro-batch 2 --global-batch 8 --eval-every 0 --steps 16 --log-every 1"
rm -rf "$WORK/lost" "$WORK/lost.jsonl" "$WORK/down.$NET.2"
ip netns exec $A env LOOM_FAULT=slow:*:*:40 "$LOOM_RUN" --hostfile "$WORK/hosts" -n 4 --bind none --max-restarts 1 \
  --exclude-failed-hosts train $LOST --tp 2 --dp 2 --ckpt "$WORK/lost" --save-every 4 --metrics "$WORK/lost.jsonl" \
  > "$WORK/lost.txt" 2>&1 &
job=$!
wait_for "$WORK/lost.jsonl" '"step": 6,' 180
touch "$WORK/down.$NET.2"
ip netns pids $B | xargs -r kill -KILL
wait $job || fail "run after a lost host: $(tail -5 "$WORK/lost.txt")"
grep -q "^loom-run: restart 1 of 1 after .*$NET.2.*: resuming from $WORK/lost/step_0000000[48] on 2 ranks without $NET.2$" "$WORK/lost.txt" ||
  fail "no restart without the lost host: $(grep -A3 'loom-run\|ORTE\|node' "$WORK/lost.txt" | head -20)"
grep -q "^elastic: 2 ranks for a plan of 4: dp 2 -> 1, global batch 8 kept" "$WORK/lost.txt" || fail "no elastic line: $(tail -5 "$WORK/lost.txt")"
"$LOOM" train $LOST --metrics "$WORK/one_lost.jsonl" > /dev/null 2>&1 || fail "serial run of the lost-host model"
losses "$WORK/one_lost.jsonl" > "$WORK/one_lost.txt"
losses "$WORK/lost.jsonl" > "$WORK/lost_losses.txt"
[ "$(wc -l < "$WORK/lost_losses.txt")" = 16 ] || fail "expected 16 losses after the restart: $(cat "$WORK/lost_losses.txt")"
paste "$WORK/one_lost.txt" "$WORK/lost_losses.txt" | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) { print "step " NR ": " $2 " vs serial " $1; bad = 1 } } END { exit bad }' ||
  fail "losses after the lost host differ from the serial run"

# A hot spare: host B is lost mid-run (its processes killed, its in-memory
# copies wiped, no longer reachable); C takes its place, the job resumes at
# its own layout (dp 2) from the in-memory copies, B's shards sent from A's
# replicas, and ends with an uninterrupted run's losses and weights, bit for bit.
printf '%s slots=2\n' $NET.3 > "$WORK/spares"
SPARE="$LOST --tp 2 --dp 2 --local-save-every 2 --local-dir $WORK/shm"
rm -f "$WORK/down.$NET.2" # B is back for the uninterrupted run
ip netns exec $A "$LOOM_RUN" --hostfile "$WORK/hosts" -n 4 --bind none train $LOST --tp 2 --dp 2 \
  --metrics "$WORK/whole.jsonl" --save "$WORK/whole.bin" > "$WORK/whole.txt" 2>&1 || fail "uninterrupted two-host run: $(tail -5 "$WORK/whole.txt")"
rm -rf "$WORK/spare" "$WORK/down.$NET.2" "$WORK/shm"
ip netns exec $A env LOOM_FAULT=slow:*:*:40 "$LOOM_RUN" --hostfile "$WORK/hosts" --spare-hosts "$WORK/spares" -n 4 --bind none \
  --max-restarts 1 train $SPARE --ckpt "$WORK/spare" --metrics "$WORK/spare.jsonl" --save "$WORK/spare.bin" > "$WORK/spare.txt" 2>&1 &
job=$!
wait_for "$WORK/spare.jsonl" '"step": 7,' 180
touch "$WORK/down.$NET.2"
ip netns pids $B | xargs -r kill -KILL
rm -rf "$WORK/shm/host-$B"
wait $job || fail "run with a spare host: $(tail -5 "$WORK/spare.txt")"
grep -q "^loom-run: restart 1 of 1 after .*$NET.2.*: replacing $NET.2 by spare $NET.3; resuming from the newest complete in-memory set" "$WORK/spare.txt" ||
  fail "no restart on the spare: $(grep 'loom-run' "$WORK/spare.txt")"
grep -q "^resume: step [0-9]* from the in-memory copies (the persistent checkpoint holds none): .* 2 sent by peers holding replicas (.*shard 2: a peer's replica, sent by rank [01] on " "$WORK/spare.txt" ||
  fail "no in-memory resume from the peers' replicas: $(grep 'resume\|local' "$WORK/spare.txt")"
grep -q "^elastic" "$WORK/spare.txt" && fail "the spare's run shrank dp"
[ "$(losses "$WORK/spare.jsonl")" = "$(losses "$WORK/whole.jsonl")" ] || fail "losses with a spare differ from the uninterrupted run's"
cmp -s "$WORK/whole.bin" "$WORK/spare.bin" || fail "final weights with a spare differ from the uninterrupted run's"
echo "ok: $((after - before)) bytes over the veth link; losses equal the serial run, after a lost host too; a spare resumes bit for bit"
