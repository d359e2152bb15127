#!/usr/bin/env python3
"""Read an ipu-codegen profile with pycapnp (an independent reader of schema/profile.capnp).

Usage: read_profile.py SCHEMA PROFILE
Prints one JSON object: tile count, samples, phase names, tile-cycles per kind, and per tile the
first start and last end. The Rust test host/tests/profile.rs compares it with its own decoding.
"""
import json
import sys

import capnp  # pycapnp

capnp.remove_import_hook()


def main():
    schema = capnp.load(sys.argv[1])
    with open(sys.argv[2], "rb") as f:
        data = f.read()
    with schema.Profile.from_bytes(data, traversal_limit_in_words=len(data) // 8 * 4 + 1024) as p:
        kinds = {}
        spans = []
        samples = 0
        for t in p.tiles:
            first = None
            last = None
            for s in t.samples:
                kinds[str(s.kind)] = kinds.get(str(s.kind), 0) + (s.end - s.start)
                first = s.start if first is None else first
                last = s.end
                samples += 1
            spans.append([t.tile, first, last, t.memory.tensors])
        out = {
            "schemaVersion": p.schemaVersion,
            "tileCount": p.tileCount,
            "runCycles": p.runCycles,
            "phaseNames": list(p.phaseNames),
            "kernelNames": list(p.kernelNames),
            "samples": samples,
            "kindCycles": kinds,
            "tiles": spans,
        }
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
