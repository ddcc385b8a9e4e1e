#!/usr/bin/env bash
# The trainer on idle cores and beside busy processes. Runs a command RUNS times alone,
# then RUNS times beside BUSY processes that each spin one core, and prints per run the
# wall time and the median step time (the trainer's "| X ms |" fields, the first step
# dropped), then their medians and the ratio beside/alone.
#
#   bash tools/bench_shared_cores.sh [-n BUSY] [-r RUNS] -- COMMAND ...
#   bash tools/bench_shared_cores.sh -n 2 -- ./train_gpt_cpu -i T.bin -j V.bin -x 30 -v 0 -m 1 -s 0
#
# BUSY defaults to the number of cores, RUNS to 3. The busy processes stop with the
# script. Give the command the environment to compare (OMP_NUM_THREADS, GOMP_SPINCOUNT,
# another binary) and run the script once per setting.
set -euo pipefail
busy=$(nproc); runs=3
while [ $# -gt 0 ]; do
  case $1 in
    -n) busy=$2; shift 2 ;;
    -r) runs=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "bench_shared_cores.sh: unknown option '$1' (usage: [-n BUSY] [-r RUNS] -- COMMAND ...)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "bench_shared_cores.sh: no command given after --" >&2; exit 2; }

pids=()
stop_busy() { [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null; pids=(); }
trap stop_busy EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
log=$(mktemp); trap 'stop_busy; rm -f "$log"' EXIT

# one run: "wall_s step_ms"
one_run() {
  local t0 t1
  t0=$(date +%s.%N)
  "$@" > "$log" 2>&1 || { rc=$?; echo "bench_shared_cores.sh: the command exited $rc: $(tail -n 1 "$log")" >&2; exit 1; }
  t1=$(date +%s.%N)
  local step
  step=$(grep -oE '\| [0-9.]+ ms \|' "$log" | awk 'NR > 1 { print $2 }' | median)
  awk -v a="$t0" -v b="$t1" -v s="$step" 'BEGIN { printf "%.3f %s\n", b - a, s }'
}

measure() {  # label, then the command; prints the runs and leaves "wall step" medians in $result
  local label=$1; shift
  local walls=() steps=()
  for r in $(seq "$runs"); do
    read -r w s < <(one_run "$@")
    printf '  %-7s run %d: %8.3f s wall, %s ms/step\n' "$label" "$r" "$w" "$s"
    walls+=("$w"); steps+=("$s")
  done
  result="$(printf '%s\n' "${walls[@]}" | median) $(printf '%s\n' "${steps[@]}" | median)"
}

echo "command: $*"
echo "cores: $(nproc), busy processes beside: $busy, runs: $runs"
measure alone "$@"; read -r wall_alone step_alone <<< "$result"
for i in $(seq "$busy"); do sh -c 'while :; do :; done' & pids+=($!); done
sleep 0.5
measure beside "$@"; read -r wall_beside step_beside <<< "$result"
stop_busy
awk -v wa="$wall_alone" -v wb="$wall_beside" -v sa="$step_alone" -v sb="$step_beside" 'BEGIN {
  printf "median wall: alone %.3f s, beside %.3f s, ratio %.2f\n", wa, wb, wb / wa
  if (sa != "nan" && sb != "nan") printf "median step: alone %.1f ms, beside %.1f ms, ratio %.2f\n", sa, sb, sb / sa }'
