//! Paged decode attention over an fp8 KV cache: the pages hold `k / k_scale`
//! and `v / v_scale` in `f8e4m3fn` (or `f8e5m2`), with one f32 scale each
//! (per tensor, as vLLM's fp8 KV cache keeps them). Each page is converted
//! to the query's type in VMEM; `k_scale` folds into the score scale and
//! `v_scale` multiplies the normalized output, so neither costs a pass over
//! the page. Grid, tables and lengths are [`super::decode`]'s.

use kernel_ir::Array;
use kernel_ir::prelude::*;

use super::decode::{paged_check, paged_reference, paged_sample};
use super::{MASK_VALUE, Online, normalized, online_softmax_init, online_update};
use crate::entry::{Config, DTYPE, Entry, EntryError, ParamKind, Preset, param, refs};
use crate::tolerance::Tolerance;

/// Paged decode attention over fp8 K/V pages with per-tensor scales.
#[tpu_kernel(grid = (b, hkv, pages_per_seq), semantics = (parallel, parallel, arbitrary))]
pub fn paged_decode_attention_fp8<T: Float, KV: Fp8>(
    sm_scale: f32,
    #[shape(b)] lengths: Prefetch,
    #[shape(b, pages_per_seq)] block_tables: Prefetch,
    #[shape(b, hkv, g, d)]
    #[block([1, 1, g, d], |bi, hk, _| (bi, hk, 0, 0))]
    q: In<T>,
    #[shape(hkv, pages, page, d)]
    #[block([1, 1, page, d], |bi, hk, p| (hk, block_tables[(bi, p.min(((lengths[bi] - 1) / page).max(0)))], 0, 0))]
    k_pages: In<KV>,
    #[shape(hkv, pages, page, d)]
    #[block([1, 1, page, d], |bi, hk, p| (hk, block_tables[(bi, p.min(((lengths[bi] - 1) / page).max(0)))], 0, 0))]
    v_pages: In<KV>,
    #[shape(1, 1)] k_scale: In<f32>,
    #[shape(1, 1)] v_scale: In<f32>,
    #[shape(b, hkv, g, d)]
    #[block([1, 1, g, d], |bi, hk, _| (bi, hk, 0, 0))]
    o: Out<T>,
    #[shape(g, 128)] m: Scratch<f32>,
    #[shape(g, 128)] l: Scratch<f32>,
    #[shape(g, d)] acc: Scratch<f32>,
) {
    let (bi, p) = (program_id(0), program_id(2));
    let len = lengths.load([bi]);
    if p == 0 {
        online_softmax_init(Online { m, l, acc });
    }
    if p * page < len {
        // The fp8 pages dequantize to the query's type in VMEM.
        let kb = k_pages.load((0, 0, .., ..)).cast::<T>();
        let vb = v_pages.load((0, 0, .., ..)).cast::<T>();
        let pos = iota(I32, [g, page], 1) + p * page;
        let s = dot(q.load((0, 0, .., ..)), kb.t()) * (k_scale.load(..) * sm_scale);
        let s = select(pos < len, s, MASK_VALUE);
        let row = iota(I32, [page, d], 0) + p * page;
        online_update(g, Online { m, l, acc }, s, select(row < len, vb, 0.0));
    }
    if p == num_programs(2) - 1 {
        let (out, _) = normalized(Online { m, l, acc });
        o.store((0, 0, .., ..), (out * v_scale.load(..)).cast::<T>());
    }
}

fn kv_dtype(c: &Config) -> Result<DType, EntryError> {
    Ok(if c.choice("kv")? == "e5m2" {
        DType::F8E5M2
    } else {
        DType::F8E4M3FN
    })
}

/// The f64 reference: paged decode attention over the dequantized pages.
fn fp8_reference(c: &Config, a: &[Array]) -> Result<Vec<Vec<f64>>, EntryError> {
    let dequant = |pages: &Array, scale: &Array| {
        let s = scale.data()[0];
        Array::new(
            DType::F32,
            pages.shape().to_vec(),
            pages.data().iter().map(|v| v * s).collect(),
        )
        .unwrap_or_else(|_| Array::zeros(DType::F32, pages.shape().to_vec()))
    };
    let mut deq = a[..3].to_vec();
    deq.extend([dequant(&a[3], &a[5]), dequant(&a[4], &a[6])]);
    paged_reference(c, &deq)
}

/// [`paged_decode_attention_fp8`](mod@paged_decode_attention_fp8) in the library.
pub const PAGED_DECODE_ATTENTION_FP8: Entry = Entry {
    name: "paged_decode_attention_fp8",
    fixed_inputs: None,
    backward: None,
    about: "paged decode attention over an fp8 KV cache with per-tensor k/v scales",
    params: &[
        DTYPE,
        param(
            "kv",
            ParamKind::Choice(&["e4m3", "e5m2"]),
            "e4m3",
            "fp8 format of the K/V pages",
        ),
        param(
            "sm_scale",
            ParamKind::Scale,
            "auto",
            "score scale; auto = 1/sqrt(head_dim)",
        ),
    ],
    inputs: |_| {
        Ok(vec![
            ("lengths", vec![4]),
            ("block_tables", vec![4, 8]),
            ("q", vec![4, 2, 4, 128]),
            ("k_pages", vec![2, 40, 16, 128]),
            ("v_pages", vec![2, 40, 16, 128]),
            ("k_scale", vec![1, 1]),
            ("v_scale", vec![1, 1]),
        ])
    },
    build: |c, s| {
        let dims = paged_decode_attention_fp8::Dims::from_shapes(&refs(s))?;
        let scale = c.scale("sm_scale", dims.d)?;
        Ok(paged_decode_attention_fp8::build_for(
            c.dtype("dtype")?,
            kv_dtype(c)?,
            scale,
            dims,
        )?)
    },
    reference: fp8_reference,
    check: paged_check,
    tolerance: |c, _| vec![Tolerance::attention(c.dtype("dtype").unwrap_or(DType::F32))],
    sample: |c, k, seed| {
        // The pages and tables of the other paged kernels; the cache holds
        // values quantized by their scales (spread over the fp8 range).
        let mut v = paged_sample(c, k, seed);
        let (ks, vs) = (0.25, 0.125);
        for (i, s) in [(3, ks), (4, vs)] {
            let d = v[i].dtype();
            v[i] = Array::random(
                d,
                v[i].shape().to_vec(),
                seed + 20 + i as u64,
                -1.0 / s,
                1.0 / s,
            );
        }
        v[5] = Array::new(DType::F32, [1, 1], vec![ks])
            .unwrap_or_else(|_| Array::zeros(DType::F32, [1, 1]));
        v[6] = Array::new(DType::F32, [1, 1], vec![vs])
            .unwrap_or_else(|_| Array::zeros(DType::F32, [1, 1]));
        v
    },
    presets: &[Preset {
        name: "paged_decode_attention_fp8_kv",
        about: "paged decode attention over an e4m3 KV cache with k/v scales, bf16 queries",
        config: &[("dtype", "bf16"), ("sm_scale", "0.088")],
        shapes: &[],
    }],
};
