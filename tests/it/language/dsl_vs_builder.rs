//! The `#[tpu_kernel]` foundation kernels print exactly the IR of their
//! builder versions, for several configs each.

use kernel_ir::prelude::*;
use kernels::foundation::{self as dsl, AddConfig, MatmulConfig, SoftmaxConfig};
use kernels::norm::{self, NormConfig};

use crate::language::builder_kernels as builder;

fn same<E: std::fmt::Debug>(
    a: Result<kernel_ir::VerifiedKernel, E>,
    b: Result<kernel_ir::VerifiedKernel, E>,
) {
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.to_string(), b.to_string());
    // The IR is equal as data too, locations aside.
    let strip = |k: &kernel_ir::Kernel| {
        let mut k = k.clone();
        k.operands.iter_mut().for_each(|o| o.loc = None);
        k.scratch.iter_mut().for_each(|s| s.loc = None);
        k.grid_loc = None;
        k.loc = None;
        k.body = kernel_ir::Body::default();
        k
    };
    assert_eq!(strip(&a), strip(&b));
}

#[test]
fn add_matches_builder() {
    for (rows, cols, br, bc, dtype) in [(64, 256, 16, 128, F32), (40, 200, 16, 128, BF16)] {
        let c = AddConfig {
            rows,
            cols,
            block_rows: br,
            block_cols: bc,
            dtype,
        };
        same(dsl::add(&c), builder::add(&c));
    }
}

#[test]
fn matmul_matches_builder() {
    for (m, n, k, bk, dtype, out_dtype) in [
        (256, 256, 512, 128, BF16, F32),
        (64, 128, 200, 128, F32, F32),
        (16, 128, 384, 128, BF16, BF16),
    ] {
        let c = MatmulConfig {
            m,
            n,
            k,
            bm: 16,
            bn: 128,
            bk,
            dtype,
            out_dtype,
        };
        same(dsl::matmul(&c), builder::matmul(&c));
    }
}

#[test]
fn softmax_matches_builder() {
    for dtype in [F32, BF16] {
        let c = SoftmaxConfig {
            rows: 64,
            cols: 512,
            block_rows: 16,
            dtype,
        };
        same(dsl::softmax(&c), builder::softmax(&c));
    }
}

#[test]
fn layer_norm_matches_builder() {
    let c = NormConfig {
        rows: 64,
        cols: 256,
        block_rows: 8,
        eps: 1e-5,
        dtype: F32,
    };
    same(norm::layer_norm(&c), builder::layer_norm(&c));
}

#[test]
fn operand_locations_point_at_the_kernel_source() {
    let k = dsl::matmul(&MatmulConfig {
        m: 16,
        n: 128,
        k: 128,
        bm: 16,
        bn: 128,
        bk: 128,
        dtype: F32,
        out_dtype: F32,
    })
    .unwrap();
    let x = k.operands[0].loc.as_ref().unwrap();
    assert!(x.file.ends_with("kernels/src/foundation.rs"), "{x}");
    let mut ops_in_source = true;
    k.body.walk(&mut |op| {
        ops_in_source &= op
            .loc
            .as_ref()
            .is_some_and(|l| l.file.ends_with("foundation.rs"))
    });
    assert!(
        ops_in_source,
        "every op records a location in the kernel's source"
    );
}
