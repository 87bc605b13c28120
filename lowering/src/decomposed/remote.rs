//! A kernel across chips as one SPMD program: every device of the mesh
//! runs the same module (`mhlo.num_replicas` = the mesh's size), its
//! logical id is `stablehlo.replica_id`, and a remote copy's start is one
//! collective that delivers every device's copy at that point.
//!
//! * When the destination device is a fixed function of the device id
//!   (`(me + 1) % n`, the rings) and no device receives twice, the copy is
//!   a `stablehlo.collective_permute` of the data and of the destination's
//!   starts (computed on the sender, as the DMA would), with those pairs.
//! * Otherwise (a loop-dependent or shared destination, as in the
//!   all-to-all) every device's copy is all-gathered with its target, and
//!   each device applies, in device order, the ones addressed to it.
//!
//! A fixed destination outside the mesh is a lowering error at the op;
//! a computed one that leaves the mesh is delivered nowhere (the
//! interpreter reports it as an error).

use std::collections::HashMap;

use melior::ir::Block;

use kernel_ir::{
    BinaryOp, CopyDescriptor, DType, Kernel, Literal, Op, OpKind, RemoteTarget, ValueId,
};

use crate::LoweringError;
use crate::mlir::Raw;

use super::Spmd;
use super::step::Step;

/// Channel handles of a kernel's collectives start here, far above the
/// small ids JAX gives the collectives of the program that calls it (the
/// kernel's body is inlined into that program, and a handle names one
/// collective).
const CHANNEL_BASE: i64 = 1 << 20;

/// `#stablehlo.channel_handle<handle = h, type = 1>` (device to device).
fn channel_handle<'c>(
    ir: &crate::mlir::Ir<'c>,
    h: i64,
) -> Result<melior::ir::Attribute<'c>, LoweringError> {
    ir.parse_attr(&format!(
        "#stablehlo.channel_handle<handle = {h}, type = 1>"
    ))
}

/// Values that are a fixed function of the device id: each one's value on
/// every device of the mesh (constants, ids and integer arithmetic on
/// them, outside loops and conditionals or inside).
pub(super) fn per_device_values(k: &Kernel) -> HashMap<ValueId, Vec<i64>> {
    let mut known: HashMap<ValueId, Vec<i64>> = HashMap::new();
    let Some(mesh) = &k.mesh else {
        return known;
    };
    let n = mesh.devices();
    k.body.walk(&mut |op: &Op| {
        let Some(&r) = op.results.first() else {
            return;
        };
        let v = match &op.kind {
            OpKind::Constant {
                value: Literal::Int(c),
                ty,
            } if ty.shape.is_empty() => Some(vec![*c; n]),
            OpKind::DeviceId => Some((0..n as i64).collect()),
            OpKind::AxisIndex { axis } => {
                let (stride, size) = (mesh.stride(*axis) as i64, mesh.axes[*axis].1 as i64);
                Some((0..n as i64).map(|d| (d / stride) % size.max(1)).collect())
            }
            OpKind::Binary { op: b, lhs, rhs } => match (known.get(lhs), known.get(rhs)) {
                (Some(x), Some(y)) => x
                    .iter()
                    .zip(y)
                    .map(|(&a, &c)| integer(*b, a, c))
                    .collect::<Option<Vec<i64>>>(),
                _ => None,
            },
            _ => None,
        };
        if let Some(v) = v {
            known.insert(r, v);
        }
    });
    known
}

/// Integer `a op b` as the kernel computes it (truncating division, C
/// remainder); `None` where it has no value (a zero divisor, an op that is
/// not integer arithmetic).
fn integer(op: BinaryOp, a: i64, b: i64) -> Option<i64> {
    Some(match op {
        BinaryOp::Add => a.checked_add(b)?,
        BinaryOp::Sub => a.checked_sub(b)?,
        BinaryOp::Mul => a.checked_mul(b)?,
        BinaryOp::Div => a.checked_div(b)?,
        BinaryOp::Rem => a.checked_rem(b)?,
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
        BinaryOp::And => a & b,
        BinaryOp::Or => a | b,
        BinaryOp::Xor => a ^ b,
        BinaryOp::Pow => return None,
        BinaryOp::ShiftLeft | BinaryOp::ShiftRightLogical | BinaryOp::ShiftRightArithmetic => {
            op.shift(a, b, 32)?
        }
    })
}

/// `source_target_pairs` when every device's target is fixed, inside the
/// mesh, and no device receives twice; `Ok(None)` when a gather is needed.
fn permutation(
    targets: Option<&Vec<i64>>,
    devices: usize,
    op: &Op,
) -> Result<Option<Vec<(i64, i64)>>, LoweringError> {
    let Some(t) = targets else {
        return Ok(None);
    };
    if let Some((d, &to)) = t
        .iter()
        .enumerate()
        .find(|&(_, &to)| to < 0 || to >= devices as i64)
    {
        return Err(LoweringError::Unsupported {
            op: op.kind.mnemonic().into(),
            loc: op.loc.clone(),
            target: "decomposed",
            reason: format!(
                "device {d} copies to device {to}, outside the mesh of {devices}; \
                 compute the destination modulo the axis size"
            ),
        });
    }
    let mut seen = vec![false; devices];
    for &to in t {
        if std::mem::replace(&mut seen[to as usize], true) {
            return Ok(None);
        }
    }
    Ok(Some(
        t.iter()
            .enumerate()
            .map(|(d, &to)| (d as i64, to))
            .collect(),
    ))
}

impl<'c> Step<'_, 'c> {
    /// This device's logical id: the replica id as i32.
    pub(super) fn device_id(&self, b: &Block<'c>) -> Result<Raw, LoweringError> {
        let ir = self.e.ir;
        let id = ir.op1(
            b,
            match self.spmd {
                Spmd::Replicas => "stablehlo.replica_id",
                Spmd::Partitions => "stablehlo.partition_id",
            },
            &[],
            ir.parse_type("tensor<ui32>")?,
            Vec::new(),
        )?;
        ir.op1(
            b,
            "stablehlo.convert",
            &[id],
            self.e.t(&[], DType::I32),
            Vec::new(),
        )
    }

    /// This device's coordinate along mesh axis `axis`.
    pub(super) fn axis_index(&self, b: &Block<'c>, axis: usize) -> Result<Raw, LoweringError> {
        let mesh = self.mesh()?;
        let e = &self.e;
        let id = self.device_id(b)?;
        let stride = e.scalar_i32(b, mesh.stride(axis) as i64)?;
        let size = e.scalar_i32(b, mesh.axes.get(axis).map_or(1, |a| a.1) as i64)?;
        let q = e.bin(b, "stablehlo.divide", id, stride, DType::I32, &[])?;
        e.bin(b, "stablehlo.remainder", q, size, DType::I32, &[])
    }

    fn mesh(&self) -> Result<&kernel_ir::Mesh, LoweringError> {
        self.k
            .mesh
            .as_ref()
            .ok_or_else(|| LoweringError::Internal("a device op in a kernel without a mesh".into()))
    }

    /// A remote copy's start: this device's source sent, and whatever the
    /// other devices send here written into the destination.
    pub(super) fn remote_start(
        &mut self,
        b: &Block<'c>,
        op: &Op,
        c: &CopyDescriptor,
        r: &RemoteTarget,
    ) -> Result<(), LoweringError> {
        let devices = self.mesh()?.devices();
        let channels = [self.channel(), self.channel(), self.channel()];
        let e = &self.e;
        let ir = e.ir;
        let slot = self.slots.of(c.dst.buffer);
        let dtype = self.k.buffer(c.dst.buffer).map_or(DType::F32, |x| x.1);
        // What leaves: the source view, shaped as the destination access.
        let (src_starts, src_sizes) = self.access(b, &c.src.indices)?;
        let (dst_starts, dst_sizes) = self.access(b, &c.dst.indices)?;
        let mut data = e.dynamic_slice(
            b,
            self.bufs[self.slots.of(c.src.buffer)],
            &src_starts,
            &src_sizes,
            dtype,
        )?;
        if src_sizes != dst_sizes {
            data = e.reshape(b, data, dtype, &dst_sizes)?;
        }
        let rank = dst_starts.len();
        let mut starts1 = Vec::with_capacity(rank);
        for s in &dst_starts {
            starts1.push(e.reshape(b, *s, DType::I32, &[1])?);
        }
        let starts = ir.op1(
            b,
            "stablehlo.concatenate",
            &starts1,
            e.t(&[rank], DType::I32),
            vec![("dimension", ir.i64_attr(0))],
        )?;
        let target = self.start(b, &r.device)?;
        let device_value = match r.device {
            kernel_ir::IndexValue::Static(t) => Some(vec![t; devices]),
            kernel_ir::IndexValue::Dynamic(v) => self.per_device.get(&v).cloned(),
        };
        let dst_ty = self.buffer_type(slot);
        let mut dst = self.bufs[slot];
        match permutation(device_value.as_ref(), devices, op)? {
            Some(pairs) => {
                let list: Vec<String> = pairs.iter().map(|(s, t)| format!("[{s}, {t}]")).collect();
                let attr = ir.parse_attr(&format!(
                    "dense<[{}]> : tensor<{}x2xi64>",
                    list.join(", "),
                    pairs.len()
                ))?;
                let permute = |x: Raw, shape: &[usize], d: DType, channel: Option<i64>| {
                    let mut attrs = vec![("source_target_pairs", attr)];
                    if let Some(h) = channel {
                        attrs.push(("channel_handle", channel_handle(ir, h)?));
                    }
                    ir.op1(
                        b,
                        "stablehlo.collective_permute",
                        &[x],
                        e.t(shape, d),
                        attrs,
                    )
                };
                let data = permute(data, &dst_sizes, dtype, channels[0])?;
                let starts = permute(starts, &[rank], DType::I32, channels[1])?;
                let at = self.unpack_starts(b, starts, rank)?;
                // Every device receives exactly once (a permutation).
                dst = e.dynamic_update_slice(b, dst, data, &at, dst_ty)?;
            }
            None => {
                let gather = |x: Raw,
                              shape: &[usize],
                              d: DType,
                              channel: Option<i64>|
                 -> Result<Raw, LoweringError> {
                    let mut one = vec![1];
                    one.extend_from_slice(shape);
                    let x = e.reshape(b, x, d, &one)?;
                    let mut all = vec![devices];
                    all.extend_from_slice(shape);
                    let ids: Vec<String> = (0..devices).map(|i| i.to_string()).collect();
                    let mut attrs = vec![
                        ("all_gather_dim", ir.i64_attr(0)),
                        (
                            "replica_groups",
                            ir.parse_attr(&format!(
                                "dense<[[{}]]> : tensor<1x{devices}xi64>",
                                ids.join(", ")
                            ))?,
                        ),
                    ];
                    if let Some(h) = channel {
                        // Partitioned: the groups name global device ids.
                        attrs.push(("channel_handle", channel_handle(ir, h)?));
                        attrs.push(("use_global_device_ids", ir.parse_attr("unit")?));
                    }
                    ir.op1(b, "stablehlo.all_gather", &[x], e.t(&all, d), attrs)
                };
                let all_data = gather(data, &dst_sizes, dtype, channels[0])?;
                let all_starts = gather(starts, &[rank], DType::I32, channels[1])?;
                let all_targets = gather(target, &[], DType::I32, channels[2])?;
                let me = self.device_id(b)?;
                for from in 0..devices {
                    let zero = e.scalar_i32(b, 0)?;
                    let row = e.scalar_i32(b, from as i64)?;
                    let mut at = vec![row];
                    at.extend(std::iter::repeat_n(zero, dst_sizes.len()));
                    let mut one = vec![1];
                    one.extend_from_slice(&dst_sizes);
                    let d = e.dynamic_slice(b, all_data, &at, &one, dtype)?;
                    let d = e.reshape(b, d, dtype, &dst_sizes)?;
                    let s = e.dynamic_slice(b, all_starts, &[row, zero], &[1, rank], DType::I32)?;
                    let s = e.reshape(b, s, DType::I32, &[rank])?;
                    let to = e.dynamic_slice(b, all_targets, &[row], &[1], DType::I32)?;
                    let to = e.reshape(b, to, DType::I32, &[])?;
                    let here = e.compare(b, kernel_ir::CompareOp::Eq, to, me, DType::I32, &[])?;
                    let at = self.unpack_starts(b, s, rank)?;
                    let written = e.dynamic_update_slice(b, dst, d, &at, dst_ty)?;
                    dst = ir.op1(
                        b,
                        "stablehlo.select",
                        &[here, written, dst],
                        dst_ty,
                        Vec::new(),
                    )?;
                }
            }
        }
        self.bufs[slot] = dst;
        Ok(())
    }

    /// A fresh channel handle for a partitioned collective (`None` for a
    /// replicated one, which needs none).
    fn channel(&mut self) -> Option<i64> {
        (self.spmd == Spmd::Partitions).then(|| {
            self.channels += 1;
            CHANNEL_BASE + self.channels
        })
    }

    /// The scalar starts packed in a `[rank]` tensor.
    fn unpack_starts(
        &self,
        b: &Block<'c>,
        packed: Raw,
        rank: usize,
    ) -> Result<Vec<Raw>, LoweringError> {
        let e = &self.e;
        let mut out = Vec::with_capacity(rank);
        for i in 0..rank {
            let i = e.scalar_i32(b, i as i64)?;
            let s = e.dynamic_slice(b, packed, &[i], &[1], DType::I32)?;
            out.push(e.reshape(b, s, DType::I32, &[])?);
        }
        Ok(out)
    }
}
