"""Compares Tessera's tpu_custom_call modules with what Pallas exports.

Usage: compare.py DIR  (DIR holds <kernel>.tessera.mlir; the report goes to
DIR/report.md). The Pallas kernels below mirror Tessera's examples:
the same grid, blocks, scratch and math.
"""
import base64
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax._src.interpreters import mlir as jmlir
from jax._src.lib import tpu
from jax._src.lib.mlir import ir, passmanager
from jax._src.mesh import AbstractDevice

# ---- the Pallas side ------------------------------------------------------


def add(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def pallas_add():
    spec = pl.BlockSpec((16, 128), lambda i, j: (i, j))
    f = pl.pallas_call(
        add,
        out_shape=jax.ShapeDtypeStruct((64, 256), jnp.float32),
        grid=(4, 2),
        in_specs=[spec, spec],
        out_specs=spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
    )
    a = jax.ShapeDtypeStruct((64, 256), jnp.float32)
    return f, (a, a)


def matmul(x_ref, y_ref, o_ref, acc_ref):
    l = pl.program_id(2)

    @pl.when(l == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(l == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def pallas_matmul():
    f = pl.pallas_call(
        matmul,
        out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            grid=(2, 2, 4),
            in_specs=[
                pl.BlockSpec((128, 128), lambda i, j, l: (i, l)),
                pl.BlockSpec((128, 128), lambda i, j, l: (l, j)),
            ],
            out_specs=pl.BlockSpec((128, 128), lambda i, j, l: (i, j)),
            scratch_shapes=[pltpu.VMEM((128, 128), jnp.float32)],
        ),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )
    return f, (jax.ShapeDtypeStruct((256, 512), jnp.bfloat16), jax.ShapeDtypeStruct((512, 256), jnp.bfloat16))


BQ, BK, D, SCALE = 64, 128, 64, 0.125


def flash_attention(q_ref, k_ref, v_ref, o_ref, lse_ref, m_ref, l_ref, acc_ref):
    qi, ki = pl.program_id(2), pl.program_id(3)

    @pl.when(ki == 0)
    def _():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(ki * BK < (qi + 1) * BQ)
    def _():
        v = v_ref[0, 0]
        s = jax.lax.dot_general(q_ref[0, 0], k_ref[0, 0], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) * SCALE
        q_pos = jax.lax.broadcasted_iota(jnp.int32, s.shape, 0) + qi * BQ
        k_pos = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1) + ki * BK
        s = jnp.where(k_pos <= q_pos, s, -1e30)
        m_prev, l_prev = m_ref[:, 0:1], l_ref[:, 0:1]
        m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m_prev - m_new)
        acc_ref[...] = acc_ref[...] * alpha + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        m_ref[...] = jnp.broadcast_to(m_new, m_ref.shape)
        l_ref[...] = jnp.broadcast_to(l_prev * alpha + p.sum(axis=1, keepdims=True), l_ref.shape)

    @pl.when(ki == pl.num_programs(3) - 1)
    def _():
        o_ref[0, 0] = (acc_ref[...] / l_ref[:, 0:1]).astype(o_ref.dtype)
        lse_ref[0, 0] = m_ref[:, 0:1] + jnp.log(l_ref[:, 0:1])


def pallas_flash_attention():
    shape = (1, 2, 256, D)
    q_spec = pl.BlockSpec((1, 1, BQ, D), lambda b, h, i, j: (b, h, i, 0))
    # Steps past the last k block a q block needs re-use that block.
    kv_spec = pl.BlockSpec((1, 1, BK, D), lambda b, h, i, j: (b, h, jnp.minimum(j, jax.lax.div((i + 1) * BQ - 1, BK)), 0))
    lse_spec = pl.BlockSpec((1, 1, BQ, 1), lambda b, h, i, j: (b, h, i, 0))
    f = pl.pallas_call(
        flash_attention,
        out_shape=(jax.ShapeDtypeStruct(shape, jnp.bfloat16), jax.ShapeDtypeStruct((1, 2, 256, 1), jnp.float32)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            grid=(1, 2, 256 // BQ, 256 // BK),
            in_specs=[q_spec, kv_spec, kv_spec],
            out_specs=(q_spec, lse_spec),
            scratch_shapes=[pltpu.VMEM((BQ, 128), jnp.float32), pltpu.VMEM((BQ, 128), jnp.float32),
                            pltpu.VMEM((BQ, D), jnp.float32)],
        ),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
    )
    a = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    return f, (a, a, a)


def double_buffered_rows(x_hbm, o_ref, buf, sems, counter):
    i = pl.program_id(0)
    slot = i % 2

    @pl.when(i == 0)
    def _():
        pltpu.make_async_copy(x_hbm.at[0, pl.ds(0, 8)], buf.at[0], sems.at[0]).start()

    @pl.when(i + 1 < pl.num_programs(0))
    def _():
        nxt = (i + 1) % 2
        pltpu.make_async_copy(x_hbm.at[i + 1, pl.ds(0, 8)], buf.at[nxt], sems.at[nxt]).start()

    pltpu.make_async_copy(x_hbm.at[i, pl.ds(0, 8)], buf.at[slot], sems.at[slot]).wait()
    pl.semaphore_signal(counter.at[0], 1)
    one = pl.semaphore_read(counter.at[0])
    pl.semaphore_wait(counter.at[0], 1)

    def scoped(bottom, sem):
        c = pltpu.make_async_copy(x_hbm.at[i, pl.ds(8, 8)], bottom, sem)
        c.start()
        c.wait()
        o_ref[0] = buf[slot] + bottom[...] + one.astype(jnp.float32)

    pl.run_scoped(scoped, pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA)


def pallas_double_buffered_rows():
    f = pl.pallas_call(
        double_buffered_rows,
        out_shape=jax.ShapeDtypeStruct((4, 8, 128), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            grid=(4,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((1, 8, 128), lambda i: (i, 0, 0)),
            scratch_shapes=[pltpu.VMEM((2, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,)),
                            pltpu.SemaphoreType.REGULAR((1,))],
        ),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
    )
    return f, (jax.ShapeDtypeStruct((4, 16, 128), jnp.float32),)


# Kernels whose Pallas lowering asks for the TPU generation (run_scoped
# does): exported under an abstract mesh naming one, as on a CPU-only host.
NEEDS_TPU_INFO = {"double_buffered_rows_f32"}

# The ops of manual data movement, compared one by one (name, operand and
# result types, in program order) between our body and Pallas's.
DMA_OPS = {"tpu.memref_slice", "tpu.memref_squeeze", "tpu.enqueue_dma", "tpu.wait_dma2", "tpu.sem_signal",
           "tpu.sem_wait", "tpu.sem_read", "tpu.region", "tpu.sem_alloc", "memref.alloca", "tpu.yield"}


def dma_ops(mod):
    out = []

    def walk(op):
        for r in op.regions:
            for b in r.blocks:
                for o in b.operations:
                    name = o.operation.name
                    if name in DMA_OPS:
                        out.append((name, [str(v.type) for v in o.operands], [str(v.type) for v in o.results]))
                    walk(o.operation)

    main = [op for op in mod.body.operations if op.operation.name == "func.func" and "window_params" in op.attributes]
    walk(main[0].operation)
    return out


KERNELS = {
    "add_f32": pallas_add,
    "matmul_bf16_f32": pallas_matmul,
    "flash_attention_causal_bf16": pallas_flash_attention,
    "double_buffered_rows_f32": pallas_double_buffered_rows,
}

# Differences that are deliberate, by field, with their reason.
REASONS = {
    "attr api_version": "Tessera writes the default api_version = 1 explicitly; Pallas leaves it implicit (same value).",
    "config custom_call_config.cost_estimate": "Tessera always derives a cost estimate from the IR; Pallas includes one only when given pl.CostEstimate.",
    "config scoped_memory_configs": "Tessera always states the scoped VMEM limit (the target default when the kernel sets none); Pallas only when vmem_limit_bytes is set.",
    "layout k": "K carries a col_major hint: Tessera transposes it explicitly before the call (a visible, countable layout change), so the call and the kernel see it in physical order [.., d, s]; Pallas has no layout hints.",
}

# ---- reading modules ------------------------------------------------------


def context():
    ctx = jmlir.make_ir_context()
    tpu.register_dialect(ctx)
    ctx.allow_unregistered_dialects = True
    return ctx


def custom_call(module):
    calls = []

    def walk(op):
        for r in op.regions:
            for b in r.blocks:
                for o in b.operations:
                    if o.operation.name == "stablehlo.custom_call":
                        calls.append(o)
                    walk(o.operation)

    walk(module.operation)
    assert len(calls) == 1, f"expected one custom call, found {len(calls)}"
    c = calls[0]
    attrs = {n: c.attributes[n] for n in c.attributes}
    operands = [str(v.type) for v in c.operands]
    return attrs, operands


def deserialize(body_bytes):
    """Parses a serialized Mosaic body and runs mosaic-serde{serialize=false}."""
    mod = ir.Module.parse(body_bytes)
    passmanager.PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(mod.operation)
    return mod


def kernel_func(mod):
    funcs = [op for op in mod.body.operations if op.operation.name == "func.func"]
    main = [f for f in funcs if "window_params" in f.attributes]
    assert len(main) == 1, "expected one kernel function"
    f = main[0]
    attrs = {n: str(f.attributes[n]) for n in f.attributes if n not in ("sym_name", "function_type", "arg_attrs")}
    args = [str(a.type) for a in f.regions[0].blocks[0].arguments]
    transforms = sorted(str(g.attributes["sym_name"]) for g in funcs if g is not f)
    return str(f.attributes["sym_name"]), args, attrs, transforms


def keys(d, prefix=""):
    out = set()
    for k, v in d.items():
        if k == "body":
            continue
        path = f"{prefix}{k}"
        out.add(path)
        if isinstance(v, dict):
            out |= keys(v, path + ".")
    return out


def describe(module_text_or_bytes, ctx):
    with ctx:
        mod = ir.Module.parse(module_text_or_bytes)
        attrs, operands = custom_call(mod)
        config = json.loads(ir.StringAttr(attrs["backend_config"]).value)
        body = base64.b64decode(config["custom_call_config"]["body"])
        kernel = deserialize(body)
        ok = kernel.operation.verify()
        info = {
            "dma_ops": dma_ops(kernel),
            "attrs": {k: str(v) for k, v in attrs.items() if k != "backend_config"},
            "operands": operands,
            "config": config,
            "kernel": kernel_func(kernel),
            "verified": ok,
            "body": body,
        }
        return info


def round_trip(body):
    """deserialize, verify, serialize, deserialize, verify."""
    ctx = context()
    with ctx:
        mod = deserialize(body)
        assert mod.operation.verify(), "the deserialized body does not verify"
        passmanager.PassManager.parse("builtin.module(mosaic-serde{serialize=true})").run(mod.operation)
        again = ir.Module.parse(mod.operation.get_asm(binary=True))
        passmanager.PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(again.operation)
        assert again.operation.verify(), "the body does not verify after a serialize round trip"


def main():
    out = Path(sys.argv[1])
    lines = ["# Tessera vs Pallas (jax 0.11.2): tpu_custom_call conformance", ""]
    failures = []
    for name, make in KERNELS.items():
        f, args = make()
        export = jax.export.export(jax.jit(f), platforms=["tpu"])
        if name in NEEDS_TPU_INFO:
            device = AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
            with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)):
                exported = export(*args)
        else:
            exported = export(*args)
        theirs = describe(exported.mlir_module(), context())
        ours = describe((out / f"{name}.tessera.mlir").read_text(), context())
        lines += [f"## {name}", ""]
        checks = []
        if not ours["verified"]:
            failures.append(f"{name}: our body does not verify in jaxlib")
        try:
            round_trip(ours["body"])
            checks.append("our body deserializes, verifies with the tpu dialect, and survives a mosaic-serde round trip")
        except Exception as e:  # noqa: BLE001
            failures.append(f"{name}: mosaic-serde round trip failed: {e}")
        diffs = []
        # custom_call attributes
        for k in sorted(set(ours["attrs"]) | set(theirs["attrs"])):
            a, b = ours["attrs"].get(k), theirs["attrs"].get(k)
            if k == "api_version" and a == "1 : i32" and b is None:
                diffs.append(("attr api_version", f"ours {a}, Pallas implicit"))
            elif a != b:
                diffs.append((f"attr {k}", f"ours {a}, Pallas {b}"))
        # backend_config keys and fixed values
        ko, kt = keys(ours["config"]), keys(theirs["config"])
        only = ko ^ kt
        for k in sorted(only):
            if any(k.startswith(p + ".") for p in only):
                continue  # reported with its parent
            top = ".".join(k.split(".")[:2]) if k.startswith("custom_call_config") else k.split(".")[0]
            diffs.append((f"config {top}", f"key {k} only in {'ours' if k in ko else 'Pallas'}"))
        for k in ("serialization_format", "needs_layout_passes"):
            a, b = ours["config"]["custom_call_config"].get(k), theirs["config"]["custom_call_config"].get(k)
            if a != b:
                diffs.append((f"config custom_call_config.{k}", f"ours {a}, Pallas {b}"))
        # operands of the call
        if ours["operands"] != theirs["operands"]:
            diffs.append(("operands", f"ours {ours['operands']}, Pallas {theirs['operands']}"))
        # the kernel function
        on, oargs, oattrs, otr = ours["kernel"]
        tn, targs, tattrs, ttr = theirs["kernel"]
        if on != tn:
            diffs.append(("kernel name", f"ours {on}, Pallas {tn}"))
        if oargs != targs:
            diffs.append(("kernel signature", f"ours {oargs}, Pallas {targs}"))
        for k in sorted(set(oattrs) | set(tattrs)):
            if oattrs.get(k) != tattrs.get(k):
                diffs.append((f"kernel attr {k}", f"ours {oattrs.get(k)}, Pallas {tattrs.get(k)}"))
        if otr != ttr:
            diffs.append(("transform functions", f"ours {otr}, Pallas {ttr}"))
        if ours["dma_ops"] != theirs["dma_ops"]:
            first = next(i for i, (a, b) in enumerate(zip(ours["dma_ops"] + [None], theirs["dma_ops"] + [None])) if a != b)
            failures.append(f"{name}: copy/semaphore ops differ from Pallas at op {first}: ours "
                            f"{(ours['dma_ops'] + [None])[first]}, Pallas {(theirs['dma_ops'] + [None])[first]}")
        elif ours["dma_ops"]:
            checks.append(f"the {len(ours['dma_ops'])} copy, semaphore and scope ops match Pallas's one by one (name, operand and result types)")
        checks.append("compared: custom_call attributes, backend_config keys, call operands, kernel signature, kernel attributes, transform functions")
        lines += [f"- {c}" for c in checks]
        if not diffs:
            lines.append("- no differences")
        for field, detail in diffs:
            reason = REASONS.get(field)
            if reason is None and name.startswith("flash_attention") and field in (
                "operands", "kernel signature", "kernel attr window_params"):
                reason = REASONS["layout k"]
            if reason is None:
                failures.append(f"{name}: unexplained difference in {field}: {detail}")
                reason = "UNEXPLAINED"
            lines.append(f"- **{field}**: {detail}\n  - reason: {reason}")
        lines.append("")
    if failures:
        lines += ["## Failures", ""] + [f"- {f}" for f in failures]
    report = "\n".join(lines) + "\n"
    (out / "report.md").write_text(report)
    print(report)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
