//! The `#[tpu_kernel]` language, feature by feature: each kernel runs in
//! the interpreter against a plain host computation, and the IR shows the
//! construct was lowered as intended (a loop stays a loop, ...).

use kernel_ir::prelude::*;
use kernel_ir::{ErrorKind, OpKind};
use kernels::check::{ErrorStats, Tolerance};

fn count_ops(k: &kernel_ir::Kernel, f: impl Fn(&OpKind) -> bool) -> usize {
    let mut n = 0;
    k.body.walk(&mut |op| n += f(&op.kind) as usize);
    n
}

/// Sums `steps` column blocks of width 128 with a kernel loop whose bound is
/// a config value, carrying the running sum.
#[tpu_kernel(grid = (m / 8,), semantics = (parallel,))]
pub(crate) fn strip_sum(
    steps: usize,
    #[shape(m, n)]
    #[block([8, n], |i| (i, 0))]
    x: In<f32>,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    let mut acc = x.load((.., 0..128)) * 0.0;
    for j in 0..steps {
        acc = acc + x.load((.., ds(j * 128, 128)));
    }
    o.store(.., acc);
}

fn strip_reference(x: &Array, steps: usize) -> Vec<f64> {
    let (m, n) = (x.shape()[0], x.shape()[1]);
    (0..m * 128)
        .map(|e| {
            (0..steps)
                .map(|j| x.data()[(e / 128) * n + j * 128 + e % 128])
                .sum()
        })
        .collect()
}

#[test]
fn for_loops_carry_values_and_stay_loops() {
    let k = strip_sum::build(3, strip_sum::Dims { m: 16, n: 384 }).unwrap();
    assert_eq!(count_ops(&k, |o| matches!(o, OpKind::For { .. })), 1);
    let x = Array::random(F32, [16, 384], 1, -1.0, 1.0);
    let out = interpret(&k, std::slice::from_ref(&x)).unwrap();
    let s = ErrorStats::between(&out[0], &strip_reference(&x, 3), Tolerance::for_dtype(F32));
    assert!(s.passes(), "{s}");
}

/// The same sum with the loop unrolled while building.
#[tpu_kernel(grid = (m / 8,), semantics = (parallel,))]
fn strip_sum_unrolled(
    #[shape(m, 384)]
    #[block([8, 384], |i| (i, 0))]
    x: In<f32>,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    let mut acc = x.load((.., 0..128));
    #[unroll]
    for j in 1..3 {
        acc += x.load((.., j * 128..(j + 1) * 128));
    }
    o.store(.., acc);
}

#[test]
fn unrolled_loops_leave_no_loop_op() {
    let k = strip_sum_unrolled::build(strip_sum_unrolled::Dims { m: 16 }).unwrap();
    assert_eq!(count_ops(&k, |o| matches!(o, OpKind::For { .. })), 0);
    assert_eq!(count_ops(&k, |o| matches!(o, OpKind::Load { .. })), 3);
    let x = Array::random(F32, [16, 384], 2, -1.0, 1.0);
    let out = interpret(&k, std::slice::from_ref(&x)).unwrap();
    let s = ErrorStats::between(&out[0], &strip_reference(&x, 3), Tolerance::for_dtype(F32));
    assert!(s.passes(), "{s}");
}

/// Branches: on a build-time flag (specializes the kernel) and on a scalar
/// tile (a conditional block); a branch on a tile assigns an outside tile.
#[tpu_kernel(grid = (4,), semantics = (arbitrary,))]
pub(crate) fn branches(
    negate: bool,
    #[shape(32, 128)]
    #[block([8, 128], |i| (i, 0))]
    x: In<f32>,
    #[shape(32, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    let i = program_id(0);
    let mut v = x.load(..);
    if negate {
        v = -v;
    }
    // Steps 1 and 2 double their block; `&&` and comparisons on tiles.
    if i >= 1 && i < 3 {
        v = v * 2.0;
    } else if i == 3 {
        v = v + 100.0;
    }
    o.store(.., v);
}

#[test]
fn branches_on_flags_specialize_and_on_tiles_record_ifs() {
    let x = Array::random(F32, [32, 128], 3, -1.0, 1.0);
    for negate in [false, true] {
        let k = branches::build(negate, branches::Dims {}).unwrap();
        // Only the tile branches are ops: the `if` and its nested `else if`.
        assert_eq!(count_ops(&k, |o| matches!(o, OpKind::If { .. })), 2);
        assert_eq!(
            count_ops(&k, |o| matches!(o, OpKind::Unary { .. })),
            negate as usize
        );
        let out = interpret(&k, std::slice::from_ref(&x)).unwrap();
        let want: Vec<f64> = x
            .data()
            .iter()
            .enumerate()
            .map(|(e, &v)| {
                let v = if negate { -v } else { v };
                match e / (8 * 128) {
                    1 | 2 => v * 2.0,
                    3 => v + 100.0,
                    _ => v,
                }
            })
            .collect();
        let s = ErrorStats::between(&out[0], &want, Tolerance::for_dtype(F32));
        assert!(s.passes(), "negate={negate}: {s}");
    }
}

/// One softmax step, factored out.
#[kernel_fn]
fn stable_exp(s: Tile) -> (Tile, Tile) {
    let m = s.max_keep(1);
    let e = (s - m).exp();
    (e, e.sum_keep(1))
}

/// Rows gathered through a scalar-prefetch table in the index map, then a
/// softmax through a kernel function.
#[tpu_kernel(grid = (rows,), semantics = (parallel,))]
pub(crate) fn gather_softmax(
    #[shape(rows)] table: Prefetch,
    #[shape(n, 8, 128)]
    #[block([1, 8, 128], |i| (table[i], 0, 0))]
    x: In<f32>,
    #[shape(rows, 8, 128)]
    #[block([1, 8, 128], |i| (i, 0, 0))]
    o: Out<f32>,
) {
    let (e, sum) = stable_exp(x.load((0, .., ..)));
    o.store((0, .., ..), e / sum);
}

#[test]
fn prefetch_tables_drive_index_maps_and_kernel_fns_are_callable() {
    let table = Array::from_elems([3], &[4i32, 0, 2]).unwrap();
    let x = Array::random(F32, [5, 8, 128], 4, -2.0, 2.0);
    let dims = gather_softmax::Dims::from_shapes(&[table.shape(), x.shape()]).unwrap();
    assert_eq!(dims, gather_softmax::Dims { rows: 3, n: 5 });
    let k = gather_softmax::build(dims).unwrap();
    let out = interpret(&k, &[table.clone(), x.clone()]).unwrap();
    let mut want = Vec::new();
    for &r in &[4usize, 0, 2] {
        let block = Array::new(F32, [8, 128], x.data()[r * 1024..(r + 1) * 1024].to_vec()).unwrap();
        want.extend(kernels::reference::softmax_rows(&block));
    }
    let s = ErrorStats::between(&out[0], &want, Tolerance::for_dtype(F32));
    assert!(s.passes(), "{s}");
}

#[test]
fn dims_from_shapes_reports_inconsistent_inputs() {
    let e = gather_softmax::Dims::from_shapes(&[&[3], &[5, 8, 64]]);
    // `#[shape(n, 8, 128)]` has literal dims: they are checked when the
    // kernel is built, not bound; the rank is checked here.
    assert!(e.is_ok());
    let e = gather_softmax::Dims::from_shapes(&[&[3], &[5, 8]]).unwrap_err();
    assert!(e.to_string().contains("`x` must have rank 3"), "{e}");
    let e = gather_softmax::Dims::from_shapes(&[&[3]]).unwrap_err();
    assert!(e.to_string().contains("takes 2 inputs"), "{e}");
    let e = strip_sum::Dims::from_shapes(&[&[16, 384]]);
    assert!(e.is_ok());
}

/// A kernel whose block is legal only for some shapes: the verifier's
/// error points at the operand's declaration in this file.
#[tpu_kernel(grid = (m / 8,), semantics = (parallel,))]
fn narrow(
    #[shape(m, n)]
    #[block([8, 64], |i| (i, 0))]
    x: In<f32>,
    #[shape(m, 64)]
    #[block([8, 64], |i| (i, 0))]
    o: Out<f32>,
) {
    o.store(.., x.load(..));
}

#[test]
fn build_time_errors_point_at_the_kernel_source() {
    // n = 64: the block is the full lane dim, fine.
    assert!(narrow::build(narrow::Dims { m: 16, n: 64 }).is_ok());
    // n = 256: 64 lanes is neither 128-aligned nor the full dim.
    let e = narrow::build(narrow::Dims { m: 16, n: 256 }).unwrap_err();
    let first = e.first().unwrap();
    assert!(matches!(first.kind, ErrorKind::Tiling { .. }), "{e}");
    let loc = first.loc.as_ref().unwrap();
    assert!(loc.file.ends_with("tests/it/language/dsl.rs"), "{loc}");
    let src = include_str!("dsl.rs");
    let line = src.lines().nth(loc.line as usize - 1).unwrap();
    assert!(line.contains("x: In<f32>"), "points at `{line}`");
}

/// Block size as a const generic; the loop bound is a run-time value read
/// from scalar prefetch (how many 128-lane chunks of each row are valid).
#[tpu_kernel(grid = (m / BR,), semantics = (parallel,))]
pub(crate) fn prefix_chunks<const BR: usize>(
    #[shape(m)] valid: Prefetch,
    #[shape(m, 512)]
    #[block([BR, 512], |i| (i, 0))]
    x: In<f32>,
    #[shape(m, 128)]
    #[block([BR, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    let n = valid.load([program_id(0) * BR]);
    let mut acc = x.load((.., 0..128)) * 0.0;
    for j in 0..n {
        acc = acc + x.load((.., ds(j * 128, 128)));
    }
    o.store(.., acc);
}

#[test]
fn const_generics_and_dynamic_loop_bounds() {
    let k = prefix_chunks::build::<8>(prefix_chunks::Dims { m: 16 }).unwrap();
    assert!(k.to_string().contains("block [8, 512]"));
    let mut found_dynamic = false;
    k.body.walk(&mut |op| {
        if let OpKind::For {
            upper: kernel_ir::IndexValue::Dynamic(_),
            ..
        } = op.kind
        {
            found_dynamic = true;
        }
    });
    assert!(found_dynamic, "the loop bound is a run-time value");
    // Rows 0..8 sum 1 chunk, rows 8..16 sum 3 chunks (each block reads its
    // first row's count).
    let mut valid = vec![0i32; 16];
    valid[0] = 1;
    valid[8] = 3;
    let valid = Array::from_elems([16], &valid).unwrap();
    let x = Array::random(F32, [16, 512], 5, -1.0, 1.0);
    let out = interpret(&k, &[valid, x.clone()]).unwrap();
    let want: Vec<f64> = (0..16 * 128)
        .map(|e| {
            let (r, c) = (e / 128, e % 128);
            let chunks = if r < 8 { 1 } else { 3 };
            (0..chunks).map(|j| x.data()[r * 512 + j * 128 + c]).sum()
        })
        .collect();
    let s = ErrorStats::between(&out[0], &want, Tolerance::for_dtype(F32));
    assert!(s.passes(), "{s}");
}

/// `o = x * scale (+ y)`, with the table of row offsets in scalar prefetch
/// when `gather`: an optional input and an optional prefetch operand in one
/// signature, chosen with `if let` on build-time values.
#[tpu_kernel(grid = (m / 8,), semantics = (parallel,), name = if gather { "gathered" } else { "plain" })]
pub(crate) fn optional_operands(
    scale: Option<f32>,
    with_y: bool,
    gather: bool,
    #[present(gather)]
    #[shape(m / 8)]
    rows: Option<Prefetch>,
    #[shape(m, 128)]
    #[block([8, 128], |i| (if let Some(r) = rows { r.at(i) } else { i }, 0))]
    x: In<f32>,
    #[present(with_y)]
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    y: Option<In<f32>>,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    let mut v = x.load(..);
    if let Some(s) = scale {
        v = v * s;
    }
    if let Some(y) = y {
        v = v + y.load(..);
    }
    o.store(.., v);
}

#[test]
fn optional_operands_are_absent_or_present_by_config() {
    let dims = optional_operands::Dims::from_shapes(&[&[16, 128]]).unwrap();
    let x = Array::random(F32, [16, 128], 1, -1.0, 1.0);
    let y = Array::random(F32, [16, 128], 2, -1.0, 1.0);
    let rows = Array::new(I32, [2], vec![1.0, 0.0]).unwrap();
    for (scale, with_y, gather) in [
        (None, false, false),
        (Some(2.0), true, false),
        (Some(0.5), true, true),
        (None, false, true),
    ] {
        let k = optional_operands::build(scale, with_y, gather, dims).unwrap();
        assert_eq!(k.name, if gather { "gathered" } else { "plain" });
        let names: Vec<&str> = k.arguments().map(|a| a.name).collect();
        let mut want_names = Vec::new();
        let mut args = Vec::new();
        if gather {
            want_names.push("rows");
            args.push(rows.clone());
        }
        want_names.push("x");
        args.push(x.clone());
        if with_y {
            want_names.push("y");
            args.push(y.clone());
        }
        assert_eq!(names, want_names);
        let out = interpret(&k, &args).unwrap();
        let want: Vec<f64> = (0..16 * 128)
            .map(|i| {
                let (r, c) = (i / 128, i % 128);
                let src = if gather { (1 - r / 8) * 8 + r % 8 } else { r };
                x.data()[src * 128 + c] * scale.map_or(1.0, f64::from)
                    + if with_y { y.data()[i] } else { 0.0 }
            })
            .collect();
        let st = ErrorStats::between(&out[0], &want, Tolerance::for_dtype(F32));
        assert!(st.passes(), "{scale:?} {with_y} {gather}: {st}");
    }
}

/// Two core_parallel steps on v5e (one TensorCore).
#[tpu_kernel(grid = (2,), semantics = (core_parallel,))]
pub(crate) fn two_core_copy(
    #[shape(16, 128)]
    #[block([8, 128], |i| (i, 0))]
    x: In<f32>,
    #[shape(16, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    o.store(.., x.load(..));
}

/// A grid error points at the attribute's `grid`, in the kernel's file.
#[test]
fn grid_errors_point_at_the_grid() {
    let e = two_core_copy::build(two_core_copy::Dims {}).unwrap_err();
    assert!(e.to_string().contains("[tpu-core-parallel]"), "{e}");
    let loc = e.0[0].loc.as_ref().expect("a located error");
    assert!(loc.file.ends_with("tests/it/language/dsl.rs"), "{loc}");
    let line = include_str!("dsl.rs")
        .lines()
        .position(|l| l.starts_with("#[tpu_kernel(grid = (2,), semantics = (core_parallel,))]"))
        .unwrap()
        + 1;
    assert_eq!(loc.line as usize, line, "{loc}");
}

/// `mesh = (..)` on `#[tpu_kernel]`, with `device_id`, `axis_index` and a
/// remote copy in the body: the same kernel as the ring permute's `.kir`
/// file, op for op.
#[tpu_kernel(grid = (), semantics = (), mesh = (x = 4))]
fn ring_permute(
    #[shape(8, 128)]
    #[any]
    x: In<f32>,
    #[shape(8, 128)]
    #[any]
    o: Out<f32>,
    #[shape()] send: DmaSemaphores,
    #[shape()] recv: DmaSemaphores,
) {
    let right = (device_id() + 1) % 4;
    let c = make_async_remote_copy(x, o, send.at(()), recv.at(()), right);
    c.start();
    c.wait_send();
    c.wait();
}

#[test]
fn a_mesh_kernel_in_the_dsl_is_the_kir_file_s_kernel() {
    let k = ring_permute::build(ring_permute::Dims {}).unwrap_or_else(|e| panic!("{e}"));
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/filetests/lower/ring-permute-tpu-custom-call.kir"
    );
    let file = kernel_ir::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(k.to_string(), file.to_string());
    assert_eq!(k.mesh.as_ref().map(|m| m.devices()), Some(4));
}
