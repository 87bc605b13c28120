//! `kernel_ir::parse` is the inverse of the printer: every library kernel
//! and preset, and every random kernel the generator builds, reads back
//! from its text as the same kernel (equal as data, locations aside), and
//! malformed text is an error naming the line and column.

use kernel_ir::{Kernel, Region, parse, parse_file};
use kernels::{Config, ENTRIES, presets};
use tests::random_kernel::random_kernel;

/// `k` without source locations (the text form has none).
fn without_locs(k: &Kernel) -> Kernel {
    fn region(r: &mut Region) {
        for op in &mut r.ops {
            op.loc = None;
            for sub in op.kind.regions_mut() {
                region(sub);
            }
        }
    }
    let mut k = k.clone();
    k.grid_loc = None;
    k.loc = None;
    if let Some(m) = &mut k.mesh {
        m.loc = None;
    }
    k.operands.iter_mut().for_each(|o| o.loc = None);
    k.scratch.iter_mut().for_each(|s| s.loc = None);
    k.prefetch.iter_mut().for_each(|p| p.loc = None);
    k.semaphores.iter_mut().for_each(|s| s.loc = None);
    region(&mut k.body.region);
    k
}

/// Reads `k`'s text back and compares; `what` names it in failures.
fn round_trip(k: &Kernel, what: &str) {
    let text = k.to_string();
    let back = parse(&text).unwrap_or_else(|e| panic!("{what}: {e}\n{text}"));
    assert_eq!(back.to_string(), text, "{what}: the text changed");
    let want = without_locs(k);
    if back != want {
        // The first field that differs, from the pretty debug forms.
        let (a, b) = (format!("{back:#?}"), format!("{want:#?}"));
        let at = a.lines().zip(b.lines()).position(|(x, y)| x != y);
        let context = |s: &str| -> String {
            let l: Vec<&str> = s.lines().collect();
            let i = at
                .unwrap_or(l.len().saturating_sub(1))
                .min(l.len().saturating_sub(1));
            l[i.saturating_sub(8)..=i].join("\n")
        };
        panic!(
            "{what}: the kernel read back differs from the one printed\nread back:\n{}\nprinted:\n{}",
            context(&a),
            context(&b)
        );
    }
}

#[test]
fn every_library_kernel_and_preset_reads_back_as_itself() {
    let mut n = 0;
    for e in ENTRIES {
        let cfg = Config::parse(e, &[]).unwrap();
        let k = e.build_at_default_shapes(&cfg).unwrap();
        round_trip(&k, e.name);
        assert!(
            parse(&k.to_string()).unwrap().verify().is_ok(),
            "{}",
            e.name
        );
        n += 1;
    }
    for p in presets() {
        round_trip(&p.build().unwrap(), p.name());
        n += 1;
    }
    assert!(n > 40, "{n}");
}

#[test]
fn random_kernels_read_back_as_themselves() {
    let mut valid = 0;
    for seed in 0..400 {
        let r = random_kernel(seed);
        let Ok(k) = r.kernel else { continue };
        round_trip(&k, &format!("random kernel {seed}"));
        // The verifier's answer is the same on the kernel read back.
        let b = parse(&k.to_string()).unwrap().verify().is_ok();
        let a = k.verify().is_ok();
        assert_eq!(a, b, "random kernel {seed}");
        valid += usize::from(a);
    }
    assert!(valid > 100, "only {valid} random kernels verified");
}

/// Each op of a file gets the file and its line as location, so a
/// verifier error names the line.
#[test]
fn a_file_s_ops_carry_their_lines() {
    let text = "\
kernel @k {
  target v5e, vmem_limit default
  grid [2 parallel]
  in @x: f32[16, 128] vmem block [8, 128] at (g0, 0) row_major
  out @o: f32[16, 128] vmem block [8, 128] at (g0, 0) row_major
body:
  %0 = load @x[0:8, 0:128] : f32[8, 128]
  %1 = exp %0 : f32[8, 128]
  store @o[0:8, 0:128], %1 : f32[8, 128]
}
";
    let k = parse_file("k.kir", text).unwrap();
    let lines: Vec<u32> = k
        .body
        .region
        .ops
        .iter()
        .map(|op| op.loc.as_ref().unwrap().line)
        .collect();
    assert_eq!(lines, [7, 8, 9]);
    assert_eq!(k.operands[1].loc.as_ref().unwrap().line, 5);
    assert_eq!(&*k.operands[1].loc.as_ref().unwrap().file, "k.kir");
}

#[test]
fn malformed_text_is_an_error_naming_line_and_column() {
    let good = "\
kernel @k {
  target v5e, vmem_limit default
  grid [2 parallel]
  in @x: f32[16, 128] vmem block [8, 128] at (g0, 0) row_major
  out @o: f32[16, 128] vmem block [8, 128] at (g0, 0) row_major
body:
  %0 = load @x[0:8, 0:128] : f32[8, 128]
  store @o[0:8, 0:128], %0 : f32[8, 128]
}
";
    assert!(parse(good).is_ok());
    let cases: &[(&str, &str, u32, &str)] = &[
        ("target v5e", "target v9z", 2, "unknown TPU target"),
        (
            "2 parallel",
            "2 sideways",
            3,
            "parallel, arbitrary or core_parallel",
        ),
        ("load @x", "load @y", 7, "`@y` is not an operand"),
        ("%0 = load", "%0 = frobnicate", 7, "unknown op `frobnicate`"),
        (
            "f32[8, 128]\n  store",
            "f32[8, 128\n  store",
            7,
            "expected `]`",
        ),
        ("row_major\nbody", "diagonal\nbody", 5, "expected a layout"),
        ("}\n", "", 8, "a `}` is missing"),
        ("0:8, 0:128] :", "8:0, 0:128] :", 7, "ends before it starts"),
    ];
    for (from, to, line, says) in cases {
        assert!(good.contains(from), "{from}");
        let bad = good.replacen(from, to, 1);
        let e = parse(&bad).expect_err(from);
        assert_eq!(e.line, *line, "{from} -> {to}: {e}");
        assert!(e.to_string().contains(says), "{from} -> {to}: {e}");
    }
    // Nothing panics on arbitrary truncations of a valid text.
    for n in 0..good.len() {
        if good.is_char_boundary(n) {
            let _ = parse(&good[..n]);
        }
    }
}

/// A kernel across chips, built with the builder (mesh, device ids,
/// remote copies and their two waits, remote signals, the barrier),
/// verifies and reads back from its text as itself.
#[test]
fn a_kernel_across_chips_reads_back_as_itself() {
    use kernel_ir::prelude::*;
    let mut k = KernelBuilder::new("ring_step");
    k.grid([1], [Arbitrary]);
    k.mesh([("x", 2), ("y", 2)]);
    let x = k.input("x", F32, [8, 128]).space(MemorySpace::Any);
    let o = k.output("o", F32, [8, 128]).space(MemorySpace::Any);
    let send = k.dma_semaphores("send", []);
    let recv = k.dma_semaphores("recv", []);
    let barrier = k.barrier_semaphore();
    let right = (device_id() + 1) % 4;
    let left = (axis_index("x") * 2 + axis_index("y") + 3) % 4;
    barrier.signal_remote(1, right);
    barrier.signal_remote(1, left);
    barrier.wait(2);
    let c = make_async_remote_copy(x, o, send.at(()), recv.at(()), right);
    c.start();
    c.wait_send();
    c.wait();
    let kernel = k.build().unwrap_or_else(|e| panic!("{e}"));
    let text = kernel.to_string();
    assert!(text.contains("  mesh [x 2, y 2]"), "{text}");
    assert!(text.contains("to %"), "{text}");
    round_trip(&kernel, "ring_step");
    // A single-device path refuses it, naming the devices.
    let e = kernel_ir::interpret(&kernel, &[Array::zeros(F32, [8, 128])]).unwrap_err();
    assert!(
        e.to_string().contains("runs on the 4 devices of its mesh"),
        "{e}"
    );
    let Err(e) = lowering::HostKernel::compile(&kernel) else {
        panic!("the host JIT must refuse a kernel across chips");
    };
    assert!(
        e.to_string().contains("runs on the 4 devices of its mesh"),
        "{e}"
    );
    // The decomposed form is its SPMD program: a permute around the ring.
    let spmd = lowering::decomposed(&kernel).unwrap();
    assert!(
        spmd.contains("mhlo.num_replicas = 4") && spmd.contains("stablehlo.collective_permute"),
        "{spmd}"
    );
}

/// Text sized to exhaust memory or the stack is refused by the limits
/// (`kernel_ir::limits`), quickly, with the line and column: a value
/// number the reader would size a table by (`%4000000000` asked for
/// 128 GB), regions nested 5,000 deep and index expressions nested
/// 50,000 deep (each overflowed the stack).
#[test]
fn hostile_sizes_and_nesting_are_refused_by_the_limits() {
    let head = "kernel @k {\n  target v5e, vmem_limit default\n  grid [1 parallel]\n";
    let out = "  out @o: f32[8, 128] vmem block [8, 128] at (0, 0) row_major\nbody:\n";
    let value = format!("{head}{out}  %4000000000 = constant 1.0 : f32[8, 128]\n}}\n");
    let n = 5000;
    let nested = format!(
        "{head}{out}  %0 = constant true : bool\n{}{}}}\n",
        "  if %0 {\n".repeat(n),
        "  }\n".repeat(n)
    );
    let deep = 50_000;
    let expr = format!(
        "{head}  out @o: f32[8, 128] vmem block [8, 128] at ({}g0{}, 0) row_major\nbody:\n}}\n",
        "(".repeat(deep),
        " + 0)".repeat(deep)
    );
    for (text, line, what) in [
        (&value, 6, "value numbers are 0 to 1048575"),
        (
            &nested,
            8 + kernel_ir::limits::MAX_NESTING as u32,
            "regions",
        ),
        (&expr, 4, "index expressions nest more than"),
    ] {
        let started = std::time::Instant::now();
        let e = parse(text).unwrap_err();
        assert!(
            started.elapsed().as_secs() < 5,
            "{what}: took {:?}",
            started.elapsed()
        );
        assert_eq!(e.line, line, "{e}");
        let msg = e.to_string();
        assert!(msg.contains("[limit]") && msg.contains(what), "{msg}");
    }
    // At the limit, nesting still reads.
    let ok = kernel_ir::limits::MAX_NESTING;
    let fine = format!(
        "{head}{out}  %0 = constant true : bool\n{}{}}}\n",
        "  if %0 {\n".repeat(ok),
        "  }\n".repeat(ok)
    );
    parse(&fine).unwrap();
}

/// A carriage return or a byte-order mark in a kernel file is named in the
/// error, never echoed raw (a raw CR rewrote the terminal line).
#[test]
fn control_characters_are_escaped_in_parse_errors() {
    for bad in ["\r", "\u{feff}", "\u{1b}[2J"] {
        let text = format!(
            "kernel @k {{\n  target v5e, vmem_limit default\n  grid [1 parallel]{bad}\n}}\n"
        );
        let e = parse(&text).unwrap_err().to_string();
        assert!(
            !e.chars().any(|c| c.is_control() || c == '\u{feff}'),
            "{e:?}"
        );
    }
}
