//! Compile-fail tests of `#[tpu_kernel]`: each case in `tests/ui/` must fail
//! to compile with the pinned, spanned message in its `.stderr` file.
//! Regenerate after a deliberate change with `TRYBUILD=overwrite`.

#[test]
fn kernel_dsl_diagnostics() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
