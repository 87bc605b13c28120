//! `tessera compile --gpu`: kernels compiled by Triton's compiler for NVIDIA
//! and AMD GPUs (no GPU needed), in a child process, with what the final
//! code says: registers, spills, shared memory, size, tensor-core
//! instructions.

use std::path::Path;

use kernel_ir::{GpuTarget, VerifiedKernel, human_bytes};
use runtime::triton::{GpuCompile, TRITON_VERSION};

use crate::{Failure, usage};

/// The GPU targets `--gpu` names (`all`: every one).
pub(crate) fn parse_gpu_targets(s: &str) -> Result<Vec<GpuTarget>, String> {
    if s == "all" {
        return Ok(GpuTarget::ALL.to_vec());
    }
    let mut out: Vec<GpuTarget> = Vec::new();
    for t in s.split(',') {
        let t: GpuTarget = t.parse().map_err(|_| {
            format!("unknown GPU target `{t}`; use sm_80, sm_90, sm_100, gfx942, gfx950 or all")
        })?;
        if !out.contains(&t) {
            out.push(t);
        }
    }
    Ok(out)
}

/// Threads one program (a CUDA block, an AMD workgroup) may have.
const MAX_THREADS: usize = 1024;

/// `--warps` and `--stages`: a Triton launch that overrides the program's
/// default ([`lowering::TritonOptions::for_kernel`]).
#[derive(Clone, Copy, Default)]
pub(crate) struct Launch {
    warps: Option<usize>,
    stages: Option<usize>,
}

impl Launch {
    pub(crate) fn parse(a: &crate::args::Args) -> Result<Launch, String> {
        let num = |flag: &str, allowed: &[usize]| -> Result<Option<usize>, String> {
            match a.one(flag)? {
                None => Ok(None),
                Some(v) => match v.parse::<usize>() {
                    Ok(n) if allowed.contains(&n) => Ok(Some(n)),
                    _ => Err(format!(
                        "--{flag} {v}: give one of {}",
                        allowed
                            .iter()
                            .map(usize::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                },
            }
        };
        Ok(Launch {
            warps: num("warps", &[1, 2, 4, 8, 16, 32])?,
            stages: num("stages", &[1, 2, 3, 4, 5, 6, 7, 8])?,
        })
    }

    /// The launch against each target's thread limit: `--warps` of the
    /// target's warp (32 threads on NVIDIA, a 64-thread wavefront on AMD)
    /// may not pass the 1,024 threads a program may have.
    pub(crate) fn check(self, targets: &[GpuTarget]) -> Result<(), String> {
        let Some(w) = self.warps else {
            return Ok(());
        };
        for t in targets {
            let threads = w * t.warp_size();
            if threads > MAX_THREADS {
                return Err(format!(
                    "--warps {w} on {} is {threads} threads ({} a warp), more than the {MAX_THREADS} a program may have; give --warps {} or fewer",
                    t.name(),
                    t.warp_size(),
                    MAX_THREADS / t.warp_size()
                ));
            }
        }
        Ok(())
    }

    fn options(self, kernel: &VerifiedKernel) -> lowering::TritonOptions {
        let d = lowering::TritonOptions::for_kernel(kernel);
        lowering::TritonOptions {
            num_warps: self.warps.unwrap_or(d.num_warps),
            num_stages: self.stages.unwrap_or(d.num_stages),
        }
    }
}

/// `--out`: a new folder or an earlier `compile --gpu --out` one.
pub(crate) fn check_out(out: Option<&Path>) -> Result<(), Failure> {
    if let Some(dir) = out
        && dir.exists()
        && !is_gpu_dir(dir)
    {
        return Err(usage(format!(
            "--out {} exists and is not an earlier `tessera compile --gpu --out` folder; name a new or empty directory",
            dir.display()
        )));
    }
    Ok(())
}

/// A kernel by name, built, or why it could not be.
pub(crate) type NamedKernel = (String, Result<VerifiedKernel, String>);

/// The kernels `name` stands for, built for the GPU's rules (blocks the
/// TPU's tiling would refuse, a 64-lane block say, are fine here): one
/// kernel, preset or kernel file, or `kernels`, `presets` or `all`, each
/// with its build error, so that one refused kernel does not stop the
/// others.
pub(crate) fn gpu_kernels(name: &str, a: &crate::args::Args) -> Result<Vec<NamedKernel>, Failure> {
    let gpu = |f: &dyn Fn() -> Result<VerifiedKernel, String>| {
        kernel_ir::for_platform(kernel_ir::Platform::Gpu, f)
    };
    if !["all", "kernels", "presets"].contains(&name) {
        let k = gpu(&|| crate::kernel_args::kernel_for_lower(name, a)).map_err(usage)?;
        // A kernel file goes by its kernel's name (an identifier): its path
        // names no folder under --out.
        let named = if name.ends_with(".kir") {
            k.name.clone()
        } else {
            name.to_string()
        };
        return Ok(vec![(named, Ok(k))]);
    }
    if !a.all("config").is_empty() || !a.all("shape").is_empty() {
        return Err(usage(format!(
            "`{name}` compiles many kernels at their defaults; --config and --shape need one kernel"
        )));
    }
    let mut out = Vec::new();
    if name != "presets" {
        for e in kernels::ENTRIES {
            let k = gpu(&|| {
                let cfg = kernels::Config::parse(e, &[]).map_err(|x| x.to_string())?;
                e.build_at_default_shapes(&cfg).map_err(|x| x.to_string())
            });
            out.push((e.name.to_string(), k));
        }
    }
    if name != "kernels" {
        for p in kernels::presets() {
            out.push((
                p.name().to_string(),
                gpu(&|| p.build().map_err(|x| x.to_string())),
            ));
        }
    }
    Ok(out)
}

/// Which GPU targets a kernel built for the GPU's rules may be compiled
/// for, as `tessera list` shows it: `gpu (sm_80, ..)`, the targets whose
/// `[gpu]` rules it breaks with the first reason, or why it has no GPU
/// form at all.
pub(crate) fn gpu_targets(kernel: &Result<VerifiedKernel, String>) -> String {
    let k = match kernel {
        Ok(k) => k,
        Err(e) => return format!("gpu: none ({})", short_reason(e)),
    };
    let (mut ok, mut refused) = (Vec::new(), Vec::new());
    for t in GpuTarget::ALL {
        match k.check_gpu(Some(t)) {
            Ok(()) => ok.push(t.name()),
            Err(e) => refused.push((t.name(), short_reason(&e.to_string()))),
        }
    }
    let mut line = if ok.is_empty() {
        "gpu: none".to_string()
    } else {
        format!("gpu ({})", ok.join(", "))
    };
    if let Some((_, why)) = refused.first() {
        let names: Vec<&str> = refused.iter().map(|(n, _)| *n).collect();
        line.push_str(&format!("; not {} ({why})", names.join(", ")));
    }
    line
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().trim().to_string()
}

/// A verifier error's first line, short: its rule's message without the
/// location, up to the first `:` after it (the fix follows there).
fn short_reason(text: &str) -> String {
    let line = first_line(text);
    let rule = line
        .find("[gpu] ")
        .map_or(line.as_str(), |i| &line[i + 6..]);
    let cut = rule.find(": ").map_or(rule, |i| &rule[..i]);
    cut.to_string()
}

/// Compiles each kernel for each target; `out` receives the Triton source
/// and each target's stages, all or nothing.
pub(crate) fn compile_gpu(
    kernels: &[NamedKernel],
    targets: &[GpuTarget],
    launch: Launch,
    out: Option<&Path>,
) -> Result<(), Failure> {
    check_out(out)?;
    let staged = match out {
        Some(dir) => Some(
            tooling::atomic_dir::StagedDir::new(dir, is_gpu_dir)
                .map_err(|e| Failure::Run(format!("--out {e}")))?,
        ),
        None => None,
    };
    let (mut ok, mut failed) = (0usize, 0usize);
    for (name, kernel) in kernels {
        let kernel = match kernel {
            Ok(k) => k,
            Err(e) => {
                failed += targets.len();
                println!("{name}: REFUSED {}", indent(e));
                continue;
            }
        };
        let mut runnable = Vec::new();
        for &t in targets {
            match kernel.check_gpu(Some(t)) {
                Ok(()) => runnable.push(t),
                Err(e) => {
                    failed += 1;
                    println!("{name}: {:<6} REFUSED {}", t.name(), indent(&e.to_string()));
                }
            }
        }
        if runnable.is_empty() {
            continue;
        }
        let program = match lowering::triton_with(kernel, launch.options(kernel), None) {
            Ok(p) => p,
            Err(e) => {
                failed += runnable.len();
                println!("{name}: REFUSED {}", indent(&e.to_string()));
                continue;
            }
        };
        println!(
            "{name}: Triton program, {} warps, {} stages, {} programs{}",
            program.options.num_warps,
            program.options.num_stages,
            program.grid.iter().product::<u64>(),
            if program.workspace_bytes > 0 {
                format!(", workspace {}", human_bytes(program.workspace_bytes))
            } else {
                String::new()
            }
        );
        let keep = staged.as_ref().map(|s| s.path().join(name));
        if let (Some(s), Some(_)) = (&staged, &keep) {
            s.write(
                &format!("{name}/{}.py", program.function),
                program.source.as_bytes(),
            )
            .map_err(|e| Failure::Run(e.to_string()))?;
        }
        let job = runtime::triton::CompileJob {
            program: &program,
            targets: &runnable,
            keep: keep.as_deref(),
            // The launch is fitted to each target unless it was given.
            fit: launch.stages.is_none() && launch.warps.is_none(),
        };
        let compiled = runtime::triton::compile_many(&[job])
            .map_err(|e| Failure::Run(format!("{name}: {e}")))?
            .pop()
            .unwrap_or_default();
        for c in compiled {
            if print(&c) {
                ok += 1;
            } else {
                failed += 1;
            }
        }
    }
    if kernels.len() * targets.len() > 1 {
        println!(
            "\ncompiled {ok} of {} ({} kernels x {} targets) with Triton {TRITON_VERSION}",
            ok + failed,
            kernels.len(),
            targets.len()
        );
    }
    if let (Some(s), Some(dir)) = (staged, out) {
        if failed > 0 {
            println!(
                "nothing written to {}: not every compile passed",
                dir.display()
            );
        } else {
            s.publish()
                .map_err(|e| Failure::Run(format!("--out {e}")))?;
            println!(
                "wrote {} (each kernel's Triton source and stages)",
                dir.display()
            );
        }
    }
    if failed > 0 {
        return Err(Failure::Run(format!(
            "{failed} of {} compiles failed or were refused",
            ok + failed
        )));
    }
    Ok(())
}

/// One target's line; true when it compiled and can launch.
fn print(c: &GpuCompile) -> bool {
    match &c.result {
        Ok(s) => {
            if let Err(e) = runtime::triton::check_launchable(c.target, s) {
                println!("  {:<6} TOO BIG {e}", c.target.name());
                return false;
            }
            let cores: Vec<String> = s
                .tensor_core
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            println!(
                "  {:<6} ok      {:>5.2} s  {}w/{}s  registers {:>3}  spills {:>4} B  shared {:>9}  code {:>9}  tensor cores: {}",
                c.target.name(),
                s.seconds,
                s.warps,
                s.stages,
                s.registers,
                s.spill_bytes,
                human_bytes(s.shared_bytes),
                human_bytes(s.code_bytes),
                if cores.is_empty() {
                    "none".to_string()
                } else {
                    cores.join(", ")
                }
            );
            true
        }
        Err(e) => {
            println!(
                "  {:<6} FAILED  {}",
                c.target.name(),
                indent(&e.to_string())
            );
            false
        }
    }
}

fn indent(text: &str) -> String {
    text.lines().collect::<Vec<_>>().join("\n                ")
}

/// Whether `dir` is an earlier `--gpu --out` folder: kernel folders each
/// holding a Triton source and target folders.
fn is_gpu_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().all(|e| {
            e.file_type().is_ok_and(|t| t.is_dir())
                && std::fs::read_dir(e.path()).is_ok_and(|inner| {
                    inner.flatten().all(|f| {
                        let n = f.file_name().to_string_lossy().to_string();
                        n.ends_with(".py") || n.parse::<GpuTarget>().is_ok()
                    })
                })
        })
    })
}
