#!/usr/bin/env bash
# Regenerate host/src/profile/profile_capnp.rs from schema/profile.capnp.
# `--check`: regenerate into a temp dir and fail if the committed file differs (CI).
# Needs `capnp` (Debian: capnproto).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
cargo run -q --release --manifest-path "$root/tools/capnp-gen/Cargo.toml" -- "$root" "$out"
target="$root/host/src/profile/profile_capnp.rs"
if [[ "${1:-}" == "--check" ]]; then
    diff -u "$target" "$out/profile_capnp.rs" >/dev/null || { echo "profile_capnp.rs is stale: run scripts/gen-capnp.sh" >&2; exit 1; }
    echo "profile_capnp.rs matches schema/profile.capnp"
else
    cp "$out/profile_capnp.rs" "$target"
    echo "wrote $target"
fi
