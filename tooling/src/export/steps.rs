//! An artifact's `triton.json`: the program as Triton programs and the
//! array ops between them ([`graph::STEPS_FORMAT`]).

use kernel_ir::{Array, VerifiedKernel};

/// The steps program ([`graph::kernel_steps`]) of one kernel
/// call with `fixed` recorded.
pub(super) fn kernel_steps(
    kernel: &VerifiedKernel,
    fixed: &[(usize, Array)],
) -> Result<String, lowering::LoweringError> {
    let steps = graph::kernel_steps(kernel)?;
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
