//! The host CPU's vector registers, which bound the dot micro-kernel's
//! register tile ([`crate::DotTiling`]): the JIT compiles for the CPU it
//! runs on (LLVM's host target), so a tile chosen for another CPU's
//! register file either spills (AVX-512's 12 × 32-lane tile is 48
//! accumulators of AVX2's 16 registers) or leaves registers idle.

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
