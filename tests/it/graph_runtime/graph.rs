//! The deferred graph runtime: a transformer block against its f64
//! reference, buckets, the three cache tiers (with several processes),
//! failures, collectives, record-time errors.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use graph::{Buckets, Runtime, RuntimeError, RuntimeOptions};
use kernel_ir::VerifiedKernel;
use kernel_ir::prelude::*;
use kernels::check::{ErrorStats, Tolerance};
use runtime::cache::RemoteCache;
use tooling::transformer::{BlockWeights, block_forward, block_reference};

/// A fresh, empty cache directory for one test.
fn fresh_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn runtime_in(dir: &Path) -> Runtime {
    Runtime::new(RuntimeOptions {
        cache_dir: Some(dir.to_path_buf()),
        ..RuntimeOptions::default()
    })
    .unwrap()
}

const TOL: Tolerance = Tolerance {
    abs: 1e-4,
    rel: 1e-3,
};

#[test]
fn transformer_block_matches_the_f64_reference() {
    let rt = runtime_in(&fresh_dir("block"));
    let w = BlockWeights::random(128, 2, 7);
    let t = w.upload(&rt).unwrap();
    // Unpadded: the valid length is the whole sequence.
    let x = Array::random(F32, [64, 128], 3, -1.0, 1.0);
    let y = block_forward(&w, &t, &rt.tensor(&x).unwrap())
        .unwrap()
        .to_host()
        .unwrap();
    let s = ErrorStats::between(&y, &block_reference(&w, &x), TOL);
    assert!(s.passes(), "{s}");
    // Bucketed, and non-causal.
    let mut w2 = w.clone();
    w2.causal = false;
    let x = Array::random(F32, [77, 128], 4, -1.0, 1.0);
    let xt = rt.dynamic(&x, 0, &Buckets::new([128]).unwrap()).unwrap();
    assert_eq!(xt.shape(), &[128, 128]);
    let y = block_forward(&w2, &t, &xt).unwrap().to_host().unwrap();
    assert_eq!(y.shape(), &[77, 128]);
    let s = ErrorStats::between(&y, &block_reference(&w2, &x), TOL);
    assert!(s.passes(), "{s}");
}

#[test]
fn twenty_lengths_in_three_buckets_compile_three_times() {
    let rt = runtime_in(&fresh_dir("buckets"));
    let buckets = Buckets::new([64, 128, 256]).unwrap();
    let w = BlockWeights::random(128, 2, 7);
    let t = w.upload(&rt).unwrap();
    let lengths = [
        5, 17, 33, 50, 64, 65, 80, 99, 100, 127, 128, 129, 150, 180, 200, 222, 240, 250, 255, 256,
    ];
    for &len in &lengths {
        let x = Array::random(F32, [len, 128], len as u64, -1.0, 1.0);
        let xt = rt.dynamic(&x, 0, &buckets).unwrap();
        let y = block_forward(&w, &t, &xt).unwrap().to_host().unwrap();
        let s = ErrorStats::between(&y, &block_reference(&w, &x), TOL);
        assert!(s.passes(), "length {len}: {s}");
    }
    let s = rt.stats();
    assert_eq!(s.compiles, 3, "{s:?}");
    assert_eq!(s.hits_memory, 17, "{s:?}");
    assert_eq!(s.buckets.values().sum::<u64>(), 20);
    assert_eq!(
        s.buckets.keys().copied().collect::<Vec<_>>(),
        vec![64, 128, 256]
    );
    assert!(s.padding_bytes > 0);
    assert!((s.hit_rate() - 17.0 / 20.0).abs() < 1e-9);
    // K's column-major hint costs one layout change per kernel call.
    assert_eq!(s.transposes, 20);
    // Past the last bucket: an error unless recompiling is allowed.
    let x = Array::random(F32, [300, 128], 1, -1.0, 1.0);
    let e = rt.dynamic(&x, 0, &buckets).unwrap_err();
    assert!(e.to_string().contains("past the last bucket (256)"), "{e}");
    assert!(
        e.to_string().contains("tests/it/graph_runtime/graph.rs"),
        "{e}"
    );
}

fn client(dir: &Path, lengths: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_graph-client"))
        .args(["--cache", &dir.to_string_lossy(), "--lengths", lengths])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// The counters a client printed.
fn counters(child: std::process::Child) -> HashMap<String, u64> {
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("STATS "))
        .unwrap_or_else(|| panic!("no STATS line in {stdout}"));
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

const LENGTHS: &str = "5,64,65,100,200";

#[test]
fn the_disk_cache_serves_other_processes_and_survives_corruption() {
    let dir = fresh_dir("disk");
    let first = counters(client(&dir, LENGTHS));
    assert_eq!(first["compiles"], 3, "{first:?}");
    let second = counters(client(&dir, LENGTHS));
    assert_eq!(second["compiles"], 0, "{second:?}");
    assert_eq!(second["disk"], 3, "{second:?}");
    // Owner-only directory and entries.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    // Truncate one entry and corrupt another's payload.
    let entries = entry_files(&dir);
    assert_eq!(entries.len(), 3);
    let bytes = std::fs::read(&entries[0]).unwrap();
    std::fs::write(&entries[0], &bytes[..bytes.len() / 2]).unwrap();
    let mut bytes = std::fs::read(&entries[1]).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&entries[1], &bytes).unwrap();
    let third = counters(client(&dir, LENGTHS));
    assert_eq!(third["compiles"], 2, "{third:?}");
    assert_eq!(third["corrupt"], 2, "{third:?}");
    assert_eq!(third["disk"], 1, "{third:?}");
    assert_intact(&dir, 3);
}

#[test]
fn eight_processes_share_one_cache_directory() {
    let dir = fresh_dir("concurrent");
    let children: Vec<_> = (0..8).map(|_| client(&dir, LENGTHS)).collect();
    let all: Vec<HashMap<String, u64>> = children.into_iter().map(counters).collect();
    // Per-key locks: each program is compiled by exactly one process.
    let compiles: u64 = all.iter().map(|c| c["compiles"]).sum();
    assert_eq!(compiles, 3, "{all:?}");
    assert_intact(&dir, 3);
}

fn entry_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "exe"))
        .collect();
    v.sort();
    v
}

/// `n` valid entries and no temporary files.
fn assert_intact(dir: &Path, n: usize) {
    let entries = entry_files(dir);
    assert_eq!(entries.len(), n);
    for e in &entries {
        let bytes = std::fs::read(e).unwrap();
        runtime::cache::check_entry(&bytes).unwrap_or_else(|why| panic!("{}: {why}", e.display()));
    }
    let leftovers: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[derive(Default)]
struct InMemory(Mutex<HashMap<String, Vec<u8>>>);

impl RemoteCache for InMemory {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, runtime::cache::RemoteError> {
        Ok(self.0.lock().unwrap().get(key).cloned())
    }
    fn put(&self, key: &str, entry: &[u8]) -> Result<(), runtime::cache::RemoteError> {
        self.0.lock().unwrap().insert(key.into(), entry.to_vec());
        Ok(())
    }
}

#[test]
fn the_remote_tier_serves_a_runtime_with_an_empty_disk() {
    let remote = Arc::new(InMemory::default());
    let make = |name: &str| {
        Runtime::new(RuntimeOptions {
            cache_dir: Some(fresh_dir(name)),
            remote: Some(remote.clone()),
            ..RuntimeOptions::default()
        })
        .unwrap()
    };
    let x = Array::random(F32, [8, 8], 1, -1.0, 1.0);
    let a = make("remote-a");
    let ya = a.tensor(&x).unwrap().exp().unwrap().to_host().unwrap();
    assert_eq!(a.stats().compiles, 1);
    let b = make("remote-b");
    let yb = b.tensor(&x).unwrap().exp().unwrap().to_host().unwrap();
    assert_eq!(b.stats().compiles, 0);
    assert_eq!(b.stats().hits_remote, 1);
    assert_eq!(ya, yb);
}

#[test]
fn constants_other_than_zero_and_one_do_not_split_the_cache() {
    let rt = Runtime::new(RuntimeOptions {
        disk_cache: false,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let x = rt
        .tensor(&Array::random(F32, [4, 4], 2, -1.0, 1.0))
        .unwrap();
    let host = x.to_host().unwrap();
    for c in [2.5, 3.5, -7.0] {
        let y = x.scale(c).unwrap().to_host().unwrap();
        for (a, b) in y.data().iter().zip(host.data()) {
            assert!((a - b * c).abs() < 1e-5);
        }
    }
    assert_eq!(rt.stats().compiles, 1);
    // 1 and 0 are part of the program: each is its own compile.
    x.scale(1.0).unwrap().to_host().unwrap();
    x.scale(0.0).unwrap().to_host().unwrap();
    assert_eq!(rt.stats().compiles, 3);
}

#[test]
fn padded_dims_are_masked_in_reductions_softmax_and_contractions() {
    let rt = Runtime::new(RuntimeOptions {
        disk_cache: false,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let b = Buckets::new([16]).unwrap();
    let x = Array::random(F32, [11, 4], 3, 1.0, 2.0);
    let xt = rt.dynamic(&x, 0, &b).unwrap();
    let xd = x.data();
    let col = |j: usize| (0..11).map(move |i| xd[i * 4 + j]);
    let sums = xt.sum(&[0]).unwrap().to_host().unwrap();
    let means = xt.mean(&[0]).unwrap().to_host().unwrap();
    let maxes = xt.min(&[0]).unwrap().to_host().unwrap();
    for j in 0..4 {
        let s: f64 = col(j).sum();
        assert!((sums.data()[j] - s).abs() < 1e-4);
        assert!((means.data()[j] - s / 11.0).abs() < 1e-5);
        assert!((maxes.data()[j] - col(j).fold(f64::INFINITY, f64::min)).abs() < 1e-6);
    }
    // softmax along the padded dim: the valid part sums to 1.
    let p = xt.softmax(0).unwrap().to_host().unwrap();
    assert_eq!(p.shape(), &[11, 4]);
    for j in 0..4 {
        let s: f64 = (0..11).map(|i| p.data()[i * 4 + j]).sum();
        assert!((s - 1.0).abs() < 1e-5, "column {j} sums to {s}");
    }
    // xᵀ·x contracts the padded dim.
    let g = xt
        .dot_general(
            &xt,
            DotDims {
                lhs_batch: vec![],
                rhs_batch: vec![],
                lhs_contract: vec![0],
                rhs_contract: vec![0],
            },
        )
        .unwrap()
        .to_host()
        .unwrap();
    let want: f64 = col(1).zip(col(2)).map(|(a, b)| a * b).sum();
    assert!((g.data()[6] - want).abs() < 1e-4);
}

/// Integer max and min start from the element type's own bounds, so an
/// all-negative max or all-positive min is exact, padded rows included.
#[test]
fn integer_max_and_min_reduce_from_the_types_bounds() {
    let rt = Runtime::new(RuntimeOptions {
        disk_cache: false,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let b = Buckets::new([16]).unwrap();
    for (dtype, seed) in [(I8, 5), (I32, 6)] {
        let neg = Array::random(dtype, [11, 3], seed, -100.0, -1.0);
        let pos = Array::random(dtype, [11, 3], seed + 1, 1.0, 100.0);
        let col = |a: &Array, j: usize| (0..11).map(|i| a.data()[i * 3 + j]).collect::<Vec<f64>>();
        for padded in [false, true] {
            let tensor = |a: &Array| {
                if padded {
                    rt.dynamic(a, 0, &b).unwrap()
                } else {
                    rt.tensor(a).unwrap()
                }
            };
            let maxes = tensor(&neg).max(&[0]).unwrap().to_host().unwrap();
            let mins = tensor(&pos).min(&[0]).unwrap().to_host().unwrap();
            assert_eq!((maxes.dtype(), mins.dtype()), (dtype, dtype));
            for j in 0..3 {
                let want_max = col(&neg, j).into_iter().fold(f64::MIN, f64::max);
                let want_min = col(&pos, j).into_iter().fold(f64::MAX, f64::min);
                assert_eq!(maxes.data()[j], want_max, "{dtype} max, padded: {padded}");
                assert_eq!(mins.data()[j], want_min, "{dtype} min, padded: {padded}");
            }
        }
    }
}

#[test]
fn record_errors_name_the_callers_line() {
    let rt = Runtime::new(RuntimeOptions {
        disk_cache: false,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let a = rt.tensor(&Array::zeros(F32, vec![2, 3])).unwrap();
    let b = rt.tensor(&Array::zeros(F32, vec![3, 2])).unwrap();
    let c = rt.tensor(&Array::zeros(BF16, vec![2, 3])).unwrap();
    let line = line!() + 1;
    let e = a.add(&b).unwrap_err();
    assert!(
        matches!(&e, RuntimeError::Record { loc, .. } if loc.contains(&format!("graph.rs:{line}"))),
        "{e}"
    );
    assert!(e.to_string().contains("shapes differ"), "{e}");
    let e = a.add(&c).unwrap_err();
    assert!(e.to_string().contains("dtypes differ: f32 and bf16"), "{e}");
    let e = a.matmul(&a).unwrap_err();
    assert!(
        e.to_string()
            .contains("lhs dim 1 has size 3 but rhs dim 0 has size 2"),
        "{e}"
    );
    let e = a.reshape(&[5]).unwrap_err();
    assert!(e.to_string().contains("cannot reshape"), "{e}");
    let e = a.transpose(&[0, 0]).unwrap_err();
    assert!(e.to_string().contains("not a permutation"), "{e}");
    let e = a.slice(&[0, 0], &[3, 1]).unwrap_err();
    assert!(
        e.to_string().contains("dim 0: 0..3 is not inside 0..2"),
        "{e}"
    );
    let e = a.sum(&[2]).unwrap_err();
    assert!(e.to_string().contains("distinct dims"), "{e}");
    let i = rt.tensor(&Array::zeros(I32, vec![2])).unwrap();
    let e = i.exp().unwrap_err();
    assert!(e.to_string().contains("needs a float tensor"), "{e}");
    let k = gather_rows();
    let e = rt.call(&k, &[&a]).unwrap_err();
    assert!(
        e.to_string()
            .contains("takes 2 arrays (t: i32[2], x: f32[16, 128]), got 1"),
        "{e}"
    );
    let e = rt.call(&k, &[&i, &a]).unwrap_err();
    assert!(
        e.to_string()
            .contains("`x` of kernel `gather_rows` must be f32[16, 128] but got f32[2, 3]"),
        "{e}"
    );
    assert!(Buckets::new(vec![1; 0]).is_err());
    assert!(Buckets::new([1, 2, 3, 4, 5, 6, 7, 8, 9]).is_err());
    // Nothing was run.
    assert_eq!(rt.stats().materializations, 0);
}

/// Block `i` of `x` is row block `t[i]`: a bad `t` fails at run time.
fn gather_rows() -> VerifiedKernel {
    let mut k = KernelBuilder::new("gather_rows");
    k.grid([2], [Parallel]);
    let t = k.scalar_prefetch("t", [2]);
    let x = k
        .input("x", F32, [16, 128])
        .block([8, 128], |[i]| (t.at(i), 0));
    let o = k.output("o", F32, [16, 128]).block([8, 128], |[i]| (i, 0));
    o.store(.., x.load(..));
    k.build().unwrap()
}

#[test]
fn a_failure_is_stored_in_the_nodes_it_affects_and_reported_at_each_sync() {
    let rt = Runtime::new(RuntimeOptions {
        disk_cache: false,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let k = gather_rows();
    let x = rt
        .tensor(&Array::random(F32, [16, 128], 1, -1.0, 1.0))
        .unwrap();
    let bad = rt
        .tensor(&Array::from_elems([2], &[0i32, 9]).unwrap())
        .unwrap();
    let out = rt.call(&k, &[&bad, &x]).unwrap().pop().unwrap();
    let later = out.exp().unwrap();
    let e1 = out.to_host().unwrap_err().to_string();
    assert!(e1.contains("`x`"), "{e1}");
    assert!(e1.contains("recorded at"), "{e1}");
    // The dependent node fails with the same cause, at its own sync.
    let e2 = later.to_host().unwrap_err().to_string();
    assert!(e2.contains("`x`"), "{e2}");
    // The runtime still works.
    let good = rt
        .tensor(&Array::from_elems([2], &[1i32, 0]).unwrap())
        .unwrap();
    let ok = rt.call(&k, &[&good, &x]).unwrap().pop().unwrap();
    assert_eq!(ok.to_host().unwrap().shape(), &[16, 128]);
}

#[test]
fn collectives_run_across_devices_and_are_never_pruned() {
    let rt = Runtime::new(RuntimeOptions {
        devices: 4,
        disk_cache: false,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let per: Vec<Array> = (0..4)
        .map(|d| Array::from_elems([2], &[d as f32, 1.0]).unwrap())
        .collect();
    let x = rt.tensor_per_device(&per).unwrap();
    let sum = x.all_reduce_sum().unwrap();
    let gathered = x.all_gather(0).unwrap();
    for a in sum.to_host_all().unwrap() {
        assert_eq!(a.data(), &[6.0, 4.0]);
    }
    assert_eq!(
        gathered.to_host().unwrap().data(),
        &[0.0, 1.0, 1.0, 1.0, 2.0, 1.0, 3.0, 1.0]
    );
    // A collective whose handle is dropped still runs at the next sync.
    let before = rt.stats().nodes_materialized;
    drop(x.scale(2.0).unwrap().all_reduce_sum().unwrap());
    let y = x.add_scalar(1.0).unwrap();
    y.to_host().unwrap();
    assert_eq!(rt.stats().nodes_materialized - before, 2);
}

#[test]
fn materializing_replaces_storage_seen_by_every_handle() {
    let rt = Runtime::new(RuntimeOptions {
        disk_cache: false,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let x = rt
        .tensor(&Array::random(F32, [3, 3], 5, -1.0, 1.0))
        .unwrap();
    let y = x.tanh().unwrap();
    let alias = y.clone();
    assert!(!alias.is_materialized());
    rt.sync(&[&y]).unwrap();
    assert!(alias.is_materialized());
    // Reading it again runs nothing more.
    let m = rt.stats().materializations;
    alias.to_host().unwrap();
    assert_eq!(rt.stats().materializations, m);
}

#[test]
fn a_cache_directory_others_can_write_is_tightened_or_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = fresh_dir("perms");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let _rt = runtime_in(&dir);
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
}

#[test]
fn a_long_unsynced_chain_records_and_frees_without_overflow() {
    let rt = Runtime::new(RuntimeOptions {
        disk_cache: false,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let x = rt.tensor(&Array::zeros(F32, vec![2])).unwrap();
    let mut y = x.clone();
    for _ in 0..200_000 {
        y = y.add_scalar(1.0).unwrap();
    }
    assert_eq!(y.shape(), &[2]);
    drop(y);
    assert_eq!(rt.stats().materializations, 0);
}

#[test]
fn kernels_lowered_as_decomposed_stablehlo_inside_the_graph_give_the_same_block() {
    // The portable lowering (what a non-CPU, non-TPU plugin gets), here on
    // the CPU plugin.
    let rt = Runtime::new(RuntimeOptions {
        disk_cache: false,
        kernels: graph::KernelLowering::Decomposed,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let w = BlockWeights::random(128, 2, 9);
    let t = w.upload(&rt).unwrap();
    let x = Array::random(F32, [50, 128], 8, -1.0, 1.0);
    let xt = rt.dynamic(&x, 0, &Buckets::new([64]).unwrap()).unwrap();
    let y = block_forward(&w, &t, &xt).unwrap().to_host().unwrap();
    let s = ErrorStats::between(&y, &block_reference(&w, &x), TOL);
    assert!(s.passes(), "{s}");
    assert_eq!(rt.stats().compiles, 1);
}

/// An exported module takes exactly the tensors given as inputs, in that
/// order, and runs on a plain PJRT client to the graph's answer; leaving
/// out a tensor the outputs read is an error that says so.
#[test]
fn export_gives_a_module_over_the_named_inputs() {
    use runtime::backend::{Backend, Prepared, cpu_client};
    let rt = graph::Runtime::cpu().unwrap();
    let a = Array::random(F32, [4, 8], 1, -1.0, 1.0);
    let b = Array::random(F32, [4, 8], 2, -1.0, 1.0);
    let (x, y) = (rt.tensor(&a).unwrap(), rt.tensor(&b).unwrap());
    let pos = rt.iota(&[4, 8], 1, I32).unwrap().cast(F32).unwrap();
    let z = x.sub(&y).unwrap().scale(3.0).unwrap().add(&pos).unwrap();
    let text = rt.export(&[&y, &x], &[&z]).unwrap();
    let client = cpu_client().unwrap();
    let executable = client
        .compile(text.as_bytes(), &runtime::pjrt::CompileOptions::default())
        .unwrap();
    let out = Prepared::Pjrt {
        backend: Backend::Decomposed,
        executable,
        client,
        kernel: None,
    }
    .run(&[b.clone(), a.clone()])
    .unwrap();
    let want: Vec<f64> = a
        .data()
        .iter()
        .zip(b.data())
        .enumerate()
        .map(|(i, (p, q))| 3.0 * (p - q) + (i % 8) as f64)
        .collect();
    for (g, w) in out[0].data().iter().zip(&want) {
        assert!((g - w).abs() < 1e-5, "{g} vs {w}");
    }
    let e = rt.export(&[&x], &[&z]).unwrap_err().to_string();
    assert!(e.contains("pass every tensor they read"), "{e}");
    assert!(rt.iota(&[4], 1, I32).is_err());
}

/// Program constants (`Runtime::constant`): their values reach the
/// program (two constants of one shape give two answers, never a cached
/// program of the other's), an export that reads one needs no input for
/// it and carries its values, and a float constant keeps its dtype.
#[test]
fn program_constants_are_part_of_the_program() {
    let rt = crate::common::fresh_runtime();
    let x = rt
        .tensor(&Array::new(I32, [2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap())
        .unwrap();
    let c1 = rt
        .constant(&Array::new(I32, [2, 3], vec![10.0, 20.0, 30.0, 40.0, 50.0, 60.0]).unwrap())
        .unwrap();
    let c2 = rt
        .constant(&Array::new(I32, [2, 3], vec![-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]).unwrap())
        .unwrap();
    assert_eq!(
        x.add(&c1).unwrap().to_host().unwrap().data(),
        &[11.0, 22.0, 33.0, 44.0, 55.0, 66.0]
    );
    assert_eq!(x.add(&c2).unwrap().to_host().unwrap().data(), &[0.0; 6]);
    let y = x.add(&c1).unwrap();
    let text = rt.export(&[&x], &[&y]).unwrap();
    assert!(
        text.contains("dense<[[10, 20, 30], [40, 50, 60]]> : tensor<2x3xi32>"),
        "{text}"
    );
    let f = rt
        .constant(&Array::new(F32, [2], vec![0.5, -1.5]).unwrap())
        .unwrap();
    let g = rt
        .tensor(&Array::new(F32, [2], vec![2.0, 2.0]).unwrap())
        .unwrap();
    assert_eq!(f.mul(&g).unwrap().to_host().unwrap().data(), &[1.0, -3.0]);
}

/// fp8 tensors in the graph runtime: uploaded as their bit patterns, cast
/// to f32 and back (XLA's fp8 conversions, which agree with
/// `DType::round`), and an fp8 matmul through a cast to f32, within the
/// f32 matmul tolerance of the f64 product.
#[test]
fn fp8_tensors_cast_and_multiply() {
    let rt = Runtime::new(RuntimeOptions {
        disk_cache: false,
        ..RuntimeOptions::default()
    })
    .unwrap();
    for d in [F8E4M3FN, F8E5M2] {
        let x = Array::random(d, [16, 32], 3, -8.0, 8.0);
        let w = Array::random(d, [32, 128], 4, -8.0, 8.0);
        let back = rt.tensor(&x).unwrap().cast(F32).unwrap().to_host().unwrap();
        assert_eq!(back.data(), x.data(), "{d}");
        let wide = Array::random(F32, [16, 32], 5, -600.0, 600.0);
        let narrow = rt
            .tensor(&wide)
            .unwrap()
            .cast(d)
            .unwrap()
            .to_host()
            .unwrap();
        for (n, v) in narrow.data().iter().zip(wide.data()) {
            let want = d.round(*v);
            assert!(
                n.is_nan() && want.is_nan() || *n == want,
                "{d}: {v} -> {n}, want {want}"
            );
        }
        let xt = rt.tensor(&x).unwrap().cast(F32).unwrap();
        let wt = rt.tensor(&w).unwrap().cast(F32).unwrap();
        let got = xt.matmul(&wt).unwrap().to_host().unwrap();
        let want = kernels::reference::matmul(&x, &w);
        let tol = kernels::check::Tolerance::matmul(32, F32);
        let r = kernels::check::ErrorStats::between(&got, &want, tol);
        assert!(r.passes(), "{d}: {r}");
    }
}
