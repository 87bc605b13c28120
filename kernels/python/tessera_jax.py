"""Tessera kernels in JAX programs: a `tessera export` directory as a
`jax.export.Exported`.

    import tessera_jax
    exp = tessera_jax.load("out/flash_attention")    # module.mlir + manifest.json
    o, lse = jax.jit(exp.call)(q, k, v)              # CPU: decomposed StableHLO; TPU: tpu_custom_call
    dq = jax.grad(lambda q: exp.call(q, k, v)[0].sum())(q)   # through the exported VJP (vjp/)

The module follows jax.export's calling convention 10 for multi-platform
modules (platforms cpu and tpu, the platform index first); this loader only
serializes it with jax's own function (`_module_to_bytecode`, a StableHLO
portable artifact) and states its avals. Checked against jax/jaxlib 0.11.2
(the conformance venv, tests/conformance/run.sh). Depends only on jax.
"""
import json
import pathlib

import jax
import jax.numpy as jnp
from jax._src.export import _export
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir

__all__ = ["load", "load_family", "manifest"]


def manifest(path):
    """The manifest of an exported directory, as a dict."""
    return json.loads((pathlib.Path(path) / "manifest.json").read_text())


def _avals(entries):
    return tuple(jax.core.ShapedArray(tuple(e["shape"]), jnp.dtype(e["dtype"])) for e in entries)


def load(path):
    """The exported kernel in `path` as a `jax.export.Exported` (call it with
    `.call(*arrays)`, inside `jax.jit` or not; arrays in manifest order)."""
    d = pathlib.Path(path)
    man = manifest(d)
    if man.get("calling_convention_version") != 10:
        raise ValueError(f"{d}: calling convention {man.get('calling_convention_version')} is not the 10 this loader knows")
    with mlir.make_ir_context():
        module = ir.Module.parse((d / "module.mlir").read_text())
        serialized = _export._module_to_bytecode(module)
    in_avals, out_avals = _avals(man["inputs"]), _avals(man["outputs"])
    n_in, n_out = len(in_avals), len(out_avals)
    return jax.export.Exported(
        fun_name=man["kernel"],
        in_tree=jax.tree_util.tree_structure((tuple(range(n_in)), {})),
        in_avals=in_avals,
        out_tree=jax.tree_util.tree_structure(tuple(range(n_out))),
        out_avals=out_avals,
        _in_named_shardings=(None,) * n_in,
        _out_named_shardings=(None,) * n_out,
        in_shardings_hlo=(None,) * n_in,
        out_shardings_hlo=(None,) * n_out,
        nr_devices=1,
        platforms=tuple(man["platforms"]),
        ordered_effects=(),
        unordered_effects=(),
        disabled_safety_checks=(),
        mlir_module_serialized=serialized,
        calling_convention_version=10,
        module_kept_var_idx=tuple(range(n_in)),
        uses_global_constants=True,
        _get_vjp=_vjp_of(d, man),
    )


def _vjp_of(d, man):
    """The loader of the exported VJP (jax.export's convention: the primals
    and the outputs' cotangents in, the inputs' cotangents out), if the
    artifact has one; `jax.grad` through `Exported.call` uses it."""
    sub = man.get("vjp")
    if sub is None:
        return None
    vjp = load(d / sub)
    return lambda _primal: vjp


def load_family(path):
    """A bucketed family (`tessera export --bucket AXIS=N,..`): a dict from
    bucket size to its `Exported`, and the bucketed axis."""
    d = pathlib.Path(path)
    fam = json.loads((d / "buckets.json").read_text())
    return {n: load(d / sub) for n, sub in zip(fam["sizes"], fam["dirs"])}, fam["axis"]
