#!/usr/bin/env bash
# The one script to run on a machine with an NVIDIA GPU:
#
#   bash tools/gpu_check.sh [OUTDIR [TEXT_FILE]]        (OUTDIR: default build/gpu_check)
#
# It runs these stages in order, each with its own time limit, each whatever
# failed before it (a stage whose program is missing says SKIP and why). The
# figures come first and the sanitizers, the slowest, last:
#   device          the GPU, its driver and nvcc
#   build-trainer   make train_gpt and the attention benchmark (nvcc, the GPU's own architecture only,
#                   -Xptxas -v: registers and spills per kernel in OUTDIR/ptxas.txt)
#   build-tests     make -k the native CUDA tests, both precisions of train_gpt, train_gpt_cpu,
#                   prepare_data, test_cuda_trainer (g++, GoogleTest, OpenBLAS): what builds is run
#   native-tests    the native CUDA tests that built, and the two trainers against train_gpt_cpu
#   train-exact     GPT-2 124M shapes (random init, B 16, T 1024), 20 steps: median ms/step, tok/s, MFU
#   train-knn       the same, 6 steps, --attn knn --attn-k 32 (brute top-k)
#   train-sampled   the same, 6 steps, --attn-grad sampled --attn-grad-samples 16 (exact-row samples)
#   train-knn-sampled  the same, 4 steps, --attn knn --attn-k 32 --attn-grad sampled (lazy-Gumbel samples)
#   profile-exact   train-exact's run for 4 steps with KNNGPT_KERNEL_TIMES=1: GPU time per kernel
#   profile-knn     (and per GEMM shape) of the whole run, kernels/cuda/kernel_times.h; then train-knn's
#   bench-attention tools/bench_attention_cuda.cu: each kernel checked against the reference
#                   kernels at T = 1024 (max abs error), then exact attention TFLOP/s, then the
#                   top-k search, kNN forward and sampled backwards against exact attention
#   nccl-world1     data parallel through NCCL, one process (ZeRO-1), 5 steps; the processes
#   nccl-worldN     meet through a shared directory (-pi fs), so no mpirun is needed; then the
#                   same on every GPU of the machine (SKIP with one GPU)
#   racecheck       compute-sanitizer --tool racecheck   on the attention (tensor-core and fp32),
#   synccheck       compute-sanitizer --tool synccheck   top-k, sampled-gradient and layer tests
#   build-here      with GPU_CHECK_PREBUILT only: the build from source on this machine, run in
#                   the background from the start (a copy of the tree), to say whether it works
#
# Prebuilt. GPU_CHECK_PREBUILT=ARCHIVE (made by tools/gpu_bundle.sh on any machine
# with nvcc) unpacks its binaries in place of the two build stages, adds its
# libraries to LD_LIBRARY_PATH, and takes the ptxas figures from its build log.
# Whichever way the binaries came, a library they load that the loader does not
# find (CUDA's cuBLASLt or NCCL installed outside its path, in a Python package
# say) is looked for under /usr/local, /opt and /usr/lib and its folder added to
# LD_LIBRARY_PATH (OUTDIR/libraries.txt says what was found where).
# A GPU stage that fails (not by its time limit) runs once more with
# CUDA_LAUNCH_BLOCKING=1, where a CUDA error names the kernel that caused it
# (kernels/cuda/common.cuh); its first CUDA error line goes to the summary.
#
# Time. Every stage's limit is its own (below) or less: the whole run keeps to
# GPU_CHECK_BUDGET_S seconds (default 470, under 8 minutes), and a stage never
# takes the last 15 s each of the stages after it would need to start. On an
# H200 with everything passing the stages are meant to take under 5 minutes
# (the builds most of it; not yet measured).
#
# Output. Each stage writes OUTDIR/<stage>.log (a rerun <stage>_blocking.log).
# The summary, one line per stage ("PASS|FAIL|SKIP  stage  figure"), is
# rewritten to OUTDIR/summary.txt after every stage and printed at the end,
# also when a stage fails or the script is interrupted (Ctrl-C, SIGTERM: the
# running stage is stopped, the stages not reached are listed as SKIP).
# Exit status 0 only if no stage failed.
#
# Environment:
#   GPU_CHECK_BUDGET_S   the time budget of the whole run, seconds (default 470)
#   GPU_CHECK_PREBUILT   an archive of tools/gpu_bundle.sh to run instead of building (above)
#   GPU_CHECK_MAKE_ARGS  extra make arguments for both builds, e.g. BLAS_DIR=/usr/lib64 on a
#                        non-Debian layout (word-split)
#   CUDA_ARCHS           nvcc's -gencode flags (default: the GPU's compute capability)
#   NVCC, KNNGPT_TEXT    nvcc; the text for the training runs (else TEXT_FILE, else 4 MB of
#                        generated text: the runs measure speed; byte-level tokens, trained with
#                        the GPT-2 vocabulary of 50257 so the shapes are GPT-2's)
set -uo pipefail
case "${1:-}" in
  -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
out=${1:-build/gpu_check}
text=${2:-${KNNGPT_TEXT:-}}
prebuilt=${GPU_CHECK_PREBUILT:-}
if [ -n "$prebuilt" ]; then
  [ -r "$prebuilt" ] || { echo "gpu_check: cannot read GPU_CHECK_PREBUILT=$prebuilt"; exit 2; }
  prebuilt=$(cd "$(dirname "$prebuilt")" && pwd)/$(basename "$prebuilt")
fi
mkdir -p "$out" || { echo "gpu_check: cannot create $out"; exit 2; }
out=$(cd "$out" && pwd)
# a reused OUTDIR: the last run's logs would pass for this run's
rm -f "$out"/*.log "$out"/summary.txt "$out"/ptxas.txt "$out"/libraries.txt "$out"/manifest.txt
if [ -n "$text" ]; then
  [ -r "$text" ] || { echo "gpu_check: cannot read the text file $text"; exit 2; }
  text=$(cd "$(dirname "$text")" && pwd)/$(basename "$text")
fi
cd "$(dirname "$0")/.." || exit 2

budget=${GPU_CHECK_BUDGET_S:-470}
case "$budget" in '' | *[!0-9]*) echo "gpu_check: GPU_CHECK_BUDGET_S must be a whole number of seconds"; exit 2 ;; esac
started=$(date +%s)
deadline=$((started + budget))
jobs=$(nproc)
make_args=(${GPU_CHECK_MAKE_ARGS:-})
stages=(device build-trainer build-tests native-tests train-exact train-knn train-sampled train-knn-sampled
        profile-exact profile-knn
        bench-attention
        nccl-world1 nccl-worldN racecheck synccheck)
[ -n "$prebuilt" ] && stages+=(build-here)
declare -A result=()   # stage -> its summary line
details=()             # lines printed under the summary (the benchmark's figures)
failed=0
child=""               # the running stage's timeout process

write_summary() {
  local s
  {
    for s in "${stages[@]}"; do
      if [ -n "${result[$s]:-}" ]; then echo "${result[$s]}"; else printf '%-4s  %-15s %s\n' SKIP "$s" "${1:-not reached}"; fi
    done
    printf '%s\n' "${details[@]}"
    echo "total $(( $(date +%s) - started )) s of the ${budget} s budget"
  } > "$out/summary.txt"
}
# record STATUS STAGE FIGURE
record() {
  result[$2]=$(printf '%-4s  %-15s %s' "$1" "$2" "$(echo "$3" | tr '\n' ' ' | sed 's/ *$//')")
  [ "$1" = FAIL ] && failed=1
  write_summary
}
# stop_build_here: the background build from source (prebuilt mode), if still running
stop_build_here() {
  if [ -n "${here_pid:-}" ] && kill -0 "$here_pid" 2> /dev/null; then
    pkill -TERM -P "$here_pid" 2> /dev/null; kill -TERM "$here_pid" 2> /dev/null
  fi
  [ -n "${here_dir:-}" ] && rm -rf "$here_dir"
}
finish() {
  local rc=$?
  trap - EXIT INT TERM
  stop_build_here
  write_summary "${interrupted:+not reached (interrupted)}"
  echo
  echo "==== summary ($out/summary.txt)"
  cat "$out/summary.txt"
  if [ $failed = 0 ] && [ -z "${interrupted:-}" ]; then echo "gpu_check: passed"; else echo "gpu_check: FAILED"; fi
  [ -n "${interrupted:-}" ] && exit 130
  [ $rc -ne 0 ] && exit $rc
  exit $failed
}
interrupt() {
  interrupted=1
  echo "gpu_check: interrupted; stopping the running stage"
  if [ -n "$child" ]; then kill -TERM "$child" 2> /dev/null; wait "$child" 2> /dev/null; fi
  exit 130
}
trap finish EXIT
trap interrupt INT TERM
banner() { echo; echo "==== $1 ($(date +%T))"; }

# limit_for OWN_LIMIT STAGE: OWN_LIMIT, or less so that the stages after STAGE
# keep 15 s each within the budget; 0 when nothing is left.
limit_for() {
  local own=$1 stage=$2 after=0 seen=0 s
  for s in "${stages[@]}"; do
    [ $seen = 1 ] && after=$((after + 1))
    [ "$s" = "$stage" ] && seen=1
  done
  local left=$((deadline - $(date +%s) - 15 * after))
  [ $left -lt 0 ] && left=0
  echo $(( own < left ? own : left ))
}
# run_limited LIMIT LOG CMD...: CMD with its output in LOG, stopped after LIMIT
# seconds (then status 124, or 137 if it had to be killed). In the background
# with wait, so that a Ctrl-C reaches the trap at once.
run_limited() {
  local limit=$1 log=$2; shift 2
  timeout -k 10 "$limit" "$@" > "$log" 2>&1 &
  child=$!
  wait "$child"
  local rc=$?
  child=""
  return $rc
}
# gpu_stage STAGE OWN_LIMIT FIGURE_FUNCTION CMD...: runs CMD as STAGE (log
# OUTDIR/STAGE.log); passes if it exits 0, and the figure is what
# FIGURE_FUNCTION LOG prints. A failure not by the time limit runs again once
# with CUDA_LAUNCH_BLOCKING=1 (log STAGE_blocking.log) for the failing kernel.
gpu_stage() {
  local stage=$1 own=$2 figure=$3; shift 3
  local log="$out/$stage.log" limit rc
  banner "$stage: $*"
  limit=$(limit_for "$own" "$stage")
  if [ "$limit" -lt 5 ]; then record SKIP "$stage" "(the time budget is spent)"; return 1; fi
  run_limited "$limit" "$log" "$@"
  rc=$?
  tail -15 "$log"
  if [ $rc = 0 ]; then record PASS "$stage" "$($figure "$log")"; return 0; fi
  local why="exit status $rc"
  [ $rc = 124 ] || [ $rc = 137 ] && why="stopped at its time limit of $limit s"
  local error
  error=$(grep -m1 -E 'CUDA error|cuBLAS error|NCCL error|FAILED|!!' "$log")
  local note="$why${error:+: $error}; $($figure "$log")"
  if [ $rc != 124 ] && [ $rc != 137 ]; then
    limit=$(limit_for "$own" "$stage")
    if [ "$limit" -ge 5 ]; then
      echo "---- $stage again with CUDA_LAUNCH_BLOCKING=1"
      CUDA_LAUNCH_BLOCKING=1 run_limited "$limit" "$out/${stage}_blocking.log" "$@"
      rc=$?
      error=$(grep -m1 -E 'CUDA error|cuBLAS error|NCCL error|FAILED|!!' "$out/${stage}_blocking.log")
      note="$note; rerun with CUDA_LAUNCH_BLOCKING=1: exit status $rc${error:+: $error}"
    fi
  fi
  record FAIL "$stage" "$note (see $log)"
  return 1
}
nothing() { :; }

# ---- device
banner device
if ! nvidia-smi -L 2> /dev/null | grep -q '^GPU'; then
  record FAIL device "no NVIDIA GPU found (nvidia-smi lists none): nothing to check here"
  exit 2
fi
if [ -z "$prebuilt" ] && ! command -v "${NVCC:-nvcc}" > /dev/null; then
  record FAIL device "nvcc not found: install the CUDA toolkit or set NVCC (or GPU_CHECK_PREBUILT)"
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvcc_version=$("${NVCC:-nvcc}" --version 2> /dev/null | grep -oE 'release [0-9.]+' | head -1)
# Only the GPU's own architecture: halves the nvcc time of the default two.
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null | head -1 | tr -d '.')
archs=${CUDA_ARCHS:-"-gencode arch=compute_${cc:-90},code=sm_${cc:-90}"}
record PASS device "$gpu, nvcc ${nvcc_version:-?}, $archs"

# ---- builds: the trainer and the benchmark first, the host-dependent tests after (make -k)
built() { [ -x "$1" ]; }
trainer_bins=(train_gpt build/bench_attention_cuda)
host_targets="native-test-bins train_gpt_cpu prepare_data build/tests/test_cuda_trainer"
host_bins=(build/native/train_gpt_fp32 build/native/train_gpt_bf16 train_gpt_cpu prepare_data build/tests/test_cuda_trainer)
for t in tests/test_cuda_*.cpp; do
  [ "$t" = tests/test_cuda_trainer.cpp ] || host_bins+=("build/native/$(basename "$t" .cpp)")
done
# resolve_libraries BIN...: for each library the loader does not find for BIN..., a
# folder under /usr/local, /opt or /usr/lib that holds it goes on LD_LIBRARY_PATH.
# Prints what it found and what it did not (also to OUTDIR/libraries.txt).
resolve_libraries() {
  local lib dir missing
  missing=$(ldd "$@" 2> /dev/null | awk '$2 == "=>" && $3 == "not" { print $1 }' | sort -u)
  # (no pipe after the loop: it would run in a subshell and lose the export)
  for lib in $missing; do
    dir=$(timeout 30 find /usr/local /opt /usr/lib /usr/lib64 -name "$lib" \( -type f -o -type l \) 2> /dev/null |
          head -1 | xargs -r dirname)
    if [ -n "$dir" ]; then
      export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      echo "found $lib in $dir" | tee -a "$out/libraries.txt"
    else
      echo "not found: $lib" | tee -a "$out/libraries.txt"
    fi
  done
}
# unresolved BIN...: the libraries still missing, space-separated
unresolved() { ldd "$@" 2> /dev/null | awk '$2 == "=>" && $3 == "not" { print $1 }' | sort -u | tr '\n' ' '; }
: > "$out/libraries.txt"

if [ -n "$prebuilt" ]; then
  banner "build-trainer (prebuilt: $prebuilt)"
  if tar -xzf "$prebuilt" > "$out/build-trainer.log" 2>&1; then
    export LD_LIBRARY_PATH="$PWD/build/gpu_bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    cp build/gpu_bundle/build.log "$out/build-trainer.log"
    cat build/gpu_bundle/manifest
    cp build/gpu_bundle/manifest "$out/manifest.txt"
  fi
else
  banner "build-trainer (nvcc, $archs)"
  t0=$(date +%s)
  limit=$(limit_for 200 build-trainer)
  # -Xptxas -v: registers, spills and shared memory of every kernel, into OUTDIR/ptxas.txt
  run_limited "$limit" "$out/build-trainer.log" make -j"$jobs" "${make_args[@]}" CUDA_ARCHS="$archs" \
    NVCC_EXTRA="-Xptxas -v" "${trainer_bins[@]}"
  rc=$?
  tail -5 "$out/build-trainer.log"
fi
tools/ptxas_summary.sh "$out/build-trainer.log" > "$out/ptxas.txt" 2>&1 || true
ptxas_line=$(tools/ptxas_summary.sh -q "$out/build-trainer.log" 2>/dev/null || echo "no ptxas summary")
head -12 "$out/ptxas.txt"
missing=""
for p in "${trainer_bins[@]}"; do built "$p" || missing="$missing $p"; done
built train_gpt && resolve_libraries "${trainer_bins[@]}"
libs_missing=$(built train_gpt && unresolved "${trainer_bins[@]}")
if [ -n "$prebuilt" ]; then
  if [ -z "$missing" ] && [ -z "$libs_missing" ]; then
    record PASS build-trainer "prebuilt ($(head -1 build/gpu_bundle/manifest)); $ptxas_line (ptxas.txt)"
  else
    record FAIL build-trainer "prebuilt archive${missing:+: not in it:$missing}${libs_missing:+; libraries not found: $libs_missing}"
  fi
elif [ $rc = 0 ] && [ -z "$libs_missing" ]; then
  record PASS build-trainer "train_gpt, bench_attention_cuda in $(( $(date +%s) - t0 )) s; $ptxas_line (ptxas.txt)"
else
  record FAIL build-trainer "exit status $rc$([ $rc = 124 ] && echo " (time limit $limit s)")${missing:+; not built:$missing}${libs_missing:+; libraries not found: $libs_missing} (see $out/build-trainer.log)"
fi

banner "build-tests"
if [ -n "$prebuilt" ]; then
  missing=""
  for p in "${host_bins[@]}"; do built "$p" || missing="$missing $p"; done
  present=(); for p in "${host_bins[@]}"; do built "$p" && present+=("$p"); done
  [ ${#present[@]} -gt 0 ] && resolve_libraries "${present[@]}"
  libs_missing=$([ ${#present[@]} -gt 0 ] && unresolved "${present[@]}")
  if [ -z "$missing" ] && [ -z "$libs_missing" ]; then
    record PASS build-tests "prebuilt: ${#host_bins[@]} test binaries and programs"
  else
    record FAIL build-tests "prebuilt archive${missing:+: not in it:$missing}${libs_missing:+; libraries not found: $libs_missing}"
  fi
elif [ ! -f /usr/include/gtest/gtest.h ] || [ -z "$(ls /usr/include/*/cblas.h /usr/include/cblas.h 2> /dev/null)" ] ||
   ! command -v g++ > /dev/null; then
  record SKIP build-tests "g++, GoogleTest or OpenBLAS headers missing (bash tools/install_deps.sh --tests installs them)"
else
  t0=$(date +%s)
  limit=$(limit_for 150 build-tests)
  run_limited "$limit" "$out/build-tests.log" make -k -j"$jobs" "${make_args[@]}" CUDA_ARCHS="$archs" $host_targets
  rc=$?
  # the targets make gave up on, by name
  broken=$(grep -oE '\*\*\* \[[^]]*: [^]]+\] Error' "$out/build-tests.log" | sed -E 's/.*: ([^]]+)\] Error/\1/' |
           sort -u | tr '\n' ' ')
  grep -E 'error|Error' "$out/build-tests.log" | head -10
  present=(); for p in "${host_bins[@]}"; do built "$p" && present+=("$p"); done
  [ ${#present[@]} -gt 0 ] && resolve_libraries "${present[@]}"
  if [ $rc = 0 ]; then
    record PASS build-tests "in $(( $(date +%s) - t0 )) s"
  else
    record FAIL build-tests "exit status $rc$([ $rc = 124 ] && echo " (time limit $limit s)")${broken:+; failed: $broken}(see $out/build-tests.log)"
  fi
fi

# ---- build-here (prebuilt only): the build from source, in the background, in a copy of the tree
here_pid=""
if [ -n "$prebuilt" ] && command -v "${NVCC:-nvcc}" > /dev/null; then
  here_dir=$(mktemp -d)
  tar --exclude=./build --exclude=./.git --exclude=./train_gpt --exclude=./train_gpt_cpu --exclude=./prepare_data \
    -cf - . | tar -xf - -C "$here_dir"
  here_started=$(date +%s)
  (cd "$here_dir" && nice -n 19 make -k -j"$(( jobs > 8 ? jobs / 2 : 2 ))" "${make_args[@]}" CUDA_ARCHS="$archs" \
     "${trainer_bins[@]}" $host_targets) > "$out/build-here.log" 2>&1 &
  here_pid=$!
fi

# ---- native tests: whatever built
tests_figure() { grep -E '^[0-9]+ passed' "$1" | tail -1; grep -E '^cuda kernels run natively: [0-9]+ distinct' "$1" |
                 head -1 | sed -E 's/ \(never run:.*//' | sed 's/^/; /'; }
native_bins=()
for t in tests/test_cuda_*.cpp; do
  b=build/native/$(basename "$t" .cpp)
  [ "$b" != build/native/test_cuda_trainer ] && built "$b" && native_bins+=("$b")
done
trainer_test=()
if built build/tests/test_cuda_trainer && built build/native/train_gpt_fp32 && built build/native/train_gpt_bf16 &&
   built train_gpt_cpu && built prepare_data; then
  trainer_test=(build/tests/test_cuda_trainer)
fi
if [ ${#native_bins[@]} = 0 ] && [ ${#trainer_test[@]} = 0 ]; then
  record SKIP native-tests "no native test binary built"
else
  # every test skipped (the fixture found no usable device) is a failure here
  if gpu_stage native-tests 90 tests_figure env KNNGPT_BUILD=build KNNGPT_CUDA_TRAINER=build/native/train_gpt_fp32 \
       KNNGPT_CUDA_TRAINER_BF16=build/native/train_gpt_bf16 sh tools/run_tests.sh "${native_bins[@]}" "${trainer_test[@]}" &&
     grep -qE '^0 passed, 0 failed, [1-9]' "$out/native-tests.log"; then
    record FAIL native-tests "every test skipped: $(grep -m1 -iE 'skip.*(device|gpu)|no cuda' "$out/native-tests.log")"
  fi
fi

# ---- training at GPT-2 124M shapes
if [ -z "$text" ]; then
  text="$out/generated.txt"
  [ -s "$text" ] || head -c 3000000 /dev/urandom | base64 -w 100 > "$text"
fi
if ! built ./prepare_data; then
  g++ -O2 -std=c++17 -I. -o "$out/prepare_data" data/prepare_data.cpp > "$out/prepare_data.log" 2>&1
fi
prepare=./prepare_data; built "$prepare" || prepare=$out/prepare_data
have_data=0
if built "$prepare" && "$prepare" --input "$text" --out-dir "$out" --name text > "$out/prepare_data.log" 2>&1; then
  have_data=1
fi
# train_figure LOG: the median step time (steps 2..) with its tok/s, and the run's mean MFU
train_figure() {
  local med mfu toks
  med=$(grep -oE '\| [0-9.]+ ms \|' "$1" | awk 'NR > 1 { print $2 }' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }')
  [ -n "$med" ] || { echo "no step timed"; return; }
  mfu=$(grep '^done' "$1" | grep -oE 'mfu [0-9.]+%' || true)
  toks=$(awk -v ms="$med" 'BEGIN { if (ms > 0) printf "%.0f", 16 * 1024 / (ms / 1000) }')
  echo "median $med ms/step, $toks tok/s${mfu:+, mean $mfu of the peak}"
}
# train_stage STAGE OWN_LIMIT STEPS [LAUNCHER...] -- FLAGS...
train_stage() {
  local stage=$1 own=$2 steps=$3; shift 3
  local launcher=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do launcher+=("$1"); shift; done
  shift
  if ! built ./train_gpt; then record SKIP "$stage" "train_gpt not built"; return; fi
  if [ $have_data = 0 ]; then record SKIP "$stage" "no token data (see $out/prepare_data.log)"; return; fi
  gpu_stage "$stage" "$own" "${TRAIN_FIGURE:-train_figure}" "${launcher[@]}" ./train_gpt -i "$out/text_train.bin" -j "$out/text_val.bin" \
    --layers 12 --heads 12 --channels 768 --max-seq-len 1024 --vocab 50257 \
    -b 16 -t 1024 -x "$steps" -l 6e-4 -u 5 -v 0 -m 2 -s 0 -g 16 "$@"
}
train_stage train-exact 75 20 --
train_stage train-knn 45 6 -- --attn knn --attn-k 32
train_stage train-sampled 45 6 -- --attn-grad sampled --attn-grad-samples 16
train_stage train-knn-sampled 45 4 -- --attn knn --attn-k 32 --attn-grad sampled --attn-grad-samples 16
# profile_figure LOG: the three kernels with the most GPU time, and their shares
profile_figure() {
  awk '/^kernel times/ { on = 1; total = $0; sub(/.*launches, /, "", total); next }
       on && $2 ~ /%$/ && n < 3 { name = $5; for (i = 6; i <= NF; i++) name = name " " $i
                                  printf "%s%s %s", (n ? "; " : "top of " total ": "), name, $2; n++ }
       END { if (!n) printf "no kernel times printed" }' "$1"
}
TRAIN_FIGURE=profile_figure train_stage profile-exact 40 4 env KNNGPT_KERNEL_TIMES=1 --
TRAIN_FIGURE=profile_figure train_stage profile-knn 40 4 env KNNGPT_KERNEL_TIMES=1 -- --attn knn --attn-k 32

# ---- NCCL: data parallel on one GPU (world 1), then on every GPU of the machine (ZeRO-1).
# The processes meet through a shared directory (-pi fs), which needs no MPI in the
# build nor mpirun on the machine. nccl_fs N CMD...: CMD as N ranks, rank 0 in the
# foreground (its output is the stage's log), the others' output in DIR/rankR.log.
nccl_fs() {
  local n=$1; shift
  local dir pids=() r rc=0
  dir=$(mktemp -d)
  for ((r = 1; r < n; r++)); do
    "$@" -pi fs -pn "$n" -pr "$r" -pg "$n" -pp "$dir" > "$dir/rank$r.log" 2>&1 &
    pids+=($!)
  done
  "$@" -pi fs -pn "$n" -pr 0 -pg "$n" -pp "$dir" || rc=$?
  # rank 0 failed: the others may wait for it at a collective, so stop them
  [ $rc = 0 ] || for r in "${pids[@]}"; do kill -TERM "$r" 2> /dev/null; done
  for r in "${pids[@]}"; do wait "$r" || { [ $rc != 0 ] || rc=1; }; done  # rank 0's status first
  [ $rc = 0 ] || tail -n 5 "$dir"/rank*.log 2> /dev/null
  rm -rf "$dir"
  return $rc
}
export -f nccl_fs
train_stage nccl-world1 60 5 bash -c 'nccl_fs "$@"' nccl_fs 1 -- -z 1
gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -gt 1 ]; then
  train_stage nccl-worldN 90 5 bash -c 'nccl_fs "$@"' nccl_fs "$gpus" -- -z 1 -d $((16 * 1024 * gpus))
else
  record SKIP nccl-worldN "one GPU here"
fi

# ---- attention benchmark: the check against the reference kernels, then TFLOP/s
# bench_figure LOG: the checks' verdicts and largest errors; the TFLOP/s of
# each configuration go under the summary (details). Fields are read by name
# (key=value pairs), so fwd_TFLOPs is never bf16_fwd_TFLOPs.
bench_fields() {  # LOG PREFIX KEY...: for each line starting with PREFIX, the values of KEY..., tab-separated
  local log=$1 prefix=$2; shift 2
  awk -v prefix="$prefix" -v keys="$*" 'index($0, prefix) == 1 {
      n = split(keys, k, " "); delete v
      for (i = 1; i <= NF; i++) if (split($i, kv, "=") == 2) v[kv[1]] = kv[2]
      line = ""; for (i = 1; i <= n; i++) line = line (i > 1 ? "\t" : "") (k[i] in v ? v[k[i]] : "?")
      print line }' "$log"
}
bench_figure() {
  bench_fields "$1" "check " T HS tiled_out tiled_dqkv bf16_out bf16_dqkv mma_out mma_dqkv |
    awk -F'\t' '{ printf "%scheck T=%s HS=%s max abs err tiled out %s dqkv %s, wmma out %s dqkv %s, mma out %s dqkv %s", (NR > 1 ? "; " : ""), $1, $2, $3, $4, $5, $6, $7, $8 }'
  grep -qE '^check .* FAIL$' "$1" && echo -n " (FAIL: beyond the bound)"
  grep -q 'skipped' "$1" && echo -n "$(grep -m1 skipped "$1")"
  echo
}
if ! built build/bench_attention_cuda; then
  record SKIP bench-attention "build/bench_attention_cuda not built"
else
  bench_log="$out/bench-attention.log"
  if gpu_stage bench-attention 80 bench_figure build/bench_attention_cuda && grep -q 'skipped' "$bench_log"; then
    record FAIL bench-attention "$(grep -m1 skipped "$bench_log")"
  fi
  [ -f "$bench_log" ] || bench_log=/dev/null  # the stage did not run (time budget): no figures
  while IFS=$'\t' read -r T HS fwd bwd bf16_fwd bf16_bwd mma_fwd mma_bwd; do
    details+=("      attention T=$T HS=$HS TFLOP/s fwd/bwd: fp32 tiled $fwd/$bwd, wmma $bf16_fwd/$bf16_bwd, mma $mma_fwd/$mma_bwd")
  done < <(bench_fields "$bench_log" "attention T=" T HS fwd_TFLOPs bwd_TFLOPs bf16_fwd_TFLOPs bf16_bwd_TFLOPs mma_fwd_TFLOPs \
           mma_bwd_TFLOPs)
  while IFS=$'\t' read -r T topk fwd efwd ratio sbwd lbwd ebwd; do
    details+=("      knn T=$T HS=64 k=32: top-k $topk ms ($ratio x the exact fwd $efwd ms), knn fwd $fwd ms; sampled bwd s=16 exact-row $sbwd ms, lazy-Gumbel $lbwd ms (exact bwd $ebwd ms)")
  done < <(bench_fields "$bench_log" "knn T=" T topk_ms knn_fwd_ms exact_fwd_ms topk_over_exact_fwd sampled_bwd_ms lazy_bwd_ms exact_bwd_ms)
  write_summary
fi

# ---- compute-sanitizer on the attention, top-k and sampled-gradient tests
sanitizer=$(command -v compute-sanitizer || echo "$(dirname "$(command -v "${NVCC:-nvcc}")")/compute-sanitizer")
sanitizer_figure() { grep -hoE '(ERROR|RACECHECK) SUMMARY: .*' "$1" | sort | uniq -c |
                     sed -E 's/^ *([0-9]+) (.*)/\2 (x\1)/' | tr '\n' ';' | sed 's/;$//; s/;/; /g'; }
# sanitize TOOL: the kernel tests of the attention the trainer runs (tensor cores),
# the top-k, sampled-gradient, fp32 attention and layer kernels under
# compute-sanitizer --tool TOOL, one after another. Left out: the death tests
# (a child process per check, which the sanitizer slows to minutes) and the
# 65535-head grid tests (tens of thousands of blocks: racecheck would take
# minutes on them alone).
sanitize_bins=(build/native/test_cuda_attention_bf16 build/native/test_cuda_knn build/native/test_cuda_sampled_grad
               build/native/test_cuda_attention build/native/test_cuda_layer_ops)
sanitize() {
  local tool=$1 rc=0 b
  for b in "${@:2}"; do
    echo "== $b"
    "$sanitizer" --tool "$tool" --error-exitcode 1 "$b" --gtest_filter='-*65535*:*Unsupported*:*Exit*' || rc=1
  done
  return $rc
}
export -f sanitize
export sanitizer
for tool in racecheck synccheck; do
  if [ ! -x "$sanitizer" ]; then
    record SKIP $tool "compute-sanitizer not found (part of the CUDA toolkit)"
  else
    present=(); for b in "${sanitize_bins[@]}"; do built "$b" && present+=("$b"); done
    if [ ${#present[@]} = 0 ]; then
      record SKIP $tool "none of the sanitized native tests built"
    else
      limit_own=100; [ $tool = synccheck ] && limit_own=60
      gpu_stage $tool $limit_own sanitizer_figure bash -c 'sanitize "$@"' sanitize $tool "${present[@]}"
    fi
  fi
done

# ---- build-here (prebuilt only): wait for the background build from source
if [ -n "$prebuilt" ]; then
  banner build-here
  if [ -z "$here_pid" ]; then
    record SKIP build-here "no nvcc on this machine"
  else
    limit=$(limit_for 60 build-here)
    waited=0
    while kill -0 "$here_pid" 2> /dev/null && [ $waited -lt "$limit" ]; do sleep 1; waited=$((waited + 1)); done
    if kill -0 "$here_pid" 2> /dev/null; then
      stop_build_here
      record FAIL build-here "still building after $(( $(date +%s) - here_started )) s, stopped (see $out/build-here.log)"
    elif wait "$here_pid"; then
      record PASS build-here "every target built from source here (done $(( $(date +%s) - here_started )) s after the start)"
    else
      broken=$(grep -oE '\*\*\* \[[^]]*: [^]]+\] Error' "$out/build-here.log" | sed -E 's/.*: ([^]]+)\] Error/\1/' |
               sort -u | tr '\n' ' ')
      record FAIL build-here "failed: ${broken:-?}; first error: $(grep -m1 -E 'error:|not found' "$out/build-here.log") (see $out/build-here.log)"
    fi
    tail -5 "$out/build-here.log"
  fi
fi
exit $failed
