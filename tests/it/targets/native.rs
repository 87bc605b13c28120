//! The native JIT and the FFI custom call beyond agreement with the
//! reference: bad input is a clear error, never a crash; threads do not
//! change results; in-out operands and scalar prefetch work on every path.

use kernel_ir::prelude::*;
use kernel_ir::{ErrorKind, VerifiedKernel};
use kernels::check::Tolerance;
use kernels::foundation::*;
use lowering::{HostKernel, HostOptions, LoweringError};
use runtime::backend::{Backend, cpu_client};
use runtime::pjrt::CompileOptions;
use tooling::paths::run_paths;

fn small_add() -> VerifiedKernel {
    add(&AddConfig {
        rows: 16,
        cols: 128,
        block_rows: 8,
        block_cols: 128,
        dtype: F32,
    })
    .unwrap()
}

/// Block `i` of `x` comes from row block `t[i]` (scalar prefetch).
fn gather_rows() -> VerifiedKernel {
    let mut k = KernelBuilder::new("gather_rows");
    k.grid([2], [Parallel]);
    let t = k.scalar_prefetch("t", [2]);
    let x = k
        .input("x", F32, [16, 128])
        .block([8, 128], |[i]| (t.at(i), 0));
    let o = k.output("o", F32, [16, 128]).block([8, 128], |[i]| (i, 0));
    o.store(.., x.load(..) * 2.0);
    k.build().unwrap()
}

#[test]
fn wrong_argument_count_and_dtype_are_errors() {
    let native = HostKernel::compile(&small_add()).unwrap();
    let x = Array::random(F32, [16, 128], 1, -1.0, 1.0);
    let err = native.run(std::slice::from_ref(&x)).unwrap_err();
    assert!(matches!(err, LoweringError::Arguments(_)), "{err}");
    assert!(err.to_string().contains("takes 2 arrays"), "{err}");
    let wrong = Array::random(BF16, [16, 128], 2, -1.0, 1.0);
    let err = native.run(&[x.clone(), wrong]).unwrap_err();
    assert!(err.to_string().contains("must be f32[16, 128]"), "{err}");
    let err = native
        .run_bytes(&[], &[&[0u8; 4], &[0u8; 4]], &mut [])
        .unwrap_err();
    assert!(err.to_string().contains("takes 1 outputs"), "{err}");
}

#[test]
fn a_block_index_past_the_array_is_an_error_on_every_path_that_can_tell() {
    let k = gather_rows();
    let x = Array::random(F32, [16, 128], 3, -1.0, 1.0);
    // In range: rows swapped.
    let t = Array::from_elems([2], &[1i32, 0]).unwrap();
    let mut want = x.data()[8 * 128..].to_vec();
    want.extend_from_slice(&x.data()[..8 * 128]);
    let want: Vec<f64> = want.iter().map(|v| v * 2.0).collect();
    for r in run_paths(
        &k,
        &[t, x.clone()],
        &Backend::ALL,
        &[want],
        &[Tolerance::for_dtype(F32)],
    ) {
        assert!(r.passes(), "{r}");
    }
    // Out of range: block 5 of 2.
    let bad = Array::from_elems([2], &[0i32, 5]).unwrap();
    let interp = interpret(&k, &[bad.clone(), x.clone()]).unwrap_err();
    assert!(
        matches!(&interp.kind, ErrorKind::BlockOutOfBounds { operand, .. } if operand == "x"),
        "{interp}"
    );
    let native = HostKernel::compile(&k).unwrap();
    let err = native.run(&[bad.clone(), x.clone()]).unwrap_err();
    assert!(
        err.to_string().contains("`x`") && err.to_string().contains("(5, 0)"),
        "{err}"
    );
    // Through XLA the handler's error reaches the caller as a PJRT error.
    let p = runtime::backend::Prepared::new(Backend::HostCall, &k).unwrap();
    let err = p.run(&[bad, x]).unwrap_err().to_string();
    assert!(err.contains("`x`"), "{err}");
}

#[test]
fn threads_do_not_change_results() {
    let c = MatmulConfig {
        m: 64,
        n: 256,
        k: 384,
        bm: 16,
        bn: 128,
        bk: 128,
        dtype: F32,
        out_dtype: F32,
    };
    let k = matmul(&c).unwrap();
    let x = Array::random(F32, [c.m, c.k], 4, -1.0, 1.0);
    let y = Array::random(F32, [c.k, c.n], 5, -1.0, 1.0);
    let one = HostKernel::compile(&k)
        .unwrap()
        .with_options(HostOptions { threads: 1 });
    let many = HostKernel::compile(&k)
        .unwrap()
        .with_options(HostOptions { threads: 7 });
    let a = one.run(&[x.clone(), y.clone()]).unwrap();
    let b = many.run(&[x, y]).unwrap();
    assert_eq!(a[0].data(), b[0].data());
}

#[test]
fn in_out_operands_update_in_place_on_every_path() {
    let mut k = KernelBuilder::new("accumulate");
    k.grid([2, 2], [Parallel, Parallel]);
    let x = k
        .input("x", F32, [16, 256])
        .block([8, 128], |[i, j]| (i, j));
    let acc = k
        .inout("acc", F32, [16, 256])
        .block([8, 128], |[i, j]| (i, j));
    acc.store(.., acc.load(..) + x.load(..).exp());
    let k = k.build().unwrap();
    let x = Array::random(F32, [16, 256], 6, -2.0, 2.0);
    let a = Array::random(F32, [16, 256], 7, -2.0, 2.0);
    let want: Vec<f64> = a
        .data()
        .iter()
        .zip(x.data())
        .map(|(a, x)| a + x.exp())
        .collect();
    for r in run_paths(
        &k,
        &[x, a],
        &Backend::ALL,
        &[want],
        &[Tolerance::for_dtype(F32)],
    ) {
        assert!(r.passes(), "{r}");
    }
}

#[test]
fn an_unregistered_kernel_key_is_an_error_not_a_crash() {
    let client = cpu_client().unwrap();
    runtime::host_call::install_handler(client.plugin()).unwrap();
    let k = small_add();
    let module = lowering::host_custom_call(&k, "no-such-kernel").unwrap();
    let exe = client
        .compile(module.as_bytes(), &CompileOptions::default())
        .unwrap();
    let x = client.upload(&Array::zeros(F32, vec![16, 128]), 0).unwrap();
    let err = exe.execute(&[&x, &x]).unwrap_err().to_string();
    assert!(
        err.contains("no Tessera host kernel is registered as `no-such-kernel`"),
        "{err}"
    );
}

#[test]
fn a_call_whose_shapes_disagree_with_the_kernel_is_an_error() {
    let client = cpu_client().unwrap();
    let k = small_add();
    let key = runtime::host_call::register_kernel(&k).unwrap();
    runtime::host_call::install_handler(client.plugin()).unwrap();
    // The same call, written by hand for a 8x128 operand.
    let module = format!(
        r#"func.func @main(%x: tensor<8x128xf32>, %y: tensor<16x128xf32>) -> tensor<16x128xf32> {{
  %r = stablehlo.custom_call @{}(%x, %y) {{api_version = 4 : i32, backend_config = {{kernel = "{key}"}}}} : (tensor<8x128xf32>, tensor<16x128xf32>) -> tensor<16x128xf32>
  return %r : tensor<16x128xf32>
}}"#,
        lowering::HOST_CALL_TARGET
    );
    let exe = client
        .compile(module.as_bytes(), &CompileOptions::default())
        .unwrap();
    let a = client.upload(&Array::zeros(F32, vec![8, 128]), 0).unwrap();
    let b = client.upload(&Array::zeros(F32, vec![16, 128]), 0).unwrap();
    let err = exe.execute(&[&a, &b]).unwrap_err().to_string();
    assert!(err.contains("must be f32[16, 128]"), "{err}");
}

#[test]
fn the_host_module_is_printed_and_lowers_without_leftovers() {
    let k = small_add();
    let text = lowering::host_module(&k).unwrap();
    assert!(text.contains("func.func @tessera_host_kernel"), "{text}");
    // Windows are strided memrefs with a dynamic offset.
    assert!(text.contains("strided<[?, 1], offset: ?>"), "{text}");
}

/// One argument check, typed, on every path: the interpreter, the native
/// JIT, both PJRT paths and the graph runtime refuse the same wrong array
/// with the same [`kernel_ir::ArgumentError`].
#[test]
fn every_path_makes_the_one_argument_check() {
    use kernel_ir::ArgumentError;
    use runtime::backend::{BackendError, Prepared};
    let k = small_add();
    let x = Array::random(F32, [16, 128], 1, -1.0, 1.0);
    let wrong = Array::random(BF16, [16, 128], 2, -1.0, 1.0);
    let args = [x.clone(), wrong.clone()];
    let mut seen: Vec<(String, ArgumentError)> = Vec::new();
    for b in Backend::ALL {
        let e = Prepared::new(b, &k).unwrap().run(&args).unwrap_err();
        let a = match e {
            BackendError::Arguments(a) => *a,
            BackendError::Lowering(LoweringError::Arguments(a)) => *a,
            BackendError::Kernel(k) => match k.kind {
                ErrorKind::Arguments(a) => a,
                other => panic!("{b}: {other}"),
            },
            other => panic!("{b}: not the shared check: {other}"),
        };
        seen.push((b.to_string(), a));
    }
    let rt = graph::Runtime::cpu().unwrap();
    let (tx, tw) = (rt.tensor(&x).unwrap(), rt.tensor(&wrong).unwrap());
    match rt.call(&k, &[&tx, &tw]) {
        Err(graph::RuntimeError::Arguments { error, .. }) => seen.push(("graph".into(), *error)),
        other => panic!("graph: {other:?}"),
    }
    let first = seen[0].1.clone();
    assert!(
        matches!(&first, ArgumentError::Mismatch { index: 1, got: (Some(d), _), .. } if *d == BF16),
        "{first}"
    );
    for (path, e) in &seen {
        assert_eq!(e, &first, "{path}");
    }
    assert_eq!(seen.len(), Backend::ALL.len() + 1);
}

/// A store whose value reads the buffer it overwrites runs in place only
/// when every read is of the same site, element by element: a read of
/// other rows, or of the same tile transposed, sees the old values on the
/// JIT as on every other path.
#[test]
fn a_store_over_what_it_reads_sees_the_old_values() {
    let n = 16usize;
    let mut k = KernelBuilder::new("self_reads");
    k.grid([1], [Arbitrary]);
    let acc = k.inout("acc", F32, [n, 128]).block([n, 128], |[_i]| (0, 0));
    let sq = k
        .inout("sq", F32, [128, 128])
        .block([128, 128], |[_i]| (0, 0));
    // Same site: in place. Shifted rows: the rows 8.. must be read before
    // the rows ..8 are overwritten. Transposed: whole-tile reads.
    acc.store(.., acc.load(..) * 2.0 + 1.0);
    acc.store((0..8, ..), acc.load((8..16, ..)) + acc.load((0..8, ..)));
    sq.store(.., sq.load(..).transpose([1, 0]) + sq.load(..));
    let k = k.build().unwrap();
    let a = Array::random(F32, [n, 128], 31, -2.0, 2.0);
    let s = Array::random(F32, [128, 128], 32, -2.0, 2.0);
    let mut want_a: Vec<f64> = a.data().iter().map(|v| v * 2.0 + 1.0).collect();
    for i in 0..8 {
        for j in 0..128 {
            want_a[i * 128 + j] += want_a[(i + 8) * 128 + j];
        }
    }
    let sd = s.data();
    let want_s: Vec<f64> = (0..128 * 128)
        .map(|e| sd[(e % 128) * 128 + e / 128] + sd[e])
        .collect();
    for r in run_paths(
        &k,
        &[a, s],
        &[Backend::Interpreter, Backend::Native],
        &[want_a, want_s],
        &[Tolerance::for_dtype(F32); 2],
    ) {
        assert!(r.passes(), "{r}");
    }
}
