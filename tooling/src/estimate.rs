//! TPU time without a TPU: libtpu's static schedule estimate of a kernel
//! ([`libtpu::estimate`]), checked against what the kernel must do
//! before anything ranks by it.
//!
//! The estimate replays the compiled bundle program; it is validated
//! against measured v5e matmuls (estimate / measured 0.84–0.96 at large
//! blocks) and ranks block sizes correctly, but it has blind spots, all
//! silent. Each is guarded here, and an estimate that trips a guard is
//! *untrusted*: printed with its reason, never ranked as if exact.
//!
//! * **Dropped work.** The profiler does not follow control flow steered
//!   by data it cannot see (scalar-prefetch tables) and can run
//!   `program_id`-dependent loops zero times. Guard: the `vmatmul`
//!   instructions of its executed bundle trace against the MXU passes the
//!   kernel's executed dots need ([`Cost::mxu_passes`], from a run of the
//!   reference interpreter at the same shapes). Fewer than
//!   [`DROPPED_WORK`] of them: untrusted.
//! * **Below the roofline.** No program beats peak flops or peak HBM
//!   bandwidth; an estimate under the roofline bound of `tessera cost`
//!   missed something.
//! * **Memory-bound kernels.** Concurrent DMAs do not share HBM bandwidth
//!   in the model (an add with 4 inputs implied 4.7 TB/s on v6e, against
//!   1.64 physical), so memory-bound kernels are underestimated 1.6–2.8×.
//!   A kernel memory-bound by `tessera cost` whose estimate is within
//!   [`MEMORY_MARGIN`] of bytes ÷ bandwidth is untrusted, reported as
//!   max(estimate, bytes ÷ physical bandwidth).
//! * **Unknown clock** (v5p, v7x): cycles only; the roofline cannot be
//!   checked, so the estimate is not trusted as a time.

use kernel_ir::{Target, VerifiedKernel};
use libtpu::child::{ChildCompiler, ChildError};
use libtpu::estimate::{Clock, ModuleEstimate, clock};
use libtpu::{KernelCompileError, lower_for};

use crate::cost::{Cost, Roofline};

/// The fraction of the needed MXU passes the executed trace must show for
/// the estimate to count as having run all the work.
pub const DROPPED_WORK: f64 = 0.9;

/// How far above the bandwidth bound an estimate of a memory-bound kernel
/// must lie to be trusted: the profiler underestimated memory-bound
/// programs by up to 2.8× (adds of 1, 2 and 4 inputs on v6e). Above that,
/// the modelled work, not HBM, sets the time even if every DMA took its
/// full share of bandwidth.
pub const MEMORY_MARGIN: f64 = 2.8;

/// A kernel's estimate on one generation, with its guards applied.
#[derive(Clone, Debug)]
pub struct KernelEstimate {
    /// The generation.
    pub target: Target,
    /// libtpu's estimate of the whole program (kernel and the layout
    /// copies around it).
    pub module: ModuleEstimate,
    /// The clock, if known.
    pub clock: Option<Clock>,
    /// The roofline bound of the kernel's traffic and flops.
    pub roofline: Roofline,
    /// MXU passes the executed dots need.
    pub needed_passes: u64,
    /// The verdict.
    pub verdict: Verdict,
}

/// Whether an estimate may be ranked by, and why not.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// Every guard that tripped; none for a trusted estimate.
    pub guards: Vec<Guard>,
    /// The time to report: the estimate, or the bandwidth bound where that
    /// is larger for a memory-bound kernel; None without a clock.
    pub seconds: Option<f64>,
}

impl Verdict {
    /// True when no guard tripped.
    pub fn trusted(&self) -> bool {
        self.guards.is_empty()
    }

    /// Whether the estimate may have left out work (it dropped some, or
    /// its trace was not dumped so nobody checked): such an estimate
    /// compares with nothing, not even at equal traffic.
    pub fn work_in_doubt(&self) -> bool {
        self.guards
            .iter()
            .any(|g| matches!(g, Guard::DroppedWork { .. } | Guard::NoTrace))
    }

    /// The guards in words, `; `-separated.
    pub fn reasons(&self) -> String {
        let v: Vec<String> = self.guards.iter().map(Guard::to_string).collect();
        v.join("; ")
    }
}

/// One guard that tripped (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub enum Guard {
    /// The trace ran fewer MXU passes than the executed dots need.
    DroppedWork {
        /// `vmatmul`s in the executed trace.
        ran: u64,
        /// Passes the executed dots need.
        needed: u64,
    },
    /// The trace was not dumped (`--no-trace`).
    NoTrace,
    /// The generation's clock is not published.
    NoClock(Target),
    /// The estimate is below the roofline bound.
    BelowRoofline {
        /// The estimate, seconds.
        estimate_s: f64,
        /// The roofline bound, seconds.
        bound_s: f64,
    },
    /// Memory-bound and within [`MEMORY_MARGIN`] of the bandwidth bound.
    MemoryBound {
        /// The estimate, seconds.
        estimate_s: f64,
        /// Bytes moved over the HBM bandwidth, seconds.
        bandwidth_s: f64,
    },
}

impl Guard {
    /// A stable name (for `--json` readers).
    pub fn name(&self) -> &'static str {
        match self {
            Guard::DroppedWork { .. } => "dropped_work",
            Guard::NoTrace => "no_trace",
            Guard::NoClock(_) => "no_clock",
            Guard::BelowRoofline { .. } => "below_roofline",
            Guard::MemoryBound { .. } => "memory_bound",
        }
    }
}

impl std::fmt::Display for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Guard::DroppedWork { ran, needed } => write!(
                f,
                "dropped work: the profiler's trace ran {ran} vmatmul of the {needed} the executed dots need \
                 (it does not follow control flow steered by prefetched data or program_id-dependent trip counts)"
            ),
            Guard::NoTrace => {
                f.write_str("no executed bundle trace (--no-trace): dropped work not checked")
            }
            Guard::NoClock(t) => write!(
                f,
                "no published {t} clock: cycles only, the roofline cannot be checked"
            ),
            Guard::BelowRoofline {
                estimate_s,
                bound_s,
            } => write!(
                f,
                "below the roofline bound ({:.2} µs < {:.2} µs): the profiler missed work",
                estimate_s * 1e6,
                bound_s * 1e6
            ),
            Guard::MemoryBound {
                estimate_s,
                bandwidth_s,
            } => write!(
                f,
                "memory-bound: the profiler does not share HBM bandwidth between DMAs; \
                 reporting max(estimate {:.2} µs, bytes / bandwidth {:.2} µs)",
                estimate_s * 1e6,
                bandwidth_s * 1e6
            ),
        }
    }
}

/// A whole-program estimate as JSON (cycles, seconds, `vmatmul`, per op):
/// what `tessera estimate --module` prints and the start of a kernel's row.
pub fn module_json(m: &ModuleEstimate) -> serde_json::Value {
    serde_json::json!({
        "target": m.target.name(),
        "cycles": m.cycles(),
        "seconds": m.seconds(),
        "vmatmul": m.vmatmul(),
        "ops": m.ops.iter().map(|o| serde_json::json!({
            "hlo_op": o.hlo_op, "cycles": o.cycles, "vmatmul": o.vmatmul,
        })).collect::<Vec<_>>(),
    })
}

impl KernelEstimate {
    /// Estimated cycles.
    pub fn cycles(&self) -> u64 {
        self.module.cycles()
    }

    /// The estimate divided by the roofline bound (None without a clock).
    pub fn over_roofline(&self) -> Option<f64> {
        let s = self.module.seconds()?;
        let r = self.roofline.seconds();
        (r > 0.0).then(|| s / r)
    }

    /// One JSON object (for scripts: the Pallas comparison): the module's
    /// fields, `seconds` the reported time, and the verdict.
    pub fn to_json(&self, kernel: &str) -> serde_json::Value {
        let mut v = module_json(&self.module);
        let extra = serde_json::json!({
            "kernel": kernel,
            "clock_hz": self.clock.map(|c| c.hz),
            "clock_published": self.clock.map(|c| c.published),
            "seconds": self.verdict.seconds,
            "roofline_seconds": self.roofline.seconds(),
            "roofline_bound": self.roofline.bound(),
            "over_roofline": self.over_roofline(),
            "needed_passes": self.needed_passes,
            "trusted": self.verdict.trusted(),
            "work_in_doubt": self.verdict.work_in_doubt(),
            "guards": self.verdict.guards.iter().map(Guard::name).collect::<Vec<_>>(),
            "reasons": self.verdict.guards.iter().map(Guard::to_string).collect::<Vec<_>>(),
        });
        if let (Some(o), serde_json::Value::Object(e)) = (v.as_object_mut(), extra) {
            o.extend(e);
        }
        v
    }
}

/// The guards, applied to an estimate of a kernel with cost `cost`.
pub fn judge(target: Target, module: &ModuleEstimate, cost: &Cost, unrolled: bool) -> Verdict {
    let mut guards = Vec::new();
    let needed = cost.mxu_passes(target);
    let ran = module.vmatmul();
    if !unrolled {
        guards.push(Guard::NoTrace);
    } else if needed > 0 && (ran as f64) < DROPPED_WORK * needed as f64 {
        guards.push(Guard::DroppedWork { ran, needed });
    }
    let roof = cost.roofline(target);
    let mut seconds = module.seconds();
    match seconds {
        None => guards.push(Guard::NoClock(target)),
        Some(s) => {
            if s < roof.seconds() {
                guards.push(Guard::BelowRoofline {
                    estimate_s: s,
                    bound_s: roof.seconds(),
                });
            }
            let bw = roof.memory_s;
            if roof.bound() == "memory" && s < MEMORY_MARGIN * bw {
                guards.push(Guard::MemoryBound {
                    estimate_s: s,
                    bandwidth_s: bw,
                });
                seconds = Some(s.max(bw));
            }
        }
    }
    Verdict { guards, seconds }
}

/// Why a kernel has no estimate on a generation.
#[derive(Debug, thiserror::Error)]
pub enum KernelChildError {
    /// The kernel does not verify for that generation, or cannot be lowered.
    #[error(transparent)]
    Lower(#[from] KernelCompileError),
    /// libtpu failed, rejected it, or its profiler aborted.
    #[error(transparent)]
    Estimate(#[from] ChildError),
}

/// Estimates `kernel` on `target`: verified again for the generation,
/// lowered to its `tpu_custom_call` module, compiled with the profile in a
/// child process, and judged against `cost`.
pub fn estimate_kernel(
    child: &ChildCompiler,
    kernel: &VerifiedKernel,
    cost: &Cost,
    target: Target,
) -> Result<KernelEstimate, KernelChildError> {
    let (_, lowered) = lower_for(kernel, target)?;
    let module = child.estimate(target, &lowered.module)?;
    let verdict = judge(target, &module, cost, child.unrolled);
    Ok(KernelEstimate {
        target,
        clock: clock(target),
        roofline: cost.roofline(target),
        needed_passes: cost.mxu_passes(target),
        module,
        verdict,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_ir::{DType, DotShape};
    use libtpu::estimate::OpEstimate;

    fn cost_with(flops: u64, bytes: u64, dots: Vec<(DotShape, u64)>) -> Cost {
        Cost {
            kernel: "k".into(),
            operands: vec![crate::cost::OperandTraffic {
                name: "x".into(),
                direction: "in",
                blocks: 1,
                bytes,
            }],
            flops,
            steps: 1,
            dtype: DType::BF16,
            dots,
        }
    }

    fn module(target: Target, cycles: u64, vmatmul: u64) -> ModuleEstimate {
        ModuleEstimate {
            target,
            ops: vec![OpEstimate {
                hlo_op: "k.1".into(),
                cycles,
                vmatmul: Some(vmatmul),
            }],
            wall: std::time::Duration::ZERO,
        }
    }

    /// 64 dots of 512³ bf16: 1.72e10 flops (87.2 µs at 197 TF/s, 130.8k
    /// cycles at 1.5 GHz); 64 · 32·4·4 = 32768 passes on v5e.
    fn big_matmul() -> Cost {
        let shape = DotShape {
            batch: 1,
            m: 512,
            k: 512,
            n: 512,
            lhs: DType::BF16,
        };
        cost_with(64 * 2 * 512 * 512 * 512, 1 << 20, vec![(shape, 64)])
    }

    #[test]
    fn an_estimate_above_the_roofline_with_all_passes_is_trusted() {
        let c = big_matmul();
        assert_eq!(c.mxu_passes(Target::V5e), 32768);
        let v = judge(Target::V5e, &module(Target::V5e, 150_000, 32768), &c, true);
        assert!(v.trusted(), "{}", v.reasons());
        assert_eq!(v.seconds, Some(150_000.0 / 1.5e9));
    }

    #[test]
    fn each_guard_trips_on_its_own() {
        let c = big_matmul();
        let short = judge(Target::V5e, &module(Target::V5e, 150_000, 16384), &c, true);
        assert_eq!(
            short.guards,
            vec![Guard::DroppedWork {
                ran: 16384,
                needed: 32768
            }]
        );
        assert!(short.work_in_doubt() && short.reasons().contains("dropped work"));
        let fast = judge(Target::V5e, &module(Target::V5e, 100_000, 32768), &c, true);
        assert!(
            matches!(fast.guards[..], [Guard::BelowRoofline { .. }]),
            "{}",
            fast.reasons()
        );
        assert!(!fast.work_in_doubt() && fast.reasons().contains("below the roofline"));
        let no_clock = judge(
            Target::V7x,
            &module(Target::V7x, 150_000, 1 << 20),
            &c,
            true,
        );
        assert_eq!(no_clock.guards, vec![Guard::NoClock(Target::V7x)]);
        assert!(no_clock.seconds.is_none());
        let untraced = judge(Target::V5e, &module(Target::V5e, 150_000, 0), &c, false);
        assert_eq!(untraced.guards, vec![Guard::NoTrace]);
        assert!(untraced.work_in_doubt() && untraced.reasons().contains("not checked"));
    }

    #[test]
    fn a_memory_bound_kernel_far_above_its_bandwidth_bound_is_trusted() {
        // 1 MB and no dots: 1.28 µs at 819 GB/s; the estimate says 10 µs,
        // more than MEMORY_MARGIN over: the modelled work sets the time.
        let c = cost_with(0, 1 << 20, vec![]);
        let v = judge(Target::V5e, &module(Target::V5e, 15_000, 0), &c, true);
        assert!(v.trusted(), "{}", v.reasons());
    }

    #[test]
    fn a_memory_bound_kernel_reports_the_bandwidth_bound() {
        // 1 GB and no dots: 1.22 ms at 819 GB/s; the estimate says 10 µs.
        let c = cost_with(0, 1 << 30, vec![]);
        let v = judge(Target::V5e, &module(Target::V5e, 15_000, 0), &c, true);
        assert!(
            v.guards
                .iter()
                .any(|g| matches!(g, Guard::MemoryBound { .. })),
            "{}",
            v.reasons()
        );
        assert!(!v.work_in_doubt() && v.reasons().contains("memory-bound"));
        let bw = (1u64 << 30) as f64 / 819e9;
        assert!((v.seconds.unwrap() - bw).abs() < 1e-12);
    }
}
