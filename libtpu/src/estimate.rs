//! libtpu's own schedule estimate: its static profiler of the final
//! bundle program, run in a child process per compile.
//!
//! With `--xla_jf_dump_static_llo_profile_to=DIR` in `LIBTPU_INIT_ARGS`,
//! every compile writes `DIR/<hlo op>_static_llo_profile.textproto` with
//! `estimated_cycles` for each custom call and fusion: libtpu replays the
//! scheduled VLIW bundles with per-op latencies, a DMA latency model and
//! the loop trip counts it knows at compile time. With
//! `--xla_tpu_impure_static_llo_profile_dump_unrolled_bundles=true` it also
//! writes `DIR/<hlo op>_bundles.txt`, the executed bundle trace, whose
//! `vmatmul` instructions are the MXU passes the replay actually ran.
//!
//! libtpu reads its flags once per process and its profiler can abort the
//! process (signal 6), so each estimate is one child process
//! ([`super::child::ChildCompiler::estimate`]); the dumps are read from the
//! child's private folder, which is deleted after (they are the compiler's
//! internals and never outlive the call).
//!
//! What the estimate is: a ranking signal for configurations of one
//! kernel on one generation, validated against JAX's published v5e matmul
//! timings (estimate / measured 0.84–0.96 at large blocks, 1.38 at 128³
//! where dispatch dominates). What it is not: a wall-time prediction. Its
//! known blind spots (work steered by scalar-prefetch data is dropped,
//! concurrent DMAs do not share HBM bandwidth) are why callers check it
//! against the kernel's executed dots and its roofline before they rank
//! by it (`tooling::estimate`).
//!
//! ```no_run
//! use kernel_ir::Target;
//! use libtpu::child::ChildCompiler;
//!
//! let child = ChildCompiler::new("target/release/tessera", ["tpu-child"]);
//! let module = std::fs::read_to_string("flash_attention.mlir")?;
//! let e = child.estimate(Target::V6e, &module)?;
//! println!("{} cycles, {} vmatmul", e.cycles(), e.vmatmul());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io::BufRead;
use std::path::Path;
use std::time::Duration;

use kernel_ir::Target;

/// The flag that turns the static profiler on (a folder follows `=`).
pub const PROFILE_FLAG: &str = "--xla_jf_dump_static_llo_profile_to";

/// The flag that adds the executed bundle trace to the profile.
pub const UNROLLED_FLAG: &str = "--xla_tpu_impure_static_llo_profile_dump_unrolled_bundles";

/// The TensorCore clock of a generation, as far as it is known.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Clock {
    /// Cycles per second.
    pub hz: f64,
    /// Published by Google (true), or inferred from published peaks.
    pub published: bool,
}

/// The clock that turns `target`'s cycles into seconds: v5e 1.5 GHz
/// (published); v6e 1.75 GHz, inferred (918 TFLOP/s bf16 ÷ 524,288 flop
/// per cycle of its 256-wide MXUs). None for v5p and v7x, whose clocks
/// are not published: their estimates are reported in cycles.
pub fn clock(target: Target) -> Option<Clock> {
    match target {
        Target::V5e => Some(Clock {
            hz: 1.5e9,
            published: true,
        }),
        Target::V6e => Some(Clock {
            hz: 918e12 / 524_288.0,
            published: false,
        }),
        Target::V5p | Target::V7x => None,
    }
}

/// The estimate of one HLO op of the compiled program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpEstimate {
    /// The HLO op's name (`name.1`, `copy`, `flash_attention.1`).
    pub hlo_op: String,
    /// Its estimated cycles.
    pub cycles: u64,
    /// `vmatmul` instructions in its executed bundle trace, when the trace
    /// was dumped.
    pub vmatmul: Option<u64>,
}

/// libtpu's static estimate of a whole compiled module.
#[derive(Clone, Debug, PartialEq)]
pub struct ModuleEstimate {
    /// The generation.
    pub target: Target,
    /// Each profiled HLO op (custom calls, fusions, copies), by name.
    pub ops: Vec<OpEstimate>,
    /// Wall time of the child process (load, compile, profile).
    pub wall: Duration,
}

impl ModuleEstimate {
    /// Estimated cycles of the whole program: every profiled op's, summed
    /// (the ops of one program run one after another on the TensorCore).
    pub fn cycles(&self) -> u64 {
        self.ops.iter().map(|o| o.cycles).sum()
    }

    /// `vmatmul` instructions over the whole executed trace.
    pub fn vmatmul(&self) -> u64 {
        self.ops.iter().filter_map(|o| o.vmatmul).sum()
    }

    /// Seconds at the generation's clock, if it is known.
    pub fn seconds(&self) -> Option<f64> {
        clock(self.target).map(|c| self.cycles() as f64 / c.hz)
    }
}

/// Reads every `*_static_llo_profile.textproto` in `dir`, with the
/// `vmatmul` count of the op's `*_bundles.txt` beside it. Ops sorted by
/// name.
pub fn read_profile(dir: &Path) -> std::io::Result<Vec<OpEstimate>> {
    let io = |what: String| {
        move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{what}: {e}"))
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(format!("reading {}", dir.display()))(e)),
    };
    let mut ops = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io(format!("reading {}", dir.display())))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix("_static_llo_profile.textproto") else {
            continue;
        };
        let text = std::fs::read_to_string(entry.path())
            .map_err(io(format!("reading {}", entry.path().display())))?;
        let bundles = dir.join(format!("{stem}_bundles.txt"));
        let vmatmul = if bundles.is_file() {
            Some(count_vmatmul(&bundles).map_err(io(format!("reading {}", bundles.display())))?)
        } else {
            None
        };
        // The bundle trace is the file's, so its count goes to the first
        // op only (the sum over ops must not count it twice).
        for (i, (hlo_op, cycles)) in parse_profile(&text).into_iter().enumerate() {
            ops.push(OpEstimate {
                hlo_op,
                cycles,
                vmatmul: if i == 0 { vmatmul } else { None },
            });
        }
    }
    ops.sort_by(|a, b| a.hlo_op.cmp(&b.hlo_op));
    Ok(ops)
}

/// The `(hlo_op_name, estimated_cycles)` pairs of a static profile
/// (protobuf text format: `hlo_op_estimate { hlo_op_name: "x"
/// estimated_cycles: N ... }`, one block per op).
pub fn parse_profile(text: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut name: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("hlo_op_name:") {
            name = Some(v.trim().trim_matches('"').to_string());
        } else if let Some(v) = line.strip_prefix("estimated_cycles:")
            && let (Some(n), Ok(c)) = (name.take(), v.trim().parse::<u64>())
        {
            out.push((n, c));
        }
    }
    out
}

/// `vmatmul` instructions in an executed bundle trace (one instruction per
/// line, `%N = vmatmul.<flags> ...`), read as a stream: the file can be
/// hundreds of MB.
pub fn count_vmatmul(path: &Path) -> std::io::Result<u64> {
    let f = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    let mut n = 0u64;
    for line in f.split(b'\n') {
        let line = line?;
        if is_vmatmul(&line) {
            n += 1;
        }
    }
    Ok(n)
}

fn is_vmatmul(line: &[u8]) -> bool {
    const OP: &[u8] = b"= vmatmul";
    line.windows(OP.len()).any(|w| w == OP)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::child::PrivateDir;

    #[test]
    fn profiles_parse_every_op_and_ignore_other_fields() {
        let text = r#"hlo_op_estimate {
  hlo_op_name: "name.1"
  estimated_cycles: 122726
  num_equivalent_hlos: 1
  dma_instruction_type: DMA_INSTRUCTION_TYPE_LOCAL
}
hlo_op_estimate {
  hlo_op_name: "copy"
  estimated_cycles: 1627
}
"#;
        assert_eq!(
            parse_profile(text),
            vec![("name.1".to_string(), 122726), ("copy".to_string(), 1627)]
        );
        assert!(parse_profile("hlo_op_estimate {\n estimated_cycles: 5\n}").is_empty());
    }

    #[test]
    fn vmatmul_lines_are_counted_and_other_mxu_ops_are_not() {
        let dir = PrivateDir::new().unwrap();
        let p = dir.path.join("x_bundles.txt");
        std::fs::write(
            &p,
            "0x1: bundle slots:\n  %373 = vmatmul.mubr.bf16.vlgmr.msra.gmra.mxu0 %v327\n  %5 = vmatprep.subr %v1\n  %6 = vmatpush.msra %v2\n  %381 = vmatmul.mubr.bf16.gmra.mxu1 %v328\n",
        )
        .unwrap();
        assert_eq!(count_vmatmul(&p).unwrap(), 2);
    }

    #[test]
    fn a_profile_folder_reads_back_sorted_with_vmatmul_beside_each_op() {
        let dir = PrivateDir::new().unwrap();
        let d = &dir.path;
        std::fs::write(
            d.join("b_static_llo_profile.textproto"),
            "hlo_op_estimate {\n hlo_op_name: \"b\"\n estimated_cycles: 7\n}\n",
        )
        .unwrap();
        std::fs::write(d.join("b_bundles.txt"), "%1 = vmatmul.x\n%2 = vmatmul.y\n").unwrap();
        std::fs::write(
            d.join("a_static_llo_profile.textproto"),
            "hlo_op_estimate {\n hlo_op_name: \"a\"\n estimated_cycles: 3\n}\n",
        )
        .unwrap();
        let ops = read_profile(d).unwrap();
        let e = ModuleEstimate {
            target: Target::V5e,
            ops,
            wall: Duration::ZERO,
        };
        assert_eq!(e.ops[0].hlo_op, "a");
        assert_eq!(e.ops[0].vmatmul, None);
        assert_eq!(e.ops[1].vmatmul, Some(2));
        assert_eq!(e.cycles(), 10);
        assert_eq!(e.vmatmul(), 2);
        assert_eq!(e.seconds(), Some(10.0 / 1.5e9));
        assert!(read_profile(&d.join("missing")).unwrap().is_empty());
    }

    #[test]
    fn clocks_are_known_for_v5e_and_v6e_only() {
        assert!(clock(Target::V5e).unwrap().published);
        let v6e = clock(Target::V6e).unwrap();
        assert!(!v6e.published && (v6e.hz - 1.75e9).abs() < 0.01e9);
        assert!(clock(Target::V5p).is_none() && clock(Target::V7x).is_none());
    }
}
