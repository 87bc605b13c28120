//! Bounded dynamism: lengths rounded up to a few bucket sizes.

use std::sync::Arc;

use kernel_ir::Array;

use super::node::{DynLen, Node};
use super::{Runtime, RuntimeError, Tensor};

/// At most this many buckets per dynamic dim: each is one compile.
pub const MAX_BUCKETS: usize = 8;

/// The sizes a dynamic dim is padded to, ascending.
///
/// ```
/// use graph::Buckets;
/// let b = Buckets::new([128, 256, 512]).unwrap();
/// assert_eq!(b.bucket(200), Some(256));
/// assert_eq!(b.bucket(600), None);
/// assert!(Buckets::new([1, 2, 3, 4, 5, 6, 7, 8, 9]).is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buckets {
    sizes: Vec<usize>,
}

impl Buckets {
    /// Buckets of these sizes (sorted and deduplicated; 1 to 8 of them,
    /// each > 0).
    pub fn new(sizes: impl Into<Vec<usize>>) -> Result<Buckets, RuntimeError> {
        let mut sizes = sizes.into();
        sizes.sort_unstable();
        sizes.dedup();
        let bad = |m: String| RuntimeError::Record {
            message: m,
            loc: "Buckets::new".into(),
        };
        if sizes.is_empty() || sizes.len() > MAX_BUCKETS {
            return Err(bad(format!(
                "give 1 to {MAX_BUCKETS} bucket sizes (each is one compile), got {}",
                sizes.len()
            )));
        }
        if sizes[0] == 0 {
            return Err(bad("bucket sizes must be positive".into()));
        }
        Ok(Buckets { sizes })
    }

    /// The smallest bucket that holds `len`.
    pub fn bucket(&self, len: usize) -> Option<usize> {
        self.sizes.iter().copied().find(|&b| b >= len)
    }

    /// The sizes.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }
}

/// `array` with `dim` zero-padded to `to`.
fn pad(array: &Array, dim: usize, to: usize) -> Array {
    let shape = array.shape();
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let n = shape[dim];
    let mut data = vec![0.0; outer * to * inner];
    for o in 0..outer {
        let src = &array.data()[o * n * inner..(o + 1) * n * inner];
        data[o * to * inner..o * to * inner + n * inner].copy_from_slice(src);
    }
    let mut padded = shape.to_vec();
    padded[dim] = to;
    Array::new(array.dtype(), padded, data).unwrap_or_else(|_| array.clone())
}

pub(super) fn upload_dynamic(
    rt: &Runtime,
    array: &Array,
    dim: usize,
    buckets: &Buckets,
    loc: String,
) -> Result<Tensor, RuntimeError> {
    let shape = array.shape();
    if dim >= shape.len() {
        return Err(RuntimeError::Record {
            message: format!(
                "dim {dim} is out of range for an array of rank {}",
                shape.len()
            ),
            loc,
        });
    }
    let len = shape[dim];
    let size = match buckets.bucket(len) {
        Some(b) => b,
        None if rt.inner.options.recompile_past_last_bucket => len,
        None => {
            return Err(RuntimeError::Record {
                message: format!(
                    "length {len} of dim {dim} is past the last bucket ({}); add a larger bucket, \
                     or set RuntimeOptions::recompile_past_last_bucket to compile for this length",
                    buckets.sizes().last().copied().unwrap_or(0)
                ),
                loc,
            });
        }
    };
    let padded = pad(array, dim, size);
    let len_array = Array::new(kernel_ir::DType::I32, [1], vec![len as f64])
        .map_err(|e| RuntimeError::Internal(e.to_string()))?;
    let len_node = rt.upload(&vec![len_array; rt.inner.devices], loc.clone(), vec![None])?;
    let mut dims = vec![None; shape.len()];
    dims[dim] = Some(Arc::new(DynLen {
        node: len_node,
        valid: len,
    }));
    let node = rt.upload(&vec![padded; rt.inner.devices], loc, dims)?;
    {
        let mut s = rt.inner.stats();
        *s.buckets.entry(size).or_default() += 1;
        let row: usize = shape
            .iter()
            .enumerate()
            .filter(|(d, _)| *d != dim)
            .map(|(_, &x)| x)
            .product();
        let padding = ((size - len) * row * array.dtype().bytes()) as u64;
        s.padding_bytes += padding;
        drop(s);
        if let Some(mut span) = rt.inner.tracer.span("bucket") {
            span.arg("length", len);
            span.arg("bucket", size);
            span.arg("padding_bytes", padding);
            span.arg("bytes", (size * row * array.dtype().bytes()) as u64);
        }
    }
    Ok(Tensor::from_node(rt.clone(), node))
}

/// A ready `i32[1]` node holding `v` (the valid length of a static dim).
pub(super) fn length_node(rt: &Runtime, v: usize, loc: String) -> Result<Arc<Node>, RuntimeError> {
    let a = Array::new(kernel_ir::DType::I32, [1], vec![v as f64])
        .map_err(|e| RuntimeError::Internal(e.to_string()))?;
    rt.upload(&vec![a; rt.inner.devices], loc, vec![None])
}
