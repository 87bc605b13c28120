//! Every library kernel at its defaults on every CPU path (interpreter,
//! native JIT, PJRT decomposed, PJRT FFI, Triton's interpreter) against its
//! f64 reference, with the inputs, reference and tolerances its entry
//! declares: what a new kernel gets tested on by adding its entry. Each
//! preset (the same body at another configuration and shapes) runs on the
//! interpreter, the semantics every path is held to, and on one other path,
//! taken in turn; `TESSERA_PRESET_PATHS=all` runs presets on every path. A
//! kernel whose GPU build differs from its TPU build (the dk/dv kernels'
//! score layout) also runs that build, the program a GPU compile compiles,
//! under Triton's interpreter.

use kernels::{Config, ENTRIES, presets};
use runtime::backend::Backend;

fn check(
    name: &str,
    e: &kernels::Entry,
    cfg: &Config,
    k: &kernel_ir::VerifiedKernel,
    gpu: Option<&kernel_ir::VerifiedKernel>,
    paths: &[Backend],
) -> Vec<String> {
    let inputs = e.sample_inputs(cfg, k, 7);
    if let Err(err) = e.check_inputs(cfg, k, &inputs) {
        return vec![format!("{name}: sampled inputs refused: {err}")];
    }
    let want = e
        .reference(cfg, &inputs)
        .unwrap_or_else(|err| panic!("{name}: {err}"));
    assert_eq!(
        want.len(),
        k.outputs().count(),
        "{name}: one reference per output"
    );
    let tol = e.tolerances(cfg, k);
    assert_eq!(tol.len(), want.len(), "{name}: one tolerance per output");
    let runs = tooling::paths::run_paths(k, &inputs, paths, &want, &tol);
    assert_eq!(runs.len(), paths.len(), "{name}");
    let mut failures: Vec<String> = runs
        .iter()
        .filter(|r| !r.passes())
        .map(|r| format!("{name}: {r}"))
        .collect();
    if let Some(g) = gpu {
        let runs = tooling::paths::run_paths(g, &inputs, &[Backend::TritonInterp], &want, &tol);
        for r in runs.iter().filter(|r| !r.passes() || r.refused.is_some()) {
            failures.push(format!("{name} (GPU build): {r}"));
        }
    }
    failures
}

/// The kernel built for the GPU's rules when its body differs from the
/// TPU build's (a kernel the GPU's rules refuse has no GPU program to
/// check: `gpu_table.rs` lists those; one whose operands take other
/// shapes on a GPU, the GDN backward's chunk states at its GPU chunk, has
/// no reference here: its own tests run it at several chunks).
fn gpu_build<E>(
    tpu: &kernel_ir::VerifiedKernel,
    build: impl FnOnce() -> Result<kernel_ir::VerifiedKernel, E>,
) -> Option<kernel_ir::VerifiedKernel> {
    let gpu = kernel_ir::for_platform(kernel_ir::Platform::Gpu, build).ok()?;
    let shapes = |k: &kernel_ir::VerifiedKernel| {
        let io = k.inputs().chain(k.outputs());
        io.map(|o| o.shape.clone()).collect::<Vec<_>>()
    };
    (gpu.body != tpu.body && shapes(&gpu) == shapes(tpu)).then_some(gpu)
}

#[test]
fn every_entry_and_preset_matches_its_reference_on_every_path() {
    let mut failures = Vec::new();
    let (mut ran, mut gpu_builds) = (0, 0);
    for e in ENTRIES {
        let cfg = Config::parse(e, &[]).unwrap();
        let k = e.build_at_default_shapes(&cfg).unwrap();
        let gpu = gpu_build(&k, || e.build_at_default_shapes(&cfg));
        gpu_builds += usize::from(gpu.is_some());
        failures.extend(check(e.name, e, &cfg, &k, gpu.as_ref(), &Backend::ALL));
        ran += 1;
    }
    let all = std::env::var("TESSERA_PRESET_PATHS").as_deref() == Ok("all");
    let (interp, others) = Backend::ALL.split_first().unwrap();
    assert_eq!(*interp, Backend::Interpreter);
    let mut covered = std::collections::BTreeSet::new();
    for (i, p) in presets().enumerate() {
        let cfg = p.config().unwrap();
        let k = p.build().unwrap();
        let gpu = gpu_build(&k, || p.build());
        gpu_builds += usize::from(gpu.is_some());
        let paths = if all {
            Backend::ALL.to_vec()
        } else {
            vec![*interp, others[i % others.len()]]
        };
        covered.extend(paths.iter().map(|b| b.name()));
        failures.extend(check(p.name(), p.entry, &cfg, &k, gpu.as_ref(), &paths));
        ran += 1;
    }
    assert_eq!(
        covered.len(),
        Backend::ALL.len(),
        "presets ran on {covered:?}"
    );
    assert_eq!(ran, ENTRIES.len() + presets().count());
    // The dk/dv kernels (alone, with a valid length, bucketed, and the
    // one-pass dq/dk/dv pair) lay their scores out by platform.
    assert!(gpu_builds >= 5, "{gpu_builds} kernels differ on the GPU");
    assert!(ran >= 36, "{ran}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
