//! `tessera compile`: kernels compiled by the real TPU compiler (libtpu,
//! compile-only) for one or every generation.

use std::path::{Path, PathBuf};

use kernel_ir::{Target, VerifiedKernel, human_bytes};
use runtime::tpu::{KernelCompileError, TpuCompiler, TpuError};

use crate::args::Args;
use crate::{Failure, usage};

/// `--tpu all`.
const ALL: &str = "all";

/// `tessera compile KERNEL|PRESET|presets|kernels|all --tpu G|all [--config k=v].. [--shape ..] [--out PATH]`.
pub fn compile(args: &[String]) -> Result<(), Failure> {
    let a = Args::parse(
        "compile",
        args,
        &["config", "shape", "tpu", "out", "module"],
        &[],
    )
    .map_err(usage)?;
    let targets = parse_targets(a.one("tpu").map_err(usage)?.unwrap_or(ALL)).map_err(usage)?;
    if let Some(path) = a.one("module").map_err(usage)? {
        if a.one("out").map_err(usage)?.is_some() {
            return Err(usage(
                "--out writes kernels' executables; with --module it has nothing to write (leave it out)".into(),
            ));
        }
        return compile_module(path, &targets);
    }
    let name = a.kernel("compile").map_err(usage)?;
    let kernels: Vec<(String, VerifiedKernel)> = crate::cost::kernels_named("compile", name, &a)?
        .into_iter()
        .map(|(n, k, _)| (n, k))
        .collect();
    let out = a.one("out").map_err(usage)?.map(PathBuf::from);
    let single = kernels.len() == 1 && targets.len() == 1;
    if let Some(path) = &out {
        check_out(path, single).map_err(usage)?;
    }
    let tpu = TpuCompiler::load().map_err(|e| Failure::Run(e.to_string()))?;
    let (mut ok, mut failed) = (0usize, 0usize);
    for (kname, kernel) in &kernels {
        let budget = kernel.vmem_budget();
        println!(
            "{kname}: grid {:?}, Tessera VMEM budget {} of {} scoped",
            kernel.grid.dims.iter().map(|d| d.bound).collect::<Vec<_>>(),
            human_bytes(budget.total()),
            human_bytes(kernel.effective_vmem_limit()),
        );
        for &t in &targets {
            match tpu.compile_kernel(kernel, t) {
                Ok(c) => {
                    ok += 1;
                    let m = &c.compiled.memory;
                    println!(
                        "  {:<4} ok      {:>6.2} s  code {:>9}  HBM: arguments {}, outputs {}, temporaries {}, peak {}",
                        t.name(),
                        c.compiled.compile_time.as_secs_f64(),
                        human_bytes(c.compiled.code_bytes.max(0) as u64),
                        human_bytes(m.argument_bytes.max(0) as u64),
                        human_bytes(m.output_bytes.max(0) as u64),
                        human_bytes(m.temp_bytes.max(0) as u64),
                        human_bytes(m.peak_bytes.max(0) as u64),
                    );
                    if let Some(path) = &out {
                        let file = if single {
                            path.clone()
                        } else {
                            path.join(format!("{kname}.{}.tpu-executable", t.name()))
                        };
                        let bytes = c
                            .compiled
                            .serialize()
                            .map_err(|e| Failure::Run(e.to_string()))?;
                        kernels::tooling::atomic_file::write(&file, &bytes)
                            .map_err(Failure::Run)?;
                        println!(
                            "        wrote {} ({})",
                            file.display(),
                            human_bytes(bytes.len() as u64)
                        );
                    }
                }
                Err(e) => {
                    failed += 1;
                    println!("  {:<4} FAILED  {}", t.name(), indent(&failure_text(&e)));
                }
            }
        }
    }
    if kernels.len() * targets.len() > 1 {
        println!(
            "\ncompiled {ok} of {} ({} kernels x {} generations) with libtpu {}",
            ok + failed,
            kernels.len(),
            targets.len(),
            runtime::tpu::LIBTPU_VERSION
        );
    }
    if failed > 0 {
        return Err(Failure::Run(format!(
            "{failed} of {} compiles failed",
            ok + failed
        )));
    }
    Ok(())
}

/// The generations `--tpu` names.
pub(crate) fn parse_targets(s: &str) -> Result<Vec<Target>, String> {
    if s == ALL {
        return Ok(Target::ALL.to_vec());
    }
    s.split(',')
        .map(|t| {
            t.parse::<Target>()
                .map_err(|_| format!("unknown TPU generation `{t}`; use v5e, v6e, v5p, v7x or all"))
        })
        .collect()
}

/// `--out` is a file for one kernel on one generation, else a directory;
/// checked before anything is compiled.
fn check_out(path: &Path, single: bool) -> Result<(), String> {
    if single {
        if path.is_dir() {
            return Err(format!(
                "--out {} is a directory; for one kernel and one generation give a file name",
                path.display()
            ));
        }
        if path.exists() && !path.is_file() {
            return Err(format!(
                "--out {} exists and is not a regular file; name a new file or a regular one to replace",
                path.display()
            ));
        }
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if !parent.is_dir() {
            return Err(format!(
                "--out {}: the folder {} does not exist",
                path.display(),
                parent.display()
            ));
        }
    } else {
        if path.exists() && !path.is_dir() {
            return Err(format!(
                "--out {} is a file; with several kernels or generations --out names a directory",
                path.display()
            ));
        }
        std::fs::create_dir_all(path)
            .map_err(|e| format!("--out {}: cannot create it: {e}", path.display()))?;
    }
    Ok(())
}

/// A failure as shown: for a compiler error, the user's source location
/// first, then the Mosaic op, then the compiler's whole message.
fn failure_text(e: &KernelCompileError) -> String {
    match e {
        KernelCompileError::Tpu(TpuError::Compile { diagnostic, .. }) => diagnostic.to_string(),
        other => other.to_string(),
    }
}

fn indent(text: &str) -> String {
    text.lines().collect::<Vec<_>>().join("\n                ")
}

/// `tessera compile --module FILE`: a whole StableHLO module (a JAX export
/// calling a Tessera artifact, say) compiled with libtpu for each target.
fn compile_module(path: &str, targets: &[Target]) -> Result<(), Failure> {
    let text = read_module(path)?;
    let tpu = TpuCompiler::load().map_err(|e| Failure::Run(e.to_string()))?;
    let mut failed = 0usize;
    for &t in targets {
        match tpu.compile(t, &text) {
            Ok(c) => println!(
                "  {:<4} ok      {:>6.2} s  code {:>9}",
                t.name(),
                c.compile_time.as_secs_f64(),
                human_bytes(c.code_bytes.max(0) as u64)
            ),
            Err(e) => {
                failed += 1;
                println!("  {:<4} FAILED  {e}", t.name());
            }
        }
    }
    if failed > 0 {
        return Err(Failure::Run(format!(
            "{path}: {failed} of {} compiles failed",
            targets.len()
        )));
    }
    Ok(())
}

/// The largest `--module` file read (a StableHLO module of a real program
/// is megabytes; the cap keeps `/dev/zero`-like inputs from growing memory).
pub(crate) const MAX_MODULE_BYTES: u64 = 256 << 20;

/// A `--module` file's text: a regular file (a FIFO or device would hang
/// or never end), at most [`MAX_MODULE_BYTES`], UTF-8. Errors are usage
/// errors naming the path.
pub(crate) fn read_module(path: &str) -> Result<String, Failure> {
    use std::io::Read;
    let meta = std::fs::metadata(path).map_err(|e| usage(format!("--module {path}: {e}")))?;
    if !meta.is_file() {
        return Err(usage(format!(
            "--module {path} is not a regular file; give a StableHLO module file (text or bytecode)"
        )));
    }
    if meta.len() > MAX_MODULE_BYTES {
        return Err(usage(format!(
            "--module {path} is {} bytes, more than the {} a module may have",
            meta.len(),
            MAX_MODULE_BYTES
        )));
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_MODULE_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| usage(format!("--module {path}: {e}")))?;
    Ok(text)
}
