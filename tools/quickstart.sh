#!/usr/bin/env bash
# From a fresh Debian 12 machine to a trained model in one command:
# installs what is missing, builds, prepares the text and trains nanoGPT's
# "baby" character-level GPT (4 layers, 4 heads, 128 channels, T = 64,
# B = 12, 2000 steps), printing validation loss, perplexity and a sample.
#
#   bash tools/quickstart.sh [TEXT_FILE] [extra train_gpt_cpu flags...]
#
# The text: TEXT_FILE if given, else $KNNGPT_TEXT, else data/tinyshakespeare.txt
# if present, else a download of tinyshakespeare when the network allows,
# else the King James Bible from Debian's bible-kjv package (works offline).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
make -j2 train_gpt_cpu prepare_data
mkdir -p data

text="${KNNGPT_TEXT:-}"
if [ $# -gt 0 ] && [ -f "$1" ]; then text="$1"; shift; fi
if [ -z "$text" ] && [ -f data/tinyshakespeare.txt ]; then text=data/tinyshakespeare.txt; fi
if [ -z "$text" ]; then
  url=https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
  if command -v curl >/dev/null && curl -fsSL --max-time 20 -o data/tinyshakespeare.txt.tmp "$url" 2>/dev/null; then
    mv data/tinyshakespeare.txt.tmp data/tinyshakespeare.txt
    text=data/tinyshakespeare.txt
  else
    rm -f data/tinyshakespeare.txt.tmp
    echo "quickstart: no tinyshakespeare (no network?): using the King James Bible from bible-kjv"
    bible -l0 Gen1:1-Rev22:21 > data/bible.txt.tmp && mv data/bible.txt.tmp data/bible.txt
    text=data/bible.txt
  fi
fi
name=$(basename "${text%.*}")
./prepare_data --input "$text" --out-dir data --name "$name"

./train_gpt_cpu \
  -i "data/${name}_train.bin" -j "data/${name}_val.bin" \
  --layers 4 --heads 4 --channels 128 -t 64 -b 12 \
  -x 2000 -l 1e-3 -k cosine -q 0.1 -u 100 --beta2 0.99 -c 0.1 --grad-clip 1.0 \
  --shuffle 1 -v 500 -m -1 -s 2000 -g 300 "$@"
