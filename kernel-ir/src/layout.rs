//! Layout hints: the physical order of an operand's dimensions and its
//! alignment.
//!
//! Logical indexing in a kernel body never depends on the layout. The layout
//! decides which dimensions are physically minor, and therefore which block
//! dimensions the TPU tiling rules apply to.

use std::fmt;

/// Physical dimension order of an array.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum Order {
    /// The last logical dim is the most minor (C order). The default.
    #[default]
    RowMajor,
    /// Each trailing matrix is stored column-major: the last two logical dims
    /// swap places physically, leading (batch) dims stay outermost. For a
    /// `[B, H, S, D]` key this makes `S` the minor dim, i.e. Kᵀ per head.
    ColMajor,
    /// A general order, XLA style: logical dims listed from most minor to
    /// most major. Must be a permutation of `0..rank`.
    MinorToMajor(Vec<usize>),
}

/// Layout hints of an operand: dimension order and alignment.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Layout {
    /// Physical dimension order.
    pub order: Order,
    /// Required alignment in bytes of every block start, if any (e.g. 128
    /// for operands that feed the MXU).
    pub align: Option<u64>,
}

impl Layout {
    /// Row-major, no alignment requirement.
    pub fn row_major() -> Layout {
        Layout::default()
    }

    /// Column-major trailing matrices, no alignment requirement.
    pub fn col_major() -> Layout {
        Layout {
            order: Order::ColMajor,
            align: None,
        }
    }

    /// A general minor-to-major order.
    pub fn minor_to_major(order: impl Into<Vec<usize>>) -> Layout {
        Layout {
            order: Order::MinorToMajor(order.into()),
            align: None,
        }
    }

    /// The same layout with an alignment requirement in bytes.
    pub fn with_align(mut self, bytes: u64) -> Layout {
        self.align = Some(bytes);
        self
    }

    /// Logical dims from most minor to most major for an array of `rank`.
    ///
    /// Returns `None` when a general order is not a permutation of
    /// `0..rank` (the verifier reports that).
    pub fn minor_to_major_dims(&self, rank: usize) -> Option<Vec<usize>> {
        match &self.order {
            Order::RowMajor => Some((0..rank).rev().collect()),
            Order::ColMajor => {
                let mut dims: Vec<usize> = (0..rank).rev().collect();
                if rank >= 2 {
                    dims.swap(0, 1);
                }
                Some(dims)
            }
            Order::MinorToMajor(dims) => {
                let mut seen = vec![false; rank];
                for &d in dims {
                    if d >= rank || std::mem::replace(&mut seen[d], true) {
                        return None;
                    }
                }
                (dims.len() == rank).then(|| dims.clone())
            }
        }
    }

    /// True when the physical order equals the logical (row-major) one.
    pub fn is_row_major(&self, rank: usize) -> bool {
        self.minor_to_major_dims(rank) == Some((0..rank).rev().collect())
    }

    /// Element strides of each logical dim in the physical order, for an
    /// array of `shape`.
    pub fn strides(&self, shape: &[usize]) -> Option<Vec<usize>> {
        let order = self.minor_to_major_dims(shape.len())?;
        let mut strides = vec![0; shape.len()];
        let mut step = 1usize;
        for &d in &order {
            strides[d] = step;
            step = step.saturating_mul(shape[d]);
        }
        Some(strides)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.order {
            Order::RowMajor => f.write_str("row_major")?,
            Order::ColMajor => f.write_str("col_major")?,
            Order::MinorToMajor(d) => write!(f, "minor_to_major{d:?}")?,
        }
        if let Some(a) = self.align {
            write!(f, ", align {a}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_resolve_per_rank() {
        assert_eq!(
            Layout::row_major().minor_to_major_dims(3),
            Some(vec![2, 1, 0])
        );
        assert_eq!(
            Layout::col_major().minor_to_major_dims(4),
            Some(vec![2, 3, 1, 0])
        );
        assert_eq!(Layout::col_major().minor_to_major_dims(1), Some(vec![0]));
        assert_eq!(Layout::minor_to_major([0, 0]).minor_to_major_dims(2), None);
        assert_eq!(Layout::minor_to_major([0, 1]).minor_to_major_dims(3), None);
        assert!(Layout::minor_to_major([1, 0]).is_row_major(2));
    }

    #[test]
    fn strides_follow_the_physical_order() {
        assert_eq!(
            Layout::row_major().strides(&[2, 3, 4]),
            Some(vec![12, 4, 1])
        );
        assert_eq!(
            Layout::col_major().strides(&[2, 3, 4]),
            Some(vec![12, 1, 3])
        );
    }
}
