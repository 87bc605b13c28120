//! Invalid kernels: each breaks one rule and gets that rule's error.

use kernel_ir::prelude::*;
use kernel_ir::{ErrorKind, InterpOptions, KernelErrors, VerifiedKernel, interpret_with};
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
fn f32_block_lane_dim_not_a_multiple_of_128() {
    let e = rejected(copy(F32, [64, 256], [8, 64], Layout::row_major()));
    let first = e.first().unwrap();
    assert!(
        matches!(
            &first.kind,
            ErrorKind::Tiling {
                dim: 1,
                block: 64,
                which: "minor (lane)",
                ..
            }
        ),
        "{e}"
    );
    let msg = first.to_string();
    assert!(
        msg.contains("multiple of 128 lanes or the full array dim 256"),
        "{msg}"
    );
    assert!(msg.contains("use 128 or 256"), "{msg}");
}

#[test]
fn f32_block_sublane_dim_not_a_multiple_of_8() {
    let e = rejected(copy(F32, [64, 256], [4, 128], Layout::row_major()));
    assert!(
        e.any(|k| matches!(
            k,
            ErrorKind::Tiling {
                dim: 0,
                block: 4,
                ..
            }
        )),
        "{e}"
    );
}

#[test]
fn bf16_block_needs_16_rows() {
    // 8 rows is a legal f32 tile but half a bf16 one.
    assert!(copy(F32, [64, 256], [8, 128], Layout::row_major()).is_ok());
    let e = rejected(copy(BF16, [64, 256], [8, 128], Layout::row_major()));
    let msg = e.to_string();
    assert!(
        msg.contains("multiple of 16 rows (bf16 tiles are (16, 128))"),
        "{msg}"
    );
}

#[test]
fn col_major_block_is_tiled_on_its_physical_minor_dim() {
    // [64, 64] blocks of a [256, 64] array: fine row-major (64 = full lane
    // dim), but col-major makes dim 0 the lane dim, and 64 is not 128.
    assert!(copy(F32, [256, 64], [64, 64], Layout::row_major()).is_ok());
    let e = rejected(copy(F32, [256, 64], [64, 64], Layout::col_major()));
    assert!(
        e.any(|k| matches!(
            k,
            ErrorKind::Tiling {
                dim: 0,
                which: "minor (lane)",
                ..
            }
        )),
        "{e}"
    );
}

#[test]
fn rank1_block_must_be_full_1024_or_power_of_two() {
    let mut k = KernelBuilder::new("v");
    k.grid([10], [Parallel]);
    let x = k.input("x", F32, [1000]).block([100], |[i]| [i]);
    let o = k.output("o", F32, [1000]).block([100], |[i]| [i]);
    o.store(.., x.load(..));
    let e = rejected(k.build());
    assert!(
        e.any(|k| matches!(
            k,
            ErrorKind::Tiling {
                which: "only",
                block: 100,
                ..
            }
        )),
        "{e}"
    );
}

#[test]
fn block_start_misaligned_along_the_minor_dim() {
    // i8 blocks of 128 lanes start every 128 bytes; align = 256 is broken
    // by the second block.
    let e = rejected(copy(
        I8,
        [32, 512],
        [32, 128],
        Layout::row_major().with_align(256),
    ));
    assert!(
        e.any(|k| matches!(
            k,
            ErrorKind::Misaligned {
                dim: 1,
                offset: 128,
                align: 256,
                ..
            }
        )),
        "{e}"
    );
    assert!(
        copy(
            I8,
            [32, 512],
            [32, 256],
            Layout::row_major().with_align(256)
        )
        .is_ok()
    );
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
fn vmem_limit_above_the_target_is_rejected() {
    let mut k = KernelBuilder::new("big");
    k.target(Target::V5p);
    k.vmem_limit(100 << 20);
    let e = rejected(k.build());
    assert!(
        e.any(|k| matches!(
            k,
            ErrorKind::VmemLimitTooLarge {
                target: Target::V5p,
                ..
            }
        )),
        "{e}"
    );
}

#[test]
fn index_map_out_of_bounds() {
    let mut k = KernelBuilder::new("shift");
    k.grid([4], [Parallel]);
    let x = k
        .input("x", F32, [32, 128])
        .block([8, 128], |[i]| (i + 1, 0));
    let o = k.output("o", F32, [32, 128]).block([8, 128], |[i]| (i, 0));
    o.store(.., x.load(..));
    let e = rejected(k.build());
    assert!(
        e.any(|k| matches!(k, ErrorKind::BlockOutOfBounds { grid, blocks: 4, .. } if grid == &[3])),
        "{e}"
    );
}

#[test]
fn dot_operands_of_different_dtypes() {
    let mut k = KernelBuilder::new("mixed");
    let a = k.input("a", F32, [8, 128]);
    let b = k.input("b", BF16, [128, 128]);
    let o = k.output("o", F32, [8, 128]);
    o.store(.., dot(a.load(..), b.load(..)));
    let e = rejected(k.build());
    assert!(e.any(|k| matches!(k, ErrorKind::DotDType { .. })), "{e}");
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
fn scratch_without_reset_on_a_parallel_grid() {
    let mut k = KernelBuilder::new("sum_rows");
    k.grid([4], [Parallel]);
    let x = k.input("x", F32, [32, 128]).block([8, 128], |[i]| (i, 0));
    let o = k.output("o", F32, [32, 128]).block([8, 128], |[i]| (i, 0));
    let acc = k.scratch("acc", F32, [8, 128]);
    acc.store(.., acc.load(..) + x.load(..));
    o.store(.., acc.load(..));
    let e = rejected(k.build());
    assert!(
        e.any(|k| matches!(k, ErrorKind::ParallelCarry { dim: 0, .. })),
        "{e}"
    );
}

#[test]
fn read_of_poisoned_scratch_is_reported_by_the_interpreter() {
    // All dims arbitrary: carrying state is legal, but the first step reads
    // scratch nobody wrote.
    let mut k = KernelBuilder::new("running_sum");
    k.grid([4], [Arbitrary]);
    let x = k.input("x", F32, [32, 128]).block([8, 128], |[i]| (i, 0));
    let o = k.output("o", F32, [32, 128]).block([8, 128], |[i]| (i, 0));
    let acc = k.scratch("acc", F32, [8, 128]);
    let line = line!() + 1;
    let s = acc.load(..) + x.load(..);
    acc.store(.., s);
    o.store(.., s);
    let kernel = k.build().unwrap();
    let x = Array::random(F32, [32, 128], 1, -1.0, 1.0);
    let e = interpret(&kernel, &[x]).unwrap_err();
    assert!(
        matches!(&e.kind, ErrorKind::PoisonRead { buffer: "scratch", name, .. } if name == "acc"),
        "{e}"
    );
    let loc = e.loc.as_ref().expect("the load has a location");
    assert!(
        loc.file.ends_with("invalid.rs") && loc.line == line,
        "{loc}"
    );
}

#[test]
fn unwritten_output_is_reported() {
    let mut k = KernelBuilder::new("half");
    k.grid([2], [Parallel]);
    let x = k.input("x", F32, [32, 128]).block([8, 128], |[i]| (i, 0));
    let o = k.output("o", F32, [32, 128]).block([8, 128], |[i]| (i, 0));
    o.store(.., x.load(..));
    let kernel = k.build().unwrap();
    let e = interpret(&kernel, &[Array::zeros(F32, [32, 128])]).unwrap_err();
    assert!(
        matches!(&e.kind, ErrorKind::UnwrittenOutput { count: 2048, total: 4096, first, .. } if first == &[16, 0]),
        "{e}"
    );
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
fn block_larger_than_the_array() {
    let e = rejected(copy(F32, [8, 128], [16, 128], Layout::row_major()));
    assert!(
        e.any(|k| matches!(
            k,
            ErrorKind::BlockTooLarge {
                dim: 0,
                block: 16,
                array: 8,
                ..
            }
        )),
        "{e}"
    );
}

#[test]
fn duplicate_operand_names() {
    let mut k = KernelBuilder::new("dup");
    k.input("x", F32, [8, 128]);
    k.output("x", F32, [8, 128]);
    let e = rejected(k.build());
    assert!(
        e.any(|k| matches!(k, ErrorKind::DuplicateName { name } if name == "x")),
        "{e}"
    );
}

#[test]
fn index_map_with_the_wrong_number_of_block_indices() {
    let mut k = KernelBuilder::new("arity");
    k.grid([4], [Parallel]);
    k.input("x", F32, [32, 128]).block([8, 128], |[i]| [i]);
    let e = rejected(k.build());
    assert!(
        e.any(|k| matches!(
            k,
            ErrorKind::IndexMapArity {
                found: 1,
                expected: 2,
                ..
            }
        )),
        "{e}"
    );
}

#[test]
fn index_map_taking_fewer_grid_indices_than_the_grid_has() {
    let mut k = KernelBuilder::new("grid_rank");
    k.grid([4, 2], [Parallel, Parallel]);
    k.input("x", F32, [32, 256]).block([8, 128], |[i]| (i, 0));
    let e = rejected(k.build());
    assert!(e.any(|k| matches!(k, ErrorKind::Builder(m) if m.contains("takes 1 grid indices but the grid has 2"))), "{e}");
}

#[test]
fn elementwise_shapes_that_do_not_broadcast() {
    let mut k = KernelBuilder::new("shapes");
    let a = k.input("a", F32, [8, 128]);
    let b = k.input("b", F32, [8, 256]);
    let o = k.output("o", F32, [8, 128]);
    let line = line!() + 1;
    let s = a.load(..) + b.load(..);
    o.store(.., s);
    let e = rejected(k.build());
    let first = e.first().unwrap();
    assert!(matches!(first.kind, ErrorKind::Shape { .. }), "{e}");
    // Reported once, at the add, not again at the store that uses it.
    assert_eq!(e.0.len(), 1, "{e}");
    assert_eq!(first.loc.as_ref().map(|l| l.line), Some(line));
}

#[test]
fn store_to_an_input() {
    let mut k = KernelBuilder::new("ro");
    let x = k.input("x", F32, [8, 128]);
    x.store(.., 1.0);
    let e = rejected(k.build());
    assert!(
        e.any(|k| matches!(k, ErrorKind::ReadOnly { buffer, .. } if buffer == "x")),
        "{e}"
    );
}

#[test]
fn branch_on_a_tile_instead_of_a_scalar() {
    let mut k = KernelBuilder::new("cond");
    let x = k.input("x", F32, [8, 128]);
    let o = k.output("o", F32, [8, 128]);
    when(x.load(..).gt(0.0), || o.store(.., 1.0));
    let e = rejected(k.build());
    assert!(
        e.any(|k| matches!(k, ErrorKind::NotScalar { op: "if", .. })),
        "{e}"
    );
}

#[test]
fn prefetch_driven_block_index_out_of_bounds_at_run_time() {
    let mut k = KernelBuilder::new("gather");
    k.grid([2], [Parallel]);
    let table = k.scalar_prefetch("table", [2]);
    let x = k
        .input("x", F32, [32, 128])
        .block([8, 128], |[i]| (table.at(i), 0));
    let o = k.output("o", F32, [16, 128]).block([8, 128], |[i]| (i, 0));
    o.store(.., x.load(..));
    let kernel = k.build().unwrap();
    let x = Array::zeros(F32, [32, 128]);
    let ok = Array::from_elems([2], &[3i32, 0]).unwrap();
    assert!(interpret(&kernel, &[ok, x.clone()]).is_ok());
    let bad = Array::from_elems([2], &[1i32, 4]).unwrap();
    let e = interpret(&kernel, &[bad, x]).unwrap_err();
    assert!(
        matches!(&e.kind, ErrorKind::BlockOutOfBounds { operand, grid, block_index, .. }
            if operand == "x" && grid == &[1] && block_index == &[4, 0]),
        "{e}"
    );
}

#[test]
fn dynamic_slice_out_of_bounds_at_run_time() {
    let mut k = KernelBuilder::new("dyn");
    k.grid([2], [Arbitrary]);
    let x = k.input("x", F32, [16, 128]);
    let o = k.output("o", F32, [16, 128]);
    let i = program_id(0);
    o.store((ds(i * 8, 8), ..), x.load((ds(i * 12, 8), ..)));
    let kernel = k.build().unwrap();
    let e = interpret(&kernel, &[Array::zeros(F32, [16, 128])]).unwrap_err();
    assert!(
        matches!(&e.kind, ErrorKind::DynamicOutOfBounds { op: "load", .. }),
        "{e}"
    );
}

#[test]
fn shuffled_parallel_order_exposes_a_hidden_dependence() {
    // Each step reads the block the previous step wrote: fine in row-major
    // order, wrong when parallel steps run in another order.
    let mut k = KernelBuilder::new("prefix");
    k.grid([4], [Parallel]);
    let x = k.input("x", F32, [32, 128]).block([8, 128], |[i]| (i, 0));
    let o = k.output("o", F32, [32, 128]).space(MemorySpace::Any);
    let i = program_id(0);
    let prev = if_else(
        i.gt(0),
        || o.load((ds((i - 1) * 8, 8), ..)),
        || constant(0.0, F32, [8, 128]),
    );
    o.store((ds(i * 8, 8), ..), prev + x.load(..));
    let kernel = k.build().unwrap();
    let x = Array::random(F32, [32, 128], 3, 0.0, 1.0);
    assert!(interpret(&kernel, std::slice::from_ref(&x)).is_ok());
    let failed = (0..8).any(|seed| {
        let opts = InterpOptions {
            shuffle_seed: Some(seed),
            ..InterpOptions::default()
        };
        matches!(
            interpret_with(&kernel, std::slice::from_ref(&x), &opts),
            Err(e) if matches!(e.kind, ErrorKind::PoisonRead { buffer: "output", .. })
        )
    });
    assert!(failed, "no shuffled order exposed the dependence");
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
