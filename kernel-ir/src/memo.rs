//! Kernels built once per process: every `#[tpu_kernel]`'s `build` looks
//! its arguments up here first, so a training step that calls the same
//! kernels as the step before builds and verifies none of them (the
//! verifier walks up to 65,536 grid steps; a step calls ~20 kernels).
//!
//! The key is the kernel function's path, its type arguments and the
//! `Debug` form of its config and dims: a builder is a pure function of
//! those. The cache holds at most [`CAPACITY`] kernels and starts over
//! when full, so a sweep over many shapes cannot grow it without bound.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use crate::VerifiedKernel;

/// The most kernels kept.
pub const CAPACITY: usize = 1024;

fn cache() -> &'static Mutex<HashMap<String, VerifiedKernel>> {
    static CACHE: OnceLock<Mutex<HashMap<String, VerifiedKernel>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

thread_local! {
    static BUILDS: Cell<u64> = const { Cell::new(0) };
    static VERIFICATIONS: Cell<u64> = const { Cell::new(0) };
}

/// The kernel cached under `key`, or `build`'s (cached when it verifies;
/// an error is returned and not kept). `build` runs without the cache
/// locked, so kernels build in parallel on several threads.
pub fn verified<E>(
    key: String,
    build: impl FnOnce() -> Result<VerifiedKernel, E>,
) -> Result<VerifiedKernel, E> {
    let lock = || {
        cache()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    if let Some(k) = lock().get(&key) {
        return Ok(k.clone());
    }
    BUILDS.with(|b| b.set(b.get() + 1));
    let k = build()?;
    let mut c = lock();
    if c.len() >= CAPACITY {
        c.clear();
    }
    c.insert(key, k.clone());
    Ok(k)
}

/// Kernels built (cache misses) on this thread so far: a caller measures
/// what a piece of its own work built by the difference.
pub fn builds_on_this_thread() -> u64 {
    BUILDS.with(Cell::get)
}

/// Kernels verified ([`crate::Kernel::verify`], cached or not) on this
/// thread so far.
pub fn verifications_on_this_thread() -> u64 {
    VERIFICATIONS.with(Cell::get)
}

pub(crate) fn count_verification() {
    VERIFICATIONS.with(|v| v.set(v.get() + 1));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, DimSemantics, KernelBuilder};

    fn tiny(name: &str) -> VerifiedKernel {
        let mut b = KernelBuilder::new(name);
        b.grid([1], [DimSemantics::Parallel]);
        let x = b.input("x", DType::F32, [8, 128]);
        let o = b.output("o", DType::F32, [8, 128]);
        o.store((.., ..), x.load((.., ..)));
        b.finish().unwrap().verify().unwrap()
    }

    #[test]
    fn a_key_builds_once_and_errors_are_not_kept() {
        let before = builds_on_this_thread();
        let a = verified::<()>("memo-test-a".into(), || Ok(tiny("a"))).unwrap();
        let again = verified::<()>("memo-test-a".into(), || panic!("built twice")).unwrap();
        assert_eq!(a, again);
        assert_eq!(builds_on_this_thread() - before, 1);
        assert!(verified("memo-test-b".into(), || Err::<VerifiedKernel, _>("no")).is_err());
        let b = verified::<()>("memo-test-b".into(), || Ok(tiny("b"))).unwrap();
        assert_eq!(b.name, "b");
        assert_eq!(builds_on_this_thread() - before, 3);
    }

    #[test]
    fn a_kernel_digest_is_its_printed_form_s() {
        let (a, a2, b) = (tiny("a"), tiny("a"), tiny("b"));
        assert_eq!(a.digest(), a2.digest(), "built twice, printed alike");
        assert_ne!(a.digest(), b.digest());
        assert_eq!(a.digest(), crate::sha256_hex(a.to_string().as_bytes()));
        assert_eq!(a.digest().len(), 64);
    }
}
