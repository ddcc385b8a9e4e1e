#!/usr/bin/env bash
# Builds, on a machine with nvcc (no GPU needed), everything tools/gpu_check.sh
# runs, and packs it into one archive that gpu_check.sh takes on the GPU machine
# instead of building there (GPU_CHECK_PREBUILT=ARCHIVE):
#
#   bash tools/gpu_bundle.sh [ARCHIVE [CUDA_ARCHS]]
#     ARCHIVE     default build/gpu_bundle.tar.gz
#     CUDA_ARCHS  nvcc's -gencode flags, default "-gencode arch=compute_90,code=sm_90" (H100/H200)
#
# For a GPU machine whose build is slow or whose image lacks the host libraries
# (GoogleTest, OpenBLAS, PCRE2 headers): the usual way on clusters whose login
# nodes compile and whose GPU nodes only run.
#
# The build runs in a temporary copy of the working tree (its uncommitted
# changes included), so the tree's own build outputs stay as they are:
#   - host code for plain x86-64 with AVX2 and FMA (ARCHFLAGS=-march=x86-64-v3),
#     so the CPU programs run on any recent Intel or AMD host;
#   - without MPI (MPICC=false): gpu_check's NCCL stages meet through a shared
#     directory (-pi fs) where the GPU machine has no mpirun;
#   - nvcc -Xptxas -v: registers, spills and shared memory per kernel.
# The archive holds the binaries at the paths make gives them (train_gpt,
# train_gpt_cpu, prepare_data, build/native/*, build/tests/test_cuda_trainer,
# build/bench_attention_cuda), build/gpu_bundle/build.log (the make output, with
# the ptxas lines), build/gpu_bundle/manifest (commit, date, nvcc, CUDA_ARCHS) and
# build/gpu_bundle/lib: the shared libraries the binaries load that a CUDA image
# may lack (OpenBLAS and what it needs, PCRE2, libgomp). The C library, libstdc++
# and the CUDA libraries (cuBLASLt, NCCL) are left to the GPU machine, whose
# versions must be the same or newer.
set -euo pipefail
cd "$(dirname "$0")/.."
archive=${1:-build/gpu_bundle.tar.gz}
archs=${2:-"-gencode arch=compute_90,code=sm_90"}
command -v "${NVCC:-nvcc}" > /dev/null || { echo "gpu_bundle: nvcc not found (install the CUDA toolkit or set NVCC)"; exit 1; }
mkdir -p "$(dirname "$archive")"
archive=$(cd "$(dirname "$archive")" && pwd)/$(basename "$archive")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the working tree as it is: tracked files (less those deleted) and untracked ones git does not ignore
git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
  xargs -0 cp --parents -t "$work"
binaries=(train_gpt train_gpt_cpu prepare_data build/tests/test_cuda_trainer build/bench_attention_cuda)
for t in tests/test_cuda_*.cpp; do
  [ "$t" = tests/test_cuda_trainer.cpp ] || binaries+=("build/native/$(basename "$t" .cpp)")
done
binaries+=(build/native/train_gpt_fp32 build/native/train_gpt_bf16)

echo "gpu_bundle: building ${#binaries[@]} binaries for $archs in $work (log: build/gpu_bundle/build.log)"
mkdir -p "$work/build/gpu_bundle/lib"
start=$(date +%s)
if ! (cd "$work" && make -j"$(nproc)" MPICC=false ARCHFLAGS=-march=x86-64-v3 CUDA_ARCHS="$archs" NVCC_EXTRA="-Xptxas -v" \
        "${binaries[@]}") > "$work/build/gpu_bundle/build.log" 2>&1; then
  grep -E 'error|Error' "$work/build/gpu_bundle/build.log" | head -20
  cp "$work/build/gpu_bundle/build.log" "$archive.failed.log"
  echo "gpu_bundle: the build failed; its log: $archive.failed.log"
  exit 1
fi
echo "gpu_bundle: built in $(( $(date +%s) - start )) s"

# the libraries to carry: what ldd resolves, less the C library, the C++ runtime and CUDA's own
libs=$(cd "$work" && ldd "${binaries[@]}" 2> /dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
       grep -vE '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so' || true)
for lib in $libs; do cp -L "$lib" "$work/build/gpu_bundle/lib/"; done
{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD 2> /dev/null || echo ' (with uncommitted changes)')"
  echo "date $(date -u +%FT%TZ)"
  echo "nvcc $("${NVCC:-nvcc}" --version | grep -oE 'release [0-9.]+' | head -1)"
  echo "CUDA_ARCHS $archs"
  echo "host $(uname -m), ARCHFLAGS=-march=x86-64-v3, no MPI"
  echo "libraries $(cd "$work/build/gpu_bundle/lib" && ls | tr '\n' ' ')"
} > "$work/build/gpu_bundle/manifest"
(cd "$work" && tar -czf "$archive" "${binaries[@]}" build/gpu_bundle)
echo "gpu_bundle: $archive ($(du -h "$archive" | cut -f1)); on the GPU machine:"
echo "  GPU_CHECK_PREBUILT=$archive bash tools/gpu_check.sh OUTDIR [TEXT_FILE]"
