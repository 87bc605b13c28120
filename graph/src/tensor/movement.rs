//! Data movement: reshape, transpose, broadcasts, slices, concatenation
//! and the collectives across devices.

use std::panic::Location;

use super::*;
use crate::RuntimeError;
use crate::node::Op;

impl Tensor {
    /// The same elements in a new shape. A bucketed dim must stay a dim of
    /// its own (same size, same elements before it).
    #[track_caller]
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let n = &self.node;
        let count: usize = shape.iter().product();
        let have: usize = n.shape.iter().product();
        if count != have {
            return Err(err(
                format!(
                    "cannot reshape {:?} ({have} elements) to {shape:?} ({count})",
                    n.shape
                ),
                loc,
            ));
        }
        let mut dims = vec![None; shape.len()];
        for (d, dy) in n.dims.iter().enumerate() {
            let Some(dy) = dy else { continue };
            let before: usize = n.shape[..d].iter().product();
            let target = (0..shape.len()).find(|&e| {
                shape[e] == n.shape[d] && shape[..e].iter().product::<usize>() == before
            });
            match target {
                Some(e) => dims[e] = Some(dy.clone()),
                None => {
                    return Err(err(
                        format!(
                            "dim {d} is padded to a bucket; the reshape to {shape:?} would mix its padding into other dims"
                        ),
                        loc,
                    ));
                }
            }
        }
        self.record(
            Op::Reshape,
            vec![n.clone()],
            shape.to_vec(),
            n.dtype,
            dims,
            loc,
        )
    }

    /// Permutes dims: result dim `i` is input dim `perm[i]`.
    #[track_caller]
    pub fn transpose(&self, perm: &[usize]) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let n = &self.node;
        let mut seen = vec![false; n.shape.len()];
        if perm.len() != n.shape.len()
            || perm
                .iter()
                .any(|&p| p >= seen.len() || std::mem::replace(&mut seen[p], true))
        {
            return Err(err(
                format!("{perm:?} is not a permutation of {} dims", n.shape.len()),
                loc,
            ));
        }
        self.record(
            Op::Transpose(perm.to_vec()),
            vec![n.clone()],
            perm.iter().map(|&p| n.shape[p]).collect(),
            n.dtype,
            perm.iter().map(|&p| n.dims[p].clone()).collect(),
            loc,
        )
    }

    /// Broadcasts to `shape`, input dim `i` becoming output dim `dims[i]`
    /// (sizes equal or 1).
    #[track_caller]
    pub fn broadcast_in_dim(
        &self,
        shape: &[usize],
        dims: &[usize],
    ) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let n = &self.node;
        if dims.len() != n.shape.len() {
            return Err(err(
                format!(
                    "give one output dim per input dim ({}), got {dims:?}",
                    n.shape.len()
                ),
                loc,
            ));
        }
        let mut out_dims = vec![None; shape.len()];
        for (i, &d) in dims.iter().enumerate() {
            if d >= shape.len()
                || (n.shape[i] != 1 && n.shape[i] != shape[d])
                || (i > 0 && dims[i - 1] >= d)
            {
                return Err(err(
                    format!(
                        "cannot broadcast {:?} to {shape:?} with dims {dims:?}: dims must increase and sizes match or be 1",
                        n.shape
                    ),
                    loc,
                ));
            }
            if n.shape[i] == shape[d] {
                out_dims[d] = n.dims[i].clone();
            }
        }
        self.record(
            Op::Broadcast(dims.to_vec()),
            vec![n.clone()],
            shape.to_vec(),
            n.dtype,
            out_dims,
            loc,
        )
    }

    /// Broadcasts trailing-aligned, NumPy style.
    #[track_caller]
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let rank = self.node.shape.len();
        if rank > shape.len() {
            return Err(err(
                format!(
                    "cannot broadcast {:?} to the lower-rank {shape:?}",
                    self.node.shape
                ),
                loc,
            ));
        }
        let dims: Vec<usize> = (shape.len() - rank..shape.len()).collect();
        self.broadcast_in_dim(shape, &dims)
            .map_err(|e| relocate(e, loc))
    }

    /// Elements `start[d]..limit[d]` of each dim (not along a bucketed
    /// dim: its valid length is only known at run time).
    #[track_caller]
    pub fn slice(&self, start: &[usize], limit: &[usize]) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let n = &self.node;
        if start.len() != n.shape.len() || limit.len() != n.shape.len() {
            return Err(err(
                format!("give a start and a limit per dim ({})", n.shape.len()),
                loc,
            ));
        }
        for d in 0..n.shape.len() {
            if start[d] > limit[d] || limit[d] > n.shape[d] {
                return Err(err(
                    format!(
                        "dim {d}: {}..{} is not inside 0..{}",
                        start[d], limit[d], n.shape[d]
                    ),
                    loc,
                ));
            }
            if n.dims[d].is_some() && (start[d], limit[d]) != (0, n.shape[d]) {
                return Err(err(
                    format!("dim {d} is padded to a bucket; slice it after to_host"),
                    loc,
                ));
            }
        }
        self.record(
            Op::Slice {
                start: start.to_vec(),
                limit: limit.to_vec(),
            },
            vec![n.clone()],
            start.iter().zip(limit).map(|(s, l)| l - s).collect(),
            n.dtype,
            n.dims.clone(),
            loc,
        )
    }

    /// Concatenates `self` and `others` along `axis`.
    #[track_caller]
    pub fn concat(&self, others: &[&Tensor], axis: usize) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let n = &self.node;
        if axis >= n.shape.len() {
            return Err(err(
                format!("axis {axis} is out of range for rank {}", n.shape.len()),
                loc,
            ));
        }
        let mut shape = n.shape.clone();
        let mut dims = n.dims.clone();
        let mut inputs = vec![n.clone()];
        for o in others {
            self.same_runtime(o, loc)?;
            let m = &o.node;
            let same_other_dims = m.shape.len() == n.shape.len()
                && (0..n.shape.len()).all(|d| d == axis || m.shape[d] == n.shape[d]);
            if m.dtype != n.dtype || !same_other_dims {
                return Err(err(
                    format!(
                        "cannot concatenate {}{:?} to {}{:?} along {axis}",
                        m.dtype, m.shape, n.dtype, n.shape
                    ),
                    loc,
                ));
            }
            dims = merge_dims(&dims, &m.dims, loc)?;
            shape[axis] += m.shape[axis];
            inputs.push(m.clone());
        }
        if inputs.iter().any(|i| i.dims[axis].is_some()) {
            return Err(err(
                format!("dim {axis} is padded to a bucket; concatenate after to_host"),
                loc,
            ));
        }
        self.record(Op::Concat(axis), inputs, shape, n.dtype, dims, loc)
    }

    /// The sum over all devices, on every device.
    #[track_caller]
    pub fn all_reduce_sum(&self) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let n = &self.node;
        self.record(
            Op::AllReduce,
            vec![n.clone()],
            n.shape.clone(),
            n.dtype,
            n.dims.clone(),
            loc,
        )
    }

    /// Every device's value concatenated along `axis`, on every device.
    #[track_caller]
    pub fn all_gather(&self, axis: usize) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let n = &self.node;
        if axis >= n.shape.len() || n.dims[axis].is_some() {
            return Err(err(
                format!(
                    "all_gather needs an unpadded axis below rank {}",
                    n.shape.len()
                ),
                loc,
            ));
        }
        let mut shape = n.shape.clone();
        shape[axis] *= self.rt.inner.devices;
        self.record(
            Op::AllGather(axis),
            vec![n.clone()],
            shape,
            n.dtype,
            n.dims.clone(),
            loc,
        )
    }

    /// The sum over all devices, split along `axis`: device `d` gets the
    /// `d`-th of `devices` equal parts (the size along `axis` must divide
    /// by the device count). The transpose of [`Tensor::all_gather`].
    #[track_caller]
    pub fn reduce_scatter_sum(&self, axis: usize) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let n = &self.node;
        let devices = self.rt.inner.devices;
        if axis >= n.shape.len() || n.dims[axis].is_some() || !n.shape[axis].is_multiple_of(devices)
        {
            return Err(err(
                format!(
                    "reduce_scatter_sum needs an unpadded axis below rank {} whose size divides by the {devices} devices, got axis {axis} of {:?}",
                    n.shape.len(),
                    n.shape
                ),
                loc,
            ));
        }
        let mut shape = n.shape.clone();
        shape[axis] /= devices;
        self.record(
            Op::ReduceScatter(axis),
            vec![n.clone()],
            shape,
            n.dtype,
            n.dims.clone(),
            loc,
        )
    }
}
