//! Params (weights, docs/model-format.md "Params"): their values are read from `.npy` or
//! `.safetensors` files next to the model file, converted to the param's dtype (f32 → f16 with
//! round-to-nearest-even, FP8 by the cast rules with the param's scale), and embedded in the plan's
//! buffers, so they travel in the tile images, are covered by the package's checksums and are
//! never sent again per inference. Their bindings are kept with direction `Param`, which tells the
//! host where to read them back for the reference.

use crate::model::{ParamSource, ParamSpec};
use crate::reference::HostTensor;
use half::f16;
use ipu_core::fp8::{self, Fp8Format};
use ipu_core::graph::Graph;
use ipu_core::plan::Plan;
use ipu_schema::{DType, Direction};
use std::collections::BTreeMap;
use std::path::Path;

/// Load every param of `g` from the files its model names, relative to `model_dir`.
pub fn load(
    model_file: &str,
    model_dir: &Path,
    g: &Graph,
    specs: &[ParamSpec],
) -> Result<BTreeMap<String, HostTensor>, String> {
    let mut out = BTreeMap::new();
    for spec in specs {
        let id = g.find(&spec.name).ok_or_else(|| format!("param `{}` is not in the graph", spec.name))?;
        let t = g.tensor(id);
        let at = format!("{model_file}:{}: param `{}`", spec.line, spec.name);
        let (values, from) = match &spec.source {
            ParamSource::Npy(file) => {
                let path = model_dir.join(file);
                // An f32 file for the param's elements, plus a header: anything larger (or not a
                // regular file, such as a FIFO or /dev/zero) is refused before it is read.
                check_file(&path, t.elements().saturating_mul(4).saturating_add(1 << 16))
                    .map_err(|e| format!("{at}: {e}"))?;
                (crate::npy::read(&path).map_err(|e| format!("{at}: {e}"))?, path.display().to_string())
            }
            ParamSource::Safetensors(file, key) => {
                let path = model_dir.join(file);
                (
                    safetensor(&path, key).map_err(|e| format!("{at}: {e}"))?,
                    format!("{}[{key}]", path.display()),
                )
            }
        };
        if values.shape != t.shape {
            return Err(format!("{at}: {from} holds shape {:?}, the param is {:?}", values.shape, t.shape));
        }
        let data = convert(&values, t.dtype, t.scale).map_err(|e| format!("{at}: {from}: {e}"))?;
        out.insert(t.name.clone(), HostTensor { dtype: t.dtype, shape: t.shape.clone(), data });
    }
    Ok(out)
}

/// Params given as f32 values (an imported model's initializers), taken over: each checked
/// against its declaration and converted to the param's dtype in place, as [`load`] converts
/// files, so a model's weights are not held twice on the host.
pub fn from_values(
    g: &Graph,
    mut values: BTreeMap<String, HostTensor>,
) -> Result<BTreeMap<String, HostTensor>, String> {
    let mut out = BTreeMap::new();
    for p in &g.params {
        let t = g.tensor(*p);
        let mut v = values.remove(&t.name).ok_or_else(|| format!("param `{}`: no value given", t.name))?;
        if v.shape != t.shape || v.dtype != DType::F32 {
            return Err(format!(
                "param `{}`: {} values of shape {:?} for a param of {:?}",
                t.name,
                v.dtype.name(),
                v.shape,
                t.shape
            ));
        }
        match t.dtype {
            DType::F32 => {}
            DType::F16 => v.data.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32()),
            DType::F8E4M3 | DType::F8E5M2 => {
                let f = if t.dtype == DType::F8E5M2 { Fp8Format::E5M2 } else { Fp8Format::E4M3 };
                v.data.iter_mut().for_each(|x| *x = fp8::from_f32_scaled(*x, f, t.scale as i32) as f32);
            }
        }
        v.dtype = t.dtype;
        out.insert(t.name.clone(), v);
    }
    Ok(out)
}

/// Refuse anything but a regular file of at most `max` bytes, before reading it.
fn check_file(path: &Path, max: u64) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{}: not a regular file", path.display()));
    }
    if meta.len() > max {
        return Err(format!(
            "{}: {} bytes, more than the {max} this param can need",
            path.display(),
            meta.len()
        ));
    }
    Ok(())
}

/// Values of a file tensor in the param's dtype (FP8: codes).
fn convert(v: &HostTensor, to: DType, scale: i8) -> Result<Vec<f32>, String> {
    let fp8 = |d| matches!(d, DType::F8E4M3 | DType::F8E5M2);
    if fp8(v.dtype) {
        // `|u1` files hold FP8 codes: only an FP8 param takes them, as they are.
        return if fp8(to) {
            Ok(v.data.clone())
        } else {
            Err(format!("FP8 codes (uint8) for a {} param", to.name()))
        };
    }
    Ok(match to {
        DType::F32 => v.data.clone(),
        DType::F16 => v.data.iter().map(|x| f16::from_f32(*x).to_f32()).collect(),
        DType::F8E4M3 | DType::F8E5M2 => {
            let f = if to == DType::F8E5M2 { Fp8Format::E5M2 } else { Fp8Format::E4M3 };
            v.data.iter().map(|x| fp8::from_f32_scaled(*x, f, scale as i32) as f32).collect()
        }
    })
}

/// One tensor of a `.safetensors` file (F32, F16 or BF16) as f32 values.
fn safetensor(path: &Path, key: &str) -> Result<HostTensor, String> {
    // A whole model's file may hold many tensors: bounded by the chip's memory in f32, not by this
    // param (the file is read whole; see docs/model-format.md).
    let chip = (ipu_core::target::NUM_TILES * ipu_core::target::TILE_MEM_SIZE) as u64;
    check_file(path, chip.saturating_mul(4))?;
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let view = st.tensor(key).map_err(|_| {
        let mut names: Vec<String> = st.names().into_iter().map(|n| n.to_string()).collect();
        names.sort();
        names.truncate(8);
        format!("{}: no tensor `{key}` (it has {})", path.display(), names.join(", "))
    })?;
    let raw = view.data();
    use safetensors::Dtype;
    let data: Vec<f32> = match view.dtype() {
        Dtype::F32 => raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::F16 => raw.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::BF16 => raw
            .chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
            .collect(),
        other => {
            return Err(format!(
                "{}: tensor `{key}` is {other:?} (expected F32, F16 or BF16)",
                path.display()
            ))
        }
    };
    Ok(HostTensor { dtype: DType::F32, shape: view.shape().iter().map(|d| *d as u64).collect(), data })
}

/// Write each param's values into the buffers its binding slices name (as initial words), and
/// mark the binding `Param`.
pub fn embed(g: &Graph, plan: &mut Plan, values: &BTreeMap<String, HostTensor>) -> Result<(), String> {
    // Each touched buffer's bytes, built once and turned into words once at the end (a buffer
    // takes many slices: one per weight block).
    let mut images: BTreeMap<(u16, ipu_core::plan::Sym), Vec<u8>> = BTreeMap::new();
    for b in plan.bindings.iter_mut() {
        if !g.params.contains(&b.tensor) {
            continue;
        }
        let name = &g.tensor(b.tensor).name;
        let t = values.get(name).ok_or_else(|| format!("param `{name}` has no values"))?;
        let bytes = crate::session::to_bytes(t, b.transpose);
        b.direction = Direction::Param;
        for s in &b.slices {
            let key = (s.tile, s.buffer.clone());
            if !images.contains_key(&key) {
                let buf =
                    plan.tiles[s.tile as usize].buffers.iter().find(|x| x.name == s.buffer).ok_or_else(
                        || format!("param `{name}`: tile {} has no buffer `{}`", s.tile, s.buffer),
                    )?;
                if !buf.init.is_empty() {
                    return Err(format!("param `{name}`: buffer `{}` already holds data", s.buffer));
                }
                images.insert(key.clone(), vec![0u8; 4 * (buf.bytes as usize).div_ceil(4)]);
            }
            let image = images.get_mut(&key).expect("inserted above");
            for r in 0..s.rows as u64 {
                let src = (s.tensor_offset + r * s.tensor_stride) as usize;
                let dst = s.offset as usize + (r * s.tile_stride as u64) as usize;
                let n = s.row_bytes as usize;
                image
                    .get_mut(dst..dst + n)
                    .ok_or_else(|| format!("param `{name}`: slice outside buffer `{}`", s.buffer))?
                    .copy_from_slice(&bytes[src..src + n]);
            }
        }
    }
    for ((tile, buffer), image) in images {
        let buf =
            plan.tiles[tile as usize].buffers.iter_mut().find(|x| x.name == buffer).expect("found above");
        buf.init = ipu_core::plan::Init::consts(
            image.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        );
    }
    Ok(())
}
