//! The graph IR: tensors and ordered operations, as parsed from a model file.

use alloc::string::String;
use alloc::vec::Vec;
use ipu_schema::DType;

/// Index of a tensor in [`Graph::tensors`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TensorId(pub u32);

/// A tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor {
    /// Name from the model.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape (row-major).
    pub shape: Vec<u64>,
    /// FP8 only: a code `c` stands for the value `c × 2^scale` (a cast stores `round(x / 2^scale)`).
    pub scale: i8,
}

impl Tensor {
    /// Elements.
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// Operations.
#[derive(Clone, Debug, PartialEq)]
pub enum OpKind {
    /// `output = a · b` with optional transposes.
    MatMul {
        /// Left operand.
        a: TensorId,
        /// Right operand.
        b: TensorId,
        /// `a` is stored `[K, M]`.
        transpose_a: bool,
        /// `b` is stored `[N, K]`.
        transpose_b: bool,
        /// Partial-sum type.
        accumulate: DType,
        /// Scalar applied to the product.
        alpha: Option<f32>,
    },
    /// `output = cast(input)` to the output's dtype and scale.
    Cast {
        /// Source.
        input: TensorId,
    },
    /// Softmax over the last axis, statistics in f32.
    Softmax {
        /// Source.
        input: TensorId,
    },
    /// `output = gelu(input)`, f16 in and out, f32 arithmetic (docs/kernels.md).
    Gelu {
        /// Source.
        input: TensorId,
        /// The tanh approximation, the erf form or the quick (sigmoid) GeLU.
        form: GeluForm,
    },
    /// `output = f(input)` for one of the elementwise functions of `MapFn`, f16 in and out, f32
    /// arithmetic (docs/kernels.md `map_f16`): what an imported model's elementwise composition
    /// that no fused kernel recognises is lowered to, one function at a time.
    Map {
        /// Source.
        input: TensorId,
        /// Which function.
        func: MapFn,
        /// The function's constant (`MapFn::field`): the exponent of `Pow`, the bound of `Max` and
        /// `Min`, the slope of `LeakyRelu`; 1 for every other function.
        exponent: f32,
    },
    /// Layer normalisation over the last axis, f16 in and out, statistics in f32
    /// (docs/kernels.md `layernorm_f16`): `y = ((x − μ)·(1/√(σ² + eps)))·gamma + beta`.
    LayerNorm {
        /// Source.
        input: TensorId,
        /// Scale per column (f16 `[D]`); 1 when absent.
        gamma: Option<TensorId>,
        /// Shift per column (f16 `[D]`); 0 when absent.
        beta: Option<TensorId>,
        /// Added to the variance.
        eps: f32,
    },
    /// One value per row of the last axis: the row's sum (`reduce_sum`) or mean (`reduce_mean`),
    /// f16 in and out, the sum in f32 (docs/kernels.md `reduce_rows_f16`); the output's shape is
    /// the input's with a last axis of 1.
    Reduce {
        /// Source.
        input: TensorId,
        /// The mean (the f32 sum times 1/D) rather than the sum.
        mean: bool,
    },
    /// The same values in row-major order with the output's shape (no data movement).
    Reshape {
        /// Source.
        input: TensorId,
    },
    /// The box `starts .. starts + output shape` of the input (no data movement: a view, read
    /// where the input's bytes are).
    Slice {
        /// Source.
        input: TensorId,
        /// First index kept on every axis.
        starts: Vec<u64>,
    },
    /// `output[i_perm[0], …] = input[i_0, …]`: axis `k` of the output is axis `perm[k]` of the input.
    Transpose {
        /// Source.
        input: TensorId,
        /// Permutation of the input's axes.
        perm: Vec<usize>,
    },
    /// `output = a ∘ b` (`+`, `−`, `×`) with NumPy broadcasting, f16 (each result rounded once
    /// to f16).
    Binary {
        /// Which operation.
        op: BinaryOp,
        /// Left operand.
        a: TensorId,
        /// Right operand.
        b: TensorId,
    },
}

/// The elementwise binary operations (`OpKind::Binary`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a − b`.
    Sub,
    /// `a × b`.
    Mul,
}

impl BinaryOp {
    /// `a ∘ b` in `T`'s arithmetic (the reference applies it in f32 as the device does, and in f64).
    pub fn apply<T>(self, a: T, b: T) -> T
    where
        T: core::ops::Add<Output = T> + core::ops::Sub<Output = T> + core::ops::Mul<Output = T>,
    {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
        }
    }

    /// The model-file name (`op = "add"`).
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
        }
    }
}

/// The two forms of GeLU (`OpKind::Gelu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GeluForm {
    /// `0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))` (`gelu_pytorch_tanh`, `approximate = "tanh"`).
    Tanh,
    /// `x·Φ(x) = 0.5x(1 + erf(x/√2))` (`approximate = "none"`), erf by Abramowitz & Stegun 7.1.26.
    Erf,
    /// The quick GeLU `x·σ(1.702x) = x/(1 + e^{−1.702x})` (`approximate = "sigmoid"`): CLIP's
    /// `quick_gelu`, which torch exports as `Mul`, `Sigmoid`, `Mul`. A form of its own so that it
    /// fuses into a matmul's epilogue as the other two do.
    Sigmoid,
}

/// The elementwise functions of `OpKind::Map`, each one kernel (`map_f16`) with its own f32
/// formula (docs/kernels.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MapFn {
    /// `tanh x = 1 − 2/(e^{2x} + 1)`.
    Tanh,
    /// `1/(1 + e^{−x})`.
    Sigmoid,
    /// `e^x`.
    Exp,
    /// `ln x` (NaN below 0, −∞ at 0).
    Log,
    /// `√x` (NaN below 0).
    Sqrt,
    /// `1/x`.
    Reciprocal,
    /// `|x| = √(x²)` (exact for f16 values).
    Abs,
    /// `erf x`, Abramowitz & Stegun 7.1.26 (absolute error ≤ 1.5e−7) with x's sign.
    Erf,
    /// `x^c = e^{c·ln x}` for a constant `c` (NaN below 0: integer powers are products instead).
    Pow,
    /// `max(x, c)` for a constant `c` (maxNum: a NaN input gives `c`); `relu` is `max(x, 0)`.
    Max,
    /// `min(x, c) = −max(−x, −c)` for a constant `c` (a NaN input gives `c`).
    Min,
    /// `max(x, α·x)`: `x` for x ≥ 0, `α·x` below, for a constant slope `α ≤ 1`.
    LeakyRelu,
}

impl MapFn {
    /// Every function, in the order of the model-file names.
    pub const ALL: [MapFn; 12] = [
        MapFn::Tanh,
        MapFn::Sigmoid,
        MapFn::Exp,
        MapFn::Log,
        MapFn::Sqrt,
        MapFn::Reciprocal,
        MapFn::Abs,
        MapFn::Erf,
        MapFn::Pow,
        MapFn::Max,
        MapFn::Min,
        MapFn::LeakyRelu,
    ];

    /// The model-file name (`op = "tanh"`).
    pub fn name(self) -> &'static str {
        match self {
            MapFn::Tanh => "tanh",
            MapFn::Sigmoid => "sigmoid",
            MapFn::Exp => "exp",
            MapFn::Log => "log",
            MapFn::Sqrt => "sqrt",
            MapFn::Reciprocal => "reciprocal",
            MapFn::Abs => "abs",
            MapFn::Erf => "erf",
            MapFn::Pow => "pow",
            MapFn::Max => "max",
            MapFn::Min => "min",
            MapFn::LeakyRelu => "leaky_relu",
        }
    }

    /// The model-file field of the function's constant, if it takes one.
    pub fn field(self) -> Option<&'static str> {
        match self {
            MapFn::Pow => Some("exponent"),
            MapFn::Max | MapFn::Min => Some("value"),
            MapFn::LeakyRelu => Some("alpha"),
            _ => None,
        }
    }

    /// The function of a model-file name.
    pub fn from_name(name: &str) -> Option<MapFn> {
        MapFn::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl OpKind {
    /// A view: the same values read another way, no data movement (a reshape, a slice, a transpose
    /// that keeps the last axis). The planner reads the bytes where they are.
    pub fn is_view(&self) -> bool {
        match self {
            OpKind::Reshape { .. } | OpKind::Slice { .. } => true,
            OpKind::Transpose { perm, .. } => perm.last() == Some(&(perm.len().wrapping_sub(1))),
            _ => false,
        }
    }
    /// The tensors the op reads, in operand order.
    pub fn operands(&self) -> Vec<TensorId> {
        match *self {
            OpKind::MatMul { a, b, .. } | OpKind::Binary { a, b, .. } => alloc::vec![a, b],
            OpKind::Cast { input }
            | OpKind::Softmax { input }
            | OpKind::Gelu { input, .. }
            | OpKind::Map { input, .. }
            | OpKind::Reduce { input, .. }
            | OpKind::Reshape { input }
            | OpKind::Slice { input, .. }
            | OpKind::Transpose { input, .. } => alloc::vec![input],
            OpKind::LayerNorm { input, gamma, beta, .. } => {
                core::iter::once(input).chain(gamma).chain(beta).collect()
            }
        }
    }
}

/// One operation.
#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    /// What it computes.
    pub kind: OpKind,
    /// The tensor it defines.
    pub output: TensorId,
}

/// A model.
#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    /// Model name.
    pub name: String,
    /// All tensors.
    pub tensors: Vec<Tensor>,
    /// Inputs, in model order: written by the host before each inference.
    pub inputs: Vec<TensorId>,
    /// Params (weights), in model order: values in the package, resident on the chip.
    pub params: Vec<TensorId>,
    /// Outputs the host reads.
    pub outputs: Vec<TensorId>,
    /// Operations in execution order.
    pub ops: Vec<Op>,
    /// Sources whose bytes a planner must leave as they are: in a stage's graph (`stages.rs`),
    /// the inputs that ops of other stages also read from where this stage is given them, or that
    /// the host reads back. Empty for a whole model.
    pub shared: Vec<TensorId>,
}

impl Graph {
    /// A tensor by id.
    pub fn tensor(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.0 as usize]
    }
    /// Whether a tensor is given rather than computed: an input or a param. Planners place both
    /// the same way; the build turns a param's placement into resident data.
    pub fn is_source(&self, id: TensorId) -> bool {
        self.inputs.contains(&id) || self.params.contains(&id)
    }
    /// Whether some op reads a tensor's values: an op that computes, or a view (reshape, slice,
    /// last-axis-keeping transpose: no data movement) whose own result is read or is an output.
    /// An input or param nothing reads is not placed: the package binds nothing for it, and `run`
    /// ignores values given for it.
    pub fn is_read(&self, id: TensorId) -> bool {
        self.ops.iter().any(|o| {
            o.kind.operands().contains(&id)
                && (!o.kind.is_view() || self.outputs.contains(&o.output) || self.is_read(o.output))
        })
    }
    /// Whether `id`'s value reaches a model output: it is an output, or an op whose result is
    /// needed reads it. An input or param that is not needed may be left unbound by the build
    /// (a dead op's operand); the package contract requires a binding for every needed one.
    pub fn is_needed(&self, id: TensorId) -> bool {
        self.needed().get(id.0 as usize).copied().unwrap_or(false)
    }
    /// [`Graph::is_needed`] of every tensor, by index: one pass over the ops from the last (ops
    /// are in the order they run), marking the operands of each op whose result is needed.
    pub fn needed(&self) -> Vec<bool> {
        let mut needed = alloc::vec![false; self.tensors.len()];
        for o in &self.outputs {
            needed[o.0 as usize] = true;
        }
        for op in self.ops.iter().rev() {
            if needed[op.output.0 as usize] {
                for t in op.kind.operands() {
                    needed[t.0 as usize] = true;
                }
            }
        }
        needed
    }
    /// Find a tensor by name.
    pub fn find(&self, name: &str) -> Option<TensorId> {
        self.tensors.iter().position(|t| t.name == name).map(|i| TensorId(i as u32))
    }
}

/// NumPy broadcast of two shapes (`None` when they do not broadcast).
pub fn broadcast_shape(a: &[u64], b: &[u64]) -> Option<Vec<u64>> {
    let len = a.len().max(b.len());
    let at = |s: &[u64], i: usize| if i + s.len() >= len { s[i + s.len() - len] } else { 1 };
    (0..len)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// Matmul dimensions of rank-2 operands after transposes: `[M, K] · [K, N]`.
pub fn matmul_dims(a: &Tensor, b: &Tensor, ta: bool, tb: bool) -> Option<(u64, u64, u64)> {
    if a.shape.len() != 2 || b.shape.len() != 2 {
        return None;
    }
    matmul_shape(a, b, ta, tb).map(|(_, m, k, n)| (m, k, n))
}

/// Batched matmul shape: `[..., M, K] · [..., K, N]` with the leading dimensions broadcast as
/// NumPy does. Returns (batch shape, M, K, N).
pub fn matmul_shape(a: &Tensor, b: &Tensor, ta: bool, tb: bool) -> Option<(Vec<u64>, u64, u64, u64)> {
    let (ra, rb) = (a.shape.len(), b.shape.len());
    if ra < 2 || rb < 2 {
        return None;
    }
    let (m, k) = if ta { (a.shape[ra - 1], a.shape[ra - 2]) } else { (a.shape[ra - 2], a.shape[ra - 1]) };
    let (k2, n) = if tb { (b.shape[rb - 1], b.shape[rb - 2]) } else { (b.shape[rb - 2], b.shape[rb - 1]) };
    if k != k2 {
        return None;
    }
    let (ba, bb) = (&a.shape[..ra - 2], &b.shape[..rb - 2]);
    let len = ba.len().max(bb.len());
    let mut batch = Vec::with_capacity(len);
    for i in 0..len {
        let da = if i + ba.len() >= len { ba[i + ba.len() - len] } else { 1 };
        let db = if i + bb.len() >= len { bb[i + bb.len() - len] } else { 1 };
        batch.push(match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        });
    }
    Some((batch, m, k, n))
}
