//! Exported artifacts: a kernel at fixed shapes as one multi-platform
//! StableHLO module that JAX (and TorchTPU, which takes `jax.export`
//! artifacts) can call, plus a manifest of its inputs and outputs.
//!
//! The module follows `jax.export`'s convention for multi-platform modules
//! (calling convention 10): `@main` takes the platform index first (an
//! `i32` marked `jax.global_constant = "_platform_index"`), then the
//! kernel's arguments, and branches with `stablehlo.case`: platform `cpu`
//! (index 0) runs the decomposed StableHLO, pure XLA with nothing to
//! register; platform `tpu` (index 1) runs the `tpu_custom_call`. The
//! loader `kernels/python/tessera_jax.py` turns the directory into a
//! `jax.export.Exported`.

use std::fmt::Write;

use kernel_ir::{DType, VerifiedKernel};

/// An exported kernel: the module and what its manifest says of its
/// calling convention.
#[derive(Clone, Debug, PartialEq)]
pub struct Artifact {
    /// The multi-platform StableHLO module (text).
    pub module: String,
    /// The kernel's name (the manifest's `kernel`).
    pub kernel: String,
    /// Manifest entries of the inputs (JSON objects, call order).
    inputs: Vec<String>,
    /// Manifest entries of the outputs.
    outputs: Vec<String>,
}

impl Artifact {
    /// The manifest (JSON): the `extra` members (already JSON values)
    /// first, then kernel name, platforms, calling convention, inputs and
    /// outputs with JAX dtype names and shapes.
    pub fn manifest(&self, extra: &[(&str, String)]) -> String {
        manifest(&self.kernel, extra, &self.inputs, &self.outputs)
    }
}

/// The `format` every Tessera manifest and family index names.
pub const FORMAT: &str = "tessera-export";

/// The version of that format: 2 added provenance (entry, full config,
/// Tessera version) and the digest of every file.
pub const FORMAT_VERSION: u32 = 2;

/// What an artifact was made from, recorded in its manifest.
#[derive(Clone, Debug, PartialEq)]
pub struct Provenance {
    /// The library entry.
    pub entry: String,
    /// Its whole config, defaults included (key, value).
    pub config: Vec<(String, String)>,
}

/// The lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

fn json_object(pairs: &[(String, String)]) -> String {
    let members: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{}: {}", json_str(k), json_str(v)))
        .collect();
    format!("{{{}}}", members.join(", "))
}

/// The members every manifest and family index opens with.
fn header(prov: &Provenance) -> Vec<(&'static str, String)> {
    vec![
        ("format", json_str(FORMAT)),
        ("format_version", FORMAT_VERSION.to_string()),
        ("tessera_version", json_str(env!("CARGO_PKG_VERSION"))),
        ("entry", json_str(&prov.entry)),
        ("config", json_object(&prov.config)),
    ]
}

/// The files of an artifact directory, paths relative to it: `module.mlir`,
/// with a VJP `vjp/module.mlir` and `vjp/manifest.json`, and last
/// `manifest.json`, which records provenance and the SHA-256 of every other
/// file (the loader refuses a directory whose files do not match, so a
/// forward and a VJP of different exports can never be loaded together).
pub fn artifact_files(
    art: &Artifact,
    vjp: Option<&Artifact>,
    prov: &Provenance,
) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    if let Some(v) = vjp {
        for (rel, bytes) in artifact_files(v, None, prov) {
            files.push((format!("vjp/{rel}"), bytes));
        }
    }
    files.push(("module.mlir".into(), art.module.clone().into_bytes()));
    let mut extra = header(prov);
    if vjp.is_some() {
        extra.push(("vjp", json_str("vjp")));
    }
    extra.push(("files", digests(&files)));
    files.push(("manifest.json".into(), art.manifest(&extra).into_bytes()));
    files
}

/// `{"path": "sha256", ..}` of `files`.
fn digests(files: &[(String, Vec<u8>)]) -> String {
    let d: Vec<(String, String)> = files
        .iter()
        .map(|(p, b)| (p.clone(), sha256_hex(b)))
        .collect();
    json_object(&d)
}

/// The index of a bucketed family (`buckets.json`): provenance, the axis,
/// the sizes with their folders, and the digest of each bucket's manifest
/// (which digests the bucket's files).
pub fn family_index(
    kernel: &str,
    prov: &Provenance,
    axis: usize,
    buckets: &[(usize, String, Vec<u8>)],
) -> String {
    let mut members = header(prov);
    members.push(("kernel", json_str(kernel)));
    members.push(("axis", axis.to_string()));
    let sizes: Vec<String> = buckets.iter().map(|(n, _, _)| n.to_string()).collect();
    let dirs: Vec<String> = buckets.iter().map(|(_, d, _)| json_str(d)).collect();
    members.push(("sizes", format!("[{}]", sizes.join(", "))));
    members.push(("dirs", format!("[{}]", dirs.join(", "))));
    let manifests: Vec<(String, Vec<u8>)> = buckets
        .iter()
        .map(|(_, d, m)| (format!("{d}/manifest.json"), m.clone()))
        .collect();
    members.push(("files", digests(&manifests)));
    let body: Vec<String> = members
        .iter()
        .map(|(k, v)| format!("  {}: {v}", json_str(k)))
        .collect();
    format!("{{\n{}\n}}\n", body.join(",\n"))
}

/// Whether `dir` holds an earlier export (an artifact or a family), which
/// a new export may replace whole.
pub fn is_export_dir(dir: &std::path::Path) -> bool {
    dir.join("manifest.json").is_file() || dir.join("buckets.json").is_file()
}

/// The platforms of an artifact, in the order of the platform index.
pub const PLATFORMS: [&str; 2] = ["cpu", "tpu"];

/// `jax.export`'s calling convention version the module follows.
pub const CALLING_CONVENTION: u32 = 10;

/// The JAX (NumPy) name of a dtype.
pub fn jax_dtype(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        DType::I32 => "int32",
        DType::I8 => "int8",
        DType::Bool => "bool",
        DType::F8E4M3FN => "float8_e4m3fn",
        DType::F8E5M2 => "float8_e5m2",
    }
}

fn tensor(shape: &[usize], d: DType) -> String {
    let elem = match d {
        DType::Bool => "i1".to_string(),
        DType::F8E4M3FN => "f8E4M3FN".to_string(),
        DType::F8E5M2 => "f8E5M2".to_string(),
        other => other.name().to_string(),
    };
    let mut s = String::from("tensor<");
    for d in shape {
        let _ = write!(s, "{d}x");
    }
    s + &elem + ">"
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out + "\""
}

/// One manifest entry: `{"name": .., "dtype": .., "shape": [..]}`.
fn manifest_entry(name: &str, shape: &[usize], d: DType) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    format!(
        "{{\"name\": {}, \"dtype\": \"{}\", \"shape\": [{}]}}",
        json_str(name),
        jax_dtype(d),
        dims.join(", ")
    )
}

/// The manifest of an artifact called `kernel`, `extra` members first.
fn manifest(
    kernel: &str,
    extra: &[(&str, String)],
    inputs: &[String],
    outputs: &[String],
) -> String {
    let mut s = String::from("{\n");
    for (k, v) in extra {
        let _ = writeln!(s, "  {}: {v},", json_str(k));
    }
    let _ = write!(
        s,
        "  \"kernel\": {},\n  \"platforms\": [\"cpu\", \"tpu\"],\n  \"calling_convention_version\": {CALLING_CONVENTION},\n  \"inputs\": [{}],\n  \"outputs\": [{}]\n}}\n",
        json_str(kernel),
        inputs.join(", "),
        outputs.join(", ")
    );
    s
}

/// Exports `kernel` (see the module docs).
pub fn export(kernel: &VerifiedKernel) -> Result<Artifact, String> {
    let err = |e: lowering::LoweringError| e.to_string();
    let cpu = lowering::decomposed(kernel).map_err(err)?;
    let tpu = lowering::tpu_custom_call(kernel).map_err(err)?.module;
    let cpu = lowering::private_function(&cpu, "tessera_cpu").map_err(err)?;
    let tpu = lowering::private_function(&tpu, "tessera_tpu").map_err(err)?;
    let ins: Vec<(String, String)> = kernel
        .arguments()
        .map(|a| (a.name.to_string(), tensor(a.shape, a.dtype)))
        .collect();
    let outs: Vec<(String, String)> = kernel
        .outputs()
        .map(|o| (o.name.clone(), tensor(&o.shape, o.dtype)))
        .collect();
    let in_types: Vec<&str> = ins.iter().map(|(_, t)| t.as_str()).collect();
    let out_types: Vec<&str> = outs.iter().map(|(_, t)| t.as_str()).collect();
    let args: Vec<String> = (1..=ins.len()).map(|i| format!("%arg{i}")).collect();
    let sig = format!("({}) -> ({})", in_types.join(", "), out_types.join(", "));
    let n = outs.len();
    let results = |v: &str| -> String {
        if n == 1 {
            v.to_string()
        } else {
            (0..n)
                .map(|i| format!("{v}#{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let bind = |v: &str| {
        if n == 1 {
            v.to_string()
        } else {
            format!("{v}:{n}")
        }
    };
    let params: Vec<String> = ins
        .iter()
        .enumerate()
        .map(|(i, (_, t))| format!("%arg{}: {t}", i + 1))
        .collect();
    let out_attrs: Vec<String> = outs
        .iter()
        .map(|(name, t)| format!("{t} {{jax.result_info = {}}}", json_str(name)))
        .collect();
    let branch = |f: &str, v: &str| {
        format!(
            "      {} = func.call @{f}({}) : {sig}\n      \"stablehlo.return\"({}) : ({}) -> ()\n",
            bind(v),
            args.join(", "),
            results(v),
            out_types.join(", ")
        )
    };
    let mut m = String::new();
    let _ = writeln!(
        m,
        "module @tessera_{} attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{",
        kernel.name
    );
    let _ = writeln!(
        m,
        "  func.func public @main(%arg0: tensor<i32> {{jax.global_constant = \"_platform_index\"}}{}{}) -> ({}) {{",
        if params.is_empty() { "" } else { ", " },
        params.join(", "),
        out_attrs.join(", ")
    );
    let _ = writeln!(m, "    {} = \"stablehlo.case\"(%arg0) ({{", bind("%0"));
    m += &branch("tessera_cpu", "%1");
    m += "    }, {\n";
    m += &branch("tessera_tpu", "%2");
    let _ = writeln!(m, "    }}) : (tensor<i32>) -> ({})", out_types.join(", "));
    let _ = writeln!(m, "    return {} : {}", results("%0"), out_types.join(", "));
    m += "  }\n";
    for f in [&cpu, &tpu] {
        for line in f.lines() {
            let _ = writeln!(m, "  {line}");
        }
    }
    m += "}\n";
    // Checked by MLIR: it parses (and its @main can be embedded again).
    lowering::private_function(&m, "main").map_err(err)?;

    let inputs: Vec<String> = kernel
        .arguments()
        .map(|a| manifest_entry(a.name, a.shape, a.dtype))
        .collect();
    let outputs: Vec<String> = kernel
        .outputs()
        .map(|o| manifest_entry(&o.name, &o.shape, o.dtype))
        .collect();
    Ok(Artifact {
        module: m,
        kernel: kernel.name.clone(),
        inputs,
        outputs,
    })
}

/// The VJP of a flash-attention artifact, from Tessera's backward kernels:
/// A kernel's arguments and outputs as (name, shape, dtype).
type Signature = Vec<(String, Vec<usize>, DType)>;

fn signature(k: &VerifiedKernel) -> (Signature, Signature) {
    let args = k
        .arguments()
        .map(|a| (a.name.to_string(), a.shape.to_vec(), a.dtype))
        .collect();
    let outs = k
        .outputs()
        .map(|o| (o.name.clone(), o.shape.clone(), o.dtype))
        .collect();
    (args, outs)
}

/// `vjp(q, k, v, ct_o, ct_lse) -> (dq, dk, dv)` in jax.export's VJP
/// convention (the primals, then the outputs' cotangents; the inputs'
/// cotangents out). It recomputes `o, lse` with the forward kernel, then
/// `delta = rowsum(ct_o ⊙ o) − ct_lse` (the logsumexp cotangent enters
/// the softmax gradient exactly where delta does), then dq and dk/dv.
/// `config` is the forward's (`--config` pairs or a preset's); each
/// backward entry takes the keys it has.
pub fn flash_attention_vjp(
    forward: &VerifiedKernel,
    config: &[(String, String)],
) -> Result<Artifact, String> {
    use crate::library::{Config, find};
    let (args, outs) = signature(forward);
    let [(_, qs, qd), (_, ks, kd), (_, vs, vd)] = args.as_slice() else {
        return Err("the VJP exports flash attention with inputs q, k, v".into());
    };
    let [(_, os, od), (_, ls, ld)] = outs.as_slice() else {
        return Err("the VJP exports flash attention with outputs o, lse".into());
    };
    let build = |entry: &str, shapes: Vec<(&str, Vec<usize>)>| -> Result<VerifiedKernel, String> {
        let e = find(entry).ok_or_else(|| format!("no library entry {entry}"))?;
        let pairs: Vec<(String, String)> = config
            .iter()
            .filter(|(k, _)| e.params.iter().any(|p| p.name == k))
            .cloned()
            .collect();
        let c = Config::parse(e, &pairs).map_err(|err| err.to_string())?;
        e.build_with_shapes(&c, &shapes)
            .map_err(|err| err.to_string())
    };
    let delta = build(
        "attention_delta",
        vec![("o", os.clone()), ("d_o", os.clone())],
    )?;
    let grads = |entry| {
        build(
            entry,
            vec![
                ("q", qs.clone()),
                ("k", ks.clone()),
                ("v", vs.clone()),
                ("d_o", os.clone()),
                ("lse", ls.clone()),
                ("delta", ls.clone()),
            ],
        )
    };
    let (dq, dkv) = (grads("flash_attention_dq")?, grads("flash_attention_dkv")?);
    let err = |e: lowering::LoweringError| e.to_string();
    let mut functions = String::new();
    for (sym, k) in [
        ("fwd", forward),
        ("delta", &delta),
        ("dq", &dq),
        ("dkv", &dkv),
    ] {
        for (p, text) in [
            ("cpu", lowering::decomposed(k).map_err(err)?),
            ("tpu", lowering::tpu_custom_call(k).map_err(err)?.module),
        ] {
            let f = lowering::private_function(&text, &format!("{sym}_{p}")).map_err(err)?;
            for line in f.lines() {
                let _ = writeln!(functions, "  {line}");
            }
        }
    }
    let (tq, tk, tv) = (tensor(qs, *qd), tensor(ks, *kd), tensor(vs, *vd));
    let (to, tl) = (tensor(os, *od), tensor(ls, *ld));
    let branch = |p: &str| {
        format!(
            "      %f_{p}:2 = func.call @fwd_{p}(%arg1, %arg2, %arg3) : ({tq}, {tk}, {tv}) -> ({to}, {tl})\n\
             \x20     %d_{p} = func.call @delta_{p}(%f_{p}#0, %arg4) : ({to}, {to}) -> ({tl})\n\
             \x20     %e_{p} = \"stablehlo.subtract\"(%d_{p}, %arg5) : ({tl}, {tl}) -> {tl}\n\
             \x20     %q_{p} = func.call @dq_{p}(%arg1, %arg2, %arg3, %arg4, %f_{p}#1, %e_{p}) : ({tq}, {tk}, {tv}, {to}, {tl}, {tl}) -> ({tq})\n\
             \x20     %kv_{p}:2 = func.call @dkv_{p}(%arg1, %arg2, %arg3, %arg4, %f_{p}#1, %e_{p}) : ({tq}, {tk}, {tv}, {to}, {tl}, {tl}) -> ({tk}, {tv})\n\
             \x20     \"stablehlo.return\"(%q_{p}, %kv_{p}#0, %kv_{p}#1) : ({tq}, {tk}, {tv}) -> ()\n"
        )
    };
    let mut m = String::new();
    let _ = writeln!(
        m,
        "module @tessera_{}_vjp attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{",
        forward.name
    );
    let _ = writeln!(
        m,
        "  func.func public @main(%arg0: tensor<i32> {{jax.global_constant = \"_platform_index\"}}, %arg1: {tq}, %arg2: {tk}, %arg3: {tv}, %arg4: {to}, %arg5: {tl}) -> ({tq}, {tk}, {tv}) {{"
    );
    let _ = writeln!(m, "    %0:3 = \"stablehlo.case\"(%arg0) ({{");
    m += &branch("cpu");
    m += "    }, {\n";
    m += &branch("tpu");
    let _ = writeln!(m, "    }}) : (tensor<i32>) -> ({tq}, {tk}, {tv})");
    let _ = writeln!(m, "    return %0#0, %0#1, %0#2 : {tq}, {tk}, {tv}");
    m += "  }\n";
    m += &functions;
    m += "}\n";
    lowering::private_function(&m, "main").map_err(err)?;
    let inputs = [
        manifest_entry("q", qs, *qd),
        manifest_entry("k", ks, *kd),
        manifest_entry("v", vs, *vd),
        manifest_entry("ct_o", os, *od),
        manifest_entry("ct_lse", ls, *ld),
    ];
    let outputs = [
        manifest_entry("dq", qs, *qd),
        manifest_entry("dk", ks, *kd),
        manifest_entry("dv", vs, *vd),
    ];
    Ok(Artifact {
        module: m,
        kernel: format!("{}_vjp", forward.name),
        inputs: inputs.to_vec(),
        outputs: outputs.to_vec(),
    })
}

/// The VJP of a one-output forward kernel from its backward kernel
/// (the norms: `rms_norm` with `rms_norm_bwd`, `layer_norm` with
/// `layer_norm_bwd`), matched by name: the backward's `dy` is the output's
/// cotangent, its other inputs are primals of the same name, and its
/// output `d<name>` is the cotangent of primal `<name>`, reshaped and
/// converted to that primal's shape and dtype (`dgamma: f32[1, n]` for a
/// `gamma: bf16[n]`).
pub fn backward_vjp(
    forward: &VerifiedKernel,
    backward: &VerifiedKernel,
) -> Result<Artifact, String> {
    let err = |e: lowering::LoweringError| e.to_string();
    let (prim, outs) = signature(forward);
    let [(_, os, od)] = outs.as_slice() else {
        return Err(format!(
            "`{}` has {} outputs; this VJP takes one",
            forward.name,
            outs.len()
        ));
    };
    let t_ct = tensor(os, *od);
    // The backward's arguments as values of @main.
    let mut bargs = Vec::new();
    let mut btypes = Vec::new();
    for a in backward.arguments() {
        let v = if a.name == "dy" {
            format!("%arg{}", prim.len() + 1)
        } else {
            let i = prim.iter().position(|p| p.0 == a.name).ok_or_else(|| {
                format!(
                    "`{}` takes `{}`, which `{}` has not",
                    backward.name, a.name, forward.name
                )
            })?;
            format!("%arg{}", i + 1)
        };
        bargs.push(v);
        btypes.push(tensor(a.shape, a.dtype));
    }
    let bouts: Vec<(String, Vec<usize>, DType)> = backward
        .outputs()
        .map(|o| (o.name.clone(), o.shape.clone(), o.dtype))
        .collect();
    let bout_types: Vec<String> = bouts.iter().map(|(_, s, d)| tensor(s, *d)).collect();
    let prim_types: Vec<String> = prim.iter().map(|(_, s, d)| tensor(s, *d)).collect();
    let branch = |p: &str| -> Result<String, String> {
        let n = bouts.len();
        let mut b = format!(
            "      %b_{p}{} = func.call @bwd_{p}({}) : ({}) -> ({})\n",
            if n > 1 {
                format!(":{n}")
            } else {
                String::new()
            },
            bargs.join(", "),
            btypes.join(", "),
            bout_types.join(", ")
        );
        let mut rets = Vec::new();
        for (i, (name, shape, dtype)) in prim.iter().enumerate() {
            let j = bouts
                .iter()
                .position(|o| o.0 == format!("d{name}"))
                .ok_or_else(|| format!("`{}` has no output d{name}", backward.name))?;
            let mut v = if n > 1 {
                format!("%b_{p}#{j}")
            } else {
                format!("%b_{p}")
            };
            let (bs, bd) = (&bouts[j].1, bouts[j].2);
            if bs != shape {
                let r = format!("%r{i}_{p}");
                b += &format!(
                    "      {r} = \"stablehlo.reshape\"({v}) : ({}) -> {}\n",
                    tensor(bs, bd),
                    tensor(shape, bd)
                );
                v = r;
            }
            if bd != *dtype {
                let c = format!("%c{i}_{p}");
                b += &format!(
                    "      {c} = \"stablehlo.convert\"({v}) : ({}) -> {}\n",
                    tensor(shape, bd),
                    tensor(shape, *dtype)
                );
                v = c;
            }
            rets.push(v);
        }
        b += &format!(
            "      \"stablehlo.return\"({}) : ({}) -> ()\n",
            rets.join(", "),
            prim_types.join(", ")
        );
        Ok(b)
    };
    let mut m = String::new();
    let _ = writeln!(
        m,
        "module @tessera_{}_vjp attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{",
        forward.name
    );
    let params: Vec<String> = prim_types
        .iter()
        .enumerate()
        .map(|(i, t)| format!("%arg{}: {t}", i + 1))
        .chain(std::iter::once(format!("%arg{}: {t_ct}", prim.len() + 1)))
        .collect();
    let np = prim.len();
    let _ = writeln!(
        m,
        "  func.func public @main(%arg0: tensor<i32> {{jax.global_constant = \"_platform_index\"}}, {}) -> ({}) {{",
        params.join(", "),
        prim_types.join(", ")
    );
    let bind = if np > 1 {
        format!("%0:{np}")
    } else {
        "%0".into()
    };
    let _ = writeln!(m, "    {bind} = \"stablehlo.case\"(%arg0) ({{");
    m += &branch("cpu")?;
    m += "    }, {\n";
    m += &branch("tpu")?;
    let _ = writeln!(m, "    }}) : (tensor<i32>) -> ({})", prim_types.join(", "));
    let res: Vec<String> = if np > 1 {
        (0..np).map(|i| format!("%0#{i}")).collect()
    } else {
        vec!["%0".into()]
    };
    let _ = writeln!(
        m,
        "    return {} : {}",
        res.join(", "),
        prim_types.join(", ")
    );
    m += "  }\n";
    for (p, text) in [
        ("cpu", lowering::decomposed(backward).map_err(err)?),
        (
            "tpu",
            lowering::tpu_custom_call(backward).map_err(err)?.module,
        ),
    ] {
        let f = lowering::private_function(&text, &format!("bwd_{p}")).map_err(err)?;
        for line in f.lines() {
            let _ = writeln!(m, "  {line}");
        }
    }
    m += "}\n";
    lowering::private_function(&m, "main").map_err(err)?;
    let mut inputs: Vec<String> = prim
        .iter()
        .map(|(n, s, d)| manifest_entry(n, s, *d))
        .collect();
    inputs.push(manifest_entry(&format!("ct_{}", outs[0].0), os, *od));
    let outputs: Vec<String> = prim
        .iter()
        .map(|(n, s, d)| manifest_entry(&format!("d{n}"), s, *d))
        .collect();
    Ok(Artifact {
        module: m,
        kernel: format!("{}_vjp", forward.name),
        inputs,
        outputs,
    })
}

/// The kernels whose artifacts carry a VJP: the library entry and the
/// backward entries it is built from.
pub const WITH_VJP: [(&str, &str); 3] = [
    (
        "flash_attention",
        "attention_delta, flash_attention_dq, flash_attention_dkv",
    ),
    ("rms_norm", "rms_norm_bwd"),
    ("layer_norm", "layer_norm_bwd"),
];

/// The VJP artifact of library entry `entry` built as `forward` with
/// `config`, if it has backward kernels ([`WITH_VJP`]).
pub fn vjp_for(
    entry: &str,
    forward: &VerifiedKernel,
    config: &[(String, String)],
) -> Result<Option<Artifact>, String> {
    let backward = match entry {
        "flash_attention" => return flash_attention_vjp(forward, config).map(Some),
        "rms_norm" => "rms_norm_bwd",
        "layer_norm" => "layer_norm_bwd",
        _ => return Ok(None),
    };
    let e = crate::library::find(backward).ok_or_else(|| format!("no library entry {backward}"))?;
    let pairs: Vec<(String, String)> = config
        .iter()
        .filter(|(k, _)| e.params.iter().any(|p| p.name == k))
        .cloned()
        .collect();
    let c = crate::library::Config::parse(e, &pairs).map_err(|err| err.to_string())?;
    let out_shape = forward
        .outputs()
        .next()
        .map(|o| o.shape.clone())
        .unwrap_or_default();
    let mut shapes: Vec<(&str, Vec<usize>)> = forward
        .arguments()
        .map(|a| (a.name, a.shape.to_vec()))
        .collect();
    shapes.push(("dy", out_shape));
    let takes: Vec<&str> = (e.inputs)(&c)
        .map_err(|err| err.to_string())?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    shapes.retain(|(n, _)| takes.contains(n));
    let bwd = e
        .build_with_shapes(&c, &shapes)
        .map_err(|err| err.to_string())?;
    backward_vjp(forward, &bwd).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The module takes the platform index first, branches to the two
    /// lowerings, and the manifest lists the arguments and results in call
    /// order (the JAX side is checked by `tests/conformance/jax_export.py`).
    #[test]
    fn an_artifact_has_both_platforms_and_its_manifest() {
        let p = crate::library::preset("flash_attention_causal_bf16").unwrap();
        let art = export(&p.build().unwrap()).unwrap();
        let m = &art.module;
        assert!(m.contains("%arg0: tensor<i32> {jax.global_constant = \"_platform_index\"}"));
        assert!(
            m.contains("func.func private @tessera_cpu")
                && m.contains("func.func private @tessera_tpu")
        );
        assert!(m.contains("tpu_custom_call") && m.contains("stablehlo.while"));
        assert!(m.contains("{jax.result_info = \"lse\"}"));
        let man = &art.manifest(&[]);
        assert!(man.contains("\"platforms\": [\"cpu\", \"tpu\"]"));
        let q = man.find("\"name\": \"q\"").unwrap();
        let v = man.find("\"name\": \"v\"").unwrap();
        let lse = man.find("\"name\": \"lse\"").unwrap();
        assert!(q < v && v < lse, "{man}");
        assert!(
            man.contains("\"dtype\": \"bfloat16\", \"shape\": [1, 2, 256, 64]"),
            "{man}"
        );
    }

    /// The VJP takes the primals and both cotangents, recomputes the
    /// forward and runs the three backward kernels on each platform; the
    /// lse cotangent enters through delta.
    #[test]
    fn the_flash_attention_vjp_chains_the_backward_kernels() {
        let p = crate::library::preset("flash_attention_causal_bf16").unwrap();
        let config: Vec<(String, String)> = p
            .preset
            .config
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let art = flash_attention_vjp(&p.build().unwrap(), &config).unwrap();
        for f in ["fwd", "delta", "dq", "dkv"] {
            for plat in PLATFORMS {
                let sym = format!("func.func private @{f}_{plat}");
                assert!(art.module.contains(&sym), "{sym}");
            }
        }
        for plat in PLATFORMS {
            let sub = format!("%e_{plat} = \"stablehlo.subtract\"(%d_{plat}, %arg5)");
            assert!(art.module.contains(&sub), "{sub}");
        }
        for name in ["\"ct_o\"", "\"ct_lse\"", "\"dk\"", "\"dv\""] {
            assert!(art.manifest(&[]).contains(name), "{name}");
        }
    }
}
