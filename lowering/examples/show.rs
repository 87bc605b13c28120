//! scratch
use kernel_ir::DType::*;
use kernels::foundation::*;
fn main() {
    let which = std::env::args().nth(1).unwrap_or_default();
    let target = std::env::args().nth(2).unwrap_or_default();
    let k = match which.as_str() {
        "attn" => kernels::attention::flash_attention(
            &kernels::attention::AttnConfig {
                causal: true,
                sm_scale: 0.125,
                block_q: 64,
                block_k: 128,
            },
            F32,
            kernels::attention::flash_attention::Dims {
                b: 1,
                h: 2,
                sq: 256,
                skv: 256,
                d: 64,
            },
        )
        .unwrap(),
        "ln" => layer_norm(&LayerNormConfig {
            rows: 64,
            cols: 256,
            block_rows: 8,
            eps: 1e-5,
            dtype: F32,
        })
        .unwrap(),
        "add" => add(&AddConfig {
            rows: 60,
            cols: 200,
            block_rows: 8,
            block_cols: 128,
            dtype: F32,
        })
        .unwrap(),
        "sm" => softmax(&SoftmaxConfig {
            rows: 64,
            cols: 256,
            block_rows: 16,
            dtype: F32,
        })
        .unwrap(),
        _ => matmul(&MatmulConfig {
            m: 64,
            n: 128,
            k: 200,
            bm: 64,
            bn: 128,
            bk: 128,
            dtype: F32,
            out_dtype: F32,
        })
        .unwrap(),
    };
    let t = std::time::Instant::now();
    let r = match target.as_str() {
        "k" => lowering::kernel_module(&k),
        "d" => lowering::decomposed(&k),
        _ => lowering::tpu_custom_call(&k).map(|c| c.module),
    };
    eprintln!("lowered in {:?}", t.elapsed());
    match r {
        Ok(s) => println!("{s}"),
        Err(e) => println!("ERR {e}"),
    }
}
