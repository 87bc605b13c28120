//! Attention kernels beyond the library's presets compile with libtpu for
//! every generation: masked attention at MXU-sized blocks, and flash
//! attention's backward kernels with dropout (also with Triton).

use kernel_ir::Target;

use super::tpu_compile::tpu;

#[test]
fn masked_attention_compiles_for_every_generation() {
    use kernel_ir::DType;
    use kernels::attention::masked::{MaskedConfig, masked_attention};
    let tpu = tpu();
    let (b, h, hkv, sq, skv, d, n) = (1usize, 4usize, 2usize, 512usize, 512usize, 128usize, 2usize);
    let (nq, nk) = (sq / 128, skv / 128);
    let dims = kernels::attention::masked::masked_attention::Dims::from_shapes(&[
        &[h, nq, nk],
        &[h, nq, nk],
        &[h, nq, nk],
        &[b, h, sq, d],
        &[b, hkv, skv, d],
        &[b, hkv, skv, d],
        &[n, 128, 128],
        &[b, sq, 1],
        &[b, 1, skv],
    ])
    .unwrap();
    for dt in [DType::F32, DType::BF16] {
        let cfg = MaskedConfig {
            sm_scale: 0.088,
            softcap: Some(30.0),
            block_q: 128,
            block_k: 128,
            rule: None,
        };
        let k = masked_attention::build_for(dt, &cfg, dims).unwrap();
        for t in Target::ALL {
            if let Err(e) = tpu.compile_kernel(&k, t) {
                panic!("masked_attention ({dt:?}) on {t}: {e}");
            }
        }
    }
}

/// The backward kernels with dropout (each draws the forward's mask from
/// the key) compile for every TPU generation (dq, dk/dv and the one-pass
/// kernel) and with Triton for an NVIDIA GPU (dk/dv).
#[test]
fn flash_attention_backward_with_dropout_compiles_for_tpus_and_gpus() {
    use kernel_ir::{DType, GpuTarget, Platform, VerifiedKernel};
    use kernels::attention::AttnConfig;
    use kernels::attention::backward::{
        flash_attention_dkv, flash_attention_dq, flash_attention_dqkv,
    };
    let shapes: [&[usize]; 6] = [
        &[1, 4, 256, 128],
        &[1, 2, 256, 128],
        &[1, 2, 256, 128],
        &[1, 4, 256, 128],
        &[1, 4, 256, 1],
        &[1, 4, 256, 1],
    ];
    let build = |block: usize| -> Vec<(&'static str, VerifiedKernel)> {
        let cfg = AttnConfig {
            causal: true,
            sm_scale: 0.088,
            block_q: block,
            block_k: block,
            window: None,
            softcap: None,
            dropout: Some(0.1),
        };
        let bf = DType::BF16;
        vec![
            (
                "dq",
                flash_attention_dq(&cfg, bf, Dims::from_shapes(&shapes).unwrap()).unwrap(),
            ),
            (
                "dkv",
                flash_attention_dkv(&cfg, bf, Dims2::from_shapes(&shapes).unwrap()).unwrap(),
            ),
            (
                "dqkv",
                flash_attention_dqkv(&cfg, bf, Dims3::from_shapes(&shapes).unwrap()).unwrap(),
            ),
        ]
    };
    use kernels::attention::backward::flash_attention_dkv::Dims as Dims2;
    use kernels::attention::backward::flash_attention_dq::Dims;
    use kernels::attention::backward::flash_attention_dqkv::Dims as Dims3;
    let tpu = tpu();
    for (name, k) in build(128) {
        assert!(k.arguments().any(|a| a.name == "dropout_key"), "{name}");
        for t in Target::ALL {
            if let Err(e) = tpu.compile_kernel(&k, t) {
                panic!("{name} with dropout on {t}: {e}");
            }
        }
    }
    // Triton takes ~10 s a compile of the Threefry rounds: the dk/dv
    // kernel (the transposed probabilities, the mask in the key-row
    // layout) for one GPU; the forward is in the GPU sweep.
    let gpu = kernel_ir::for_platform(Platform::Gpu, || build(64));
    for (name, k) in gpu.into_iter().filter(|(n, _)| *n == "dkv") {
        tessera_testing::compile_for_gpu(&k, &[GpuTarget::Sm90])
            .unwrap_or_else(|e| panic!("{name} with dropout: {e}"));
    }
}
