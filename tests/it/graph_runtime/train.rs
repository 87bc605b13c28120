//! Training through the graph runtime: the copy task is learned below the
//! stated threshold with one compile; a run killed with SIGTERM saves,
//! exits 0 and resumes bit-identically; a truncated checkpoint is skipped
//! for the previous one.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tooling::train::model::{LmConfig, MoeConfig};
use tooling::train::{LOSS_THRESHOLD, TrainOptions, train};

#[test]
fn the_copy_task_is_learned_below_the_threshold_with_one_compile() {
    let opts = TrainOptions {
        handle_sigterm: false,
        progress: false,
        ..TrainOptions::default()
    };
    let s = train(&opts).unwrap();
    assert!(
        s.recent_loss < LOSS_THRESHOLD,
        "loss {} after {} steps",
        s.recent_loss,
        s.last_step
    );
    // One look-up per step: the first compiles (or finds the disk cache),
    // every later one is a hit.
    assert!(s.compiles <= 1, "{s:?}");
    assert_eq!(s.compiles + s.cache_hits, opts.steps, "{s:?}");
    // Steps 2..n record the same kernel calls as step 1 and build or
    // verify none of them again.
    assert_eq!(s.later_kernel_builds, (0, 0), "{s:?}");
}

/// The MoE model (routed experts, sinks, the fused loss) learns the same
/// task below the same threshold with one compile; stopped by SIGTERM and
/// resumed, its loss curve is the uninterrupted run's bit for bit.
#[test]
fn the_moe_model_learns_the_task_and_resumes_bit_identically() {
    let d = dir("moe");
    let log = d.join("full.log");
    let opts = TrainOptions {
        model: LmConfig {
            moe: Some(MoeConfig::default()),
            ..LmConfig::default()
        },
        seed: 5,
        handle_sigterm: false,
        progress: false,
        loss_log: Some(log.clone()),
        ..TrainOptions::default()
    };
    let s = train(&opts).unwrap();
    assert!(
        s.recent_loss < LOSS_THRESHOLD,
        "loss {} after {} steps",
        s.recent_loss,
        s.last_step
    );
    assert!(s.compiles <= 1, "{s:?}");
    assert_eq!(s.compiles + s.cache_hits, opts.steps, "{s:?}");
    assert_eq!(s.later_kernel_builds, (0, 0), "{s:?}");
    let want = lines(&log);
    let steps = 30;
    let (ckpt, part) = (d.join("ckpt"), d.join("part.log"));
    let run = || {
        let n = steps.to_string();
        worker_with(&ckpt, &part, &["--model", "moe", "--steps", &n])
    };
    let mut child = run();
    signal_after(&mut child, &part, 8, libc::SIGTERM);
    let (code, text) = finish(child);
    assert_eq!(code, 0, "{text}");
    let stopped_at = lines(&part).len();
    assert!(
        stopped_at < steps,
        "the signal came too late to test anything"
    );
    let (code, text) = finish(run());
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains(&format!("resuming from checkpoint step {stopped_at}")),
        "{text}"
    );
    assert_eq!(lines(&part), want[..steps].to_vec());
    std::fs::remove_dir_all(&d).unwrap();
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-train-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn worker(ckpt: &Path, log: &Path, steps: u64) -> Child {
    worker_with(
        ckpt,
        log,
        &["--steps", &steps.to_string(), "--checkpoint-every", "10"],
    )
}

/// Sends `sig` to `child` once its loss log has `n` lines (it must not end
/// before).
fn signal_after(child: &mut Child, log: &Path, n: usize, sig: libc::c_int) {
    let t0 = Instant::now();
    while lines(log).len() < n {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the worker made no progress"
        );
        if let Ok(Some(_)) = child.try_wait() {
            panic!("the worker ended before it was signalled");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // SAFETY: signalling our own child by its pid.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

fn finish(c: Child) -> (i32, String) {
    let out = c.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn sigterm_saves_exits_zero_and_the_resumed_loss_curve_is_bit_identical() {
    let d = dir("preempt");
    let steps = 60;
    // The uninterrupted run.
    let (code, text) = finish(worker(&d.join("a"), &d.join("a.log"), steps));
    assert_eq!(code, 0, "{text}");
    let want = lines(&d.join("a.log"));
    assert_eq!(want.len(), steps as usize);
    // The same run, SIGTERM after some steps.
    let (ckpt, log) = (d.join("b"), d.join("b.log"));
    let mut child = worker(&ckpt, &log, steps);
    signal_after(&mut child, &log, 12, libc::SIGTERM);
    let signalled = Instant::now();
    let (code, text) = finish(child);
    assert!(
        signalled.elapsed() < Duration::from_secs(25),
        "exit took {:?}",
        signalled.elapsed()
    );
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("stopped by SIGTERM"), "{text}");
    let stopped_at = lines(&log).len();
    assert!(
        stopped_at < steps as usize,
        "the signal came too late to test anything"
    );
    assert!(ckpt.join(format!("step-{stopped_at:010}.json")).exists());
    // Resume: from the checkpoint of the step it stopped at, to the end.
    let (code, text) = finish(worker(&ckpt, &log, steps));
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains(&format!("resuming from checkpoint step {stopped_at}")),
        "{text}"
    );
    assert_eq!(
        lines(&log),
        want,
        "the loss curve (step, loss, f32 bits) differs after the resume"
    );
    // A truncated newest checkpoint: skipped with a message, the previous
    // one used, and the curve from there is the same again.
    let newest = ckpt.join(format!("step-{steps:010}.safetensors"));
    let bytes = std::fs::read(&newest).unwrap();
    std::fs::write(&newest, &bytes[..bytes.len() - 100]).unwrap();
    let log2 = d.join("c.log");
    let (code, text) = finish(worker(&ckpt, &log2, steps));
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("skipping checkpoint") && text.contains("truncated"),
        "{text}"
    );
    let resumed: u64 = text
        .split("resuming from checkpoint step ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(resumed < steps);
    assert_eq!(lines(&log2), want[resumed as usize..].to_vec());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn sigint_stops_like_sigterm_and_says_when_nothing_was_saved() {
    let d = dir("sigint");
    let log = d.join("log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_train-worker"))
        .args([
            "--steps",
            "400",
            "--seed",
            "5",
            "--quiet",
            "--no-resume",
            "--loss-log",
        ])
        .arg(&log)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    signal_after(&mut child, &log, 5, libc::SIGINT);
    let (code, text) = finish(child);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("stopped by SIGINT"), "{text}");
    assert!(
        text.contains("nothing saved (no --checkpoint-dir)"),
        "{text}"
    );
    assert!(
        lines(&log).len() < 400,
        "the signal came too late to test anything"
    );
}

/// A train-worker on `ckpt` with `extra` arguments.
fn worker_with(ckpt: &Path, log: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_train-worker"))
        .args(["--seed", "5", "--quiet", "--checkpoint-every", "5"])
        .args(extra)
        .arg("--checkpoint-dir")
        .arg(ckpt)
        .arg("--loss-log")
        .arg(log)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The losses recorded in the manifests of `dir`.
fn manifest_losses(dir: &Path) -> Vec<(u64, f64)> {
    let mut v: Vec<(u64, f64)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .map(|e| {
            let m: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(e.path()).unwrap()).unwrap();
            (
                m["step"].as_u64().unwrap(),
                m["loss"].as_f64().unwrap_or(f64::NAN),
            )
        })
        .collect();
    v.sort_by_key(|x| x.0);
    v
}

#[test]
fn a_diverging_run_stops_nonzero_and_keeps_its_good_checkpoints() {
    let d = dir("diverge");
    let (ckpt, log) = (d.join("ck"), d.join("log"));
    // lr 1000 diverges (NaN) at step 7 of this seeded run; step 5 was saved.
    let (code, text) = finish(worker_with(
        &ckpt,
        &log,
        &["--steps", "60", "--lr", "1000", "--no-resume"],
    ));
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("diverged"), "{text}");
    let kept = manifest_losses(&ckpt);
    assert!(
        !kept.is_empty(),
        "no checkpoint before the divergence: {text}"
    );
    assert!(kept.iter().all(|(_, l)| l.is_finite()), "{kept:?}");
    assert!(lines(&log).len() < 60, "it ran to the end");
}

#[test]
fn a_checkpoint_directory_belongs_to_one_run() {
    let d = dir("run-id");
    let (ckpt, log) = (d.join("ck"), d.join("log"));
    let (code, text) = finish(worker_with(&ckpt, &log, &["--steps", "10", "--no-resume"]));
    assert_eq!(code, 0, "{text}");
    assert_eq!(manifest_losses(&ckpt).len(), 2);
    // Resumed with another learning rate: refused, naming the field.
    let (code, text) = finish(worker_with(&ckpt, &log, &["--steps", "20", "--lr", "0.01"]));
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("its lr is") && text.contains("this run's is 0.01"),
        "{text}"
    );
    // Started over: the old run's checkpoints go first, none is mixed in.
    let (code, text) = finish(worker_with(
        &ckpt,
        &log,
        &["--steps", "7", "--seed", "9", "--no-resume"],
    ));
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("removed 2 checkpoints"), "{text}");
    let steps: Vec<u64> = manifest_losses(&ckpt).iter().map(|x| x.0).collect();
    assert_eq!(steps, vec![5, 7], "{text}");
}

#[test]
fn one_run_per_checkpoint_directory_checked_before_step_one() {
    let d = dir("lock");
    let (ckpt, log) = (d.join("ck"), d.join("log"));
    std::fs::create_dir_all(&ckpt).unwrap();
    // A save killed mid-write left its temporary file.
    let stale = ckpt.join(".step-0000000005.safetensors.tmp-99999");
    std::fs::write(&stale, b"half").unwrap();
    let mut first = worker_with(&ckpt, &log, &["--steps", "400", "--no-resume"]);
    let t0 = Instant::now();
    while lines(&log).is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(120), "no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!stale.exists(), "the stale temporary file is still there");
    let t1 = Instant::now();
    let (code, text) = finish(worker_with(
        &ckpt,
        &d.join("log2"),
        &["--steps", "5", "--no-resume"],
    ));
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("in use by another tessera train"), "{text}");
    assert!(t1.elapsed() < Duration::from_secs(20));
    assert!(lines(&d.join("log2")).is_empty(), "the second run trained");
    // SAFETY: signalling our own child by its pid.
    unsafe {
        libc::kill(first.id() as libc::pid_t, libc::SIGTERM);
    }
    let _ = first.wait();
    // A directory that cannot be made is refused before step 1.
    let (code, text) = finish(worker_with(
        Path::new("/dev/null/ck"),
        &d.join("log3"),
        &["--steps", "5"],
    ));
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("--checkpoint-dir /dev/null/ck"), "{text}");
    assert!(
        lines(&d.join("log3")).is_empty(),
        "it trained before failing"
    );
}

#[test]
fn a_checkpoint_that_does_not_fit_the_model_falls_back_to_the_previous_one() {
    use tooling::train::checkpoint;
    let d = dir("wrong-shape");
    let (ckpt, log) = (d.join("ck"), d.join("log"));
    let (code, text) = finish(worker_with(&ckpt, &log, &["--steps", "10", "--no-resume"]));
    assert_eq!(code, 0, "{text}");
    // Step 10 rewritten whole (its checksums valid) with one tensor of
    // another shape, as a checkpoint of another model would be.
    let (Some(mut ck), _) = checkpoint::latest(&ckpt).unwrap() else {
        panic!("no checkpoint: {text}");
    };
    assert_eq!(ck.step, 10);
    let name = ck.tensors[0].0.clone();
    ck.tensors[0].1 =
        kernel_ir::Array::new(kernel_ir::DType::F32, [3], vec![1.0, 2.0, 3.0]).unwrap();
    checkpoint::save(&ckpt, &ck).unwrap();
    let (code, text) = finish(worker_with(&ckpt, &log, &["--steps", "12"]));
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("skipping checkpoint")
            && text.contains(&format!("its tensor `{name}` is [3]"))
            && text.contains("resuming from checkpoint step 5"),
        "{text}"
    );
}
