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

/// An exported kernel: the module and its manifest.
#[derive(Clone, Debug, PartialEq)]
pub struct Artifact {
    /// The multi-platform StableHLO module (text).
    pub module: String,
    /// The manifest (JSON): kernel name, platforms, calling convention,
    /// inputs and outputs with JAX dtype names and shapes.
    pub manifest: String,
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
    if let Err(e) = lowering::private_function(&m, "main") {
        if std::env::var_os("TESSERA_DEBUG_EXPORT").is_some() {
            eprintln!("{m}");
        }
        return Err(err(e));
    }

    let entry = |(name, shape, d): (&str, &[usize], DType)| {
        let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
        format!(
            "{{\"name\": {}, \"dtype\": \"{}\", \"shape\": [{}]}}",
            json_str(name),
            jax_dtype(d),
            dims.join(", ")
        )
    };
    let inputs: Vec<String> = kernel
        .arguments()
        .map(|a| entry((a.name, a.shape, a.dtype)))
        .collect();
    let outputs: Vec<String> = kernel
        .outputs()
        .map(|o| entry((&o.name, &o.shape, o.dtype)))
        .collect();
    let manifest = format!(
        "{{\n  \"kernel\": {},\n  \"platforms\": [\"cpu\", \"tpu\"],\n  \"calling_convention_version\": {CALLING_CONVENTION},\n  \"inputs\": [{}],\n  \"outputs\": [{}]\n}}\n",
        json_str(&kernel.name),
        inputs.join(", "),
        outputs.join(", ")
    );
    Ok(Artifact {
        module: m,
        manifest,
    })
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
        let man = &art.manifest;
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
}
