#!/usr/bin/env python3
"""Small ONNX models for the importer's tests (docs/onnx.md), written with the `onnx` package's
helpers in the forms torch exports, and their outputs from onnxruntime (the independent
reference).

    python3 scripts/onnx_models.py OUT_DIR [NAME ...]

For each model NAME: OUT_DIR/NAME.onnx (weights in OUT_DIR/NAME.onnx.data when the model is
written with external data), OUT_DIR/NAME.in.<input>.npy and OUT_DIR/NAME.ref.<output>.npy.
Weights, biases and LayerNorm affine parameters are random (seeded), so every path is exercised.
"""
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OPSET = 18


class G:
    """A graph under construction: nodes in order, initializers, unique names."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0

    def name(self, base):
        self.n += 1
        return f"{base}_{self.n}"

    def w(self, shape, scale=None, base="w"):
        fan = shape[0] if len(shape) > 1 else 1
        scale = scale if scale is not None else 1.0 / np.sqrt(fan)
        v = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return self.const(v, base)

    def const(self, v, base="c"):
        n = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(v), n))
        return n

    def op(self, kind, inputs, outputs=1, **attrs):
        outs = [self.name(kind.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(kind, inputs, outs, name=self.name(kind), **attrs))
        return outs[0] if outputs == 1 else outs

    def linear(self, x, din, dout, bias=True):
        y = self.op("MatMul", [x, self.w([din, dout])])
        return self.op("Add", [y, self.w([dout], 0.5, "b")]) if bias else y

    def ln_decomposed(self, x, d, eps=1e-6):
        ax = self.const(np.array([-1], np.int64), "axes")
        m = self.op("ReduceMean", [x, ax])
        dx = self.op("Sub", [x, m])
        p = self.op("Pow", [dx, self.const(np.float32(2.0))])
        v = self.op("ReduceMean", [p, ax])
        s = self.op("Sqrt", [self.op("Add", [v, self.const(np.float32(eps))])])
        y = self.op("Div", [dx, s])
        y = self.op("Mul", [y, self.w([d], 0.3, "g") ])
        y = self.op("Add", [y, self.w([d], 0.3, "beta")])
        return y

    def ln(self, x, d, eps=1e-6):
        g = self.const((1 + 0.3 * self.rng.standard_normal(d)).astype(np.float32), "gamma")
        b = self.w([d], 0.3, "beta")
        return self.op("LayerNormalization", [x, g, b], axis=-1, epsilon=eps)

    def gelu_tanh(self, x):
        c = lambda v: self.const(np.float32(v))
        cube = self.op("Pow", [x, c(3.0)])
        inner = self.op("Add", [x, self.op("Mul", [c(0.044715), cube])])
        t = self.op("Tanh", [self.op("Mul", [c(0.7978845608028654), inner])])
        return self.op("Mul", [self.op("Mul", [c(0.5), x]), self.op("Add", [c(1.0), t])])

    def gelu_erf(self, x):
        c = lambda v: self.const(np.float32(v))
        e = self.op("Erf", [self.op("Div", [x, c(1.4142135381698608)])])
        return self.op("Mul", [self.op("Mul", [x, self.op("Add", [e, c(1.0)])]), c(0.5)])

    def heads(self, x, t, h, dh, perm):
        # The legacy exporter's shape arithmetic: the batch size read from the tensor itself.
        batch = self.op("Gather", [self.op("Shape", [x]), self.const(np.int64(0))], axis=0)
        batch = self.op("Unsqueeze", [batch, self.const(np.array([0], np.int64))])
        rest = self.const(np.array([t, h, dh], np.int64))
        shape = self.op("Concat", [batch, rest], axis=0)
        return self.op("Transpose", [self.op("Reshape", [x, shape])], perm=perm)

    def save(self, path, inputs, outputs, external=False):
        graph = helper.make_graph(self.nodes, path.stem, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 9
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        if external:
            onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=path.name + ".data", size_threshold=256)
        else:
            onnx.save_model(model, str(path))


def tensor(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def mlp(g):
    x = "x"
    h = g.gelu_erf(g.linear(x, 40, 64))
    return [tensor(x, [1, 8, 40])], {"y": g.linear(h, 64, 40)}


def layernorm(g):
    x = "x"
    y = g.linear(g.ln_decomposed(x, 48), 48, 32)
    return [tensor(x, [1, 10, 48])], {"y": y}


def gelu(g):
    x = "x"
    return [tensor(x, [1, 12, 32])], {"y": g.gelu_tanh(g.linear(x, 32, 56))}


def attention(g, t=13, d=48, h=4):
    dh = d // h
    x = "x"
    n = g.ln(x, d)
    q = g.heads(g.linear(n, d, d), t, h, dh, [0, 2, 1, 3])
    k = g.heads(g.linear(n, d, d), t, h, dh, [0, 2, 3, 1])
    v = g.heads(g.linear(n, d, d), t, h, dh, [0, 2, 1, 3])
    s = g.op("Mul", [g.op("MatMul", [q, k]), g.const(np.float32(1 / np.sqrt(dh)))])
    o = g.op("MatMul", [g.op("Softmax", [s], axis=-1), v])
    o = g.op("Reshape", [g.op("Transpose", [o], perm=[0, 2, 1, 3]), g.const(np.array([1, t, d], np.int64))])
    y = g.op("Add", [g.linear(o, d, d), x])
    return [tensor(x, [1, t, d])], {"y": y}


def patch(g, c=3, side=28, k=14, d=32):
    x = "pixel_values"
    conv = g.op("Conv", [x, g.w([d, c, k, k], 0.05), g.w([d], 0.5, "b")], kernel_shape=[k, k], strides=[k, k])
    p = (side // k) ** 2
    flat = g.op("Reshape", [conv, g.const(np.array([1, d, p], np.int64))])
    e = g.op("Transpose", [flat], perm=[0, 2, 1])
    e = g.op("Add", [e, g.w([1, p, d], 0.5, "pos")])
    return [tensor(x, [1, c, side, side])], {"embeddings": g.ln(e, d)}


def patch_crop(g):
    # Sides that are not multiples of the kernel: the convolution drops the last pixels (as
    # SigLIP So400m's 384-pixel image with 14-pixel patches does).
    return patch(g, side=31, k=14, d=24)


def gemm(g):
    x = "x"
    y = g.op("Gemm", [x, g.w([24, 40]), g.w([24], 0.5, "b")], transB=1, alpha=0.5)
    return [tensor(x, [6, 40])], {"y": y}


def gemm_const_a(g):
    # A constant left operand stored transposed (transA): Y = Aᵀ·X + C.
    x = "x"
    y = g.op("Gemm", [g.w([40, 16]), x, g.w([16, 8], 0.5, "c")], transA=1)
    return [tensor(x, [40, 8])], {"y": y}


def unfamiliar(g):
    # Elementwise compositions no fused kernel computes: each step becomes an op of its own.
    x = "x"
    h = g.linear(x, 32, 48)
    one = g.const(np.float32(1.0))
    silu = g.op("Mul", [h, g.op("Sigmoid", [h])])
    ratio = g.op("Div", [g.op("Tanh", [h]), g.op("Add", [g.op("Mul", [h, h]), one])])
    root = g.op("Sqrt", [g.op("Add", [g.op("Pow", [h, g.const(np.float32(2.0))]), one])])
    decay = g.op("Exp", [g.op("Neg", [g.op("Abs", [h])])])
    half_erf = g.op("Mul", [g.op("Erf", [h]), g.const(np.float32(0.5))])
    softplus = g.op("Log", [g.op("Add", [g.op("Exp", [h]), one])])
    power = g.op("Pow", [g.op("Add", [g.op("Abs", [h]), one]), g.const(np.float32(1.5))])
    cube = g.op("Pow", [h, g.const(np.float32(3.0))])
    terms = [silu, ratio, root, decay, half_erf, softplus, power, cube]
    total = terms[0]
    for t in terms[1:]:
        total = g.op("Add", [total, t])
    # A division by another computed tensor.
    gate = g.op("Add", [g.op("Abs", [g.linear(x, 32, 48)]), one])
    y = g.linear(g.op("Div", [total, gate]), 48, 16)
    return [tensor(x, [1, 7, 32])], {"y": y}


def select(g):
    # Boxes of computed tensors: a Slice of tokens and columns, and a Gather of one token (a ViT's
    # class token), each feeding a projection.
    x = "x"
    h = g.linear(x, 32, 48)
    i64 = lambda v: g.const(np.array(v, np.int64))
    part = g.op("Slice", [h, i64([1, 8]), i64([9, 40]), i64([1, 2])])
    first = g.op("Gather", [h, g.const(np.array(0, np.int64))], axis=1)
    return [tensor(x, [1, 10, 32])], {"part": g.linear(part, 32, 16), "first": g.linear(first, 48, 8)}


MODELS = {"mlp": mlp, "layernorm": layernorm, "gelu": gelu, "attention": attention, "patch": patch,
          "patch_crop": patch_crop, "gemm": gemm, "gemm_const_a": gemm_const_a, "unfamiliar": unfamiliar, "select": select}
EXTERNAL = {"attention"}


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    names = sys.argv[2:] or list(MODELS)
    for i, name in enumerate(names):
        g = G(100 + i)
        inputs, outs = MODELS[name](g)
        path = out / f"{name}.onnx"
        # Outputs get the names the user sees.
        for k, v in outs.items():
            g.nodes.append(helper.make_node("Identity", [v], [k], name=f"out_{k}"))
        g.save(path, inputs, [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in outs],
               external=name in EXTERNAL)
        feeds = {}
        for vi in inputs:
            dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            feeds[vi.name] = np.random.default_rng(7 + i).standard_normal(dims).astype(np.float32)
            np.save(out / f"{name}.in.{vi.name}.npy", feeds[vi.name])
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        for k, v in zip(outs, sess.run(list(outs), feeds)):
            np.save(out / f"{name}.ref.{k}.npy", v)
        print(name, path)


if __name__ == "__main__":
    main()
