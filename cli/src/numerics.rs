//! `tessera numerics [--k K,K,..] [--m M] [--n N] [--backend B] [--seed S]`:
//! the FP8 GEMM's error against its f64 reference by depth and
//! accumulation scheme (`tooling::numerics`).

use tooling::numerics::{fp8_gemm_errors, table};

use crate::args::Args;
use crate::run::backend;
use crate::{Failure, usage};

pub fn numerics(args: &[String]) -> Result<(), Failure> {
    let a =
        Args::parse("numerics", args, &["k", "m", "n", "backend", "seed"], &[]).map_err(usage)?;
    if let Some(extra) = a.positional.first() {
        return Err(usage(format!("unexpected argument `{extra}`")));
    }
    let int = |name: &str, default: usize, max: usize| -> Result<usize, Failure> {
        match a.one(name).map_err(usage)? {
            None => Ok(default),
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|&x| x >= 1 && x <= max)
                .ok_or_else(|| usage(format!("--{name} {v}: give an integer in 1..={max}"))),
        }
    };
    let ks: Vec<usize> = match a.one("k").map_err(usage)? {
        None => vec![1024, 4096, 16384],
        Some(list) => list
            .split(',')
            .map(|s| {
                s.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|&k| k >= 512 && k % 512 == 0 && k <= 1 << 20)
                    .ok_or_else(|| usage(format!("--k {s}: give multiples of 512 up to 2^20")))
            })
            .collect::<Result<_, _>>()?,
    };
    let (m, n) = (int("m", 128, 4096)?, int("n", 128, 4096)?);
    if m % 8 != 0 || n % 128 != 0 {
        return Err(usage(format!(
            "--m {m} --n {n}: m must be a multiple of 8 and n of 128"
        )));
    }
    let seed = int("seed", 7, usize::MAX)? as u64;
    let b = match a.one("backend").map_err(usage)?.unwrap_or("jit") {
        "all" => {
            return Err(usage(
                "numerics measures one back end per run: give --backend interp, jit, pjrt or pjrt-ffi".into(),
            ));
        }
        name => backend(name).map_err(usage)?,
    };
    let rows = fp8_gemm_errors(&ks, m, n, seed, b).map_err(|e| Failure::Run(e.to_string()))?;
    println!(
        "FP8 GEMM (e4m3fn inputs uniform in -8..8, {m} x {n}, f32 output) against the f64 reference, on {b} (f32 subnormals {}):\n",
        b.subnormals().name()
    );
    print!("{}", table(&rows, m, n));
    Ok(())
}
