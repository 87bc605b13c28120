//! An artifact's `triton.json`: the program as Triton programs and the
//! array ops between them ([`runtime::graph::STEPS_FORMAT`]).

use kernel_ir::{Array, VerifiedKernel};

/// The steps program ([`runtime::graph::STEPS_FORMAT`]) of one kernel
/// call: the kernel's Triton program on all its arguments.
pub(super) fn kernel_steps(
    kernel: &VerifiedKernel,
    fixed: &[(usize, Array)],
) -> Result<String, String> {
    use runtime::graph::{STEPS_FORMAT, STEPS_VERSION};
    use runtime::triton::{dtype_name, program_json};
    let program = lowering::triton(kernel).map_err(|e| e.to_string())?;
    let inputs: Vec<serde_json::Value> = kernel
        .arguments()
        .map(|a| serde_json::json!({"dtype": dtype_name(a.dtype), "shape": a.shape}))
        .collect();
    let (n, m) = (inputs.len(), kernel.outputs().count());
    let steps = serde_json::json!({
        "format": STEPS_FORMAT,
        "format_version": STEPS_VERSION,
        "inputs": inputs,
        "programs": [program_json(&program)],
        "steps": [{
            "op": "kernel",
            "program": 0,
            "args": (0..n).collect::<Vec<_>>(),
            "out": (n..n + m).collect::<Vec<_>>(),
            "kernel": kernel.name,
        }],
        "outputs": (n..n + m).collect::<Vec<_>>(),
    });
    Ok(steps_with_fixed(steps, fixed))
}

/// `steps` with the `fixed` inputs recorded (`fixed`: index, dtype,
/// shape, little-endian bytes in hex): the caller passes the others only,
/// as to the module's `@main`.
pub(super) fn steps_with_fixed(mut steps: serde_json::Value, fixed: &[(usize, Array)]) -> String {
    let fixed: Vec<serde_json::Value> = fixed
        .iter()
        .map(|(i, a)| {
            serde_json::json!({
                "index": i,
                "dtype": runtime::triton::dtype_name(a.dtype()),
                "shape": a.shape(),
                "data": kernel_ir::hex(&a.to_le_bytes()),
            })
        })
        .collect();
    steps["fixed"] = serde_json::json!(fixed);
    steps.to_string()
}
