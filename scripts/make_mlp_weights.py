#!/usr/bin/env python3
"""Writes the small deterministic weights of examples/mlp/ (f16 .npy): an MLP-up block
Y = gelu_tanh(X·W1 + b1) with W1 [96, 384] and b1 [384], as a pre-LN ViT's MLP starts.
Usage: python3 scripts/make_mlp_weights.py  (needs numpy; the files are committed)."""
import pathlib
import numpy as np

out = pathlib.Path(__file__).resolve().parent.parent / "examples" / "mlp"
rng = np.random.default_rng(20261203)
np.save(out / "w1.npy", (rng.standard_normal((96, 384)) / np.sqrt(96)).astype(np.float16))
np.save(out / "b1.npy", (rng.standard_normal(384) * 0.1).astype(np.float16))
print(f"wrote {out / 'w1.npy'} and {out / 'b1.npy'}")
