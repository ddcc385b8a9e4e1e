#!/usr/bin/env bash
# Installs the Debian 12 packages knngpt needs, skipping those already present.
#   bash tools/install_deps.sh           build + quick start (compiler, OpenBLAS, OpenMPI, bible-kjv text),
#                                        and compare_attention's JSON library and plots (nlohmann-json, matplotlib)
#   bash tools/install_deps.sh --tests   also what `make test` needs (GoogleTest, python3-torch, xxhsum)
#   bash tools/install_deps.sh --fuzz    also what `make fuzz` needs (clang, its libFuzzer and sanitizer
#                                        runtimes, LLVM's OpenMP); flags combine: --tests --fuzz
set -euo pipefail
packages=(g++ make libopenblas-openmp-dev openmpi-bin libopenmpi-dev bible-kjv nlohmann-json3-dev python3-matplotlib)
for flag in "$@"; do
  case "$flag" in
    --tests) packages+=(libgtest-dev python3-torch python3-numpy xxhash) ;;
    --fuzz) packages+=(clang libclang-rt-14-dev libomp-14-dev) ;;
    *) echo "install_deps: unknown flag '$flag' (--tests, --fuzz)"; exit 1 ;;
  esac
done
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_deps: done"
