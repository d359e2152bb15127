#!/usr/bin/env python3
"""The second oracle for random graphs (issue 38): the same model, written as ONNX by this
script (not by our importer) and run by onnxruntime, against what the simulator computed.

    scripts/graph_onnx_check.py N [START_SEED]        # seeds START..START+N
    scripts/graph_onnx_check.py --model DIR/model.toml --tiles T --seed S

For each seed: `graph_fuzz --emit` writes the model and its params, `ipu-codegen build` builds it
(a refusal is skipped and counted), `ipu-codegen run --seed S --save-inputs --output-dir` runs it
on the simulator; the model is translated to ONNX op by op (f32 arithmetic, each f16 result
rounded to f16 by a Cast pair, as the model format specifies), run by onnxruntime on the saved
inputs, and each output compared by cosine similarity over the elements finite on both sides;
an element finite on one side only is a disagreement too. Exit 1 when the two disagree on a graph
the verdict passed (a graph the verdict failed is the verdict's finding, counted apart).

FP8: a cast f16 -> FP8 with scale s is QuantizeLinear(x, 2^s, float8e4m3fnuz/float8e5m2fnuz,
saturate=0) then DequantizeLinear (round to nearest even, NaN on overflow: the model format's
rule); FP8 tensors are carried as their real values, so a cast back to f16 and an FP8 matmul are
plain. FP8 graphs are reported apart: one FP8 rounding that lands on the other side of a tie
moves a value by 1/8, so their floor is 0.99 instead of the f16 graphs' 0.999.
Requires: python3 -m pip install onnx onnxruntime numpy ml_dtypes. Not run in CI.
"""
import os, subprocess, sys, tempfile, tomllib
import numpy as np
import ml_dtypes
import onnx
from onnx import TensorProto, helper, numpy_helper
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODEGEN = os.path.join(ROOT, "target/release/ipu-codegen")
FUZZ = os.path.join(ROOT, "target/release/graph_fuzz")
FP8 = {"f8e4m3": (ml_dtypes.float8_e4m3fnuz, TensorProto.FLOAT8E4M3FNUZ),
       "f8e5m2": (ml_dtypes.float8_e5m2fnuz, TensorProto.FLOAT8E5M2FNUZ)}


def fp8_real(codes, dtype, scale):
    """FP8 codes (uint8) to real values: code * 2^scale."""
    return codes.astype(np.uint8).view(FP8[dtype][0]).astype(np.float32) * np.float32(2.0 ** scale)


def to_onnx(model, model_dir):
    """The model as an ONNX graph in f32; returns (onnx model, scale of each FP8 tensor)."""
    nodes, inits, scales, dtypes = [], [], {}, {}
    k = [0]

    def const(arr, dtype=np.float32):
        k[0] += 1
        name = f"c{k[0]}"
        inits.append(numpy_helper.from_array(np.asarray(arr, dtype=dtype), name))
        return name

    def node(op, ins, out=None, **attrs):
        k[0] += 1
        out = out or f"n{k[0]}"
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    graph_inputs = []
    for name, t in model.get("inputs", {}).items():
        graph_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, t["shape"]))
        dtypes[name] = t["dtype"]
    for name, p in model.get("params", {}).items():
        arr = np.load(os.path.join(model_dir, p["file"]))
        d, s = p["dtype"], p.get("scale", 0)
        if d in FP8:
            real = fp8_real(arr, d, s) if arr.dtype == np.uint8 else \
                (arr.astype(np.float32) / np.float32(2.0 ** s)).astype(FP8[d][0]).astype(np.float32) * np.float32(2.0 ** s)
            scales[name] = s
        elif d == "f16":
            real = arr.astype(np.float16).astype(np.float32)
        else:
            real = arr.astype(np.float32)
        inits.append(numpy_helper.from_array(real.astype(np.float32), name))
        dtypes[name] = d
    for op in model.get("ops", []):
        kind, out, dt = op["op"], op["output"], op["dtype"]
        x = op.get("input")
        if kind == "matmul":
            a, b = op["a"], op["b"]
            if op.get("transpose_a"):
                a = node("Transpose", [a], perm=swap_last(model_rank(model, op["a"], dtypes, shapes)))
            if op.get("transpose_b"):
                b = node("Transpose", [b], perm=swap_last(model_rank(model, op["b"], dtypes, shapes)))
            y = node("MatMul", [a, b])
            if "alpha" in op:
                y = node("Mul", [y, const(op["alpha"])])
        elif kind == "cast":
            if dt in FP8:
                s, zp = const(2.0 ** op.get("scale", 0)), f"zp{k[0]}"
                inits.append(helper.make_tensor(zp, FP8[dt][1], [], [0.0]))
                q = node("QuantizeLinear", [x, s, zp], saturate=0)
                y = node("DequantizeLinear", [q, s])
                scales[out] = op.get("scale", 0)
            else:
                y = node("Identity", [x])
        elif kind in ("add", "sub", "mul"):
            y = node(kind.capitalize(), [op["a"], op["b"]])
        elif kind == "gelu":
            if op["approximate"] == "tanh":
                x3 = node("Mul", [node("Mul", [x, x]), x])
                u = node("Mul", [node("Add", [x, node("Mul", [x3, const(0.044715)])]), const(np.sqrt(2 / np.pi))])
                y = node("Mul", [node("Mul", [x, const(0.5)]), node("Add", [node("Tanh", [u]), const(1.0)])])
            else:
                e = node("Erf", [node("Mul", [x, const(1 / np.sqrt(2))])])
                y = node("Mul", [node("Mul", [x, const(0.5)]), node("Add", [e, const(1.0)])])
        elif kind in ("tanh", "sigmoid", "exp", "log", "sqrt", "reciprocal", "abs", "erf"):
            y = node({"tanh": "Tanh", "sigmoid": "Sigmoid", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
                      "reciprocal": "Reciprocal", "abs": "Abs", "erf": "Erf"}[kind], [x])
        elif kind == "pow":
            # The format's pow is e^{c·ln x}: NaN below 0 whatever the exponent (docs/model-format.md).
            p = node("Pow", [x, const(op["exponent"])])
            y = node("Where", [node("Less", [x, const(0.0)]), const(np.nan), p])
        elif kind == "softmax":
            y = node("Softmax", [x], axis=-1)
        elif kind == "layernorm":
            d = shapes[x][-1]
            g = op.get("gamma") or const(np.ones(d))
            ins = [x, g] + ([op["beta"]] if "beta" in op else [])
            y = node("LayerNormalization", ins, axis=-1, epsilon=float(op.get("eps", 1e-5)))
        elif kind == "reshape":
            y = node("Reshape", [x, const(op["shape"], np.int64)])
        elif kind == "transpose":
            y = node("Transpose", [x], perm=op["perm"])
        elif kind == "slice":
            n = len(op["starts"])
            y = node("Slice", [x, const(op["starts"], np.int64), const(op["ends"], np.int64),
                               const(list(range(n)), np.int64)])
        else:
            raise ValueError(f"op {kind}")
        if dt == "f16" and kind not in ("reshape", "transpose", "slice") and not (kind == "cast" and dtypes.get(x) in FP8):
            y = node("Cast", [node("Cast", [y], to=TensorProto.FLOAT16)], to=TensorProto.FLOAT)
        if x in scales and kind in ("reshape", "transpose", "slice"):
            scales[out] = scales[x]
        node("Identity", [y], out)
        dtypes[out] = dt
        shapes[out] = infer(shapes, op, kind, x)
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in model["outputs"]]
    g = helper.make_graph(nodes, "g", graph_inputs, outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m, scales


shapes = {}


def model_rank(model, name, dtypes, shapes):
    return len(shapes[name])


def swap_last(r):
    p = list(range(r))
    p[-1], p[-2] = p[-2], p[-1]
    return p


def infer(shapes, op, kind, x):
    """The output shape, numpy-style (for the few ops that need an input's shape later)."""
    if kind == "matmul":
        a, b = np.zeros(shapes[op["a"]]), np.zeros(shapes[op["b"]])
        if op.get("transpose_a"):
            a = np.swapaxes(a, -1, -2)
        if op.get("transpose_b"):
            b = np.swapaxes(b, -1, -2)
        return list(np.matmul(a, b).shape)
    if kind in ("add", "sub", "mul"):
        return list(np.broadcast_shapes(tuple(shapes[op["a"]]), tuple(shapes[op["b"]])))
    if kind == "reshape":
        return list(op["shape"])
    if kind == "transpose":
        return [shapes[x][p] for p in op["perm"]]
    if kind == "slice":
        return [e - s for s, e in zip(op["starts"], op["ends"])]
    return list(shapes[x])


def cosine(a, b):
    """Cosine over the elements finite on both sides, and the count of elements finite on one
    side only (a NaN or inf the other engine does not have)."""
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    ok = np.isfinite(a) & np.isfinite(b)
    one_sided = int((np.isfinite(a) != np.isfinite(b)).sum())
    a, b = a[ok], b[ok]
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0, one_sided
    return (float(a @ b / (na * nb)) if na and nb else 0.0), one_sided


def check(model_path, tiles, seed, work):
    """Build, run, compare. Returns (status, fp8, min cosine, detail)."""
    text = open(model_path).read()
    model = tomllib.loads(text)
    model_dir = os.path.dirname(model_path)
    pkg = os.path.join(work, "m.ipuexe")
    b = subprocess.run([CODEGEN, "build", model_path, "-o", pkg, "--tiles", str(tiles), "--threads", "1"],
                       capture_output=True, text=True)
    if b.returncode != 0:
        return "refused", False, None, b.stderr.strip().splitlines()[-1] if b.stderr else ""
    r = subprocess.run([CODEGEN, "run", pkg, "--seed", str(seed), "--save-inputs", os.path.join(work, "in"),
                        "--output-dir", os.path.join(work, "out")], capture_output=True, text=True)
    fp8 = "f8e" in text
    if r.returncode not in (0, 1):
        return "run-error", fp8, None, r.stderr.strip()[-300:]
    shapes.clear()
    for name, t in list(model.get("inputs", {}).items()) + list(model.get("params", {}).items()):
        shapes[name] = list(t["shape"])
    m, scales = to_onnx(model, model_dir)
    # `run` saves only the inputs whose value reaches an output (the package binds no others);
    # onnxruntime still wants every graph input, and any value of an unread one gives the same
    # outputs: zeros.
    def feed(n):
        path = os.path.join(work, "in", f"{n}.npy")
        if os.path.exists(path):
            return np.load(path).astype(np.float32)
        return np.zeros(shapes[n], np.float32)
    feeds = {n: feed(n) for n in model.get("inputs", {})}
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    got = dict(zip(model["outputs"], sess.run(model["outputs"], feeds)))
    worst, detail, nonfinite = 1.0, [], 0
    for o in model["outputs"]:
        dev = np.load(os.path.join(work, "out", f"{o}.npy"))
        if dev.dtype == np.uint8:
            dt = next(op["dtype"] for op in model["ops"] if op["output"] == o) if o not in model.get("params", {}) else None
            dev = fp8_real(dev, dt if dt in FP8 else "f8e4m3", scales.get(o, 0))
        c, bad = cosine(dev, got[o])
        nonfinite += bad
        worst = min(worst, c)
        detail.append(f"{o}={c:.6f}" + (f"({bad} non-finite on one side)" if bad else ""))
    agree = worst >= (0.99 if fp8 else 0.999) and nonfinite == 0
    verdict = "PASS" if r.returncode == 0 else "FAIL"
    return f"{'agree' if agree else 'DISAGREE'} run={verdict}", fp8, worst, " ".join(detail)


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        sys.exit(2)
    for exe in (CODEGEN, FUZZ):
        if not os.path.exists(exe):
            subprocess.run(["cargo", "build", "--release", "-p", "ipu-host", "-p", "ipu-tests", "--bins"], cwd=ROOT, check=True)
    counts, low = {}, []
    if args[0] == "--model":
        cases = [(args[1], int(args[args.index("--tiles") + 1]), int(args[args.index("--seed") + 1]))]
    else:
        n, start = int(args[0]), int(args[1]) if len(args) > 1 else 0
        cases = [(None, None, s) for s in range(start, start + n)]
    cos_f16, cos_fp8 = [], []
    for path, tiles, seed in cases:
        with tempfile.TemporaryDirectory() as work:
            if path is None:
                out = subprocess.run([FUZZ, "--emit", str(seed), work], capture_output=True, text=True, check=True)
                tiles = int(out.stdout.split()[0].split("=")[1])
                path = os.path.join(work, "model.toml")
            status, fp8, worst, detail = check(path, tiles, seed, work)
        key = status if status in ("refused", "run-error") else f"{status} {'fp8' if fp8 else 'f16'}"
        counts[key] = counts.get(key, 0) + 1
        if worst is not None and "run=PASS" in status:
            (cos_fp8 if fp8 else cos_f16).append(worst)
        # Both oracles must agree on a graph the verdict passed; a FAIL is the verdict's finding.
        if status == "DISAGREE run=PASS":
            low.append(f"seed {seed}: {status} {detail}")
        print(f"seed {seed}: {status} {'fp8' if fp8 else 'f16'} {detail}", flush=True)
    print("summary:", dict(sorted(counts.items())))
    for name, cs in (("f16", cos_f16), ("fp8", cos_fp8)):
        if cs:
            print(f"{name} graphs the verdict passed: {len(cs)}, min cosine {min(cs):.6f}, median {np.median(cs):.6f}")
    for line in low:
        print(line)
    sys.exit(1 if low else 0)


if __name__ == "__main__":
    main()
