//! The dispatch fast path: a pending subgraph's *structure* (ops and their
//! attributes, shapes, dtypes, padding, which inputs are materialized
//! leaves, which constants are structural) as a SHA-256 fingerprint, and
//! per fingerprint the executable and how to bind its parameters. A sync
//! whose structure was seen before skips lowering, printing and hashing
//! the module: it binds the new leaves and scalars to the cached
//! executable and runs it.
//!
//! The fingerprint encodes everything the module text depends on (the
//! text is a function of it: `lower` reads nothing else), so equal
//! fingerprints mean equal modules; the binding plan is read off the
//! `Program` lowered on the first sync, in the order `lower` assigns
//! parameters (materialized inputs in first-use order, then non-structural
//! constants in node order, then outputs that were already materialized).

use std::collections::HashMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::lower::{Param, Pending, Program, is_structural};
use super::node::{Node, Op};
use runtime::pjrt::Executable;

/// Where each parameter of a cached executable comes from.
#[derive(Clone, Debug)]
pub(crate) enum Slot {
    /// The `i`-th materialized leaf, in first-use order.
    Leaf(usize),
    /// The `i`-th non-structural constant node, in node order.
    Scalar(usize),
}

/// A cached executable and its binding.
pub(crate) struct Plan {
    pub executable: Arc<Executable>,
    pub slots: Vec<Slot>,
    /// Layout changes per execution (count, bytes), for the stats.
    pub transposes: (u64, u64),
}

/// Entries kept before the memo is cleared (a program that records ever
/// new structures must not grow it without bound).
pub(crate) const CAPACITY: usize = 4096;

/// The subgraph's materialized leaves in first-use order (as `lower`
/// makes them parameters) and non-structural constants in node order.
pub(crate) struct Shape {
    pub fingerprint: [u8; 32],
    pub leaves: Vec<Arc<Node>>,
    pub scalars: Vec<(f64, kernel_ir::DType)>,
}

fn put(h: &mut Sha256, v: u64) {
    h.update(v.to_le_bytes());
}

fn put_list(h: &mut Sha256, v: &[usize]) {
    put(h, v.len() as u64);
    for &x in v {
        put(h, x as u64);
    }
}

/// The fingerprint of `order` computing `outputs`, with `salt` (devices,
/// platform and kernel lowering).
pub(crate) fn shape_of(order: &[Pending], outputs: &[Arc<Node>], salt: &str) -> Option<Shape> {
    let mut h = Sha256::new();
    h.update(salt.as_bytes());
    let mut pos: HashMap<u64, u64> = HashMap::new();
    let mut leaves = Vec::new();
    // Leaves first, as `lower` names them.
    for (_, _, inputs) in order {
        for i in inputs {
            if !pos.contains_key(&i.id) && i.deferred().is_none() {
                pos.insert(i.id, leaves.len() as u64);
                put(&mut h, 1);
                put_list(&mut h, &i.shape);
                put(&mut h, i.dtype as u64);
                leaves.push(i.clone());
            }
        }
    }
    let base = 1u64 << 40;
    let mut scalars = Vec::new();
    let mut calls: HashMap<usize, u64> = HashMap::new();
    for (k, (n, op, inputs)) in order.iter().enumerate() {
        put(&mut h, 2);
        put_list(&mut h, &n.shape);
        put(&mut h, n.dtype as u64);
        for d in &n.dims {
            put(&mut h, u64::from(d.is_some()));
        }
        for i in inputs {
            put(&mut h, *pos.get(&i.id)?);
        }
        match op {
            Op::Constant(v) if !is_structural(*v) => {
                scalars.push((*v, n.dtype));
                h.update(b"scalar");
            }
            Op::Literal(a) => {
                h.update(b"literal");
                put_list(&mut h, a.shape());
                for v in a.data() {
                    put(&mut h, v.to_bits());
                }
            }
            Op::Kernel { call, output } => {
                // The kernel's identity is its printed IR.
                h.update(runtime::host_call::kernel_key(&call.kernel).as_bytes());
                // Outputs of one call share it; two calls are two.
                let next = calls.len() as u64;
                put(
                    &mut h,
                    *calls.entry(Arc::as_ptr(call) as usize).or_insert(next),
                );
                put(&mut h, *output as u64);
            }
            other => h.update(format!("{other:?}").as_bytes()),
        }
        pos.insert(n.id, base + k as u64);
    }
    // Which outputs, in order (a materialized one is a leaf).
    for o in outputs {
        match pos.get(&o.id) {
            Some(p) => put(&mut h, *p),
            None => {
                pos.insert(o.id, leaves.len() as u64);
                put(&mut h, 3);
                put_list(&mut h, &o.shape);
                leaves.push(o.clone());
            }
        }
    }
    Some(Shape {
        fingerprint: h.finalize().into(),
        leaves,
        scalars,
    })
}

/// The binding of `program`'s parameters to `shape`'s leaves and scalars.
pub(crate) fn slots(program: &Program, shape: &Shape) -> Option<Vec<Slot>> {
    let index: HashMap<u64, usize> = shape
        .leaves
        .iter()
        .enumerate()
        .map(|(i, n)| (n.id, i))
        .collect();
    let mut next_scalar = 0;
    program
        .params
        .iter()
        .map(|p| match p {
            Param::Node(n) => index.get(&n.id).map(|&i| Slot::Leaf(i)),
            Param::Scalar(..) => {
                next_scalar += 1;
                (next_scalar <= shape.scalars.len()).then_some(Slot::Scalar(next_scalar - 1))
            }
        })
        .collect()
}

/// The parameters of a cached plan for this sync's leaves and scalars.
pub(crate) fn bind(plan: &Plan, shape: &Shape) -> Option<Vec<Param>> {
    plan.slots
        .iter()
        .map(|s| match s {
            Slot::Leaf(i) => shape.leaves.get(*i).map(|n| Param::Node(n.clone())),
            Slot::Scalar(i) => shape.scalars.get(*i).map(|&(v, d)| Param::Scalar(v, d)),
        })
        .collect()
}
