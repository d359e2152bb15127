#!/usr/bin/env python3
"""Write one SigLIP So400m MLP-up stage as a model: layernorm -> FP8 cast -> FP8 matmul
729x1152 . 1152x4304 + bias -> tanh GeLU, with random params (m.toml, w.npy, b.npy in OUTDIR).
With `--qproj`: an f16 attention projection instead, layernorm -> matmul 729x1152 . 1152x1152 + bias.

They reproduce the planning-cost figures of issue #13/#14 without the 1.7 GB So400m export:
    python3 scripts/mlp_fp8_model.py /tmp/mlp8
    ipu-codegen -v build /tmp/mlp8/m.toml -o /tmp/mlp8/m.ipuexe --tiles 736 --search-attempts 0
"""
import sys
from pathlib import Path

import numpy as np

def model(name, output, wdtype, wscale, n, ops):
    """The model text: input X [729, 1152], params W [1152, n] (`wscale`: its scale line) and b [n], `ops`."""
    return f"""name = "{name}"
outputs = ["{output}"]
[inputs.X]
dtype = "f16"
shape = [729, 1152]
[params.W]
dtype = "{wdtype}"
shape = [1152, {n}]
{wscale}file = "w.npy"
[params.b]
dtype = "f16"
shape = [{n}]
file = "b.npy"
[[ops]]
op = "layernorm"
input = "X"
output = "XN"
dtype = "f16"
{ops}"""


def matmul_bias(a):
    """`a`·W as Y, then Y + b as Yb (both stages end this way)."""
    return f"""[[ops]]
op = "matmul"
a = "{a}"
b = "W"
output = "Y"
dtype = "f16"
accumulate = "f16"
[[ops]]
op = "add"
a = "Y"
b = "b"
output = "Yb"
dtype = "f16"
"""


MLP_OPS = """[[ops]]
op = "cast"
input = "XN"
output = "X8"
dtype = "f8e4m3"
scale = -4
""" + matmul_bias("X8") + """[[ops]]
op = "gelu"
input = "Yb"
output = "H"
dtype = "f16"
approximate = "tanh"
"""

QPROJ_OPS = matmul_bias("XN")


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    n = 1152 if "--qproj" in sys.argv[2:] else 4304
    rng = np.random.default_rng(0)
    np.save(out / "w.npy", (rng.standard_normal((1152, n)) * 0.03).astype(np.float32))
    np.save(out / "b.npy", (rng.standard_normal((n,)) * 0.1).astype(np.float32))
    if n == 1152:
        text = model("qproj", "Yb", "f16", "", n, QPROJ_OPS)
    else:
        text = model("mlp8", "H", "f8e4m3", "scale = -8\n", n, MLP_OPS)
    (out / "m.toml").write_text(text)
    print(out / "m.toml")


if __name__ == "__main__":
    main()
