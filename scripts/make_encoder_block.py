#!/usr/bin/env python3
"""Writes a pre-LayerNorm ViT encoder block as a model (encoder_block.toml) with small
deterministic f16 weights (.npy params) into OUT_DIR:

    h = X + Wo·merge(softmax(alpha · fp8(Q)·fp8(K)ᵀ)·V) + bo,  Q/K/V = heads(LN1(X)·Wq/k/v + b)
    Y = h + W2·gelu_tanh(W1·LN2(h) + b1) + b2

With --fp8 the weight matrices are E4M3 params (scale 2^-5, from the same f16 files) and each
activation is cast to E4M3 once before the matmuls that read it (LN1's output once for Q, K
and V): FP8 GEMMs with f16 accumulation, as issue 36's FP8 block.

Usage: python3 scripts/make_encoder_block.py OUT_DIR [--tokens 50] [--width 96] [--heads 3]
       [--mlp 384] [--seed 0] [--fp8]
`examples/encoder_block/` is this script's output with the defaults (committed); the tests use it
for other shapes. Needs numpy."""
import argparse
import math
import pathlib

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--tokens", type=int, default=50)
ap.add_argument("--width", type=int, default=96)
ap.add_argument("--heads", type=int, default=3)
ap.add_argument("--mlp", type=int, default=384)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--fp8", action="store_true", help="E4M3 weights and activations cast before the GEMMs")
a = ap.parse_args()
T, D, H, F = a.tokens, a.width, a.heads, a.mlp
assert D % H == 0, "width must be a multiple of heads"
dh = D // H
out = pathlib.Path(a.out)
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(a.seed)

params = {}


def param(name, shape, kind):
    if kind == "w":
        v = rng.standard_normal(shape) / math.sqrt(shape[0])
    elif kind == "gamma":
        v = 1.0 + 0.2 * rng.standard_normal(shape)
    else:
        v = 0.1 * rng.standard_normal(shape)
    np.save(out / f"{name}.npy", v.astype(np.float16))
    params[name] = list(shape)


for w in "qkvo":
    param(f"W{w}", (D, D), "w")
    param(f"b{w}", (D,), "b")
param("ln1_g", (D,), "gamma")
param("ln1_b", (D,), "b")
param("ln2_g", (D,), "gamma")
param("ln2_b", (D,), "b")
param("W1", (D, F), "w")
param("b1", (F,), "b")
param("W2", (F, D), "w")
param("b2", (D,), "b")

lines = [
    f"# Pre-LN ViT encoder block: {T} tokens, width {D}, {H} heads of {dh}, MLP {F}.",
    "# Written by scripts/make_encoder_block.py (weights: the .npy files beside this file).",
    'name = "encoder_block"',
    'outputs = ["Y"]',
    "",
    "[inputs.X]",
    'dtype = "f16"',
    f"shape = [{T}, {D}]",
    "",
]
W_SCALE = -5  # a weight code c stands for c * 2^-5 (|w| <= 7.5 fits E4M3's 240)
for name, shape in params.items():
    if a.fp8 and name.startswith("W"):
        lines += [f"[params.{name}]", 'dtype = "f8e4m3"', f"scale = {W_SCALE}", f"shape = {shape}"]
        lines += [f'file = "{name}.npy"', ""]
    else:
        lines += [f"[params.{name}]", 'dtype = "f16"', f"shape = {shape}", f'file = "{name}.npy"', ""]


def op(**kw):
    lines.append("[[ops]]")
    for k, v in kw.items():
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, str):
            v = f'"{v}"'
        lines.append(f"{k} = {v}")
    lines.append("")


def gemm_input(x):
    """The matmul operand for activation x: x itself, or (--fp8) its E4M3 cast (scale 0)."""
    if not a.fp8:
        return x
    op(op="cast", input=x, output=f"{x}8", dtype="f8e4m3", scale=0)
    return f"{x}8"


op(op="layernorm", input="X", gamma="ln1_g", beta="ln1_b", eps=1e-6, output="n1", dtype="f16")
n1 = gemm_input("n1")
for w in "qkv":
    op(op="matmul", a=n1, b=f"W{w}", output=f"{w}_p", dtype="f16", accumulate="f16")
    op(op="add", a=f"{w}_p", b=f"b{w}", output=f"{w}_f", dtype="f16")
    op(op="reshape", input=f"{w}_f", shape=[T, H, dh], output=f"{w}_r", dtype="f16")
    op(op="transpose", input=f"{w}_r", perm=[1, 0, 2], output=f"{w}_h", dtype="f16")
op(op="transpose", input="k_h", perm=[0, 2, 1], output="k_t", dtype="f16")
op(op="cast", input="q_h", output="q8", dtype="f8e4m3")
op(op="cast", input="k_t", output="k8", dtype="f8e4m3")
op(op="matmul", a="q8", b="k8", alpha=1 / math.sqrt(dh), output="S", dtype="f16", accumulate="f16")
op(op="softmax", input="S", output="P", dtype="f16")
op(op="matmul", a="P", b="v_h", output="O", dtype="f16", accumulate="f16")
op(op="transpose", input="O", perm=[1, 0, 2], output="O_t", dtype="f16")
op(op="reshape", input="O_t", shape=[T, D], output="O_m", dtype="f16")
op(op="matmul", a=gemm_input("O_m"), b="Wo", output="o_p", dtype="f16", accumulate="f16")
op(op="add", a="o_p", b="bo", output="o_b", dtype="f16")
op(op="add", a="o_b", b="X", output="h", dtype="f16")
op(op="layernorm", input="h", gamma="ln2_g", beta="ln2_b", eps=1e-6, output="n2", dtype="f16")
op(op="matmul", a=gemm_input("n2"), b="W1", output="u_p", dtype="f16", accumulate="f16")
op(op="add", a="u_p", b="b1", output="u_b", dtype="f16")
op(op="gelu", input="u_b", output="u", dtype="f16", approximate="tanh")
op(op="matmul", a=gemm_input("u"), b="W2", output="d_p", dtype="f16", accumulate="f16")
op(op="add", a="d_p", b="b2", output="d_b", dtype="f16")
op(op="add", a="d_b", b="h", output="Y", dtype="f16")
(out / "encoder_block.toml").write_text("\n".join(lines))
print(f"wrote {out / 'encoder_block.toml'} and {len(params)} weight files")
