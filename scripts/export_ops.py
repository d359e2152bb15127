#!/usr/bin/env python3
"""Export small torch models that use the ops of issue #40 the family's fixtures do not: ReduceMean
and ReduceSum over the last axis of a computed tensor, and Where with a constant condition (a
causal mask, a fixed selection between two computed tensors). Written by `torch.onnx.export`
(the default exporter, opset 18) as a user would, with onnxruntime's outputs as the reference
(docs/onnx.md). Needs torch, onnx, onnxscript and onnxruntime; not run in CI: its output is
committed in tests/data/onnx/ops/ and read by tests/tests/onnx_reduce_where.rs.

    python3 scripts/export_ops.py OUT_DIR [--tokens 16 --width 40 --seed 0]

For each model NAME writes OUT_DIR/NAME.onnx, its input OUT_DIR/NAME.in.x.npy and onnxruntime's
output OUT_DIR/NAME.ref.y.npy:
- `reduce`: Linear, then an RMS norm `h / sqrt(mean(h²) + eps)`, a centring `h − mean(h)` and
  `0.1·sum(h)` (keepdim), a Linear.
- `where`: causal self-attention of one head (the scores' upper triangle filled with −inf by
  `masked_fill` of a constant mask), and `torch.where` of a constant mask between two Linears.
"""
import argparse
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch


class Reduce(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.a = torch.nn.Linear(width, width)
        self.b = torch.nn.Linear(width, width)

    def forward(self, x):
        h = self.a(x)
        rms = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        centred = h - h.mean(-1, keepdim=True)
        return self.b(rms + centred + 0.1 * h.sum(-1, keepdim=True))


class Where(torch.nn.Module):
    def __init__(self, tokens, width):
        super().__init__()
        self.q = torch.nn.Linear(width, width)
        self.k = torch.nn.Linear(width, width)
        self.v = torch.nn.Linear(width, width)
        self.u = torch.nn.Linear(width, width)
        causal = torch.ones(tokens, tokens).tril().bool()
        self.register_buffer("future", ~causal)
        self.register_buffer("pick", torch.rand(tokens, width) < 0.5)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
        s = s.masked_fill(self.future, float("-inf"))
        att = torch.softmax(s, dim=-1) @ v
        return torch.where(self.pick, att, self.u(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--width", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ["reduce", "where"]:
        torch.manual_seed(a.seed)
        model = (Reduce(a.width) if name == "reduce" else Where(a.tokens, a.width)).eval()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("bias"):
                    p.copy_(0.2 * torch.randn_like(p))
        x = torch.randn(1, a.tokens, a.width)
        path = out / f"{name}.onnx"
        torch.onnx.export(model, (x,), str(path), opset_version=18, input_names=["x"], output_names=["y"],
                          external_data=False)
        np.save(out / f"{name}.in.x.npy", x.numpy())
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (got,) = sess.run(None, {"x": x.numpy()})
        np.save(out / f"{name}.ref.y.npy", got.astype(np.float32))
        with torch.no_grad():
            d = np.abs(got - model(x).numpy()).max()
        ops = sorted({n.op_type for n in __import__("onnx").load(str(path)).graph.node})
        print(f"{name}: y {tuple(got.shape)}, onnxruntime vs torch max |diff| {d:.2e}; ops {ops}")


if __name__ == "__main__":
    main()
