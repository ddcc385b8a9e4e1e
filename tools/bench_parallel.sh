#!/usr/bin/env bash
# tools/bench_parallel.sh — data parallelism on CPUs, measured in one run:
# one process of 2 threads against two processes of 1 thread each (mpirun,
# ZeRO-0 and ZeRO-1), on the same global batch, for the baby model and a
# 6-layer, 384-channel model (nanoGPT's shakespeare-char shape). Prints the
# median ms per step (the first step left out) as tok/s, the ratio to the one
# process, and the bytes each rank sends per step for each ZeRO stage.
#
#   bash tools/bench_parallel.sh [STEPS]        (default 20 steps a run)
# The text is data/tinyshakespeare_train.bin (or $KNNGPT_TRAIN_BIN).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
train=${KNNGPT_TRAIN_BIN:-data/tinyshakespeare_train.bin}
command -v mpirun >/dev/null || { echo "bench_parallel: mpirun not found (bash tools/install_deps.sh)"; exit 1; }
make -s train_gpt_cpu
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_rmaps_base_oversubscribe=1

# median of the "| X ms |" of the step lines after the first
median_ms() { grep -oE '^step +[0-9]+/[0-9]+ .*\| ([0-9.]+) ms \|' | sed -n '2,$p' | sed -E 's/.*\| ([0-9.]+) ms \|$/\1/' |
              sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "nan"; else print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
params_of() { grep -oE '^\| parameters +\| [0-9]+' | grep -oE '[0-9]+$'; }

printf "%-10s %10s %8s | %-16s | %-24s | %-24s\n" config params tokens "1 x 2 threads" "2 x 1 thread, ZeRO-0" "2 x 1 thread, ZeRO-1"
for cfg in "baby|--layers 4 --heads 4 --channels 128 -t 64|12" "6L/384|--layers 6 --heads 6 --channels 384 -t 256|8"; do
  IFS='|' read -r name shape B <<< "$cfg"
  common="-i $train -j $train $shape -x $steps -v 0 -m 1 -s 0 -g 1"
  one=$(OMP_NUM_THREADS=2 ./train_gpt_cpu $common -b "$B")
  ms1=$(median_ms <<< "$one"); n=$(params_of <<< "$one")
  tokens=$((B * $(sed -E 's/.*-t ([0-9]+).*/\1/' <<< "$shape")))
  row=""
  for z in 0 1; do
    two=$(OMP_NUM_THREADS=1 mpirun -q -np 2 -x OMP_NUM_THREADS ./train_gpt_cpu $common -b $((B / 2)) -z $z)
    ms2=$(median_ms <<< "$two")
    row+=$(awk -v t="$tokens" -v a="$ms1" -v b="$ms2" 'BEGIN { printf "| %7.0f tok/s (%.2fx)    ", t / (b / 1000), a / b }')
  done
  printf "%-10s %10s %8s | %7.0f tok/s    %s\n" "$name" "$n" "$tokens" "$(awk -v t="$tokens" -v a="$ms1" 'BEGIN { print t / (a / 1000) }')" "$row"
  # bytes each of W ranks sends per step (ring algorithms): an all-reduce is a
  # reduce-scatter plus an all-gather, each (W-1)/W of the 4n gradient bytes
  awk -v n="$n" -v name="$name" 'BEGIN { W = 2; mb = 4 * n / 1e6;
    printf "%-10s bytes sent per rank per step, W = 2: ZeRO-0 all-reduce %.2f MB; ZeRO-1 reduce-scatter %.2f MB + all-gather %.2f MB = %.2f MB;", name, 2 * (W - 1) / W * mb, (W - 1) / W * mb, (W - 1) / W * mb, 2 * (W - 1) / W * mb;
    printf " AdamW state per rank %.2f MB (ZeRO-0) vs %.2f MB (ZeRO-1)\n", 2 * mb, 2 * mb / W }'
done
