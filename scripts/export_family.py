#!/usr/bin/env python3
"""Export the everyday models of issue #40 from torch/transformers to ONNX as a new user would
(`torch.onnx.export`, the default exporter, opset 18), with onnxruntime's outputs as the reference
(docs/onnx.md). Needs torch, transformers, onnx, onnxscript and onnxruntime; not run in CI (torch
is large): its output for the default sizes is committed in tests/data/onnx/family/ and read by
tests/tests/onnx_family.rs.

    python3 scripts/export_family.py OUT_DIR [--models mlp,acts,vit,clip,dinov2,bert,bert_mask]
        [--image 64 --patch 16 --width 96 --layers 2 --heads 4 --tokens 16 --seed 0 --attn eager]
        [--mlp 0 --vocab 1000] [--suffix _sdpa]

The committed fixtures: the default run (eager attention), and `--models vit,dinov2,bert --attn
sdpa --suffix _sdpa` (transformers' default attention, which torch writes with a zero mask and a
NaN guard around the softmax).

For each model NAME writes OUT_DIR/NAME.onnx (weights inline when under 2 GB), its inputs
OUT_DIR/NAME.in.INPUT.npy and onnxruntime's outputs OUT_DIR/NAME.ref.OUTPUT.npy. Weights are
random; biases and LayerNorm affine parameters are randomised too (transformers' init leaves them
at 0 and (1, 0), which would leave those paths untested), as are DINOv2's layer scales.
"""
import argparse
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch


def randomise(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
            elif "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "lambda1" in name or "layer_scale" in name:
                p.copy_(0.5 + 0.2 * torch.randn_like(p))
            elif "cls_token" in name or "class_embedding" in name or "position_embeddings" in name:
                p.copy_(0.5 * torch.randn_like(p))
    return model.eval()


class Outputs(torch.nn.Module):
    """A transformers model returning (last_hidden_state, pooler_output) as a tuple."""

    def __init__(self, m, key):
        super().__init__()
        self.m, self.key = m, key

    def forward(self, x):
        out = self.m(**{self.key: x})
        return out.last_hidden_state, out.pooler_output


class Masked(torch.nn.Module):
    """BertModel with an attention mask: (input_ids, attention_mask) → (last_hidden_state,
    pooler_output)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        out = self.m(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state, out.pooler_output


class Mlp(torch.nn.Module):
    """Linear → ReLU → Linear."""

    def __init__(self, d, h):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.ReLU(), torch.nn.Linear(h, d))

    def forward(self, x):
        return self.net(x)


class Acts(torch.nn.Module):
    """The everyday activations between linears: LeakyReLU, Hardswish, ReLU6 (Clip), SiLU,
    Hardsigmoid, and a clamp (Max/Min or Clip with constants)."""

    def __init__(self, d):
        super().__init__()
        self.l = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(5))
        self.acts = [torch.nn.LeakyReLU(0.1), torch.nn.Hardswish(), torch.nn.ReLU6(), torch.nn.SiLU(),
                     torch.nn.Hardsigmoid()]

    def forward(self, x):
        for lin, act in zip(self.l, self.acts):
            x = act(lin(3.0 * x))
        return torch.clamp(x, min=0.25, max=0.75)


def vision(kind, a):
    from transformers import (CLIPVisionConfig, CLIPVisionModel, Dinov2Config, Dinov2Model, ViTConfig,
                              ViTModel)
    common = dict(image_size=a.image, patch_size=a.patch, hidden_size=a.width, num_hidden_layers=a.layers,
                  num_attention_heads=a.heads, intermediate_size=a.mlp or 2 * a.width)
    if kind == "vit":
        m = ViTModel(ViTConfig(**common, attn_implementation=a.attn))
    elif kind == "clip":
        m = CLIPVisionModel(CLIPVisionConfig(**common, attn_implementation=a.attn))
    else:
        m = Dinov2Model(Dinov2Config(**common, mlp_ratio=(a.mlp or 2 * a.width) // a.width,
                                     attn_implementation=a.attn))
    return Outputs(randomise(m), "pixel_values"), torch.randn(1, 3, a.image, a.image), "pixel_values"


def bert(a, masked):
    """BERT on token ids; with `masked`, also an attention mask whose last quarter is padding."""
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=a.vocab, hidden_size=a.width, num_hidden_layers=a.layers,
                     num_attention_heads=a.heads, intermediate_size=a.mlp or 2 * a.width,
                     max_position_embeddings=max(64, a.tokens), attn_implementation=a.attn)
    ids = torch.randint(0, cfg.vocab_size, (1, a.tokens), dtype=torch.int64)
    m = randomise(BertModel(cfg))
    if not masked:
        return Outputs(m, "input_ids"), (ids,), ["input_ids"]
    mask = torch.ones(1, a.tokens, dtype=torch.int64)
    mask[0, a.tokens - a.tokens // 4:] = 0
    return Masked(m), (ids, mask), ["input_ids", "attention_mask"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--models", default="mlp,acts,vit,clip,dinov2,bert,bert_mask")
    ap.add_argument("--image", type=int, default=64)
    ap.add_argument("--patch", type=int, default=16)
    ap.add_argument("--width", type=int, default=96)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--mlp", type=int, default=0, help="MLP hidden width (default 2 × width)")
    ap.add_argument("--vocab", type=int, default=1000, help="BERT vocabulary")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--opset", type=int, default=18)
    ap.add_argument("--attn", default="eager", help="transformers attn_implementation (eager or sdpa)")
    ap.add_argument("--suffix", default="", help="appended to each file's model name (vit_sdpa.onnx, …)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in a.models.split(","):
        torch.manual_seed(a.seed)
        outs = ["last_hidden_state", "pooler_output"]
        if name == "mlp":
            model, xs, names = Mlp(a.width, 2 * a.width).eval(), (torch.randn(a.tokens, a.width),), ["x"]
            outs = ["y"]
        elif name == "acts":
            model, xs, names = Acts(a.width).eval(), (torch.randn(1, a.tokens, a.width),), ["x"]
            outs = ["y"]
        elif name in ("bert", "bert_mask"):
            model, xs, names = bert(a, name == "bert_mask")
        else:
            model, x, xin = vision(name, a)
            xs, names = (x,), [xin]
        stem = name + a.suffix
        path = out / f"{stem}.onnx"
        # Inline weights under 2 GB (protobuf's limit); base sizes (ViT-B, BERT-base) are under it.
        torch.onnx.export(model, xs, str(path), opset_version=a.opset, input_names=names, output_names=outs,
                          external_data=False)
        for n, x in zip(names, xs):
            np.save(out / f"{stem}.in.{n}.npy", x.numpy())
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = sess.run(None, {n: x.numpy() for n, x in zip(names, xs)})
        with torch.no_grad():
            want = model(*xs)
        want = want if isinstance(want, tuple) else (want,)
        for o, g, w in zip([o.name for o in sess.get_outputs()], got, want):
            np.save(out / f"{stem}.ref.{o}.npy", g.astype(np.float32))
            d = np.abs(g - w.numpy()).max()
            print(f"{stem}: {o} {tuple(g.shape)}, onnxruntime vs torch max |diff| {d:.2e}")


if __name__ == "__main__":
    main()
