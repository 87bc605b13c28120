//! `--max-memory` and `--max-work` on every command that runs a kernel
//! here: the kernel's [`Demand`] checked before any input is sampled or
//! any path starts, a refusal one line with the numbers and the flag.

use kernel_ir::Kernel;
use tooling::resources::{Demand, Limits, parse_bytes};

use crate::args::Args;
use crate::{Failure, usage};

/// The limits `a` gives, the defaults where it gives none.
pub fn limits(a: &Args) -> Result<Limits, Failure> {
    let mut l = Limits::defaults();
    if let Some(v) = a.one("max-memory").map_err(usage)? {
        l.max_memory = parse_bytes(v).map_err(|e| usage(format!("--max-memory {e}")))?;
    }
    if let Some(v) = a.one("max-work").map_err(usage)? {
        l.max_work = v.trim().parse().map_err(|_| {
            usage(format!(
                "--max-work `{v}` is not a whole number of element-ops"
            ))
        })?;
    }
    Ok(l)
}

/// `Ok` when running `k` stays within the limits `a` gives.
pub fn check(k: &Kernel, a: &Args) -> Result<(), Failure> {
    limits(a)?
        .check(&Demand::of(k))
        .map_err(|e| usage(format!("kernel `{}` {e}", k.name)))
}

/// `Ok` when `k`'s arrays fit `--max-memory` (for a command that samples
/// its inputs but does not run it here: `compile`).
pub fn check_memory(k: &Kernel, a: &Args) -> Result<(), Failure> {
    let mut l = limits(a)?;
    l.max_work = u128::MAX;
    l.check(&Demand::of(k))
        .map_err(|e| usage(format!("kernel `{}` {e}", k.name)))
}

/// `--timeout SECS`, if given: seconds up to a day.
pub fn timeout(a: &Args) -> Result<Option<std::time::Duration>, Failure> {
    let Some(t) = a.one("timeout").map_err(usage)? else {
        return Ok(None);
    };
    let secs: f64 = t
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= kernel_ir::limits::MAX_TIMEOUT_SECONDS)
        .ok_or_else(|| {
            usage(format!(
                "--timeout {t}: give seconds up to {} (a day), e.g. --timeout 120",
                kernel_ir::limits::MAX_TIMEOUT_SECONDS
            ))
        })?;
    Ok(Some(std::time::Duration::from_secs_f64(secs)))
}

/// Sets the time limit of the children a run starts (Triton's
/// interpreter) from `--timeout`, [`runtime::child::DEFAULT_TIMEOUT`]
/// where it is not given.
pub fn child_timeout(a: &Args) -> Result<(), Failure> {
    if let Some(t) = timeout(a)? {
        runtime::child::set_timeout(t);
    }
    Ok(())
}
