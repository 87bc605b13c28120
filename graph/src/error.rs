//! The graph runtime's errors: what failed, where the user recorded it,
//! and its cause, typed ([`Cause`]: PJRT, the compile cache, a host call,
//! or a message).

/// Errors of the graph runtime.
#[derive(Clone, Debug, thiserror::Error)]
pub enum RuntimeError {
    /// An op was recorded with inputs it cannot take; `loc` is the call.
    #[error("{loc}: {message}")]
    Record {
        /// What is wrong and how to fix it.
        message: String,
        /// `file:line:col` of the recording call.
        loc: String,
    },
    /// A kernel call was recorded with arrays that do not fit the kernel
    /// (the shared [`kernel_ir::Kernel::check_arguments`]); `loc` is the
    /// call.
    #[error("{loc}: {error}")]
    Arguments {
        /// What does not fit.
        error: Box<kernel_ir::ArgumentError>,
        /// `file:line:col` of the recording call.
        loc: String,
    },
    /// Materializing a node failed (lowering, compile or execution); stored
    /// in every node it affects and reported at each sync that reads them.
    #[error("{what}: {cause}{}", recorded_at.as_ref().map(|l| format!(" (recorded at {l})")).unwrap_or_default())]
    Failed {
        /// What failed (`compiling the graph`, `kernel `rope``, ...).
        what: String,
        /// Why.
        cause: Box<Cause>,
        /// Where the op whose value failed was recorded, once known.
        recorded_at: Option<String>,
    },
    /// Setting up the runtime failed (plugin, client, cache directory).
    #[error("{what}: {cause}")]
    Setup {
        /// The step that failed.
        what: &'static str,
        /// Why.
        cause: Box<Cause>,
    },
    /// A Tessera bug.
    #[error("internal runtime error (a Tessera bug, please report it): {0}")]
    Internal(String),
}

/// What a runtime failure came from, kept typed so callers can tell a PJRT
/// error from a lowering one without reading the message.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Cause {
    /// The PJRT plugin (compile, transfer, execute).
    #[error(transparent)]
    Pjrt(#[from] runtime::pjrt::PjrtError),
    /// Lowering a kernel call.
    #[error(transparent)]
    Lowering(#[from] lowering::LoweringError),
    /// Building or verifying a kernel.
    #[error(transparent)]
    Kernel(#[from] kernel_ir::KernelErrors),
    /// Finding or loading the plugin.
    #[error(transparent)]
    Plugin(#[from] runtime::plugin::PluginError),
    /// Triton: a kernel call's Triton program for a GPU platform (no
    /// Triton, a program it rejects).
    #[error(transparent)]
    Triton(std::sync::Arc<runtime::triton::TritonError>),
    /// The compile cache's disk tier (its directory, a key's lock).
    #[error(transparent)]
    Cache(#[from] runtime::cache::DiskError),
    /// Anything else, said in words (the OS).
    #[error("{0}")]
    Other(String),
}

impl From<runtime::triton::TritonError> for Cause {
    fn from(e: runtime::triton::TritonError) -> Self {
        Cause::Triton(std::sync::Arc::new(e))
    }
}

impl RuntimeError {
    /// A materialization failure of `what` because of `cause`.
    pub fn failed(what: impl Into<String>, cause: impl Into<Cause>) -> RuntimeError {
        RuntimeError::Failed {
            what: what.into(),
            cause: Box::new(cause.into()),
            recorded_at: None,
        }
    }
}

impl From<runtime::cache::CacheError> for Cause {
    fn from(e: runtime::cache::CacheError) -> Self {
        match e {
            runtime::cache::CacheError::Compile(e) => Cause::Pjrt(e),
            runtime::cache::CacheError::Disk(e) => Cause::Cache(e),
        }
    }
}

impl From<runtime::host_call::HostCallError> for Cause {
    fn from(e: runtime::host_call::HostCallError) -> Self {
        match e {
            runtime::host_call::HostCallError::Lowering(e) => Cause::Lowering(e),
            runtime::host_call::HostCallError::Pjrt(e) => Cause::Pjrt(e),
        }
    }
}

/// A `map_err` for set-up step `what`.
pub(super) fn setup<E: Into<Cause>>(what: &'static str) -> impl FnOnce(E) -> RuntimeError {
    move |e| RuntimeError::Setup {
        what,
        cause: Box::new(e.into()),
    }
}

impl From<String> for Cause {
    fn from(s: String) -> Self {
        Cause::Other(s)
    }
}

/// The graph's program could not be built (a Tessera bug unless a kernel
/// call's form refuses the kernel).
impl From<lowering::LoweringError> for RuntimeError {
    fn from(e: lowering::LoweringError) -> Self {
        RuntimeError::failed("building the graph's program", e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A compile the plugin refused keeps its PJRT cause through the
    /// cache: callers match `Cause::Pjrt`, not a message.
    #[test]
    fn a_refused_compile_is_a_pjrt_cause() {
        let refused = runtime::pjrt::PjrtError::Plugin {
            what: "compile",
            message: "nonsense".into(),
            code: 3,
        };
        let cause = Cause::from(runtime::cache::CacheError::Compile(refused));
        assert!(matches!(cause, Cause::Pjrt(_)), "{cause:?}");
        let e = RuntimeError::failed("compiling the graph", cause);
        assert!(e.to_string().contains("nonsense"), "{e}");
    }
}
