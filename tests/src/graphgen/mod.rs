//! Random model graphs (issue 38): seeded, deterministic DAGs of the model format's ops
//! (docs/model-format.md) with odd shapes, several outputs, unused sources and params, for the
//! differential oracle in [`crate::oracle`]. A graph is kept as a [`GraphSpec`] — sources, ops
//! with named operands and attributes — rather than as text, so that the minimiser
//! ([`crate::shrink`]) can drop ops, sources and outputs and rewrite sizes, and render again.
//!
//! Determinism: everything is drawn from one splitmix64 stream per seed, in a fixed order; no hash
//! map is iterated (the same seed gives the same text, byte for byte, on every machine).

use ipu_host::reference::HostTensor;
use ipu_schema::DType;
use std::fmt::Write as _;
use std::path::Path;

mod draw;
pub use draw::generate;

/// splitmix64: tiny, seedable, and good enough for drawing graphs.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A stream for `seed` (`salt` separates independent streams of one seed).
    pub fn new(seed: u64, salt: u64) -> Self {
        Rng(seed ^ salt.wrapping_mul(0xD1B5_4A32_D192_ED03))
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// True with probability `p` percent.
    pub fn pct(&mut self, p: u32) -> bool {
        self.below(100) < p as usize
    }
    /// One of `items`, uniformly.
    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }
    /// An index drawn with the given weights.
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u32 = weights.iter().sum();
        let mut x = self.below(total as usize) as u32;
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return i;
            }
            x -= w;
        }
        weights.len() - 1
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// An op attribute's value, rendered as TOML.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// `true` / `false`.
    Bool(bool),
    /// An integer (a cast's scale).
    Int(i64),
    /// A float (alpha, eps, exponent), rendered so that TOML reads it back as a float.
    Float(f64),
    /// A string (`approximate`).
    Str(String),
    /// A list of integers (shape, perm, starts, ends).
    List(Vec<i64>),
}

/// A model input or a param.
#[derive(Clone, Debug, PartialEq)]
pub struct Source {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u64>,
    /// `Some` for a param: how its `.npy` is written.
    pub param: Option<Param>,
}

/// How a param's values are written: FP8 params as codes (`|u1`, taken as they are) or as `<f4`
/// values converted by the cast rules; f16/f32 params as `<f4` (f16 ones then rounded by the build).
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    /// FP8 scale (`scale = …`), FP8 params only.
    pub scale: Option<i8>,
    /// Write FP8 codes rather than values.
    pub codes: bool,
}

/// One `[[ops]]` entry: tensor operands by field (`a`, `b`, `input`, `gamma`, `beta`) and the
/// other fields, in the order they are written.
#[derive(Clone, Debug, PartialEq)]
pub struct OpSpec {
    /// `op = …`.
    pub op: String,
    /// Tensor-valued fields.
    pub operands: Vec<(String, String)>,
    /// Other fields.
    pub attrs: Vec<(String, Attr)>,
    /// The result's name.
    pub output: String,
    /// The result's dtype.
    pub dtype: DType,
}

/// A whole random model and the tile count it is built for.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphSpec {
    /// The seed it was drawn from (kept through minimisation, for the record).
    pub seed: u64,
    /// Target tiles.
    pub tiles: usize,
    /// Inputs and params, in declaration order.
    pub sources: Vec<Source>,
    /// Ops in order.
    pub ops: Vec<OpSpec>,
    /// Model outputs.
    pub outputs: Vec<String>,
}

/// The model format's name of a dtype.
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::F8E4M3 => "f8e4m3",
        DType::F8E5M2 => "f8e5m2",
    }
}

pub(crate) fn is_fp8(d: DType) -> bool {
    matches!(d, DType::F8E4M3 | DType::F8E5M2)
}

fn fmt_float(x: f64) -> String {
    let s = format!("{x:?}");
    if s.contains(['.', 'e', 'E']) || !x.is_finite() {
        s
    } else {
        format!("{s}.0")
    }
}

impl GraphSpec {
    /// The model file, params read from `<param_dir>NAME.npy` (`param_dir` is `""` or ends in `/`).
    pub fn to_toml(&self, param_dir: &str) -> String {
        let mut s = String::new();
        let outs: Vec<String> = self.outputs.iter().map(|o| format!("\"{o}\"")).collect();
        let _ = writeln!(s, "name = \"g{}\"\noutputs = [{}]", self.seed, outs.join(", "));
        for src in &self.sources {
            let kind = if src.param.is_some() { "params" } else { "inputs" };
            let _ = write!(
                s,
                "\n[{kind}.{}]\ndtype = \"{}\"\nshape = {:?}\n",
                src.name,
                dtype_name(src.dtype),
                src.shape
            );
            if let Some(p) = &src.param {
                if let Some(sc) = p.scale {
                    let _ = writeln!(s, "scale = {sc}");
                }
                let _ = writeln!(s, "file = \"{param_dir}{}.npy\"", src.name);
            }
        }
        for op in &self.ops {
            let _ = write!(s, "\n[[ops]]\nop = \"{}\"\n", op.op);
            for (f, t) in &op.operands {
                let _ = writeln!(s, "{f} = \"{t}\"");
            }
            let _ = writeln!(s, "output = \"{}\"\ndtype = \"{}\"", op.output, dtype_name(op.dtype));
            for (f, a) in &op.attrs {
                let v = match a {
                    Attr::Bool(b) => b.to_string(),
                    Attr::Int(i) => i.to_string(),
                    Attr::Float(x) => fmt_float(*x),
                    Attr::Str(t) => format!("\"{t}\""),
                    Attr::List(l) => format!("{l:?}"),
                };
                let _ = writeln!(s, "{f} = {v}");
            }
        }
        s
    }

    /// The values a param's `.npy` holds: deterministic in the seed, the name and the shape.
    pub fn param_tensor(&self, src: &Source) -> HostTensor {
        let p = src.param.as_ref().expect("a param");
        let salt = src
            .name
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3));
        let mut rng = Rng::new(self.seed, salt);
        let n: u64 = src.shape.iter().product();
        let (dtype, data) = if p.codes {
            // Every FP8 code but 0x80 (the one NaN): a NaN param is not what this tests.
            let codes = (0..n).map(|_| ((rng.below(255) + 0x81) % 256) as f32).collect();
            (src.dtype, codes)
        } else {
            (DType::F32, (0..n).map(|_| rng.unit()).collect())
        };
        HostTensor { dtype, shape: src.shape.clone(), data }
    }

    /// Write every param's `.npy` into `dir`.
    pub fn write_params(&self, dir: &Path) -> std::io::Result<()> {
        for src in self.sources.iter().filter(|s| s.param.is_some()) {
            let bytes = ipu_host::npy::to_bytes(&self.param_tensor(src)).map_err(std::io::Error::other)?;
            std::fs::write(dir.join(format!("{}.npy", src.name)), bytes)?;
        }
        Ok(())
    }

    /// Every tensor name an op reads.
    pub fn reads(&self) -> Vec<&str> {
        self.ops.iter().flat_map(|o| o.operands.iter().map(|(_, t)| t.as_str())).collect()
    }
}
