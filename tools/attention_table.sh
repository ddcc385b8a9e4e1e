#!/usr/bin/env bash
# Trains nanoGPT's CPU baby config on tinyshakespeare once per attention
# setting, with the same init, data order and schedule (the quick start's
# flags: 4L/4H/128, T = 64, B = 12, 2000 steps, lr 1e-3 cosine to 1e-4,
# warmup 100, beta2 0.99, weight decay 0.1, clip 1.0), and prints a markdown
# table of the final validation loss (whole validation split).
#
#   bash tools/attention_table.sh TEXT_FILE [SEED...]       (default seeds: 1337)
#   SETTINGS_FILTER='^knn k=(8|32)$' bash tools/attention_table.sh ...   (only the rows whose
#                                                name matches this regular expression)
# Logs go to build/attention_table/; a run whose log already ends with its
# summary line is not repeated. Each run takes ~5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
text=${1:?usage: attention_table.sh TEXT_FILE [SEED...]}
shift
seeds=("$@")
[ ${#seeds[@]} -eq 0 ] && seeds=(1337)
make -s train_gpt_cpu prepare_data
out=build/attention_table
mkdir -p "$out"
./prepare_data --input "$text" --out-dir "$out" --name text > /dev/null

settings=(
  "exact|--attn exact"
  "knn k=16|--attn knn --attn-k 16"
  "knn k=8|--attn knn --attn-k 8"
  "knn k=4|--attn knn --attn-k 4"
  "knn k=32|--attn knn --attn-k 32"
  "knn k=16, cluster index|--attn knn --attn-k 16 --attn-index cluster"
  "knn k=16, ivf index|--attn knn --attn-k 16 --attn-index ivf"
  "knn-tail k=8 m=8|--attn knn-tail --attn-k 8 --attn-tail 8"
  "gumbel k=8 (sampled grads)|--attn gumbel --attn-k 8 --attn-grad sampled"
  "kmv k=8 m=8|--attn kmv --attn-k 8 --attn-tail 8"
  "kmv k=8 m=8, relative, 4 levels, alpha 1|--attn kmv --attn-k 8 --attn-tail 8 --attn-kmv-threshold relative --attn-kmv-levels 4 --attn-kmv-alpha 1"
  "exact, sampled grads s=16|--attn exact --attn-grad sampled --attn-grad-samples 16"
  "knn k=16, sampled grads s=16|--attn knn --attn-k 16 --attn-grad sampled --attn-grad-samples 16"
)
if [ -n "${SETTINGS_FILTER:-}" ]; then
  kept=()
  for s in "${settings[@]}"; do [[ "${s%%|*}" =~ $SETTINGS_FILTER ]] && kept+=("$s"); done
  settings=("${kept[@]}")
fi

echo "| attention | seed | val loss | perplexity | ms/step | flags |"
echo "|---|---|---|---|---|---|"
for seed in "${seeds[@]}"; do
  for s in "${settings[@]}"; do
    name=${s%%|*}; flags=${s#*|}
    log="$out/$(echo "$name-$seed" | tr -c 'A-Za-z0-9=.-' '_').log"
    if ! grep -q '^done:' "$log" 2>/dev/null; then
      OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)} ./train_gpt_cpu \
        -i "$out/text_train.bin" -j "$out/text_val.bin" \
        --layers 4 --heads 4 --channels 128 -t 64 -b 12 \
        -x 2000 -l 1e-3 -k cosine -q 0.1 -u 100 --beta2 0.99 -c 0.1 --grad-clip 1.0 \
        --shuffle 1 -v 0 -m -1 -s 0 -g 64 --seed "$seed" $flags > "$log" 2>&1
    fi
    summary=$(grep '^done:' "$log")
    val=$(echo "$summary" | sed -E 's/.*val loss ([0-9.]+).*/\1/')
    ppl=$(echo "$summary" | sed -E 's/.*perplexity ([0-9.]+).*/\1/')
    ms=$(echo "$summary" | sed -E 's/.*mean ([0-9.]+) ms.*/\1/')
    echo "| $name | $seed | $val | $ppl | $ms | \`$flags\` |"
  done
done
