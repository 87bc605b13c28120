//! A whole case from a seed: the grid, the operands and their blocks, a
//! body from [`super::Gen`], and inputs with the special values now and
//! then.

use kernel_ir::{Array, DType, SplitMix64};

use super::*;

/// Input values: multiples of 1/4 in [-4, 4], and now and then NaN, ±∞
/// or −0.
fn input(c: &mut Choose, dtype: DType, shape: [usize; 2], specials: bool) -> Array {
    let n = shape[0] * shape[1];
    let data = (0..n)
        .map(|_| match dtype {
            DType::Bool => c.below(2) as f64,
            DType::I32 => c.below(17) as f64 - 8.0,
            _ if specials && c.chance(2) => {
                c.pick(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0])
            }
            _ => (c.below(33) as f64 - 16.0) / 4.0,
        })
        .collect();
    Array::new(dtype, shape, data).expect("the shape holds n elements")
}

/// A well-typed kernel and its inputs from `seed`.
pub fn generate(seed: u64) -> Case {
    let mut c = SplitMix64(seed);
    let rows = c.pick(&[8, 16, 16, 32]);
    let lanes = 128;
    let g0 = 1 + c.below(3);
    // A second dim over lane blocks, parallel or arbitrary; with an
    // arbitrary one the output may be accumulated over it.
    let g1 = if c.chance(40) { 1 + c.below(3) } else { 0 };
    let s0 = c.pick(&["parallel", "arbitrary"]);
    let s1 = c.pick(&["parallel", "arbitrary"]);
    let accumulate = g1 > 0 && s1 == "arbitrary" && c.chance(50);
    let ragged = if g0 > 1 && c.chance(20) {
        1 + c.below(rows - 1)
    } else {
        0
    };
    let height = g0 * rows - ragged;
    let width = lanes * g1.max(1);
    let grid = if g1 > 0 {
        format!("grid [{g0} {s0}, {g1} {s1}]")
    } else {
        format!("grid [{g0} {s0}]")
    };
    let in_at = if g1 > 0 { "(g0, g1)" } else { "(g0, 0)" };
    let out_at = if g1 > 0 && !accumulate {
        "(g0, g1)"
    } else {
        "(g0, 0)"
    };
    let out_width = if out_at == "(g0, g1)" { width } else { lanes };
    let specials = c.chance(30);
    let n_in = 1 + c.below(3);
    let mut head = vec![
        format!("kernel @fuzz_{:x} {{", seed & 0xffff_ffff),
        "  target v5e, vmem_limit default".into(),
        format!("  {grid}"),
    ];
    let mut inputs = Vec::new();
    let mut loads = Vec::new();
    for i in 0..n_in {
        let dtype = c.pick(&[DType::F32, DType::F32, DType::BF16, DType::I32, DType::Bool]);
        // bf16 tiles need 16 rows, bool tiles 32.
        let dtype = match dtype {
            DType::BF16 if rows < 16 => DType::F32,
            DType::Bool if rows < 32 => DType::I32,
            d => d,
        };
        head.push(format!(
            "  in @x{i}: {dtype}[{height}, {width}] vmem block [{rows}, {lanes}] at {in_at} row_major"
        ));
        inputs.push((
            format!("x{i}"),
            input(&mut c, dtype, [height, width], specials),
        ));
        loads.push(dtype);
    }
    let out_dtype = c.pick(&[DType::F32, DType::F32, DType::F32, DType::BF16, DType::I32]);
    let out_dtype = if out_dtype == DType::BF16 && rows < 16 {
        DType::F32
    } else {
        out_dtype
    };
    head.push(format!(
        "  out @o: {out_dtype}[{height}, {out_width}] vmem block [{rows}, {lanes}] at {out_at} row_major"
    ));
    if accumulate {
        head.push(format!("  scratch @acc: f32[{rows}, {lanes}] vmem"));
    }
    head.push("body:".into());
    let mut g = Gen {
        c,
        lines: Vec::new(),
        indent: 0,
        next: 0,
        vals: Vec::new(),
        rows,
        lanes,
        grid_dims: if g1 > 0 { 2 } else { 1 },
        ops_left: 0,
    };
    g.ops_left = 3 + g.c.below(10);
    let (tf, slice) = (g.tile(Ty::F32), format!("[0:{rows}, 0:{lanes}]"));
    for (i, d) in loads.iter().enumerate() {
        let t = format!("{d}[{rows}, {lanes}]");
        let id = g.fresh();
        g.emit(format!("%{id} = load @x{i}{slice} : {t}"));
        let ex = Ex::exact(2, 3);
        match d {
            DType::F32 => g.vals.push(Val {
                id,
                ty: Ty::F32,
                ex,
            }),
            DType::I32 => {
                g.vals.push(Val {
                    id,
                    ty: Ty::I32,
                    ex: Ex::exact(0, 4),
                });
                g.def_to(format!("convert %{id} : {t} ->"), Ty::F32, Ex::exact(0, 4));
            }
            DType::Bool => {
                g.vals.push(Val {
                    id,
                    ty: Ty::Bool,
                    ex: Ex::exact(0, 1),
                });
            }
            _ => {
                g.def_to(format!("convert %{id} : {t} ->"), Ty::F32, ex);
            }
        }
    }
    g.block(0, 20);
    let mut result = g.pick(Ty::F32, |_| true);
    if accumulate {
        let p = g.scalar("program_id 1".into());
        let z = g.scalar("constant 0".into());
        let first = g.fresh();
        g.emit(format!("%{first} = cmp eq %{p}, %{z} : i32"));
        // Initialized at the first step of the arbitrary dim, the
        // pattern the verifier accepts for state across steps.
        let zero = g.fresh();
        g.emit(format!("if %{first} {{"));
        g.emit(format!("  %{zero} = constant 0.0 : {tf}"));
        g.emit(format!("  store @acc{slice}, %{zero} : {tf}"));
        g.emit("}".into());
        let prev = g.fresh();
        g.emit(format!("%{prev} = load @acc{slice} : {tf}"));
        let sum = g.fresh();
        g.emit(format!("%{sum} = add %{prev}, %{} : {tf}", result.id));
        g.emit(format!("store @acc{slice}, %{sum} : {tf}"));
        result = Val {
            id: sum,
            ty: Ty::F32,
            ex: Ex::Rounded {
                mag: result.ex.mag() * 4.0,
            },
        };
    }
    let out = match out_dtype {
        DType::F32 => result.id,
        DType::I32 => {
            let x = g.pick(
                Ty::F32,
                |v| matches!(v.ex, Ex::Exact { int, .. } if int <= 30),
            );
            let id = g.fresh();
            g.emit(format!(
                "%{id} = convert %{} : {tf} -> i32[{rows}, {lanes}]",
                x.id
            ));
            id
        }
        d => {
            let id = g.fresh();
            g.emit(format!(
                "%{id} = convert %{} : {tf} -> {d}[{rows}, {lanes}]",
                result.id
            ));
            id
        }
    };
    g.emit(format!(
        "store @o{slice}, %{out} : {out_dtype}[{rows}, {lanes}]"
    ));
    let mut text = head;
    text.extend(g.lines);
    text.push("}".into());
    Case {
        text: text.join("\n") + "\n",
        inputs,
        mutations: Vec::new(),
    }
}
