//! Invalid kernels the text form cannot express (builder misuse, library
//! kernels altered after building, the interpreter's argument checks, a
//! budget checked by its arithmetic): each breaks one rule and gets that
//! rule's error. The rest are files: `tests/filetests/verify` and `interp`
//! (format: `kernel_ir::filetest`).

use kernel_ir::prelude::*;
use kernel_ir::{ErrorKind, KernelErrors, VerifiedKernel};
use kernels::foundation::{MatmulConfig, matmul};

/// The errors of a kernel that must not verify.
fn rejected(r: Result<VerifiedKernel, KernelErrors>) -> KernelErrors {
    match r {
        Ok(k) => panic!("kernel `{}` verified but should not have:\n{}", k.name, *k),
        Err(e) => e,
    }
}

/// A one-operand copy kernel with the given dtype, shape, block and layout.
fn copy(
    dtype: DType,
    shape: [usize; 2],
    block: [usize; 2],
    layout: Layout,
) -> Result<VerifiedKernel, KernelErrors> {
    let mut k = KernelBuilder::new("copy");
    let grid = [shape[0].div_ceil(block[0]), shape[1].div_ceil(block[1])];
    k.grid(grid, [Parallel, Parallel]);
    let x = k
        .input("x", dtype, shape)
        .block(block, |[i, j]| (i, j))
        .layout(layout);
    let o = k.output("o", dtype, shape).block(block, |[i, j]| (i, j));
    o.store(.., x.load(..));
    k.build()
}

#[test]
fn vmem_overflow_shows_the_breakdown() {
    let e = rejected(copy(F32, [4096, 4096], [2048, 2048], Layout::row_major()));
    let ErrorKind::VmemOverflow(b) = &e.first().unwrap().kind else {
        panic!("{e}")
    };
    // Two double-buffered 16 MiB windows, and the compiler's own share
    // (a copy has no matmul to spill: just the fixed headroom).
    assert_eq!(b.total(), 2 * 2 * 2048 * 2048 * 4 + (64 << 10));
    let msg = e.to_string();
    for needle in [
        "(compiler)",
        "exceeds the scoped limit 32.0 MiB",
        "x ",
        "o ",
        "16.0 MiB",
        "vmem_limit",
    ] {
        assert!(msg.contains(needle), "missing {needle:?} in {msg}");
    }
}

#[test]
fn state_carried_on_a_parallel_dim() {
    // The matmul accumulator carries state along k; making k parallel is a
    // race on hardware.
    let c = MatmulConfig {
        m: 8,
        n: 128,
        k: 256,
        bm: 8,
        bn: 128,
        bk: 128,
        dtype: F32,
        out_dtype: F32,
    };
    // With a bf16 output the state is the f32 scratch; with an f32 output
    // the output block itself accumulates (it is read back every step).
    for (out_dtype, carrier) in [(BF16, "acc"), (F32, "o")] {
        let c = MatmulConfig {
            out_dtype,
            ..c.clone()
        };
        assert!(matmul(&c).is_ok());
        let mut kernel = matmul(&c).unwrap().into_kernel();
        kernel.grid.dims[2].semantics = Parallel;
        let e = rejected(kernel.verify());
        assert!(
            e.any(
                |k| matches!(k, ErrorKind::ParallelCarry { scratch, dim: 2 } if scratch == carrier)
            ),
            "{e}"
        );
    }
}

#[test]
fn ragged_reduction_without_a_mask_is_poison() {
    // k = 200 with bk = 128 and the mask removed: the second k block reads
    // past the end of x and y, and that garbage reaches the output.
    let c = MatmulConfig {
        m: 8,
        n: 128,
        k: 200,
        bm: 8,
        bn: 128,
        bk: 128,
        dtype: F32,
        out_dtype: F32,
    };
    let mut kernel = matmul(&c).unwrap().into_kernel();
    strip_masks(&mut kernel.body.region);
    let kernel = kernel.verify().unwrap();
    let args = [Array::zeros(F32, [8, 200]), Array::zeros(F32, [200, 128])];
    let e = interpret(&kernel, &args).unwrap_err();
    assert!(
        matches!(
            &e.kind,
            ErrorKind::PoisonRead {
                buffer: "output",
                ..
            }
        ),
        "{e}"
    );
}

fn strip_masks(r: &mut kernel_ir::Region) {
    for op in &mut r.ops {
        match &mut op.kind {
            kernel_ir::OpKind::Load { mask, .. } => *mask = None,
            kernel_ir::OpKind::If {
                then_region,
                else_region,
                ..
            } => {
                strip_masks(then_region);
                strip_masks(else_region);
            }
            kernel_ir::OpKind::For { body, .. } => strip_masks(body),
            _ => {}
        }
    }
}

#[test]
fn index_map_taking_fewer_grid_indices_than_the_grid_has() {
    let mut k = KernelBuilder::new("grid_rank");
    k.grid([4, 2], [Parallel, Parallel]);
    k.input("x", F32, [32, 256]).block([8, 128], |[i]| (i, 0));
    let e = rejected(k.build());
    assert!(
        e.any(|k| matches!(
            k,
            ErrorKind::Builder(kernel_ir::BuilderMisuse::IndexMapArity {
                takes: 1,
                grid_rank: 2
            })
        )),
        "{e}"
    );
}

#[test]
fn a_tile_from_another_builder() {
    let mut a = KernelBuilder::new("a");
    let xa = a.input("x", F32, [8, 128]);
    let t = xa.load(..);
    let mut b = KernelBuilder::new("b");
    let o = b.output("o", F32, [8, 128]);
    o.store(.., t);
    let e = rejected(b.build());
    assert!(e.any(|k| matches!(k, ErrorKind::ForeignTile)), "{e}");
    assert!(a.build().is_ok());
}

#[test]
fn wrong_inputs_to_the_interpreter() {
    let kernel = copy(F32, [8, 128], [8, 128], Layout::row_major()).unwrap();
    let e = interpret(&kernel, &[]).unwrap_err();
    assert!(
        matches!(&e.kind, ErrorKind::Arguments(a) if a.to_string().contains("takes 1 arrays (x: f32[8, 128])")),
        "{e}"
    );
    let e = interpret(&kernel, &[Array::zeros(BF16, [8, 128])]).unwrap_err();
    assert!(
        matches!(&e.kind, ErrorKind::Arguments(a) if a.to_string().contains("must be f32[8, 128] but got bf16[8, 128]")),
        "{e}"
    );
}
