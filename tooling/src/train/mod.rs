//! Training on the graph runtime: a small causal transformer LM
//! ([`model`]) on a copying task ([`data`]) with AdamW, forward, backward
//! and update recorded as one program per step (compiled at the first
//! step, a cache hit after), checkpoints that survive preemption
//! ([`checkpoint`]), and a SIGTERM handler that finishes the current step,
//! saves and returns, well inside a preemption notice.
//!
//! `tessera train` runs [`train`] with [`TrainOptions::from_args`].
//!
//! ```no_run
//! use tooling::train::{TrainOptions, train};
//! let opts = TrainOptions { steps: 50, ..TrainOptions::default() };
//! let summary = train(&opts).unwrap();
//! println!("loss {} after {} steps", summary.final_loss, summary.last_step);
//! ```

pub mod checkpoint;
pub mod data;
pub mod model;
pub mod program;

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use graph::{AdamW, Runtime, RuntimeOptions, Tensor, grad};
use kernel_ir::Array;

use checkpoint::{Checkpoint, CheckpointError, Writer, WriterError};
use data::CopyTask;

/// Why a training run stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A bad `tessera train` argument.
    #[error("{0}; see tessera train --help")]
    Usage(String),
    /// The model's sizes do not fit together.
    #[error(
        "the model needs d_model divisible by heads, an even seq, vocab ≥ 3, checkpoint_every ≥ 1, and (MoE) 1 ≤ top_k ≤ experts with expert_ffn ≥ 1"
    )]
    Model,
    /// The graph runtime failed at a step of the run.
    #[error("{what}: {source}")]
    Runtime {
        /// What the run was doing.
        what: &'static str,
        /// Why it failed.
        source: graph::RuntimeError,
    },
    /// The checkpoint directory (locking, reading, clearing it).
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A checkpoint could not be saved.
    #[error(transparent)]
    Save(#[from] WriterError),
    /// The directory holds a run with other settings.
    #[error(
        "{} holds another run: its {field} is {theirs}, this run's is {ours}; resume with the same settings, or start over with --no-resume (which removes its checkpoints) or another --checkpoint-dir",
        dir.display()
    )]
    OtherRun {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The setting that differs.
        field: String,
        /// Its value in the checkpoint.
        theirs: String,
        /// Its value in this run.
        ours: String,
    },
    /// A taken checkpoint lacks a tensor the model needs.
    #[error("checkpoint step {step} has no tensor `{name}`")]
    MissingTensor {
        /// The checkpoint's step.
        step: u64,
        /// The tensor.
        name: String,
    },
    /// The loss, or a tensor after the update, is not finite.
    #[error(
        "step {step}: {what}; the run diverged and stopped without saving it (the checkpoints before it are kept); lower --lr (now {lr})"
    )]
    Diverged {
        /// The step.
        step: u64,
        /// What was not finite.
        what: String,
        /// The learning rate.
        lr: f64,
    },
    /// The step's module could not be written.
    #[error("writing the step module {}: {source}", path.display())]
    StepModule {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The loss log could not be opened or written.
    #[error("the loss log {}: {source}", path.display())]
    LossLog {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}
use model::LmConfig;

/// The loss the default run must reach (nats per copied token; chance is
/// ln 15 ≈ 2.7), as the mean of its last [`RECENT_STEPS`] steps.
pub const LOSS_THRESHOLD: f64 = 0.05;

/// How many final steps [`TrainSummary::recent_loss`] averages.
pub const RECENT_STEPS: usize = 10;

/// How a training run is set up.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// The model.
    pub model: LmConfig,
    /// Train until this step (a resumed run continues to it).
    pub steps: u64,
    /// Seed of the parameters and the data.
    pub seed: u64,
    /// AdamW learning rate.
    pub lr: f64,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Where checkpoints go (and are resumed from); none: no checkpoints.
    pub checkpoint_dir: Option<PathBuf>,
    /// Save every this many steps (and on SIGTERM).
    pub checkpoint_every: u64,
    /// Resume from the newest valid checkpoint in `checkpoint_dir`.
    pub resume: bool,
    /// Append `step loss loss_bits` lines here (the bit pattern of the f32
    /// loss, for bit-exact comparisons).
    pub loss_log: Option<PathBuf>,
    /// Stop at SIGTERM after the current step, with a checkpoint.
    pub handle_sigterm: bool,
    /// Print progress on stderr.
    pub progress: bool,
    /// Write the step's module for a TPU here instead of training
    /// ([`program::write_step_module`]).
    pub step_module: Option<PathBuf>,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            model: LmConfig::default(),
            steps: 200,
            seed: 1,
            lr: 3e-3,
            weight_decay: 0.01,
            checkpoint_dir: None,
            checkpoint_every: 50,
            resume: true,
            loss_log: None,
            handle_sigterm: true,
            progress: true,
            step_module: None,
        }
    }
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct TrainSummary {
    /// The step it started after (0, or the checkpoint's).
    pub resumed_from: u64,
    /// The last step done.
    pub last_step: u64,
    /// Its loss.
    pub final_loss: f64,
    /// The mean loss of this run's last (up to) [`RECENT_STEPS`] steps:
    /// what the threshold is judged on, since one step's loss is noisy
    /// (a batch, and dropout's mask).
    pub recent_loss: f64,
    /// Mean wall time per step after the first of this run.
    pub step_time: Duration,
    /// The first step's time (it compiles).
    pub first_step_time: Duration,
    /// Tokens per second after the first step.
    pub tokens_per_s: f64,
    /// Programs compiled by this run.
    pub compiles: u64,
    /// Kernels built, and verified, after the first step of this run
    /// (zero: later steps reuse the first step's kernels).
    pub later_kernel_builds: (u64, u64),
    /// Compile-cache hits of this run.
    pub cache_hits: u64,
    /// Whether SIGTERM stopped it.
    pub stopped_by_signal: bool,
    /// Checkpoints skipped at resume, with why.
    pub skipped: Vec<String>,
}

static TERMINATE: AtomicBool = AtomicBool::new(false);

/// The signal that asked to stop (SIGTERM or SIGINT; 0 for none).
static SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn on_sigterm(sig: libc::c_int) {
    // Only atomic stores: async-signal-safe.
    SIGNAL.store(sig, Ordering::SeqCst);
    TERMINATE.store(true, Ordering::SeqCst);
}

/// SIGTERM and SIGINT (Ctrl-C) both finish the step, save and exit 0.
fn install_sigterm() {
    let handler: extern "C" fn(libc::c_int) = on_sigterm;
    // SAFETY: the handler only stores to atomics, which is
    // async-signal-safe; `signal` replaces the disposition process-wide.
    unsafe {
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
    }
}

/// The name of the signal that stopped the run.
fn stop_signal_name() -> &'static str {
    if SIGNAL.load(Ordering::SeqCst) == libc::SIGINT {
        "SIGINT"
    } else {
        "SIGTERM"
    }
}

fn err(what: &'static str) -> impl Fn(graph::RuntimeError) -> TrainError {
    move |source| TrainError::Runtime { what, source }
}

/// The host copy of tensors named `names`.
/// The settings that decide a run's numbers, as recorded in each of its
/// checkpoints (the step count and checkpoint cadence do not).
fn run_fields(o: &TrainOptions) -> Vec<(String, String)> {
    vec![
        ("seed".into(), o.seed.to_string()),
        ("lr".into(), o.lr.to_string()),
        ("weight_decay".into(), o.weight_decay.to_string()),
        ("model".into(), format!("{:?}", o.model)),
    ]
}

fn host(names: &[String], ts: &[&Tensor]) -> Result<Vec<(String, Array)>, TrainError> {
    names
        .iter()
        .zip(ts)
        .map(|(n, t)| {
            Ok((
                n.clone(),
                t.to_host().map_err(err("copying a tensor to the host"))?,
            ))
        })
        .collect()
}

/// Trains as `opts` says; see the module docs.
pub fn train(opts: &TrainOptions) -> Result<TrainSummary, TrainError> {
    let c = &opts.model;
    if !c.d_model.is_multiple_of(c.heads)
        || !c.seq.is_multiple_of(2)
        || c.vocab < 3
        || opts.checkpoint_every == 0
        || c.moe
            .as_ref()
            .is_some_and(|m| m.top_k == 0 || m.top_k > m.experts || m.expert_ffn == 0)
    {
        return Err(TrainError::Model);
    }
    // One run per directory, checked writable before step 1: the lock
    // file is created there (a read-only or missing-parent directory fails
    // here, not after the last step) and held for the whole run.
    let _lock = match &opts.checkpoint_dir {
        Some(dir) => Some(checkpoint::lock_dir(dir)?),
        None => None,
    };
    if opts.handle_sigterm {
        TERMINATE.store(false, Ordering::SeqCst);
        SIGNAL.store(0, Ordering::SeqCst);
        install_sigterm();
    }
    let rt = Runtime::new(RuntimeOptions::default()).map_err(err("starting the runtime"))?;
    let shapes = model::param_shapes(c);
    let names: Vec<String> = shapes.iter().map(|(n, _)| n.clone()).collect();
    let state_names: Vec<String> = names
        .iter()
        .map(|n| format!("adamw.m.{n}"))
        .chain(names.iter().map(|n| format!("adamw.v.{n}")))
        .collect();
    // Start, or resume from the newest valid checkpoint.
    let mut init = model::init_params(c, opts.seed);
    let mut data = CopyTask::new(opts.seed);
    let mut step = 0;
    let mut skipped = Vec::new();
    let mut saved_state: Option<(Vec<Array>, u64)> = None;
    let run = run_fields(opts);
    if let (false, Some(dir)) = (opts.resume, &opts.checkpoint_dir) {
        let n = checkpoint::remove_all(dir)?;
        if n > 0 {
            eprintln!(
                "--no-resume: removed {n} checkpoints of an earlier run from {}",
                dir.display()
            );
        }
    }
    if let (true, Some(dir)) = (opts.resume, &opts.checkpoint_dir) {
        // A checkpoint that does not fit this model (a tensor missing, of
        // another shape, not finite) is skipped for the previous one.
        let fits = |ck: &checkpoint::Checkpoint| -> Result<(), String> {
            let wanted = shapes.iter().map(|(n, s)| (n.as_str(), s)).chain(
                state_names
                    .iter()
                    .zip(shapes.iter().cycle())
                    .map(|(n, (_, s))| (n.as_str(), s)),
            );
            for (n, shape) in wanted {
                let t = ck
                    .tensors
                    .iter()
                    .find(|(k, _)| k == n)
                    .map(|(_, a)| a)
                    .ok_or_else(|| format!("it has no tensor `{n}` (a different model?)"))?;
                if t.shape() != shape.as_slice() {
                    return Err(format!(
                        "its tensor `{n}` is {:?}, the model's {shape:?}",
                        t.shape()
                    ));
                }
                if t.data().iter().any(|x| !x.is_finite()) {
                    return Err(format!("its tensor `{n}` has NaN or infinite values"));
                }
            }
            Ok(())
        };
        let (ck, skip) = checkpoint::latest_accepted(dir, fits)?;
        for s in &skip {
            eprintln!("{s}");
        }
        skipped = skip;
        if let Some(ck) = ck {
            if let Some((k, old)) = ck.run.iter().find(|f| !run.contains(f)) {
                let new = run
                    .iter()
                    .find(|(n, _)| n == k)
                    .map_or("(none)", |(_, v)| v.as_str());
                return Err(TrainError::OtherRun {
                    dir: dir.clone(),
                    field: k.clone(),
                    theirs: old.clone(),
                    ours: new.to_string(),
                });
            }
            // Every name is there (`fits` took the checkpoint).
            let find = |n: &str| -> Result<Array, TrainError> {
                ck.tensors
                    .iter()
                    .find(|(k, _)| k == n)
                    .map(|(_, a)| a.clone())
                    .ok_or_else(|| TrainError::MissingTensor {
                        step: ck.step,
                        name: n.to_string(),
                    })
            };
            for (n, a) in init.iter_mut() {
                *a = find(n)?;
            }
            let state: Vec<Array> = state_names
                .iter()
                .map(|n| find(n))
                .collect::<Result<_, _>>()?;
            saved_state = Some((state, ck.optimizer_steps));
            data = CopyTask::resume(ck.rng_state, ck.data_position);
            step = ck.step;
            eprintln!(
                "resuming from checkpoint step {} (loss {:.4})",
                ck.step, ck.loss
            );
        }
    }
    let resumed_from = step;
    let mut params: Vec<Tensor> = init
        .iter()
        .map(|(_, a)| rt.tensor(a).and_then(|t| t.requires_grad()))
        .collect::<Result<_, _>>()
        .map_err(err("uploading the parameters"))?;
    let mut opt =
        AdamW::new(&rt, &params, opts.lr, opts.weight_decay).map_err(err("the optimizer"))?;
    if let Some((state, t)) = saved_state {
        let up: Vec<Tensor> = state
            .iter()
            .map(|a| rt.tensor(a))
            .collect::<Result<_, _>>()
            .map_err(err("uploading the optimizer state"))?;
        let (m, v) = up.split_at(names.len());
        opt.set_state(m.to_vec(), v.to_vec(), t)
            .map_err(err("the optimizer state"))?;
    }
    let writer = opts.checkpoint_dir.clone().map(Writer::new);
    let mut log = match &opts.loss_log {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|source| TrainError::LossLog {
                    path: p.clone(),
                    source,
                })?,
        ),
        None => None,
    };
    let before = rt.stats();
    let tokens = (c.batch * c.seq) as f64;
    let (mut first_step_time, mut later) = (Duration::ZERO, Duration::ZERO);
    let mut final_loss = f64::NAN;
    let mut recent = std::collections::VecDeque::with_capacity(RECENT_STEPS);
    let mut stopped = false;
    let tty = unsafe { libc::isatty(2) } == 1;
    let started_at = step;
    let mut after_first = (0, 0);
    let counts = || {
        (
            kernel_ir::memo::builds_on_this_thread(),
            kernel_ir::memo::verifications_on_this_thread(),
        )
    };
    while step < opts.steps {
        let t0 = Instant::now();
        step += 1;
        let batch = data.next_batch(&rt, c).map_err(err("uploading a batch"))?;
        let loss = model::loss(c, &params, &batch).map_err(err("recording the model"))?;
        let refs: Vec<&Tensor> = params.iter().collect();
        let grads = grad(&loss, &refs).map_err(err("recording the gradients"))?;
        params = opt
            .step(&params, &grads)
            .map_err(err("recording the update"))?;
        let mut sync: Vec<&Tensor> = vec![&loss];
        sync.extend(params.iter());
        sync.extend(opt.state());
        rt.sync(&sync).map_err(err("running the step"))?;
        let l = loss.item().map_err(err("reading the loss"))?;
        if !l.is_finite() {
            // Never saved, never pruning the good checkpoints: stop here
            // (dropping the writer finishes the saves already queued).
            return Err(TrainError::Diverged {
                step,
                what: format!("the loss is {l}"),
                lr: opts.lr,
            });
        }
        final_loss = l;
        if recent.len() == RECENT_STEPS {
            recent.pop_front();
        }
        recent.push_back(l);
        let dt = t0.elapsed();
        if step == started_at + 1 {
            first_step_time = dt;
            after_first = counts();
        } else {
            later += dt;
        }
        if let Some(f) = log.as_mut() {
            writeln!(f, "{step} {l:.6} {:08x}", (l as f32).to_bits())
                .and_then(|()| f.flush())
                .map_err(|source| TrainError::LossLog {
                    path: opts.loss_log.clone().unwrap_or_default(),
                    source,
                })?;
        }
        let terminate = opts.handle_sigterm && TERMINATE.load(Ordering::SeqCst);
        if let Some(w) = &writer
            && (step % opts.checkpoint_every == 0 || terminate || step == opts.steps)
        {
            let mut tensors = host(&names, &params.iter().collect::<Vec<_>>())?;
            tensors.extend(host(&state_names, &opt.state())?);
            if let Some((name, _)) = tensors
                .iter()
                .find(|(_, a)| a.data().iter().any(|x| !x.is_finite()))
            {
                return Err(TrainError::Diverged {
                    step,
                    what: format!("`{name}` holds NaN or infinity after the update"),
                    lr: opts.lr,
                });
            }
            w.save(Checkpoint {
                step,
                optimizer_steps: opt.t,
                rng_state: data.rng_state(),
                data_position: data.position,
                loss: l,
                tensors,
                run: run.clone(),
            })?;
        }
        if opts.progress && (tty || step % 25 == 0 || step == opts.steps || terminate) {
            let done = (step * 30 / opts.steps.max(1)) as usize;
            let runs = step - started_at;
            let rate = if runs > 1 {
                tokens * (runs - 1) as f64 / later.as_secs_f64().max(1e-9)
            } else {
                0.0
            };
            let bar = format!("[{}{}]", "#".repeat(done), ".".repeat(30 - done.min(30)));
            let line = format!(
                "{bar} step {step}/{} loss {l:.4} {:.0} tokens/s",
                opts.steps, rate
            );
            if tty {
                eprint!("\r{line}");
            } else {
                eprintln!("{line}");
            }
        }
        if terminate {
            stopped = true;
            break;
        }
    }
    if opts.progress && tty {
        eprintln!();
    }
    if let Some(w) = writer {
        w.finish()?;
    }
    if stopped {
        let saved = if opts.checkpoint_dir.is_some() {
            "with a checkpoint"
        } else {
            "with nothing saved (no --checkpoint-dir)"
        };
        eprintln!("{}: stopped after step {step} {saved}", stop_signal_name());
    }
    let after = rt.stats();
    let runs = step - started_at;
    let step_time = if runs > 1 {
        later / (runs - 1) as u32
    } else {
        first_step_time
    };
    Ok(TrainSummary {
        resumed_from,
        last_step: step,
        final_loss,
        recent_loss: if recent.is_empty() {
            f64::NAN
        } else {
            recent.iter().sum::<f64>() / recent.len() as f64
        },
        step_time,
        first_step_time,
        tokens_per_s: tokens / step_time.as_secs_f64().max(1e-9),
        compiles: after.compiles - before.compiles,
        later_kernel_builds: if step > started_at {
            let now = counts();
            (now.0 - after_first.0, now.1 - after_first.1)
        } else {
            (0, 0)
        },
        cache_hits: (after.hits_memory + after.hits_disk + after.hits_remote)
            - (before.hits_memory + before.hits_disk + before.hits_remote),
        stopped_by_signal: stopped,
        skipped,
    })
}

const HELP: &str = "\
tessera train: a small causal transformer LM trained on a copying task

USAGE:
    tessera train [--model dense|moe] [--steps N] [--seed S] [--lr X]
                  [--checkpoint-dir DIR] [--checkpoint-every N] [--no-resume]
                  [--loss-log FILE] [--quiet] [--step-module FILE]

Trains a 2-layer transformer (Tessera's rms_norm, flash_attention and
swiglu kernels with their backward kernels; AdamW as deferred ops) on
sequences `x₁..xₙ SEP x₁..xₙ`, scored on the copy, on the CPU plugin. Each
step (forward, backward, update) is one program: compiled at the first step,
a cache hit after. With --checkpoint-dir, saves every N steps (default 50)
and at the end, resumes from the newest valid checkpoint there (skipping a
corrupt or partial one, with a message), and on SIGTERM finishes the current
step, saves and exits 0. --loss-log appends `step loss f32-bits` lines.

--model moe replaces each layer's FFN with 4 SwiGLU experts, each token
routed to 2 (router_top_k, moe_positions, moe_permute, grouped_matmul,
moe_unpermute; backward through tgmm and the unpermute's and router's
backward kernels), gives attention a learned sink per head, and takes the
loss from the fused linear cross-entropy.

--step-module FILE writes one step's forward and backward (loss and
gradients) as a StableHLO module for a TPU instead of training; `tessera
compile --module FILE --tpu v6e` then prints libtpu's peak HBM for it.

Prints the loss reached, the time per step, tokens/s and the compile count;
exits 1 if a full run from scratch ends with its last 10 steps' mean loss
above the threshold (0.05).
";

impl TrainOptions {
    /// Options from `tessera train` arguments (`Ok(None)` for `--help`).
    pub fn from_args(args: &[String]) -> Result<Option<TrainOptions>, TrainError> {
        let mut o = TrainOptions::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |what: &str| -> Result<String, TrainError> {
                it.next()
                    .cloned()
                    .ok_or(TrainError::Usage(format!("{a} needs {what}")))
            };
            let num = |v: String| -> Result<u64, TrainError> {
                v.parse().map_err(|_| {
                    TrainError::Usage(format!("{a} needs a non-negative integer, got `{v}`"))
                })
            };
            match a.as_str() {
                "--help" | "-h" => return Ok(None),
                "--steps" => o.steps = num(value("a step count")?)?,
                "--seed" => o.seed = num(value("a seed")?)?,
                "--checkpoint-every" => o.checkpoint_every = num(value("a step count")?)?.max(1),
                "--lr" => {
                    let v = value("a learning rate")?;
                    o.lr = v
                        .parse()
                        .ok()
                        .filter(|x: &f64| x.is_finite() && *x > 0.0)
                        .ok_or(TrainError::Usage(format!(
                            "--lr needs a positive number, got `{v}`"
                        )))?;
                }
                "--checkpoint-dir" => o.checkpoint_dir = Some(PathBuf::from(value("a directory")?)),
                "--loss-log" => o.loss_log = Some(PathBuf::from(value("a file")?)),
                "--step-module" => o.step_module = Some(PathBuf::from(value("a file")?)),
                "--model" => {
                    o.model.moe = match value("dense or moe")?.as_str() {
                        "dense" => None,
                        "moe" => Some(model::MoeConfig::default()),
                        other => {
                            return Err(TrainError::Usage(format!(
                                "--model is dense or moe, got `{other}`"
                            )));
                        }
                    }
                }
                "--no-resume" => o.resume = false,
                "--quiet" => o.progress = false,
                other => {
                    return Err(TrainError::Usage(format!("unknown option `{other}`")));
                }
            }
        }
        Ok(Some(o))
    }
}

/// `tessera train`: exit status 0 (done, or stopped by SIGTERM with a
/// checkpoint), 1 (failed, or a full run ended above the threshold), 2
/// (bad arguments).
pub fn cli(args: &[String]) -> i32 {
    let opts = match TrainOptions::from_args(args) {
        Ok(Some(o)) => o,
        Ok(None) => {
            print!("{HELP}");
            return 0;
        }
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    if let Some(path) = &opts.step_module {
        return match program::write_step_module(&opts, path) {
            Ok(()) => {
                println!(
                    "wrote {}: one training step (loss and gradients) for a TPU; `tessera compile --module {} --tpu v6e` reports its peak HBM",
                    path.display(),
                    path.display()
                );
                0
            }
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        };
    }
    match train(&opts) {
        Ok(s) => {
            println!(
                "steps {}..{}: final loss {:.4}, mean of the last {RECENT_STEPS} {:.4} (threshold {LOSS_THRESHOLD}); first step {:.2} s (compile or cache load), then {:.1} ms/step, {:.0} tokens/s; {} compiles, {} cache hits{}",
                s.resumed_from + 1,
                s.last_step,
                s.final_loss,
                s.recent_loss,
                s.first_step_time.as_secs_f64(),
                s.step_time.as_secs_f64() * 1e3,
                s.tokens_per_s,
                s.compiles,
                s.cache_hits,
                if s.stopped_by_signal {
                    if stop_signal_name() == "SIGINT" {
                        "; stopped by SIGINT"
                    } else {
                        "; stopped by SIGTERM"
                    }
                } else {
                    ""
                }
            );
            let full = s.resumed_from == 0
                && !s.stopped_by_signal
                && opts.steps >= TrainOptions::default().steps;
            let reached = s.recent_loss < LOSS_THRESHOLD; // NaN does not
            if full && !reached {
                eprintln!(
                    "error: the loss (mean of the last {RECENT_STEPS} steps) {:.4} did not reach {LOSS_THRESHOLD} in {} steps",
                    s.recent_loss, s.last_step
                );
                return 1;
            }
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}
