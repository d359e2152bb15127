#!/usr/bin/env bash
# Coverage-guided fuzzing of every untrusted-input format with cargo-fuzz (libFuzzer):
# package reader, model parser (+planner), .npy reader, assembler, search state, profile reader,
# ONNX importer.
# Usage: scripts/fuzz.sh SECONDS_PER_TARGET [JOBS]   (CPU time per target = SECONDS × JOBS)
# Seeds come from the repository's own inputs; crashes land in fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
jobs=${2:-1}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
cargo build -p ipu-host >/dev/null
exe=target/debug/ipu-codegen
corpus=fuzz/corpus
mkdir -p "$corpus"/{package,model,npy,asm,search_state,profile,onnx}
cp tests/data/onnx/siglip_tiny/legacy.onnx "$corpus/onnx/"
if python3 -c 'import onnx, onnxruntime' 2>/dev/null; then
  python3 scripts/onnx_models.py "$corpus/onnx-models" >/dev/null && cp "$corpus"/onnx-models/*.onnx "$corpus/onnx/"
fi
cp examples/*.toml "$corpus/model/"
cp tests/programs/*.s "$corpus/asm/"
for m in examples/*.toml; do
  n=$(basename "$m" .toml)
  "$exe" build "$m" -o "$corpus/package/$n.ipuexe" --tiles 8 >/dev/null 2>&1
  "$exe" run "$corpus/package/$n.ipuexe" --device sim --output-dir "fuzz/npy-$n" >/dev/null 2>&1 || true
  for f in fuzz/npy-$n/*.npy; do [ -e "$f" ] && cp "$f" "$corpus/npy/$n-$(basename "$f")"; done
  rm -rf "fuzz/npy-$n"
done
"$exe" build examples/matmul.toml -o "$corpus/package/searched.ipuexe" --tiles 64 --search-attempts 3 \
  --search-state "$corpus/search_state/state.json" >/dev/null 2>&1
"$exe" build examples/qk.toml -o "$corpus/package/qk-searched.ipuexe" --tiles 16 \
  --search-state "$corpus/search_state/qk-state.json" >/dev/null 2>&1
"$exe" build examples/qk.toml -o "$corpus/package/qk-profiled.ipuexe" --tiles 4 --profile >/dev/null 2>&1
"$exe" run "$corpus/package/qk-profiled.ipuexe" --profile "$corpus/profile/qk.capnp" >/dev/null 2>&1
cd fuzz
for t in ${TARGETS:-package model npy asm search_state profile onnx}; do
  log=$(mktemp)
  status=0
  cargo fuzz run "$t" -s none "corpus/$t" -- -max_total_time="$secs" -fork="$jobs" -rss_limit_mb=2048 -timeout=10 \
    >"$log" 2>&1 || status=$?
  # Fork mode's last stats line: "#RUNS: cov: C ft: F corp: N exec/s: E oom/timeout/crash: a/b/c ...".
  stats=$(grep -E '^#[0-9]+: cov' "$log" | tail -1 || true)
  bad=$(printf '%s' "$stats" | sed -nE 's#.*oom/timeout/crash: ([0-9]+)/([0-9]+)/([0-9]+).*#\1 \2 \3#p')
  if [ -n "$(ls -A "artifacts/$t" 2>/dev/null)" ] || [ "${bad:-0 0 0}" != "0 0 0" ]; then
    tail -40 "$log"; echo "FUZZ FAILURE in $t: see fuzz/artifacts/$t"; exit 1
  fi
  if [ -z "$stats" ]; then tail -20 "$log"; echo "FUZZ FAILURE in $t: no statistics (exit $status)"; exit 1; fi
  echo "fuzz target=$t seconds=$secs jobs=$jobs cpu_seconds=$((secs * jobs)) ${stats}"
  rm -f "$log"
done
