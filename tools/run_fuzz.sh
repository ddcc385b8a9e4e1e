#!/bin/sh
# Runs libFuzzer targets (make fuzz): each given name is $FUZZ_DIR/NAME, run for
# $FUZZ_SECONDS seconds, or for $FUZZ_RUNS inputs when that is set, from a
# working copy of its seed corpus tests/fuzz/corpus/NAME (what it finds is kept
# in $FUZZ_DIR/corpus/NAME, for the next run; the seeds stay as committed).
# Limits: 2048 MB of memory, no single allocation over 256 MB (each target
# checks a tighter bound itself: tests/fuzz/fuzz_util.h), 10 s per input.
# A crash, sanitizer report, leak or timeout stops the target and leaves the
# input in $FUZZ_DIR/artifacts/. Prints one line per target, the executions
# and the result, and exits non-zero if any target failed.
FUZZ_DIR=${FUZZ_DIR:-build/fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
mkdir -p "$FUZZ_DIR/artifacts"
summary=$(mktemp); failed=0
for name in "$@"; do
  bin=$FUZZ_DIR/$name
  [ -x "$bin" ] || { echo "run_fuzz: $bin not built (make fuzz-bins)"; exit 1; }
  corpus=$FUZZ_DIR/corpus/$name
  mkdir -p "$corpus"
  [ -d "tests/fuzz/corpus/$name" ] && cp -n tests/fuzz/corpus/"$name"/* "$corpus"/ 2>/dev/null
  if [ -n "$FUZZ_RUNS" ]; then budget="-runs=$FUZZ_RUNS"; else budget="-max_total_time=$FUZZ_SECONDS"; fi
  log=$FUZZ_DIR/$name.log
  echo "== $name ($budget)"
  "$bin" "$budget" -rss_limit_mb=2048 -malloc_limit_mb=256 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$FUZZ_DIR/artifacts/$name-" "$corpus" > "$log" 2>&1
  rc=$?
  runs=$(grep '^stat::number_of_executed_units:' "$log" | awk '{ print $2 }')
  secs=$(grep '^stat::average_exec_per_sec:' "$log" | awk '{ print $2 }')
  units=$(ls "$corpus" | wc -l)
  if [ $rc -eq 0 ] && ! grep -q 'ERROR: \|runtime error:\|WARNING: ' "$log"; then
    result="ok"
  else
    result="FAILED (exit $rc, see $log)"; failed=$((failed + 1))
    grep -m 20 'ERROR: \|runtime error:\|WARNING: \|^fuzz: \|SUMMARY' "$log"
  fi
  printf '%-20s %12s runs %8s/s  corpus %5s  %s\n' "$name" "${runs:-?}" "${secs:-?}" "$units" "$result" | tee -a "$summary"
done
echo "== fuzz summary"
cat "$summary"; rm -f "$summary"
echo "$failed of $# targets failed"
[ $failed -eq 0 ]
