#!/usr/bin/env bash
# Regenerates the walkthrough excerpt (docs/walkthrough_excerpt.txt, and between the markers of
# docs/walkthrough.md) and the heatmaps docs/images/walkthrough_step5_weights.png and
# docs/images/walkthrough_step9_dscores.png.
# Run from anywhere, with numpy-attn installed (torch and matplotlib too: '.[tests]' has both) and,
# offline, TIKTOKEN_CACHE_DIR naming a folder that holds tiktoken's cached GPT-2 files:
#   NUMPY_ATTN=.venv/bin/numpy-attn docs/regenerate_walkthrough.sh
set -euo pipefail
cd "$(dirname "$0")/.."
numpy_attn=${NUMPY_ATTN:-numpy-attn}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The source example: typed-in embeddings and W matrices, so every number can be checked.
"$numpy_attn" walkthrough --example source --color never --plot "$work" > "$work/walkthrough.txt"
{
  sed -n '1,/^$/p' "$work/walkthrough.txt" | head -n -1       # the header, up to its blank line
  echo "[...]"
  sed -n '/^  context = weights @ values/,/^Step 6/p' "$work/walkthrough.txt" | head -n -2   # not the blank line and the Step 6 title
  echo "[...]"
  sed -n '/^Step 9/,/^  dweights = G/p' "$work/walkthrough.txt" | head -n -2    # step 9 up to the loss
  echo "[...]"
  sed -n '/^  dscores = weights/,/^  dq = dscores/p' "$work/walkthrough.txt" | head -n -2   # dscores, cat by hand
} > docs/walkthrough_excerpt.txt
cp "$work/step5_qkv.png" docs/images/walkthrough_step5_weights.png
cp "$work/step9_dscores.png" docs/images/walkthrough_step9_dscores.png
# Put the excerpt between the markers of docs/walkthrough.md.
awk -v excerpt=docs/walkthrough_excerpt.txt '
  /<!-- excerpt end -->/ { skip = 0 }
  !skip { print }
  /<!-- excerpt start/ { print "```text"; while ((getline line < excerpt) > 0) print line; print "```"; skip = 1 }
' docs/walkthrough.md > "$work/walkthrough.md"
cp "$work/walkthrough.md" docs/walkthrough.md
echo "wrote docs/walkthrough_excerpt.txt, docs/walkthrough.md, docs/images/walkthrough_step5_weights.png" \
  "and docs/images/walkthrough_step9_dscores.png"
