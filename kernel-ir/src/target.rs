//! TPU generations and the hardware facts the verifier needs.

use std::fmt;
use std::str::FromStr;

use crate::{DType, DotShape};

/// Lanes per vreg row: the tiling unit of the minor dimension.
pub const LANES: usize = 128;

const MIB: u64 = 1 << 20;

/// The TPU generation a kernel is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Target {
    /// TPU v5e (v5 lite).
    #[default]
    V5e,
    /// TPU v5p.
    V5p,
    /// TPU v6e (Trillium).
    V6e,
    /// TPU v7x (Ironwood).
    V7x,
}

impl Target {
    /// Every target, in release order.
    pub const ALL: [Target; 4] = [Target::V5e, Target::V5p, Target::V6e, Target::V7x];

    /// Short name, as printed and parsed (`v5e`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Target::V5e => "v5e",
            Target::V5p => "v5p",
            Target::V6e => "v6e",
            Target::V7x => "v7x",
        }
    }

    /// TensorCores one device runs a kernel on, which a `core_parallel`
    /// grid dim splits across: 2 on v5p (a megacore), 1 elsewhere. v7x's
    /// two TensorCores are two devices in libtpu's topologies (1 each), as
    /// measured with libtpu 0.0.48.1.
    pub fn tensor_cores(self) -> usize {
        match self {
            Target::V5p => 2,
            Target::V5e | Target::V6e | Target::V7x => 1,
        }
    }

    /// Side of the MXU systolic array: 128 up to v5, 256 from v6e on.
    pub fn mxu_width(self) -> usize {
        match self {
            Target::V5e | Target::V5p => 128,
            Target::V6e | Target::V7x => 256,
        }
    }

    /// Peak dot throughput of one device in flop/s for operands of
    /// `dtype`, from Google's published per-chip figures (Cloud TPU docs,
    /// "TPU v5e" / "TPU v5p" / "TPU v6e" / "TPU7x (Ironwood)", system
    /// architecture tables): bf16 197 / 459 / 918 / 2307 TFLOP/s, int8 394
    /// / 918 / 1836 TOP/s, fp8 4614 TFLOP/s on v7x. A v7x chip is two
    /// devices (one per die, as libtpu's topologies count them), so its
    /// figures are halved. fp8 before v7x and int8 on v7x have no native
    /// MXU path (the compiler converts): bf16's rate. f32 has no published
    /// MXU rate; it is estimated at a third of bf16 (a three-pass bf16
    /// product). An estimate for rooflines, not a measurement.
    pub fn peak_flops(self, dtype: DType) -> f64 {
        let t = 1e12;
        let (bf16, int8, fp8) = match self {
            Target::V5e => (197.0 * t, 394.0 * t, 197.0 * t),
            Target::V5p => (459.0 * t, 918.0 * t, 459.0 * t),
            Target::V6e => (918.0 * t, 1836.0 * t, 918.0 * t),
            Target::V7x => (2307.0 * t / 2.0, 2307.0 * t / 2.0, 4614.0 * t / 2.0),
        };
        match dtype {
            DType::I8 => int8,
            DType::F8E4M3FN | DType::F8E5M2 => fp8,
            DType::F32 | DType::I32 => bf16 / 3.0,
            _ => bf16,
        }
    }

    /// HBM bandwidth of one device in bytes/s, from the same tables: 819,
    /// 2765, 1640 GB/s per chip on v5e, v5p, v6e, and 7380 GB/s per v7x
    /// chip (3690 per device).
    pub fn hbm_bandwidth(self) -> f64 {
        let g = 1e9;
        match self {
            Target::V5e => 819.0 * g,
            Target::V5p => 2765.0 * g,
            Target::V6e => 1640.0 * g,
            Target::V7x => 7380.0 * g / 2.0,
        }
    }

    /// One direction of one ICI link in bytes/s, per device: what one
    /// remote copy to a ring neighbour can use. From Google's published
    /// per-chip bidirectional ICI bandwidth over its ports (Cloud TPU docs'
    /// system architecture tables: v5e 400 GB/s over 4 ports, v6e 800 GB/s
    /// over 4, v5p 1200 GB/s over 6; Ironwood's announced 1.2 TB/s, taken
    /// over 6 ports of its 3D torus and shared by the chip's two devices):
    /// 50, 100, 100 and 50 GB/s. An estimate for overlap bounds, not a
    /// measurement.
    pub fn ici_link_bandwidth(self) -> f64 {
        let g = 1e9;
        match self {
            Target::V5e => 400.0 * g / 8.0,
            Target::V6e => 800.0 * g / 8.0,
            Target::V5p => 1200.0 * g / 12.0,
            Target::V7x => 1200.0 * g / 12.0 / 2.0,
        }
    }

    /// HBM capacity of one device in bytes (Google's published tables: 16,
    /// 95, 32 GB per chip on v5e, v5p, v6e; 192 GB per v7x chip, 96 per
    /// device, which is what libtpu reports available): no tensor larger
    /// than this can exist on one device.
    pub fn hbm_bytes(self) -> u64 {
        let gib = 1u64 << 30;
        match self {
            Target::V5e => 16 * gib,
            Target::V5p => 95 * gib,
            Target::V6e => 32 * gib,
            Target::V7x => 96 * gib,
        }
    }

    /// MXU passes (`vmatmul` instructions in libtpu's bundles) one dot of
    /// `shape` takes: the lhs streams through the systolic array one vreg
    /// of rows at a time (8 rows of f32, 16 of bf16, 32 of 8-bit types),
    /// once per `mxu_width`-square weight tile of the rhs. On the 256-wide
    /// MXU (v6e, v7x) a dot whose contracting and output widths are both
    /// at most 128 takes half as many (two 128-square weight tiles share
    /// the array). Measured, not documented: libtpu 0.0.48.1's executed
    /// bundle trace for matmuls of every block shape 128/256/512 in f32 and
    /// bf16 on v5e and v6e, and flash attention's two dots, match this
    /// count exactly. Used to tell when libtpu's static profiler dropped
    /// work, not to predict time.
    pub fn mxu_passes(self, shape: &DotShape) -> u64 {
        let rows = 8 * shape.lhs.packing().max(1);
        let w = self.mxu_width();
        let per = shape.m.div_ceil(rows) * shape.k.div_ceil(w) * shape.n.div_ceil(w);
        let half = w == 256 && shape.k <= 128 && shape.n <= 128;
        let per = if half { per.div_ceil(2) } else { per };
        (per * shape.batch) as u64
    }

    /// Physical VMEM per core in bytes.
    pub fn vmem_bytes(self) -> u64 {
        match self {
            Target::V5e | Target::V6e => 128 * MIB,
            Target::V5p | Target::V7x => 64 * MIB,
        }
    }

    /// The scoped VMEM limit a kernel gets when it does not set
    /// `vmem_limit_bytes`; far below the physical size.
    pub fn default_scoped_vmem_limit(self) -> u64 {
        32 * MIB
    }

    /// Rows of one native (sublane) tile for `dtype`: 8 × packing, so f32
    /// tiles are (8, 128), bf16 (16, 128), int8 (32, 128).
    pub fn tile_rows(self, dtype: DType) -> usize {
        8 * dtype.packing()
    }

    /// Lanes of one native tile (the minor tile dim): 128 on every generation.
    pub fn tile_lanes(self) -> usize {
        LANES
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error of parsing a target name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown TPU target `{0}`; expected one of v5e, v5p, v6e, v7x")]
pub struct ParseTargetError(pub String);

impl FromStr for Target {
    type Err = ParseTargetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Target::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| ParseTargetError(s.to_string()))
    }
}

/// A GPU a kernel is compiled for through Triton: the architecture Triton's
/// `GPUTarget` names (`("cuda", 90, 32)`, `("hip", "gfx942", 64)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuTarget {
    /// NVIDIA Ampere (A100): `sm_80`.
    Sm80,
    /// NVIDIA Hopper (H100, H200): `sm_90`.
    Sm90,
    /// NVIDIA Blackwell (B200): `sm_100`.
    Sm100,
    /// AMD CDNA 3 (MI300X): `gfx942`.
    Gfx942,
    /// AMD CDNA 4 (MI355X): `gfx950`.
    Gfx950,
}

impl GpuTarget {
    /// Every GPU target, NVIDIA first.
    pub const ALL: [GpuTarget; 5] = [
        GpuTarget::Sm80,
        GpuTarget::Sm90,
        GpuTarget::Sm100,
        GpuTarget::Gfx942,
        GpuTarget::Gfx950,
    ];

    /// Short name, as printed and parsed (`sm_90`, `gfx942`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GpuTarget::Sm80 => "sm_80",
            GpuTarget::Sm90 => "sm_90",
            GpuTarget::Sm100 => "sm_100",
            GpuTarget::Gfx942 => "gfx942",
            GpuTarget::Gfx950 => "gfx950",
        }
    }

    /// Triton's back end: `cuda` or `hip`.
    pub fn backend(self) -> &'static str {
        match self {
            GpuTarget::Sm80 | GpuTarget::Sm90 | GpuTarget::Sm100 => "cuda",
            GpuTarget::Gfx942 | GpuTarget::Gfx950 => "hip",
        }
    }

    /// The architecture as Triton's `GPUTarget` takes it: the compute
    /// capability (`90`) on NVIDIA, the gfx name on AMD.
    pub fn arch(self) -> &'static str {
        match self {
            GpuTarget::Sm80 => "80",
            GpuTarget::Sm90 => "90",
            GpuTarget::Sm100 => "100",
            GpuTarget::Gfx942 => "gfx942",
            GpuTarget::Gfx950 => "gfx950",
        }
    }

    /// Threads per warp (wavefront): 32 on NVIDIA, 64 on AMD CDNA.
    pub fn warp_size(self) -> usize {
        match self.backend() {
            "cuda" => 32,
            _ => 64,
        }
    }

    /// The most shared memory (LDS on AMD) one program may use, in bytes:
    /// 163 KiB on sm_80 and 227 KiB on sm_90 and sm_100 (the CUDA C++
    /// Programming Guide's "maximum amount of shared memory per thread
    /// block" with opt-in, per compute capability), the CU's LDS on AMD:
    /// 64 KiB on CDNA 3 (gfx942), 160 KiB on CDNA 4 (gfx950). Triton
    /// compiles a program that needs more; it cannot launch.
    pub fn max_shared_bytes(self) -> u64 {
        match self {
            GpuTarget::Sm80 => 163 * 1024,
            GpuTarget::Sm90 | GpuTarget::Sm100 => 227 * 1024,
            GpuTarget::Gfx942 => 64 * 1024,
            GpuTarget::Gfx950 => 160 * 1024,
        }
    }

    /// Whether Triton 3.9 takes `f8e4m3fn` (its `fp8e4nv`) on this
    /// architecture: not on `sm_80`, whose fp8 types are `fp8e5` and
    /// `fp8e4b15` (Triton's `supported_fp8_dtypes` for the target).
    pub fn has_f8e4m3fn(self) -> bool {
        self != GpuTarget::Sm80
    }
}

impl fmt::Display for GpuTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error of parsing a GPU target name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown GPU target `{0}`; expected one of sm_80, sm_90, sm_100, gfx942, gfx950")]
pub struct ParseGpuTargetError(pub String);

impl FromStr for GpuTarget {
    type Err = ParseGpuTargetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GpuTarget::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| ParseGpuTargetError(s.to_string()))
    }
}

/// The platform whose rules a kernel is verified against: the TPU's
/// (tiling, Mosaic's limits, the VMEM budget, for its [`Target`]
/// generation) or the GPU's (power-of-two tiles, Triton's tensor size).
/// The CPU paths run either. One kernel source builds for both: the
/// same `#[tpu_kernel]` built inside [`for_platform`]`(Platform::Gpu, ..)`
/// may take blocks the TPU refuses (a 64-wide lane dim, say).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Platform {
    /// TPU rules (the default).
    #[default]
    Tpu,
    /// GPU (Triton) rules.
    Gpu,
}

std::thread_local! {
    static PLATFORM: std::cell::Cell<Platform> = const { std::cell::Cell::new(Platform::Tpu) };
}

/// The platform kernels built on this thread now are verified for:
/// [`Platform::Tpu`] unless inside [`for_platform`].
pub fn current_platform() -> Platform {
    PLATFORM.with(std::cell::Cell::get)
}

/// Runs `f` with kernels built on this thread verified for `platform`
/// (the `#[tpu_kernel]` builds, [`crate::KernelBuilder::new`]); restores
/// the previous platform afterwards, also when `f` panics.
///
/// ```
/// use kernel_ir::{Platform, prelude::*};
/// let build = || {
///     let mut k = KernelBuilder::new("narrow");
///     k.grid([2], [Parallel]);
///     let x = k.input("x", BF16, [16, 128]).block([16, 64], |[j]| (0, j));
///     let o = k.output("o", BF16, [16, 128]).block([16, 64], |[j]| (0, j));
///     o.store(.., x.load(..));
///     k.build()
/// };
/// // A 64-lane block: the TPU's tiling refuses it, a GPU takes it.
/// assert!(build().is_err());
/// let k = kernel_ir::for_platform(Platform::Gpu, build).unwrap();
/// assert_eq!(k.platform, Platform::Gpu);
/// ```
pub fn for_platform<R>(platform: Platform, f: impl FnOnce() -> R) -> R {
    struct Restore(Platform);
    impl Drop for Restore {
        fn drop(&mut self) {
            PLATFORM.with(|p| p.set(self.0));
        }
    }
    let _restore = Restore(PLATFORM.with(|p| p.replace(platform)));
    f()
}
