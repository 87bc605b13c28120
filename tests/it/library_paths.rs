//! Every library kernel, at its defaults and at each preset, on every CPU
//! path (interpreter, native JIT, PJRT decomposed, PJRT FFI) against its
//! f64 reference, with the inputs, reference and tolerances its entry
//! declares: what a new kernel gets tested on by adding its entry.

use kernels::{Config, ENTRIES, presets};
use runtime::backend::Backend;

fn check(
    name: &str,
    e: &kernels::Entry,
    cfg: &Config,
    k: &kernel_ir::VerifiedKernel,
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
    match tessera_testing::check_every_path(k, &inputs, &want, &tol) {
        Ok(report) => {
            assert_eq!(report.paths.len(), Backend::ALL.len(), "{name}");
            Vec::new()
        }
        Err(m) => vec![format!("{name}: {m}")],
    }
}

#[test]
fn every_entry_and_preset_matches_its_reference_on_every_path() {
    let mut failures = Vec::new();
    let mut ran = 0;
    for e in ENTRIES {
        let cfg = Config::parse(e, &[]).unwrap();
        let k = e.build_at_default_shapes(&cfg).unwrap();
        failures.extend(check(e.name, e, &cfg, &k));
        ran += 1;
    }
    for p in presets() {
        let cfg = p.config().unwrap();
        let k = p.build().unwrap();
        failures.extend(check(p.name(), p.entry, &cfg, &k));
        ran += 1;
    }
    assert_eq!(ran, ENTRIES.len() + presets().count());
    assert!(ran >= 36, "{ran}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
