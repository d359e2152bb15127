#!/usr/bin/env python3
"""End-to-end FP8 check against ml_dtypes itself: numpy makes an f16 input, ipu-codegen casts it
to FP8 on the simulated device, and the uint8 .npy it writes must equal ml_dtypes' cast bit for bit.
Usage: check_fp8_output.py PATH/TO/ipu-codegen WORKDIR"""
import pathlib, subprocess, sys
import ml_dtypes
import numpy as np

exe, work = sys.argv[1], pathlib.Path(sys.argv[2])
work.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(7)
def run(q, fmt, scale):
    """Cast q on the simulated device; returns (exit code, stdout, device codes)."""
    np.save(work / "Q.npy", q)
    model = work / "cast.toml"
    model.write_text(f'name = "cast"\noutputs = ["Q8"]\n[inputs.Q]\ndtype = "f16"\nshape = [3, 7, 45]\n'
                     f'[[ops]]\nop = "cast"\ninput = "Q"\noutput = "Q8"\ndtype = "{fmt}"\nscale = {scale}\n')
    pkg = work / "cast.ipuexe"
    subprocess.run([exe, "build", str(model), "-o", str(pkg), "--tiles", "5"], check=True, capture_output=True)
    r = subprocess.run([exe, "run", str(pkg), "--device", "sim", "--input", f"Q={work / 'Q.npy'}",
                        "--output-dir", str(work / "out")], capture_output=True, text=True)
    return r.returncode, r.stdout, np.load(work / "out" / "Q8.npy")


for fmt, f8, scale in [("f8e4m3", ml_dtypes.float8_e4m3fnuz, -2), ("f8e5m2", ml_dtypes.float8_e5m2fnuz, 3)]:
    q = (rng.standard_normal((3, 7, 45)) * 40).astype(np.float16)
    special = q.copy()
    special.flat[:6] = np.array([0.0, -0.0, 65504.0, -1e-7, 1000.0, np.nan], dtype=np.float16)
    for name, x in [("random", q), ("with zeros, overflow and NaN", special)]:
        code, out, got = run(x, fmt, scale)
        with np.errstate(all="ignore"):
            want = (x.astype(np.float32) / np.float32(2.0 ** scale)).astype(f8).view(np.uint8)
        assert got.dtype == np.uint8, got.dtype
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"{fmt} {name}: {bad.size} codes differ, first at {bad[0]}: {got.flat[bad[0]]:#x} vs {want.flat[bad[0]]:#x}"
        nan_out = np.isnan(want.view(f8).astype(np.float32))
        overflow = int(np.count_nonzero(nan_out & np.isfinite(x)))
        assert f"nonFiniteOutputs={int(np.count_nonzero(nan_out))}" in out, out
        if overflow == 0:
            # No finite value overflows (a NaN input gives NaN, as its f64 value does): the run
            # passes on both checks.
            assert code == 0 and "numericalTest=PASS" in out, out
        else:
            # An FP8 NaN where the real value is finite is an infinite error: the run fails and
            # counts the NaNs, and still writes the codes, which match ml_dtypes bit for bit.
            assert code == 1 and "numericalTest=FAIL" in out, (overflow, out)
        print(f"{fmt} scale={scale} {name}: {got.size} codes equal to ml_dtypes (exit {code}, {overflow} finite values overflowed to NaN)")
