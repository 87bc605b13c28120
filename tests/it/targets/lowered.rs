//! Every kernel of `kernels` and the test kernels, lowered to all three
//! targets: MLIR-verified (the lowering checks), pinned by insta snapshots,
//! and round-tripped through `mlir-opt-22 --verify-roundtrip`.

use std::process::Command;

use kernel_ir::prelude::*;
use kernel_ir::{ErrorKind, VerifiedKernel};
use lowering::LoweringError;

/// y += a * x in place: an in-out operand.
#[tpu_kernel(grid = (n / 8,), semantics = (parallel,))]
pub(crate) fn axpy(
    a: f32,
    #[shape(n, 128)]
    #[block([8, 128], |i| (i, 0))]
    x: In<f32>,
    #[shape(n, 128)]
    #[block([8, 128], |i| (i, 0))]
    y: InOut<f32>,
) {
    y.store(.., x.load(..) * a + y.load(..));
}

/// Rows scattered into a whole-array (`any`) output by a table.
#[tpu_kernel(grid = (rows,), semantics = (arbitrary,))]
pub(crate) fn scatter_rows(
    #[shape(rows)] dest: Prefetch,
    #[shape(rows, 8, 128)]
    #[block([1, 8, 128], |i| (i, 0, 0))]
    x: In<f32>,
    #[shape(rows, 8, 128)]
    #[any]
    o: Out<f32>,
) {
    let i = program_id(0);
    o.store((dest.load([i]), .., ..), x.load((0, .., ..)));
}

/// The kernels every target is checked on, by snapshot name: the presets
/// of the library and the test kernels.
pub(crate) fn catalog() -> Vec<(&'static str, VerifiedKernel)> {
    let mut all: Vec<(&'static str, VerifiedKernel)> = kernels::presets()
        .map(|p| (p.name(), p.build().unwrap()))
        .collect();
    all.extend([
        (
            "strip_sum_loop",
            crate::language::dsl::strip_sum::build(
                3,
                crate::language::dsl::strip_sum::Dims { m: 16, n: 384 },
            )
            .unwrap(),
        ),
        (
            "branches",
            crate::language::dsl::branches::build(true, crate::language::dsl::branches::Dims {})
                .unwrap(),
        ),
        (
            "gather_softmax_prefetch",
            crate::language::dsl::gather_softmax::build(
                crate::language::dsl::gather_softmax::Dims { rows: 3, n: 5 },
            )
            .unwrap(),
        ),
        (
            "prefix_chunks_dynamic_loop",
            crate::language::dsl::prefix_chunks::build::<8>(
                crate::language::dsl::prefix_chunks::Dims { m: 16 },
            )
            .unwrap(),
        ),
        (
            "axpy_inout",
            axpy::build(2.0, axpy::Dims { n: 32 }).unwrap(),
        ),
    ]);
    all
}

/// The printed IR and every lowering target of each catalog kernel,
/// through the public snapshot macro a kernel author's crate uses
/// (`snapshots/<target>/<name>.snap`; the custom call shows its Mosaic
/// body decoded, without source lines, instead of as base64).
#[test]
fn every_kernel_pinned_on_every_target() {
    for (name, k) in catalog() {
        tessera_testing::assert_lowered_snapshots!(name, &k);
    }
}

/// `mlir-opt-22`, when installed (the set-up installs it).
fn mlir_opt() -> Option<&'static str> {
    let ok = Command::new("mlir-opt-22")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Some("mlir-opt-22")
    } else {
        eprintln!("mlir-opt-22 is not installed; run .ci/setup.sh to check the round trip");
        None
    }
}

#[test]
fn every_module_round_trips_through_mlir_opt() {
    let Some(tool) = mlir_opt() else { return };
    let dir = std::env::temp_dir().join(format!("tessera-roundtrip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut checked = 0;
    for (name, k) in catalog() {
        let modules = [
            ("kernel", lowering::kernel_module(&k).unwrap()),
            ("custom_call", lowering::tpu_custom_call(&k).unwrap().module),
            ("decomposed", lowering::decomposed(&k).unwrap()),
        ];
        for (target, text) in modules {
            let path = dir.join(format!("{name}.{target}.mlir"));
            std::fs::write(&path, &text).unwrap();
            let out = Command::new(tool)
                .args(["--allow-unregistered-dialect", "--verify-roundtrip"])
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{name} {target}: mlir-opt failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(checked, 3 * catalog().len());
}

#[test]
fn a_whole_array_operand_cannot_be_loaded_directly_on_tpu() {
    // `any` memory is HBM: Mosaic reaches it only by DMA, which Tessera does
    // not model yet. The host and decomposed targets express it fine.
    let k = scatter_rows::build(scatter_rows::Dims { rows: 4 }).unwrap();
    assert!(lowering::kernel_module(&k).is_ok());
    assert!(lowering::decomposed(&k).is_ok());
    let e = lowering::tpu_custom_call(&k).unwrap_err();
    let LoweringError::Unsupported {
        op, loc, target, ..
    } = &e
    else {
        panic!("{e}")
    };
    assert_eq!((op.as_str(), *target), ("store", "Mosaic"));
    let loc = loc.as_ref().map(|l| l.file.to_string()).unwrap_or_default();
    assert!(loc.ends_with("tests/it/targets/lowered.rs"), "{e}");
    assert!(e.to_string().contains("DMA"), "{e}");
    let _ = ErrorKind::ForeignTile;
}
