//! A small PJRT program for leak checking: load the plugin, create a
//! client, move buffers of every dtype in and out, compile and run a
//! module (twice), and free everything. `tests/leaks/run.sh` runs it under
//! valgrind (the dev build, its debug info stripped: valgrind 3.19 cannot
//! read DWARF 5):
//!
//! ```text
//! cargo build --workspace --example pjrt_lifecycle
//! objcopy --strip-debug target/debug/examples/pjrt_lifecycle /tmp/pjrt_lifecycle
//! valgrind --leak-check=full /tmp/pjrt_lifecycle
//! ```
//!
//! Everything Tessera allocates is freed before `main` returns; what
//! valgrind still reports comes from the plugin's own process-lifetime
//! singletons (thread pools, registries), which live until exit by design.

use kernel_ir::{Array, DType};
use runtime::pjrt::{Client, CompileOptions};

const MODULE: &str = r#"
func.func @main(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %s = stablehlo.add %x, %y : tensor<4x8xf32>
  return %s : tensor<4x8xf32>
}
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::cpu(1)?;
    for d in [
        DType::F32,
        DType::BF16,
        DType::F16,
        DType::I32,
        DType::I8,
        DType::Bool,
    ] {
        let a = Array::random(d, vec![3, 5], 1, -4.0, 4.0);
        let b = client.upload(&a, 0)?;
        assert_eq!(b.to_host()?.data(), a.data());
    }
    let exe = client.compile(MODULE.as_bytes(), &CompileOptions::default())?;
    let x = Array::random(DType::F32, vec![4, 8], 2, -1.0, 1.0);
    let y = Array::random(DType::F32, vec![4, 8], 3, -1.0, 1.0);
    let (bx, by) = (client.upload(&x, 0)?, client.upload(&y, 0)?);
    for _ in 0..2 {
        let out = exe.execute(&[&bx, &by])?;
        let got = out[0].to_host()?;
        for ((g, a), b) in got.data().iter().zip(x.data()).zip(y.data()) {
            assert!((g - (a + b)).abs() < 1e-6);
        }
    }
    println!("pjrt lifecycle: ok");
    Ok(())
}
