//! Values known at compile time (initializers, `Constant` nodes, shape arithmetic) and the ops
//! the importer folds on them.
//!
//! Floats are kept as f32 (ONNX's FLOAT; FLOAT16 and DOUBLE initializers are widened or narrowed
//! to it once), integers and booleans as i64. Every op checks its shapes and returns a message
//! rather than panicking: the file is untrusted.

use super::proto::{data_type, TensorProto};
use std::collections::BTreeMap;
use std::path::{Component, Path};

/// Element storage.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// Floating point (FLOAT, FLOAT16, DOUBLE).
    F(Vec<f32>),
    /// Integers and booleans.
    I(Vec<i64>),
}

/// A constant tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Const {
    /// Shape (row-major); `[]` is a scalar.
    pub shape: Vec<u64>,
    /// Elements.
    pub data: Data,
}

/// Largest tensor the importer decodes: 2^31 elements (8 GiB of f32), far above any model that
/// fits the chip, but a bound on what a hostile header can make it allocate.
const MAX_ELEMENTS: u64 = 1 << 31;

/// Elements of a shape, refused past [`MAX_ELEMENTS`].
pub fn elements(shape: &[u64]) -> Result<usize, String> {
    elements_at_most(shape, MAX_ELEMENTS).ok_or_else(|| format!("shape {shape:?} has too many elements"))
}

/// Elements of a shape if they number at most `max` (no overflow on the way).
pub fn elements_at_most(shape: &[u64], max: u64) -> Option<usize> {
    shape.iter().try_fold(1u64, |a, d| a.checked_mul(*d)).filter(|n| *n <= max).map(|n| n as usize)
}

impl Const {
    /// A float constant.
    pub fn f(shape: Vec<u64>, v: Vec<f32>) -> Const {
        Const { shape, data: Data::F(v) }
    }
    /// An integer constant.
    pub fn i(shape: Vec<u64>, v: Vec<i64>) -> Const {
        Const { shape, data: Data::I(v) }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            Data::F(v) => v.len(),
            Data::I(v) => v.len(),
        }
    }
    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The values as f64.
    pub fn as_f64(&self) -> Vec<f64> {
        match &self.data {
            Data::F(v) => v.iter().map(|x| *x as f64).collect(),
            Data::I(v) => v.iter().map(|x| *x as f64).collect(),
        }
    }
    /// The values as f32 (integers converted).
    pub fn as_f32(&self) -> Vec<f32> {
        match &self.data {
            Data::F(v) => v.clone(),
            Data::I(v) => v.iter().map(|x| *x as f32).collect(),
        }
    }
    /// The values as integers (floats must be whole numbers).
    pub fn as_i64(&self) -> Result<Vec<i64>, String> {
        match &self.data {
            Data::I(v) => Ok(v.clone()),
            Data::F(v) => v
                .iter()
                .map(|x| {
                    if x.fract() == 0.0 && x.abs() < 9.0e15 {
                        Ok(*x as i64)
                    } else {
                        Err(format!("expected integers, found {x}"))
                    }
                })
                .collect(),
        }
    }
    /// The one value of a single-element constant.
    pub fn scalar(&self) -> Option<f64> {
        (self.len() == 1).then(|| self.as_f64()[0])
    }
    /// Same elements, another shape.
    pub fn reshaped(&self, shape: Vec<u64>) -> Const {
        Const { shape, data: self.data.clone() }
    }
    /// Pick elements by flat index.
    pub fn pick(&self, shape: Vec<u64>, idx: &[usize]) -> Const {
        let data = match &self.data {
            Data::F(v) => Data::F(idx.iter().map(|i| v[*i]).collect()),
            Data::I(v) => Data::I(idx.iter().map(|i| v[*i]).collect()),
        };
        Const { shape, data }
    }
}

/// Row-major strides of a shape.
pub fn strides(shape: &[u64]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1] as usize;
    }
    s
}

/// Where a model's external data lives: the directory of the `.onnx` file and the data files
/// mapped so far (each mapped once, however many tensors it holds).
pub struct External<'a> {
    /// Directory of the model file.
    pub dir: &'a Path,
    /// Mapped files by `location`.
    pub maps: BTreeMap<String, memmap2::Mmap>,
}

impl External<'_> {
    /// The bytes `[offset, offset + length)` of `location`, checked to lie inside the file.
    fn bytes(&mut self, location: &str, offset: u64, length: Option<u64>) -> Result<&[u8], String> {
        let rel = Path::new(location);
        if location.is_empty() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(format!(
                "external data location `{location}` must be a relative path below the model's directory"
            ));
        }
        if !self.maps.contains_key(location) {
            let path = self.dir.join(rel);
            let file = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let meta = file.metadata().map_err(|e| format!("{}: {e}", path.display()))?;
            if !meta.is_file() {
                return Err(format!("{}: not a regular file", path.display()));
            }
            let map = map_file(&file).map_err(|e| format!("{}: {e}", path.display()))?;
            self.maps.insert(location.to_string(), map);
        }
        let map = &self.maps[location];
        let len = map.len() as u64;
        let length = length.unwrap_or(len.saturating_sub(offset));
        match offset.checked_add(length) {
            Some(end) if end <= len => Ok(&map[offset as usize..end as usize]),
            _ => Err(format!(
                "external data `{location}`: bytes {offset}..{} lie outside the file's {len} bytes",
                offset.saturating_add(length)
            )),
        }
    }
}

impl External<'_> {
    /// Drop this process's pages of `[offset, offset + length)` of `location` once its values are
    /// decoded: the mapping is read-only and file-backed, so they stay in the page cache and are
    /// read again if the range is needed again, but a 2 GB weight file no longer sits in the
    /// import's resident memory beside its decoded copy (`benches/benches/onnx_import.rs`).
    #[allow(unsafe_code)]
    fn release(&self, location: &str, offset: u64, length: u64) {
        if let Some(map) = self.maps.get(location) {
            // SAFETY: no slice of the range is alive (the values were copied out), and
            // MADV_DONTNEED on a private read-only file mapping only discards pages that the
            // next access reads back from the file: the contents seen do not change.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    offset as usize,
                    length as usize,
                )
            };
        }
    }
}

#[allow(unsafe_code)]
fn map_file(file: &std::fs::File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the mapping is read-only and lives while the import runs; a file changed under us
    // gives wrong values, which the package's checksums then cover, not undefined behaviour in
    // safe code that reads bytes.
    unsafe { memmap2::Mmap::map(file) }
}

/// Decode an initializer or a `Constant`'s tensor.
pub fn decode(t: &TensorProto, ext: &mut External) -> Result<Const, String> {
    let shape: Vec<u64> = t
        .dims
        .iter()
        .map(|d| u64::try_from(*d).map_err(|_| format!("negative dimension {d}")))
        .collect::<Result<_, _>>()?;
    let n = elements(&shape)?;
    let width = match t.data_type {
        data_type::FLOAT | data_type::INT32 => 4,
        data_type::INT64 | data_type::DOUBLE => 8,
        data_type::FLOAT16 => 2,
        data_type::UINT8 | data_type::INT8 | data_type::BOOL => 1,
        other => return Err(format!("data type {} is not supported", data_type::name(other))),
    };
    let mut external = None;
    let raw: Option<&[u8]> = if t.data_location == 1 {
        let get = |k: &str| t.external_data.iter().find(|e| e.key == k).map(|e| e.value.as_str());
        let location = get("location").ok_or("external data without a `location`")?;
        let num = |k: &str| -> Result<Option<u64>, String> {
            get(k)
                .map(|v| v.parse::<u64>().map_err(|_| format!("external data `{k}` = `{v}` is not a number")))
                .transpose()
        };
        let (offset, length) = (num("offset")?.unwrap_or(0), num("length")?);
        let bytes = ext.bytes(location, offset, length)?;
        external = Some((location, offset, bytes.len() as u64));
        Some(bytes)
    } else if !t.raw_data.is_empty() || n == 0 {
        Some(&t.raw_data)
    } else {
        None
    };
    if let Some(raw) = raw {
        if raw.len() as u64 != n as u64 * width {
            return Err(format!(
                "{} bytes of data for {n} elements of {}",
                raw.len(),
                data_type::name(t.data_type)
            ));
        }
        let c = raw.chunks_exact(width as usize);
        let data = match t.data_type {
            data_type::FLOAT => Data::F(c.map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()),
            data_type::FLOAT16 => {
                Data::F(c.map(|b| half::f16::from_le_bytes(b.try_into().unwrap()).to_f32()).collect())
            }
            data_type::DOUBLE => {
                Data::F(c.map(|b| f64::from_le_bytes(b.try_into().unwrap()) as f32).collect())
            }
            data_type::INT64 => Data::I(c.map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect()),
            data_type::INT32 => {
                Data::I(c.map(|b| i32::from_le_bytes(b.try_into().unwrap()) as i64).collect())
            }
            data_type::INT8 => Data::I(c.map(|b| b[0] as i8 as i64).collect()),
            _ => Data::I(c.map(|b| b[0] as i64).collect()),
        };
        if let Some((location, offset, length)) = external {
            ext.release(location, offset, length);
        }
        return Ok(Const { shape, data });
    }
    let count = |len: usize| {
        if len == n {
            Ok(())
        } else {
            Err(format!("{len} values for {n} elements of {}", data_type::name(t.data_type)))
        }
    };
    let data = match t.data_type {
        data_type::FLOAT => {
            count(t.float_data.len())?;
            Data::F(t.float_data.clone())
        }
        data_type::DOUBLE => {
            count(t.double_data.len())?;
            Data::F(t.double_data.iter().map(|x| *x as f32).collect())
        }
        data_type::INT64 => {
            count(t.int64_data.len())?;
            Data::I(t.int64_data.clone())
        }
        data_type::FLOAT16 => {
            count(t.int32_data.len())?;
            Data::F(t.int32_data.iter().map(|b| half::f16::from_bits(*b as u16).to_f32()).collect())
        }
        _ => {
            count(t.int32_data.len())?;
            Data::I(t.int32_data.iter().map(|x| *x as i64).collect())
        }
    };
    Ok(Const { shape, data })
}
