//! What running a kernel on this machine will take, known before it runs:
//! the bytes its host arrays need and the work its grid and loops do, each
//! against a limit a command can raise. A shape of 65536 × 65536 is then a
//! one-line refusal with the numbers, not an allocation that aborts the
//! process; a loop of 2^24 trips in every grid step is refused before it
//! occupies the interpreter for minutes.
//!
//! ```
//! use kernel_ir::prelude::*;
//! use tooling::resources::{Demand, Limits};
//!
//! let mut k = KernelBuilder::new("copy");
//! k.grid([2], [Parallel]);
//! let x = k.input("x", F32, [16, 128]).block([8, 128], |[i]| (i, 0));
//! let o = k.output("o", F32, [16, 128]).block([8, 128], |[i]| (i, 0));
//! o.store(.., x.load(..));
//! let kernel = k.build().unwrap();
//!
//! let d = Demand::of(&kernel);
//! assert_eq!(d.bytes, 2 * 16 * 128 * (8 + 4)); // x and o, as f64 and as f32
//! assert_eq!(d.work, 2 * 2 * 8 * 128); // 2 steps of a load and a store
//! assert!(Limits { max_memory: 1 << 20, max_work: 1 << 20 }.check(&d).is_ok());
//! assert!(Limits { max_memory: 1 << 10, max_work: 1 << 20 }.check(&d).is_err());
//! ```

use kernel_ir::{Body, IndexValue, Kernel, OpKind, Region, ValueId};

/// The default of `--max-work`: 2^34 element-ops (grid steps × loop trips
/// × each body op's elements). Measured here: the checking interpreter
/// runs about 8·10^7 a second, Triton's interpreter about 2·10^7 (a loop
/// of 2^16 trips of an 8 × 128 add in 4 grid steps: 3.4 s and 11.9 s, the
/// JIT 0.14 s), so this bounds a run to about 4 minutes on the
/// interpreter and 15 on Triton's; a 2^24-trip loop in 4 steps is 2^36.
pub const DEFAULT_MAX_WORK: u128 = 1 << 34;

/// What a kernel run takes on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Demand {
    /// Bytes of its arrays: every argument and output as the host holds
    /// it (f64 per element) and once more in its own dtype (the buffer a
    /// path hands the kernel), an element window's array with the padding
    /// its windows reach ([`kernel_ir::Kernel::element_reach`]; all of it
    /// where that is known only at run time), as the CPU paths store it.
    pub bytes: u128,
    /// Element-ops run: grid steps × each body op's elements (its largest
    /// operand or result, at least 1) times the trips of the loops around
    /// it (a loop with a bound known only at run time counts once: a
    /// lower bound there).
    pub work: u128,
}

impl Demand {
    /// The demand of running `k` once. Checked arithmetic throughout (in
    /// u128, saturating): any shape gives a number.
    pub fn of(k: &Kernel) -> Demand {
        let mut bytes: u128 = 0;
        for p in &k.prefetch {
            bytes = bytes.saturating_add(elements(&p.shape).saturating_mul(8 + 4));
        }
        for (i, o) in k.operands.iter().enumerate() {
            let mut shape: Vec<u128> = o.shape.iter().map(|&n| n as u128).collect();
            if let Some(pad) = &o.block.element {
                // What the CPU paths store of the padded array: the part
                // the run touches, where that is known before it runs.
                match k.element_reach(i) {
                    Some(reach) => {
                        for (n, (lo, hi)) in shape.iter_mut().zip(reach) {
                            *n = (hi - lo) as u128;
                        }
                    }
                    None => {
                        for (d, n) in shape.iter_mut().enumerate() {
                            let low = pad.low.get(d).copied().unwrap_or(0) as u128;
                            let high = pad.high.get(d).copied().unwrap_or(0) as u128;
                            *n = n.saturating_add(low).saturating_add(high);
                        }
                    }
                }
            }
            let n = shape.iter().fold(1u128, |a, &d| a.saturating_mul(d));
            let per = 8 + o.dtype.bytes() as u128;
            // An in-out operand is an argument and an output.
            let copies = if o.role.is_input() && o.role.is_output() {
                2
            } else {
                1
            };
            bytes = bytes.saturating_add(n.saturating_mul(per).saturating_mul(copies));
        }
        let steps = k
            .grid
            .dims
            .iter()
            .fold(1u128, |a, d| a.saturating_mul(d.bound as u128));
        Demand {
            bytes,
            work: steps.saturating_mul(region_work(&k.body, &k.body.region)),
        }
    }
}

fn elements(shape: &[usize]) -> u128 {
    shape
        .iter()
        .fold(1u128, |a, &d| a.saturating_mul(d as u128))
}

/// Element-ops of a region: each op counts the elements of its largest
/// operand or result (at least one), each loop's body times its trips.
fn region_work(body: &Body, r: &Region) -> u128 {
    let size = |v: ValueId| body.ty(v).map_or(1, |t| elements(&t.shape));
    let mut n: u128 = 0;
    for op in &r.ops {
        let own = op
            .kind
            .operands()
            .into_iter()
            .chain(op.results.iter().copied())
            .map(size)
            .fold(1u128, u128::max);
        n = n.saturating_add(own);
        let inner = match &op.kind {
            OpKind::For {
                lower,
                upper,
                step,
                body: inner,
                ..
            } => region_work(body, inner).saturating_mul(trips(lower, upper, *step)),
            other => other
                .regions()
                .into_iter()
                .map(|sub| region_work(body, sub))
                .fold(0u128, u128::saturating_add),
        };
        n = n.saturating_add(inner);
    }
    n
}

fn trips(lower: &IndexValue, upper: &IndexValue, step: i64) -> u128 {
    match (lower, upper) {
        (IndexValue::Static(l), IndexValue::Static(u)) if step > 0 => {
            if u <= l {
                0
            } else {
                ((*u as i128 - *l as i128 + step as i128 - 1) / step as i128) as u128
            }
        }
        // Known only at run time (a valid length, a page count): counted
        // once, so the demand is a lower bound there; the interpreter's
        // per-loop limit ([`kernel_ir::limits::MAX_LOOP_TRIPS`]) and the
        // children's time limits bound the rest. Counting the limit instead
        // refused every paged kernel (5·10^13 element-ops).
        _ => 1,
    }
}

/// The most a command may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes (`--max-memory`).
    pub max_memory: u128,
    /// Element-ops (`--max-work`).
    pub max_work: u128,
}

impl Limits {
    /// The defaults: a quarter of this machine's physical memory (8 GiB
    /// where it cannot be read) and [`DEFAULT_MAX_WORK`].
    pub fn defaults() -> Limits {
        Limits {
            max_memory: physical_memory().map_or(8 << 30, |m| m / 4) as u128,
            max_work: DEFAULT_MAX_WORK,
        }
    }

    /// `Ok` when `d` is within both limits, else the one-line reason with
    /// the numbers and the flag that raises the limit.
    pub fn check(&self, d: &Demand) -> Result<(), String> {
        if d.bytes > self.max_memory {
            return Err(format!(
                "needs {} of host memory for its arrays, more than --max-memory {}; give smaller shapes, or raise --max-memory (bytes, or with K, M, G, T)",
                human(d.bytes),
                human(self.max_memory)
            ));
        }
        if d.work > self.max_work {
            return Err(format!(
                "runs {} element-ops (grid steps × loop trips × each op's elements), more than --max-work {}; give fewer steps, trips or elements, or raise --max-work",
                d.work, self.max_work
            ));
        }
        Ok(())
    }
}

/// A byte count as people read it (`2.0 GiB`), past u64 as u64's most.
fn human(b: u128) -> String {
    kernel_ir::human_bytes(u64::try_from(b).unwrap_or(u64::MAX))
}

/// `--max-memory`'s value: bytes, or a number with `K`, `M`, `G` or `T`
/// (powers of 1024; `GiB` and `GB` read alike).
pub fn parse_bytes(s: &str) -> Result<u128, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u128 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size; give bytes, or a number with K, M, G or T"))?;
    let shift = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches(['B', 'I'])
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => {
            return Err(format!(
                "`{s}` has an unknown unit; give bytes, or a number with K, M, G or T"
            ));
        }
    };
    n.checked_mul(1u128 << shift)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// This machine's physical memory in bytes (Linux's `/proc/meminfo`).
pub fn physical_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_ir::parse;

    #[test]
    fn any_shape_is_a_number_and_the_limits_name_their_flags() {
        let text = "kernel @big {
  target v5e, vmem_limit default
  grid [2 parallel]
  in @x: f32[65536, 65536] any row_major
  out @o: f32[65536, 65536] any row_major
body:
  %0 = constant 0 : i32
}
";
        let k = parse(text).unwrap();
        let d = Demand::of(&k);
        assert_eq!(d.bytes, 2 * 65536 * 65536 * 12);
        let e = Limits {
            max_memory: 8 << 30,
            max_work: DEFAULT_MAX_WORK,
        }
        .check(&d)
        .unwrap_err();
        assert!(
            e.contains("96.0 GiB") && e.contains("--max-memory 8.0 GiB"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1);
    }

    #[test]
    fn loop_trips_multiply_the_grid() {
        let text = "kernel @spin {
  target v5e, vmem_limit default
  grid [4 parallel]
  in @x: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
  out @o: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
body:
  %0 = load @x[0:8, 0:128] : f32[8, 128]
  %3 = for %1 = 0 to 16777216 step 1 iter(%2 = %0) {
    %4 = add %2, %2 : f32[8, 128]
    yield %4
  }
  store @o[0:8, 0:128], %3 : f32[8, 128]
}
";
        let k = parse(text).unwrap();
        // load, for, store (1024 elements each), and the loop's add (1024)
        // 2^24 times, in 4 steps.
        assert_eq!(Demand::of(&k).work, 4 * 1024 * (3 + (1 << 24)));
        let e = Limits::defaults().check(&Demand::of(&k)).unwrap_err();
        assert!(e.contains("--max-work"), "{e}");
    }

    #[test]
    fn sizes_read_with_units() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1 T"), Ok(1 << 40));
        assert!(
            parse_bytes("-1").is_err() && parse_bytes("1X").is_err() && parse_bytes("").is_err()
        );
    }
}
