//! Measuring one workload with one method: median time and peak memory,
//! each measurement in a child process of its own.

use kernel_ir::Array;
use lowering::HostKernel;
use runtime::backend::{Backend, Prepared, cpu_client};
use runtime::pjrt::{Buffer, CompileOptions};
use std::process::Command;
use std::time::{Duration, Instant};

use super::*;

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

/// The most timed runs of one measurement. Enough that a short workload
/// (a 6 ms matmul) is timed over the whole budget, so that its median is
/// not that of a 60 ms window the machine's background load may own.
pub const MAX_RUNS: usize = 100;

/// Measures in this process: compile, reset the peak, run once (memory),
/// then time runs until `budget` is spent (at least two, at most
/// `MAX_RUNS`).
pub fn measure(w: Workload, m: Method, budget: Duration) -> Result<Measurement, BenchError> {
    if m == Method::Torch {
        let python = super::torch_python().ok_or(BenchError::Unsupported(
            "no Python with torch (tooling/benches/setup_torch.sh makes one)",
        ))?;
        return super::torch::measure_torch(&python, w, budget);
    }
    let pool = w.pool(m)?;
    let mut run: Box<dyn FnMut() -> Result<(), BenchError>> = match m {
        // Measured above, in Python.
        Method::Torch => {
            return Err(BenchError::Unsupported(
                "torch is measured by its own child",
            ));
        }
        Method::Jit | Method::Tables => {
            let stages: Vec<(HostKernel, Vec<usize>)> = w
                .stages(m)?
                .into_iter()
                .map(|st| Ok((HostKernel::compile(&st.kernel)?, st.inputs)))
                .collect::<Result<_, BenchError>>()?;
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
                        let (prefetch, inputs) = refs.split_at(k.kernel().prefetch.len());
                        k.run_bytes(prefetch, inputs, &mut out_refs)?;
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
                .map(|st| Ok((Prepared::new(Backend::Decomposed, &st.kernel)?, st.inputs)))
                .collect::<Result<_, BenchError>>()?;
            let first = &stages
                .first()
                .ok_or(BenchError::Unsupported("no stages"))?
                .0;
            let bufs: Vec<Buffer> = first.upload(&pool)?;
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
                        exe.execute_refs(&args)?
                    };
                    produced.extend(outs);
                }
                Ok(())
            })
        }
        Method::Xla => {
            let client = cpu_client()?;
            let executable =
                client.compile(w.baseline_module()?.as_bytes(), &CompileOptions::default())?;
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
            let bufs: Vec<Buffer> = exe.upload(&args)?;
            Box::new(move || Ok(exe.execute(&bufs).map(drop)?))
        }
    };
    let before = reset_peak().unwrap_or(0);
    let t = Instant::now();
    run()?;
    let first = t.elapsed();
    let peak_bytes = peak().unwrap_or(0).saturating_sub(before);
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < MAX_RUNS && (times.len() < 2 || start.elapsed() + first < budget) {
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
pub fn measure_isolated(
    w: Workload,
    m: Method,
    budget: Duration,
) -> Result<Measurement, BenchError> {
    if m == Method::Torch {
        // Its own process already: the Python child.
        return measure(w, m, budget);
    }
    let spawn = |source| BenchError::Spawn {
        what: format!("{} on {w}", m.name(w)),
        source: std::sync::Arc::new(source),
    };
    let exe = std::env::current_exe().map_err(spawn)?;
    let mut cmd = Command::new(exe);
    cmd.arg(CHILD_FLAG)
        .arg(m.arg())
        .arg(budget.as_secs_f64().to_string());
    cmd.args(w.args().split(' '));
    let out = cmd.output().map_err(spawn)?;
    child_result(w, m, &out)
}

/// Every method of one workload measured in `rounds` interleaved rounds
/// (each a child process per method with `budget / rounds` of timed runs;
/// the order rotates each round): a drift in the machine's speed (a noisy
/// neighbour on a shared host, a thermal change) lands on every method
/// alike, instead of on whichever ran during it. A method's time is the
/// median of its rounds' medians; its runs add up, its peak is the
/// largest. A method that fails in any round reports that error.
pub fn measure_interleaved(
    w: Workload,
    methods: &[Method],
    budget: Duration,
    rounds: usize,
    mut progress: impl FnMut(Method, usize),
) -> Vec<Result<Measurement, BenchError>> {
    let rounds = rounds.max(1);
    let each = budget / rounds as u32;
    let mut got: Vec<Result<Vec<Measurement>, BenchError>> = vec![Ok(Vec::new()); methods.len()];
    for round in 0..rounds {
        for i in 0..methods.len() {
            let i = (i + round) % methods.len();
            let Ok(list) = &mut got[i] else { continue };
            progress(methods[i], round);
            match measure_isolated(w, methods[i], each) {
                Ok(m) => list.push(m),
                Err(e) => got[i] = Err(e),
            }
        }
    }
    got.into_iter()
        .zip(methods)
        .map(|(r, &method)| {
            let mut list = r?;
            list.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
            let mid = list
                .get(list.len() / 2)
                .ok_or_else(|| BenchError::NotMeasured(format!("{} on {w}", method.name(w))))?;
            Ok(Measurement {
                workload: w,
                method,
                seconds: mid.seconds,
                runs: list.iter().map(|m| m.runs).sum(),
                peak_bytes: list.iter().map(|m| m.peak_bytes).max().unwrap_or(0),
            })
        })
        .collect()
}

/// The measurement a child printed (`TESSERA_BENCH seconds runs
/// peak_bytes`), or its last line of stderr as the error.
pub(super) fn child_result(
    w: Workload,
    m: Method,
    out: &std::process::Output,
) -> Result<Measurement, BenchError> {
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
            BenchError::Child {
                what: format!("{} on {w}", m.name(w)),
                last_line: last.to_string(),
            }
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
