//! `tessera masked`: attention with any mask on `.npy` inputs, its block
//! tables built from a mask description, and the bytes its pipeline moves.

use std::path::Path;

use kernel_ir::{Array, DType};
use kernels::attention::block_table::BlockTables;
use kernels::attention::mask::MultiHeadMask;
use kernels::attention::masked::{MaskedConfig, masked_attention};
use runtime::backend::Prepared;

use crate::args::Args;
use crate::run::backend;
use crate::{Failure, usage};

/// The inputs `masked` takes.
const INPUTS: [&str; 5] = ["q", "k", "v", "q_seg", "kv_seg"];

fn read(a: &Args, name: &str) -> Result<Option<Array>, String> {
    for (k, path) in a.pairs("input")? {
        if k == name {
            return tooling::npy::read(Path::new(&path))
                .map(Some)
                .map_err(|e| e.to_string());
        }
    }
    Ok(None)
}

/// `tessera masked --mask SPEC[;SPEC..] --input q=.. --input k=.. --input v=..
/// [--input q_seg=.. --input kv_seg=..] [--block-q N] [--block-k N]
/// [--backend B] [--cost] --out DIR`.
pub fn masked(args: &[String]) -> Result<(), Failure> {
    let a = Args::parse(
        "masked",
        args,
        &[
            "mask", "input", "block-q", "block-k", "backend", "out", "softcap",
        ],
        &["cost"],
    )
    .map_err(usage)?;
    // Every input named once, and only the five masked attention takes: a
    // misspelt `q_seg` would otherwise drop the segment mask silently.
    let mut named = std::collections::BTreeSet::new();
    for (k, _) in a.pairs("input").map_err(usage)? {
        if !INPUTS.contains(&k.as_str()) {
            return Err(usage(format!(
                "--input {k}: masked attention takes {}",
                INPUTS.join(", ")
            )));
        }
        if !named.insert(k.clone()) {
            return Err(usage(format!("--input {k} is given twice; give it once")));
        }
    }
    let spec = a.one("mask").map_err(usage)?.ok_or_else(|| {
        usage("give --mask, e.g. causal, local:127:0 or chunked:8192&causal".into())
    })?;
    let out = a
        .one("out")
        .map_err(usage)?
        .ok_or_else(|| usage("give --out DIR, where o.npy and lse.npy go".into()))?;
    if Path::new(out).exists() && !Path::new(out).is_dir() {
        return Err(usage(format!(
            "--out {out} is a file; give a folder for o.npy and lse.npy"
        )));
    }
    let b_name = a.one("backend").map_err(usage)?.unwrap_or("jit");
    if b_name == "all" {
        return Err(usage(
            "masked runs one backend: give one of interp, jit, pjrt, pjrt-ffi, triton-interp"
                .into(),
        ));
    }
    let be = backend(b_name).map_err(usage)?;
    let need = |n: &str| -> Result<Array, Failure> {
        read(&a, n)
            .map_err(usage)?
            .ok_or_else(|| usage(format!("missing --input {n}=FILE.npy")))
    };
    let (q, k, v) = (need("q")?, need("k")?, need("v")?);
    if q.shape().len() != 4 || k.shape().len() != 4 || v.shape() != k.shape() {
        return Err(usage(format!(
            "q must be [b, h, sq, d] and k, v one [b, hkv, skv, d]; got q {:?}, k {:?}, v {:?}",
            q.shape(),
            k.shape(),
            v.shape()
        )));
    }
    let (b, h, sq, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let skv = k.shape()[2];
    let mask = MultiHeadMask::parse(spec, h).map_err(|e| usage(e.to_string()))?;
    let block = |name: &str, default: usize, len: usize| -> Result<usize, Failure> {
        let v = match a.one(name).map_err(usage)? {
            None => default.min(len),
            Some(s) => s
                .parse::<usize>()
                .ok()
                .filter(|&n| (1..=len.max(1)).contains(&n))
                .ok_or_else(|| {
                    usage(format!(
                        "--{name} {s}: give a block size from 1 to the sequence length {len}"
                    ))
                })?,
        };
        Ok(v)
    };
    let (bq, bk) = (block("block-q", 128, sq)?, block("block-k", 128, skv)?);
    let blocks = (sq.div_ceil(bq) as u64).saturating_mul(skv.div_ceil(bk) as u64);
    if blocks > kernel_ir::limits::MAX_INTERP_STEPS {
        return Err(usage(format!(
            "--block-q {bq} --block-k {bk} make {blocks} block pairs per head, over the limit of {} (kernel_ir::limits::MAX_INTERP_STEPS); use larger blocks",
            kernel_ir::limits::MAX_INTERP_STEPS
        )));
    }
    let t = BlockTables::build(&mask, sq, skv, bq, bk).map_err(|e| usage(e.to_string()))?;
    // Segment ids are int32 `[b, len]`, one per position.
    let seg = |name: &str, len: usize, shape: Vec<usize>| -> Result<Array, Failure> {
        match read(&a, name).map_err(usage)? {
            None => Ok(Array::zeros(DType::I32, shape)),
            Some(s) if s.dtype() == DType::I32 && s.shape() == [b, len] => {
                Array::new(DType::I32, shape, s.data().to_vec()).map_err(|e| usage(e.to_string()))
            }
            Some(s) => Err(usage(format!(
                "--input {name} is {}{:?}; give int32 segment ids of shape [{b}, {len}], one per position",
                s.dtype(),
                s.shape()
            ))),
        }
    };
    let q_seg = seg("q_seg", sq, vec![b, sq, 1])?;
    let kv_seg = seg("kv_seg", skv, vec![b, 1, skv])?;
    let ([kind, fetch, mask_fetch], masks) = t.arrays();
    let args = vec![kind, fetch, mask_fetch, q, k, v, masks, q_seg, kv_seg];
    let softcap = match a.one("softcap").map_err(usage)? {
        None => None,
        Some(s) => Some(
            s.parse::<f32>()
                .ok()
                .filter(|c| c.is_finite() && *c > 0.0)
                .ok_or_else(|| usage(format!("--softcap {s}: give a positive number")))?,
        ),
    };
    let cfg = MaskedConfig {
        sm_scale: 1.0 / (d as f32).sqrt(),
        softcap,
        block_q: bq,
        block_k: bk,
        rule: MaskedConfig::rule_of(&mask),
    };
    let shapes: Vec<&[usize]> = args.iter().map(|x| x.shape()).collect();
    let dims = kernels::attention::masked::masked_attention::Dims::from_shapes(&shapes)
        .map_err(|e| usage(e.to_string()))?;
    let dtype = args[3].dtype();
    let kernel =
        masked_attention::build_for(dtype, &cfg, dims).map_err(|e| Failure::Run(e.to_string()))?;
    let outs = Prepared::new(be, &kernel)
        .and_then(|p| p.run(&args))
        .map_err(|e| Failure::Run(format!("{be}: {e}")))?;
    let dir = Path::new(out);
    std::fs::create_dir_all(dir).map_err(|e| Failure::Run(format!("cannot create {out}: {e}")))?;
    let files = vec![
        (dir.join("o.npy"), tooling::npy::encode(&outs[0])),
        (dir.join("lse.npy"), tooling::npy::encode(&outs[1])),
    ];
    tooling::atomic_file::write_all(&files).map_err(|e| Failure::Run(e.into()))?;
    let computed = t.kind.iter().filter(|&&x| x != 0).count();
    println!(
        "masked_attention on {be}: {computed} of {} steps computed, {} distinct partial masks, tables {} B; wrote {}/o.npy, lse.npy",
        t.kind.len(),
        t.partial_masks(),
        t.bytes(),
        dir.display()
    );
    if a.flag("cost") {
        let c = tooling::cost::cost(&kernel, &args).map_err(|e| Failure::Run(e.to_string()))?;
        println!("{}", c.to_json());
    }
    Ok(())
}
