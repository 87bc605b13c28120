//! A TPU compiler error, taken apart so the kernel author's line comes
//! first.
//!
//! Mosaic reports a failure as one message: a headline (`Mosaic failed to
//! compile TPU kernel ...: <what>`), `at location: <MLIR location>`, `The
//! MLIR operation involved:` and the op, then a bug-report footer. Tessera
//! gives every op of the Mosaic body the Rust source location it was
//! written at, so the location is the user's `file:line:col`.

use std::fmt;

/// The TPU compiler's error message, with the parts a kernel author needs
/// pulled out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompilerDiagnostic {
    /// What went wrong, in the compiler's words (`memref and vector rank
    /// mismatch`).
    pub summary: String,
    /// The kernel source location of the offending op (`src/k.rs:12:5`),
    /// when the compiler named one.
    pub location: Option<String>,
    /// The MLIR operation involved, as the compiler printed it.
    pub op: Option<String>,
    /// The whole message, verbatim.
    pub message: String,
    /// The status code (absl), e.g. 13 for INTERNAL.
    pub code: i32,
}

const MOSAIC_HEAD: &str = "Mosaic failed to compile TPU kernel";

impl CompilerDiagnostic {
    /// Takes apart `message`, the compiler's error text.
    pub fn parse(message: &str, code: i32) -> CompilerDiagnostic {
        let summary = summary_of(message);
        let location = message
            .lines()
            .find_map(|l| l.trim().strip_prefix("at location: "))
            .and_then(source_location);
        let op = message
            .split_once("The MLIR operation involved:")
            .map(|(_, rest)| {
                rest.lines()
                    .map(str::trim)
                    .skip_while(|l| l.is_empty())
                    .take_while(|l| !l.is_empty())
                    .collect::<Vec<_>>()
                    .join(" ")
            });
        CompilerDiagnostic {
            summary,
            location,
            op: op.filter(|o| !o.is_empty()),
            message: message.trim().to_string(),
            code,
        }
    }

    /// Whether this is Mosaic (the kernel compiler) rejecting the kernel,
    /// rather than XLA rejecting the program around it.
    pub fn is_mosaic(&self) -> bool {
        self.message.contains(MOSAIC_HEAD)
    }
}

/// The headline: for Mosaic, what follows `HLO name `...`: `; otherwise the
/// first non-empty line.
fn summary_of(message: &str) -> String {
    let first = message
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    if let Some(i) = first.find(MOSAIC_HEAD) {
        let rest = &first[i..];
        // The module and HLO names are in backquotes; the reason follows
        // the last "`: ".
        if let Some(j) = rest.rfind("`: ") {
            return rest[j + 3..].trim().to_string();
        }
    }
    first.to_string()
}

/// `file:line:col` out of an MLIR location (`loc("f.rs":3:7)`, possibly
/// nested in `callsite(...)` or `fused[...]`); `None` for `loc(unknown)`.
fn source_location(loc: &str) -> Option<String> {
    let start = loc.find('"')?;
    let rest = &loc[start + 1..];
    let end = rest.find('"')?;
    let file = &rest[..end];
    let after = &rest[end + 1..];
    let mut nums = after.strip_prefix(':')?.splitn(2, ':');
    let line: u32 = nums.next()?.parse().ok()?;
    let col: String = nums
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let col: u32 = col.parse().ok()?;
    Some(format!("{file}:{line}:{col}"))
}

impl fmt::Display for CompilerDiagnostic {
    /// The location first, then the op, then the compiler's whole message.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.location {
            Some(l) => write!(f, "{l}: {}", self.summary)?,
            None => write!(f, "{}", self.summary)?,
        }
        if let Some(op) = &self.op {
            write!(f, "\n  op: {op}")?;
        }
        if self.message != self.summary {
            write!(f, "\n  compiler said:")?;
            for line in self.message.lines() {
                write!(f, "\n    {line}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOSAIC: &str = "Mosaic failed to compile TPU kernel with MLIR module name `<no name>` HLO name `name.1`: memref and vector rank mismatch\n\nat location: loc(\"kernels/src/rope.rs\":41:9)\n\nThe MLIR operation involved:\n  \"tpu.vector_store\"(%14, %5) : (vector<32x64xf32>, memref<1x1x32x128xf32>) -> ()\n\nPlease report a bug at: https://github.com/jax-ml/jax/issues/new/choose\n";

    #[test]
    fn a_mosaic_error_yields_location_summary_and_op() {
        let d = CompilerDiagnostic::parse(MOSAIC, 13);
        assert_eq!(d.summary, "memref and vector rank mismatch");
        assert_eq!(d.location.as_deref(), Some("kernels/src/rope.rs:41:9"));
        assert!(d.op.as_deref().unwrap().starts_with("\"tpu.vector_store\""));
        assert!(d.is_mosaic());
        let shown = d.to_string();
        assert!(shown.starts_with("kernels/src/rope.rs:41:9: memref and vector rank mismatch\n  op: \"tpu.vector_store\""), "{shown}");
        assert!(shown.contains("Please report a bug"), "{shown}");
    }

    #[test]
    fn unknown_and_nested_locations() {
        let d = CompilerDiagnostic::parse(
            &MOSAIC.replace("loc(\"kernels/src/rope.rs\":41:9)", "loc(unknown)"),
            13,
        );
        assert_eq!(d.location, None);
        assert_eq!(
            source_location("loc(callsite(\"a/b.rs\":7:12 at \"c.rs\":1:1))").as_deref(),
            Some("a/b.rs:7:12")
        );
        assert_eq!(source_location("loc(\"x.rs\":7)"), None);
    }

    #[test]
    fn other_errors_keep_their_first_line() {
        let d = CompilerDiagnostic::parse(
            "RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem.\nmore",
            8,
        );
        assert_eq!(
            d.summary,
            "RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem."
        );
        assert!(!d.is_mosaic());
        assert_eq!(d.op, None);
    }
}
