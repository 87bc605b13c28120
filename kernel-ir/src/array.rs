//! Host arrays: the inputs and outputs of interpreted kernels.

use std::fmt;

use crate::ops::ShapeDisplay;
use crate::{DType, Element};

/// A dense, row-major host array. Values are stored as f64 but always hold
/// something the dtype can represent exactly (they are rounded on the way
/// in), so comparisons against a reference see the dtype's true values.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    dtype: DType,
    shape: Vec<usize>,
    data: Vec<f64>,
}

/// Why an array could not be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("shape {} holds {expected} elements but {found} values were given", ShapeDisplay(.shape))]
pub struct ArrayError {
    /// The shape asked for.
    pub shape: Vec<usize>,
    /// Elements it holds.
    pub expected: usize,
    /// Values given.
    pub found: usize,
}

fn count(shape: &[usize]) -> usize {
    shape.iter().fold(1usize, |a, &d| a.saturating_mul(d))
}

impl Array {
    /// An array from f64 values, each rounded to `dtype`.
    pub fn new(
        dtype: DType,
        shape: impl Into<Vec<usize>>,
        data: Vec<f64>,
    ) -> Result<Array, ArrayError> {
        let shape = shape.into();
        let expected = count(&shape);
        if expected != data.len() {
            return Err(ArrayError {
                shape,
                expected,
                found: data.len(),
            });
        }
        let data = data.into_iter().map(|v| dtype.round(v)).collect();
        Ok(Array { dtype, shape, data })
    }

    /// An array from typed host values.
    pub fn from_elems<T: Element>(
        shape: impl Into<Vec<usize>>,
        data: &[T],
    ) -> Result<Array, ArrayError> {
        Array::new(T::DTYPE, shape, data.iter().map(|v| v.to_f64()).collect())
    }

    /// The elements as little-endian bytes of the dtype (what PJRT buffers
    /// and native kernels hold; bool is one byte, 0 or 1).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let d = &self.data;
        match self.dtype {
            DType::F32 => d
                .iter()
                .flat_map(|&v| crate::dtype::f32_narrow(v).to_le_bytes())
                .collect(),
            DType::BF16 => d
                .iter()
                .flat_map(|&v| half::bf16::from_f64(v).to_le_bytes())
                .collect(),
            DType::F16 => d
                .iter()
                .flat_map(|&v| half::f16::from_f64(v).to_le_bytes())
                .collect(),
            DType::I32 => d.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect(),
            DType::I8 => d.iter().map(|&v| v as i8 as u8).collect(),
            DType::Bool => d.iter().map(|&v| (v != 0.0) as u8).collect(),
            DType::F8E4M3FN => d.iter().map(|&v| crate::fp8::E4M3FN.encode(v)).collect(),
            DType::F8E5M2 => d.iter().map(|&v| crate::fp8::E5M2.encode(v)).collect(),
        }
    }

    /// An array from little-endian bytes of `dtype`, the inverse of
    /// [`Array::to_le_bytes`]; the byte count must match the shape.
    pub fn from_le_bytes(
        dtype: DType,
        shape: impl Into<Vec<usize>>,
        bytes: &[u8],
    ) -> Result<Array, ArrayError> {
        let shape = shape.into();
        let expected = count(&shape);
        let width = dtype.bytes();
        if bytes.len() != expected.saturating_mul(width) {
            return Err(ArrayError {
                shape,
                expected,
                found: bytes.len() / width.max(1),
            });
        }
        let data: Vec<f64> = match dtype {
            DType::F32 => bytes
                .chunks_exact(4)
                .map(|c| crate::dtype::f32_widen(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
            DType::BF16 => bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DType::F16 => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DType::I32 => bytes
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                .collect(),
            DType::I8 => bytes.iter().map(|&b| b as i8 as f64).collect(),
            DType::Bool => bytes.iter().map(|&b| (b != 0) as u8 as f64).collect(),
            DType::F8E4M3FN => bytes
                .iter()
                .map(|&b| crate::fp8::E4M3FN.decode(b))
                .collect(),
            DType::F8E5M2 => bytes.iter().map(|&b| crate::fp8::E5M2.decode(b)).collect(),
        };
        Ok(Array { dtype, shape, data })
    }

    /// All zeros (false for bool).
    pub fn zeros(dtype: DType, shape: impl Into<Vec<usize>>) -> Array {
        let shape = shape.into();
        let n = count(&shape);
        Array {
            dtype,
            shape,
            data: vec![0.0; n],
        }
    }

    /// Uniform pseudo-random values in `[lo, hi)` (integers: `lo..hi`;
    /// bool: fair coin), deterministic for a seed.
    pub fn random(
        dtype: DType,
        shape: impl Into<Vec<usize>>,
        seed: u64,
        lo: f64,
        hi: f64,
    ) -> Array {
        let shape = shape.into();
        let mut rng = SplitMix64(seed);
        let data = (0..count(&shape))
            .map(|_| {
                let u = rng.next_f64();
                let v = match dtype {
                    DType::Bool => (u < 0.5) as u8 as f64,
                    d if d.is_int() => (lo + u * (hi - lo)).floor(),
                    _ => lo + u * (hi - lo),
                };
                dtype.round(v)
            })
            .collect();
        Array { dtype, shape, data }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Values in row-major order.
    pub fn data(&self) -> &[f64] {
        &self.data
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The values as a typed vector.
    pub fn to_vec<T: Element>(&self) -> Vec<T> {
        self.data.iter().map(|&v| T::from_f64(v)).collect()
    }

    /// The element at a multi-index, if in bounds.
    pub fn get(&self, index: &[usize]) -> Option<f64> {
        if index.len() != self.shape.len() {
            return None;
        }
        let mut flat = 0usize;
        for (&i, &n) in index.iter().zip(&self.shape) {
            if i >= n {
                return None;
            }
            flat = flat * n + i;
        }
        self.data.get(flat).copied()
    }

    /// The same values converted (rounded) to another dtype.
    pub fn cast(&self, dtype: DType) -> Array {
        Array {
            dtype,
            shape: self.shape.clone(),
            data: self.data.iter().map(|&v| dtype.round(v)).collect(),
        }
    }

    /// Builds from parts already rounded to `dtype` (internal fast path).
    pub(crate) fn from_parts(dtype: DType, shape: Vec<usize>, data: Vec<f64>) -> Array {
        Array { dtype, shape, data }
    }
}

impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{} ", self.dtype, ShapeDisplay(&self.shape))?;
        let shown: Vec<String> = self
            .data
            .iter()
            .take(8)
            .map(|v| format!("{v:.6}"))
            .collect();
        write!(f, "[{}", shown.join(", "))?;
        if self.data.len() > 8 {
            write!(f, ", ... ({} more)", self.data.len() - 8)?;
        }
        f.write_str("]")
    }
}

/// A small, fast, seedable generator (splitmix64) for test and demo data;
/// not for cryptography.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    /// An element of `xs` (not empty), uniformly.
    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())].clone()
    }
}
