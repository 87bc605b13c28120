//! Copies, semaphores and scopes: the verifier's rules (spanned), and each
//! DMA bug the interpreter catches, at the line of the op that shows it.

// Interpreter errors are returned as they are.
#![allow(clippy::result_large_err)]

use kernel_ir::prelude::*;
use kernel_ir::{DimSemantics, ErrorKind, InterpOptions, KernelError, SemArray, interpret_with};

/// `x: any f32[4, 8, 128]`, `o: f32[4 * 8, 128]` in row blocks, scratch
/// `buf: [2, 8, 128]`, DMA semaphores `sems: [2]`; `body` writes the rest.
fn kernel(
    semantics: DimSemantics,
    body: impl FnOnce(Ref, Ref, Ref, SemArray),
) -> kernel_ir::VerifiedKernel {
    let mut k = KernelBuilder::new("dma_case");
    k.grid([4], [semantics]);
    let x = k.input("x", F32, [4, 8, 128]).space(MemorySpace::Any);
    let o = k.output("o", F32, [32, 128]).block([8, 128], |[i]| (i, 0));
    let buf = k.scratch("buf", F32, [2, 8, 128]);
    let sems = k.dma_semaphores("sems", [2]);
    body(x, o, buf, sems);
    k.build().unwrap_or_else(|e| panic!("{e}"))
}

fn input() -> Array {
    Array::random(F32, [4, 8, 128], 3, -1.0, 1.0)
}

fn run(k: &kernel_ir::VerifiedKernel, opts: &InterpOptions) -> Result<Vec<Array>, KernelError> {
    interpret_with(k, &[input()], opts)
}

/// The race error, checked to come from `line` and to mention `words`.
fn race_at(r: Result<Vec<Array>, KernelError>, line: u32, words: &[&str]) {
    let e = r.expect_err("the interpreter must reject this kernel");
    assert!(
        matches!(e.kind, ErrorKind::DmaRace { .. }),
        "not a DMA race: {e}"
    );
    let at = e.loc.as_ref().map(|l| l.line);
    assert_eq!(at, Some(line), "reported at the wrong line: {e}");
    let text = e.to_string();
    for w in words {
        assert!(text.contains(w), "`{w}` not in: {text}");
    }
}

/// Copies row block `i` of `x` into slot `i % 2`, waits, stores 2x it.
#[test]
fn a_correct_copy_gives_the_answer() {
    let k = kernel(Arbitrary, |x, o, buf, sems| {
        let i = program_id(0);
        let c = make_async_copy(
            x.slice((i, .., ..)),
            buf.slice((i % 2, .., ..)),
            sems.at(i % 2),
        );
        c.start();
        c.wait();
        o.store(.., buf.load((i % 2, .., ..)) * 2.0);
    });
    let x = input();
    for opts in [
        InterpOptions::default(),
        InterpOptions {
            dma_seed: Some(5),
            ..Default::default()
        },
    ] {
        let out = interpret_with(&k, std::slice::from_ref(&x), &opts).unwrap();
        let bad = out[0]
            .data()
            .iter()
            .zip(x.data())
            .filter(|(o, x)| **o != 2.0 * **x)
            .count();
        assert_eq!(bad, 0);
    }
}

#[test]
fn reading_a_destination_before_the_wait_is_caught() {
    let mut line = 0;
    let k = kernel(Arbitrary, |x, o, buf, sems| {
        let i = program_id(0);
        let c = make_async_copy(x.slice((i, .., ..)), buf.slice((0, .., ..)), sems.at(0));
        c.start();
        line = line!() + 1;
        let early = buf.load((0, .., ..));
        c.wait();
        o.store(.., early);
    });
    race_at(
        run(&k, &Default::default()),
        line,
        &["reads `buf`", "destination", "wait on the copy"],
    );
}

#[test]
fn overwriting_a_source_before_the_wait_is_caught() {
    let mut line = 0;
    let k = kernel(Arbitrary, |_, o, buf, sems| {
        buf.store((1, .., ..), 1.0);
        let c = make_async_copy(buf.slice((1, .., ..)), buf.slice((0, .., ..)), sems.at(0));
        c.start();
        line = line!() + 1;
        buf.store((1, .., ..), 2.0);
        c.wait();
        o.store(.., buf.load((0, .., ..)));
    });
    race_at(
        run(&k, &Default::default()),
        line,
        &["writes `buf`", "source"],
    );
}

#[test]
fn waiting_a_copy_never_started_is_caught() {
    let mut line = 0;
    let k = kernel(Arbitrary, |x, o, buf, sems| {
        let i = program_id(0);
        let c = make_async_copy(x.slice((i, .., ..)), buf.slice((0, .., ..)), sems.at(0));
        line = line!() + 1;
        c.wait();
        o.store(.., buf.load((0, .., ..)));
    });
    race_at(
        run(&k, &Default::default()),
        line,
        &["sems[0]", "never started", "never returns"],
    );
}

#[test]
fn starting_a_copy_into_a_buffer_with_one_in_flight_is_caught() {
    let mut line = 0;
    let k = kernel(Arbitrary, |x, o, buf, sems| {
        let i = program_id(0);
        let a = make_async_copy(x.slice((i, .., ..)), buf.slice((0, .., ..)), sems.at(0));
        a.start();
        let b = make_async_copy(
            x.slice(((i + 1) % 4, .., ..)),
            buf.slice((0, .., ..)),
            sems.at(1),
        );
        line = line!() + 1;
        b.start();
        a.wait();
        b.wait();
        o.store(.., buf.load((0, .., ..)));
    });
    race_at(
        run(&k, &Default::default()),
        line,
        &["starts a copy into `buf`", "another buffer slot"],
    );
}

#[test]
fn a_kernel_ending_with_a_copy_in_flight_is_caught() {
    let mut line = 0;
    let k = kernel(Arbitrary, |x, o, buf, sems| {
        let i = program_id(0);
        o.store(.., 0.0);
        // Prefetches the next block but the last step's prefetch (of
        // block 0 again) is never waited.
        let c = make_async_copy(
            x.slice(((i + 1) % 4, .., ..)),
            buf.slice((i % 2, .., ..)),
            sems.at(i % 2),
        );
        line = line!() + 1;
        c.start();
        when(i.gt(0), || {
            make_async_copy(
                x.slice((i, .., ..)),
                buf.slice(((i + 1) % 2, .., ..)),
                sems.at((i + 1) % 2),
            )
            .wait();
        });
    });
    race_at(
        run(&k, &Default::default()),
        line,
        &["still in flight when the kernel ends"],
    );
}

#[test]
fn a_copy_in_flight_across_a_parallel_step_is_caught() {
    let mut line = 0;
    let k = kernel(Parallel, |x, o, buf, sems| {
        let i = program_id(0);
        o.store(.., 0.0);
        when(i.eq(0), || {
            let c = make_async_copy(x.slice((1, .., ..)), buf.slice((1, .., ..)), sems.at(1));
            line = line!() + 1;
            c.start();
        });
        when(i.eq(1), || {
            make_async_copy(x.slice((1, .., ..)), buf.slice((1, .., ..)), sems.at(1)).wait();
        });
    });
    race_at(
        run(&k, &Default::default()),
        line,
        &["parallel grid index changes", "arbitrary"],
    );
}

#[test]
fn a_wait_of_the_wrong_size_is_caught() {
    let mut line = 0;
    let k = kernel(Arbitrary, |x, o, buf, sems| {
        let i = program_id(0);
        make_async_copy(x.slice((i, .., ..)), buf.slice((0, .., ..)), sems.at(0)).start();
        line = line!() + 1;
        make_async_copy(x.slice((i, 0..4, ..)), buf.slice((0, 0..4, ..)), sems.at(0)).wait();
        o.store(.., 0.0);
    });
    race_at(
        run(&k, &Default::default()),
        line,
        &["waits for 2048 bytes", "move 4096 bytes"],
    );
}

#[test]
fn an_out_of_bounds_window_is_caught_at_the_copy() {
    let line;
    let k = {
        let mut l = 0;
        let k = kernel(Arbitrary, |x, o, buf, sems| {
            let i = program_id(0);
            let c = make_async_copy(x.slice((i + 1, .., ..)), buf.slice((0, .., ..)), sems.at(0));
            l = line!() + 1;
            c.start();
            c.wait();
            o.store(.., buf.load((0, .., ..)));
        });
        line = l;
        k
    };
    let e = run(&k, &Default::default()).unwrap_err();
    assert!(
        matches!(e.kind, ErrorKind::DynamicOutOfBounds { .. }),
        "{e}"
    );
    assert_eq!(e.loc.as_ref().map(|l| l.line), Some(line), "{e}");
    assert!(e.to_string().contains("elements 4..5 are outside"), "{e}");
}

/// Two copies share a semaphore; the body waits once, reads the first
/// copy's buffer, then waits again. Hardware may retire either copy at the
/// first wait, so reading there is a race the default order hides and a
/// random order finds.
#[test]
fn a_random_completion_order_finds_a_shared_semaphore_bug() {
    let mut line = 0;
    let k = kernel(Arbitrary, |x, o, buf, sems| {
        let i = program_id(0);
        let a = make_async_copy(x.slice((i, .., ..)), buf.slice((0, .., ..)), sems.at(0));
        let b = make_async_copy(
            x.slice(((i + 1) % 4, .., ..)),
            buf.slice((1, .., ..)),
            sems.at(0),
        );
        a.start();
        b.start();
        a.wait();
        line = line!() + 1;
        let first = buf.load((0, .., ..));
        b.wait();
        o.store(.., first + buf.load((1, .., ..)));
    });
    assert!(run(&k, &Default::default()).is_ok());
    let failures: Vec<KernelError> = (0..16)
        .filter_map(|seed| {
            run(
                &k,
                &InterpOptions {
                    dma_seed: Some(seed),
                    ..Default::default()
                },
            )
            .err()
        })
        .collect();
    assert!(!failures.is_empty(), "no seed retired the other copy first");
    race_at(
        Err(failures[0].clone()),
        line,
        &["reads `buf`", "destination"],
    );
}

#[test]
fn regular_semaphores_count_and_must_end_at_zero() {
    let mut k = KernelBuilder::new("sem_count");
    k.grid([2], [Arbitrary]);
    let o = k
        .output("o", I32, [2, 8, 128])
        .block([1, 8, 128], |[i]| (i, 0, 0));
    let s = k.semaphores("s", [2]);
    let i = program_id(0);
    s.at(i).signal(3);
    s.at(i).signal(i + 1);
    let v = s.at(i).read();
    s.at(i).wait(v);
    o.store((0, .., ..), v);
    let k = k.build().unwrap();
    let out = interpret_with(&k, &[], &Default::default()).unwrap();
    assert_eq!(out[0].data()[0], 4.0);
    assert_eq!(out[0].data()[8 * 128], 5.0);

    // A signal no wait takes back: reported at the signal.
    let mut k = KernelBuilder::new("sem_left");
    k.grid([1], [Arbitrary]);
    let o = k.output("o", I32, [8, 128]);
    let s = k.semaphores("s", []);
    let line = line!() + 1;
    s.at(()).signal(2);
    s.at(()).wait(1);
    o.store(.., 0);
    race_at(
        interpret_with(&k.build().unwrap(), &[], &Default::default()),
        line,
        &["`s[]` holds 1 when the kernel ends"],
    );

    // A wait nothing can satisfy hangs a TPU.
    let mut k = KernelBuilder::new("sem_hang");
    k.grid([1], [Arbitrary]);
    let o = k.output("o", I32, [8, 128]);
    let s = k.semaphores("s", [1]);
    s.at(0).signal(1);
    let line = line!() + 1;
    s.at(0).wait(2);
    o.store(.., 0);
    race_at(
        interpret_with(&k.build().unwrap(), &[], &Default::default()),
        line,
        &["waits for 2", "holds 1", "never returns"],
    );
}

#[test]
fn a_scope_ending_with_its_copy_in_flight_is_caught() {
    let mut line = 0;
    let k = kernel(Arbitrary, |x, o, _, _| {
        let i = program_id(0);
        line = line!() + 1;
        scoped(|s| {
            let tmp = s.vmem("tmp", F32, [8, 128]);
            let sem = s.dma_semaphores("sem", []);
            make_async_copy(x.slice((i, .., ..)), tmp, sem.at(())).start();
            o.store(.., 0.0);
        });
    });
    race_at(
        run(&k, &Default::default()),
        line,
        &[
            "ends while the copy of `x` into `tmp`",
            "wait on it inside the scope",
        ],
    );
}

#[test]
fn scoped_buffers_exist_only_inside_their_scope_and_count_in_the_budget() {
    // Used after its scope: an error at the use.
    let mut k = KernelBuilder::new("escape");
    k.grid([1], [Arbitrary]);
    let o = k.output("o", F32, [8, 128]);
    let mut kept = None;
    scoped(|s| {
        let t = s.vmem("t", F32, [8, 128]);
        t.store(.., 1.0);
        kept = Some(t);
    });
    let line = line!() + 1;
    o.store(.., kept.unwrap().load(..));
    let e = k.build().unwrap_err();
    let first = &e.0[0];
    assert!(
        first
            .to_string()
            .contains("`t` is allocated by a `scoped` block"),
        "{first}"
    );
    assert_eq!(first.loc.as_ref().map(|l| l.line), Some(line));

    // The budget lists a scoped buffer, and too large a one overflows it.
    let mut k = KernelBuilder::new("big_scope");
    k.grid([1], [Arbitrary]);
    let o = k.output("o", F32, [8, 128]);
    scoped(|s| {
        let t = s.vmem("t", F32, [8192, 1024]);
        t.store((0..8, 0..128), 1.0);
        o.store(.., t.load((0..8, 0..128)));
    });
    let e = k.build().unwrap_err();
    assert!(e.any(|k| matches!(k, ErrorKind::VmemOverflow(b) if b.items.iter().any(|i| i.name == "t" && i.kind == "scoped"))), "{e}");
}

/// A count carried along an arbitrary dim, inside each parallel group, runs
/// alike on every path (the host JIT gives each parallel group its own
/// counters, zeroed at the group's first step).
#[test]
fn a_count_carried_along_an_arbitrary_dim_runs_on_every_path() {
    let mut k = KernelBuilder::new("count");
    k.grid([4, 2], [Parallel, Arbitrary]);
    let o = k
        .output("o", I32, [32, 128])
        .block([8, 128], |[i, _]| (i, 0));
    let c = k.semaphores("c", []);
    let (i, j) = (program_id(0), program_id(1));
    when(j.eq(0), || c.at(()).signal(i + 1));
    when(j.eq(1), || {
        let v = c.at(()).read();
        c.at(()).wait(v);
        o.store(.., v);
    });
    let k = k.build().unwrap();
    let want: Vec<f64> = (0..32 * 128).map(|e| (e / (8 * 128) + 1) as f64).collect();
    let tol = [kernels::check::Tolerance { abs: 0.0, rel: 0.0 }];
    let reports =
        tooling::paths::run_paths(&k, &[], &runtime::backend::Backend::ALL, &[want], &tol);
    assert_eq!(reports.len(), runtime::backend::Backend::ALL.len());
    for r in reports {
        assert!(r.passes(), "{r}");
    }

    // Left non-zero when the parallel index changes: a count that would
    // cross to another core.
    let mut k = KernelBuilder::new("count_left");
    k.grid([2], [Parallel]);
    let o = k.output("o", I32, [16, 128]).block([8, 128], |[i]| (i, 0));
    let c = k.semaphores("c", []);
    let line = line!() + 1;
    c.at(()).signal(1);
    o.store(.., 0);
    race_at(
        interpret_with(&k.build().unwrap(), &[], &Default::default()),
        line,
        &["holds 1 when a parallel grid index changes"],
    );
}
