//! Benchmarks of the CPU paths, each next to its baseline measured in the
//! same run.
//!
//! | workload | methods | baseline |
//! |---|---|---|
//! | matmul 1024³ f32 | native JIT of [`kernels::foundation::matmul()`] | XLA's `dot_general` on the same PJRT plugin |
//! | attention forward, B=1 H=8 D=128, S=1024…8192, causal or not | native JIT and decomposed StableHLO of [`kernels::attention::flash_attention()`] | XLA's unfused `softmax(QKᵀ)V` graph |
//! | the same, forward and backward, as masks (`tessera bench masked_attention`) | native JIT of the table-driven [`kernels::attention::masked`] kernels, the mask (`causal` or `full`) preprocessed into block tables | the band kernels ([`Method::Jit`]) at the same blocks |
//!
//! Every (workload, method) runs in its own child process (the benchmark
//! binary re-executed with [`CHILD_FLAG`]), so that one measurement's
//! allocations cannot hide another's peak. Time is the median of repeated
//! runs after one warm-up; *peak memory* is how far the process's resident
//! set grows above where it stood just before the first run (inputs already
//! resident), read from `/proc/self/status` after resetting the high-water
//! mark — one method for every path, native or XLA.

use std::fmt;

use kernel_ir::{Array, DType, VerifiedKernel};
use lowering::HostKernel;

use kernel_ir::KernelErrors;
use kernels::attention::{AttnConfig, flash_attention};
use kernels::foundation::{MatmulConfig, matmul};

mod baseline;
mod measure;
mod report;
mod torch;

use baseline::baseline;

/// Why a workload could not be measured.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BenchError {
    /// The workload cannot be measured this way.
    #[error("{0}")]
    Unsupported(&'static str),
    /// A kernel of the workload did not build.
    #[error(transparent)]
    Kernel(#[from] KernelErrors),
    /// The mask's block tables could not be built.
    #[error(transparent)]
    Tables(#[from] kernels::attention::block_table::TableError),
    /// A kernel could not be lowered or run natively.
    #[error(transparent)]
    Lowering(#[from] lowering::LoweringError),
    /// A kernel could not be prepared or run on a backend.
    #[error(transparent)]
    Backend(std::sync::Arc<runtime::backend::BackendError>),
    /// PJRT refused the baseline (compile, upload, run).
    #[error(transparent)]
    Pjrt(#[from] runtime::pjrt::PjrtError),
    /// The baseline program could not be recorded.
    #[error(transparent)]
    Runtime(#[from] graph::RuntimeError),
    /// A measurement's process could not be started.
    #[error("cannot start {what}: {source}")]
    Spawn {
        /// The process.
        what: String,
        /// The operating system's error.
        source: std::sync::Arc<std::io::Error>,
    },
    /// A measurement's process failed; its last line of stderr.
    #[error("{what} failed: {last_line}")]
    Child {
        /// The method and workload.
        what: String,
        /// What it said last.
        last_line: String,
    },
    /// No round measured the method.
    #[error("{0}: not measured")]
    NotMeasured(String),
}

impl From<runtime::backend::BackendError> for BenchError {
    fn from(e: runtime::backend::BackendError) -> Self {
        BenchError::Backend(std::sync::Arc::new(e))
    }
}
pub use measure::{Measurement, child_main, measure, measure_interleaved, measure_isolated};
pub use report::{masked_suite, suite, svg_chart, table, to_json};

pub use torch::torch_python;

/// The machine a run measured, for its report: the CPU (model, cores,
/// vector ISA, cache sizes) and the JIT's dot register tile for each class
/// of dot, with where each came from ([`lowering::HostTuning`]).
pub fn cpu_summary() -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match lowering::HostTuning::host() {
        Ok(t) => format!(
            "{}; {cores} cores\nJIT dot register tiles (rows x f32 lanes), {}:\n  {}",
            t.cpu,
            t.source,
            t.choices().join("\n  ")
        ),
        Err(e) => format!("{}; {cores} cores\n{e}", lowering::CpuIdentity::host()),
    }
}

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
    /// Indices into the pool of its arguments in call order (scalar
    /// prefetch first, [`kernel_ir::Kernel::arguments`]).
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

    /// The arrays the workload starts from: its inputs, for the backward
    /// pass the forward's output and logsumexp (computed here by the native
    /// forward kernel, outside any timing), and for [`Method::Tables`] the
    /// mask's block tables, element masks and (all-zero) segment ids, built
    /// outside any timing as a caller builds them once per mask.
    fn pool(self, m: Method) -> Result<Vec<Array>, BenchError> {
        let mut pool = self.data_pool()?;
        if m == Method::Tables {
            pool.extend(self.tables()?);
        }
        Ok(pool)
    }

    /// What [`Method::Tables`] adds to the pool: `kind, fetch, mask_fetch,
    /// masks, q_seg, kv_seg` of the workload's mask, and for the backward
    /// pass the transposed `kind_t, fetch_t, mask_fetch_t`.
    fn tables(self) -> Result<Vec<Array>, BenchError> {
        use kernels::attention::block_table::BlockTables;
        let (s, backward) = match self {
            Workload::Attention { s, .. } => (s, false),
            Workload::AttentionBwd { s, .. } => (s, true),
            Workload::Matmul { .. } => return Err(BenchError::Unsupported("a matmul has no mask")),
        };
        let b = attention_block(Method::Tables, s);
        let tables = BlockTables::build(&self.mask(), s, s, b, b)?;
        let ([kind, fetch, mask_fetch], masks) = tables.arrays();
        let zeros = |shape: [usize; 3]| Array::zeros(DType::I32, shape);
        let mut v = vec![
            kind,
            fetch,
            mask_fetch,
            masks,
            zeros([1, s, 1]),
            zeros([1, 1, s]),
        ];
        if backward {
            v.extend(tables.transposed_arrays());
        }
        Ok(v)
    }

    /// The attention workload's mask on every head: causal or full.
    fn mask(self) -> kernels::attention::mask::MultiHeadMask {
        use kernels::attention::mask::{Mask, MultiHeadMask};
        let causal = matches!(
            self,
            Workload::Attention { causal: true, .. } | Workload::AttentionBwd { causal: true, .. }
        );
        let mask = if causal {
            Mask::Causal { offset: 0 }
        } else {
            Mask::Full
        };
        MultiHeadMask::uniform(mask, HEADS)
    }

    fn data_pool(self) -> Result<Vec<Array>, BenchError> {
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
                    HostKernel::compile(&Workload::Attention { s, causal }.kernel(Method::Jit)?)?;
                let outs = fwd.run(&pool[..3])?;
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
    pub fn stages(self, m: Method) -> Result<Vec<Stage>, BenchError> {
        if m == Method::Tables {
            return self.table_stages();
        }
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
                    dropout: None,
                };
                use kernels::attention::backward as bw;
                let (h, d) = (HEADS, HEAD_DIM);
                // Pool: q k v dO o lse, then delta. One pass for dq, dk
                // and dv: five products per step, not the seven of the dq
                // and dk/dv kernels.
                vec![
                    Stage {
                        kernel: bw::attention_delta::build_for(
                            DType::F32,
                            b,
                            bw::attention_delta::Dims { b: 1, h, sq: s, d },
                        )?,
                        inputs: vec![4, 3],
                    },
                    Stage {
                        kernel: bw::flash_attention_dqkv(
                            &cfg,
                            DType::F32,
                            bw::flash_attention_dqkv::Dims {
                                b: 1,
                                h,
                                hkv: h,
                                sq: s,
                                skv: s,
                                d,
                            },
                        )?,
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

    /// [`Method::Tables`]'s kernels: the table-driven forward, or delta,
    /// dq over the tables and dk/dv over their transpose, at the blocks of
    /// the band kernels.
    fn table_stages(self) -> Result<Vec<Stage>, BenchError> {
        use kernels::attention::backward::{attention_delta, attention_delta::Dims as DeltaDims};
        use kernels::attention::masked::{MaskedConfig, masked_attention};
        use kernels::attention::masked_backward::{masked_attention_dkv, masked_attention_dq};
        let (s, backward) = match self {
            Workload::Attention { s, .. } => (s, false),
            Workload::AttentionBwd { s, .. } => (s, true),
            Workload::Matmul { .. } => return Err(BenchError::Unsupported("a matmul has no mask")),
        };
        let b = attention_block(Method::Tables, s);
        let cfg = MaskedConfig {
            sm_scale: 1.0 / (HEAD_DIM as f32).sqrt(),
            softcap: None,
            block_q: b,
            block_k: b,
            rule: MaskedConfig::rule_of(&self.mask()),
        };
        let (h, d, n) = (HEADS, HEAD_DIM, s.div_ceil(b));
        let masks = self.tables()?[3].shape()[0];
        // The three kernels' dims have the same fields, each its own type.
        macro_rules! dims {
            ($t:path) => {{
                use $t as Dims;
                Dims {
                    b: 1,
                    h,
                    hkv: h,
                    sq: s,
                    skv: s,
                    d,
                    nq: n,
                    nk: n,
                    n: masks,
                }
            }};
        }
        if !backward {
            // Pool: q k v, kind fetch mask_fetch masks q_seg kv_seg.
            let dims = dims!(kernels::attention::masked::masked_attention::Dims);
            return Ok(vec![Stage {
                kernel: masked_attention::build_for(DType::F32, &cfg, dims)?,
                inputs: vec![3, 4, 5, 0, 1, 2, 6, 7, 8],
            }]);
        }
        // Pool: q k v dO o lse (0..6), kind fetch mask_fetch masks q_seg
        // kv_seg (6..12), kind_t fetch_t mask_fetch_t (12..15), then delta.
        let dq = dims!(kernels::attention::masked_backward::masked_attention_dq::Dims);
        let dkv = dims!(kernels::attention::masked_backward::masked_attention_dkv::Dims);
        Ok(vec![
            Stage {
                kernel: attention_delta::build_for(DType::F32, b, DeltaDims { b: 1, h, sq: s, d })?,
                inputs: vec![4, 3],
            },
            Stage {
                kernel: masked_attention_dq::build_for(DType::F32, &cfg, dq)?,
                inputs: vec![6, 7, 8, 0, 1, 2, 3, 5, 15, 9, 10, 11],
            },
            Stage {
                kernel: masked_attention_dkv::build_for(DType::F32, &cfg, dkv)?,
                inputs: vec![12, 13, 14, 0, 1, 2, 3, 5, 15, 9, 10, 11],
            },
        ])
    }

    /// The Tessera kernel of this workload, configured for method `m`.
    pub fn kernel(self, m: Method) -> Result<VerifiedKernel, BenchError> {
        match self {
            // 256³ blocks: each block of the inputs is read from beyond L2
            // half as often as with 128-row blocks (4% faster here).
            Workload::Matmul { n } => matmul(&MatmulConfig {
                m: n,
                n,
                k: n,
                bm: 256.min(n),
                bn: 256.min(n),
                bk: 256.min(n),
                dtype: DType::F32,
                out_dtype: DType::F32,
            }),
            Workload::AttentionBwd { .. } => {
                return Err(BenchError::Unsupported(
                    "the backward pass is several kernels; see `stages`",
                ));
            }
            Workload::Attention { s, causal } => flash_attention(
                &AttnConfig {
                    causal,
                    sm_scale: 1.0 / (HEAD_DIM as f32).sqrt(),
                    block_q: attention_block(m, s),
                    block_k: attention_block(m, s),
                    window: None,
                    softcap: None,
                    dropout: None,
                },
                DType::F32,
                kernels::attention::flash_attention::Dims {
                    b: 1,
                    h: HEADS,
                    sq: s,
                    skv: s,
                    d: HEAD_DIM,
                    hkv: HEADS,
                },
            ),
        }
        .map_err(BenchError::from)
    }

    /// The unfused baseline XLA compiles: the workload written with the
    /// graph runtime's ops and exported as the StableHLO it would run.
    pub fn baseline_module(self) -> Result<String, BenchError> {
        Ok(baseline(self)?)
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

/// Attention block size per method, the same for the forward and the
/// backward pass: the JIT runs 256 × 256 blocks (fewer block copies per
/// multiply-add than 128, still cache-resident; 512 × 512 forward blocks
/// measured 0.82× instead of 0.94× PyTorch's time at S = 4096, but 1.33×
/// instead of 0.97× causal, where a diagonal block wastes half its work),
/// and the table-driven kernels run at the JIT's
/// blocks so that they compare with it; XLA runs the decomposed grid loop
/// with a per-iteration cost, so fewer, larger 512 × 512 blocks win there.
pub fn attention_block(m: Method, s: usize) -> usize {
    let b = if m == Method::Decomposed { 512 } else { 256 };
    b.min(s)
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
    /// PyTorch (`torch.matmul`, `scaled_dot_product_attention` with the
    /// flash backend), in a Python child process, when a Python with torch
    /// is found ([`torch_python`]).
    Torch,
    /// The attention workloads as masks (`causal` or `full`) through the
    /// table-driven kernels ([`kernels::attention::masked`]), native JIT:
    /// whether the band kernels are still worth keeping beside them.
    Tables,
}

impl Method {
    /// Its name in reports.
    pub fn name(self, w: Workload) -> &'static str {
        match (self, w) {
            (Method::Jit, _) => "tessera jit",
            (Method::Tables, _) => "tessera jit, mask tables",
            (Method::Decomposed, _) => "tessera pjrt-decomposed",
            (Method::Xla, Workload::Matmul { .. }) => "xla dot_general",
            (Method::Xla, Workload::Attention { .. } | Workload::AttentionBwd { .. }) => {
                "xla unfused"
            }
            (Method::Torch, Workload::Matmul { .. }) => "torch matmul",
            (Method::Torch, Workload::Attention { .. }) => "torch sdpa flash",
            (Method::Torch, Workload::AttentionBwd { .. }) => "torch sdpa flash bwd",
        }
    }

    fn arg(self) -> &'static str {
        match self {
            Method::Jit => "jit",
            Method::Decomposed => "decomposed",
            Method::Xla => "xla",
            Method::Torch => "torch",
            Method::Tables => "tables",
        }
    }

    fn parse(s: &str) -> Option<Method> {
        [
            Method::Jit,
            Method::Decomposed,
            Method::Xla,
            Method::Torch,
            Method::Tables,
        ]
        .into_iter()
        .find(|m| m.arg() == s)
    }
}
