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
    },
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
    /// Inputs, in model order.
    pub inputs: Vec<TensorId>,
    /// Outputs the host reads.
    pub outputs: Vec<TensorId>,
    /// Operations in execution order.
    pub ops: Vec<Op>,
}

impl Graph {
    /// A tensor by id.
    pub fn tensor(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.0 as usize]
    }
    /// Find a tensor by name.
    pub fn find(&self, name: &str) -> Option<TensorId> {
        self.tensors.iter().position(|t| t.name == name).map(|i| TensorId(i as u32))
    }
}

/// Matmul dimensions after transposes: `[M, K] · [K, N]`.
pub fn matmul_dims(a: &Tensor, b: &Tensor, ta: bool, tb: bool) -> Option<(u64, u64, u64)> {
    if a.shape.len() != 2 || b.shape.len() != 2 {
        return None;
    }
    let (m, k) = if ta { (a.shape[1], a.shape[0]) } else { (a.shape[0], a.shape[1]) };
    let (k2, n) = if tb { (b.shape[1], b.shape[0]) } else { (b.shape[0], b.shape[1]) };
    (k == k2).then_some((m, k, n))
}
