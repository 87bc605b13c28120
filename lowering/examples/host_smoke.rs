use kernel_ir::Array;
fn main() {
    let which = std::env::args().nth(1);
    for ex in kernels::examples::examples() {
        if let Some(w) = &which {
            if ex.name != w {
                continue;
            }
        }
        let k = (ex.build)().unwrap();
        let t = std::time::Instant::now();
        let hk = match lowering::HostKernel::compile(&k) {
            Ok(h) => h,
            Err(e) => {
                println!("{}: compile error: {e}", ex.name);
                continue;
            }
        };
        let ct = t.elapsed();
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
        let t = std::time::Instant::now();
        let got = hk.run(&args);
        let rt = t.elapsed();
        match got {
            Ok(got) => {
                let mut max = 0f64;
                for (a, b) in want.iter().zip(&got) {
                    for (x, y) in a.data().iter().zip(b.data()) {
                        let d = (x - y).abs();
                        if d.is_nan() || d > max {
                            max = if d.is_nan() { f64::INFINITY } else { d };
                        }
                    }
                }
                println!(
                    "{}: compile {:?} run {:?} max abs diff vs interp {max:e}",
                    ex.name, ct, rt
                );
            }
            Err(e) => println!("{}: run error {e}", ex.name),
        }
    }
}
