#!/bin/bash
# Compare the examples' predicted and simulated cycles between two ipu-codegen binaries, e.g. the
# landed main's and a change's: every example on 1, 8, 64 and 1472 tiles, each built and run by
# its own binary; lines that differ end in "<-- DIFFERS".
#   scripts/compare_cycles.sh OLD/ipu-codegen NEW/ipu-codegen
set -u
A=$1; B=$2
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
for m in examples/matmul.toml examples/qk.toml examples/attention.toml examples/mlp/mlp.toml examples/encoder_block/encoder_block.toml; do
  for t in 1 8 64 1472; do
    ra=$($A build $m -o $tmp/a.ipuexe --tiles $t 2>&1 | grep -o "predicted_cycles=[0-9]*")
    rb=$($B build $m -o $tmp/b.ipuexe --tiles $t 2>&1 | grep -o "predicted_cycles=[0-9]*")
    sa=$($A run $tmp/a.ipuexe --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['cycles'], d['numerical_test'])" 2>/dev/null)
    sb=$($B run $tmp/b.ipuexe --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['cycles'], d['numerical_test'])" 2>/dev/null)
    rm -f $tmp/a.ipuexe $tmp/b.ipuexe
    flag=""; [ "$ra $sa" != "$rb $sb" ] && flag="  <-- DIFFERS"
    echo "$m t=$t old: $ra $sa | new: $rb $sb$flag"
  done
done
rm -rf "$tmp"
