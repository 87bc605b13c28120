//! Smoke run of every backend on every example kernel.
use kernel_ir::Array;
use runtime::backend::{Backend, Prepared};
fn main() {
    for ex in kernels::examples::examples() {
        let k = (ex.build)().unwrap();
        let args: Vec<Array> = k
            .prefetch
            .iter()
            .map(|p| Array::zeros(p.dtype, p.shape.clone()))
            .chain(
                k.inputs()
                    .enumerate()
                    .map(|(i, o)| Array::random(o.dtype, o.shape.clone(), i as u64 + 3, -1.0, 1.0)),
            )
            .collect();
        let want = kernel_ir::interpret(&k, &args).unwrap();
        for b in Backend::ALL {
            let t = std::time::Instant::now();
            let r = Prepared::new(b, &k).and_then(|p| p.run(&args));
            match r {
                Ok(got) => {
                    let mut max = 0f64;
                    for (a, g) in want.iter().zip(&got) {
                        for (x, y) in a.data().iter().zip(g.data()) {
                            let d = (x - y).abs();
                            if d.is_nan() {
                                max = f64::INFINITY
                            } else if d > max {
                                max = d
                            }
                        }
                    }
                    println!(
                        "{:28} {:16} {:?} maxdiff {max:e}",
                        ex.name,
                        b.name(),
                        t.elapsed()
                    );
                }
                Err(e) => println!("{:28} {:16} ERROR {e}", ex.name, b.name()),
            }
        }
    }
}
