#!/usr/bin/env bash
# Mutation testing of the ONNX importer (docs/reliability.md "Mutation testing"): every mutant
# cargo-mutants makes of host/src/onnx/ is built and the importer's tests run against it; a
# mutant that no test notices ("missed") is a change of the code that no test can see.
#
#   scripts/mutants.sh [OUT_DIR] [extra cargo-mutants args, e.g. --re 'patterns.rs' or --iterate]
#   FILES='host/src/onnx/lower/**' scripts/mutants.sh ...   (a part of the importer; default all)
#
# OUT_DIR/mutants.out (default OUT_DIR: target/mutants-onnx) receives cargo-mutants' report:
# outcomes.json, caught.txt, missed.txt, timeout.txt, unviable.txt, and a log per mutant. Slow (about 20 s per mutant on 2 cores, 1,100+ mutants:
# hours); not run by CI. Needs `cargo install cargo-mutants` and, for the models written by
# scripts/onnx_models.py, python3 with numpy, onnx and onnxruntime (else those checks are skipped
# and more mutants are missed).
#
# The tests: the unit tests of ipu-host (`--lib`: the importer's folding and composition tests,
# 0.1 s) and tests/tests/onnx.rs without its two simulator runs (they build and simulate each
# model, ~30 s; the device-precision evaluation `imported_models_evaluated_in_device_precision_…`
# computes the same values the simulator must match bit for bit, in a few seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/mutants-onnx}
shift || true
command -v cargo-mutants >/dev/null || { echo "cargo install cargo-mutants" >&2; exit 2; }
# `--baseline skip`: cargo-mutants 27 runs the baseline with the mutated package's tests
# (ipu-host), not `--test-package`'s; the tests are known to pass (CI), and `--timeout` is set.
# `--cargo-arg=--test=onnx --cargo-arg=--lib`: only those two test binaries are built and run.
exec nice -n 10 cargo mutants \
  --package ipu-host --file "${FILES:-host/src/onnx/**}" \
  --test-package ipu-host,ipu-tests --cargo-arg=--test=onnx --cargo-arg=--lib \
  --baseline skip --timeout 120 \
  --jobs 1 \
  --output "$out" \
  "$@" \
  -- -- --skip tiny_siglip_from_both_torch_exporters --skip small_models_in_torch_forms
