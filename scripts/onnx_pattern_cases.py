#!/usr/bin/env python3
"""Small ONNX models that test what the importer fuses (docs/onnx.md "What each pattern checks"):
each recognised pattern in its exact form, and the same graph with one constant or attribute
changed, which must not be fused (it is then written op by op, or refused naming the op).

    python3 scripts/onnx_pattern_cases.py [OUT_DIR]   (default: tests/data/onnx/patterns)

For each case NAME: OUT_DIR/NAME.onnx, OUT_DIR/NAME.in.<input>.npy and OUT_DIR/NAME.ref.<output>.npy
(onnxruntime's outputs, the independent reference). The expected imports are asserted in
tests/tests/onnx.rs (`pattern_cases_fuse_exactly_the_forms_whose_constants_match`). The files are
committed; rerunning the script rewrites them identically (seeded).
"""
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from onnx_models import G, tensor  # noqa: E402

SQRT_2_OVER_PI = 0.7978845608028654
SQRT_2 = 1.4142135381698608


def scalar(g, v, dtype=np.float32):
    return g.const(np.array(v, dtype))


def constant_node(g, v):
    """A `Constant` node holding `v` (the legacy exporter's way of writing constants)."""
    out = g.name("const")
    g.nodes.append(helper.make_node("Constant", [], [out], name=g.name("Constant"),
                                    value=numpy_helper.from_array(np.asarray(v))))
    return out


def ln_written(g, x, square="pow", exponent=None, axes=(-1,), keepdims=1, source="init", eps=1e-5):
    """`(x − mean(x)) / sqrt(mean(d²) + eps)` as torch's legacy exporter writes it; `exponent`
    names the Pow's second input (default: 2.0 from `source`)."""
    make = (lambda v: constant_node(g, v)) if source == "node" else (lambda v: g.const(np.asarray(v)))
    ax = make(np.array(axes, np.int64))
    m = g.op("ReduceMean", [x, ax], keepdims=keepdims)
    d = g.op("Sub", [x, m])
    if square == "mul":
        sq = g.op("Mul", [d, d])
    else:
        sq = g.op("Pow", [d, exponent or make(np.float32(2.0))])
    v = g.op("ReduceMean", [sq, ax], keepdims=keepdims)
    s = g.op("Sqrt", [g.op("Add", [v, make(np.float32(eps))])])
    return g.op("Div", [d, s])


def gelu_tanh(g, x, sqrt_2_over_pi=SQRT_2_OVER_PI, cubic=0.044715, half=0.5, one=1.0):
    cube = g.op("Pow", [x, scalar(g, 3.0)])
    inner = g.op("Add", [x, g.op("Mul", [scalar(g, cubic), cube])])
    t = g.op("Tanh", [g.op("Mul", [scalar(g, sqrt_2_over_pi), inner])])
    return g.op("Mul", [g.op("Mul", [scalar(g, half), x]), g.op("Add", [scalar(g, one), t])])


def gelu_erf(g, x, sqrt_2=SQRT_2, half=0.5, one=1.0):
    e = g.op("Erf", [g.op("Div", [x, scalar(g, sqrt_2)])])
    return g.op("Mul", [g.op("Mul", [x, g.op("Add", [e, scalar(g, one)])]), scalar(g, half)])


def relu(g, x):
    # (x + |x|) / 2, with the ops the importer composes.
    return g.op("Mul", [g.op("Add", [x, g.op("Abs", [x])]), scalar(g, 0.5)])


X = [1, 6, 16]


def ln_case(**kw):
    def case(g):
        return [tensor("x", X)], {"y": ln_written(g, "x", **kw)}
    return case


def ln_pow4(g):
    # The module of issue #38: d = x − mean(x); y = d / sqrt(mean(d⁴) + 1e-5).
    return [tensor("x", X)], {"y": ln_written(g, "x", exponent=scalar(g, 4.0))}


def ln_pow_near2(g):
    # The f32 next to 2: a fourth-power-like typo is not the only way to miss the square.
    return [tensor("x", X)], {"y": ln_written(g, "x", exponent=scalar(g, np.nextafter(np.float32(2), np.float32(3))))}


def ln_cast(g):
    # An integer 2 cast to float (still the square).
    two = g.op("Cast", [constant_node(g, np.int64(2))], to=TensorProto.FLOAT)
    return [tensor("x", X)], {"y": ln_written(g, "x", exponent=two, source="node")}


def ln_identity(g):
    # The exponent read through Identity.
    two = g.op("Identity", [scalar(g, 2.0)])
    return [tensor("x", X)], {"y": ln_written(g, "x", exponent=two)}


def ln_computed_exponent(g):
    # 1 + 1: a value other nodes compute is not stated in the file; not fused.
    two = g.op("Add", [constant_node(g, np.float32(1)), constant_node(g, np.float32(1))])
    return [tensor("x", X)], {"y": ln_written(g, "x", exponent=two, source="node")}


def ln_keepdims0(g):
    # Means without kept axes broadcast along the last axis instead (a square input makes it a
    # valid model): not a LayerNorm.
    return [tensor("x", [1, 16, 16])], {"y": ln_written(g, "x", keepdims=0)}


def ln_eps_rank4(g):
    # An eps of shape [1, 1, 1, 1] broadcasts the rank-3 result to rank 4.
    x = "x"
    ax = g.const(np.array([-1], np.int64))
    d = g.op("Sub", [x, g.op("ReduceMean", [x, ax])])
    v = g.op("ReduceMean", [g.op("Pow", [d, scalar(g, 2.0)]), ax])
    eps = g.const(np.full([1, 1, 1, 1], 1e-5, np.float32))
    return [tensor(x, X)], {"y": g.op("Div", [d, g.op("Sqrt", [g.op("Add", [v, eps])])])}


def ln_affine_alias(g):
    # The LayerNorm's value read through Identity by its affine, and directly as an output: the
    # affine must not be folded into the op the other reader reads.
    v = ln_written(g, "x")
    y = g.op("Add", [g.op("Mul", [g.op("Identity", [v]), g.w([16], 0.3, "g")]), g.w([16], 0.3, "beta")])
    return [tensor("x", X)], {"y": y, "z": v}


def gelu_case(form, **kw):
    def case(g):
        h = g.linear("x", 16, 24)
        return [tensor("x", X)], {"y": (gelu_tanh if form == "tanh" else gelu_erf)(g, h, **kw)}
    return case


def gelu_bump(g):
    # A tanh GeLU plus relu(1/8 − |h − 1/8|): zero at every multiple of 1/4 (the first sample
    # points), up to 1/8 between 0 and 1/4.
    h = g.linear("x", 16, 24)
    e = scalar(g, 0.125)
    bump = relu(g, g.op("Sub", [e, g.op("Abs", [g.op("Sub", [h, e])])]))
    return [tensor("x", X)], {"y": g.op("Add", [gelu_tanh(g, h), bump])}


def scale_softmax(g):
    # Attention's scale after the score matmul: folded into the matmul's alpha.
    h = g.op("MatMul", ["x", g.w([16, 12])])
    return [tensor("x", X)], {"y": g.op("Softmax", [g.op("Mul", [h, scalar(g, 0.125)])], axis=-1)}


def scale_two_readers(g):
    # The scaled scores read by a softmax and by a composition.
    h = g.op("MatMul", ["x", g.w([16, 12])])
    s = g.op("Mul", [h, scalar(g, 0.125)])
    return [tensor("x", X)], {"y": g.op("Softmax", [s], axis=-1), "z": g.op("Tanh", [s])}


def scale_alias(g):
    # The unscaled matmul output read through an Identity by a bias add.
    h = g.op("Identity", [g.op("MatMul", ["x", g.w([16, 12])])])
    y = g.op("Softmax", [g.op("Mul", [h, scalar(g, 0.125)])], axis=-1)
    return [tensor("x", X)], {"y": y, "z": g.op("Add", [h, g.w([12], 0.5, "b")])}


def scale_twice(g):
    # A scaling of an already scaled value (0.5, then 0.5 again).
    h = g.op("MatMul", ["x", g.w([16, 12])])
    s = g.op("Mul", [h, scalar(g, 0.5)])
    y = g.op("Softmax", [s], axis=-1)
    return [tensor("x", X)], {"y": y, "z": g.op("Softmax", [g.op("Mul", [s, scalar(g, 0.5)])], axis=-1)}


def select_transposed_bias(g):
    # A bias added along the tokens of a transposed projection (square: 4 tokens, 4 columns), then
    # one column selected: the bias is not the projection's (per column), so the selection is a
    # slice of the sum, not a narrower projection with that bias.
    h = g.op("Transpose", [g.op("MatMul", ["x", g.w([16, 4])])], perm=[0, 2, 1])
    v = g.op("Add", [h, g.w([4], 0.5, "b")])
    return [tensor("x", [1, 4, 16])], {"y": g.op("Gather", [v, g.const(np.array(1, np.int64))], axis=1)}


def select_batched_weight(g):
    # A constant weight per batch (rank 3), then a Slice of its columns.
    h = g.op("MatMul", ["x", g.w([2, 2, 2])])
    i64 = lambda v: g.const(np.array(v, np.int64))
    return [tensor("x", [2, 4, 2])], {"y": g.op("Slice", [h, i64([0]), i64([1]), i64([2])])}


def scale_operand_and_output(g):
    # A scaled operand (alpha 0.5) and a scaled result (0.25): alpha 0.125.
    h = g.op("MatMul", [g.op("Mul", ["x", scalar(g, 0.5)]), g.w([16, 12])])
    return [tensor("x", X)], {"y": g.op("Softmax", [g.op("Mul", [h, scalar(g, 0.25)])], axis=-1)}


def patch_case(side, **attrs):
    def case(g, c=3, k=14, d=16):
        conv = g.op("Conv", ["pixel_values", g.w([d, c, k, k], 0.05), g.w([d], 0.5, "b")], kernel_shape=[k, k],
                    strides=[k, k], **attrs)
        flat = g.op("Reshape", [conv, g.const(np.array([1, d, -1], np.int64))])
        return [tensor("pixel_values", [1, c, side, side])], {"y": g.op("Transpose", [flat], perm=[0, 2, 1])}
    return case


def patch_shapes(g, c=3, side=28, k=14, d=16):
    # The legacy exporter's shape arithmetic around a patch embedding: the flatten target read
    # from Shape(conv), and the output viewed in a shape read from Shape(flatten).
    conv = g.op("Conv", ["pixel_values", g.w([d, c, k, k], 0.05), g.w([d], 0.5, "b")], kernel_shape=[k, k],
                strides=[k, k])
    sc = g.op("Shape", [conv])
    dim = lambda s, i: g.op("Unsqueeze", [g.op("Gather", [s, g.const(np.int64(i))], axis=0),
                                          g.const(np.array([0], np.int64))])
    target = g.op("Concat", [dim(sc, 0), dim(sc, 1), g.const(np.array([-1], np.int64))], axis=0)
    flat = g.op("Reshape", [conv, target])
    sf = g.op("Shape", [flat])
    t = g.op("Transpose", [flat], perm=[0, 2, 1])
    view = g.op("Concat", [dim(sf, 0), dim(sf, 2), dim(sf, 1)], axis=0)
    return [tensor("pixel_values", [1, c, side, side])], {"y": g.op("Reshape", [t, view])}


def shape_slices(g):
    # Shape with negative start and end (opset 15), of a constant and of a computed tensor.
    w = g.w([16, 12])
    h = g.op("MatMul", ["x", w])
    last = g.op("Shape", [w], start=-1)
    y = g.op("Reshape", [h, g.op("Concat", [g.const(np.array([-1], np.int64)), last], axis=0)])
    rows = g.op("Shape", [h], start=-2, end=-1)
    z = g.op("Reshape", [h, g.op("Concat", [rows, g.const(np.array([-1], np.int64))], axis=0)])
    return [tensor("x", X)], {"y": y, "z": z}


CASES = {
    "ln_pow2": ln_case(),
    "ln_mul": ln_case(square="mul"),
    "ln_nodes": ln_case(source="node"),
    "ln_cast": ln_cast,
    "ln_pow4": ln_pow4,
    "ln_pow_near2": ln_pow_near2,
    "ln_computed_exponent": ln_computed_exponent,
    "ln_axis1": ln_case(axes=(1,)),
    "ln_keepdims0": ln_keepdims0,
    "gelu_tanh": gelu_case("tanh"),
    "gelu_tanh_sqrt_2_over_pi": gelu_case("tanh", sqrt_2_over_pi=0.8),
    "gelu_tanh_cubic": gelu_case("tanh", cubic=0.045),
    "gelu_tanh_half": gelu_case("tanh", half=0.49),
    "gelu_tanh_one": gelu_case("tanh", one=1.01),
    "gelu_erf": gelu_case("erf"),
    "gelu_erf_sqrt_2": gelu_case("erf", sqrt_2=1.4),
    "gelu_erf_half": gelu_case("erf", half=0.51),
    "gelu_erf_one": gelu_case("erf", one=0.99),
    "gelu_bump": gelu_bump,
    "scale_softmax": scale_softmax,
    "scale_two_readers": scale_two_readers,
    "scale_alias": scale_alias,
    "scale_twice": scale_twice,
    "patch_valid": patch_case(31, auto_pad="VALID"),
    "patch_same_whole": patch_case(28, auto_pad="SAME_UPPER"),
    "patch_same_padded": patch_case(31, auto_pad="SAME_UPPER"),
    "ln_eps_rank4": ln_eps_rank4,
    "ln_affine_alias": ln_affine_alias,
    "ln_identity": ln_identity,
    "select_transposed_bias": select_transposed_bias,
    "select_batched_weight": select_batched_weight,
    "scale_operand_and_output": scale_operand_and_output,
    "patch_shapes": patch_shapes,
    "shape_slices": shape_slices,
}


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "tests/data/onnx/patterns"
    out.mkdir(parents=True, exist_ok=True)
    for i, (name, make) in enumerate(CASES.items()):
        g = G(200 + i)
        inputs, outs = make(g)
        for k, v in outs.items():
            g.nodes.append(helper.make_node("Identity", [v], [k], name=f"out_{k}"))
        path = out / f"{name}.onnx"
        g.save(path, inputs, [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in outs])
        rng = np.random.default_rng(300 + i)
        feeds = {}
        for vi in inputs:
            dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            feeds[vi.name] = (2.0 * rng.standard_normal(dims)).astype(np.float32)
            np.save(out / f"{name}.in.{vi.name}.npy", feeds[vi.name])
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        for k, v in zip(outs, sess.run(list(outs), feeds)):
            np.save(out / f"{name}.ref.{k}.npy", v)
        print(name, path)


if __name__ == "__main__":
    main()
