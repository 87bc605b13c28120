//! Benchmarks of the CPU paths, each next to its baseline measured in the
//! same run.
//!
//! | workload | methods | baseline |
//! |---|---|---|
//! | matmul 1024³ f32 | native JIT of [`crate::foundation::matmul()`] | XLA's `dot_general` on the same PJRT plugin |
//! | attention forward, B=1 H=8 D=128, S=1024…8192, causal or not | native JIT and decomposed StableHLO of [`crate::attention::flash_attention()`] | XLA's unfused `softmax(QKᵀ)V` graph |
//!
//! Every (workload, method) runs in its own child process (the benchmark
//! binary re-executed with [`CHILD_FLAG`]), so that one measurement's
//! allocations cannot hide another's peak. Time is the median of repeated
//! runs after one warm-up; *peak memory* is how far the process's resident
//! set grows above where it stood just before the first run (inputs already
//! resident), read from `/proc/self/status` after resetting the high-water
//! mark — one method for every path, native or XLA.

use std::fmt;
use std::process::Command;
use std::time::{Duration, Instant};

use kernel_ir::{Array, DType, DotDims, VerifiedKernel};
use lowering::HostKernel;
use runtime::backend::{Backend, Prepared, cpu_client};
use runtime::graph::{Runtime, RuntimeError, Tensor};
use runtime::pjrt::{Buffer, CompileOptions};

use crate::attention::{AttnConfig, flash_attention};
use crate::foundation::{MatmulConfig, matmul};
use kernel_ir::KernelErrors;

/// The argument that makes a benchmark binary measure one case and exit.
pub const CHILD_FLAG: &str = "--tessera-bench-child";

/// What is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// `n × n × n` f32 matmul.
    Matmul {
        /// The size.
        n: usize,
    },
    /// Attention forward, B = 1, H = 8, D = 128, f32.
    Attention {
        /// Sequence length (queries and keys).
        s: usize,
        /// Causal mask.
        causal: bool,
    },
    /// Attention backward (dq, dk, dv from q, k, v, dO and the forward's
    /// output and logsumexp), same shapes.
    AttentionBwd {
        /// Sequence length.
        s: usize,
        /// Causal mask.
        causal: bool,
    },
}

/// One kernel of a workload and which arrays of the workload's pool it
/// reads (its outputs are appended to the pool).
pub struct Stage {
    /// The kernel.
    pub kernel: VerifiedKernel,
    /// Indices into the pool.
    pub inputs: Vec<usize>,
}

/// Heads of the attention benchmark.
pub const HEADS: usize = 8;
/// Head dim of the attention benchmark.
pub const HEAD_DIM: usize = 128;

impl Workload {
    /// Floating-point operations (multiply-adds count two); a causal
    /// attention counts the half it needs.
    pub fn flops(self) -> f64 {
        match self {
            Workload::Matmul { n } => 2.0 * (n as f64).powi(3),
            Workload::Attention { s, causal } => {
                let full = 4.0 * HEADS as f64 * (s as f64).powi(2) * HEAD_DIM as f64;
                if causal { full / 2.0 } else { full }
            }
            // Five products instead of two (recomputed scores, dP, dq, dk,
            // dv).
            Workload::AttentionBwd { s, causal } => 2.5 * Workload::Attention { s, causal }.flops(),
        }
    }

    fn args(self) -> String {
        match self {
            Workload::Matmul { n } => format!("matmul {n}"),
            Workload::Attention { s, causal } => format!("attention {s} {causal}"),
            Workload::AttentionBwd { s, causal } => format!("attention-bwd {s} {causal}"),
        }
    }

    fn parse(words: &[String]) -> Option<Workload> {
        match words {
            [w, n] if w == "matmul" => Some(Workload::Matmul { n: n.parse().ok()? }),
            [w, s, c] if w == "attention" => Some(Workload::Attention {
                s: s.parse().ok()?,
                causal: c.parse().ok()?,
            }),
            [w, s, c] if w == "attention-bwd" => Some(Workload::AttentionBwd {
                s: s.parse().ok()?,
                causal: c.parse().ok()?,
            }),
            _ => None,
        }
    }

    /// The arrays the workload starts from: its inputs, and for the
    /// backward pass the forward's output and logsumexp (computed here by
    /// the native forward kernel, outside any timing).
    fn pool(self) -> Result<Vec<Array>, String> {
        let attn = |s: usize| -> Vec<Array> {
            (0..3)
                .map(|i| Array::random(DType::F32, [1, HEADS, s, HEAD_DIM], 10 + i, -1.0, 1.0))
                .collect()
        };
        Ok(match self {
            Workload::Matmul { n } => vec![
                Array::random(DType::F32, [n, n], 1, -1.0, 1.0),
                Array::random(DType::F32, [n, n], 2, -1.0, 1.0),
            ],
            Workload::Attention { s, .. } => attn(s),
            Workload::AttentionBwd { s, causal } => {
                let mut pool = attn(s);
                pool.push(Array::random(
                    DType::F32,
                    [1, HEADS, s, HEAD_DIM],
                    20,
                    -1.0,
                    1.0,
                ));
                let fwd =
                    HostKernel::compile(&Workload::Attention { s, causal }.kernel(Method::Jit)?)
                        .map_err(|e| e.to_string())?;
                let outs = fwd.run(&pool[..3]).map_err(|e| e.to_string())?;
                pool.extend(outs); // o, lse
                pool
            }
        })
    }

    /// The pool arrays the XLA baseline takes.
    fn baseline_inputs(self) -> Vec<usize> {
        match self {
            Workload::Matmul { .. } => vec![0, 1],
            Workload::Attention { .. } => vec![0, 1, 2],
            Workload::AttentionBwd { .. } => vec![0, 1, 2, 3],
        }
    }

    /// The Tessera kernels of this workload for method `m`, in order.
    pub fn stages(self, m: Method) -> Result<Vec<Stage>, String> {
        let err = |e: KernelErrors| e.to_string();
        Ok(match self {
            Workload::AttentionBwd { s, causal } => {
                let b = attention_block(m, s);
                let cfg = AttnConfig {
                    causal,
                    sm_scale: 1.0 / (HEAD_DIM as f32).sqrt(),
                    block_q: b,
                    block_k: b,
                    window: None,
                    softcap: None,
                };
                use crate::attention::backward as bw;
                let (h, d) = (HEADS, HEAD_DIM);
                // Pool: q k v dO o lse, then delta.
                vec![
                    Stage {
                        kernel: bw::attention_delta(
                            b,
                            DType::F32,
                            bw::attention_delta::Dims { b: 1, h, sq: s, d },
                        )
                        .map_err(err)?,
                        inputs: vec![4, 3],
                    },
                    Stage {
                        kernel: bw::flash_attention_dq(
                            &cfg,
                            DType::F32,
                            bw::flash_attention_dq::Dims {
                                b: 1,
                                h,
                                hkv: h,
                                sq: s,
                                skv: s,
                                d,
                            },
                        )
                        .map_err(err)?,
                        inputs: vec![0, 1, 2, 3, 5, 6],
                    },
                    Stage {
                        kernel: bw::flash_attention_dkv(
                            &cfg,
                            DType::F32,
                            bw::flash_attention_dkv::Dims {
                                b: 1,
                                h,
                                hkv: h,
                                sq: s,
                                skv: s,
                                d,
                            },
                        )
                        .map_err(err)?,
                        inputs: vec![0, 1, 2, 3, 5, 6],
                    },
                ]
            }
            w => {
                let kernel = w.kernel(m)?;
                let n = kernel.inputs().count();
                vec![Stage {
                    kernel,
                    inputs: (0..n).collect(),
                }]
            }
        })
    }

    /// The Tessera kernel of this workload, configured for method `m`.
    pub fn kernel(self, m: Method) -> Result<VerifiedKernel, String> {
        match self {
            Workload::Matmul { n } => matmul(&MatmulConfig {
                m: n,
                n,
                k: n,
                bm: 128,
                bn: 256,
                bk: 256,
                dtype: DType::F32,
                out_dtype: DType::F32,
            }),
            Workload::AttentionBwd { .. } => {
                return Err("the backward pass is several kernels; see `stages`".into());
            }
            Workload::Attention { s, causal } => flash_attention(
                &AttnConfig {
                    causal,
                    sm_scale: 1.0 / (HEAD_DIM as f32).sqrt(),
                    block_q: attention_block(m, s),
                    block_k: attention_block(m, s),
                    window: None,
                    softcap: None,
                },
                DType::F32,
                crate::attention::flash_attention::Dims {
                    b: 1,
                    h: HEADS,
                    sq: s,
                    skv: s,
                    d: HEAD_DIM,
                    hkv: HEADS,
                },
            ),
        }
        .map_err(|e| e.to_string())
    }

    /// The unfused baseline XLA compiles: the workload written with the
    /// graph runtime's ops and exported as the StableHLO it would run.
    pub fn baseline_module(self) -> Result<String, String> {
        baseline(self).map_err(|e| e.to_string())
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Workload::Matmul { n } => write!(f, "matmul {n}x{n}x{n} f32"),
            Workload::Attention { s, causal } => {
                write!(f, "attention S={s}{}", if *causal { " causal" } else { "" })
            }
            Workload::AttentionBwd { s, causal } => {
                write!(
                    f,
                    "attention bwd S={s}{}",
                    if *causal { " causal" } else { "" }
                )
            }
        }
    }
}

/// Attention block size per method, tuned on this machine's CPUs: the JIT
/// is fastest with 256 × 256 blocks (fewer block copies per multiply-add
/// than 128, still cache-resident); XLA runs the decomposed grid loop with
/// a per-iteration cost, so fewer, larger 512 × 512 blocks win there.
pub fn attention_block(m: Method, s: usize) -> usize {
    let b = if m == Method::Decomposed { 512 } else { 256 };
    b.min(s)
}

/// `[.., S, D] × [.., S, D]` products over the `[1, H]` batch dims,
/// contracting dim `l` of the lhs with dim `r` of the rhs.
fn batched(l: usize, r: usize) -> DotDims {
    DotDims {
        lhs_batch: vec![0, 1],
        rhs_batch: vec![0, 1],
        lhs_contract: vec![l],
        rhs_contract: vec![r],
    }
}

/// `P = softmax(Q·Kᵀ·scale [+ causal mask])` over `[1, H, S, S]`, op by
/// op: the `[S, S]` intermediate flash attention never writes.
fn probabilities(
    rt: &Runtime,
    q: &Tensor,
    k: &Tensor,
    s: usize,
    causal: bool,
) -> Result<Tensor, RuntimeError> {
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    let scores = q.dot_general(k, batched(3, 3))?.scale(scale)?;
    let scores = if causal {
        let shape = [1, HEADS, s, s];
        let keep = rt
            .iota(&shape, 2, DType::I32)?
            .ge(&rt.iota(&shape, 3, DType::I32)?)?;
        let hidden = rt
            .scalar(f64::NEG_INFINITY, DType::F32)
            .broadcast_to(&shape)?;
        keep.select(&scores, &hidden)?
    } else {
        scores
    };
    scores.softmax(3)
}

/// The baseline graph of `w` on a CPU runtime, exported.
fn baseline(w: Workload) -> Result<String, RuntimeError> {
    let rt = Runtime::cpu()?;
    let input = |shape: &[usize]| rt.tensor(&Array::zeros(DType::F32, shape.to_vec()));
    match w {
        Workload::Matmul { n } => {
            let (a, b) = (input(&[n, n])?, input(&[n, n])?);
            let c = a.matmul(&b)?;
            rt.export(&[&a, &b], &[&c])
        }
        Workload::Attention { s, causal } => {
            let shape = [1, HEADS, s, HEAD_DIM];
            let (q, k, v) = (input(&shape)?, input(&shape)?, input(&shape)?);
            let o = probabilities(&rt, &q, &k, s, causal)?.dot_general(&v, batched(3, 2))?;
            rt.export(&[&q, &k, &v], &[&o])
        }
        Workload::AttentionBwd { s, causal } => {
            // P recomputed from q, k; then dV = Pᵀ·dO, dP = dO·Vᵀ,
            // dS = P ∘ (dP − rowsum(P ∘ dP)), dQ = scale·dS·K,
            // dK = scale·dSᵀ·Q, each with an [S, S] intermediate.
            let shape = [1, HEADS, s, HEAD_DIM];
            let (q, k, v, d_o) = (
                input(&shape)?,
                input(&shape)?,
                input(&shape)?,
                input(&shape)?,
            );
            let p = probabilities(&rt, &q, &k, s, causal)?;
            let dv = p.dot_general(&d_o, batched(2, 2))?;
            let dp = d_o.dot_general(&v, batched(3, 3))?;
            let delta = p
                .mul(&dp)?
                .sum(&[3])?
                .broadcast_in_dim(&[1, HEADS, s, s], &[0, 1, 2])?;
            let ds = p
                .mul(&dp.sub(&delta)?)?
                .scale(1.0 / (HEAD_DIM as f64).sqrt())?;
            let dq = ds.dot_general(&k, batched(3, 2))?;
            let dk = ds.dot_general(&q, batched(2, 2))?;
            rt.export(&[&q, &k, &v, &d_o], &[&dq, &dk, &dv])
        }
    }
}

/// How a workload is run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// The Tessera kernel, native JIT.
    Jit,
    /// The Tessera kernel as decomposed StableHLO on PJRT.
    Decomposed,
    /// The plain StableHLO baseline on PJRT.
    Xla,
}

impl Method {
    /// Its name in reports.
    pub fn name(self, w: Workload) -> &'static str {
        match (self, w) {
            (Method::Jit, _) => "tessera jit",
            (Method::Decomposed, _) => "tessera pjrt-decomposed",
            (Method::Xla, Workload::Matmul { .. }) => "xla dot_general",
            (Method::Xla, Workload::Attention { .. } | Workload::AttentionBwd { .. }) => {
                "xla unfused"
            }
        }
    }

    fn arg(self) -> &'static str {
        match self {
            Method::Jit => "jit",
            Method::Decomposed => "decomposed",
            Method::Xla => "xla",
        }
    }

    fn parse(s: &str) -> Option<Method> {
        [Method::Jit, Method::Decomposed, Method::Xla]
            .into_iter()
            .find(|m| m.arg() == s)
    }
}

/// One measured (workload, method).
#[derive(Clone, Debug)]
pub struct Measurement {
    /// What ran.
    pub workload: Workload,
    /// How.
    pub method: Method,
    /// Median seconds per run.
    pub seconds: f64,
    /// Timed runs (after one warm-up).
    pub runs: usize,
    /// Resident-set growth of the first run, bytes.
    pub peak_bytes: u64,
}

impl Measurement {
    /// GFLOP/s at the median time.
    pub fn gflops(&self) -> f64 {
        self.workload.flops() / self.seconds / 1e9
    }
}

fn status_kib(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Resets the resident-set high-water mark; returns the current RSS.
fn reset_peak() -> Option<u64> {
    std::fs::write("/proc/self/clear_refs", "5").ok()?;
    status_kib("VmRSS:").map(|k| k * 1024)
}

fn peak() -> Option<u64> {
    status_kib("VmHWM:").map(|k| k * 1024)
}

/// Measures in this process: compile, reset the peak, run once (memory),
/// then time runs until `budget` is spent (at least two, at most 10).
pub fn measure(w: Workload, m: Method, budget: Duration) -> Result<Measurement, String> {
    let pool = w.pool()?;
    let mut run: Box<dyn FnMut() -> Result<(), String>> = match m {
        Method::Jit => {
            let stages: Vec<(HostKernel, Vec<usize>)> = w
                .stages(m)?
                .into_iter()
                .map(|st| {
                    Ok((
                        HostKernel::compile(&st.kernel).map_err(|e| e.to_string())?,
                        st.inputs,
                    ))
                })
                .collect::<Result<_, String>>()?;
            let bytes: Vec<Vec<u8>> = pool.iter().map(Array::to_le_bytes).collect();
            Box::new(move || {
                // Stage outputs; the inputs are read in place (no copy, so
                // the peak counts only what the kernels allocate).
                let mut produced: Vec<Vec<u8>> = Vec::new();
                for (k, inputs) in &stages {
                    let outs = {
                        let refs: Vec<&[u8]> = inputs
                            .iter()
                            .map(|&i| {
                                if i < bytes.len() {
                                    bytes[i].as_slice()
                                } else {
                                    produced[i - bytes.len()].as_slice()
                                }
                            })
                            .collect();
                        let mut outs: Vec<Vec<u8>> = k
                            .kernel()
                            .outputs()
                            .map(|o| vec![0u8; o.shape.iter().product::<usize>() * o.dtype.bytes()])
                            .collect();
                        let mut out_refs: Vec<&mut [u8]> =
                            outs.iter_mut().map(Vec::as_mut_slice).collect();
                        k.run_bytes(&[], &refs, &mut out_refs)
                            .map_err(|e| e.to_string())?;
                        outs
                    };
                    produced.extend(outs);
                }
                Ok(())
            })
        }
        Method::Decomposed => {
            let stages: Vec<(Prepared, Vec<usize>)> = w
                .stages(m)?
                .into_iter()
                .map(|st| {
                    Ok((
                        Prepared::new(Backend::Decomposed, &st.kernel)
                            .map_err(|e| e.to_string())?,
                        st.inputs,
                    ))
                })
                .collect::<Result<_, String>>()?;
            let first = &stages.first().ok_or("no stages")?.0;
            let bufs: Vec<Buffer> = first.upload(&pool).map_err(|e| e.to_string())?;
            let bufs = std::sync::Arc::new(bufs);
            Box::new(move || {
                let mut produced: Vec<Buffer> = Vec::new();
                for (exe, inputs) in &stages {
                    let outs = {
                        let args: Vec<&Buffer> = inputs
                            .iter()
                            .map(|&i| {
                                if i < bufs.len() {
                                    &bufs[i]
                                } else {
                                    &produced[i - bufs.len()]
                                }
                            })
                            .collect();
                        exe.execute_refs(&args).map_err(|e| e.to_string())?
                    };
                    produced.extend(outs);
                }
                Ok(())
            })
        }
        Method::Xla => {
            let client = cpu_client().map_err(|e| e.to_string())?;
            let executable = client
                .compile(w.baseline_module()?.as_bytes(), &CompileOptions::default())
                .map_err(|e| e.to_string())?;
            let exe = Prepared::Pjrt {
                backend: Backend::Decomposed,
                executable,
                client,
                kernel: None,
            };
            let args: Vec<Array> = w
                .baseline_inputs()
                .iter()
                .map(|&i| pool[i].clone())
                .collect();
            let bufs: Vec<Buffer> = exe.upload(&args).map_err(|e| e.to_string())?;
            Box::new(move || exe.execute(&bufs).map(drop).map_err(|e| e.to_string()))
        }
    };
    let before = reset_peak().unwrap_or(0);
    let t = Instant::now();
    run()?;
    let first = t.elapsed();
    let peak_bytes = peak().unwrap_or(0).saturating_sub(before);
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 10 && (times.len() < 2 || start.elapsed() + first < budget) {
        let t = Instant::now();
        run()?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(Measurement {
        workload: w,
        method: m,
        seconds: times[times.len() / 2],
        runs: times.len(),
        peak_bytes,
    })
}

/// If `args` (without the program name) ask for one child measurement,
/// runs it, prints the result line and returns the exit code.
pub fn child_main(args: &[String]) -> Option<std::process::ExitCode> {
    let pos = args.iter().position(|a| a == CHILD_FLAG)?;
    // A measurement dies with the `tessera bench` that started it (SIGINT,
    // SIGTERM or a crash of the parent), instead of running on orphaned.
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag of this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    // The parent may already be gone (between fork and the prctl).
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } == 1 {
        return Some(std::process::ExitCode::FAILURE);
    }
    let rest = &args[pos + 1..];
    let parsed = rest
        .first()
        .and_then(|m| Method::parse(m))
        .zip(Workload::parse(rest.get(2..).unwrap_or(&[])))
        .zip(rest.get(1).and_then(|b| b.parse::<f64>().ok()));
    let Some(((m, w), budget)) = parsed else {
        eprintln!("bad benchmark child arguments: {rest:?}");
        return Some(std::process::ExitCode::from(2));
    };
    match measure(w, m, Duration::from_secs_f64(budget)) {
        Ok(r) => {
            println!("TESSERA_BENCH {} {} {}", r.seconds, r.runs, r.peak_bytes);
            Some(std::process::ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{e}");
            Some(std::process::ExitCode::FAILURE)
        }
    }
}

/// Measures in a child process (this executable with [`CHILD_FLAG`]).
pub fn measure_isolated(w: Workload, m: Method, budget: Duration) -> Result<Measurement, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.arg(CHILD_FLAG)
        .arg(m.arg())
        .arg(budget.as_secs_f64().to_string());
    cmd.args(w.args().split(' '));
    let out = cmd.output().map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("TESSERA_BENCH "))
        .ok_or_else(|| {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no output");
            format!("{} on {w} failed: {last}", m.name(w))
        })?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let parse = |i: usize| {
        f.get(i)
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    Ok(Measurement {
        workload: w,
        method: m,
        seconds: parse(0),
        runs: parse(1) as usize,
        peak_bytes: parse(2) as u64,
    })
}

/// The standard suite: matmul 1024³, attention forward at S = 1024…8192
/// (up to `max_s`) and backward at S = 1024…4096 (up to `max_bwd_s`),
/// causal and not.
pub fn suite(max_s: usize, max_bwd_s: usize) -> Vec<(Workload, Vec<Method>)> {
    let mut v = vec![(Workload::Matmul { n: 1024 }, vec![Method::Jit, Method::Xla])];
    let mut s = 1024;
    while s <= max_s {
        for causal in [false, true] {
            v.push((
                Workload::Attention { s, causal },
                vec![Method::Jit, Method::Decomposed, Method::Xla],
            ));
        }
        s *= 2;
    }
    let mut s = 1024;
    while s <= max_bwd_s {
        for causal in [false, true] {
            v.push((
                Workload::AttentionBwd { s, causal },
                vec![Method::Jit, Method::Decomposed, Method::Xla],
            ));
        }
        s *= 2;
    }
    v
}

/// A table of measurements with time and peak-memory ratios against the
/// XLA baseline of the same workload.
pub fn table(rows: &[Result<Measurement, String>]) -> String {
    let mut out = format!(
        "{:<26} {:<24} {:>10} {:>9} {:>11} {:>10} {:>10}\n",
        "workload", "method", "time", "GFLOP/s", "peak mem", "time/xla", "mem/xla"
    );
    let base = |w: Workload| {
        rows.iter()
            .flatten()
            .find(|m| m.workload == w && m.method == Method::Xla)
    };
    for r in rows {
        match r {
            Ok(m) => {
                let b = base(m.workload);
                let ratio = |x: f64, y: Option<f64>| match y {
                    Some(y) if y > 0.0 => format!("{:.2}x", x / y),
                    _ => "-".into(),
                };
                out += &format!(
                    "{:<26} {:<24} {:>8.1}ms {:>9.1} {:>11} {:>10} {:>10}\n",
                    m.workload.to_string(),
                    m.method.name(m.workload),
                    m.seconds * 1e3,
                    m.gflops(),
                    kernel_ir::human_bytes(m.peak_bytes),
                    ratio(m.seconds, b.map(|b| b.seconds)),
                    ratio(m.peak_bytes as f64, b.map(|b| b.peak_bytes as f64)),
                );
            }
            Err(e) => out += &format!("error: {e}\n"),
        }
    }
    out
}

/// The measurements as JSON (an array of objects; ratios against the XLA
/// baseline of the same workload, `null` where there is none).
pub fn to_json(rows: &[Result<Measurement, String>]) -> String {
    let base = |w: Workload| {
        rows.iter()
            .flatten()
            .find(|m| m.workload == w && m.method == Method::Xla)
    };
    let items: Vec<String> = rows
        .iter()
        .map(|r| match r {
            Ok(m) => {
                let b = base(m.workload);
                let ratio = |x: f64, y: Option<f64>| match y {
                    Some(y) if y > 0.0 => format!("{:.4}", x / y),
                    _ => "null".into(),
                };
                format!(
                    "{{\"workload\": \"{}\", \"method\": \"{}\", \"seconds\": {:.6}, \"runs\": {}, \"gflops\": {:.2}, \"peak_bytes\": {}, \"time_vs_xla\": {}, \"memory_vs_xla\": {}}}",
                    m.workload,
                    m.method.name(m.workload),
                    m.seconds,
                    m.runs,
                    m.gflops(),
                    m.peak_bytes,
                    ratio(m.seconds, b.map(|b| b.seconds)),
                    ratio(m.peak_bytes as f64, b.map(|b| b.peak_bytes as f64))
                )
            }
            Err(e) => format!("{{\"error\": \"{}\"}}", e.replace('\\', "\\\\").replace('"', "\\\"")),
        })
        .collect();
    format!("[\n  {}\n]\n", items.join(",\n  "))
}

/// An SVG chart of attention forward: time and peak memory against
/// sequence length (log-log), one line per method, causal dashed.
pub fn svg_chart(rows: &[Result<Measurement, String>]) -> String {
    let pts: Vec<&Measurement> = rows
        .iter()
        .flatten()
        .filter(|m| matches!(m.workload, Workload::Attention { .. }))
        .collect();
    let (w, h, pad) = (460.0, 300.0, 55.0);
    let mut svg = String::from(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"980\" height=\"360\" font-family=\"sans-serif\" font-size=\"11\">\n",
    );
    svg += "<text x=\"490\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">Attention forward: fused (Tessera) vs unfused (XLA), B=1 H=8 D=128 f32</text>\n";
    let colors = [
        (Method::Jit, "#1f77b4"),
        (Method::Decomposed, "#2ca02c"),
        (Method::Xla, "#d62728"),
    ];
    type Value = fn(&Measurement) -> f64;
    let panels: [(&str, Value); 2] = [
        ("time (ms)", |m| m.seconds * 1e3),
        ("peak memory (MiB)", |m| m.peak_bytes as f64 / 1048576.0),
    ];
    for (p, (title, value)) in panels.iter().enumerate() {
        let x0 = 20.0 + p as f64 * 490.0;
        let y0 = 30.0;
        let vals: Vec<f64> = pts.iter().map(|m| value(m)).filter(|v| *v > 0.0).collect();
        let ss: Vec<f64> = pts
            .iter()
            .filter_map(|m| match m.workload {
                Workload::Attention { s, .. } => Some(s as f64),
                _ => None,
            })
            .collect();
        if vals.is_empty() || ss.is_empty() {
            continue;
        }
        let (vmin, vmax) = vals
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        let (smin, smax) = ss
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        let (lv0, lv1) = (
            vmin.log10().floor(),
            vmax.log10().ceil().max(vmin.log10().floor() + 1.0),
        );
        let (ls0, ls1) = (smin.log2(), smax.log2().max(smin.log2() + 1.0));
        let px = |s: f64| x0 + pad + (s.log2() - ls0) / (ls1 - ls0) * (w - pad - 10.0);
        let py = |v: f64| y0 + h - pad + 10.0 - (v.log10() - lv0) / (lv1 - lv0) * (h - pad);
        svg += &format!(
            "<rect x=\"{x0}\" y=\"{y0}\" width=\"{w}\" height=\"{h}\" fill=\"none\" stroke=\"#ccc\"/>\n<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"12\">{title}</text>\n",
            x0 + w / 2.0,
            y0 + 14.0
        );
        let mut e = lv0;
        while e <= lv1 {
            let v = 10f64.powf(e);
            svg += &format!(
                "<line x1=\"{}\" x2=\"{}\" y1=\"{y}\" y2=\"{y}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{v}</text>\n",
                x0 + pad,
                x0 + w - 10.0,
                x0 + pad - 4.0,
                py(v) + 4.0,
                y = py(v)
            );
            e += 1.0;
        }
        let mut s = smin;
        while s <= smax {
            svg += &format!(
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">S={s}</text>\n",
                px(s),
                y0 + h - 8.0
            );
            s *= 2.0;
        }
        for (method, color) in colors {
            for causal in [false, true] {
                let mut line: Vec<(f64, f64)> = pts
                    .iter()
                    .filter(|m| m.method == method && matches!(m.workload, Workload::Attention { causal: c, .. } if c == causal))
                    .filter_map(|m| match m.workload {
                        Workload::Attention { s, .. } => Some((s as f64, value(m))),
                        _ => None,
                    })
                    .filter(|(_, v)| *v > 0.0)
                    .collect();
                line.sort_by(|a, b| a.0.total_cmp(&b.0));
                if line.is_empty() {
                    continue;
                }
                let path: Vec<String> = line
                    .iter()
                    .map(|(s, v)| format!("{:.1},{:.1}", px(*s), py(*v)))
                    .collect();
                svg += &format!(
                    "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{}/>\n",
                    path.join(" "),
                    if causal {
                        " stroke-dasharray=\"5,4\""
                    } else {
                        ""
                    }
                );
            }
        }
    }
    // Legend.
    for (i, (method, color)) in colors.iter().enumerate() {
        let x = 80.0 + i as f64 * 220.0;
        let name = method.name(Workload::Attention {
            s: 1,
            causal: false,
        });
        svg += &format!(
            "<line x1=\"{x}\" x2=\"{}\" y1=\"348\" y2=\"348\" stroke=\"{color}\" stroke-width=\"2\"/><text x=\"{}\" y=\"352\">{name}</text>\n",
            x + 24.0,
            x + 30.0
        );
    }
    svg += "<text x=\"740\" y=\"352\">solid: full, dashed: causal</text>\n</svg>\n";
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::tooling::check::{ErrorStats, Tolerance};

    /// Runs the exported baseline of `w` on XLA's CPU plugin.
    fn run_baseline(w: Workload, args: &[Array]) -> Vec<Array> {
        let client = cpu_client().unwrap();
        let executable = client
            .compile(
                w.baseline_module().unwrap().as_bytes(),
                &CompileOptions::default(),
            )
            .unwrap();
        Prepared::Pjrt {
            backend: Backend::Decomposed,
            executable,
            client,
            kernel: None,
        }
        .run(args)
        .unwrap()
    }

    /// The peer the benchmark compares with computes what it claims:
    /// attention forward and backward against the f64 reference.
    #[test]
    fn the_xla_baselines_compute_attention() {
        let s = 64;
        let shape = [1, HEADS, s, HEAD_DIM];
        let r = |seed| Array::random(DType::F32, shape, seed, -1.0, 1.0);
        let (q, k, v, g) = (r(1), r(2), r(3), r(4));
        let scale = 1.0 / (HEAD_DIM as f64).sqrt();
        for causal in [false, true] {
            let o = run_baseline(
                Workload::Attention { s, causal },
                &[q.clone(), k.clone(), v.clone()],
            );
            let want = reference::attention(&q, &k, &v, causal, scale);
            let st = ErrorStats::between(&o[0], &want, Tolerance::attention(DType::F32));
            assert!(st.passes(), "forward causal={causal}: {st}");
            let grads = run_baseline(
                Workload::AttentionBwd { s, causal },
                &[q.clone(), k.clone(), v.clone(), g.clone()],
            );
            let spec = reference::AttnSpec::new(causal, scale);
            let (dq, dk, dv) = reference::attention_backward(&q, &k, &v, &g, &spec);
            for (name, got, want) in [
                ("dq", &grads[0], dq),
                ("dk", &grads[1], dk),
                ("dv", &grads[2], dv),
            ] {
                let st = ErrorStats::between(got, &want, Tolerance::attention_grad(DType::F32));
                assert!(st.passes(), "{name} causal={causal}: {st}");
            }
        }
        let (a, b) = (
            Array::random(DType::F32, [64, 64], 5, -1.0, 1.0),
            Array::random(DType::F32, [64, 64], 6, -1.0, 1.0),
        );
        let c = run_baseline(Workload::Matmul { n: 64 }, &[a.clone(), b.clone()]);
        let st = ErrorStats::between(
            &c[0],
            &reference::matmul(&a, &b),
            Tolerance::matmul(64, DType::F32),
        );
        assert!(st.passes(), "matmul: {st}");
    }
}
