//! Time to lower flash attention to all three targets (release build):
//! `cargo bench -p tessera-kernels --bench lower`. The target is under 50 ms for all three.

use std::time::{Duration, Instant};

use kernel_ir::DType;
use kernels::attention::{AttnConfig, flash_attention};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let dims = kernels::attention::flash_attention::Dims {
        b: 1,
        h: 8,
        sq: 2048,
        skv: 2048,
        d: 128,
        hkv: 8,
    };
    let cfg = AttnConfig {
        causal: true,
        sm_scale: 0.088,
        block_q: 128,
        block_k: 128,
        window: None,
        softcap: None,
        dropout: None,
    };
    let kernel = flash_attention(&cfg, DType::BF16, dims).expect("flash attention verifies");
    let runs = 20;
    let time = |f: &dyn Fn()| {
        median(
            (0..runs)
                .map(|_| {
                    let t = Instant::now();
                    f();
                    t.elapsed()
                })
                .collect(),
        )
    };
    let k = time(&|| {
        lowering::kernel_module(&kernel).unwrap();
    });
    let m = time(&|| {
        lowering::tpu_custom_call(&kernel).unwrap();
    });
    let d = time(&|| {
        lowering::decomposed(&kernel).unwrap();
    });
    let all = time(&|| {
        lowering::kernel_module(&kernel).unwrap();
        lowering::tpu_custom_call(&kernel).unwrap();
        lowering::decomposed(&kernel).unwrap();
    });
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "lowering flash attention (bf16, causal, [1, 8, 2048, 128], 128x128 blocks), median of {runs}:"
    );
    println!("  kernel module      {:>7.2} ms", ms(k));
    println!("  tpu_custom_call    {:>7.2} ms", ms(m));
    println!("  decomposed         {:>7.2} ms", ms(d));
    println!(
        "  all three          {:>7.2} ms   (target < 50 ms: {})",
        ms(all),
        if ms(all) < 50.0 { "met" } else { "NOT met" }
    );
}
