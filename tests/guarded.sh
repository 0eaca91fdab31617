#!/bin/sh
# The guarded backend against the CPU backend, bit for bit, over the whole
# multi-rank matrix: each layout trains on both (with held-out evaluation,
# checkpoint saves and an llm.c export), and the metrics and the exported
# weights must be identical; a checkpoint saved on the guarded backend
# resumes onto another layout there as it does on the CPU; and sampling from
# the exported model gives the same text. The guarded backend faults on any
# host access to tensor memory, so this also proves that nothing above the
# backends touches it, on every path the matrix takes; and its allocator's
# memory peak checks the plan's estimate of what each layout holds.
# Usage: tests/guarded.sh MPIEXEC LOOM WORKDIR
set -u
MPIEXEC=$1 LOOM=$2 WORK=$3
. "$(dirname "$0")/lib.sh"
rm -rf "$WORK" && mkdir -p "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MODEL="--layers 4 --hidden 32 --heads 4 --seq 16 --micro-batch 2 --global-batch 8 --eval-every 2 --eval-batches 2"
numbers() { grep -o '"step": [0-9]*, "loss": [0-9.e+-]*, "lr": [0-9.e+-]*, "grad_norm": [0-9.e+-]*\|"eval_loss": [0-9.e+-]*, "eval_accuracy": [0-9.e+-]*' "$1"; }

# run NAME RANKS DEVICE STEPS [FLAGS...]: one training run into $WORK/NAME.DEVICE.*
run() {
  name=$1 ranks=$2 dev=$3 steps=$4
  shift 4
  out="$WORK/$name.$dev"
  "$MPIEXEC" --oversubscribe --bind-to none -np "$ranks" -x OMP_NUM_THREADS=1 "$LOOM" train $MODEL --device "$dev" \
    --steps "$steps" --metrics "$out.jsonl" "$@" > "$out.txt" 2>&1 || fail "$name on $dev: $(tail -3 "$out.txt")"
}

# same NAME: the two backends' metrics and exported weights are identical (and not empty).
same() {
  numbers "$WORK/$1.cpu.jsonl" > "$WORK/$1.cpu.numbers"
  numbers "$WORK/$1.guarded.jsonl" > "$WORK/$1.guarded.numbers"
  [ -s "$WORK/$1.cpu.numbers" ] || fail "$1: the CPU run reported no losses"
  grep -q eval_loss "$WORK/$1.cpu.numbers" || fail "$1: no held-out evaluation"
  cmp -s "$WORK/$1.cpu.numbers" "$WORK/$1.guarded.numbers" ||
    fail "$1: the guarded backend's numbers differ: $(diff "$WORK/$1.cpu.numbers" "$WORK/$1.guarded.numbers" | head -4)"
  # The guarded allocator counts what the run holds, as a GPU's does, in
  # blocks rounded up to 512 bytes: the memory model's estimate must come
  # within 5% of its peak (tests/test_pp.c holds the exact count to 1%).
  off=$(sed -n "s/.*tensor memory peaked at .* (the guarded allocator's count); loom estimated .* MiB, \([-+][0-9.]*\)% off;.*/\1/p" "$WORK/$1.guarded.txt")
  [ -n "$off" ] || fail "$1: no memory report from the guarded allocator"
  awk -v x="$off" 'BEGIN { exit !(x >= -5 && x <= 5) }' ||
    fail "$1: the plan's memory estimate is $off% off the guarded allocator's peak (bound 5%)"
  if [ -f "$WORK/$1.cpu.model" ]; then
    cmp -s "$WORK/$1.cpu.model" "$WORK/$1.guarded.model" || fail "$1: the exported weights differ"
  elif [ -f "$WORK/$1.cpu.model.safetensors" ]; then # a Mixture of Experts
    cmp -s "$WORK/$1.cpu.model.safetensors" "$WORK/$1.guarded.model.safetensors" || fail "$1: the exported weights differ"
  elif [ -d "$WORK/$1.cpu.model" ]; then # a Hugging Face directory
    cmp -s "$WORK/$1.cpu.model/model.safetensors" "$WORK/$1.guarded.model/model.safetensors" || fail "$1: the exported weights differ"
  else
    fail "$1: the CPU run saved no weights to compare"
  fi
}

layout() { # layout NAME RANKS FLAGS...: trained on both, with checkpoints and an export (the quick tier's part)
  part quick || return 0
  layout_on "$@"
}
layout_more() { # the same, a second configuration of what a quick layout covers: the full tier's part (guarded_more)
  part more || return 0
  layout_on "$@"
}
layout_on() {
  name=$1 ranks=$2
  shift 2
  suffix="" # a Mixture of Experts saves a safetensors file
  case "$*" in *--num-experts*) suffix=.safetensors ;; esac
  for dev in cpu guarded; do
    run "$name" "$ranks" "$dev" 4 --ckpt "$WORK/$name.$dev.ckpt" --save-every 2 --save "$WORK/$name.$dev.model$suffix" "$@"
  done
  same "$name"
}

layout serial 1
layout_more tp2 2 --tp 2
layout tp2_sp 2 --tp 2 --sequence-parallel
layout_more pp2 2 --pp 2
layout pp2_interleaved 2 --pp 2 --vpp 2 --schedule interleaved
layout_more dp2 2 --dp 2
layout dp2_zero1 2 --dp 2 --zero 1
layout_more dp2_zero2 2 --dp 2 --zero 2
layout pp2_dp2_zero3_recompute 4 --pp 2 --dp 2 --zero 3 --recompute full
layout bf16_dp2_zero3 2 --dp 2 --zero 3 --precision bf16
layout dp2_powersgd 2 --dp 2 --grad-compression powersgd:2
layout_more dp2_sign 2 --dp 2 --grad-compression sign
layout_more bf16_dp2_zero1_powersgd 2 --dp 2 --zero 1 --precision bf16 --grad-compression powersgd:2
layout tp2_dp2_zero1_recompute 4 --tp 2 --dp 2 --zero 1 --recompute full
layout_more tp2_pp2_dropout 4 --tp 2 --pp 2 --dropout 0.1
layout bf16_tp2_sp 2 --tp 2 --sequence-parallel --precision bf16
layout_more bf16_pp2_dp2_zero1 4 --pp 2 --dp 2 --zero 1 --precision bf16
layout_more bf16_recompute 1 --recompute full --precision bf16 --dropout 0.1
# The Llama family (saved as Hugging Face directories): grouped-query
# attention under SP, and one key/value head replicated over tp 2 in bf16.
LLAMA="--norm rmsnorm --mlp swiglu --position rope --no-bias --untied"
layout llama_tp2_sp_dp2_zero3 4 --tp 2 --sequence-parallel --dp 2 --zero 3 --kv-heads 2 $LLAMA
layout_more bf16_mqa_tp2_pp2_recompute 4 --tp 2 --pp 2 --kv-heads 1 --precision bf16 --recompute full $LLAMA
# Mixtures of Experts (saved as safetensors): over tp 2 (SP) x dp 2 each expert split over the tp group (etp 2)
# and ep 2 over dp under ZeRO-1, its rows gathered over tp; and in bf16 ep 2 over dp 2 with a capacity factor,
# its tokens crossing the EP group in all-to-alls.
MOE="$LLAMA --num-experts 4 --moe-ffn-hidden-size 32 --moe-shared-expert-intermediate-size 16 --moe-aux-loss-coeff 0.01"
layout moe_etp2_ep2_tp2_sp_dp2_zero1 4 --tp 2 --sequence-parallel --dp 2 --ep 2 --etp 2 --zero 1 $MOE
layout bf16_moe_ep2_dp2_capacity 2 --dp 2 --ep 2 --precision bf16 --moe-expert-capacity-factor 1 $MOE

# Resume a guarded checkpoint (tp 2, dp 2, ZeRO-1) onto pp 2: the same numbers as on the CPU.
part quick || { echo "ok: the guarded backend equals the CPU's over the full tier's layouts"; exit 0; }
for dev in cpu guarded; do
  cp -r "$WORK/tp2_dp2_zero1_recompute.$dev.ckpt" "$WORK/resumed.$dev.ckpt"
  run resumed 2 "$dev" 6 --pp 2 --ckpt "$WORK/resumed.$dev.ckpt" --resume --save "$WORK/resumed.$dev.model"
done
same resumed
grep -q '"step": 5,' "$WORK/resumed.guarded.jsonl" || fail "the resumed run did not train steps 5 and 6"

# Sampling from the exported model on each backend, greedy and at a temperature.
for temperature in 0 0.8; do
  for dev in cpu guarded; do
    "$LOOM" sample --device "$dev" --init-from "$WORK/serial.cpu.model" --prompt "12+34=" --max-tokens 12 \
      --temperature $temperature > "$WORK/sample.$dev.txt" 2>&1 || fail "sample on $dev: $(tail -3 "$WORK/sample.$dev.txt")"
  done
  [ -s "$WORK/sample.cpu.txt" ] || fail "sampling printed nothing"
  cmp -s "$WORK/sample.cpu.txt" "$WORK/sample.guarded.txt" ||
    fail "sampling at temperature $temperature differs: $(diff "$WORK/sample.cpu.txt" "$WORK/sample.guarded.txt" | head -4)"
done
echo "ok: the guarded backend equals the CPU backend bit for bit over the matrix"
