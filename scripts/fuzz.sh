#!/usr/bin/env bash
# Coverage-guided fuzzing of every untrusted-input format with cargo-fuzz (libFuzzer):
# package reader, model parser (+planner), .npy reader, assembler.
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
mkdir -p "$corpus"/{package,model,npy,asm}
cp examples/*.toml "$corpus/model/"
cp tests/programs/*.s "$corpus/asm/"
for m in examples/*.toml; do
  n=$(basename "$m" .toml)
  "$exe" build "$m" -o "$corpus/package/$n.ipuexe" --tiles 8 >/dev/null 2>&1
  "$exe" run "$corpus/package/$n.ipuexe" --device sim --output-dir "fuzz/npy-$n" >/dev/null 2>&1 || true
  for f in fuzz/npy-$n/*.npy; do [ -e "$f" ] && cp "$f" "$corpus/npy/$n-$(basename "$f")"; done
  rm -rf "fuzz/npy-$n"
done
cd fuzz
for t in package model npy asm; do
  log=$(mktemp)
  cargo fuzz run "$t" -s none "corpus/$t" -- -max_total_time="$secs" -fork="$jobs" -rss_limit_mb=2048 \
    -ignore_crashes=0 >"$log" 2>&1 || { tail -40 "$log"; echo "FUZZ FAILURE in $t"; exit 1; }
  runs=$(grep -Eo '(Done [0-9]+ runs|#[0-9]+\s+DONE)' "$log" | tail -1)
  echo "fuzz target=$t seconds=$secs jobs=$jobs $runs corpus=$(ls "corpus/$t" | wc -l) crashes=0"
  rm -f "$log"
done
