//! `.npy` (v1.0, C order) tensors through `npyz`: f32 as `<f4`, f16 as `<f2`, FP8 as `|u1` bit
//! patterns. Reading refuses any header whose data would not fit in the file, before allocating.

use crate::reference::HostTensor;
use half::f16;
use ipu_schema::DType;
use npyz::WriterBuilder;
use std::path::Path;

/// Read a tensor from a file.
pub fn read(path: &Path) -> Result<HostTensor, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    from_bytes(&bytes).map_err(|m| format!("{}: {m}", path.display()))
}

/// Check the header before npyz parses it. npyz's header parser takes exponential time on
/// deeply nested lists (found by fuzzing: 30 nested `[` take longer than 20 s), and lists only
/// appear in structured dtypes, which this reader does not support anyway.
fn precheck(bytes: &[u8]) -> Result<(), String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (bad magic)".into());
    }
    let (len, start): (usize, usize) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => {
            (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12)
        }
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let header = bytes.get(start..start.saturating_add(len)).ok_or("header longer than the file")?;
    if header.contains(&b'[') {
        return Err("structured dtypes are not supported (only <f4, <f2 and |u1)".into());
    }
    // A valid header is one dict with one shape tuple; deeper nesting is refused (npyz's parser is
    // exponential in nesting depth — fuzzing found `{{{{…` too).
    let count = |c: u8| header.iter().filter(|b| **b == c).count();
    if count(b'{') != 1 || count(b'(') != 1 || count(b')') != 1 {
        return Err("malformed header (expected one dict with one shape tuple)".into());
    }
    // The shape: npyz multiplies it without overflow checks (fuzzing found a panic), so the
    // element count is checked here against the file size first.
    let text = std::str::from_utf8(header).map_err(|_| "header is not text")?;
    let key = text.find("'shape'").or_else(|| text.find("\"shape\"")).ok_or("header has no shape")?;
    let open = key + text[key..].find('(').ok_or("header has no shape tuple")?;
    let close = open + text[open..].find(')').ok_or("header has no shape tuple")?;
    let mut elements: u64 = 1;
    for dim in text[open + 1..close].split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let d: u64 = dim.parse().map_err(|_| format!("shape dimension `{dim}` is not a number"))?;
        elements = elements.checked_mul(d).ok_or("shape overflows")?;
    }
    if elements > bytes.len() as u64 {
        return Err(format!(
            "header declares {elements} elements but the file has only {} bytes",
            bytes.len()
        ));
    }
    Ok(())
}

/// Parse `.npy` bytes (untrusted: every size is checked against the input before allocating).
pub fn from_bytes(bytes: &[u8]) -> Result<HostTensor, String> {
    precheck(bytes)?;
    // Defence in depth: a panic inside the third-party parser becomes an error, not a crash.
    let file = std::panic::catch_unwind(|| npyz::NpyFile::new(bytes))
        .map_err(|_| "npy header could not be parsed".to_string())?
        .map_err(|e| format!("not a .npy file: {e}"))?;
    if file.order() != npyz::Order::C {
        return Err("Fortran-order arrays are not supported; save with C order".into());
    }
    let shape = file.shape().to_vec();
    let descr = file.dtype().descr().trim_matches(|c| c == '\'' || c == '"').to_string();
    let (dtype, size) = match descr.as_str() {
        "<f4" => (DType::F32, 4),
        "<f2" => (DType::F16, 2),
        "|u1" => (DType::F8E4M3, 1),
        other => return Err(format!("unsupported dtype `{other}` (expected <f4, <f2 or |u1)")),
    };
    let elems =
        shape.iter().try_fold(1u64, |a, d| a.checked_mul(*d)).ok_or_else(|| "shape overflows".to_string())?;
    if elems.saturating_mul(size) > bytes.len() as u64 {
        return Err(format!("header declares {elems} elements but the file has only {} bytes", bytes.len()));
    }
    let data: Vec<f32> = match dtype {
        DType::F32 => file.into_vec::<f32>().map_err(|e| e.to_string())?,
        DType::F16 => file.into_vec::<f16>().map_err(|e| e.to_string())?.iter().map(|h| h.to_f32()).collect(),
        _ => file.into_vec::<u8>().map_err(|e| e.to_string())?.iter().map(|b| *b as f32).collect(),
    };
    if data.len() as u64 != elems {
        return Err(format!("expected {elems} elements, read {}", data.len()));
    }
    Ok(HostTensor { dtype, shape, data })
}

/// Integer ids (`<i8` or `<i4`: token ids) from `.npy` bytes: the shape and the values. Every
/// size is checked against the input before allocating, as for [`from_bytes`].
pub fn ids_from_bytes(bytes: &[u8]) -> Result<(Vec<u64>, Vec<i64>), String> {
    precheck(bytes)?;
    let file = std::panic::catch_unwind(|| npyz::NpyFile::new(bytes))
        .map_err(|_| "npy header could not be parsed".to_string())?
        .map_err(|e| format!("not a .npy file: {e}"))?;
    if file.order() != npyz::Order::C {
        return Err("Fortran-order arrays are not supported; save with C order".into());
    }
    let shape = file.shape().to_vec();
    let descr = file.dtype().descr().trim_matches(|c| c == '\'' || c == '"').to_string();
    let size = match descr.as_str() {
        "<i8" => 8,
        "<i4" => 4,
        other => return Err(format!("unsupported dtype `{other}` for ids (expected <i8 or <i4)")),
    };
    let elems =
        shape.iter().try_fold(1u64, |a, d| a.checked_mul(*d)).ok_or_else(|| "shape overflows".to_string())?;
    if elems.saturating_mul(size) > bytes.len() as u64 {
        return Err(format!("header declares {elems} elements but the file has only {} bytes", bytes.len()));
    }
    let data: Vec<i64> = if size == 8 {
        file.into_vec::<i64>().map_err(|e| e.to_string())?
    } else {
        file.into_vec::<i32>().map_err(|e| e.to_string())?.into_iter().map(i64::from).collect()
    };
    if data.len() as u64 != elems {
        return Err(format!("expected {elems} elements, read {}", data.len()));
    }
    Ok((shape, data))
}

/// Write `values` as an n-dimensional C-order array with their default dtype.
fn write_nd<T: npyz::AutoSerialize>(
    shape: &[u64],
    values: impl Iterator<Item = T>,
) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(shape)
        .writer(&mut out)
        .begin_nd()
        .map_err(|e| e.to_string())?;
    w.extend(values).and_then(|_| w.finish()).map_err(|e| e.to_string())?;
    Ok(out)
}

/// Encode a tensor as `.npy` bytes in its dtype (FP8 as `uint8` codes).
pub fn to_bytes(t: &HostTensor) -> Result<Vec<u8>, String> {
    match t.dtype {
        DType::F32 => write_nd(&t.shape, t.data.iter().copied()),
        DType::F16 => write_nd(&t.shape, t.data.iter().map(|x| f16::from_f32(*x))),
        DType::F8E4M3 | DType::F8E5M2 => write_nd(&t.shape, t.data.iter().map(|x| *x as u8)),
    }
}
