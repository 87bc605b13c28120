"""How far a Tessera artifact gets into TorchTPU on a machine without a TPU.

Usage: probe.py TESSERA OUTDIR (in a venv with torch-tpu 0.2.0, torch 2.15,
libtpu 0.0.51, jax 0.11.2; tests/torchtpu/run.sh makes it). Exports Tessera's
flash attention, wraps it as a torch custom op with TorchTPU's own
`jax_op` (the path its Pallas kernels take), and checks each step:

1. `jax_op("tessera::flash_attention", fn)` wraps the artifact's call;
2. called on `meta` tensors (tracing, shape inference) it returns tensors of
   the artifact's output shapes and dtypes;
3. `register_custom_kernel(name, fingerprint, serialized_mlir_module=...)`
   takes the artifact exported for TPU, and `lookup_custom_kernel` finds it;
4. running needs the `tpu` device, which torch does not know without a
   chip: the call on real tensors fails with torch's device error (expected,
   and checked, so a change in that is noticed).
"""
import pathlib
import subprocess
import sys
import warnings

warnings.filterwarnings("ignore")

import jax  # noqa: E402
import torch  # noqa: E402
import torch_tpu  # noqa: E402, F401
from torch_tpu._internal.pallas import pallas as tt  # noqa: E402

import tessera_jax  # noqa: E402


def main():
    tessera, out = sys.argv[1], pathlib.Path(sys.argv[2])
    d = out / "flash_attention"
    subprocess.run([tessera, "export", "flash_attention", "--config", "causal=true", "--out", str(d)], check=True,
                   capture_output=True)
    exp = tessera_jax.load(d)
    results = []

    def fa(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
        return exp.call(q, k, v)

    op = tt.jax_op("tessera::flash_attention", fa)
    results.append(("jax_op wraps the artifact", op is not None))
    args = [torch.empty(a.shape, dtype=torch.float32, device="meta") for a in exp.in_avals]
    o, lse = op(*args)
    shapes = [tuple(o.shape), tuple(lse.shape)] == [tuple(a.shape) for a in exp.out_avals]
    results.append(("traced on meta tensors, with the artifact's output shapes", shapes and o.device.type == "meta"))
    tpu = jax.export.export(jax.jit(fa), platforms=["tpu"])(*[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in exp.in_avals])
    tt.tpu_torch_pallas.register_custom_kernel("tessera_flash_attention", "probe",
                                               serialized_mlir_module=tpu.mlir_module_serialized)
    results.append(("register_custom_kernel takes the artifact exported for TPU",
                    bool(tt.tpu_torch_pallas.lookup_custom_kernel("tessera_flash_attention", "probe"))))
    try:
        op(*[torch.randn(a.shape) for a in exp.in_avals])
        results.append(("running needs a TPU (expected: torch's device error)", False))
    except RuntimeError as e:
        results.append(("running needs a TPU (torch has no `tpu` device here)", "device type at start of device string: tpu" in str(e)))
    lines = ["# Tessera artifacts in TorchTPU (torch-tpu 0.2.0, no TPU)", ""]
    lines += [f"- {what}: {'ok' if ok else 'FAILED'}" for what, ok in results]
    report = "\n".join(lines) + "\n"
    (out / "report.md").write_text(report)
    print(report)
    sys.exit(0 if all(ok for _, ok in results) else 1)


if __name__ == "__main__":
    main()
