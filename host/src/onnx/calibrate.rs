//! FP8 activation scales from a calibration run (docs/onnx.md "FP8 weights"): the model is
//! imported with f16 weights, evaluated by the host reference in device precision on the
//! calibration inputs (given as `.npy`, else generated as `run` generates them with seed 1), and
//! each FP8 matmul's activation operand gets the power-of-two scale that fits its largest
//! magnitude there.

use super::{import, ImportOptions, Weights};
use crate::reference::HostTensor;
use ipu_core::graph::OpKind;
use ipu_schema::{Binding, Direction};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Multiply-accumulates of a calibration run above which, without `--calibrate` files, no run is
/// made (the host reference does ~0.2 G MAC/s, issue #16): 2 G MACs, ~10 s.
pub const AUTO_CALIBRATION_MACS: u64 = 2_000_000_000;

/// Largest |activation| of each matmul that reads a computed tensor and a param, by the
/// matmul's output tensor name (the same name in the FP8 import). Without `given` files, a model
/// of more than `max_macs` multiply-accumulates is not run: `Ok(None)`.
pub fn ranges(
    path: &Path,
    opts: &ImportOptions,
    given: &BTreeMap<String, PathBuf>,
    max_macs: u64,
) -> Result<Option<BTreeMap<String, f32>>, String> {
    let f16 = ImportOptions { weights: Weights::F16, ..opts.clone() };
    let imp = import(path, &f16)?;
    let g = crate::model::parse("<calibration model>", &imp.toml).map_err(|e| e.to_string())?;
    if given.is_empty() && macs(&g) > max_macs {
        return Ok(None);
    }
    let mut vals = crate::params::from_values(&g, imp.params)?;
    for name in given.keys() {
        if !g.inputs.iter().any(|i| g.tensor(*i).name == *name) {
            return Err(format!("--calibrate {name}: the model has no input of that name"));
        }
    }
    // Token ids (`one_hot` inputs) are given and generated as ids, as `run` takes them.
    let ids = crate::ids::integer_inputs(&imp.toml);
    for id in &g.inputs {
        let t = g.tensor(*id);
        let b = Binding {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            direction: Direction::Input,
            transpose: false,
            scale: 0,
            slices: Vec::new(),
        };
        let seed = crate::session::iteration_seed(1, 1);
        let value = match (given.get(&t.name), ids.get(&t.name)) {
            (Some(file), Some(kind)) => {
                crate::ids::read_as(&b, kind, file).map_err(|e| format!("--calibrate {}: {e}", t.name))?
            }
            (Some(file), None) => {
                let v = crate::npy::read(file).map_err(|e| format!("--calibrate {}: {e}", t.name))?;
                if v.shape != t.shape {
                    return Err(format!(
                        "--calibrate {}: {} holds shape {:?}, the input is {:?}",
                        t.name,
                        file.display(),
                        v.shape,
                        t.shape
                    ));
                }
                HostTensor { dtype: t.dtype, shape: v.shape, data: v.data }
            }
            (None, Some(kind)) => crate::ids::generated_as(&b, kind, seed),
            (None, None) => crate::session::generated(&b, seed),
        };
        vals.insert(t.name.clone(), value);
    }
    let ev = crate::reference::evaluate(&g, &vals, &[], &[])?;
    let mut out = BTreeMap::new();
    for op in &g.ops {
        if let OpKind::MatMul { a, b, .. } = op.kind {
            if g.params.contains(&b) && !g.is_source(a) {
                let range =
                    ev.device.get(&g.tensor(a).name).map(|t| t.data.iter().fold(0f32, |m, x| m.max(x.abs())));
                out.insert(g.tensor(op.output).name.clone(), range.unwrap_or(0.0));
            }
        }
    }
    Ok(Some(out))
}

/// Multiply-accumulates of the graph's matmuls.
pub fn macs(g: &ipu_core::graph::Graph) -> u64 {
    g.ops
        .iter()
        .filter_map(|op| match op.kind {
            OpKind::MatMul { a, b, transpose_a, transpose_b, .. } => {
                ipu_core::graph::matmul_shape(g.tensor(a), g.tensor(b), transpose_a, transpose_b).map(
                    |(batch, m, k, n)| batch.iter().product::<u64>().saturating_mul(m * k).saturating_mul(n),
                )
            }
            _ => None,
        })
        .fold(0u64, |a, x| a.saturating_add(x))
}
