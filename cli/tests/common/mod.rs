//! Helpers of the command's tests: running `tessera` and making inputs.
#![allow(dead_code)] // each test binary uses some of them

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kernel_ir::Array;

pub fn tessera(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .output()
        .expect("the tessera binary runs")
}

pub fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn save(d: &Path, name: &str, a: &Array) -> String {
    let p = d.join(format!("{name}.npy"));
    tooling::npy::write(&p, a).unwrap();
    format!("{name}={}", p.display())
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
