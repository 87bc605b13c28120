//! The `tessera` command: see `tessera --help`.
//!
//! Exit status: 0 on success, 1 when a kernel or back end fails at run
//! time (or the demo finds a mismatch), 2 for a bad invocation (one line on
//! stderr naming the problem and the fix).

mod args;
mod bench;
mod cases;
mod compile;
mod compile_gpu;
mod cost;
mod demo;
mod estimate;
mod kernel_args;
mod limits;
mod lower;
mod masked;
mod numerics;
mod profile;
mod run;
mod run_file;
mod tpu_child;
mod tune;

use std::process::ExitCode;

const HELP: &str = "\
tessera: write, check, lower and run TPU-style kernels in Rust

USAGE:
    tessera <COMMAND> [ARGS]

COMMANDS:
    demo     build flash attention from the DSL, verify it, show its tiling, IR
             and VMEM budget, write it lowered to every target, run it and the
             example kernels on every CPU path, compare with f64 references
    list     the kernels with their inputs, outputs and config parameters
    lower    print or write a kernel lowered to a target
    export   write a kernel as a multi-platform artifact JAX programs call
    compile  compile kernels with the real TPU compiler (libtpu, compile-only)
             for v5e, v6e, v5p and v7x: code size and memory, or its error;
             with --gpu, with Triton for NVIDIA and AMD GPUs: registers,
             spills, shared memory, tensor-core instructions
    estimate libtpu's static schedule estimate of kernels (cycles, time), checked
             against each kernel's roofline and executed dots: trusted or not
    tune     search a kernel's block sizes, ranked by trusted TPU estimate or by
             measured JIT time; prints the winning --config
    run      run a kernel on .npy inputs, write its outputs as .npy
    diff     compare two back ends (or one with the f64 reference) on one input
    bench    benchmarks with their XLA baselines, one table with ratios
    numerics the FP8 GEMM's error by depth and accumulation scheme
    masked   attention with any mask (causal, local, chunked, prefix, per head,
             segment ids) on .npy inputs through its block tables
    cost     the HBM<->VMEM bytes each kernel's pipeline moves, its flops, and a
             roofline bound per TPU generation
    profile  a traced run through the graph runtime: a Perfetto trace and a
             summary (cache tiers, buckets and padding, transfers, time split)
    cases    every catalog kernel as a GPU check case: Triton program, inputs,
             f64 reference and tolerance (what tests/gpu/run.sh runs)
    train    train a small transformer LM on a copying task on the CPU, with
             gradients through the kernels' backward passes and checkpoints
             that survive SIGTERM

`tessera <COMMAND> --help` describes each command.
";

const HELP_COST: &str = "\
tessera cost: what a kernel moves between HBM and VMEM on a TPU

USAGE:
    tessera cost [KERNEL|PRESET|all] [--config KEY=VALUE]... [--shape INPUT=DxDx..]...
                 [--input INPUT=FILE.npy]... [--json]

Runs the kernel in the reference interpreter on its sample inputs (--input
replaces one, e.g. a valid length or a page table) and counts,
per operand, the blocks its pipeline moves: a block is fetched into VMEM when
its block index changes between consecutive grid steps (kept otherwise), and
an output block is written back when its index changes and at the end; a
block at an array's edge moves only its in-bounds part. Also the dot flops it
executed (skipped steps count nothing), the arithmetic intensity, and the
roofline bound on v5e, v5p, v6e and v7x from Google's published peak flops and
HBM bandwidth (per device). `all` (the default) is every catalog kernel at its
defaults and every preset. --json prints one object per kernel (the Pallas
comparison in tests/conformance reads it). Operands a kernel copies itself
(manual DMA) count the bytes its copies moved.
LIMITS (before anything is sampled or run):
    --max-memory SIZE     the most host memory the kernel's arrays may take
                          (bytes, or with K, M, G, T) [default: a quarter of
                          this machine's memory]
    --max-work N          the most element-ops a run may do (grid steps x loop
                          trips x each op's elements) [default: 2^34]
";

const HELP_ESTIMATE: &str = "\
tessera estimate: how long a kernel takes on a TPU, by the TPU compiler's own
static schedule estimate

USAGE:
    tessera estimate KERNEL|PRESET|kernels|presets|all [--tpu G[,G..]|all]
                     [--config KEY=VALUE].. [--shape INPUT=DxDx..].. [--input INPUT=FILE.npy]..
                     [--json] [--no-trace] [--timeout SECONDS]
    tessera estimate --module FILE [--tpu G[,G..]] [--json]

Compiles the kernel's tpu_custom_call module with libtpu (compile-only) with
its static profiler on, one child process per compile (libtpu reads its flags
once per process, and the profiler can abort: that is an error naming it, not
a crash), and prints per generation: the estimated cycles of the whole program
(the kernel and the layout copies around it), the time at the TensorCore clock
(v5e 1.5 GHz published, v6e 1.75 GHz inferred; v5p and v7x have no published
clock and get cycles only), the roofline bound of `tessera cost` (C compute, M
memory), estimate / roofline, the vmatmul instructions of the executed bundle
trace against the MXU passes the kernel's executed dots need (the reference
interpreter runs it on its sample inputs), and a verdict.

An estimate is UNTRUSTED, with the reason, when its trace is short of the
needed MXU passes (the profiler dropped work it cannot follow: control flow
steered by prefetched data or program_id-dependent loops), when it is below
the roofline, when the kernel is memory-bound (the profiler does not share HBM
bandwidth between DMAs: the time shown is then max(estimate, bytes /
bandwidth)), or when the clock is unknown. Rank configurations by trusted
estimates only; they rank, they do not predict wall time.

--module estimates a whole StableHLO module (a Pallas kernel exported with
jax.export for TPU, say) with no guards. --no-trace skips the executed bundle
trace (large for big grids) and with it the dropped-work check. --timeout
limits each profiled compile (default 600 s). With TESSERA_KEEP_PROFILE=DIR
set, each estimate's profile and executed bundle trace (libtpu's internals)
are kept in DIR/<generation>/, for a bundle-level look at an estimate: one
instruction per line, `%x = opcode ...`, bundles headed `0x..: bundle`.

OPTIONS:
    --tpu G               v5e, v6e, v5p, v7x, a comma list, or all   [default: v5e,v6e]
    --config, --shape     as for `tessera lower` (one kernel only)
    --input INPUT=FILE    as for `tessera cost` (values that decide the work)
    --json                one object per kernel and generation

    --max-memory SIZE     the most host memory the kernel's arrays may take
                          (bytes, or with K, M, G, T) [default: a quarter of
                          this machine's memory]
    --max-work N          the most element-ops a run may do (grid steps x loop
                          trips x each op's elements) [default: 2^34]";

const HELP_TUNE: &str = "\
tessera tune: a kernel's block sizes, searched and ranked; or the JIT tuned for this CPU

USAGE:
    tessera tune KERNEL (--tpu G | --cpu) [--config KEY=VALUE].. [--shape INPUT=DxDx..]..
                 [--values 128,256,512] [--top N]
    tessera tune --cpu

`tessera tune --cpu` alone measures the native JIT's dot register tiles on
this CPU again (a few seconds), on one probe per class of dot (shallow or
deep contraction, narrow or wide output), prints them and keeps each class's
choice in the cache folder for every later compile: the register rule's tile
unless another is 3 % faster on that class's probe, twice. The JIT does this
by itself at its first compile on a CPU it has no tuning for; run it again on
a quiet machine, or override it with TESSERA_HOST_TUNING=ROWSxLANES (e.g.
6x16, every class), =deep-wide=4x16,shallow-wide=5x16 (those classes), or
=default (the rule).

Builds the kernel for every combination of --values (default 128,256,512) over
its block-size parameters (block_q, block_k, bm, bn, bk, ...), keeps those the
verifier accepts for the generation (tiling, VMEM budget; blocks clamped to a
short array that build the same kernel count once), and ranks them:

  --tpu G   by libtpu's static schedule estimate (`tessera estimate`), one
            child process per compile; estimates that dropped work are listed
            unranked, memory-bound ones rank at max(estimate, bytes /
            bandwidth); v5p and v7x rank by cycles (no published clock)
  --cpu     by the native JIT's measured time on this machine (best of 5)

Prints the table (--top N rows, default 10) and the winner as --config flags.

LIMITS (before anything is sampled or run):
    --max-memory SIZE     the most host memory the kernel's arrays may take
                          (bytes, or with K, M, G, T) [default: a quarter of
                          this machine's memory]
    --max-work N          the most element-ops a run may do (grid steps x loop
                          trips x each op's elements) [default: 2^34]

EXAMPLE:
    tessera tune flash_attention --tpu v6e --config dtype=bf16 \\
        --shape q=1x8x2048x128 --shape k=1x8x2048x128 --shape v=1x8x2048x128
";

const HELP_PROFILE: &str = "\
tessera profile: what the runtime did, as a trace you can open

USAGE:
    tessera profile [KERNEL] [--steps N] [--out DIR]

Runs the transformer block through the graph runtime for N steps (default 12)
over sequence lengths 40, 100, 200, 64, 130, 250 padded to buckets 64, 128
and 256 (or, with KERNEL, that catalog kernel at its defaults, N calls) with
tracing on, and writes DIR/trace.json (default DIR target/tessera-profile), a
Chrome/Perfetto trace: one track per thread, spans for recording, syncs,
materializations, lowering, compile-cache look-ups per tier, compiles, host
kernel JITs, transfers each way, executions, bucket decisions and
collectives; and DIR/summary.svg. Prints the summary: cache hit rate per
tier, the bucket histogram with padding, transposes, bytes each way, and the
time split between compile, kernel JIT, transfer, execute and host.
";

const HELP_DEMO: &str = "\
tessera demo: the main job

USAGE:
    tessera demo

Builds flash attention from the #[tpu_kernel] DSL and verifies it, prints its
grid, blocks, IR and VMEM budget, writes it lowered to every target under
target/tessera-demo/ (kernel module, tpu_custom_call module, Mosaic body,
decomposed StableHLO, host module), compiles it with the TPU compiler
(libtpu, compile-only) for v5e, v6e, v5p and v7x, then runs it and the
foundation kernels on every CPU path (interp, jit, pjrt-decomposed, pjrt-ffi)
on random inputs and prints, per path and output, the error against an f64
reference and the compile and run times. Exits 1 if any path mismatches or
any TPU compile fails.
";

const HELP_LIST: &str = "\
tessera list: the kernels

USAGE:
    tessera list

For each kernel of the catalog: its inputs and outputs (at the default
shapes), the targets it runs on, and every config parameter with its default
and meaning. Then the presets: named instances with fixed config and shapes
(what the lowering snapshots cover), usable with `tessera lower`, each with
its targets.

Targets: cpu (every CPU path), tpu (libtpu: v5e, v6e, v5p, v7x), and the GPU
targets whose rules the kernel, built for the GPU, meets (sm_80, sm_90,
sm_100, gfx942, gfx950; a refused one with the first reason).
";

const HELP_LOWER: &str = "\
tessera lower: a kernel lowered to a target

USAGE:
    tessera lower KERNEL --target TARGET [--config KEY=VALUE]... [--shape INPUT=DxDx..]... [--out FILE]

KERNEL is a catalog kernel or a preset (`tessera list`), or a kernel file
FILE.kir in the printed IR form (`kernel_ir::parse`; its text fixes config
and shapes, so --config and --shape do not apply).

OPTIONS:
    --target TARGET       kernel       the kernel module in upstream MLIR dialects
                          mosaic       StableHLO calling it through tpu_custom_call
                          mosaic-body  the Mosaic kernel module inside that call
                          decomposed   plain StableHLO, runnable on any PJRT back end
                          host         the CPU module the native JIT compiles
                          triton       the Triton program (Python source) GPUs compile
    --config KEY=VALUE    set a config parameter (repeatable; see `tessera list`)
    --shape INPUT=DxD..   the shape of an input, e.g. q=1x8x1024x128 (repeatable;
                          other inputs keep their default shapes)
    --out FILE            write to FILE instead of standard output

EXAMPLE:
    tessera lower flash_attention --config causal=true --config dtype=bf16 --target mosaic
";

const HELP_COMPILE: &str = "\
tessera compile: kernels compiled by the TPU compiler, for each generation,
or by Triton for GPUs

USAGE:
    tessera compile KERNEL|PRESET|presets|kernels|all [--tpu G[,G..]|all] [--config KEY=VALUE]... [--shape INPUT=DxDx..]... [--out PATH]
    tessera compile --module FILE [--tpu G[,G..]|all]
    tessera compile KERNEL|PRESET|presets|kernels|all --gpu T[,T..]|all [--warps N] [--stages N] [--config ..] [--shape ..] [--out DIR]

Lowers the kernel to its tpu_custom_call module and compiles that with libtpu
(the TPU compiler from PyPI, which .ci/setup.sh fetches) against a
compile-only topology of each generation: Mosaic and the TPU back end run as
on a TPU host, nothing runs. The kernel is verified again for each
generation first (its VMEM and rules). Prints, per generation, ok with the
compile time, code size and the compiler's HBM memory stats, or the
compiler's error: the kernel source line of the offending op first, then the
Mosaic op, then the whole message. It proves a kernel compiles, not how fast
it runs.

KERNEL is a catalog kernel or a preset (`tessera list`), or a FILE.kir
kernel file (a kernel with a mesh compiles as one partition per device); `presets` compiles
every preset, `kernels` every catalog kernel at its defaults, `all` both.

With --module, compiles a whole StableHLO module instead (a JAX program
exported with platforms=[\"tpu\"] that calls a `tessera export` artifact).

With --gpu, lowers the kernel to its Triton program (`tessera lower --target
triton`) and compiles it with Triton (from PyPI, which .ci/setup.sh installs)
for each GPU target, in a child process, no GPU needed. Prints, per target,
ok with the compile time, registers per thread (VGPRs on AMD), bytes spilled,
shared memory, code size and the tensor-core instructions in the final code
(HGMMA/HMMA/IMMA on NVIDIA, MFMA on AMD), or Triton's error at the kernel's
Rust line, or the [gpu] rule the kernel breaks (REFUSED).

OPTIONS:
    --tpu G               v5e, v6e, v5p, v7x, a comma list, or all   [default: all]
    --gpu T               sm_80, sm_90, sm_100 (NVIDIA), gfx942, gfx950 (AMD), a
                          comma list, or all
    --warps N, --stages N the Triton launch with --gpu [default: 4 warps, or 8
                          for dots of 128 x 128 and more; 3 stages]
    --config, --shape     as for `tessera lower` (one kernel only)
    --out PATH            write the serialized executables (ahead-of-time
                          artifacts a TPU host with the same libtpu loads): PATH
                          is the file for one kernel on one generation, else a
                          directory receiving KERNEL.GEN.tpu-executable; with
                          --gpu, a directory receiving KERNEL/KERNEL_kernel.py
                          and KERNEL/TARGET/kernel.{ttir,ttgir,llir,ptx,cubin,
                          sass | amdgcn,hsaco}, written only if all compile

ENVIRONMENT:
    TESSERA_LIBTPU        the libtpu.so to use [default: the set-up's cache]
    TESSERA_TRITON_PYTHON the Python with Triton [default: the set-up's cache]
    TESSERA_PLUGIN_LOG=1  show libtpu's own logging

Exit status 1 if any compile fails.
";

const HELP_RUN: &str = "\
tessera run: run a kernel on .npy inputs

USAGE:
    tessera run KERNEL --input NAME=FILE.npy... --out DIR [--config KEY=VALUE]... [--backend B]
    tessera run FILE.kir --input NAME=FILE.npy... --out DIR [--backend B] [--seed N]

KERNEL is a catalog kernel; FILE.kir a kernel file in the printed IR form, run
at the shapes its text fixes. A kernel file with a mesh runs on every device of
it (interp: the checking interpreter of N devices, in interleaving --seed N;
pjrt: its SPMD program on as many PJRT CPU devices): each input file holds every
device's shard stacked along a new leading axis, and so does each output.

OPTIONS:
    --input NAME=FILE     one per kernel input (`tessera list` names them); the
                          shapes of the files decide the kernel's shapes
    --out DIR             where the outputs go: DIR/<output>.npy, or with
                          --backend all, DIR/<backend>/<output>.npy
    --config KEY=VALUE    a config parameter (repeatable)
    --backend B           interp | jit | pjrt (decomposed StableHLO on the PJRT CPU
                          plugin; also pjrt-decomposed) | pjrt-ffi (the native kernel
                          inside an XLA program) | triton-interp (the kernel's Triton
                          program, the one `compile --gpu` compiles, under Triton's
                          interpreter) | all      [default: jit]
    --max-memory SIZE     the most host memory the kernel's arrays may take
                          (bytes, or with K, M, G, T) [default: a quarter of
                          this machine's memory]
    --max-work N          the most element-ops a run may do (grid steps x loop
                          trips x each op's elements) [default: 2^34]
    --timeout SECS        how long Triton's interpreter may run the kernel
                          (triton-interp) before it is killed [default: 600]

FILES:
    .npy files of float32, float16, int32, int8 or bool, C order. NumPy has no
    bfloat16: bf16 outputs are written as float32 (exactly), and a float32 file
    given to a bf16 input is rounded to bf16 (to nearest, ties to even).
    Scalar-prefetch inputs (lengths, block tables) are int32.
";

const HELP_MASKED: &str = "\
tessera masked: attention with any mask on .npy inputs

USAGE:
    tessera masked --mask SPEC[;SPEC..] --input q=Q.npy --input k=K.npy --input v=V.npy
                   [--input q_seg=S.npy --input kv_seg=S.npy] [--block-q N] [--block-k N]
                   [--softcap C] [--backend B] [--cost] --out DIR

The mask is described, preprocessed into block tables (empty, partial and full
steps; the block a skipped step names; deduplicated partial masks) and run by the
table-driven kernel (kernels::attention::masked). SPEC is full, causal[:OFFSET],
local:LEFT:RIGHT (`-` for an open side), chunked:CHUNK or prefix:LEN, combined with
& and | left to right; one for every head or one per head, `;`-separated.

OPTIONS:
    --input q, k, v       q [b, h, sq, d], k and v [b, hkv, skv, d] (float32)
    --input q_seg, kv_seg segment ids (int32, [b, sq] and [b, skv]): a query sees only
                          keys of its own segment (packed sequences); default all 0
    --block-q, --block-k  block sizes of the tables and the kernel [default: 128]
    --backend B           interp | jit | pjrt | pjrt-ffi              [default: jit]
    --cost                also print the HBM bytes its pipeline moves, as JSON
    --out DIR             where o.npy and lse.npy ([b, h, sq, 1]) go
";

const HELP_DIFF: &str = "\
tessera diff: how two back ends differ on one input

USAGE:
    tessera diff KERNEL --input NAME=FILE.npy... --backends A,B [--config KEY=VALUE]... [--first N]

OPTIONS:
    --backends A,B        two of: interp, jit, pjrt (pjrt-decomposed), pjrt-ffi,
                          triton-interp, reference (the f64 host reference)
    --input, --config     as for `tessera run`
    --first N             how many differing elements to list [default: 10]
    --max-memory SIZE     the most host memory the kernel's arrays may take
                          (bytes, or with K, M, G, T) [default: a quarter of
                          this machine's memory]
    --max-work N          the most element-ops a run may do (grid steps x loop
                          trips x each op's elements) [default: 2^34]
    --timeout SECS        how long Triton's interpreter may run the kernel
                          (triton-interp) before it is killed [default: 600]

For each output: the largest absolute and relative difference, NaN counts,
how many elements differ, a histogram of the distance in units in the last
place of the output dtype (0, 1, 2, 3-4, 5-8, ...), and the first differing
elements with their indices.
";

const HELP_BENCH: &str = "\
tessera bench: benchmarks with their baselines, measured in one run

USAGE:
    tessera bench [KERNEL] [--max-s N] [--max-bwd-s N] [--budget SECS] [--rounds N] [--json] [--svg FILE]

KERNEL picks one group: matmul (1024^3 f32, native JIT vs XLA dot_general),
flash_attention (forward, B=1 H=8 D=128, S=1024..max-s, causal and not:
native JIT and decomposed StableHLO vs XLA's unfused graph),
flash_attention_bwd (the backward kernels vs XLA's unfused backward), or
masked_attention (the same forward and backward workloads as masks, causal
or full, through the table-driven kernels beside the band kernels, native
JIT at the same blocks; the table ends with their time ratios).
Default: all but masked_attention. Each measurement runs in its own process; time is the median
of repeated runs, peak memory the resident-set growth of the first run. The methods of a
workload take turns over --rounds rounds (the order rotating), so that a change in the
machine's speed during the run (a busy neighbour on a shared host) falls on all of them;
a method's time is the median of its rounds.

OPTIONS:
    --max-s N             largest forward sequence length [default: 8192]
    --max-bwd-s N         largest backward sequence length [default: 4096]
    --budget SECS         seconds of timed runs per measurement, split over the
                          rounds [default: 3]
    --rounds N            interleaved rounds per workload [default: 3]
    --json                print JSON instead of the table
    --svg FILE            also write a chart of attention time and peak memory
                          against sequence length, fused vs unfused
";

const HELP_EXPORT: &str = "\
tessera export: a kernel as an artifact JAX (and TorchTPU) programs call

USAGE:
    tessera export KERNEL|PRESET [--config KEY=VALUE]... [--shape INPUT=DxDx..]... [--bucket AXIS=N,N..] [--gpu] --out DIR

Writes DIR/module.mlir, one StableHLO module for platforms cpu (the
decomposed StableHLO, pure XLA) and tpu (the tpu_custom_call), and with
--gpu also cuda and rocm (the kernel's Triton program called through XLA's
GPU custom call __gpu$xla.gpu.triton, its TTIR made by Triton, which must
be installed: .ci/setup.sh), in
jax.export's multi-platform convention (the platform index first), and
DIR/manifest.json (inputs and outputs with dtypes and shapes); for kernels
with backward kernels (flash attention, rms_norm, layer_norm) also DIR/vjp/,
the VJP in jax.export's convention. --bucket writes one artifact per size of
an axis (every input whose axis matches the first input's), DIR/AXIS_N/,
and DIR/buckets.json. python (package tessera-jax) loads them
(load, load_family) as jax.export.Exported objects.
";

const HELP_NUMERICS: &str = "\
tessera numerics: where an FP8 GEMM's numerics drift

USAGE:
    tessera numerics [--k K,K,..] [--m M] [--n N] [--backend B] [--seed S]

Runs the library's FP8 GEMM (e4m3fn inputs uniform in -8..8, unit scales,
f32 output) at each depth in three accumulation schemes: the running sum
in f32, rounded to bf16 after every k step, and split-K of 4 (four f32
partial GEMMs summed in f32); prints each one's error against the f64
reference as a Markdown table.

OPTIONS:
    --k K,K,..            depths, multiples of 512 [default: 1024,4096,16384]
    --m M, --n N          output shape [default: 128 x 128]
    --backend B           interp, jit, pjrt or pjrt-ffi [default: jit]
    --seed S              input seed [default: 7]
";

/// Why a command failed.
pub enum Failure {
    /// A bad invocation: exit status 2.
    Usage(String),
    /// The work itself failed: exit status 1.
    Run(String),
    /// libtpu ended a compile's child process (an abort, or killed for
    /// memory): exit status 3, distinct from a compile error.
    CompilerAborted(String),
}

/// Exit status when libtpu aborted a compile (its child process).
const EXIT_COMPILER_ABORTED: u8 = 3;

/// A usage error.
pub fn usage(m: String) -> Failure {
    Failure::Usage(m)
}

/// Exit status of an internal error: a panic that reached `main` (a
/// Tessera bug; the tests fail if it is ever seen).
const EXIT_INTERNAL: u8 = 70;

fn main() -> ExitCode {
    // Arguments are UTF-8 or a usage error, never a panic.
    let mut args = Vec::new();
    for (i, a) in std::env::args_os().skip(1).enumerate() {
        match a.into_string() {
            Ok(s) => args.push(s),
            Err(raw) => {
                eprintln!(
                    "tessera: argument {} ({}) is not valid UTF-8; paths and values must be UTF-8",
                    i + 1,
                    raw.to_string_lossy()
                );
                return ExitCode::from(2);
            }
        }
    }
    // A panic is reported as one line with exit status 70, not a trace;
    // failing to print (a closed pipe, a full disk) is a clean stop.
    let panic_info = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let slot = panic_info.clone();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        if let Ok(mut s) = slot.lock() {
            *s = Some(format!("{msg}{at}"));
        }
    }));
    match std::panic::catch_unwind(|| run(&args)) {
        Ok(code) => code,
        Err(_) => {
            let msg = panic_info
                .lock()
                .ok()
                .and_then(|m| m.clone())
                .unwrap_or_else(|| "panic".into());
            let cmd = args.first().map(String::as_str).unwrap_or("");
            if msg.contains("failed printing to stdout") {
                if msg.contains("Broken pipe") {
                    // The reader stopped reading (`tessera list | head`).
                    return ExitCode::SUCCESS;
                }
                let why = msg.rsplit_once(" at ").map_or(msg.as_str(), |(m, _)| m);
                let why = why.trim_start_matches("failed printing to stdout: ");
                eprintln!("tessera {cmd}: cannot write to standard output: {why}");
                return ExitCode::FAILURE;
            }
            eprintln!("tessera {cmd}: internal error (a Tessera bug, please report it): {msg}");
            ExitCode::from(EXIT_INTERNAL)
        }
    }
}

fn run(args: &[String]) -> ExitCode {
    // Benchmark measurements re-run this binary in a child process.
    if let Some(code) = tooling::bench::child_main(args) {
        return code;
    }
    let Some(cmd) = args.first().map(String::as_str) else {
        print!("{HELP}");
        return ExitCode::from(2);
    };
    let rest = &args[1..];
    let help = |text: &str| {
        print!("{text}");
        ExitCode::SUCCESS
    };
    if cmd == "tpu-child" {
        // One profiled libtpu compile, started by `tessera estimate`.
        return tpu_child::tpu_child(rest);
    }
    if cmd == "train" {
        // Its own help and exit codes (0 also when SIGTERM stopped it).
        return ExitCode::from(tooling::train::cli(rest) as u8);
    }
    if rest.iter().any(|a| a == "--help" || a == "-h") {
        return match cmd {
            "demo" => help(HELP_DEMO),
            "list" => help(HELP_LIST),
            "lower" => help(HELP_LOWER),
            "export" => help(HELP_EXPORT),
            "compile" => help(HELP_COMPILE),
            "run" => help(HELP_RUN),
            "diff" => help(HELP_DIFF),
            "bench" => help(HELP_BENCH),
            "numerics" => help(HELP_NUMERICS),
            "cost" => help(HELP_COST),
            "masked" => help(HELP_MASKED),
            "estimate" => help(HELP_ESTIMATE),
            "tune" => help(HELP_TUNE),
            "profile" => help(HELP_PROFILE),
            "cases" => help(cases::HELP),
            "help" => help(HELP),
            other => {
                eprintln!("tessera: unknown command `{other}`; see `tessera --help`");
                ExitCode::from(2)
            }
        };
    }
    // A malformed TESSERA_HOST_TUNING is a bad invocation, said before any
    // work (the JIT would report it at its first compile, as a run failure).
    if let Ok(v) = std::env::var(lowering::TUNING_ENV) {
        let v = v.trim();
        if !v.is_empty()
            && v != "default"
            && let Err(e) =
                lowering::DotTilings::parse_setting(v, lowering::CpuIdentity::host().registers)
        {
            eprintln!(
                "tessera {cmd}: {}",
                lowering::TilingError::Setting(Box::new(e))
            );
            return ExitCode::from(2);
        }
    }
    let result = match cmd {
        "--help" | "-h" | "help" => return help(HELP),
        "demo" if rest.is_empty() => return demo::demo(),
        "demo" => Err(usage(format!(
            "`tessera demo` takes no arguments, got `{}`",
            rest.join(" ")
        ))),
        "list" => lower::list(rest),
        "lower" => lower::lower(rest),
        "export" => lower::export(rest),
        "compile" => compile::compile(rest),
        "run" => run::run(rest),
        "diff" => run::diff(rest),
        "bench" => bench::bench(rest),
        "numerics" => numerics::numerics(rest),
        "cost" => cost::cost_cmd(rest),
        "masked" => masked::masked(rest),
        "estimate" => estimate::estimate(rest),
        "tune" => tune::tune(rest),
        "profile" => profile::profile(rest),
        "cases" => cases::cases(rest),
        other => Err(usage(format!(
            "unknown command `{other}`; see `tessera --help`"
        ))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(m)) => {
            eprintln!("tessera {cmd}: {}", one_line(&m));
            ExitCode::from(2)
        }
        Err(Failure::Run(m)) => {
            eprintln!("tessera {cmd}: {}", one_line(&m));
            ExitCode::FAILURE
        }
        Err(Failure::CompilerAborted(m)) => {
            eprintln!("tessera {cmd}: {}", one_line(&m));
            ExitCode::from(EXIT_COMPILER_ABORTED)
        }
    }
}

/// A failure as one line: the first of several errors (the verifier
/// reports every operand that breaks a rule, usually the same rule), with
/// how many more there are.
fn one_line(m: &str) -> String {
    let lines: Vec<&str> = m.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let first = lines
        .first()
        .map(|l| l.strip_prefix("error: ").unwrap_or(l))
        .unwrap_or("");
    match lines.len() {
        0 | 1 => first.to_string(),
        2 => format!("{first} (and 1 more error)"),
        n => format!("{first} (and {} more errors)", n - 1),
    }
}
