//! Element-offset windows (Pallas's `pl.Element` block dims): a causal
//! three-tap sum and a centred two-tap sum read their halos through the
//! inputs' BlockSpecs, on every path against sums written from the
//! definitions (zero outside the array), with the sequence a whole number
//! of blocks or ragged; libtpu compiles them for every generation. Bad
//! windows are errors that say the fix.

use kernel_ir::prelude::*;
use kernel_ir::{VerifiedKernel, constant};
use kernels::check::Tolerance;
use proptest::prelude::*;

use crate::common::all_paths;

const COLS: usize = 128;
/// Output rows per grid step.
const BT: usize = 16;
/// Halo rows on each side of a window: a whole sublane tile of the dtype
/// (8 rows of 32 bits, 16 of bf16), so windows keep the TPU's tiling.
fn halo(dtype: DType) -> usize {
    8 * 4 / dtype.bytes()
}

/// `y[r] = x[r-2] + x[r-1] + x[r]` and `z[r] = x[r-1] + x[r+1]` over
/// `rows` rows, `x` zero outside them.
fn stencils(dtype: DType, rows: usize) -> Result<VerifiedKernel, kernel_ir::KernelErrors> {
    let steps = rows.div_ceil(BT);
    let tail = steps * BT - rows;
    let h = halo(dtype);
    // Windows of a power of two rows (Triton's tensors must be), the
    // padding after the array making the last one whole.
    let causal_rows = (h + BT).next_power_of_two();
    let centred_rows = (h + BT + h).next_power_of_two();
    let mut k = KernelBuilder::new("stencils");
    k.grid([steps], [Parallel]);
    let causal = k
        .input("x", dtype, [rows, COLS])
        .block([causal_rows, COLS], |[t]| (t * BT as i64, 0))
        .element_window([h, 0], [causal_rows - BT - h + tail, 0]);
    let centred = k
        .input("x2", dtype, [rows, COLS])
        .block([centred_rows, COLS], |[t]| (t * BT as i64, 0))
        .element_window([h, 0], [centred_rows - BT - h + tail, 0]);
    let y = k
        .output("y", dtype, [rows, COLS])
        .block([BT, COLS], |[t]| (t, 0));
    let z = k
        .output("z", dtype, [rows, COLS])
        .block([BT, COLS], |[t]| (t, 0));
    let zero = if dtype.is_float() {
        constant(0.0, dtype, [BT, COLS])
    } else {
        constant(0, dtype, [BT, COLS])
    };
    let row = iota(I32, [BT, COLS], 0) + program_id(0) * BT as i32;
    // Window row h is output row 0; `back` rows earlier is h - back.
    let tap = |w: Tile, back: i64| {
        let start = (h as i64 - back) as usize;
        let at = row - back as i32;
        let inside = at.ge(0) & at.lt(rows as i32);
        select(inside, w.slice(0, start..start + BT), zero)
    };
    let xc = causal.load(..);
    y.store(.., tap(xc, 2) + tap(xc, 1) + tap(xc, 0));
    let xs = centred.load(..);
    z.store(.., tap(xs, 1) + tap(xs, -1));
    k.build()
}

fn wants(x: &[f64], rows: usize) -> Vec<Vec<f64>> {
    let at = |r: i64, c: usize| {
        if r < 0 || r >= rows as i64 {
            0.0
        } else {
            x[r as usize * COLS + c]
        }
    };
    let each = |f: &dyn Fn(i64, usize) -> f64| -> Vec<f64> {
        (0..rows * COLS)
            .map(|i| f((i / COLS) as i64, i % COLS))
            .collect()
    };
    vec![
        each(&|r, c| at(r - 2, c) + at(r - 1, c) + at(r, c)),
        each(&|r, c| at(r - 1, c) + at(r + 1, c)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    #[test]
    fn element_windows_read_their_halos_on_every_path(
        seed in any::<u64>(),
        which in 0usize..3,
        ragged in any::<bool>(),
    ) {
        let dtype = [F32, BF16, I32][which];
        let rows = if ragged { 56 } else { 64 };
        let x = Array::random(dtype, [rows, COLS], seed, -4.0, 5.0);
        let want = wants(x.data(), rows);
        // Integer sums are exact; float sums round after each add.
        let tol = match dtype {
            // Two bf16 roundings of sums up to 15: 2 × 2⁻⁵.
            BF16 => Tolerance { abs: 0.07, rel: 1e-2 },
            F32 => Tolerance { abs: 1e-6, rel: 1e-6 },
            _ => Tolerance { abs: 0.0, rel: 0.0 },
        };
        all_paths(stencils(dtype, rows), &[x.clone(), x], want, &[tol, tol])?;
    }
}

#[test]
fn an_element_window_prints_parses_and_is_checked() {
    let kernel = stencils(F32, 56).unwrap();
    let text = kernel.to_string();
    assert!(text.contains("element low [8, 0] high [16, 0]"), "{text}");
    let back = kernel_ir::parse(&text).unwrap();
    assert_eq!(back.to_string(), text);
    for (from, to, says) in [
        (
            "element low [8, 0] high [16, 0]",
            "element low [8, 0] high [0, 0]",
            "[block-bounds] operand `x`: at grid index (3) the element window starts at (48, 0) and dim 0 covers elements 48..80 of the padded array, which has 8 + 56 + 0 = 64",
        ),
        (
            "element low [8, 0] high [16, 0]",
            "element low [8] high [16, 0]",
            "[element-window] operand `x`: the padding has 1 low and 2 high entries",
        ),
        (
            "block [16, 128] at (g0, 0) row_major",
            "block [16, 128] at (g0, 0) element low [0, 0] high [0, 0] row_major",
            "[element-window] operand `y`: element windows are for inputs (y is out)",
        ),
    ] {
        assert!(text.contains(from), "{from} in {text}");
        let err = match kernel_ir::parse(&text.replacen(from, to, 1)) {
            Err(e) => e.to_string(),
            Ok(k) => k.verify().map(|_| ()).unwrap_err().to_string(),
        };
        assert!(err.contains(says), "{err}");
    }
}

#[test]
fn element_windows_compile_with_libtpu_for_every_generation() {
    let tpu = crate::targets::tpu_compile::tpu();
    for (dtype, rows) in [(F32, 64), (BF16, 56)] {
        let kernel = stencils(dtype, rows).unwrap();
        for t in kernel_ir::Target::ALL {
            if let Err(e) = tpu.compile_kernel(&kernel, t) {
                panic!("{dtype} on {t}: {e}");
            }
        }
    }
}

/// On the TPU a window with low padding is fetched shifted and rotated into
/// place at each load, so what cannot be rotated is refused with the fix:
/// a load at a dynamic start, and a copy reading the window.
#[test]
fn what_the_tpu_cannot_rotate_into_place_is_refused() {
    let build = |dynamic: bool| {
        let mut k = KernelBuilder::new("halo");
        k.grid([2], [Parallel]);
        let x = k
            .input("x", F32, [16, 128])
            .block([16, 128], |[t]| (t * 8, 0))
            .element_window([8, 0], [0, 0]);
        let o = k.output("o", F32, [16, 128]).block([8, 128], |[t]| (t, 0));
        let buf = k.scratch("buf", F32, [8, 128]);
        let sems = k.dma_semaphores("sems", [1]);
        if dynamic {
            o.store(.., x.load((ds(program_id(0) * 8, 8), ..)));
        } else {
            let c = make_async_copy(x.slice((8..16, ..)), buf.slice(..), sems.at(0));
            c.start();
            c.wait();
            o.store(.., buf.load(..));
        }
        k.build().unwrap()
    };
    for (dynamic, says) in [
        (true, "index it with static starts"),
        (false, "load it and store the tile where the copy should go"),
    ] {
        let err = lowering::tpu_custom_call(&build(dynamic))
            .unwrap_err()
            .to_string();
        assert!(err.contains("element window with low padding"), "{err}");
        assert!(err.contains(says), "{err}");
    }
}

/// Issue 70's fourth finding: an element window's padding was allocated
/// whole on the JIT and PJRT paths (a low padding of 4·10^6 rows on an
/// 8 KiB input took 2.1 GB and 14 s; 2·10^9 rows, about 1 TB). Now the CPU
/// paths store only the part of the padded array that the array and the
/// windows cover (`Kernel::element_reach`): the same kernel with its
/// window placed after 2·10^9 rows of padding instead of 8 gives the same
/// outputs on every path, from 24 stored rows.
#[test]
fn padding_no_window_reads_is_never_stored() {
    let kernel = |low: i64| {
        format!(
            "kernel @far_window {{
  target v5e, vmem_limit default
  grid [2 parallel]
  in @x: f32[16, 128] vmem block [16, 128] at (((g0 * 8) + {}), 0) element low [{low}, 0] high [0, 0] row_major
  out @o: f32[16, 128] vmem block [8, 128] at (g0, 0) row_major
body:
  %0 = load @x[0:16, 0:128] : f32[16, 128]
  %1 = slice %0, axis 0, start 7, len 8 : f32[16, 128] -> f32[8, 128]
  %2 = slice %0, axis 0, start 8, len 8 : f32[16, 128] -> f32[8, 128]
  %3 = iota dim 0 : i32[8, 128]
  %4 = program_id 0 : i32
  %5 = constant 8 : i32
  %6 = mul %4, %5 : i32
  %7 = broadcast_in_dim %6, dims [] : i32 -> i32[8, 128]
  %8 = add %3, %7 : i32[8, 128]
  %9 = constant 1 : i32[8, 128]
  %10 = cmp ge %8, %9 : i32[8, 128]
  %11 = constant 0 : f32[8, 128]
  %12 = select %10, %1, %11 : f32[8, 128]
  %13 = add %2, %12 : f32[8, 128]
  store @o[0:8, 0:128], %13 : f32[8, 128]
}}
",
            low - 8
        )
    };
    let near = kernel_ir::parse(&kernel(8)).unwrap().verify().unwrap();
    let far = kernel_ir::parse(&kernel(2_000_000_000))
        .unwrap()
        .verify()
        .unwrap();
    assert_eq!(
        far.element_reach(0),
        Some(vec![(1_999_999_992, 2_000_000_016), (0, 128)])
    );
    let d = tooling::resources::Demand::of(&far);
    assert!(d.bytes < 1 << 20, "{} bytes", d.bytes);
    let x = Array::random(F32, [16, 128], 5, -1.0, 1.0);
    // Row r: x[r] + x[r - 1] (0 before the first row).
    let want: Vec<f64> = (0..16 * 128)
        .map(|i| {
            let before = if i >= 128 { x.data()[i - 128] } else { 0.0 };
            x.data()[i] + before
        })
        .collect();
    for k in [near, far] {
        for b in runtime::backend::Backend::ALL {
            let got = runtime::backend::Prepared::new(b, &k)
                .and_then(|p| p.run(std::slice::from_ref(&x)))
                .unwrap_or_else(|e| panic!("{b}: {e}"));
            let err = got[0]
                .data()
                .iter()
                .zip(&want)
                .map(|(g, w)| (g - w).abs())
                .fold(0f64, f64::max);
            assert!(err <= 1e-6, "{b}: max abs error {err}");
        }
    }
}
