#!/bin/sh
# Data parallelism over a slow link: two hosts made of network namespaces
# joined by a veth pair (as tests/two_hosts.sh builds them), the link shaped
# by tc to each RATE, one rank per host (dp 2, TCP only). For each rate and
# each --grad-compression it trains STEPS steps and prints the median step
# time of the steps after the first, in one table. Needs root.
# Usage: bench/slow_link.sh LOOM "RATE..." "COMPRESSION..." [train flags...]
#   e.g. bench/slow_link.sh build/loom "200mbit 1gbit none" "none powersgd:4 sign" --model gpt2-small --seq 64 --micro-batch 2
set -u
. "$(dirname "$0")/lib.sh"
LOOM=$(realpath "$1") RATES=$2 METHODS=$3
shift 3
STEPS=${STEPS:-4}
WORK=$(mktemp -d)
A=sl$$a B=sl$$b NET=10.79.$(($$ % 200 + 20))
cleanup() { ip netns del $A 2> /dev/null; ip netns del $B 2> /dev/null; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM
ip netns add $A && ip netns add $B || { echo "cannot create network namespaces" >&2; exit 1; }
ip link add v$A type veth peer name v$B && ip link set v$A netns $A && ip link set v$B netns $B
ip -n $A addr add $NET.1/24 dev v$A && ip -n $B addr add $NET.2/24 dev v$B
for ns in $A $B; do ip -n $ns link set lo up; ip -n $ns link set v$ns up; done
cat > "$WORK/agent" << AGENT
#!/bin/sh
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
case \$host in $NET.1) ns=$A ;; $NET.2) ns=$B ;; *) exit 1 ;; esac
exec ip netns exec \$ns sh -c "\$*"
AGENT
chmod +x "$WORK/agent"
printf '%s slots=1\n%s slots=1\n' $NET.1 $NET.2 > "$WORK/hosts"
export OMPI_MCA_plm_rsh_agent="$WORK/agent" OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=$NET.0/24 \
  OMPI_MCA_oob_tcp_if_include=$NET.0/24 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TMPDIR="$WORK"

printf '%-10s' "link"
for m in $METHODS; do printf ' | %-22s' "$m"; done
printf '\n'
for rate in $RATES; do
  for ns in $A $B; do
    tc -n $ns qdisc del dev v$ns root 2> /dev/null
    [ "$rate" = none ] || tc -n $ns qdisc add dev v$ns root tbf rate "$rate" burst 256kb latency 2s
  done
  printf '%-10s' "$rate"
  for m in $METHODS; do
    ip netns exec $A mpirun --hostfile "$WORK/hosts" -np 2 --bind-to none -x OMP_NUM_THREADS=1 "$LOOM" train --dp 2 \
      --grad-compression "$m" --steps "$STEPS" --eval-every 0 --log-every 1 --metrics "$WORK/m.jsonl" "$@" \
      > "$WORK/run.txt" 2>&1 || { tail -3 "$WORK/run.txt" >&2; exit 1; }
    ms=$(median_step_ms "$WORK/m.jsonl")
    bytes=$(grep -o '"dp_bytes": [0-9.e+-]*' "$WORK/m.jsonl" | tail -1 | cut -d' ' -f2)
    printf ' | %8.0f ms, %8s MB' "$ms" "$(awk -v b="${bytes:-0}" 'BEGIN { if (b > 0) printf "%.3f", b / 1e6; else printf "whole" }')"
  done
  printf '\n'
done
