//! `tests/gpu/run.sh --prepare DIR` deletes only what it made (issue 70's
//! seventh finding: it wiped DIR whatever it held, resolved a relative DIR
//! against the checkout, and with a trailing slash deleted DIR, then said
//! "prepared" and exited 0). Run with a stand-in `tessera` that writes an
//! empty folder at each `--out`, so no build is needed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn checkout() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A scratch folder holding the stand-in commands (`ok`, `fails`) and the
/// tutorial file the script copies.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-gpu-script-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("bin")).unwrap();
    let ok = "#!/usr/bin/env bash\nwhile [ $# -gt 0 ]; do [ \"$1\" = --out ] && mkdir -p \"$2\"; shift; done\n";
    std::fs::write(d.join("bin/ok"), ok).unwrap();
    std::fs::write(d.join("bin/fails"), "#!/usr/bin/env bash\nexit 3\n").unwrap();
    for f in ["ok", "fails"] {
        Command::new("chmod")
            .arg("+x")
            .arg(d.join("bin").join(f))
            .status()
            .unwrap();
    }
    std::fs::write(d.join("bin/tutorial.py"), "# a stand-in\n").unwrap();
    d
}

fn prepare(caller: &Path, tessera: &str, dir: &str) -> Output {
    Command::new("bash")
        .arg(checkout().join("tests/gpu/run.sh"))
        .args(["--prepare", dir])
        .current_dir(caller)
        .env("TESSERA_BIN", caller.join("bin").join(tessera))
        .env("TRITON_TUTORIAL_ATTENTION", caller.join("bin/tutorial.py"))
        .output()
        .unwrap()
}

fn leftovers(d: &Path) -> Vec<String> {
    std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".partial") || n.contains(".old"))
        .collect()
}

#[test]
fn prepare_replaces_only_its_own_folder_relative_to_the_caller() {
    let c = scratch("prepare");
    let name = format!("inputs-{}", std::process::id());
    let o = prepare(&c, "ok", &name);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(c.join(&name).join(".tessera-gpu-inputs").is_file(), "{err}");
    assert!(c.join(&name).join("jax/spec.json").is_file(), "{err}");
    assert!(
        !checkout().join(&name).exists(),
        "resolved against the checkout"
    );

    // A trailing slash: an earlier --prepare folder is replaced, not lost.
    let o = prepare(&c, "ok", &format!("{name}/"));
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(c.join(&name).join(".tessera-gpu-inputs").is_file());

    // A failure exits non-zero and leaves the earlier folder as it was.
    std::fs::write(c.join(&name).join("earlier"), "1").unwrap();
    let o = prepare(&c, "fails", &name);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(c.join(&name).join("earlier").is_file());
    assert_eq!(leftovers(&c), Vec::<String>::new());

    // A folder it did not make is refused whole, trailing slash or not.
    let mine = c.join("mine");
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::write(mine.join("keep.txt"), "mine").unwrap();
    for arg in ["mine", "mine/", "mine//"] {
        let o = prepare(&c, "ok", arg);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{arg}: {err}");
        assert!(err.contains("not an earlier --prepare folder"), "{err}");
        assert_eq!(
            std::fs::read_to_string(mine.join("keep.txt")).unwrap(),
            "mine"
        );
    }
    let o = prepare(&c, "ok", "mine/keep.txt");
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(leftovers(&c), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(&c);
}
