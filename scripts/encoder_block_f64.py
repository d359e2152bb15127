#!/usr/bin/env python3
"""An f64 NumPy implementation of scripts/make_encoder_block.py's block, written independently of
the compiler, compared with a device output. Every value is f64 except where the model itself asks
for a rounding: Q and K are cast to FP8 (`f8e4m3` = ml_dtypes `float8_e4m3fnuz`) before Q·Kᵀ, as
the model's `cast` ops say; nothing else is rounded (no f16 anywhere after the given inputs and
weights). Usage: python3 scripts/encoder_block_f64.py MODEL_DIR X.npy Y.npy HEADS
Prints `cosine=… max_rel=…` (max |Y − ref| / max |ref|) and exits 1 unless cosine ≥ 0.999 and
max_rel ≤ 1e-2 (the issue's tolerance)."""
import math
import pathlib
import sys

import ml_dtypes
import numpy as np

d = pathlib.Path(sys.argv[1])
x = np.load(sys.argv[2]).astype(np.float64)
y = np.load(sys.argv[3]).astype(np.float64)
H = int(sys.argv[4])
p = {f.stem: np.load(f).astype(np.float64) for f in d.glob("*.npy")}


def ln(v, g, b, eps=1e-6):
    mu = v.mean(-1, keepdims=True)
    var = ((v - mu) ** 2).mean(-1, keepdims=True)
    return (v - mu) / np.sqrt(var + eps) * g + b


def gelu_tanh(v):
    return 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))


T, D = x.shape
dh = D // H
n1 = ln(x, p["ln1_g"], p["ln1_b"])
q, k, v = ((n1 @ p[f"W{w}"] + p[f"b{w}"]).reshape(T, H, dh).transpose(1, 0, 2) for w in "qkv")
fp8 = lambda a: a.astype(np.float32).astype(ml_dtypes.float8_e4m3fnuz).astype(np.float64)  # noqa: E731
s = fp8(q) @ fp8(k).transpose(0, 2, 1) / math.sqrt(dh)
s = np.exp(s - s.max(-1, keepdims=True))
o = (s / s.sum(-1, keepdims=True)) @ v
h = o.transpose(1, 0, 2).reshape(T, D) @ p["Wo"] + p["bo"] + x
ref = gelu_tanh(ln(h, p["ln2_g"], p["ln2_b"]) @ p["W1"] + p["b1"]) @ p["W2"] + p["b2"] + h
cos = float((y * ref).sum() / (np.linalg.norm(y) * np.linalg.norm(ref)))
rel = float(np.abs(y - ref).max() / np.abs(ref).max())
print(f"cosine={cos:.6f} max_rel={rel:.3e}")
sys.exit(0 if cos >= 0.999 and rel <= 1e-2 else 1)
