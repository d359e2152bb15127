#!/usr/bin/env bash
# The family models of issue #40 at their real base sizes: ViT-B/16 at 224² (197 tokens, width 768,
# 12 layers, 12 heads, MLP 3072) and BERT-base (128 tokens, vocabulary 30,522), exported by torch
# (scripts/export_family.py, random weights, onnxruntime's outputs as the reference), built for the
# whole chip and — when the build succeeds — run on the simulator, with the output's cosine against
# onnxruntime. Prints per model: build wall time and peak RSS, then the run's cycles or the build's
# refusal. Not in CI (torch is large; each build takes minutes): results are in docs/onnx.md.
#
#     scripts/base_sizes.sh [OUT_DIR] [PYTHON]      (PYTHON: one with torch, transformers, onnx,
#                                                    onnxscript, onnxruntime; default python3)
#
# `--search-attempts 0`: each stage-search candidate is a whole-graph plan, 12 layers each.
set -euo pipefail
out=${1:-/tmp/base_sizes}
py=${2:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
cargo build --release --quiet --manifest-path "$root/Cargo.toml" --bin ipu-codegen
bin="$root/target/release/ipu-codegen"
"$py" "$root/scripts/export_family.py" "$out" --models vit,bert --image 224 --patch 16 --width 768 \
    --layers 12 --heads 12 --mlp 3072 --tokens 128 --vocab 30522 2>&1 | grep -E '^(vit|bert):'

cosine() { # device output, reference
    "$py" -c "import numpy as np,sys; a=np.load(sys.argv[1]).ravel().astype(np.float64); \
b=np.load(sys.argv[2]).ravel().astype(np.float64); \
print(f'{a@b/np.linalg.norm(a)/np.linalg.norm(b):.7f}')" "$1" "$2"
}

# name, input, then build flags
for spec in "vit pixel_values" "vit pixel_values --weights fp8 --calibrate pixel_values=$out/vit.in.pixel_values.npy" \
    "bert input_ids"; do
    set -- $spec
    name=$1 input=$2
    shift 2
    tag=$name${1:+_fp8}
    pkg="$out/$tag.ipuexe"
    echo "== $tag: ipu-codegen build $name.onnx --tiles 1472 --search-attempts 0 $*"
    if /usr/bin/time -f "build: %e s wall, %M KB peak RSS" "$bin" build "$out/$name.onnx" -o "$pkg" \
        --search-attempts 0 "$@" > "$out/$tag.build.log" 2> "$out/$tag.build.err"; then
        tail -1 "$out/$tag.build.err"
        rm -rf "$out/$tag.out" && mkdir -p "$out/$tag.out"
        "$bin" run "$pkg" --input "$input=$out/$name.in.$input.npy" --output-dir "$out/$tag.out" 2>&1 |
            grep -E 'cycles|Test=' || true
        echo "cosine vs onnxruntime (last_hidden_state): $(cosine "$out/$tag.out/last_hidden_state.npy" \
            "$out/$name.ref.last_hidden_state.npy")"
    else
        grep -E '^error' "$out/$tag.build.err" || true
        tail -1 "$out/$tag.build.err"
    fi
done
