//! `tessera compile`: kernels compiled by the real TPU compiler (libtpu,
//! compile-only) for one or every generation.

use std::path::{Path, PathBuf};

use kernel_ir::{Target, VerifiedKernel, human_bytes};
use libtpu::KernelCompileError;
use libtpu::child::{ChildCompiled, ChildCompiler, ChildError};

use crate::args::Args;
use crate::{Failure, usage};

/// `--tpu all`.
const ALL: &str = "all";

/// `tessera compile KERNEL|PRESET|presets|kernels|all --tpu G|all [--config k=v].. [--shape ..] [--out PATH]`.
pub fn compile(args: &[String]) -> Result<(), Failure> {
    let a = Args::parse(
        "compile",
        args,
        &[
            "config", "shape", "tpu", "gpu", "out", "module", "warps", "stages",
        ],
        &[],
    )
    .map_err(usage)?;
    if let Some(gpu) = a.one("gpu").map_err(usage)? {
        if a.one("tpu").map_err(usage)?.is_some() || a.one("module").map_err(usage)?.is_some() {
            return Err(usage(
                "--gpu compiles with Triton, --tpu and --module with libtpu: give one of them"
                    .into(),
            ));
        }
        // Every flag is checked before any kernel is built.
        let targets = crate::compile_gpu::parse_gpu_targets(gpu).map_err(usage)?;
        let launch = crate::compile_gpu::Launch::parse(&a).map_err(usage)?;
        launch.check(&targets).map_err(usage)?;
        let out = a.one("out").map_err(usage)?.map(PathBuf::from);
        crate::compile_gpu::check_out(out.as_deref())?;
        let name = a.kernel("compile").map_err(usage)?;
        let kernels = crate::compile_gpu::gpu_kernels(name, &a)?;
        return crate::compile_gpu::compile_gpu(&kernels, &targets, launch, out.as_deref());
    }
    if a.one("warps").map_err(usage)?.is_some() || a.one("stages").map_err(usage)?.is_some() {
        return Err(usage(
            "--warps and --stages set a Triton program's launch: give --gpu too".into(),
        ));
    }
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
    let child = crate::tpu_child::child_compiler()?;
    let (mut ok, mut failed, mut aborted) = (0usize, 0usize, 0usize);
    // A directory's executables, published together at the end.
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for (kname, kernel) in &kernels {
        let budget = kernel.vmem_budget();
        println!(
            "{kname}: grid {:?}, Tessera VMEM budget {} of {} scoped",
            kernel.grid.dims.iter().map(|d| d.bound).collect::<Vec<_>>(),
            human_bytes(budget.total()),
            human_bytes(kernel.effective_vmem_limit()),
        );
        for &t in &targets {
            match compile_kernel(&child, kernel, t, out.is_some()) {
                Ok((_, c)) => {
                    ok += 1;
                    println!("{}", ok_line(t, &c));
                    match &out {
                        Some(path) if single => {
                            let bytes = c.executable.unwrap_or_default();
                            tooling::atomic_file::write(path, &bytes)
                                .map_err(|e| Failure::Run(e.into()))?;
                            println!(
                                "        wrote {} ({})",
                                path.display(),
                                human_bytes(bytes.len() as u64)
                            );
                        }
                        Some(_) => files.push((
                            format!("{kname}.{}.{EXECUTABLE_SUFFIX}", t.name()),
                            c.executable.unwrap_or_default(),
                        )),
                        None => {}
                    }
                }
                Err(e) => {
                    failed += 1;
                    aborted += usize::from(e.aborted());
                    println!("  {:<4} FAILED  {}", t.name(), indent(&e.to_string()));
                }
            }
        }
    }
    if kernels.len() * targets.len() > 1 {
        println!(
            "\ncompiled {ok} of {} ({} kernels x {} generations) with {}",
            ok + failed,
            kernels.len(),
            targets.len(),
            libtpu_in_use()
        );
    }
    if let Some(dir) = out.as_ref().filter(|_| !single) {
        if failed > 0 {
            println!(
                "nothing written to {}: not every compile passed",
                dir.display()
            );
        } else {
            publish_executables(dir, &files)?;
        }
    }
    if aborted > 0 {
        return Err(Failure::CompilerAborted(format!(
            "libtpu aborted {aborted} of {} compiles (see above){}",
            ok + failed,
            if failed > aborted {
                format!(", {} more failed", failed - aborted)
            } else {
                String::new()
            }
        )));
    }
    if failed > 0 {
        return Err(Failure::Run(format!(
            "{failed} of {} compiles failed",
            ok + failed
        )));
    }
    Ok(())
}

/// Why one kernel did not compile for one generation.
pub(crate) enum CompileFailure {
    /// Tessera's own checks or lowering for that generation.
    Kernel(KernelCompileError),
    /// The child compile (libtpu's error, an abort, a timeout).
    Child(ChildError),
}

impl CompileFailure {
    pub(crate) fn aborted(&self) -> bool {
        matches!(
            self,
            CompileFailure::Child(ChildError::CompilerAborted { .. })
        )
    }
}

impl std::fmt::Display for CompileFailure {
    /// For a compiler error, the user's source location first, then the
    /// Mosaic op, then the compiler's whole message.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompileFailure::Kernel(e) => write!(f, "{e}"),
            CompileFailure::Child(ChildError::Compile { diagnostic, .. }) => {
                write!(f, "{diagnostic}")
            }
            CompileFailure::Child(e) => write!(f, "{e}"),
        }
    }
}

/// `kernel` verified and lowered for `target` here, compiled by libtpu in
/// a child process (an abort of libtpu ends the child, not the CLI).
pub(crate) fn compile_kernel(
    child: &ChildCompiler,
    kernel: &VerifiedKernel,
    target: Target,
    executable: bool,
) -> Result<(VerifiedKernel, ChildCompiled), CompileFailure> {
    let (kernel, lowered) = libtpu::lower_for(kernel, target).map_err(CompileFailure::Kernel)?;
    let compiled = child
        .compile(target, &lowered.module, executable)
        .map_err(CompileFailure::Child)?;
    Ok((kernel, compiled))
}

/// The generations `--tpu` names.
pub(crate) fn parse_targets(s: &str) -> Result<Vec<Target>, String> {
    if s == ALL {
        return Ok(Target::ALL.to_vec());
    }
    let mut out: Vec<Target> = Vec::new();
    for t in s.split(',') {
        let t = t
            .parse::<Target>()
            .map_err(|_| format!("unknown TPU generation `{t}`; use v5e, v6e, v5p, v7x or all"))?;
        // A generation named twice is compiled once.
        if !out.contains(&t) {
            out.push(t);
        }
    }
    Ok(out)
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
        // Checked now, written at the end (whole).
        if path.is_dir() && !is_executables_dir(path) {
            return Err(format!(
                "--out {} holds files other than executables; name a new or empty directory, or an earlier `tessera compile --out` one (it is replaced whole)",
                path.display()
            ));
        }
    }
    Ok(())
}

/// How each executable in a `--out` directory is named:
/// `KERNEL.GENERATION.tpu-executable`.
const EXECUTABLE_SUFFIX: &str = "tpu-executable";

/// Whether `dir` holds only executables (an earlier `--out` directory).
fn is_executables_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().all(|e| {
            e.file_type().is_ok_and(|t| t.is_file())
                && e.file_name()
                    .to_string_lossy()
                    .ends_with(&format!(".{EXECUTABLE_SUFFIX}"))
        })
    })
}

/// The executables as the directory `dir`, all or nothing (staged beside
/// it, one rename or exchange).
fn publish_executables(dir: &Path, files: &[(String, Vec<u8>)]) -> Result<(), Failure> {
    let staged = tooling::atomic_dir::StagedDir::new(dir, is_executables_dir)
        .map_err(|e| Failure::Run(format!("--out {e}")))?;
    let mut total = 0u64;
    for (name, bytes) in files {
        staged
            .write(name, bytes)
            .map_err(|e| Failure::Run(e.to_string()))?;
        total += bytes.len() as u64;
    }
    staged
        .publish()
        .map_err(|e| Failure::Run(format!("--out {e}")))?;
    println!(
        "wrote {} ({} executables, {})",
        dir.display(),
        files.len(),
        human_bytes(total)
    );
    Ok(())
}

fn indent(text: &str) -> String {
    text.lines().collect::<Vec<_>>().join("\n                ")
}

/// A successful compile's line: time, code size and libtpu's HBM memory
/// stats (a module's peak counts the temporaries its XLA ops hold, the
/// unfused logits of a loss, say).
fn ok_line(t: Target, c: &ChildCompiled) -> String {
    let m = &c.memory;
    format!(
        "  {:<4} ok      {:>6.2} s  code {:>9}  HBM: arguments {}, outputs {}, temporaries {}, peak {}",
        t.name(),
        c.compile_time.as_secs_f64(),
        human_bytes(m.generated_code_bytes.max(0) as u64),
        human_bytes(m.argument_bytes.max(0) as u64),
        human_bytes(m.output_bytes.max(0) as u64),
        human_bytes(m.temp_bytes.max(0) as u64),
        human_bytes(m.peak_bytes.max(0) as u64),
    )
}

/// `tessera compile --module FILE`: a whole StableHLO module (a JAX export
/// calling a Tessera artifact, say) compiled with libtpu for each target.
fn compile_module(path: &str, targets: &[Target]) -> Result<(), Failure> {
    let text = read_module(path)?;
    let child = crate::tpu_child::child_compiler()?;
    let (mut failed, mut aborted) = (0usize, 0usize);
    for &t in targets {
        if let Err(m) = check_module_tensors(&text, t) {
            return Err(usage(format!("--module {path}: {m}")));
        }
        match child.compile(t, &text, false) {
            Ok(c) => println!("{}", ok_line(t, &c)),
            Err(e) => {
                failed += 1;
                aborted += usize::from(matches!(e, ChildError::CompilerAborted { .. }));
                println!("  {:<4} FAILED  {e}", t.name());
            }
        }
    }
    if aborted > 0 {
        return Err(Failure::CompilerAborted(format!(
            "{path}: libtpu aborted {aborted} of {} compiles (see above)",
            targets.len()
        )));
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

/// Refuses a module with a tensor type larger than `target`'s HBM (libtpu
/// aborts on some, `tensor<4000000000x4000000000xf32>` among them, and
/// nothing that large can run). Reads every `tensor<DxDx..xT>` in the text;
/// dynamic dims (`?`) and unknown element types are left to libtpu.
pub(crate) fn check_module_tensors(text: &str, target: Target) -> Result<(), String> {
    let hbm = target.hbm_bytes();
    let mut rest = text;
    while let Some(i) = rest.find("tensor<") {
        rest = &rest[i + "tensor<".len()..];
        let Some(end) = rest.find('>') else { break };
        let ty = &rest[..end];
        let parts: Vec<&str> = ty.split('x').collect();
        let Some((elem, dims)) = parts.split_last() else {
            continue;
        };
        let Some(bits) = element_bits(elem.trim()) else {
            continue;
        };
        let mut elems: u128 = 1;
        let mut known = true;
        for d in dims {
            match d.trim().parse::<u128>() {
                Ok(n) => elems = elems.saturating_mul(n),
                Err(_) => known = false,
            }
        }
        let bytes = elems.saturating_mul(bits).div_ceil(8);
        if known && bytes > u128::from(hbm) {
            return Err(format!(
                "`tensor<{ty}>` is {} bytes, more than the {} of HBM one {} chip has; shrink it (libtpu would abort on it)",
                bytes,
                human_bytes(hbm),
                target.name()
            ));
        }
    }
    Ok(())
}

/// Bits of one element of a StableHLO element type, if known.
fn element_bits(t: &str) -> Option<u128> {
    Some(match t {
        "f64" | "i64" | "ui64" | "complex<f32>" => 64,
        "f32" | "i32" | "ui32" => 32,
        "f16" | "bf16" | "i16" | "ui16" => 16,
        "i8" | "ui8" => 8,
        "i1" => 8,
        t if t.starts_with("f8") => 8,
        t if t.starts_with("i4") || t.starts_with("ui4") => 4,
        _ => return None,
    })
}

/// The libtpu this run loaded, as the summary names it: the pinned version,
/// or the file `$TESSERA_LIBTPU` chose (whose version is not known here).
fn libtpu_in_use() -> String {
    match std::env::var_os(libtpu::LIBTPU_ENV) {
        Some(p) => format!("the libtpu at {} ($TESSERA_LIBTPU)", p.to_string_lossy()),
        None => format!("libtpu {}", libtpu::LIBTPU_VERSION),
    }
}
