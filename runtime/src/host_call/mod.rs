//! Tessera kernels inside XLA programs on the CPU.
//!
//! A kernel compiled with [`lowering::HostKernel`] is registered here under
//! a key; [`host_call_module`] returns a StableHLO module that calls it as
//! `stablehlo.custom_call @tessera_host_kernel` (typed FFI, `api_version =
//! 4`, `backend_config = {kernel = "<key>"}`), and the typed XLA FFI
//! handler this module registers with the plugin for platform `Host` runs
//! it when XLA executes the call.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let kernel: kernel_ir::VerifiedKernel = unimplemented!();
//! # let inputs: Vec<kernel_ir::Array> = Vec::new();
//! use runtime::pjrt::{Client, CompileOptions};
//! let client = Client::cpu(1)?;
//! let module = runtime::host_call::host_call_module(client.plugin(), &kernel)?;
//! let exe = client.compile(module.as_bytes(), &CompileOptions::default())?;
//! let args: Vec<_> = inputs.iter().map(|a| client.upload(a, 0)).collect::<Result<_, _>>()?;
//! let outputs = exe.execute(&args.iter().collect::<Vec<_>>())?;
//! # Ok(()) }
//! ```

mod sys;

use std::collections::HashMap;
use std::ffi::{CString, c_int, c_void};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use kernel_ir::{DType, VerifiedKernel};
use lowering::{HOST_CALL_TARGET, HostKernel, LoweringError};

use crate::pjrt::{PjrtError, Plugin};

/// The XLA platform name of the CPU plugin, under which the handler is
/// registered.
pub const HOST_PLATFORM: &str = "Host";

/// Errors of host kernel calls.
#[derive(Debug, thiserror::Error)]
pub enum HostCallError {
    /// Compiling or lowering the kernel failed.
    #[error(transparent)]
    Lowering(#[from] LoweringError),
    /// Registering the handler with the plugin failed.
    #[error(transparent)]
    Pjrt(#[from] PjrtError),
}

fn registry() -> &'static RwLock<HashMap<String, Arc<HostKernel>>> {
    static R: OnceLock<RwLock<HashMap<String, Arc<HostKernel>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// The key a kernel is registered under: its name and the SHA-256 of its
/// printed IR, so two different kernels never share a key, one kernel is
/// compiled once per process, and the key is the same in every process (a
/// cached executable that calls it stays valid).
pub fn kernel_key(kernel: &VerifiedKernel) -> String {
    format!("{}-{}", kernel.name, &kernel.digest()[..16])
}

/// Compiles `kernel` for the host (once per process) and registers it for
/// the FFI handler; returns its key.
pub fn register_kernel(kernel: &VerifiedKernel) -> Result<String, HostCallError> {
    let key = kernel_key(kernel);
    if registry()
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .contains_key(&key)
    {
        return Ok(key);
    }
    let compiled = Arc::new(HostKernel::compile(kernel)?);
    registry()
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .entry(key.clone())
        .or_insert(compiled);
    Ok(key)
}

/// The compiled kernel registered under `key`.
pub fn registered(key: &str) -> Option<Arc<HostKernel>> {
    registry()
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(key)
        .cloned()
}

/// Registers the host-kernel FFI handler with `plugin` (once per plugin).
pub fn install_handler(plugin: &Plugin) -> Result<(), PjrtError> {
    static DONE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
    if done.contains(&plugin.path) {
        return Ok(());
    }
    let f: sys::Handler = handler;
    plugin.register_ffi_handler(HOST_CALL_TARGET, HOST_PLATFORM, f as *const c_void)?;
    done.push(plugin.path.clone());
    Ok(())
}

/// A StableHLO module whose `main` runs `kernel` natively through the FFI
/// handler, after installing the handler with `plugin` and registering the
/// kernel. Arguments and results are those of [`kernel_ir::interpret`].
pub fn host_call_module(plugin: &Plugin, kernel: &VerifiedKernel) -> Result<String, HostCallError> {
    install_handler(plugin)?;
    let key = register_kernel(kernel)?;
    Ok(lowering::host_custom_call(kernel, &key)?)
}

fn ffi_dtype(d: DType) -> c_int {
    match d {
        DType::F32 => sys::DTYPE_F32,
        DType::BF16 => sys::DTYPE_BF16,
        DType::F16 => sys::DTYPE_F16,
        DType::I32 => sys::DTYPE_S32,
        DType::I8 => sys::DTYPE_S8,
        DType::Bool => sys::DTYPE_PRED,
        DType::F8E4M3FN => sys::DTYPE_F8E4M3FN,
        DType::F8E5M2 => sys::DTYPE_F8E5M2,
    }
}

/// The dtype of an XLA FFI type code, if Tessera has one.
fn dtype_of_ffi(code: c_int) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| ffi_dtype(d) == code)
}

/// A failed call: the code and message XLA reports.
struct CallError(c_int, String);

/// The typed FFI handler XLA calls for `@tessera_host_kernel`.
///
/// # Safety
/// Called by XLA with a valid call frame.
unsafe extern "C" fn handler(frame: *mut sys::CallFrame) -> *mut c_void {
    // Nothing may unwind into XLA.
    let result = std::panic::catch_unwind(|| {
        // SAFETY: XLA passes a valid frame for the duration of the call.
        unsafe { handle(frame) }
    });
    let err = match result {
        Ok(Ok(())) => return std::ptr::null_mut(),
        Ok(Err(e)) => e,
        Err(_) => CallError(
            sys::ERROR_INTERNAL,
            "the Tessera host kernel handler panicked (a Tessera bug)".into(),
        ),
    };
    // SAFETY: the frame and its API table are valid during the call.
    unsafe { make_error(frame, err) }
}

/// An `XLA_FFI_Error` for `err`, made by XLA's own constructor.
unsafe fn make_error(frame: *mut sys::CallFrame, err: CallError) -> *mut c_void {
    // SAFETY: valid per the caller.
    let api = unsafe { (*frame).api };
    let message = CString::new(err.1.replace('\0', " ")).unwrap_or_default();
    // SAFETY: the API table is valid; XLA copies the message.
    unsafe {
        match api.as_ref().and_then(|a| a.error_create) {
            Some(create) => {
                let mut args = sys::ErrorCreateArgs {
                    struct_size: std::mem::size_of::<sys::ErrorCreateArgs>(),
                    extension_start: std::ptr::null_mut(),
                    message: message.as_ptr(),
                    errc: err.0,
                };
                create(&mut args)
            }
            None => std::ptr::null_mut(),
        }
    }
}

/// # Safety
/// `frame` is a valid call frame.
unsafe fn handle(frame: *mut sys::CallFrame) -> Result<(), CallError> {
    // SAFETY: valid per the caller.
    let f = unsafe { &*frame };
    // Registration asks for the handler's metadata first.
    if !f.extension_start.is_null() {
        // SAFETY: a non-null extension chain of the frame.
        let ext = unsafe { &*f.extension_start };
        if ext.kind == sys::EXTENSION_METADATA {
            // SAFETY: an extension of this kind is a metadata extension.
            let meta = unsafe { &*(f.extension_start as *const sys::MetadataExtension) };
            if !meta.metadata.is_null() {
                // SAFETY: XLA owns the metadata struct for this call.
                let m = unsafe { &mut *meta.metadata };
                m.api_version = sys::ApiVersion {
                    struct_size: std::mem::size_of::<sys::ApiVersion>(),
                    extension_start: std::ptr::null_mut(),
                    major: sys::API_MAJOR,
                    minor: sys::API_MINOR,
                };
                m.traits = 0;
            }
            return Ok(());
        }
    }
    let key = kernel_attr(f)?;
    let kernel = registered(&key).ok_or_else(|| {
        CallError(
            sys::ERROR_NOT_FOUND,
            format!(
                "no Tessera host kernel is registered as `{key}` in this process; \
                 build the module with runtime::host_call::host_call_module in the process that runs it"
            ),
        )
    })?;
    let k = kernel.kernel();
    // SAFETY: the frame's args and rets are valid for the call.
    let (args, arg_types) = unsafe { buffers(&f.args, sys::ARG_BUFFER, "argument") }?;
    // SAFETY: as above.
    let (rets, ret_types) = unsafe { buffers(&f.rets, sys::RET_BUFFER, "result") }?;
    // The one argument check every path makes, on XLA's view of the call.
    let bad = |e: kernel_ir::ArgumentError| CallError(sys::ERROR_INVALID_ARGUMENT, e.to_string());
    k.check_arguments(arg_types.iter().map(|(d, s)| (*d, s.as_slice())))
        .map_err(bad)?;
    k.check_results(ret_types.iter().map(|(d, s)| (*d, s.as_slice())))
        .map_err(bad)?;
    let np = k.prefetch.len();
    let prefetch: Vec<*const u8> = args[..np].iter().map(|&p| p as *const u8).collect();
    let inputs: Vec<*const u8> = args[np..].iter().map(|&p| p as *const u8).collect();
    // SAFETY: XLA's buffers have the checked shapes and dtypes; results
    // do not alias arguments except an in-out operand's, which may.
    unsafe { kernel.run_raw(&prefetch, &inputs, &rets) }
        .map_err(|e| CallError(sys::ERROR_INVALID_ARGUMENT, e.to_string()))
}

/// The `kernel` string attribute of the call.
fn kernel_attr(f: &sys::CallFrame) -> Result<String, CallError> {
    let a = &f.attrs;
    for i in 0..a.size.max(0) as usize {
        // SAFETY: `names`, `types` and `attrs` have `size` entries.
        let (name, ty, value) = unsafe { (&**a.names.add(i), *a.types.add(i), *a.attrs.add(i)) };
        // SAFETY: a byte span XLA owns for the call.
        let name = unsafe { std::slice::from_raw_parts(name.ptr as *const u8, name.len) };
        if name == b"kernel" && ty == sys::ATTR_STRING {
            // SAFETY: a string attribute is a byte span.
            let span = unsafe { &*(value as *const sys::ByteSpan) };
            // SAFETY: as above.
            let bytes = unsafe { std::slice::from_raw_parts(span.ptr as *const u8, span.len) };
            return Ok(String::from_utf8_lossy(bytes).into_owned());
        }
    }
    Err(CallError(
        sys::ERROR_INVALID_ARGUMENT,
        format!(
            "`@{HOST_CALL_TARGET}` needs backend_config = {{kernel = \"<key>\"}}; \
             use runtime::host_call::host_call_module to build the call"
        ),
    ))
}

/// Data pointers of the call's buffers, with each buffer's dtype (`None`
/// for a type Tessera has no name for) and dims, for
/// [`kernel_ir::Kernel::check_arguments`].
///
/// # Safety
/// `list` is a valid argument or result list of a call frame.
#[allow(clippy::type_complexity)]
unsafe fn buffers(
    list: &sys::Args,
    kind: c_int,
    what: &str,
) -> Result<(Vec<*mut u8>, Vec<(Option<DType>, Vec<usize>)>), CallError> {
    let n = usize::try_from(list.size).unwrap_or(0);
    let mut ptrs = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: `types` and `args` have `size` entries.
        let (ty, ptr) = unsafe { (*list.types.add(i), *list.args.add(i)) };
        if ty != kind {
            return Err(CallError(
                sys::ERROR_INVALID_ARGUMENT,
                format!("{what} {i} is not a buffer"),
            ));
        }
        // SAFETY: a buffer entry points at an XLA_FFI_Buffer.
        let b = unsafe { &*(ptr as *const sys::Buffer) };
        let dims: &[i64] = if b.rank <= 0 {
            &[]
        } else {
            // SAFETY: `dims` has `rank` entries.
            unsafe { std::slice::from_raw_parts(b.dims, b.rank as usize) }
        };
        // A negative dim fits no kernel: usize::MAX mismatches every shape.
        let dims = dims
            .iter()
            .map(|&d| usize::try_from(d).unwrap_or(usize::MAX))
            .collect();
        types.push((dtype_of_ffi(b.dtype), dims));
        ptrs.push(b.data as *mut u8);
    }
    Ok((ptrs, types))
}
