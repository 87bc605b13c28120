//! Multi-head latent attention (DeepSeek's MLA) decode over a paged latent
//! cache, in the absorbed form a decode step runs: every query head reads
//! the same cached rows, the compressed latent `c` (`d_c`, 512 in
//! DeepSeek-V3) and the decoupled RoPE key `k_pe` (`d_r`, 64). Head `i`'s
//! score for token `j` is `(q_c[i]·c[j] + q_pe[i]·k_pe[j]) · scale`, and
//! its output the softmax-weighted sum of the latents, `o[i] = Σ_j p_ij
//! c[j]` (`[h, d_c]`; the caller applies the value up-projection). The
//! latent is read once per page for all heads and is both key and value.
//!
//! The pages are found as in [`super::decode`]: the block tables and
//! lengths are scalar prefetch, the index maps read the table, and steps
//! past a sequence's last page re-use it and skip their compute; a
//! sequence of length 0 gets `o = 0`.
//!
//! Shapes: `q_c: [b, h, d_c]`, `q_pe: [b, h, d_r]`, `c_pages: [pages,
//! page, d_c]`, `pe_pages: [pages, page, d_r]`, `o: [b, h, d_c]`.

use kernel_ir::prelude::*;
use kernel_ir::{Array, VerifiedKernel};

use super::decode::{DecodeConfig, attend_scores, paged_tables, tables_in_range};
use super::{Online, normalized, online_softmax_init};
use crate::entry::{
    Config, DTYPE, Entry, EntryError, ParamKind, Preset, param, refs, uniform_inputs,
};
use crate::reference::softmax_lse;
use crate::tolerance::Tolerance;

/// MLA decode attention.
#[tpu_kernel(grid = (b, pages_per_seq), semantics = (parallel, arbitrary))]
pub fn mla_decode_attention<T: Float>(
    cfg: &DecodeConfig,
    #[shape(b)] lengths: Prefetch,
    #[shape(b, pages_per_seq)] block_tables: Prefetch,
    #[shape(b, h, dc)]
    #[block([1, h, dc], |bi, _| (bi, 0, 0))]
    q_c: In<T>,
    #[shape(b, h, dr)]
    #[block([1, h, dr], |bi, _| (bi, 0, 0))]
    q_pe: In<T>,
    #[shape(pages, page, dc)]
    #[block([1, page, dc], |bi, p| (block_tables[(bi, p.min(((lengths[bi] - 1) / page).max(0)))], 0, 0))]
    c_pages: In<T>,
    #[shape(pages, page, dr)]
    #[block([1, page, dr], |bi, p| (block_tables[(bi, p.min(((lengths[bi] - 1) / page).max(0)))], 0, 0))]
    pe_pages: In<T>,
    #[shape(b, h, dc)]
    #[block([1, h, dc], |bi, _| (bi, 0, 0))]
    o: Out<T>,
    #[shape(h, 128)] m: Scratch<f32>,
    #[shape(h, 128)] l: Scratch<f32>,
    #[shape(h, dc)] acc: Scratch<f32>,
) {
    let (bi, p) = (program_id(0), program_id(1));
    let len = lengths.load([bi]);
    let st = Online { m, l, acc };
    if p == 0 {
        online_softmax_init(st);
    }
    if p * page < len {
        let c = c_pages.load((0, .., ..));
        let scores = dot(q_c.load((0, .., ..)), c.t())
            + dot(q_pe.load((0, .., ..)), pe_pages.load((0, .., ..)).t());
        attend_scores(st, scores * cfg.sm_scale, c, p * page, len);
    }
    if p == num_programs(1) - 1 {
        let (out, _) = normalized(st);
        o.store((0, .., ..), out.cast::<T>());
    }
}

/// The f64 reference from the definition (inputs in the kernel's order).
pub fn reference(c: &Config, a: &[Array]) -> Result<Vec<Vec<f64>>, EntryError> {
    let [b, h, dc] = [a[2].shape()[0], a[2].shape()[1], a[2].shape()[2]];
    let dr = a[3].shape()[2];
    let (pps, page) = (a[1].shape()[1], a[4].shape()[1]);
    let scale = sm_scale(c, dc, dr)? as f64;
    let (qc, qp, cp, pp) = (a[2].data(), a[3].data(), a[4].data(), a[5].data());
    let mut out = vec![0.0; b * h * dc];
    for bi in 0..b {
        let len = a[0].data()[bi].max(0.0) as usize;
        // The pool rows of this sequence's tokens.
        let rows: Vec<usize> = (0..len)
            .map(|t| a[1].data()[bi * pps + t / page] as usize * page + t % page)
            .collect();
        for i in 0..h {
            let (q1, q2) = ((bi * h + i) * dc, (bi * h + i) * dr);
            let s: Vec<f64> = rows
                .iter()
                .map(|&r| {
                    let latent: f64 = (0..dc).map(|t| qc[q1 + t] * cp[r * dc + t]).sum();
                    let rope: f64 = (0..dr).map(|t| qp[q2 + t] * pp[r * dr + t]).sum();
                    (latent + rope) * scale
                })
                .collect();
            let (p, _) = softmax_lse(&s);
            for t in 0..dc {
                out[q1 + t] = rows.iter().zip(&p).map(|(&r, w)| w * cp[r * dc + t]).sum();
            }
        }
    }
    Ok(vec![out])
}

/// `sm_scale`, or by default `1/√(d_c + d_r)`, the head dim the scores
/// were trained at (DeepSeek's `1/√(128 + 64)` is given explicitly).
fn sm_scale(c: &Config, dc: usize, dr: usize) -> Result<f32, EntryError> {
    c.scale("sm_scale", dc + dr)
}

/// Lengths within the table's capacity, table entries within the pool.
fn check(_: &Config, k: &VerifiedKernel, a: &[Array]) -> Result<(), EntryError> {
    // c_pages: [pages, page, d_c].
    tables_in_range(k, a, "c_pages", 0)
}

/// Uniform queries and cache, distinct pages per sequence, lengths from 0
/// to full.
fn sample(c: &Config, k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    let mut v = uniform_inputs(c, k, seed);
    let (b, pps) = (v[1].shape()[0], v[1].shape()[1]);
    let (pool, page) = (v[4].shape()[0], v[4].shape()[1]);
    if let Some((l, t)) = paged_tables(b, pps, pool, page, seed) {
        v[0] = l;
        v[1] = t;
    }
    v
}

/// [`mla_decode_attention`](mod@mla_decode_attention) in the library.
pub const MLA_DECODE_ATTENTION: Entry = Entry {
    name: "mla_decode_attention",
    fixed_inputs: None,
    backward: None,
    about: "multi-head latent attention (MLA) decode over a paged latent cache: latent and RoPE key pages shared by every head",
    params: &[
        DTYPE,
        param(
            "sm_scale",
            ParamKind::Scale,
            "auto",
            "score scale; auto = 1/sqrt(d_c + d_r)",
        ),
    ],
    inputs: |_| {
        Ok(vec![
            ("lengths", vec![4]),
            ("block_tables", vec![4, 8]),
            ("q_c", vec![4, 16, 256]),
            ("q_pe", vec![4, 16, 64]),
            ("c_pages", vec![40, 16, 256]),
            ("pe_pages", vec![40, 16, 64]),
        ])
    },
    build: |c, s| {
        let dims = mla_decode_attention::Dims::from_shapes(&refs(s))?;
        let cfg = DecodeConfig {
            sm_scale: sm_scale(c, dims.dc, dims.dr)?,
        };
        Ok(mla_decode_attention::build_for(
            c.dtype("dtype")?,
            &cfg,
            dims,
        )?)
    },
    reference,
    check,
    tolerance: |c, _| vec![Tolerance::attention(c.dtype("dtype").unwrap_or(DType::F32))],
    sample,
    presets: &[Preset {
        name: "mla_decode_deepseek_bf16",
        about: "MLA decode at DeepSeek-V3's latent sizes (d_c 512, d_r 64), 16 heads, 2 sequences over pages of 16",
        config: &[("dtype", "bf16"), ("sm_scale", "0.0722")],
        shapes: &[
            ("lengths", &[2]),
            ("block_tables", &[2, 4]),
            ("q_c", &[2, 16, 512]),
            ("q_pe", &[2, 16, 64]),
            ("c_pages", &[12, 16, 512]),
            ("pe_pages", &[12, 16, 64]),
        ],
    }],
};
