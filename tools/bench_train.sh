#!/usr/bin/env bash
# Training-step benchmark of train_gpt_cpu on three shapes, against a baseline
# measured in the same run: the same trainer built with plain OpenMP loops for
# the matmuls (build/train_gpt_cpu_loops, -DKNNGPT_MATMUL_LOOPS), which is how
# a from-scratch C trainer computes them. Prints the median ms/step (the first
# step is dropped as warm-up), tok/s and the speedup, and writes
# build/bench_train.csv.
#
#   bash tools/bench_train.sh            (make bench builds the binaries first)
#   STEPS_SCALE=2 bash tools/bench_train.sh   more steps per shape
# Text: $KNNGPT_TEXT, else data/tinyshakespeare.txt, else bible-kjv's text.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${KNNGPT_BUILD:-build}
scale=${STEPS_SCALE:-1}
threads=${OMP_NUM_THREADS:-$(nproc)}

text=${KNNGPT_TEXT:-}
[ -z "$text" ] && [ -f data/tinyshakespeare.txt ] && text=data/tinyshakespeare.txt
if [ -z "$text" ]; then
  mkdir -p "$BUILD"; bible -l0 Gen1:1-Rev22:21 > "$BUILD/bench_text.txt"; text="$BUILD/bench_text.txt"
fi
mkdir -p "$BUILD/bench"
./prepare_data --input "$text" --out-dir "$BUILD/bench" --name text > /dev/null
data="-i $BUILD/bench/text_train.bin -j $BUILD/bench/text_val.bin -v 0 -m 1 -s 0 -g 1"

# median of the "| X ms |" fields of the step lines, skipping the first step
median_ms() {
  grep -oE '\| [0-9.]+ ms \|' | awk 'NR > 1 { print $2 }' | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

csv="$BUILD/bench_train.csv"
echo "shape,B,T,steps,threads,ms_per_step,tok_per_s,baseline_ms_per_step,speedup" > "$csv"
printf '%-28s %6s %10s %10s %14s %8s\n' shape steps "ms/step" "tok/s" "loops ms/step" speedup
run_shape() {  # name B T steps model-flags...
  local name=$1 B=$2 T=$3 steps=$(( $4 * scale )); shift 4
  local flags="$data -b $B -t $T -x $steps $*"
  local fast slow
  fast=$(OMP_NUM_THREADS=$threads ./train_gpt_cpu $flags | median_ms)
  slow=$(OMP_NUM_THREADS=$threads "$BUILD/train_gpt_cpu_loops" $flags | median_ms)
  local toks speedup
  toks=$(awk -v ms="$fast" -v n=$((B * T)) 'BEGIN { printf "%.0f", n / (ms / 1000) }')
  speedup=$(awk -v a="$slow" -v b="$fast" 'BEGIN { printf "%.2f", a / b }')
  printf '%-28s %6d %10.1f %10s %14.1f %7sx\n' "$name" "$steps" "$fast" "$toks" "$slow" "$speedup"
  echo "$name,$B,$T,$steps,$threads,$fast,$toks,$slow,$speedup" >> "$csv"
}
run_shape "baby 4L/4H/128 T64 B12" 12 64 30 --layers 4 --heads 4 --channels 128
run_shape "6L/6H/384 T256 B4" 4 256 10 --layers 6 --heads 6 --channels 384
run_shape "GPT-2 124M (d12) T64 B4" 4 64 4 -e d12
echo "threads: $threads; csv: $csv"
