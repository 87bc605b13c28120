//! The hostile suite's tally: each surface's harness (kernel files, CLI
//! flags and shapes, tuning files, artifacts and `tessera_torch` calls)
//! records how many generated cases it ran and how many held, one file
//! per surface in a folder; `tests/conformance/run.sh` gathers them into
//! `target/conformance/hostile.md` and fails on a surface short of its
//! cases or with one that did not hold.
//!
//! ```
//! let dir = std::env::temp_dir().join(format!("tessera-hostile-doc-{}", std::process::id()));
//! tooling::hostile::record(&dir, "kernel files", 2000, 2000, "seed 44").unwrap();
//! let row = std::fs::read_to_string(dir.join("kernel_files.md")).unwrap();
//! assert_eq!(row, "| kernel files | 2000 | 2000 | seed 44 |\n");
//! ```

use std::path::{Path, PathBuf};

/// The cases each surface runs in the test command (more where a harness
/// is asked for more).
pub const CASES: u64 = 2000;

/// The folder the workspace's harnesses record into:
/// `target/conformance/hostile` under the workspace root.
pub fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/conformance/hostile")
}

/// Writes `surface`'s row (all or nothing): `| surface | cases | held |
/// note |`, in `dir/<surface with _ for spaces>.md`.
pub fn record(
    dir: &Path,
    surface: &str,
    cases: u64,
    held: u64,
    note: &str,
) -> Result<(), crate::atomic_file::WriteError> {
    let _ = std::fs::create_dir_all(dir);
    let file = dir.join(format!("{}.md", surface.replace(' ', "_")));
    crate::atomic_file::write(
        &file,
        format!("| {surface} | {cases} | {held} | {note} |\n").as_bytes(),
    )
}
