//! From the host kernel module to machine code: the upstream lowering
//! pipeline, a check that only the LLVM dialect is left, and MLIR's
//! ExecutionEngine.

use std::ffi::c_void;

use melior::ir::operation::OperationLike;
use melior::ir::{BlockLike, Module, OperationRef, RegionLike};
use mlir_sys::MlirExecutionEngine;

use crate::LoweringError;
use crate::mlir::Mlir;

/// The passes that take the host module (func, scf, vector, memref, arith,
/// math) to the LLVM dialect. Math ops without an LLVM intrinsic (erf, tanh,
/// …) become libm calls, which the engine resolves in the process; bf16
/// conversions are expanded to integer ops because LLVM's x86 back end
/// would otherwise call a compiler-rt helper the process may not have.
pub(crate) const PIPELINE: &str = concat!(
    "builtin.module(",
    "convert-vector-to-scf,",
    "convert-scf-to-cf,",
    "arith-expand{include-bf16=true},",
    // Math before vectors: libm calls on vectors unroll into vector
    // extracts and inserts, which the vector conversion then lowers.
    "convert-math-to-llvm,",
    "convert-math-to-libm,",
    "convert-vector-to-llvm,",
    "expand-strided-metadata,",
    "finalize-memref-to-llvm,",
    "convert-arith-to-llvm,",
    "convert-index-to-llvm,",
    "convert-func-to-llvm,",
    "convert-cf-to-llvm,",
    "reconcile-unrealized-casts)"
);

/// Runs [`PIPELINE`] on `module`.
pub(crate) fn lower_to_llvm(m: &Mlir, module: &mut Module) -> Result<(), LoweringError> {
    melior::utility::register_all_passes();
    let pm = melior::pass::PassManager::new(&m.ctx);
    melior::utility::parse_pass_pipeline(pm.as_operation_pass_manager(), PIPELINE)
        .map_err(|e| LoweringError::Internal(format!("host pass pipeline: {e}")))?;
    m.clear_diagnostics();
    pm.run(module).map_err(|_| LoweringError::Mlir {
        what: "host kernel module (lowering to LLVM)",
        message: m.diagnostics(),
    })
}

/// Calls `f` on every op of `module`, nested ones included, in order.
fn for_each_op(module: &Module, f: &mut impl FnMut(OperationRef)) {
    fn walk(op: OperationRef, f: &mut impl FnMut(OperationRef)) {
        f(op);
        for region in op.regions() {
            let mut block = region.first_block();
            while let Some(b) = block {
                let mut next = b.first_operation();
                while let Some(o) = next {
                    walk(o, f);
                    next = o.next_in_block();
                }
                block = b.next_in_region();
            }
        }
    }
    walk(module.as_operation(), f);
}

/// Ops outside the LLVM dialect (by name, first few), which the engine
/// would crash on instead of reporting.
pub(crate) fn non_llvm_ops(module: &Module) -> Vec<String> {
    let mut out = Vec::new();
    for_each_op(module, &mut |op| {
        let name = op
            .name()
            .as_string_ref()
            .as_str()
            .unwrap_or("?")
            .to_string();
        if !name.starts_with("llvm.") && name != "builtin.module" && !out.contains(&name) {
            out.push(name);
        }
    });
    out
}

/// LLVM ops past which the engine compiles at -O0: instruction selection
/// and scheduling grow faster than a block's size. The catalog's kernels
/// stay well below it (at most ~9,100 ops, median ~2,100).
const OPTIMIZED_OPS: usize = 1 << 15;

/// The level below [`OPTIMIZED_OPS`]: -O2, not -O3. -O3's extra passes
/// made no measured difference to the code (JIT time per call within 2 %
/// of -O3's, interleaved runs: the 1024³ matmul, flash attention forward
/// and backward at S = 1024–2048, causal or not, AVX-512 Xeon) but grow
/// badly with a long straight-line body: 1,000 chained f32[8, 128]
/// ops (24.5k LLVM ops) took 35 s to compile at -O3 and 2.3 s at -O2.
const OPTIMIZED_LEVEL: i32 = 2;

/// The optimization level of a module of `ops` LLVM ops.
fn opt_level(ops: usize) -> i32 {
    if ops > OPTIMIZED_OPS {
        0
    } else {
        OPTIMIZED_LEVEL
    }
}

/// The ops of `module`, nested ones included.
pub(crate) fn op_count(module: &Module) -> usize {
    let mut n = 0;
    for_each_op(module, &mut |_| n += 1);
    n
}

/// A packed entry point: one pointer per scalar of the lowered signature.
pub(crate) type PackedFn = unsafe extern "C" fn(*mut *mut c_void);

/// A JIT-compiled module and its entry point.
pub(crate) struct Engine {
    raw: MlirExecutionEngine,
    entry: PackedFn,
}

// SAFETY: the engine owns machine code and its own LLVM context; after
// construction it is only read (calls into the code, and its destruction).
// Nothing in it refers to the MLIR context it was built from.
unsafe impl Send for Engine {}
// SAFETY: see `Send`; calling the compiled code concurrently is sound
// because the code keeps no global state.
unsafe impl Sync for Engine {}

impl Engine {
    /// JIT-compiles an LLVM-dialect module and finds `_mlir_<entry>`.
    pub fn new(m: &Mlir, module: &Module, entry: &str) -> Result<Engine, LoweringError> {
        let left = non_llvm_ops(module);
        if !left.is_empty() {
            return Err(LoweringError::Internal(format!(
                "ops outside the LLVM dialect remain after the host pipeline: {}",
                left.join(", ")
            )));
        }
        melior::utility::register_all_llvm_translations(&m.ctx);
        m.clear_diagnostics();
        let raw = {
            // One engine is created at a time, so the jitdump cleanup after
            // it never races another engine's listener opening its file.
            // Only the creation: the listener has its file open once the
            // engine exists, and the compile itself (LLVM's passes and
            // code generation, at initialization and lookup below) runs
            // unlocked, so threads compile kernels side by side.
            let _creating = ENGINE_CREATION
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // SAFETY: the module is a valid, verified LLVM-dialect module;
            // no shared libraries are passed.
            let raw = unsafe {
                mlir_sys::mlirExecutionEngineCreate(
                    module.to_raw(),
                    opt_level(op_count(module)),
                    0,
                    std::ptr::null(),
                    false,
                    false,
                )
            };
            remove_jitdumps();
            raw
        };
        if raw.ptr.is_null() {
            return Err(LoweringError::Mlir {
                what: "host kernel (JIT compilation)",
                message: m.diagnostics(),
            });
        }
        // SAFETY: `raw` is a live engine.
        unsafe { mlir_sys::mlirExecutionEngineInitialize(raw) };
        let name = melior::StringRef::new(entry);
        // SAFETY: `raw` is live; the name outlives the call.
        let f = unsafe { mlir_sys::mlirExecutionEngineLookupPacked(raw, name.to_raw()) };
        if f.is_null() {
            // SAFETY: created above, destroyed once.
            unsafe { mlir_sys::mlirExecutionEngineDestroy(raw) };
            return Err(LoweringError::Internal(format!(
                "the JIT has no packed entry point for `{entry}`"
            )));
        }
        // SAFETY: MLIR generates `_mlir_<entry>` as `void(void**)`.
        let entry: PackedFn = unsafe { std::mem::transmute::<*mut c_void, PackedFn>(f) };
        Ok(Engine { raw, entry })
    }

    /// Calls the entry point.
    ///
    /// # Safety
    /// `args` must hold one valid pointer per scalar of the lowered
    /// signature, pointing at values of the right types, and every memref
    /// descriptor must describe memory valid for what the kernel touches.
    pub unsafe fn call(&self, args: &mut [*mut c_void]) {
        // SAFETY: upheld by the caller.
        unsafe { (self.entry)(args.as_mut_ptr()) }
    }
}

/// Held while an engine is created (see [`remove_jitdumps`]).
static ENGINE_CREATION: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// MLIR's C API creates every engine with LLVM's perf listener on (the
/// option is not exposed), which writes a jitdump of the generated code to
/// `$JITDUMPDIR` (else the temp dir) `/.debug/jit/llvm-IR-jit-*/jit-PID.dump`
/// and never removes it: every process that JIT-compiles a kernel would
/// leave tens of KB in /tmp forever. This process's dumps are unlinked
/// right after creation (the listener keeps writing to the open, unlinked
/// file, freed when the engine goes) and their folders removed.
///
/// `TESSERA_KEEP_JITDUMP=1` keeps them, for profiling the kernel's native
/// code: `perf record -k 1 …`, then `perf inject --jit` and `perf annotate`
/// find the generated instructions through the dump.
fn remove_jitdumps() {
    if std::env::var_os("TESSERA_KEEP_JITDUMP").is_some_and(|v| v == "1") {
        return;
    }
    let base = std::env::var_os("JITDUMPDIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let jit = base.join(".debug").join("jit");
    let Ok(entries) = std::fs::read_dir(&jit) else {
        return;
    };
    let ours = format!("jit-{}.dump", std::process::id());
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with("llvm-IR-jit-") {
            continue;
        }
        let dump = e.path().join(&ours);
        if std::fs::remove_file(&dump).is_ok() {
            // Only if empty: another process's files are never touched.
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        unsafe { mlir_sys::mlirExecutionEngineDestroy(self.raw) }
    }
}

#[cfg(test)]
mod opt_level_tests {
    use super::*;

    /// Large modules compile at -O0, the catalog's (≤ ~9,100 ops) at -O2.
    #[test]
    fn modules_past_the_threshold_compile_unoptimized() {
        assert_eq!(opt_level(9_100), 2);
        assert_eq!(opt_level(OPTIMIZED_OPS), 2);
        assert_eq!(opt_level(OPTIMIZED_OPS + 1), 0);
    }
}
