use kernel_ir::prelude::*;
use kernel_ir::{Target, VerifiedKernel};

use super::*;

fn compiler() -> Arc<TpuCompiler> {
    TpuCompiler::load().unwrap_or_else(|e| panic!("{e}"))
}

/// `o = x + y` over [64, 256] f32 in 16x128 blocks.
fn add() -> VerifiedKernel {
    let mut k = KernelBuilder::new("add");
    k.grid([4, 2], [Parallel, Parallel]);
    let x = k
        .input("x", F32, [64, 256])
        .block([16, 128], |[i, j]| (i, j));
    let y = k
        .input("y", F32, [64, 256])
        .block([16, 128], |[i, j]| (i, j));
    let o = k
        .output("o", F32, [64, 256])
        .block([16, 128], |[i, j]| (i, j));
    o.store(.., x.load(..) + y.load(..));
    k.build().unwrap()
}

#[test]
fn a_kernel_compiles_for_every_generation_with_stats_and_an_artifact() {
    let tpu = compiler();
    let module = lowering::tpu_custom_call(&add()).unwrap().module;
    for target in Target::ALL {
        let c = tpu
            .compile(target, &module)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.target, target);
        assert!(c.code_bytes > 0, "{target}: {c:?}");
        // Two f32[64, 256] arguments and one output, as the compiler counts.
        assert_eq!(c.memory.argument_bytes, 2 * 64 * 256 * 4, "{target}");
        assert_eq!(c.memory.output_bytes, 64 * 256 * 4, "{target}");
        assert_eq!(
            c.cost("flops"),
            Some(64.0 * 256.0),
            "{target}: {:?}",
            c.cost
        );
        let bytes = c.serialize().unwrap();
        assert!(bytes.len() > 1000, "{target}: {} bytes", bytes.len());
    }
}

#[test]
fn generations_compile_differently() {
    let tpu = compiler();
    let module = lowering::tpu_custom_call(&add()).unwrap().module;
    let platform = |t| tpu.topology(t).unwrap().platform_version.clone();
    assert!(
        platform(Target::V5e).contains("v5 lite"),
        "{}",
        platform(Target::V5e)
    );
    assert!(
        platform(Target::V6e).contains("v6 lite"),
        "{}",
        platform(Target::V6e)
    );
    let a = tpu
        .compile(Target::V5e, &module)
        .unwrap()
        .serialize()
        .unwrap();
    let b = tpu
        .compile(Target::V6e, &module)
        .unwrap()
        .serialize()
        .unwrap();
    assert_ne!(a, b);
}

#[test]
fn a_compiler_error_comes_back_typed_with_its_whole_message() {
    let tpu = compiler();
    let e = tpu
        .compile(Target::V6e, "module { func.func @main() { not mlir } }")
        .unwrap_err();
    match &e {
        TpuError::Compile { target, diagnostic } => {
            assert_eq!(*target, Target::V6e);
            assert!(!diagnostic.message.is_empty());
            assert!(!diagnostic.is_mosaic(), "{diagnostic:?}");
        }
        other => panic!("not a compile error: {other}"),
    }
}

#[test]
fn a_missing_libtpu_names_the_fix() {
    let e = TpuCompiler::load_from(Path::new("/nonexistent/libtpu.so")).unwrap_err();
    let shown = e.to_string();
    assert!(shown.contains("/nonexistent/libtpu.so"), "{shown}");
    let e = TpuError::NotInstalled {
        path: "/x/libtpu.so".into(),
        why: "the default libtpu path",
    };
    assert!(e.to_string().contains(".ci/setup.sh"), "{e}");
}
