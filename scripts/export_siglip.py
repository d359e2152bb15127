#!/usr/bin/env python3
"""Export a SigLIP vision tower from transformers to ONNX with both torch exporters, plus the
FP32 reference outputs (docs/onnx.md). Needs torch, transformers, onnxscript and onnxruntime;
not run in CI (torch is large): its output for the default config is committed as the test
fixture tests/data/onnx/siglip_tiny/, and with `--attn sdpa --exporters dynamo` (transformers'
default attention) as tests/data/onnx/siglip_tiny_sdpa/.

    python3 scripts/export_siglip.py OUT_DIR [--image 56 --patch 14 --width 96 --layers 2
        --heads 4 --mlp 192 --seed 0]

Writes OUT_DIR/dynamo.onnx + dynamo.onnx.data (torch's default exporter, weights as external
data), OUT_DIR/legacy.onnx (dynamo=False, weights inline), OUT_DIR/pixel_values.npy and the
torch FP32 outputs OUT_DIR/ref.pooler_output.npy, OUT_DIR/ref.last_hidden_state.npy. Biases and
LayerNorm affine parameters are randomised (HF's init leaves them at 0 and (1, 0), which would
leave those paths untested).
"""
import argparse
from pathlib import Path

import numpy as np
import torch
from transformers import SiglipVisionConfig, SiglipVisionModel


class Tower(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, pixel_values):
        out = self.m(pixel_values=pixel_values)
        return out.last_hidden_state, out.pooler_output


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--image", type=int, default=56)
    ap.add_argument("--patch", type=int, default=14)
    ap.add_argument("--width", type=int, default=96)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--mlp", type=int, default=192)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--opset", type=int, default=18)
    ap.add_argument("--attn", default="eager", help="transformers attn_implementation (eager or sdpa)")
    ap.add_argument("--exporters", default="dynamo,legacy",
                    help="which exporters to run (the legacy one inlines weights: at most 2 GB)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(a.seed)
    cfg = SiglipVisionConfig(
        image_size=a.image, patch_size=a.patch, hidden_size=a.width, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, intermediate_size=a.mlp, vision_use_head=True,
        attn_implementation=a.attn,
    )
    model = SiglipVisionModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
            elif "layernorm" in name or "layer_norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("probe"):
                p.copy_(torch.randn_like(p))
    tower = Tower(model).eval()
    x = torch.randn(1, 3, a.image, a.image)
    with torch.no_grad():
        last, pooled = tower(x)
    np.save(out / "pixel_values.npy", x.numpy())
    np.save(out / "ref.last_hidden_state.npy", last.numpy())
    np.save(out / "ref.pooler_output.npy", pooled.numpy())
    names = dict(input_names=["pixel_values"], output_names=["last_hidden_state", "pooler_output"])
    which = a.exporters.split(",")
    if "dynamo" in which:
        torch.onnx.export(tower, (x,), str(out / "dynamo.onnx"), opset_version=a.opset, dynamo=True,
                          external_data=True, **names)
    if "legacy" in which:
        torch.onnx.export(tower, (x,), str(out / "legacy.onnx"), opset_version=a.opset, dynamo=False, **names)
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {out}: {params} params, last_hidden_state {tuple(last.shape)}, pooler_output {tuple(pooled.shape)}")


if __name__ == "__main__":
    main()
