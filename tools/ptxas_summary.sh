#!/usr/bin/env bash
# tools/ptxas_summary.sh LOG: one line per kernel and architecture from the
# `nvcc -Xptxas -v` output in LOG (make NVCC_EXTRA="-Xptxas -v" ...):
#   sm_90  128 regs  0 B spill  33792 B smem  causal_topk_brute_kernel<64>
# sorted by registers, most first; the kernel names demangled when c++filt is
# there. With -q, one line only: the kernel count, the most registers, and the
# kernels that spill.
set -euo pipefail
quiet=0
[ "${1:-}" = "-q" ] && { quiet=1; shift; }
log=${1:?usage: tools/ptxas_summary.sh [-q] LOG}
[ -f "$log" ] || { echo "ptxas_summary: $log: no such file" >&2; exit 1; }
demangle=cat
command -v c++filt > /dev/null && demangle=c++filt
# ptxas prints, per entry function: "Compiling entry function 'NAME' for 'sm_XX'",
# then "N bytes stack frame, S bytes spill stores, L bytes spill loads", then
# "Used R registers, ... M bytes smem, ..."
table=$(awk '
  /Compiling entry function/ { split($0, q, "'"'"'"); name = q[2]; arch = q[4]; spill = 0; next }
  /bytes spill stores/ && name != "" { for (i = 1; i <= NF; i++) if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) == "stores,") spill = $i; next }
  /Used [0-9]+ registers/ && name != "" {
    regs = 0; smem = 0
    for (i = 1; i <= NF; i++) { if ($i == "Used") regs = $(i+1); if ($(i+1) == "bytes" && $(i+2) ~ /^smem/) smem = $i }
    printf "%s\t%d\t%d\t%d\t%s\n", arch, regs, spill, smem, name; name = ""
  }' "$log" | sort -t$'\t' -k2,2nr | uniq)
if [ -z "$table" ]; then
  [ $quiet = 1 ] && { echo "no ptxas -v lines"; exit 0; }
  echo "ptxas_summary: no 'ptxas info' lines in $log (build with NVCC_EXTRA=\"-Xptxas -v\")" >&2
  exit 1
fi
if [ $quiet = 1 ]; then
  kernels=$(printf '%s\n' "$table" | wc -l)
  most=$(printf '%s\n' "$table" | head -1 | cut -f2)
  spills=$(printf '%s\n' "$table" | awk -F'\t' '$3 > 0' | wc -l)
  echo "$kernels kernel builds, at most $most registers, $spills spilling"
  exit 0
fi
printf '%s\n' "$table" | while IFS=$'\t' read -r arch regs spill smem name; do
  printf '%-6s %4d regs %6d B spill %7d B smem  %s\n' "$arch" "$regs" "$spill" "$smem" "$(printf '%s' "$name" | $demangle)"
done
