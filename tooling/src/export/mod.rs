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
//! loader `python (package tessera-jax)` turns the directory into a
//! `jax.export.Exported`.

use kernel_ir::quote::json_str;
use std::fmt::Write;

use crate::atomic_dir::{StageError, StagedDir};
use kernel_ir::{Array, DType, VerifiedKernel, sha256_hex};
use lowering::program::{Branch, CallForm};

mod steps;
mod vjp;

use steps::kernel_steps;
pub use vjp::{vjp_fixed, vjp_for, vjp_on};

/// An exported kernel: the module and what its manifest says of its
/// calling convention.
#[derive(Clone, Debug, PartialEq)]
pub struct Artifact {
    /// The multi-platform StableHLO module (text).
    pub module: String,
    /// The kernel's name (the manifest's `kernel`).
    pub kernel: String,
    /// Its platforms, in the order of the platform index (the manifest's
    /// `platforms`).
    pub platforms: Vec<String>,
    /// Manifest entries of the inputs (JSON objects, call order).
    inputs: Vec<String>,
    /// Manifest entries of the outputs.
    outputs: Vec<String>,
    /// The mesh of a kernel across chips, `(axis, size)` outermost first
    /// (empty for one device): the manifest's `mesh_axes`.
    mesh: Vec<(String, usize)>,
    /// A VJP's: the forward inputs (call order) whose cotangents it
    /// returns, when not all are (integer inputs have none): the
    /// manifest's `grad_inputs`.
    grad_inputs: Option<Vec<usize>>,
    /// With the GPU platforms: the same program as Triton programs and the
    /// array ops between them (`triton.json`, [`graph::STEPS_FORMAT`]),
    /// for hosts that launch Triton themselves (`tessera_torch`).
    pub steps: Option<String>,
}

impl Artifact {
    /// The manifest (JSON): the `extra` members (already JSON values)
    /// first, then kernel name, platforms, calling convention, inputs and
    /// outputs with JAX dtype names and shapes.
    pub fn manifest(&self, extra: &[(&str, String)]) -> String {
        let mut extra = extra.to_vec();
        if !self.mesh.is_empty() {
            // Call it inside `jax.shard_map` over a mesh of these axes.
            let axes: Vec<String> = self
                .mesh
                .iter()
                .map(|(n, size)| format!("[{}, {size}]", json_str(n)))
                .collect();
            extra.push(("mesh_axes", format!("[{}]", axes.join(", "))));
        }
        if let Some(g) = &self.grad_inputs {
            let ix: Vec<String> = g.iter().map(usize::to_string).collect();
            extra.push(("grad_inputs", format!("[{}]", ix.join(", "))));
        }
        manifest(
            &self.kernel,
            &extra,
            &self.platforms,
            &self.inputs,
            &self.outputs,
        )
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
    if let Some(steps) = &art.steps {
        files.push(("triton.json".into(), steps.clone().into_bytes()));
    }
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

/// The platforms of an artifact, in the order of the platform index:
/// `cpu` runs the decomposed StableHLO, `tpu` the `tpu_custom_call`.
pub const PLATFORMS: [&str; 2] = ["cpu", "tpu"];

/// The platforms an artifact made with GPUs adds after [`PLATFORMS`]
/// (`tessera export --gpu`), with the target whose TTIR each carries:
/// each calls the kernel's Triton program through XLA's GPU custom call,
/// its TTIR made by Triton's front end
/// (`runtime::triton::custom_call_module`), so exporting needs Triton.
pub const GPU_PLATFORMS: [(&str, kernel_ir::GpuTarget); 2] = runtime::triton::PLATFORMS;

/// `jax.export`'s calling convention version the module follows.
pub const CALLING_CONVENTION: u32 = 10;

/// The JAX (NumPy, ml_dtypes) name of a dtype: PyTorch's too
/// ([`runtime::triton::dtype_name`]), which `tessera_torch` relies on.
pub fn jax_dtype(d: DType) -> &'static str {
    runtime::triton::dtype_name(d)
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
    platforms: &[String],
    inputs: &[String],
    outputs: &[String],
) -> String {
    let mut s = String::from("{\n");
    for (k, v) in extra {
        let _ = writeln!(s, "  {}: {v},", json_str(k));
    }
    let platforms: Vec<String> = platforms.iter().map(|p| json_str(p)).collect();
    let _ = write!(
        s,
        "  \"kernel\": {},\n  \"platforms\": [{}],\n  \"calling_convention_version\": {CALLING_CONVENTION},\n  \"inputs\": [{}],\n  \"outputs\": [{}]\n}}\n",
        json_str(kernel),
        platforms.join(", "),
        inputs.join(", "),
        outputs.join(", ")
    );
    s
}

/// A kernel's arguments and outputs as (name, shape, dtype).
type Signature = Vec<(String, Vec<usize>, DType)>;

/// Whether `dir` may receive an export ([`publish`]'s check, to make
/// before the work).
pub fn check_out(dir: &std::path::Path) -> Result<(), StageError> {
    crate::atomic_dir::check_replaceable(dir, is_export_dir)
}

/// Writes `files` as the directory `dir`, all or nothing: staged beside
/// it and put in place with one rename (an earlier export there is
/// replaced whole; any other non-empty directory is refused).
pub fn publish(dir: &std::path::Path, files: &[(String, Vec<u8>)]) -> Result<(), StageError> {
    let staged = StagedDir::new(dir, is_export_dir)?;
    for (rel, bytes) in files {
        staged.write(rel, bytes)?;
    }
    staged.publish()
}

/// Exports a kernel of a user's own crate (no library entry, so no
/// backward) into `dir` for `tessera_jax.load`: `module.mlir` and
/// `manifest.json`, with `name` and `config` recorded as its provenance,
/// all or nothing ([`publish`]).
///
/// ```no_run
/// # let kernel: kernel_ir::VerifiedKernel = unimplemented!();
/// tooling::export::write_kernel(&kernel, "my_kernel", &[], std::path::Path::new("out/my_kernel"))?;
/// # Ok::<(), tooling::export::ExportError>(())
/// ```
pub fn write_kernel(
    kernel: &VerifiedKernel,
    name: &str,
    config: &[(String, String)],
    dir: &std::path::Path,
) -> Result<(), ExportError> {
    let prov = Provenance {
        entry: name.to_string(),
        config: config.to_vec(),
    };
    let files = artifact_files(&export(kernel)?, None, &prov);
    Ok(publish(dir, &files)?)
}

/// Why a kernel was not exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A platform's lowering failed.
    #[error(transparent)]
    Lowering(#[from] lowering::LoweringError),
    /// `--gpu` asked of a kernel across chips (a Triton program is one
    /// device's).
    #[error(
        "`{kernel}` runs across chips; its GPU platforms are not exported (the Triton program is one device's): export it without --gpu"
    )]
    AcrossChipsOnGpu {
        /// The kernel's name.
        kernel: String,
    },
    /// A GPU platform's Triton program could not be made.
    #[error("the {platform} platform of `{kernel}`: {source}")]
    Triton {
        /// The platform (`cuda`, `rocm`).
        platform: &'static str,
        /// The kernel's name.
        kernel: String,
        /// Triton's or the GPU lowering's error.
        source: Box<runtime::triton::TritonError>,
    },
    /// A fixed input whose value does not match the program's input.
    #[error(
        "fixed input {index} of `{kernel}` is {dtype:?} {shape:?}, but the program's input is {found}"
    )]
    FixedInput {
        /// The kernel's name.
        kernel: String,
        /// The input's index.
        index: usize,
        /// The value's dtype.
        dtype: kernel_ir::DType,
        /// The value's shape.
        shape: Vec<usize>,
        /// The program's input there (or none).
        found: String,
    },
    /// The kernel's steps for the PyTorch loader (`triton.json`).
    #[error("its Triton steps (triton.json): {0}")]
    Steps(Box<lowering::LoweringError>),
    /// Recording or exporting the backward on the graph runtime failed.
    #[error("the VJP of `{kernel}`: {what}: {source}")]
    Vjp {
        /// The forward kernel's name.
        kernel: String,
        /// The step (`recording the backward`, `exporting the program`).
        what: &'static str,
        /// The runtime's error.
        source: Box<graph::RuntimeError>,
    },
    /// The artifact's folder could not be written (nothing was).
    #[error(transparent)]
    Write(#[from] StageError),
}

/// Exports `kernel` (see the module docs).
pub fn export(kernel: &VerifiedKernel) -> Result<Artifact, ExportError> {
    export_fixed(kernel, &[])
}

/// Exports `kernel` with the arguments in `fixed` (index, value) written
/// into the module as constants: its `@main` takes the other arguments
/// only (an entry's [`kernels::entry::FixedInputs`], such as a mask's
/// block tables).
pub fn export_fixed(
    kernel: &VerifiedKernel,
    fixed: &[(usize, Array)],
) -> Result<Artifact, ExportError> {
    export_on(kernel, fixed, false)
}

/// [`export_fixed`], with the GPU platforms ([`GPU_PLATFORMS`]) after the
/// CPU and TPU ones when `gpu` is set.
pub fn export_on(
    kernel: &VerifiedKernel,
    fixed: &[(usize, Array)],
    gpu: bool,
) -> Result<Artifact, ExportError> {
    // A kernel across chips is called per shard inside `jax.shard_map`,
    // whose program is partitioned: its CPU branch numbers devices by
    // partition.
    let call = |form| Branch::Kernel(kernel.clone(), form);
    let mut branches = vec![
        (
            "cpu",
            call(CallForm::Decomposed(lowering::Spmd::Partitions)),
        ),
        ("tpu", call(CallForm::TpuCustomCall)),
    ];
    if gpu {
        if kernel.mesh.is_some() {
            return Err(ExportError::AcrossChipsOnGpu {
                kernel: kernel.name.clone(),
            });
        }
        for (platform, target) in GPU_PLATFORMS {
            let ttir =
                runtime::triton::kernel_ttir(kernel, target).map_err(|e| ExportError::Triton {
                    platform,
                    kernel: kernel.name.clone(),
                    source: Box::new(e),
                })?;
            branches.push((platform, call(CallForm::Triton { ttir })));
        }
    }
    let ins: Signature = kernel
        .arguments()
        .map(|a| (a.name.to_string(), a.shape.to_vec(), a.dtype))
        .collect();
    let outs: Signature = kernel
        .outputs()
        .map(|o| (o.name.clone(), o.shape.clone(), o.dtype))
        .collect();
    let mut art = multi_platform(&kernel.name, &ins, &outs, &branches, fixed)?;
    if gpu {
        art.steps = Some(kernel_steps(kernel, fixed).map_err(|e| ExportError::Steps(Box::new(e)))?);
    }
    art.mesh = kernel
        .mesh
        .as_ref()
        .map(|m| m.axes.clone())
        .unwrap_or_default();
    Ok(art)
}

/// The artifact of a program given as its branches, one per platform in
/// the order of the platform index, each a private function
/// (`@tessera_<platform>`, with any functions it calls) taking `ins` and
/// returning `outs`: `@main` takes the platform index first, then the
/// inputs not in `fixed` (those are constants in `@main`, checked against
/// their signature), and branches with `stablehlo.case`.
fn multi_platform(
    name: &str,
    ins: &Signature,
    outs: &Signature,
    branches: &[(&str, Branch)],
    fixed: &[(usize, Array)],
) -> Result<Artifact, ExportError> {
    for (i, a) in fixed {
        match ins.get(*i) {
            Some((n, shape, d)) if shape.as_slice() == a.shape() && *d == a.dtype() => {
                let _ = n;
            }
            other => {
                return Err(ExportError::FixedInput {
                    kernel: name.to_string(),
                    index: *i,
                    dtype: a.dtype(),
                    shape: a.shape().to_vec(),
                    found: format!("{other:?}"),
                });
            }
        }
    }
    let is_fixed = |i: usize| fixed.iter().any(|(j, _)| *j == i);
    let m = lowering::program::platform_switch(name, ins, outs, branches, fixed)?;
    let entries = |sig: &Signature| -> Vec<String> {
        sig.iter()
            .map(|(n, s, d)| manifest_entry(n, s, *d))
            .collect()
    };
    let free: Signature = ins
        .iter()
        .enumerate()
        .filter(|(i, _)| !is_fixed(*i))
        .map(|(_, x)| x.clone())
        .collect();
    Ok(Artifact {
        module: m,
        kernel: name.to_string(),
        platforms: branches.iter().map(|(p, _)| p.to_string()).collect(),
        inputs: entries(&free),
        outputs: entries(outs),
        mesh: Vec::new(),
        grad_inputs: None,
        steps: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::Config;

    /// With GPUs, an artifact and its VJP carry cuda and rocm after cpu and
    /// tpu, each calling the kernels' Triton programs through XLA's GPU
    /// custom call (JAX's lowering of them: `tests/conformance/jax_export.py`).
    #[test]
    fn with_gpu_an_artifact_and_its_vjp_call_triton_on_cuda_and_rocm() {
        let p = kernels::preset("flash_attention_causal_bf16").unwrap();
        let k = p.build().unwrap();
        let art = export_on(&k, &[], true).unwrap();
        assert_eq!(art.platforms, ["cpu", "tpu", "cuda", "rocm"]);
        let m = &art.module;
        for f in ["tessera_cpu", "tessera_tpu", "tessera_cuda", "tessera_rocm"] {
            assert!(m.contains(&format!("func.func private @{f}")), "{f}");
        }
        // One Triton call per GPU platform, each with its TTIR (the F32_DOT
        // precision differs: tf32x3 on NVIDIA, ieee on AMD).
        assert_eq!(m.matches(lowering::TRITON_CALL_TARGET).count(), 2);
        assert_eq!(
            m.matches("tt.func public @flash_attention_kernel").count(),
            2
        );
        assert!(m.contains("grid_x = ") && m.contains("num_warps = "));
        let man = art.manifest(&[]);
        assert!(
            man.contains("\"platforms\": [\"cpu\", \"tpu\", \"cuda\", \"rocm\"]"),
            "{man}"
        );
        // The VJP's backward kernels (dq, dk/dv) on both GPU platforms.
        let cfg = Config::of_preset(p.entry, p.preset).unwrap();
        let vjp = vjp_on(p.entry, &cfg, &k, &[], true).unwrap().unwrap();
        assert_eq!(vjp.platforms, art.platforms);
        assert!(vjp.module.matches(lowering::TRITON_CALL_TARGET).count() >= 4);
        // triton.json: the forward is its kernel's program on every
        // argument; the VJP's steps run the GPU builds' kernels, dq apart
        // from dk/dv (the one-pass kernel's grid is too narrow for a GPU),
        // with the cotangent of lse subtracted between them.
        let steps: serde_json::Value = serde_json::from_str(art.steps.as_deref().unwrap()).unwrap();
        assert_eq!(steps["format"], graph::STEPS_FORMAT);
        assert_eq!(steps["steps"][0]["op"], "kernel");
        assert_eq!(steps["steps"][0]["args"], serde_json::json!([0, 1, 2]));
        assert_eq!(steps["outputs"], serde_json::json!([3, 4]));
        assert_eq!(steps["programs"][0]["function"], "flash_attention_kernel");
        let vsteps: serde_json::Value =
            serde_json::from_str(vjp.steps.as_deref().unwrap()).unwrap();
        let kernels: Vec<&str> = vsteps["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s["kernel"].as_str())
            .collect();
        assert_eq!(
            kernels,
            [
                "flash_attention",
                "attention_delta",
                "flash_attention_dq",
                "flash_attention_dkv"
            ]
        );
        assert!(
            vsteps["steps"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["op"] == "binary" && s["name"] == "sub")
        );
        // Without --gpu nothing of the GPU is there.
        let plain = export(&k).unwrap();
        assert!(!plain.module.contains(lowering::TRITON_CALL_TARGET));
        assert!(plain.steps.is_none());
        let files = artifact_files(
            &plain,
            None,
            &Provenance {
                entry: "x".into(),
                config: vec![],
            },
        );
        assert!(files.iter().all(|(f, _)| f != "triton.json"));
    }

    /// At head dim 128 a GPU's backward kernels take 64-wide inner blocks
    /// (dq: 64 keys, dk/dv: 64 query rows), so their score tiles are
    /// 128 x 64 where the forward's are 128 x 128 (128-row ones spill).
    #[test]
    fn a_gpu_backward_at_head_dim_128_takes_64_wide_inner_blocks() {
        let e = kernels::find("flash_attention").unwrap();
        let pairs: Vec<(String, String)> =
            [("dtype", "bf16"), ("block_q", "128"), ("block_k", "128")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let cfg = Config::parse(e, &pairs).unwrap();
        let shape = [1usize, 2, 256, 128];
        let k = e
            .build_with_shapes(&cfg, &[("q", shape), ("k", shape), ("v", shape)])
            .unwrap();
        let vjp = vjp_on(e, &cfg, &k, &[], true).unwrap().unwrap();
        let steps: serde_json::Value = serde_json::from_str(vjp.steps.as_deref().unwrap()).unwrap();
        let source = |f: &str| {
            steps["programs"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["function"] == f)
                .unwrap_or_else(|| panic!("no {f}"))["source"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert!(!source("flash_attention_kernel").contains("[128, 64]"));
        for f in ["flash_attention_dq_kernel", "flash_attention_dkv_kernel"] {
            assert!(source(f).contains("[128, 64]"), "{f}");
        }
    }

    /// The module takes the platform index first, branches to the two
    /// lowerings, and the manifest lists the arguments and results in call
    /// order (the JAX side is checked by `tests/conformance/jax_export.py`).
    #[test]
    fn an_artifact_has_both_platforms_and_its_manifest() {
        let p = kernels::preset("flash_attention_causal_bf16").unwrap();
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

    /// The VJP is the entry's own backward (what `grad` runs), exported:
    /// the primals and both cotangents in, the forward recomputed and the
    /// two backward kernels (delta, then the one-pass dq/dk/dv) on each
    /// platform, the lse cotangent entering through delta. Entries without a backward have none; integer
    /// inputs get no cotangent.
    #[test]
    fn the_vjp_is_the_entry_backward_on_both_platforms() {
        let p = kernels::preset("flash_attention_causal_bf16").unwrap();
        let cfg = Config::of_preset(p.entry, p.preset).unwrap();
        let art = vjp_for(p.entry, &cfg, &p.build().unwrap())
            .unwrap()
            .unwrap();
        for plat in PLATFORMS {
            for i in 0..3 {
                let sym = format!("func.func private @tessera_{plat}_kernel_{i}(");
                assert!(art.module.contains(&sym), "{sym}");
            }
            let fourth = format!("func.func private @tessera_{plat}_kernel_3(");
            assert!(!art.module.contains(&fourth), "{fourth}");
        }
        assert_eq!(
            art.module
                .matches("call_target_name = \"tpu_custom_call\"")
                .count(),
            3
        );
        assert!(art.module.matches("stablehlo.subtract").count() >= 2);
        let man = art.manifest(&[]);
        for name in ["\"ct_o\"", "\"ct_lse\"", "\"dq\"", "\"dk\"", "\"dv\""] {
            assert!(man.contains(name), "{name}");
        }
        let e = kernels::find("matmul").unwrap();
        let k = e
            .build_at_default_shapes(&Config::parse(e, &[]).unwrap())
            .unwrap();
        assert!(
            vjp_for(e, &Config::parse(e, &[]).unwrap(), &k)
                .unwrap()
                .is_none()
        );
        // Integer inputs get no cotangent; the manifest names the others.
        let e = kernels::find("flash_attention_kv_len").unwrap();
        let c = Config::parse(e, &[]).unwrap();
        let k = e.build_at_default_shapes(&c).unwrap();
        let art = vjp_for(e, &c, &k).unwrap().unwrap();
        let man = art.manifest(&[]);
        assert!(man.contains("\"grad_inputs\": [1, 2, 3]"), "{man}");
        assert!(!man.contains("\"dkv_len\""), "{man}");
        let e = kernels::find("masked_attention").unwrap();
        let c = Config::parse(e, &[("mask".into(), "local:31:0;causal".into())]).unwrap();
        let k = e.build_at_default_shapes(&c).unwrap();
        let man = vjp_for(e, &c, &k).unwrap().unwrap().manifest(&[]);
        assert!(man.contains("\"grad_inputs\": [3, 4, 5]"), "{man}");
    }
}
