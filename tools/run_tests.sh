#!/bin/sh
# Runs each GoogleTest binary given as an argument and prints one closing line
# "N passed, N failed, N skipped" over all of them. Exit status non-zero if any
# test failed or a binary crashed.
#
# Binaries that test kernels/cuda print the kernels they launched
# ("cuda kernels run under emulation: N: name ..." or "... natively: ...");
# before the closing line this prints how many distinct kernels ran each way,
# out of the __global__ kernels defined in kernels/cuda, and names any never run.
#
# Tests of several processes start them with mpirun (OpenMPI). When the suite
# runs as root (CI), OpenMPI refuses that unless told it is wanted; the
# settings below say so for this run only, and let two ranks share the cores of
# a small machine.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1
passed=0; failed=0; skipped=0; crashed=0
log=$(mktemp); emulated=$(mktemp); native=$(mktemp)
for bin in "$@"; do
  echo "== $bin"
  "$bin" > "$log" 2>&1
  rc=$?
  cat "$log"
  p=$(grep -c '^\[       OK \]' "$log"); f=$(grep -c '^\[  FAILED  \] .* ([0-9]* ms)$' "$log")
  s=$(grep -c '^\[  SKIPPED \] .* ([0-9]* ms)$' "$log")
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then crashed=$((crashed + 1)); echo "!! $bin exited with status $rc"; fi
  grep '^cuda kernels run under emulation: [0-9]*:' "$log" | cut -d: -f3 | tr ' ' '\n' | grep . >> "$emulated"
  grep '^cuda kernels run natively: [0-9]*:' "$log" | cut -d: -f3 | tr ' ' '\n' | grep . >> "$native"
done
# (KNNGPT_KERNEL_COVERAGE=0: a run of a subset of the tests, where the count means nothing)
if [ "${KNNGPT_KERNEL_COVERAGE:-1}" != 0 ] && { [ -s "$emulated" ] || [ -s "$native" ]; }; then
  defined=$(cat kernels/cuda/*.cuh | tr '\n' ' ' | grep -oE '__global__ +void +(__launch_bounds__\([^)]*\) +)?[A-Za-z0-9_]+' |
    awk '{ print $NF }' | sort -u)
  total=$(echo "$defined" | grep -c .)
  for mode in "under emulation" natively; do
    file=$emulated; [ "$mode" = natively ] && file=$native
    [ -s "$file" ] || continue
    # kernels of kernels/cuda only (a test may launch a kernel of its own)
    ran=$(echo "$defined" | while read -r k; do grep -qx "$k" "$file" && echo "$k"; done | grep -c .)
    missing=$(echo "$defined" | while read -r k; do grep -qx "$k" "$file" || printf ' %s' "$k"; done)
    echo "cuda kernels run $mode: $ran distinct of the $total defined in kernels/cuda${missing:+ (never run:$missing)}"
  done
fi
rm -f "$log" "$emulated" "$native"
[ $crashed -gt 0 ] && failed=$((failed + crashed))
echo "$passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
