#!/usr/bin/env python3
"""FP8 conversion tables from ml_dtypes, as SHA-256 digests (one line per table).

encode FMT SCALE: for every f16 bit pattern 0..65535, the code of float8_FMT(f32(x) / 2**SCALE).
decode FMT SCALE: for every code 0..255, the f16 bits (little-endian) of f16(f32(code) * 2**SCALE);
                  NaN results are written as 0x7e00 (payloads are not compared).
tests/tests/fp8_mldtypes.rs computes the same tables with ipu_core::fp8 and compares the digests;
.ci/run regenerates this file's output and diffs it against tests/data/fp8_mldtypes.txt.
"""
import hashlib
import ml_dtypes
import numpy as np

FORMATS = {"e4m3": ml_dtypes.float8_e4m3fnuz, "e5m2": ml_dtypes.float8_e5m2fnuz}
SCALES = [0, 1, 3, -2, -5, 7, 12, -20, 31, -32]

def main():
    halves = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    codes = np.arange(256, dtype=np.uint8)
    for name, f8 in FORMATS.items():
        for s in SCALES:
            with np.errstate(all="ignore"):
                enc = (halves / np.float32(2.0 ** s)).astype(f8).view(np.uint8)
            print(f"encode {name} {s} {hashlib.sha256(enc.tobytes()).hexdigest()}")
    for name, f8 in FORMATS.items():
        for s in SCALES:
            with np.errstate(all="ignore"):
                dec = (codes.view(f8).astype(np.float32) * np.float32(2.0 ** s)).astype(np.float16)
            bits = dec.view(np.uint16).copy()
            bits[np.isnan(dec)] = 0x7E00
            print(f"decode {name} {s} {hashlib.sha256(bits.astype('<u2').tobytes()).hexdigest()}")

if __name__ == "__main__":
    main()
