//! The host CPU: its vector registers, which bound the dot micro-kernel's
//! register tile ([`crate::DotTiling`]): the JIT compiles for the CPU it
//! runs on (LLVM's host target), so a tile chosen for another CPU's
//! register file either spills (AVX-512's 12 × 32-lane tile is 48
//! accumulators of AVX2's 16 registers) or leaves registers idle; and its
//! identity, which keys the measured tuning ([`crate::HostTuning`]).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The vector register file the JIT's code runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VectorRegisters {
    /// Bytes per register (64 with AVX-512, 32 with AVX2, 16 with SSE or NEON).
    pub bytes: usize,
    /// Architectural vector registers (32 with AVX-512 or NEON, else 16).
    pub count: usize,
    /// The instruction set they were detected from, for reports.
    pub isa: &'static str,
}

impl VectorRegisters {
    /// This machine's, detected once.
    pub fn host() -> VectorRegisters {
        static HOST: OnceLock<VectorRegisters> = OnceLock::new();
        *HOST.get_or_init(detect)
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> VectorRegisters {
    if std::arch::is_x86_feature_detected!("avx512f") {
        VectorRegisters {
            bytes: 64,
            count: 32,
            isa: "avx512",
        }
    } else if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
    {
        VectorRegisters {
            bytes: 32,
            count: 16,
            isa: "avx2",
        }
    } else {
        VectorRegisters {
            bytes: 16,
            count: 16,
            isa: "sse",
        }
    }
}

#[cfg(target_arch = "aarch64")]
fn detect() -> VectorRegisters {
    VectorRegisters {
        bytes: 16,
        count: 32,
        isa: "neon",
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> VectorRegisters {
    VectorRegisters {
        bytes: 16,
        count: 16,
        isa: "generic",
    }
}

/// What the JIT's tuning is keyed by: what makes one CPU's best tile
/// differ from another's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuIdentity {
    /// The model name (`/proc/cpuinfo`), with the family, model and
    /// stepping numbers (x86) or implementer and part (Arm), which tell
    /// apart CPUs a hypervisor reports under one generic name.
    pub model: String,
    /// The vector registers the JIT's code uses.
    pub registers: VectorRegisters,
    /// Level-1 data cache per core, bytes (0 when unknown).
    pub l1d_bytes: usize,
    /// Level-2 cache per core, bytes (0 when unknown).
    pub l2_bytes: usize,
}

impl CpuIdentity {
    /// This machine's, read once.
    pub fn host() -> &'static CpuIdentity {
        static HOST: OnceLock<CpuIdentity> = OnceLock::new();
        HOST.get_or_init(|| {
            let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
            let field = |name: &str| {
                info.lines()
                    .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            };
            let name = field("model name").unwrap_or_else(|| "unknown CPU".into());
            let numbers: Vec<String> = [
                ("family", "cpu family"),
                ("model", "model"),
                ("stepping", "stepping"),
                ("implementer", "CPU implementer"),
                ("part", "CPU part"),
            ]
            .into_iter()
            .filter_map(|(short, key)| field(key).map(|v| format!("{short} {v}")))
            .collect();
            let model = if numbers.is_empty() {
                name
            } else {
                format!("{name} ({})", numbers.join(", "))
            };
            CpuIdentity {
                model,
                registers: VectorRegisters::host(),
                l1d_bytes: cache_bytes(1, "Data"),
                l2_bytes: cache_bytes(2, "Unified"),
            }
        })
    }

    /// The file name its tuning is kept under: a hash of the identity
    /// and Tessera's version.
    pub(crate) fn file_name(&self) -> String {
        // FNV-1a: stable across Rust releases, unlike `DefaultHasher`.
        let text = format!("{self} / tessera {}", env!("CARGO_PKG_VERSION"));
        let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("host-tuning-{}-{hash:016x}.txt", self.registers.isa)
    }
}

impl fmt::Display for CpuIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.registers;
        write!(
            f,
            "{}; {} ({} vector registers of {} B); L1d {} KiB, L2 {} KiB",
            self.model,
            r.isa,
            r.count,
            r.bytes,
            self.l1d_bytes / 1024,
            self.l2_bytes / 1024
        )
    }
}

/// The size of cpu0's cache of `level` and `kind` from sysfs (0 when
/// unknown).
fn cache_bytes(level: u32, kind: &str) -> usize {
    let base = Path::new("/sys/devices/system/cpu/cpu0/cache");
    let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    (0..8)
        .map(|i| base.join(format!("index{i}")))
        .find(|d| {
            read(d.join("level")).trim() == level.to_string() && read(d.join("type")).trim() == kind
        })
        .and_then(|d| {
            let s = read(d.join("size"));
            let s = s.trim();
            let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
            let n: usize = n.parse().ok()?;
            Some(match unit {
                "K" => n << 10,
                "M" => n << 20,
                _ => n,
            })
        })
        .unwrap_or(0)
}
