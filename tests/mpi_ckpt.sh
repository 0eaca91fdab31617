#!/bin/sh
# Checkpoints under mpirun: bit-exact resume on the same plan (with ZeRO-1
# too), resharding onto other plans both by --resume and by `loom ckpt
# reshard`, a rank killed mid-save, SIGTERM, --keep, export, and every kind of
# damaged or mismatched checkpoint refused with the file named.
# Usage: tests/mpi_ckpt.sh MPIEXEC LOOM WORKDIR
set -u
MPIEXEC=$1 LOOM=$2 WORK=$3
rm -rf "$WORK" && mkdir -p "$WORK" # a run before this one leaves its outputs, which loom will not replace
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. "$(dirname "$0")/lib.sh"
MODEL="--layers 2 --hidden 32 --heads 4 --seq 16 --micro-batch 2 --global-batch 8 --eval-every 0 --dropout 0.1"
# np N [flags]: loom train of MODEL on N ranks.
np() { n=$1; shift; "$MPIEXEC" --oversubscribe --bind-to none -np "$n" -x OMP_NUM_THREADS=1 "$LOOM" train $MODEL "$@"; }
losses() { grep -o '"step": [0-9]*, "loss": [0-9.e+-]*' "$1" | sed 's/.*"loss": //'; }
# same_losses A B [TOL]: every loss of B equals A's at the same step within rel TOL (default 1e-5: fp32
# after resharding); B must hold at least one loss, so an empty or missing file fails.
same_losses() {
  tol=${3:-1e-5}
  [ "$(grep -c '"loss": ' "$2" 2>/dev/null)" -ge 1 ] || { echo "$2 holds no losses"; return 1; }
  grep -o '"step": [0-9]*, "loss": [0-9.e+-]*' "$2" | while IFS= read -r line; do
    step=$(echo "$line" | sed 's/"step": \([0-9]*\),.*/\1/') b=$(echo "$line" | sed 's/.*"loss": //')
    a=$(grep -o "\"step\": $step, \"loss\": [0-9.e+-]*" "$1" | sed 's/.*"loss": //')
    awk -v a="$a" -v b="$b" -v t="$tol" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= t * (a < 0 ? -a : a)) }' ||
      { echo "step $step: $b vs $a"; return 1; }
  done
}

# The reference: 9 uninterrupted steps on (tp, pp, dp) = (2, 2, 1) (not in the full tier's part, which only resumes).
if part quick; then
  np 4 --tp 2 --pp 2 --steps 9 --metrics "$WORK/full.jsonl" --save "$WORK/full.bin" > "$WORK/full.txt" 2>&1 || fail "reference run: $(cat "$WORK/full.txt")"
fi

# Same plan: 3 steps, then resume to 9, equals that plan's uninterrupted run
# to the last bit (losses and the gathered final weights), on (2,2,1) and on
# (1,2,2) with ZeRO-1 and ZeRO-3 (whose checkpoints hold each replica's
# pieces of the weights), in fp32 and in bf16 (whose checkpoints hold the
# fp32 master weights; the bf16 copy is made again from them), ZeRO-2 in bf16,
# and under the zero-bubble schedules (ZB-V's rank 0 holds the first and last stage).
# The quick tier resumes three of these layouts (ZeRO-3's resume is also the resharding chain's below),
# the full tier's part (mpi_ckpt_more) the other five.
quick_layouts='"--tp 2 --pp 2 --schedule zb_v --vpp 2" "--pp 2 --dp 2 --zero 1 --schedule zb_h1"
  "--pp 2 --dp 2 --zero 2 --precision bf16"'
more_layouts='"--tp 2 --pp 2" "--pp 2 --dp 2 --zero 1" "--pp 2 --dp 2 --zero 1 --precision bf16" "--tp 2 --pp 2 --precision bf16"
  "--pp 2 --dp 2 --zero 3"'
layouts=""
part quick && layouts="$quick_layouts"
part more && layouts="$layouts $more_layouts"
eval "set -- $layouts"
for layout in "$@"; do
  rm -rf "$WORK/ck" "$WORK"/ref.* "$WORK"/res.*
  np 4 $layout --steps 9 --metrics "$WORK/ref.jsonl" --save "$WORK/ref.bin" > /dev/null 2>&1 || fail "reference ($layout)"
  np 4 $layout --steps 3 --ckpt "$WORK/ck" > "$WORK/a.txt" 2>&1 || fail "first third ($layout): $(cat "$WORK/a.txt")"
  np 4 $layout --steps 9 --ckpt "$WORK/ck" --resume --metrics "$WORK/res.jsonl" --save "$WORK/res.bin" > "$WORK/res.txt" 2>&1 ||
    fail "resume ($layout): $(cat "$WORK/res.txt")"
  grep -q "resumed from .*/latest at step 3: .* GB/s" "$WORK/res.txt" || fail "no resume line ($layout)"
  exact_losses "$WORK/res.jsonl" "$WORK/ref.jsonl" 6 || fail "resumed losses differ ($layout)"
  cmp -s "$WORK/ref.bin" "$WORK/res.bin" || fail "resumed final weights differ ($layout)"
done
part quick || { echo "ok: the full tier's layouts resume bit for bit"; exit 0; }
# A checkpoint of ZB-V's layout resumes under 1F1B: the first 3 steps on
# ZB-V, the rest on 1F1B, give the reference's 1F1B losses (relative 1e-5).
rm -rf "$WORK/zv"
np 4 --tp 2 --pp 2 --schedule zb_v --vpp 2 --steps 3 --ckpt "$WORK/zv" > "$WORK/zv.txt" 2>&1 ||
  fail "ZB-V's first third: $(cat "$WORK/zv.txt")"
np 4 --tp 2 --pp 2 --steps 9 --ckpt "$WORK/zv" --resume --metrics "$WORK/zv.jsonl" > "$WORK/zv.txt" 2>&1 ||
  fail "ZB-V's checkpoint under 1F1B: $(cat "$WORK/zv.txt")"
[ "$(losses "$WORK/zv.jsonl" | wc -l)" = 6 ] || fail "the resumed run should train steps 4-9"
same_losses "$WORK/full.jsonl" "$WORK/zv.jsonl" || fail "ZB-V's checkpoint resumed under 1F1B: losses differ"

# The checkpoint exports as the same model --save wrote, and as safetensors.
"$LOOM" ckpt export "$WORK/ck" --format llmc -o "$WORK/export.bin" > /dev/null || fail "export llmc"
cmp -s "$WORK/ref.bin" "$WORK/export.bin" || fail "exported model differs from the trained one"
"$LOOM" ckpt export "$WORK/ck" --format safetensors -o "$WORK/m.safetensors" > /dev/null || fail "export safetensors"
grep -q '"h.1.mlp.c_fc.weight":{"dtype":"F32","shape":\[32,128\]' "$WORK/m.safetensors" || fail "safetensors header"
# Streamed from the checkpoint tensor by tensor, it equals the export of the same model held in memory.
"$LOOM" ckpt export --init-from "$WORK/ref.bin" --format safetensors \
  -o "$WORK/m2.safetensors" > /dev/null || fail "export safetensors from a model file"
cmp -s "$WORK/m.safetensors" "$WORK/m2.safetensors" || fail "safetensors from the checkpoint and from memory differ"

# The Llama family with one key/value head: 9 steps on (2,2,1), where both TP ranks hold the head and
# only the first writes it, equal 3 there, resumed onto (1,1,2) to 6 and onto (1,2,1) to 9; --save
# writes a Hugging Face directory, which `ckpt export --format hf` of the checkpoint equals.
LLAMA="--norm rmsnorm --mlp swiglu --position rope --no-bias --untied --kv-heads 1"
rm -rf "$WORK/ll" "$WORK/ll_ref" "$WORK/ll_export"
np 4 --tp 2 --pp 2 $LLAMA --steps 9 --metrics "$WORK/ll_ref.jsonl" > "$WORK/ll_ref.txt" 2>&1 || fail "Llama reference: $(cat "$WORK/ll_ref.txt")"
np 4 --tp 2 --pp 2 $LLAMA --steps 3 --ckpt "$WORK/ll" > "$WORK/ll0.txt" 2>&1 || fail "Llama first third: $(cat "$WORK/ll0.txt")"
np 2 --dp 2 $LLAMA --steps 6 --ckpt "$WORK/ll" --resume --metrics "$WORK/ll1.jsonl" > "$WORK/ll1.txt" 2>&1 ||
  fail "Llama resumed on (1,1,2): $(cat "$WORK/ll1.txt")"
np 2 --pp 2 $LLAMA --steps 9 --ckpt "$WORK/ll" --resume --metrics "$WORK/ll2.jsonl" --save "$WORK/ll_ref" > "$WORK/ll2.txt" 2>&1 ||
  fail "Llama resumed on (1,2,1): $(cat "$WORK/ll2.txt")"
same_losses "$WORK/ll_ref.jsonl" "$WORK/ll1.jsonl" || fail "Llama losses after resharding onto (1,1,2)"
same_losses "$WORK/ll_ref.jsonl" "$WORK/ll2.jsonl" || fail "Llama losses after resharding onto (1,2,1)"
"$LOOM" ckpt export "$WORK/ll" --format hf -o "$WORK/ll_export" > /dev/null || fail "Llama export"
cmp -s "$WORK/ll_ref/model.safetensors" "$WORK/ll_export/model.safetensors" || fail "the Llama export differs from --save's"
grep -q '"architectures": \["LlamaForCausalLM"\]' "$WORK/ll_export/config.json" || fail "Llama config.json"

# Context parallelism: a checkpoint is independent of cp. The Llama family (two key/value heads, RoPE) 3
# steps at cp 2 resumed to 9 at cp 1 and at cp 4 (ZeRO-1 over dp x cp's four ranks) gives the one-rank
# run's losses within fp32's 1e-5, and the same run at cp 2 resumed there equals itself bit for bit.
LLAMA2="--norm rmsnorm --mlp swiglu --position rope --no-bias --untied --kv-heads 2"
rm -rf "$WORK"/cp*
np 1 $LLAMA2 --steps 9 --metrics "$WORK/cp_ref.jsonl" > "$WORK/cp_ref.txt" 2>&1 || fail "cp reference: $(cat "$WORK/cp_ref.txt")"
np 2 --cp 2 $LLAMA2 --steps 9 --metrics "$WORK/cp2_ref.jsonl" > "$WORK/cp2_ref.txt" 2>&1 || fail "cp 2 run: $(cat "$WORK/cp2_ref.txt")"
np 2 --cp 2 $LLAMA2 --steps 3 --ckpt "$WORK/cp" > "$WORK/cp0.txt" 2>&1 || fail "cp 2 first third: $(cat "$WORK/cp0.txt")"
cp -r "$WORK/cp" "$WORK/cp_copy" && cp -r "$WORK/cp" "$WORK/cp_same"
np 1 $LLAMA2 --steps 9 --ckpt "$WORK/cp" --resume --metrics "$WORK/cp1.jsonl" > "$WORK/cp1.txt" 2>&1 ||
  fail "cp 2 resumed at cp 1: $(cat "$WORK/cp1.txt")"
np 4 --cp 4 --zero 1 $LLAMA2 --steps 9 --ckpt "$WORK/cp_copy" --resume --metrics "$WORK/cp4.jsonl" > "$WORK/cp4.txt" 2>&1 ||
  fail "cp 2 resumed at cp 4: $(cat "$WORK/cp4.txt")"
np 2 --cp 2 $LLAMA2 --steps 9 --ckpt "$WORK/cp_same" --resume --metrics "$WORK/cp2.jsonl" > "$WORK/cp2.txt" 2>&1 ||
  fail "cp 2 resumed at cp 2: $(cat "$WORK/cp2.txt")"
[ "$(losses "$WORK/cp1.jsonl" | wc -l)" = 6 ] && [ "$(losses "$WORK/cp4.jsonl" | wc -l)" = 6 ] || fail "the resumed cp runs should train steps 4-9"
same_losses "$WORK/cp_ref.jsonl" "$WORK/cp2_ref.jsonl" || fail "cp 2's losses differ from the one-rank run's"
same_losses "$WORK/cp_ref.jsonl" "$WORK/cp1.jsonl" || fail "losses of cp 2's checkpoint resumed at cp 1"
same_losses "$WORK/cp_ref.jsonl" "$WORK/cp4.jsonl" || fail "losses of cp 2's checkpoint resumed at cp 4"
exact_losses "$WORK/cp2.jsonl" "$WORK/cp2_ref.jsonl" 6 || fail "cp 2 resumed at cp 2: losses differ"

# A Mixture of Experts (4 experts, top 2, a shared expert, both router losses): 3 steps on (2,2,1) with
# SP and each expert split over the tp group (--etp 2) resumed to 9 there equals the uninterrupted run to
# the last bit (losses and final weights, whose experts' slices each rank saved by name); resumed onto
# (1,1,2) instead, every expert whole on each rank, the losses equal it within fp32's 1e-5.
MOE="--norm rmsnorm --mlp swiglu --position rope --no-bias --untied --num-experts 4 --moe-ffn-hidden-size 32
  --moe-shared-expert-intermediate-size 16 --moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 0.001"
rm -rf "$WORK/moe" "$WORK"/moe_*
np 4 --tp 2 --pp 2 --sequence-parallel --etp 2 $MOE --steps 9 --metrics "$WORK/moe_ref.jsonl" --save "$WORK/moe_ref.safetensors" \
  > "$WORK/moe_ref.txt" 2>&1 || fail "MoE reference: $(cat "$WORK/moe_ref.txt")"
grep -q '"load_balancing_loss": ' "$WORK/moe_ref.jsonl" || fail "MoE metrics hold no load_balancing_loss"
np 4 --tp 2 --pp 2 --sequence-parallel --etp 2 $MOE --steps 3 --ckpt "$WORK/moe" > "$WORK/moe_0.txt" 2>&1 || fail "MoE first third: $(cat "$WORK/moe_0.txt")"
cp -r "$WORK/moe" "$WORK/moe_copy" # the same 3 steps, for a resume elsewhere
np 4 --tp 2 --pp 2 --sequence-parallel --etp 2 $MOE --steps 9 --ckpt "$WORK/moe" --resume --metrics "$WORK/moe_res.jsonl" \
  --save "$WORK/moe_res.safetensors" > "$WORK/moe_res.txt" 2>&1 || fail "MoE resume: $(cat "$WORK/moe_res.txt")"
exact_losses "$WORK/moe_res.jsonl" "$WORK/moe_ref.jsonl" 6 || fail "MoE resumed losses differ"
cmp -s "$WORK/moe_ref.safetensors" "$WORK/moe_res.safetensors" || fail "MoE resumed final weights differ"
np 2 --dp 2 $MOE --steps 9 --ckpt "$WORK/moe_copy" --resume --metrics "$WORK/moe_dp.jsonl" > "$WORK/moe_dp.txt" 2>&1 ||
  fail "MoE resumed on (1,1,2): $(cat "$WORK/moe_dp.txt")"
same_losses "$WORK/moe_ref.jsonl" "$WORK/moe_dp.jsonl" || fail "MoE losses after resharding onto (1,1,2)"

# Expert parallelism: a checkpoint holds each expert by its global name, whatever the ep. 3 steps at ep 2
# over dp 2 under ZeRO-1 (bucket by bucket: the experts' apart) resume there to 9 bit for bit (losses and the
# final weights); 3 steps at ep 4 over dp 4 resume at
# ep 2 over dp 4 under ZeRO-3 to 6 (each expert's state in pieces over its 2 replicas, the rest over 4) and on
# one rank to 9, equal to the one-rank run within fp32's 1e-5. That chain routes
# with DeepSeek-V3's expert bias, which the manifest carries from step to step (a resume from a bias of 0
# routes differently), and keeps its first layer's MLP dense (--moe-layer-freq).
MOEB="$MOE --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.02
  --moe-layer-freq ([0]+[1])"
rm -rf "$WORK"/ep*
np 2 --dp 2 --ep 2 --zero 1 $MOE --steps 9 --metrics "$WORK/ep_ref.jsonl" --save "$WORK/ep_ref.safetensors" > "$WORK/ep_ref.txt" 2>&1 ||
  fail "ep 2 reference: $(cat "$WORK/ep_ref.txt")"
np 2 --dp 2 --ep 2 --zero 1 $MOE --steps 3 --ckpt "$WORK/ep" > "$WORK/ep0.txt" 2>&1 || fail "ep 2 first third: $(cat "$WORK/ep0.txt")"
np 2 --dp 2 --ep 2 --zero 1 $MOE --steps 9 --ckpt "$WORK/ep" --resume --metrics "$WORK/ep_res.jsonl" --save "$WORK/ep_res.safetensors" \
  > "$WORK/ep_res.txt" 2>&1 || fail "ep 2 resume: $(cat "$WORK/ep_res.txt")"
exact_losses "$WORK/ep_res.jsonl" "$WORK/ep_ref.jsonl" 6 || fail "ep 2 resumed losses differ"
cmp -s "$WORK/ep_ref.safetensors" "$WORK/ep_res.safetensors" || fail "ep 2 resumed final weights differ"
"$MPIEXEC" --oversubscribe --bind-to none -np 1 -x OMP_NUM_THREADS=1 "$LOOM" train $MODEL $MOE --steps 9 \
  --metrics "$WORK/ep_one.jsonl" > "$WORK/ep_one.txt" 2>&1 || fail "MoE on one rank: $(cat "$WORK/ep_one.txt")"
"$MPIEXEC" --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS=1 "$LOOM" train $(echo "$MODEL" | sed 's/--eval-every 0/--eval-every 3/') \
  --dp 4 --ep 4 $MOEB --steps 3 --ckpt "$WORK/ep4" > "$WORK/ep40.txt" 2>&1 || fail "ep 4 first third: $(cat "$WORK/ep40.txt")"
# The checkpoint as a model (--init-from DIR, as eval and sample load it) routes with its bias: its held-out loss is the run's.
"$LOOM" train --seq 16 --micro-batch 2 --global-batch 8 --init-from "$WORK/ep4" --steps 1 --eval-every 1 > "$WORK/ep4_init.txt" 2>&1 ||
  fail "--init-from a checkpoint: $(cat "$WORK/ep4_init.txt")"
held_out() { grep "^eval  step *$2 " "$1" | sed 's/.*held-out loss \([0-9.]*\).*/\1/'; }
[ -n "$(held_out "$WORK/ep40.txt" 3)" ] && [ "$(held_out "$WORK/ep40.txt" 3)" = "$(held_out "$WORK/ep4_init.txt" 0)" ] ||
  fail "--init-from the checkpoint: held-out loss $(held_out "$WORK/ep4_init.txt" 0), the run's $(held_out "$WORK/ep40.txt" 3)"
np 4 --dp 4 --ep 2 --zero 3 $MOEB --steps 6 --ckpt "$WORK/ep4" --resume --metrics "$WORK/ep42.jsonl" > "$WORK/ep42.txt" 2>&1 ||
  fail "ep 4 resumed at ep 2 under ZeRO-3: $(cat "$WORK/ep42.txt")"
"$MPIEXEC" --oversubscribe --bind-to none -np 1 -x OMP_NUM_THREADS=1 "$LOOM" train $MODEL $MOEB --steps 9 --ckpt "$WORK/ep4" \
  --resume --metrics "$WORK/ep41.jsonl" > "$WORK/ep41.txt" 2>&1 || fail "ep 2 resumed on one rank: $(cat "$WORK/ep41.txt")"
"$MPIEXEC" --oversubscribe --bind-to none -np 1 -x OMP_NUM_THREADS=1 "$LOOM" train $MODEL $MOEB --steps 9 \
  --metrics "$WORK/ep_oneb.jsonl" > "$WORK/ep_oneb.txt" 2>&1 || fail "MoE with expert bias on one rank: $(cat "$WORK/ep_oneb.txt")"
same_losses "$WORK/ep_one.jsonl" "$WORK/ep_ref.jsonl" || fail "ep 2's losses against one rank's"
same_losses "$WORK/ep_oneb.jsonl" "$WORK/ep42.jsonl" || fail "ep 4 resumed at ep 2 under ZeRO-3 (expert bias): losses"
same_losses "$WORK/ep_oneb.jsonl" "$WORK/ep41.jsonl" || fail "ep 2 resumed on one rank (expert bias): losses"
[ "$(losses "$WORK/ep41.jsonl" | wc -l)" = 3 ] || fail "the one-rank resume should train steps 7-9"

# DeepSeek-V3's architecture (multi-head latent attention, group-limited sigmoid routing with its expert bias, one
# MTP module) reshards: tp 2 with SP for 3 steps, resumed on one rank to 6, the losses the one-rank run's.
DSV3="--norm rmsnorm --mlp swiglu --position rope --no-bias --multi-latent-attention --q-lora-rank 16 --kv-lora-rank 8
  --qk-head-dim 8 --qk-pos-emb-head-dim 4 --v-head-dim 8 --num-experts 8 --moe-router-score-function sigmoid
  --moe-router-enable-expert-bias --moe-router-num-groups 2 --moe-router-group-topk 1 --moe-router-topk-scaling-factor 2.5
  --mtp-num-layers 1"
np 2 --tp 2 --sequence-parallel $DSV3 --steps 3 --ckpt "$WORK/mla" > "$WORK/mla0.txt" 2>&1 || fail "MLA on tp 2: $(cat "$WORK/mla0.txt")"
np 1 $DSV3 --steps 6 --ckpt "$WORK/mla" --resume --metrics "$WORK/mla_res.jsonl" > "$WORK/mla1.txt" 2>&1 ||
  fail "MLA resumed on one rank: $(cat "$WORK/mla1.txt")"
np 1 $DSV3 --steps 6 --metrics "$WORK/mla_one.jsonl" > "$WORK/mla2.txt" 2>&1 || fail "MLA on one rank: $(cat "$WORK/mla2.txt")"
same_losses "$WORK/mla_one.jsonl" "$WORK/mla_res.jsonl" || fail "MLA resumed from tp 2 on one rank: losses"
[ "$(losses "$WORK/mla_res.jsonl" | wc -l)" = 3 ] || fail "the MLA resume should train steps 4-6"

# Resharding by --resume: (2,2,1) for 3 steps, (1,1,2) to 6, (4,1,1) to 9.
rm -rf "$WORK/rs"
np 4 --tp 2 --pp 2 --steps 3 --ckpt "$WORK/rs" > /dev/null 2>&1 || fail "reshard: first third"
np 2 --dp 2 --steps 6 --ckpt "$WORK/rs" --resume --metrics "$WORK/rs1.jsonl" > "$WORK/rs1.txt" 2>&1 || fail "resume on (1,1,2): $(cat "$WORK/rs1.txt")"
grep -q "resharding: the checkpoint was written by tp 2 x pp 2 x dp 1" "$WORK/rs1.txt" || fail "no resharding line"
np 4 --tp 4 --steps 9 --ckpt "$WORK/rs" --resume --metrics "$WORK/rs2.jsonl" > "$WORK/rs2.txt" 2>&1 || fail "resume on (4,1,1): $(cat "$WORK/rs2.txt")"
same_losses "$WORK/full.jsonl" "$WORK/rs1.jsonl" || fail "losses after resharding onto (1,1,2)"
same_losses "$WORK/full.jsonl" "$WORK/rs2.jsonl" || fail "losses after resharding onto (4,1,1)"
[ "$(losses "$WORK/rs2.jsonl" | wc -l)" = 3 ] || fail "the resumed runs should train steps 7-9"
# ZeRO-3 on (1,2,2) for 3 steps, ZeRO-1 on (2,1,2) to 6, ZeRO-3 on (1,2,2) again to 9: each element of
# the weights and Adam's moments moves by its global offset between the stages' pieces.
rm -rf "$WORK/z3"
np 4 --pp 2 --dp 2 --zero 3 --steps 3 --ckpt "$WORK/z3" --metrics "$WORK/z30.jsonl" > "$WORK/z30.txt" 2>&1 || fail "ZeRO-3 first third: $(cat "$WORK/z30.txt")"
np 4 --tp 2 --dp 2 --zero 1 --steps 6 --ckpt "$WORK/z3" --resume --metrics "$WORK/z31.jsonl" > "$WORK/z31.txt" 2>&1 ||
  fail "ZeRO-3 resumed under ZeRO-1 on (2,1,2): $(cat "$WORK/z31.txt")"
grep -q "resharding: the checkpoint was written by tp 1 x pp 2 x dp 2 (vpp 1, zero 3)" "$WORK/z31.txt" || fail "no ZeRO-3 resharding line"
np 4 --pp 2 --dp 2 --zero 3 --steps 9 --ckpt "$WORK/z3" --resume --metrics "$WORK/z32.jsonl" > "$WORK/z32.txt" 2>&1 ||
  fail "back onto ZeRO-3: $(cat "$WORK/z32.txt")"
for part in z30 z31 z32; do same_losses "$WORK/full.jsonl" "$WORK/$part.jsonl" || fail "losses of $part (ZeRO-3 -> ZeRO-1 -> ZeRO-3)"; done
[ "$(losses "$WORK/z32.jsonl" | wc -l)" = 3 ] || fail "the last ZeRO-3 run should train steps 7-9"
# bf16 resharded by --resume, (2,2,1) onto (1,2,2) under the distributed optimizer (each replica loads its
# slice of the master weights) and from there onto (1,1,2) without it, against the uninterrupted bf16 run
# on (2,2,1): relative 1e-3, as a bf16 run on another layout keeps (test_pp); and an fp32 checkpoint
# continued in bf16.
rm -rf "$WORK/rb" "$WORK/rf"
np 4 --tp 2 --pp 2 --precision bf16 --steps 9 --metrics "$WORK/bfull.jsonl" > /dev/null 2>&1 || fail "bf16 reference"
np 4 --tp 2 --pp 2 --precision bf16 --steps 3 --ckpt "$WORK/rb" > /dev/null 2>&1 || fail "bf16 reshard: first third"
np 4 --pp 2 --dp 2 --zero 1 --precision bf16 --steps 6 --ckpt "$WORK/rb" --resume --metrics "$WORK/rb0.jsonl" \
  > "$WORK/rb0.txt" 2>&1 || fail "bf16 resume on (1,2,2) with ZeRO-1: $(cat "$WORK/rb0.txt")"
np 2 --dp 2 --precision bf16 --steps 9 --ckpt "$WORK/rb" --resume --metrics "$WORK/rb.jsonl" > "$WORK/rb.txt" 2>&1 ||
  fail "bf16 resume on (1,1,2): $(cat "$WORK/rb.txt")"
same_losses "$WORK/bfull.jsonl" "$WORK/rb0.jsonl" 1e-3 || fail "bf16 losses after resharding onto (1,2,2) with ZeRO-1"
same_losses "$WORK/bfull.jsonl" "$WORK/rb.jsonl" 1e-3 || fail "bf16 losses after resharding from ZeRO-1 onto (1,1,2)"
np 4 --tp 2 --pp 2 --steps 3 --ckpt "$WORK/rf" > /dev/null 2>&1 || fail "fp32 first half"
np 2 --dp 2 --precision bf16 --steps 6 --ckpt "$WORK/rf" --resume --metrics "$WORK/rf.jsonl" > "$WORK/rf.txt" 2>&1 ||
  fail "fp32 checkpoint resumed in bf16: $(cat "$WORK/rf.txt")"
same_losses "$WORK/full.jsonl" "$WORK/rf.jsonl" 1e-2 || fail "an fp32 checkpoint continued in bf16 left fp32's losses"
# Interleaved chunks (pp 2, vpp 2) onto (2,1,2) with ZeRO-1, against that plan's own run.
rm -rf "$WORK/vk"
V="--layers 4 --pp 2 --vpp 2 --schedule interleaved"
"$MPIEXEC" --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 "$LOOM" train $(echo "$MODEL" | sed 's/--layers 2//') $V \
  --steps 3 --ckpt "$WORK/vk" > /dev/null 2>&1 || fail "interleaved first half"
"$MPIEXEC" --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS=1 "$LOOM" train $(echo "$MODEL" | sed 's/--layers 2/--layers 4/') \
  --tp 2 --dp 2 --zero 1 --steps 6 --metrics "$WORK/v0.jsonl" > /dev/null 2>&1 || fail "(2,1,2) reference"
"$MPIEXEC" --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS=1 "$LOOM" train $(echo "$MODEL" | sed 's/--layers 2/--layers 4/') \
  --tp 2 --dp 2 --zero 1 --steps 6 --ckpt "$WORK/vk" --resume --metrics "$WORK/v1.jsonl" > "$WORK/v1.txt" 2>&1 || fail "vpp -> (2,1,2): $(cat "$WORK/v1.txt")"
same_losses "$WORK/v0.jsonl" "$WORK/v1.jsonl" || fail "losses after resharding interleaved chunks"
# ... and by `loom ckpt reshard`, offline: (2,2,1) -> (1,2,2) with ZeRO-1 -> (4,1,1) by a plan file.
rm -rf "$WORK/os" "$WORK/os1" "$WORK/os2"
np 4 --tp 2 --pp 2 --steps 3 --ckpt "$WORK/os" > /dev/null 2>&1 || fail "offline: first third"
"$LOOM" ckpt reshard "$WORK/os" --pp 2 --dp 2 --zero 1 -o "$WORK/os1" > /dev/null || fail "reshard to (1,2,2)"
"$LOOM" plan new --layers 2 --hidden 32 --heads 4 --seq 16 --tp 4 --micro-batch 2 --global-batch 8 -o "$WORK/tp4.txtpb" > /dev/null
"$LOOM" ckpt reshard "$WORK/os1" --plan "$WORK/tp4.txtpb" -o "$WORK/os2" | grep -q "onto tp 4 x pp 1 x dp 1" || fail "reshard by plan"
"$LOOM" ckpt verify "$WORK/os2" | grep -q "ok (4 shards" || fail "the resharded checkpoint does not verify"
np 4 --tp 4 --steps 9 --ckpt "$WORK/os2" --resume --metrics "$WORK/os.jsonl" > "$WORK/os.txt" 2>&1 || fail "resume the resharded: $(cat "$WORK/os.txt")"
same_losses "$WORK/full.jsonl" "$WORK/os.jsonl" || fail "losses after offline resharding"
"$LOOM" ckpt reshard "$WORK/os1" --tp 4 -o "$WORK/os2" > "$WORK/o.txt" 2>&1
[ $? = 2 ] && grep -q "already holds a checkpoint" "$WORK/o.txt" || fail "reshard over a checkpoint: $(cat "$WORK/o.txt")"
# A reshard that fails part way (a shard cut short) leaves no output behind, not an empty OUT/step_N.
cp -r "$WORK/os1" "$WORK/cut"
shard=$(find "$WORK/cut" -name '*.shard' | head -1)
[ -n "$shard" ] || fail "no shard file in $WORK/cut: $(find "$WORK/cut")"
head -c "$(($(wc -c < "$shard") / 2))" "$shard" > "$shard.half" && mv "$shard.half" "$shard"
"$LOOM" ckpt reshard "$WORK/cut" --tp 4 -o "$WORK/cut_out" > "$WORK/o.txt" 2>&1 && fail "a reshard of a cut shard passed"
[ ! -e "$WORK/cut_out" ] || fail "a failed reshard left $(find "$WORK/cut_out")"

# A rank killed (SIGABRT, a test fault) mid-save at step 4, its shard
# written and the manifest not: mpirun ends the job, latest still names step
# 2, and --resume from it finishes with the uninterrupted run's losses.
rm -rf "$WORK/kill"
LOOM_FAULT=kill_in_save:1:4 "$MPIEXEC" --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS=1 \
  -x LOOM_FAULT "$LOOM" train $MODEL --tp 2 --pp 2 --steps 9 --save-every 2 \
  --ckpt "$WORK/kill" > "$WORK/kill.txt" 2>&1 && fail "the killed run exited 0"
[ "$(cat "$WORK/kill/latest")" = step_00000002 ] || fail "latest moved past the last complete checkpoint"
[ -f "$WORK/kill/step_00000004/rank_00001.shard" ] && [ ! -f "$WORK/kill/step_00000004/manifest.pb" ] || fail "not killed mid-save"
np 4 --tp 2 --pp 2 --steps 9 --ckpt "$WORK/kill" --resume --metrics "$WORK/kill.jsonl" > "$WORK/kr.txt" 2>&1 || fail "resume after the kill: $(cat "$WORK/kr.txt")"
exact_losses "$WORK/kill.jsonl" "$WORK/full.jsonl" 7 || fail "losses after the kill differ"

# Asynchronous saves: a run without faults leaves the same checkpoint as a synchronous one (its
# resume gives the uninterrupted losses); a rank killed while copying its shard to host memory,
# halfway through writing it on the writer thread, or with it written and the manifest not, leaves
# latest on step 2 (step 4 never recorded), and --resume finishes with the uninterrupted losses.
rm -rf "$WORK/async"
np 4 --tp 2 --pp 2 --steps 6 --save-every 2 --async-save --ckpt "$WORK/async" > "$WORK/async.txt" 2>&1 || fail "async: $(cat "$WORK/async.txt")"
grep -q "^checkpoint $WORK/async/step_00000006: .* written in the background in .*; the step loop stalled .* ms for it" "$WORK/async.txt" ||
  fail "async save's line: $(cat "$WORK/async.txt")"
"$LOOM" ckpt verify "$WORK/async" | grep -q "ok (4 shards" || fail "verify of an asynchronous checkpoint"
np 4 --tp 2 --pp 2 --steps 9 --ckpt "$WORK/async" --resume --metrics "$WORK/async.jsonl" > "$WORK/ar.txt" 2>&1 || fail "resume async: $(cat "$WORK/ar.txt")"
exact_losses "$WORK/async.jsonl" "$WORK/full.jsonl" 3 || fail "losses after an asynchronous save differ"
for fault in kill_in_stage:1:4 kill_in_write:2:4 kill_in_save:3:4; do
  rm -rf "$WORK/akill"
  LOOM_FAULT=$fault "$MPIEXEC" --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS=1 -x LOOM_FAULT "$LOOM" train $MODEL \
    --tp 2 --pp 2 --steps 9 --save-every 2 --async-save --ckpt "$WORK/akill" > "$WORK/akill.txt" 2>&1 && fail "$fault: the killed run exited 0"
  [ "$(cat "$WORK/akill/latest")" = step_00000002 ] || fail "$fault: latest is $(cat "$WORK/akill/latest"), not the last complete step 2"
  [ ! -f "$WORK/akill/step_00000004/manifest.pb" ] || fail "$fault: step 4 was recorded"
  case $fault in # where each fault left step 4: a shard missing, half written, all written
    kill_in_stage*) [ ! -e "$WORK/akill/step_00000004/rank_00001.shard" ] ;;
    kill_in_write*) [ -f "$WORK/akill/step_00000004/rank_00002.shard.tmp" ] && [ ! -e "$WORK/akill/step_00000004/rank_00002.shard" ] ;;
    kill_in_save*) [ -f "$WORK/akill/step_00000004/rank_00003.shard" ] ;;
  esac || fail "$fault: step 4 holds $(ls "$WORK/akill/step_00000004" | tr '\n' ' ')"
  np 4 --tp 2 --pp 2 --steps 9 --ckpt "$WORK/akill" --resume --async-save --metrics "$WORK/akill.jsonl" > "$WORK/akr.txt" 2>&1 ||
    fail "$fault: resume: $(cat "$WORK/akr.txt")"
  exact_losses "$WORK/akill.jsonl" "$WORK/full.jsonl" 7 || fail "$fault: losses after the kill differ"
done

# --keep 2 leaves the two newest steps (beside latest and the goodput ledger).
rm -rf "$WORK/keep"
np 2 --dp 2 --steps 4 --save-every 1 --keep 2 --ckpt "$WORK/keep" > /dev/null 2>&1 || fail "--keep run"
[ "$(ls "$WORK/keep" | tr '\n' ' ')" = "goodput.jsonl latest step_00000003 step_00000004 " ] || fail "--keep 2 left $(ls "$WORK/keep")"

# Damaged or mismatched checkpoints: refused, the file named, never loaded.
C="$WORK/ck/step_00000009"
"$MPIEXEC" --oversubscribe --bind-to none -np 4 "$LOOM" train $(echo "$MODEL" | sed 's/--layers 2/--layers 3/') --pp 2 --dp 2 \
  --steps 12 --ckpt "$WORK/ck" --resume > "$WORK/r.txt" 2>&1
[ $? = 2 ] && grep -q "checkpoint of another model (layers 2" "$WORK/r.txt" || fail "another model: $(cat "$WORK/r.txt")"
np 4 --pp 2 --dp 2 --steps 12 --seed 7 --ckpt "$WORK/ck" --resume > "$WORK/r.txt" 2>&1
[ $? = 2 ] && grep -q "trained with --seed 1337; resume with the same" "$WORK/r.txt" || fail "another seed: $(cat "$WORK/r.txt")"
"$LOOM" ckpt verify "$WORK/ck" | grep -q "ok (4 shards" || fail "verify of a good checkpoint"
cp "$C/rank_00001.shard" "$WORK/good.shard"
printf '\377' | dd of="$C/rank_00001.shard" bs=1 seek=$(($(wc -c < "$WORK/good.shard") - 2)) conv=notrunc 2> /dev/null
"$LOOM" ckpt verify "$WORK/ck" > "$WORK/v.txt" 2>&1
[ $? = 1 ] && grep -q "rank_00001.shard: tensor .* fails its checksum" "$WORK/v.txt" || fail "verify of a flipped byte: $(cat "$WORK/v.txt")"
np 4 --pp 2 --dp 2 --steps 12 --ckpt "$WORK/ck" --resume > "$WORK/r.txt" 2>&1
[ $? != 0 ] && grep -q "rank_00001.shard: tensor .* fails its checksum .*: the file is corrupt" "$WORK/r.txt" || fail "flipped byte: $(cat "$WORK/r.txt")"
# The first error line is the failing rank's own, whole; the ranks that failed only because it did say nothing.
first=$(grep -m1 "loom: " "$WORK/r.txt")
echo "$first" | grep -q "^\[rank [0-9]*\] loom: .*rank_00001.shard: tensor .* fails its checksum" && ! grep -q "could not load" "$WORK/r.txt" ||
  fail "the first error is not the failing rank's: $(grep "loom: " "$WORK/r.txt")"
head -c 5000 "$WORK/good.shard" > "$C/rank_00001.shard"
np 4 --pp 2 --dp 2 --steps 12 --ckpt "$WORK/ck" --resume > "$WORK/r.txt" 2>&1
[ $? != 0 ] && grep -q "rank_00001.shard: 5000 bytes, the manifest says [0-9]*: the shard is damaged" "$WORK/r.txt" || fail "truncated: $(cat "$WORK/r.txt")"
cp "$WORK/good.shard" "$C/rank_00001.shard"
rm "$C/manifest.pb"
np 4 --pp 2 --dp 2 --steps 12 --ckpt "$WORK/ck" --resume > "$WORK/r.txt" 2>&1
[ $? = 2 ] && grep -q "manifest.pb: missing manifest: the checkpoint is incomplete" "$WORK/r.txt" || fail "missing manifest: $(cat "$WORK/r.txt")"

# SIGTERM, as Slurm sends on preemption: the run checkpoints at the next step
# boundary and exits 0; the checkpoint verifies.
rm -rf "$WORK/sig"
"$LOOM" train --layers 1 --hidden 16 --heads 2 --seq 16 --micro-batch 2 --steps 1000000 --eval-every 0 \
  --ckpt "$WORK/sig" --threads 1 > "$WORK/sig.txt" 2>&1 &
pid=$!
wait_for "$WORK/sig.txt" "^step " 120 # training has begun: the signal lands between steps
kill -TERM $pid
wait $pid
code=$?
[ $code = 0 ] || fail "exit $code after SIGTERM: $(tail -3 "$WORK/sig.txt")"
grep -q "stopped by a signal after step [0-9]*; resume with --resume" "$WORK/sig.txt" || fail "no signal stop: $(tail -3 "$WORK/sig.txt")"
"$LOOM" ckpt verify "$WORK/sig" > /dev/null || fail "the signal checkpoint does not verify"
echo "ok"
