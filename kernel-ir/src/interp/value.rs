//! Values the interpreter computes with.

use crate::DType;

/// A runtime value: a tile with optional per-element poison.
#[derive(Clone, Debug)]
pub(crate) struct Val {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
    /// `None` when every element is defined.
    pub poison: Option<Vec<bool>>,
}

impl Val {
    pub(crate) fn clean(dtype: DType, shape: Vec<usize>, data: Vec<f64>) -> Val {
        Val {
            dtype,
            shape,
            data,
            poison: None,
        }
    }

    pub(crate) fn is_poison(&self, i: usize) -> bool {
        self.poison.as_ref().is_some_and(|p| p[i])
    }

    pub(crate) fn any_poison(&self) -> bool {
        self.poison.as_ref().is_some_and(|p| p.iter().any(|&b| b))
    }
}

/// Start and length of the indexed range in each buffer dim.
pub(crate) type Ranges = Vec<(i64, usize)>;
