//! The child process every libtpu compile runs in (libtpu can abort its
//! process): this binary re-run as its hidden `tpu-child` command. Both
//! `compile` and `estimate` (and the demo) start it from here.

use libtpu::child::ChildCompiler;

use crate::Failure;

/// The child that runs one libtpu compile (or profiled compile): this
/// binary's hidden `tpu-child` command.
pub fn child_compiler() -> Result<ChildCompiler, Failure> {
    let exe = std::env::current_exe()
        .map_err(|e| Failure::Run(format!("cannot find the tessera binary to re-run: {e}")))?;
    Ok(ChildCompiler::new(exe, ["tpu-child"]))
}

/// `tessera tpu-child TARGET MODULE REPORT` (started by the estimate).
pub fn tpu_child(args: &[String]) -> std::process::ExitCode {
    std::process::ExitCode::from(libtpu::child::serve_child(args) as u8)
}
