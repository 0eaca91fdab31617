#!/bin/sh
# Writes the harnesses' seed corpora (tests/fuzz/corpus/NAME) with loom
# itself: small plans, one small checkpoint's manifest and shards, an llm.c
# export of its model and a token file; the built-in cluster profiles and a
# calibrated one; an indexed dataset; a trained tokenizer.json and a tiktoken
# rank file. Rerun after a format changes (--only-data: the last two only).
# Usage: tests/fuzz/make_seeds.sh LOOM [--only-data]
set -eu
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
out=$here/corpus
work=$(mktemp -d "${TMPDIR:-/tmp}/loom_seeds.XXXXXX")
trap 'rm -rf "$work"' EXIT
[ "${2:-}" = "--only-data" ] || rm -rf "$out"
mkdir -p "$out/fuzz_plan_text" "$out/fuzz_plan_binary" "$out/fuzz_manifest" "$out/fuzz_shard" "$out/fuzz_llmc" "$out/fuzz_tokens" "$out/fuzz_hf_config" "$out/fuzz_profile" \
  "$out/fuzz_indexed" "$out/fuzz_tokenizer"

# fuzz_indexed: a 4-byte length of the .idx part, the .idx, the .bin.
# fuzz_tokenizer: a format byte (0 tokenizer.json, 1 gpt2 ranks, 2 cl100k_base ranks), the file.
indexed_and_tokenizer_seeds() {
  printf 'The plan is the one source of truth.\nEvery value from outside is range-checked.\n' > "$work/seed.txt"
  "$loom" data tokenizer train "$work/seed.txt" --vocab-size 300 -o "$work/tok" --force >/dev/null
  { printf '\000'; cat "$work/tok/tokenizer.json"; } > "$out/fuzz_tokenizer/tokenizer.json"
  "$loom" data prepare "$work/seed.txt" --output-prefix "$work/ds" --tokenizer "$work/tok" --append-eod --force >/dev/null
  size=$(wc -c < "$work/ds.idx")
  { printf "\\$(printf %03o $((size % 256)))\\$(printf %03o $((size / 256)))\\000\\000"; cat "$work/ds.idx" "$work/ds.bin"; } > "$out/fuzz_indexed/dataset"
  for b in $(seq 0 255); do
    printf "$(printf '\\%03o' "$b")" | base64 | tr -d '\n'
    echo " $b"
  done > "$work/ranks"
  { printf '\001'; cat "$work/ranks"; echo "aGU= 256"; echo "dGhl 257"; } > "$out/fuzz_tokenizer/ranks.tiktoken"
}
if [ "${2:-}" = "--only-data" ]; then
  mkdir -p "$out/fuzz_indexed" "$out/fuzz_tokenizer"
  indexed_and_tokenizer_seeds
  exit 0
fi

small="--layers 2 --hidden 16 --heads 2 --vocab 256 --seq 8"
n=0
for layout in "" "--tp 2 --pp 2 --dp 2 --global-batch 32" "--pp 2 --vpp 2 --schedule interleaved --global-batch 64" \
              "--zero 1 --dp 2 --sequence-parallel --tp 2 --recompute full --global-batch 32" \
              "--norm rmsnorm --mlp swiglu --position rope --no-bias --untied --num-experts 4 --moe-expert-capacity-factor 1.5
               --moe-shared-expert-intermediate-size 16 --moe-aux-loss-coeff 0.01 --dp 2 --ep 2 --global-batch 32"; do
  n=$((n + 1))
  # shellcheck disable=SC2086 # the words of $small and $layout are flags
  "$loom" plan new $small $layout -o "$out/fuzz_plan_text/plan$n.txtpb" >/dev/null
  # shellcheck disable=SC2086
  "$loom" plan new $small $layout -o "$out/fuzz_plan_binary/plan$n.pb" >/dev/null
done

# shellcheck disable=SC2086
"$loom" train $small --micro-batch 2 --steps 1 --ckpt "$work/ckpt" --log-every 0 >/dev/null
cp "$work"/ckpt/step_*/manifest.pb "$out/fuzz_manifest/manifest.pb"
cp "$work"/ckpt/step_*/rank_00000.shard "$out/fuzz_shard/rank_00000.shard"
"$loom" ckpt export "$work/ckpt" --format llmc -o "$out/fuzz_llmc/model.bin" >/dev/null

printf '12+34=46\n5+6=11\nThe plan is the one source of truth.\n' > "$work/text.txt"
"$loom" data prepare "$work/text.txt" -o "$out/fuzz_tokens/tokens.bin" --force >/dev/null
for model in gpt-tiny llama-tiny moe-tiny; do
  "$loom" ckpt export --model $model --format hf -o "$work/$model" >/dev/null
  cp "$work/$model/config.json" "$out/fuzz_hf_config/$model.json"
done
cp "$here"/../../examples/clusters/*.txtpb "$out/fuzz_profile/"
if mpirun --version >/dev/null 2>&1; then
  mpirun -np 2 "$loom" sim calibrate --seconds 0.02 --mem-mb 8 -o "$out/fuzz_profile/calibrated.txtpb" >/dev/null
fi
indexed_and_tokenizer_seeds
echo "make_seeds: wrote $(find "$out" -type f | wc -l) seeds under $out"
