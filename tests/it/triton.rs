//! The Triton path's promises beside the numbers: an error in a Triton
//! program, from the compiler or the interpreter, names the Rust
//! `file:line:col` of the op its line came from.

use kernel_ir::{Array, DType, GpuTarget, Platform};
use kernels::Config;

/// The `add` kernel's Triton program, and the Rust location its first
/// load's line names.
fn add_program() -> (kernel_ir::VerifiedKernel, lowering::TritonProgram) {
    let e = kernels::find("add").unwrap();
    let cfg = Config::parse(e, &[]).unwrap();
    let k = kernel_ir::for_platform(Platform::Gpu, || e.build_at_default_shapes(&cfg)).unwrap();
    let p = lowering::triton(&k).unwrap();
    (k, p)
}

/// Breaks the program's first load (an attribute Triton does not have)
/// and returns the broken program with the location that line names.
fn broken(mut p: lowering::TritonProgram) -> (lowering::TritonProgram, String) {
    let line = p
        .source
        .lines()
        .find(|l| l.contains("tl.load("))
        .expect("a load")
        .to_string();
    let loc = line.rsplit("# ").next().unwrap().trim().to_string();
    assert!(
        loc.starts_with("kernels/src/") && loc.matches(':').count() == 2,
        "{loc}"
    );
    p.source = p
        .source
        .replacen(&line, &line.replacen("tl.load(", "tl.no_such_load(", 1), 1);
    (p, loc)
}

#[test]
fn a_triton_compile_error_names_the_rust_line() {
    let (_, p) = add_program();
    let (p, loc) = broken(p);
    let c = runtime::triton::compile(&p, &[GpuTarget::Sm90], None).unwrap();
    let e = c[0].result.clone().unwrap_err();
    assert_eq!(e.loc.as_deref(), Some(loc.as_str()), "{e}");
    assert!(e.to_string().starts_with(&loc), "{e}");
}

#[test]
fn a_triton_interpreter_error_names_the_rust_line() {
    let (k, p) = add_program();
    let (p, loc) = broken(p);
    let args: Vec<Array> = k
        .inputs()
        .map(|o| Array::random(DType::F32, o.shape.clone(), 1, -1.0, 1.0))
        .collect();
    let e = runtime::triton::interpret(&k, &p, &args).unwrap_err();
    match &e {
        runtime::triton::TritonError::Run { loc: Some(l), .. } => assert_eq!(l, &loc, "{e}"),
        other => panic!("not a located run error: {other}"),
    }
}
