#!/bin/sh
# Text to training through Megatron's indexed datasets, on Debian's license
# texts with a BPE loom trains on them:
# - `loom data tokenizer train` writes a tokenizer that loads in both formats
#   and round-trips the corpus;
# - `loom data prepare` (2 workers, --append-eod) writes an indexed dataset
#   with one document per file, the same as 1 worker's; an existing output is refused without
#   --force; a bad JSON line is refused naming its line, and leaves nothing;
#   empty documents are skipped and counted; a corpus of special tokens and a
#   100 MB one-line document are handled; an llm.c file cannot hold ids past
#   uint16, an indexed dataset then holds int32; a post-processor template
#   is applied (and named) unless --no-add-special-tokens, and one loom does
#   not apply is refused;
# - training on the prefix gives the same losses (relative 1e-5) at tp 2, pp 2
#   and dp 2 as on one rank, and with the batch in other micro-batches: the
#   sample at each global index does not depend on the layout; the model
#   samples text through the tokenizer;
# - a blend of two prefixes trains and logs the counts it drew.
# Usage: tests/data_pipeline.sh MPIEXEC LOOM WORKDIR
set -u
MPIEXEC=$1 LOOM=$2 WORK=$3
. "$(dirname "$0")/lib.sh"
rm -rf "$WORK" && mkdir -p "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
LICENSES=/usr/share/common-licenses
[ -f "$LICENSES/GPL-3" ] || fail "no $LICENSES to train on"
set -- "$LICENSES"/GPL-3 "$LICENSES"/LGPL-2.1 "$LICENSES"/Apache-2.0 "$LICENSES"/Artistic "$LICENSES"/MPL-2.0 "$LICENSES"/GFDL-1.3
CORPUS="$*"

# shellcheck disable=SC2086 # one word per corpus file
"$LOOM" data tokenizer train $CORPUS --vocab-size 1000 -o "$WORK/tok" > "$WORK/train_tok.txt" 2>&1 ||
  fail "tokenizer train: $(cat "$WORK/train_tok.txt")"
grep -q "^trained 1000 tokens (743 merges) on 6 documents" "$WORK/train_tok.txt" || fail "trainer summary: $(cat "$WORK/train_tok.txt")"
mkdir -p "$WORK/gpt2_files" && cp "$WORK/tok/encoder.json" "$WORK/tok/vocab.bpe" "$WORK/gpt2_files/"
cat "$@" > "$WORK/all.txt"
for t in "$WORK/tok/tokenizer.json" "$WORK/gpt2_files"; do
  "$LOOM" data encode --tokenizer "$t" "$WORK/all.txt" > "$WORK/ids.txt" || fail "encode with $t"
  "$LOOM" data decode --tokenizer "$t" "$WORK/ids.txt" > "$WORK/back.txt" || fail "decode with $t"
  cmp -s "$WORK/all.txt" "$WORK/back.txt" || fail "decode(encode(corpus)) differs with $t"
done
[ "$(wc -w < "$WORK/ids.txt")" -lt "$(($(wc -c < "$WORK/all.txt") / 3))" ] || fail "the trained BPE compresses less than 3 bytes a token"

# A post-processor template (Hugging Face's TemplateProcessing), here <|endoftext|> (999) on both
# sides of each text: encode and prepare add it unless --no-add-special-tokens, and prepare names it.
with_post() { # with_post NAME JSON: the trained tokenizer.json with that post-processor, as $WORK/NAME.json
  sed "s/\"post_processor\": {[^}]*}/\"post_processor\": $2/" "$WORK/tok/tokenizer.json" > "$WORK/$1.json"
}
EOT='{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}' A='{"Sequence": {"id": "A", "type_id": 0}}'
SPECIALS='"special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [999], "tokens": ["<|endoftext|>"]}}'
with_post template "{\"type\": \"TemplateProcessing\", \"single\": [$EOT, $A, $EOT], \"pair\": [], $SPECIALS}"
printf 'the licensee' > "$WORK/one.txt"
plain=$("$LOOM" data encode --tokenizer "$WORK/tok/tokenizer.json" "$WORK/one.txt") || fail "encode plain"
[ -n "$plain" ] || fail "encode plain: no ids"
[ "$("$LOOM" data encode --tokenizer "$WORK/template.json" "$WORK/one.txt")" = "999 $plain 999" ] || fail "encode with the template"
[ "$("$LOOM" data encode --tokenizer "$WORK/template.json" --no-add-special-tokens "$WORK/one.txt")" = "$plain" ] ||
  fail "encode with --no-add-special-tokens"
"$LOOM" data prepare "$WORK/one.txt" --output-prefix "$WORK/tpl" --tokenizer "$WORK/template.json" > "$WORK/tpl.txt" 2>&1 ||
  fail "prepare with the template: $(cat "$WORK/tpl.txt")"
grep -q "^tokenizer post-processor adds <|endoftext|> (999) before and <|endoftext|> (999) after each text (add_special_tokens; --no-add-special-tokens leaves it out)$" \
  "$WORK/tpl.txt" || fail "prepare's template line: $(cat "$WORK/tpl.txt")"
grep -q "^prepared 1 documents (0 empty skipped), $(($(echo "$plain" | wc -w) + 2)) tokens" "$WORK/tpl.txt" || fail "templated tokens: $(cat "$WORK/tpl.txt")"
# An exported model's tokenizer must fit its vocab and go into a directory; nothing is written otherwise.
for bad in "gpt-tiny:hf:loom: --tokenizer $WORK/tok: its ids reach 1000, past the model's vocab of 256" \
           "gpt-tiny:llmc:loom ckpt export: --tokenizer goes into a Hugging Face directory; --format llmc writes one file"; do
  model=${bad%%:*} rest=${bad#*:}
  "$LOOM" ckpt export --model "$model" --format "${rest%%:*}" -o "$WORK/exported" --tokenizer "$WORK/tok" > "$WORK/bad.txt" 2>&1
  code=$?
  [ "$code" = 2 ] && [ "$(cat "$WORK/bad.txt")" = "${rest#*:}" ] && [ ! -e "$WORK/exported" ] || fail "export ${rest%%:*}: exit $code, $(cat "$WORK/bad.txt")"
done
"$LOOM" ckpt export --model gpt-tiny --vocab 1000 --format hf -o "$WORK/exported" --tokenizer "$WORK/tok" > "$WORK/exp.txt" 2>&1 ||
  fail "export with a tokenizer: $(cat "$WORK/exp.txt")"
for f in config.json generation_config.json tokenizer.json tokenizer_config.json model.safetensors; do
  [ -s "$WORK/exported/$f" ] || fail "export with a tokenizer wrote no $f"
done
grep -q '"eos_token_id": 999' "$WORK/exported/generation_config.json" || fail "generation config: $(cat "$WORK/exported/generation_config.json")"
# Post-processors loom does not apply, and templates that lie, are refused by name.
with_post bert '{"type": "BertProcessing", "sep": ["x", 1], "cls": ["y", 2]}'
with_post no_a "{\"type\": \"TemplateProcessing\", \"single\": [$EOT], \"pair\": [], $SPECIALS}"
with_post wrong_id "{\"type\": \"TemplateProcessing\", \"single\": [$EOT, $A], \"pair\": [], $(echo "$SPECIALS" | sed 's/\[999\]/[5]/')}"
for bad in "bert:post-processor BertProcessing is not supported (loom applies ByteLevel and TemplateProcessing, alone or in a Sequence)" \
           "no_a:the post-processor's single template must hold the sequence \"A\" once" \
           "wrong_id:the post-processor's special token \"<|endoftext|>\" has an id that is not its token in the vocabulary"; do
  "$LOOM" data prepare "$WORK/one.txt" --output-prefix "$WORK/bad" --tokenizer "$WORK/${bad%%:*}.json" > "$WORK/bad.txt" 2>&1
  code=$?
  [ "$code" = 2 ] && [ "$(cat "$WORK/bad.txt")" = "loom: $WORK/${bad%%:*}.json: ${bad#*:}" ] && [ ! -e "$WORK/bad.idx" ] ||
    fail "post-processor ${bad%%:*}: exit $code, $(cat "$WORK/bad.txt")"
done

# shellcheck disable=SC2086
"$LOOM" data prepare $CORPUS --output-prefix "$WORK/lic" --tokenizer "$WORK/tok" --append-eod --workers 2 > "$WORK/prep.txt" 2>&1 ||
  fail "prepare: $(cat "$WORK/prep.txt")"
grep -q "^prepared 6 documents (0 empty skipped), [0-9]* tokens, .* with 2 workers (tokenizer.json, 1000 tokens)" "$WORK/prep.txt" ||
  fail "prepare summary: $(cat "$WORK/prep.txt")"
[ -f "$WORK/lic.bin" ] && [ -f "$WORK/lic.idx" ] && [ ! -e "$WORK/lic.bin.tmp" ] || fail "prepare outputs"
grep -q "prepare:" "$WORK/prep.txt" && fail "a progress line off a terminal"
# shellcheck disable=SC2086
"$LOOM" data prepare $CORPUS --output-prefix "$WORK/lic1" --tokenizer "$WORK/tok" --append-eod --workers 1 > /dev/null 2>&1 || fail "prepare, 1 worker"
cmp -s "$WORK/lic.bin" "$WORK/lic1.bin" && cmp -s "$WORK/lic.idx" "$WORK/lic1.idx" || fail "1 and 2 workers wrote different datasets"
# On a terminal (script(1) gives loom a pty), a progress status line.
command -v script > /dev/null 2>&1 || fail "script(1) (util-linux) runs loom on a terminal here; it is missing"
script -qec "$LOOM data prepare $CORPUS --output-prefix $WORK/tty --tokenizer $WORK/tok" /dev/null > "$WORK/tty.txt" 2>&1 ||
  fail "prepare on a terminal: $(cat "$WORK/tty.txt")"
grep -q "prepare: 6 documents, [0-9.]* of [0-9.]* MB, [0-9.]* MB/s, ETA 0m00s" "$WORK/tty.txt" ||
  fail "no progress line on a terminal: $(od -c "$WORK/tty.txt" | head -20)"
# shellcheck disable=SC2086
"$LOOM" data prepare $CORPUS --output-prefix "$WORK/lic" --tokenizer "$WORK/tok" > "$WORK/again.txt" 2>&1
rc=$?
[ $rc = 2 ] && [ "$(cat "$WORK/again.txt")" = "loom: --output-prefix $WORK/lic.bin: a file exists there; add --force to replace it" ] ||
  fail "an existing output: exit $rc, $(cat "$WORK/again.txt")"
# A signal mid-prepare leaves no temporary file behind (the handler removes it).
yes "a line of text to prepare, again and again" | head -c 50000000 > "$WORK/big.txt"
"$LOOM" data prepare "$WORK/big.txt" --output-prefix "$WORK/sig" > "$WORK/sig.txt" 2>&1 &
pid=$!
wait_for_file() { _t=600; while [ $_t -gt 0 ] && [ ! -e "$1" ]; do sleep 0.1; _t=$((_t - 1)); done; [ -e "$1" ]; }
wait_for_file "$WORK/sig.bin.tmp" || fail "prepare never started writing $WORK/sig.bin.tmp"
kill -TERM $pid
wait $pid
rc=$?
[ $rc = 143 ] && [ ! -e "$WORK/sig.bin.tmp" ] && [ ! -e "$WORK/sig.bin" ] || fail "after SIGTERM: exit $rc, $(ls "$WORK" | grep sig)"
rm -f "$WORK/big.txt"

printf '{"text": "one"}\n\n{"text": "two"\n{"text": "three"}\n' > "$WORK/bad.jsonl"
"$LOOM" data prepare "$WORK/bad.jsonl" --output-prefix "$WORK/bad" --tokenizer "$WORK/tok" > "$WORK/bad.txt" 2>&1
rc=$?
[ $rc = 2 ] && [ "$(cat "$WORK/bad.txt")" = "loom: $WORK/bad.jsonl:3: bad JSON at byte 14: expected ',' or '}'" ] ||
  fail "a bad JSON line: exit $rc, $(cat "$WORK/bad.txt")"
[ ! -e "$WORK/bad.bin" ] && [ ! -e "$WORK/bad.idx" ] && [ ! -e "$WORK/bad.bin.tmp" ] || fail "a refused corpus left files"
printf '{"id": 1}\n' > "$WORK/nokey.jsonl"
"$LOOM" data prepare "$WORK/nokey.jsonl" --output-prefix "$WORK/bad" > "$WORK/bad.txt" 2>&1
[ "$(cat "$WORK/bad.txt")" = "loom: $WORK/nokey.jsonl:1: no string member \"text\" in this JSON line" ] || fail "no text: $(cat "$WORK/bad.txt")"

printf '{"text": ""}\n{"text": "x"}\n{"text": ""}\n' > "$WORK/empty.jsonl"
"$LOOM" data prepare "$WORK/empty.jsonl" --output-prefix "$WORK/empty" --tokenizer "$WORK/tok" --append-eod > "$WORK/e.txt" 2>&1 ||
  fail "empty documents: $(cat "$WORK/e.txt")"
grep -q "^prepared 1 documents (2 empty skipped), 2 tokens" "$WORK/e.txt" || fail "empty documents: $(cat "$WORK/e.txt")"

printf '{"text": "<|endoftext|>"}\n{"text": "<|endoftext|><|endoftext|>"}\n' > "$WORK/special.jsonl"
"$LOOM" data prepare "$WORK/special.jsonl" --output-prefix "$WORK/special" --tokenizer "$WORK/tok" --allow-special > "$WORK/s.txt" 2>&1 ||
  fail "special tokens: $(cat "$WORK/s.txt")"
grep -q "^prepared 2 documents (0 empty skipped), 3 tokens" "$WORK/s.txt" || fail "special tokens: $(cat "$WORK/s.txt")"
"$LOOM" data prepare "$WORK/special.jsonl" --output-prefix "$WORK/plain" --tokenizer "$WORK/tok" > "$WORK/s.txt" 2>&1 ||
  fail "special tokens as text: $(cat "$WORK/s.txt")"
grep -q "^prepared 2 documents (0 empty skipped), [1-9][0-9] tokens" "$WORK/s.txt" || fail "special tokens as text: $(cat "$WORK/s.txt")"

# One document of 100 MB on one line.
{ printf '{"text": "'; yes "the licensee may copy and distribute verbatim copies of it" | head -c 100000000 | tr '\n' ' '; printf '"}\n'; } > "$WORK/big.jsonl"
"$LOOM" data prepare "$WORK/big.jsonl" --output-prefix "$WORK/big" --tokenizer "$WORK/tok" --workers 2 > "$WORK/big.txt" 2>&1 ||
  fail "a 100 MB document: $(cat "$WORK/big.txt")"
grep -q "^prepared 1 documents (0 empty skipped), [0-9]\{8\} tokens, from 100.0 MB" "$WORK/big.txt" || fail "a 100 MB document: $(cat "$WORK/big.txt")"
rm -f "$WORK/big.jsonl" "$WORK/big.bin"

# Token ids past uint16: an llm.c file is refused, an indexed dataset holds int32 (dtype code 4).
sed 's/"added_tokens": \[{"id": [0-9]*/"added_tokens": [{"id": 70000/' "$WORK/tok/tokenizer.json" > "$WORK/wide.json"
"$LOOM" data prepare "$LICENSES/GPL-3" -o "$WORK/wide.bin" --tokenizer "$WORK/wide.json" > "$WORK/w.txt" 2>&1
[ "$(cat "$WORK/w.txt")" = "loom: $WORK/wide.bin: llm.c token files hold uint16 ids, but the tokenizer has 70001 tokens (write an indexed dataset with --output-prefix)" ] ||
  fail "wide ids into llm.c: $(cat "$WORK/w.txt")"
"$LOOM" data prepare "$LICENSES/GPL-3" --output-prefix "$WORK/wide" --tokenizer "$WORK/wide.json" > "$WORK/w.txt" 2>&1 || fail "wide: $(cat "$WORK/w.txt")"
[ "$(od -An -tu1 -j17 -N1 "$WORK/wide.idx" | tr -d ' ')" = 4 ] || fail "wide ids are not int32 in the index"

# Training: one rank against tp 2, pp 2 and dp 2 on the same prefix.
MODEL="--vocab 1000 --layers 2 --hidden 32 --heads 2 --seq 32 --steps 4 --eval-every 0 --log-every 1"
train() { # train NAME RANKS FLAGS...: the losses of a run, one per line, in $WORK/NAME.loss
  name=$1 np=$2
  shift 2
  # shellcheck disable=SC2086
  "$MPIEXEC" --oversubscribe --bind-to none -np "$np" -x OMP_NUM_THREADS=1 "$LOOM" train --data "${DATA:-$WORK/lic}" $MODEL \
    --metrics "$WORK/$name.jsonl" "$@" > "$WORK/$name.txt" 2>&1 || fail "train $name: $(tail -3 "$WORK/$name.txt")"
  grep -o '"loss": [0-9.e+-]*' "$WORK/$name.jsonl" | cut -d' ' -f2 > "$WORK/$name.loss"
  [ "$(wc -l < "$WORK/$name.loss")" = 4 ] || fail "$name: $(wc -l < "$WORK/$name.loss") losses"
}
same_losses() { # same_losses A B: relative 1e-5, step by step
  paste "$WORK/$1.loss" "$WORK/$2.loss" | awk -v a="$1" -v b="$2" '
    { d = $1 - $2; if (d < 0) d = -d; if (!($1 > 0) || d > 1e-5 * $1) { print a " and " b " differ at step " NR ": " $1 " vs " $2; bad = 1 } }
    END { exit bad }' || fail "losses differ"
}
train serial 1 --micro-batch 4 --micro-batches 2 --save "$WORK/serial.bin"
"$LOOM" sample --init-from "$WORK/serial.bin" --tokenizer "$WORK/tok" --prompt "The licensee" --max-tokens 4 > "$WORK/sample.txt" 2>&1 ||
  fail "sample: $(cat "$WORK/sample.txt")"
grep -q "^The licensee" "$WORK/sample.txt" || fail "sample: $(cat "$WORK/sample.txt")"
"$LOOM" sample --init-from "$WORK/serial.bin" --tokenizer "$WORK/template.json" --prompt "The licensee" --max-tokens 4 \
  > "$WORK/sample.txt" 2>&1 || fail "sample with a template: $(cat "$WORK/sample.txt")"
grep -q "^tokenizer post-processor adds <|endoftext|> (999) before and <|endoftext|> (999) after each text" "$WORK/sample.txt" ||
  fail "sample's template line: $(cat "$WORK/sample.txt")"
"$LOOM" sample --init-from "$WORK/serial.bin" --tokenizer "$WORK/wide.json" --prompt "x" > "$WORK/sample.txt" 2>&1
[ "$(cat "$WORK/sample.txt")" = "loom sample: $WORK/serial.bin has vocab 1000; the --tokenizer tokenizer needs at least 70001" ] ||
  fail "sample with a larger tokenizer: $(cat "$WORK/sample.txt")"
grep -q "^data samples: $WORK/lic: weight 1.0000, 32 of 32 samples (100.00%)" "$WORK/serial.txt" || fail "data line: $(cat "$WORK/serial.txt")"
train split 1 --micro-batch 2 --micro-batches 4
train tp2 2 --tp 2 --micro-batch 4 --micro-batches 2
train pp2 2 --pp 2 --micro-batch 4 --micro-batches 2
train dp2 2 --dp 2 --micro-batch 4 --micro-batches 1
for run in split tp2 pp2 dp2; do same_losses serial $run; done
awk 'NR == 1 { first = $1 } END { exit !($1 < first) }' "$WORK/serial.loss" || fail "the loss did not fall: $(cat "$WORK/serial.loss")"

# A blend of two prefixes, 3:1.
"$LOOM" data prepare "$LICENSES/GPL-2" --output-prefix "$WORK/gpl2" --tokenizer "$WORK/tok" --append-eod > /dev/null 2>&1 || fail "prepare gpl2"
DATA="0.75 $WORK/lic 0.25 $WORK/gpl2" train blend 1 --micro-batch 4 --micro-batches 2
grep -q "^data samples: $WORK/lic: weight 0.7500, 24 of 32 samples (75.00%), .*; $WORK/gpl2: weight 0.2500, 8 of 32 samples (25.00%)" \
  "$WORK/blend.txt" || fail "blend line: $(grep '^data' "$WORK/blend.txt")"
# Weights near DBL_MAX: their sum once overflowed (weight -nan, every sample from the first).
DATA="1e308 $WORK/lic 1e308 $WORK/gpl2" train huge 1 --micro-batch 4 --micro-batches 2
grep -q "^data samples: $WORK/lic: weight 0.5000, 16 of 32 samples (50.00%), .*; $WORK/gpl2: weight 0.5000, 16 of 32 samples (50.00%)" \
  "$WORK/huge.txt" || fail "blend of huge weights: $(grep '^data' "$WORK/huge.txt")"
rm -rf "$WORK"
echo "data pipeline: ok"
