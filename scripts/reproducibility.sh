#!/usr/bin/env bash
# Builds every example (and the ONNX fixtures) under variations of thread count, build directory, TZ, LC_ALL, umask and
# SOURCE_DATE_EPOCH, and checks that each example's package has one SHA-256 across all of them.
# Usage: scripts/reproducibility.sh [path/to/ipu-codegen]   (exit 1 on any difference)
set -euo pipefail
cd "$(dirname "$0")/.."
exe=${1:-target/debug/ipu-codegen}
exe=$(realpath "$exe")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
printf '%-10s %-44s %s\n' example variation sha256
for model in examples/*.toml examples/*/*.toml tests/data/onnx/siglip_tiny/*.onnx; do
  ext=${model##*.}
  name=$(basename "$model" ".$ext")
  hashes=()
  run() { # label, env assignments..., then a directory
    local label=$1 dir=$2; shift 2
    mkdir -p "$dir"
    cp "$model" "$dir/model.$ext"
    # Params are read from files next to the model (an ONNX model's external data likewise).
    cp "$(dirname "$model")"/*.npy "$dir/" 2>/dev/null || true
    if [ -e "$model.data" ]; then cp "$model.data" "$dir/$(basename "$model").data"; fi
    if [ "$ext" = onnx ]; then
      # The external data file keeps its name; the model file keeps its own (it is named in the
      # imported model's header).
      cp "$model" "$dir/$(basename "$model")"
      (cd "$dir" && env "$@" "$exe" build "$(basename "$model")" -o out.ipuexe --tiles 64 >/dev/null 2>&1)
    else
      (cd "$dir" && env "$@" "$exe" build model.toml -o out.ipuexe --tiles 64 >/dev/null 2>&1)
    fi
    local h; h=$(sha256sum "$dir/out.ipuexe" | cut -d' ' -f1)
    printf '%-10s %-44s %s\n' "$name" "$label" "$h"
    hashes+=("$h")
  }
  run "threads=1" "$work/$name/a" RAYON_NUM_THREADS=1
  run "threads=2, other directory" "$work/$name/deeper/b" RAYON_NUM_THREADS=2
  run "TZ=Asia/Kolkata LC_ALL=C.UTF-8" "$work/$name/c" TZ=Asia/Kolkata LC_ALL=C.UTF-8
  run "TZ=America/St_Johns LC_ALL=POSIX umask 077" "$work/$name/d" TZ=America/St_Johns LC_ALL=POSIX sh -c 'umask 077; exec "$0" "$@"'
  run "SOURCE_DATE_EPOCH=0" "$work/$name/e" SOURCE_DATE_EPOCH=0
  run "SOURCE_DATE_EPOCH=1700000000 threads=1" "$work/$name/f" SOURCE_DATE_EPOCH=1700000000 RAYON_NUM_THREADS=1
  if [ "$(printf '%s\n' "${hashes[@]}" | sort -u | wc -l)" -ne 1 ]; then
    echo "DIFFERENT: $name"; status=1
  fi
done
[ $status -eq 0 ] && echo "reproducible: every example has one package hash across all variations"
exit $status
