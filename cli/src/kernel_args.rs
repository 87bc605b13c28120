//! Turning a kernel name, `--config` and `--shape`/`--input` into a
//! verified kernel and its inputs.

use std::path::Path;

use kernel_ir::{ArgumentError, Array, DType, VerifiedKernel};
use kernels::{Config, Entry};

use crate::args::{Args, parse_shape};

fn unknown_kernel(name: &str) -> String {
    format!("unknown kernel `{name}`; `tessera list` shows the kernels and presets")
}

/// A catalog kernel with its parsed config.
pub struct Chosen {
    pub entry: &'static Entry,
    pub config: Config,
}

/// The catalog entry `name` with `--config` applied.
pub fn choose(name: &str, args: &Args) -> Result<Chosen, String> {
    let entry = kernels::find(name).ok_or_else(|| unknown_kernel(name))?;
    let config = Config::parse(entry, &args.pairs("config")?).map_err(|e| e.to_string())?;
    Ok(Chosen { entry, config })
}

/// The largest kernel file read (a `.kir` file is text of a few KiB).
const MAX_KIR_BYTES: u64 = kernel_ir::limits::MAX_KIR_BYTES;

/// Whether `name` names a kernel file (the printed IR form, `*.kir`)
/// rather than a catalog kernel.
pub fn is_kernel_file(name: &str) -> bool {
    name.ends_with(".kir")
}

/// A kernel read from a `.kir` file (`kernel_ir::parse_file`) and
/// verified; its text fixes config and shapes, so `--config` and
/// `--shape` are refused.
pub fn kernel_file(path: &str, args: &Args) -> Result<VerifiedKernel, String> {
    if !args.all("config").is_empty() || !args.all("shape").is_empty() {
        return Err(format!(
            "`{path}` is a kernel file, whose text fixes its config and shapes; drop --config and --shape"
        ));
    }
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read `{path}`: {e}"))?;
    if !meta.is_file() {
        return Err(format!(
            "`{path}` is not a regular file; give a `.kir` kernel file"
        ));
    }
    if meta.len() > MAX_KIR_BYTES {
        return Err(format!(
            "`{path}` has {} bytes; a kernel file is text of at most {MAX_KIR_BYTES}",
            meta.len()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read `{path}`: {e}"))?;
    let kernel = kernel_ir::parse_file(path, &text).map_err(|e| format!("{path}: {e}"))?;
    kernel.verify().map_err(|e| e.to_string())
}

/// For `lower`: a catalog kernel (default shapes, overridden by
/// `--shape NAME=DxD..`), a preset from `tessera list`, or a `.kir` kernel
/// file.
pub fn kernel_for_lower(name: &str, args: &Args) -> Result<VerifiedKernel, String> {
    if is_kernel_file(name) {
        return kernel_file(name, args);
    }
    if kernels::find(name).is_none()
        && let Some(ex) = kernels::preset(name)
    {
        if !args.all("config").is_empty() || !args.all("shape").is_empty() {
            return Err(format!(
                "`{name}` is a preset with fixed config and shapes; use a catalog kernel with --config and --shape"
            ));
        }
        return ex.build().map_err(|e| e.to_string());
    }
    let c = choose(name, args)?;
    let mut shapes = Vec::new();
    for (k, v) in args.pairs("shape")? {
        shapes.push((k, parse_shape(&v)?));
    }
    c.entry
        .build_with_shapes(&c.config, &shapes)
        .map_err(|e| given_flags(args, e.to_string()))
}

/// A build error led by the `--config`/`--shape` flags that made the kernel
/// (the error's location is the library's line, not the user's input).
fn given_flags(args: &Args, error: String) -> String {
    let mut flags: Vec<String> = Vec::new();
    for k in ["config", "shape"] {
        flags.extend(args.all(k).iter().map(|v| format!("--{k} {v}")));
    }
    if flags.is_empty() {
        error
    } else {
        let error = error.strip_prefix("error: ").unwrap_or(&error);
        format!("with {}: {error}", flags.join(" "))
    }
}

/// For `run` and `diff`: the kernel built for the shapes of the `.npy`
/// inputs, and the inputs in kernel order (a float32 file given to a bf16
/// input is rounded to bf16).
pub fn kernel_and_inputs(c: &Chosen, args: &Args) -> Result<(VerifiedKernel, Vec<Array>), String> {
    let name = c.entry.name;
    let wanted: Vec<&str> = c
        .entry
        .default_shapes(&c.config)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let mut files: Vec<Option<Array>> = vec![None; wanted.len()];
    for (k, path) in args.pairs("input")? {
        let i = wanted.iter().position(|n| *n == k).ok_or_else(|| {
            format!(
                "kernel `{name}` has no input `{k}`; its inputs are: {}",
                wanted.join(", ")
            )
        })?;
        if files[i].is_some() {
            return Err(format!("--input {k} is given twice"));
        }
        files[i] = Some(tooling::npy::read(Path::new(&path)).map_err(|e| e.to_string())?);
    }
    let missing: Vec<&str> = wanted
        .iter()
        .zip(&files)
        .filter(|(_, f)| f.is_none())
        .map(|(n, _)| *n)
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "missing --input for {} (kernel `{name}` takes {})",
            missing.join(", "),
            wanted.join(", ")
        ));
    }
    let arrays: Vec<Array> = files.into_iter().flatten().collect();
    // Zero-size arrays have nothing to compute, and kernels need every dim
    // to be at least 1: the one answer, before anything is built.
    for (n, a) in wanted.iter().zip(&arrays) {
        if a.shape().contains(&0) {
            return Err(format!(
                "input `{n}` has shape {:?}, with a zero-size dim; Tessera kernels need every dim to be at least 1",
                a.shape()
            ));
        }
    }
    let shapes: Vec<Vec<usize>> = arrays.iter().map(|a| a.shape().to_vec()).collect();
    let kernel = c
        .entry
        .build(&c.config, &shapes)
        .map_err(|e| given_flags(args, e.to_string()))?;
    // The files were matched in argument order: prefetch, then inputs.
    // A float32 file given to a bf16 or fp8 input is rounded to it, a
    // uint8 (fp8 bits) file read as f8e4m3fn is taken as the f8e5m2 an
    // input may be; then the check every path makes.
    let out: Vec<Array> = arrays
        .into_iter()
        .zip(kernel.arguments())
        .map(|(a, arg)| for_argument(a, arg.dtype, arg.shape))
        .collect();
    kernel
        .check_arguments(out.iter().map(|a| (Some(a.dtype()), a.shape())))
        .map_err(|e| argument_error(name, e))?;
    c.entry
        .check_inputs(&c.config, &kernel, &out)
        .map_err(|e| e.to_string())?;
    Ok((kernel, out))
}

/// A `.npy` file's array as an argument of `dtype` and `shape` takes it:
/// a float32 file of that shape given to a bf16 or fp8 argument is rounded
/// to it, a uint8 (fp8 bits) file read as f8e4m3fn is taken as the f8e5m2
/// an argument may be; anything else is left for the shared argument check.
pub fn for_argument(a: Array, dtype: DType, shape: &[usize]) -> Array {
    let narrower = dtype == DType::BF16 || dtype.is_fp8();
    if a.dtype() == DType::F32 && narrower && a.shape() == shape {
        a.cast(dtype)
    } else {
        tooling::npy::reinterpret_fp8(a, dtype)
    }
}

/// The shared argument check's error in the words of `--input` files.
fn argument_error(kernel: &str, e: ArgumentError) -> String {
    match e {
        ArgumentError::Mismatch {
            name,
            want: (d, shape),
            got: (gd, gs),
            ..
        } => {
            if gs != shape {
                format!(
                    "input `{name}` has shape {gs:?} but, given the other inputs, kernel `{kernel}` takes {shape:?} there"
                )
            } else {
                format!(
                    "input `{name}` is {} but kernel `{kernel}` takes {d} there; convert the file{}",
                    gd.map_or("of an unknown dtype".to_string(), |g| g.to_string()),
                    if d.is_float() {
                        " or set --config dtype=..."
                    } else {
                        ""
                    }
                )
            }
        }
        other => other.to_string(),
    }
}
