//! The printed IR of the foundation kernels, pinned with insta.
//! Review changes with `cargo insta review`.

use kernel_ir::prelude::*;
use kernels::foundation::*;
use kernels::norm::{NormConfig, layer_norm};

#[test]
fn add_ir() {
    let k = add(&AddConfig {
        rows: 64,
        cols: 256,
        block_rows: 16,
        block_cols: 128,
        dtype: F32,
    })
    .unwrap();
    tessera_testing::assert_snapshot_in!("ir", "add_ir", k.to_string());
}

#[test]
fn matmul_ir() {
    let k = matmul(&MatmulConfig {
        m: 256,
        n: 256,
        k: 512,
        bm: 128,
        bn: 128,
        bk: 128,
        dtype: BF16,
        out_dtype: F32,
    })
    .unwrap();
    tessera_testing::assert_snapshot_in!("ir", "matmul_ir", format!("{}\n{}", *k, k.vmem_budget()));
}

#[test]
fn matmul_ragged_k_ir() {
    let k = matmul(&MatmulConfig {
        m: 64,
        n: 128,
        k: 200,
        bm: 64,
        bn: 128,
        bk: 128,
        dtype: F32,
        out_dtype: F32,
    })
    .unwrap();
    tessera_testing::assert_snapshot_in!("ir", "matmul_ragged_k_ir", k.to_string());
}

#[test]
fn softmax_ir() {
    let k = softmax(&SoftmaxConfig {
        rows: 64,
        cols: 512,
        block_rows: 16,
        dtype: BF16,
    })
    .unwrap();
    tessera_testing::assert_snapshot_in!("ir", "softmax_ir", k.to_string());
}

#[test]
fn layer_norm_ir() {
    let k = layer_norm(&NormConfig {
        rows: 64,
        cols: 256,
        block_rows: 8,
        eps: 1e-5,
        dtype: F32,
    })
    .unwrap();
    tessera_testing::assert_snapshot_in!("ir", "layer_norm_ir", k.to_string());
}
