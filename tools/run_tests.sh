#!/bin/sh
# Runs each GoogleTest binary given as an argument and prints one closing line
# "N passed, N failed, N skipped" over all of them. Exit status non-zero if any
# test failed or a binary crashed.
passed=0; failed=0; skipped=0; crashed=0
log=$(mktemp)
for bin in "$@"; do
  echo "== $bin"
  "$bin" > "$log" 2>&1
  rc=$?
  cat "$log"
  p=$(grep -c '^\[       OK \]' "$log"); f=$(grep -c '^\[  FAILED  \] .* ([0-9]* ms)$' "$log")
  s=$(grep -c '^\[  SKIPPED \] .* ([0-9]* ms)$' "$log")
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then crashed=$((crashed + 1)); echo "!! $bin exited with status $rc"; fi
done
rm -f "$log"
[ $crashed -gt 0 ] && failed=$((failed + crashed))
echo "$passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
