//! Token ids at the session boundary (docs/model-format.md "Inputs", `one_hot`). An input declared
//! with `one_hot = [ids shape]` holds, on the chip, one f16 row per id with a 1 at the id and
//! zeros elsewhere (`shape` = the ids' shape and the vocabulary size). `run --input NAME=ids.npy`
//! takes the integer ids (`<i8` or `<i4`) and the host writes their rows; an embedding lookup is
//! then the matmul of those rows with the table, exact in f16 (one product per output). The
//! model text carries the declaration, so the package records how its input is made; the host
//! reference is given the same rows. An input declared `integer = true` (f32) is given as
//! integers too and written as their values (BERT's attention mask).

use crate::package::Package;
use crate::reference::HostTensor;
use ipu_schema::Binding;
use ipu_schema::DType;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Deserialize)]
struct Light {
    #[serde(default)]
    inputs: BTreeMap<String, LightInput>,
}

#[derive(Deserialize)]
struct LightInput {
    one_hot: Option<Vec<u64>>,
    integer: Option<bool>,
}

/// How `run` takes an input that the model text declares as integer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Integer {
    /// Token ids of this shape, written as their one-hot rows (`one_hot`).
    OneHot(Vec<u64>),
    /// Integers written as f32 values (`integer = true`: an attention mask of 0/1).
    Values,
}

/// The integer inputs of a model text, by name.
pub fn integer_inputs(model_source: &str) -> BTreeMap<String, Integer> {
    toml::from_str::<Light>(model_source)
        .map(|l| {
            l.inputs
                .into_iter()
                .filter_map(|(n, i)| match (i.one_hot, i.integer) {
                    (Some(shape), _) => Some((n, Integer::OneHot(shape))),
                    (None, Some(true)) => Some((n, Integer::Values)),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Integers larger than this are not exact in f32.
pub const MAX_EXACT: i64 = 1 << 24;

/// The input for binding `b` from `path`, as `kind` says: one-hot rows of ids, or the integers'
/// values (exact in f32: at most 2^24 in magnitude).
pub fn read_as(b: &Binding, kind: &Integer, path: &Path) -> Result<HostTensor, String> {
    match kind {
        Integer::OneHot(shape) => read(b, shape, path),
        Integer::Values => {
            let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let (shape, v) =
                crate::npy::ids_from_bytes(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
            if shape != b.shape {
                return Err(format!(
                    "{}: input `{}` takes integers of shape {:?} (<i8 or <i4), the file holds {shape:?}",
                    path.display(),
                    b.name,
                    b.shape
                ));
            }
            if let Some((k, x)) = v.iter().enumerate().find(|(_, x)| x.abs() > MAX_EXACT) {
                return Err(format!(
                    "{}: input `{}`: {x} at position {k} is not exact in f32",
                    path.display(),
                    b.name
                ));
            }
            Ok(HostTensor { dtype: b.dtype, shape, data: v.iter().map(|x| *x as f32).collect() })
        }
    }
}

/// Deterministic values for binding `b` as `kind` says: random ids, or random 0/1 values (a
/// mask).
pub fn generated_as(b: &Binding, kind: &Integer, seed: u64) -> HostTensor {
    match kind {
        Integer::OneHot(shape) => generated(b, shape, seed),
        Integer::Values => {
            let mut t = crate::session::generated(b, seed);
            t.data.iter_mut().for_each(|x| *x = if *x < 0.0 { 0.0 } else { 1.0 });
            t
        }
    }
}

/// The integer inputs of a package's model, by name.
pub fn of_package(pkg: &Package) -> BTreeMap<String, Integer> {
    integer_inputs(&pkg.info.model_source)
}

/// The one-hot rows of `ids` for binding `b` (shape: the ids' shape and the vocabulary size).
pub fn one_hot(b: &Binding, ids: &[i64]) -> Result<HostTensor, String> {
    let width = *b.shape.last().unwrap_or(&0);
    let mut data = vec![0f32; (ids.len() as u64 * width) as usize];
    for (k, id) in ids.iter().enumerate() {
        if *id < 0 || *id as u64 >= width {
            return Err(format!("input `{}`: id {id} at position {k} is outside 0..{width}", b.name));
        }
        data[k * width as usize + *id as usize] = 1.0;
    }
    Ok(HostTensor { dtype: b.dtype, shape: b.shape.clone(), data })
}

/// Read the ids file for binding `b`, checking its shape against `ids_shape`; their rows.
pub fn read(b: &Binding, ids_shape: &[u64], path: &Path) -> Result<HostTensor, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (shape, ids) = crate::npy::ids_from_bytes(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    if shape != ids_shape {
        return Err(format!(
            "{}: input `{}` takes integer ids of shape {ids_shape:?} (<i8 or <i4), the file holds {shape:?}",
            path.display(),
            b.name
        ));
    }
    one_hot(b, &ids).map_err(|e| format!("{}: {e}", path.display()))
}

/// Deterministic ids (uniform over the vocabulary, from [`crate::session::generated`]) and
/// their rows.
pub fn generated(b: &Binding, ids_shape: &[u64], seed: u64) -> HostTensor {
    let width = *b.shape.last().unwrap_or(&1);
    let probe = Binding { shape: ids_shape.to_vec(), dtype: DType::F32, ..b.clone() };
    let ids: Vec<i64> = crate::session::generated(&probe, seed)
        .data
        .iter()
        .map(|x| (((x + 1.0) / 2.0 * width as f32) as i64).clamp(0, width as i64 - 1))
        .collect();
    one_hot(b, &ids).expect("ids in range by construction")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(shape: Vec<u64>) -> Binding {
        Binding {
            name: "ids".into(),
            dtype: DType::F16,
            shape,
            direction: ipu_schema::Direction::Input,
            transpose: false,
            scale: 0,
            slices: vec![],
        }
    }

    #[test]
    fn ids_become_rows_with_one_one_and_out_of_range_ids_are_refused() {
        let b = binding(vec![1, 3, 5]);
        let t = one_hot(&b, &[4, 0, 2]).unwrap();
        let want = [0., 0., 0., 0., 1., 1., 0., 0., 0., 0., 0., 0., 1., 0., 0.];
        assert_eq!(t.data, want);
        for bad in [5, -1] {
            let e = one_hot(&b, &[0, bad, 1]).unwrap_err();
            assert!(e.contains(&format!("id {bad} at position 1 is outside 0..5")), "{e}");
        }
        // The model text checks the declaration: f16, the ids' shape and the vocabulary size.
        let model = |dtype: &str, shape: &str, ids: &str| {
            let src = format!(
                "name = \"m\"\noutputs = [\"y\"]\n[inputs.x]\ndtype = \"{dtype}\"\nshape = {shape}\none_hot = {ids}\n\
                 [[ops]]\nop = \"max\"\ninput = \"x\"\noutput = \"y\"\ndtype = \"f16\"\nvalue = 0.0\n"
            );
            crate::model::parse("m.toml", &src).map(|_| ()).map_err(|e| e.to_string())
        };
        model("f16", "[1, 3, 5]", "[1, 3]").expect("well declared");
        for (dtype, shape, ids) in
            [("f32", "[1, 3, 5]", "[1, 3]"), ("f16", "[1, 3]", "[1, 3]"), ("f16", "[2, 3, 5]", "[1, 3]")]
        {
            let e = model(dtype, shape, ids).unwrap_err();
            assert!(e.contains("input `x`: one_hot [1, 3] must be"), "{e}");
        }
        let g = generated(&b, &[1, 3], 7);
        assert_eq!(g.data.iter().filter(|v| **v == 1.0).count(), 3);
        assert_eq!(g.data.iter().filter(|v| **v == 0.0).count(), 12);
    }
}
