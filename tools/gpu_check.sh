#!/usr/bin/env bash
# The one script to run on a machine with an NVIDIA GPU. It finishes in under
# 8 minutes: every stage has a time limit (build 150 s, tests 80 s, training
# 90 s + 2 x 40 s, benchmark 70 s; an H100-class machine should need far less):
#   1. builds train_gpt, the native CUDA tests and the attention benchmark (nvcc);
#   2. runs the CUDA kernel tests natively, and 3 steps of train_gpt against
#      train_gpt_cpu (needs g++, GoogleTest and OpenBLAS; skipped, saying so,
#      where they are missing);
#   3. trains GPT-2 124M shapes (random init, B 16, T 1024) for 20 steps and
#      prints tok/s and MFU; then 3 steps each with knn attention and with
#      sampled gradients, for their tok/s;
#   4. runs the attention kernel benchmark (exact attention forward/backward
#      TFLOP/s, T = 1K..16K, head size 64 and 128);
# and ends with a short summary. Exit status 0 only if every stage that ran passed.
#
#   bash tools/gpu_check.sh [TEXT_FILE]
#
# The text for the training run: TEXT_FILE, else $KNNGPT_TEXT, else 4 MB of
# generated text (the run measures speed; its tokens are byte-level, trained
# with the GPT-2 vocabulary of 50257 so the shapes are GPT-2's).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=build/gpu_check
mkdir -p "$out"
jobs=$(nproc)
summary=()
status=0
note() { summary+=("$1"); }
fail() { summary+=("FAIL: $1"); status=1; }
stage() { echo; echo "==== $1 ($(date +%T))"; }

stage "device"
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "gpu_check: no NVIDIA GPU found (nvidia-smi lists none): nothing to check here"
  exit 2
fi
if ! command -v "${NVCC:-nvcc}" >/dev/null; then
  echo "gpu_check: nvcc not found: install the CUDA toolkit or set NVCC"
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
"${NVCC:-nvcc}" --version | tail -2
note "device: $gpu"

# Only the GPU's own architecture: halves the nvcc time of the default two.
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
archs=${CUDA_ARCHS:-"-gencode arch=compute_${cc:-90},code=sm_${cc:-90}"}

stage "build (nvcc, $archs)"
have_host_deps=1
if [ ! -f /usr/include/gtest/gtest.h ] || [ -z "$(ls /usr/include/*/cblas.h /usr/include/cblas.h 2>/dev/null)" ] ||
   ! command -v g++ >/dev/null; then
  have_host_deps=0
  echo "gpu_check: g++, GoogleTest or OpenBLAS headers missing (bash tools/install_deps.sh --tests installs them):"
  echo "           the native tests and the comparison with train_gpt_cpu are skipped"
fi
targets="train_gpt build/bench_attention_cuda"
[ $have_host_deps = 1 ] && targets="$targets native-test-bins train_gpt_cpu prepare_data build/tests/test_cuda_trainer"
t0=$(date +%s)
if timeout 150 make -j"$jobs" CUDA_ARCHS="$archs" $targets > "$out/build.log" 2>&1; then
  note "build: ok in $(( $(date +%s) - t0 )) s"
else
  tail -30 "$out/build.log"
  fail "build (see $out/build.log)"
  printf '%s\n' "" "==== summary" "${summary[@]}"
  exit 1
fi

if [ $have_host_deps = 1 ]; then
  stage "native CUDA tests"
  if timeout 80 make --no-print-directory CUDA_ARCHS="$archs" test-native > "$out/tests.log" 2>&1; then
    note "native tests: $(grep -E '^[0-9]+ passed' "$out/tests.log" | tr '\n' ';' | sed 's/;$//')"
  else
    fail "native tests (see $out/tests.log)"
  fi
  grep -E '^cuda kernels run natively: [0-9]+ distinct|^[0-9]+ passed|FAILED|!!' "$out/tests.log"
  k=$(grep -E '^cuda kernels run natively: [0-9]+ distinct' "$out/tests.log" | head -1)
  [ -n "$k" ] && note "$k"
else
  note "native tests: skipped (host build dependencies missing)"
fi

stage "GPT-2 124M shapes, random init, B 16, T 1024, 20 steps"
text="${1:-${KNNGPT_TEXT:-}}"
if [ -z "$text" ]; then
  text="$out/generated.txt"
  head -c 3000000 /dev/urandom | base64 -w 100 > "$text"
fi
if [ ! -x ./prepare_data ]; then
  g++ -O2 -std=c++17 -I. -o prepare_data data/prepare_data.cpp >> "$out/build.log" 2>&1
fi
./prepare_data --input "$text" --out-dir "$out" --name text > /dev/null
# train_run NAME LIMIT_S STEPS FLAGS...: GPT-2 124M shapes for STEPS steps; notes
# the median step time (steps 2..) with its tok/s and the run's mean MFU
train_run() {
  local name=$1 limit=$2 steps=$3; shift 3
  local log="$out/train_$name.log"
  if timeout "$limit" ${launch:-} ./train_gpt -i "$out/text_train.bin" -j "$out/text_val.bin" \
       --layers 12 --heads 12 --channels 768 --max-seq-len 1024 --vocab 50257 \
       -b 16 -t 1024 -x "$steps" -l 6e-4 -u 5 -v 0 -m 2 -s 0 -g 16 "$@" > "$log" 2>&1; then
    grep -E '^\| (backend|parameters|attention)|^step|^done' "$log"
    local med toks mfu
    med=$(grep -oE '\| [0-9.]+ ms \|' "$log" | awk 'NR > 1 { print $2 }' | sort -g |
          awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }')
    mfu=$(grep '^done' "$log" | grep -oE 'mfu [0-9.]+%' || true)
    toks=$(awk -v ms="$med" 'BEGIN { if (ms > 0) printf "%.0f", 16 * 1024 / (ms / 1000) }')
    note "gpt2-124M B16 T1024 $name: median ${med} ms/step, ${toks} tok/s${mfu:+, mean $mfu of the peak}"
  else
    tail -20 "$log"
    fail "training run $name (see $log)"
  fi
}
train_run exact 90 20
note "  (target for later work: 475K tok/s on one H100-class GPU)"

stage "GPT-2 124M shapes, 3 steps each: knn k 16 (brute top-k) and exact attention with sampled gradients"
train_run "knn-k16" 40 3 --attn knn --attn-k 16
train_run "sampled-s16" 40 3 --attn-grad sampled --attn-grad-samples 16

stage "NCCL: data parallel on one GPU (world 1), then on every GPU of the machine (ZeRO-1)"
if command -v mpirun > /dev/null; then
  [ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  launch="mpirun -q --timeout 60 -np 1" train_run "nccl-world1" 70 5 -z 1
  gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true)
  if [ "${gpus:-0}" -gt 1 ]; then
    launch="mpirun -q --timeout 90 -np $gpus" train_run "nccl-world$gpus" 100 5 -z 1 -d $((16 * 1024 * gpus))
  else
    note "NCCL on several GPUs: SKIP (one GPU here)"
  fi
else
  note "NCCL stage: SKIP (no mpirun: apt-get install openmpi-bin libopenmpi-dev)"
fi

stage "attention benchmark"
if timeout 70 build/bench_attention_cuda > "$out/bench.log" 2>&1; then
  cat "$out/bench.log"
  grep -q 'skipped' "$out/bench.log" && fail "attention benchmark: $(grep skipped "$out/bench.log")"
  while read -r line; do note "$line"; done < <(grep -E '^attention ' "$out/bench.log" |
    sed -E 's/^attention (T=[0-9]+ HS=[0-9]+).*fwd_TFLOPs=([0-9.]+).*bwd_TFLOPs=([0-9.]+).*/attention \1: fwd \2 TFLOP\/s, bwd \3 TFLOP\/s/')
else
  tail -20 "$out/bench.log"
  fail "attention benchmark (see $out/bench.log)"
fi

echo
echo "==== summary"
printf '%s\n' "${summary[@]}"
[ $status = 0 ] && echo "gpu_check: passed" || echo "gpu_check: FAILED"
exit $status
