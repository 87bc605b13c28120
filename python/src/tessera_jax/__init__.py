"""Tessera kernels in JAX programs: a `tessera export` directory as a
`jax.export.Exported`.

    import tessera_jax
    exp = tessera_jax.load("out/flash_attention")    # checked: every file's SHA-256
    o, lse = jax.jit(exp.call)(q, k, v)              # CPU: decomposed StableHLO; TPU: tpu_custom_call;
                                                     # GPU (export --gpu): the Triton program, XLA's Triton call
    dq = jax.grad(lambda q: exp.call(q, k, v)[0].sum())(q)   # through the exported VJP (vjp/)

The module follows jax.export's calling convention 10 for multi-platform
modules (platforms cpu and tpu, with `tessera export --gpu` also cuda and
rocm; the platform index first); this loader only
serializes it with jax's own function (`_module_to_bytecode`, a StableHLO
portable artifact) and states its avals. Checked against jax/jaxlib 0.11.2
and 0.12.0.1, the oldest and the newest supported (the conformance venvs,
tests/conformance/run.sh and versions.py). Depends only on jax.

Installed with `pip install ./python` from a Tessera checkout; its
version is that checkout's Tessera version, and it loads only artifacts
whose manifest names the same release (`tessera_version`, major and minor).
"""
from __future__ import annotations

import pathlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax._src.export import _export
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir

__all__ = ["ArtifactError", "load", "load_family", "manifest", "check", "__version__"]

from tessera_artifact import ArtifactError, PathLike, __version__, check, manifest

def _avals(entries: list[dict[str, Any]]) -> tuple[jax.core.ShapedArray, ...]:
    """The abstract values of manifest entries (shape and dtype each)."""
    return tuple(jax.core.ShapedArray(tuple(e["shape"]), jnp.dtype(e["dtype"])) for e in entries)


def _varying(x: Any) -> frozenset[str]:
    """The mesh axes a value varies over inside `shard_map` (empty outside
    it): `manual_axis_type.varying` in jax 0.11, `vma` before."""
    t = jax.typeof(x)
    m = getattr(t, "manual_axis_type", None)
    if m is not None:
        return frozenset(m.varying)
    return frozenset(getattr(t, "vma", frozenset()))


class TesseraExported(jax.export.Exported):
    """A `jax.export.Exported` whose `.call` also differentiates inside
    `jax.shard_map` with its default checks: the exported VJP's cotangents
    come back typed as invariant across the mesh axes, so they are cast to
    vary over the axes their primals vary over (`jax.lax.pcast`), which is
    what `shard_map`'s varying-manual-axes check wants. Outside `shard_map`
    (no varying axes) it is exactly `jax.export.Exported.call`."""

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the exported kernel on `args` (see the class docs)."""
        plain = super().call
        if self._get_vjp is None or kwargs:
            return plain(*args, **kwargs)

        # The axes each argument varies over, read where the call is traced
        # (the residuals the backward sees do not carry them).
        vary = [_varying(a) for a in args]

        axes = frozenset().union(*vary)

        def varying(x, want):
            missing = tuple(sorted(want - _varying(x)))
            return jax.lax.pcast(x, missing, to="varying") if missing else x

        # The exported call's outputs come back typed invariant; typed as
        # varying over the arguments' axes (inside the rule, so not
        # differentiated), each device's cotangent reaches the backward as
        # it is instead of summed over the mesh.
        @jax.custom_vjp
        def f(*a):
            return tuple(varying(o, axes) for o in plain(*a))

        def fwd(*a):
            return f(*a), a

        def bwd(primals, cts):
            vjp = self.vjp()
            grads = vjp.call(*primals, *cts)
            # Integer inputs (segment ids, lengths) get no cotangent: the
            # VJP returns the float inputs' only, `grad_inputs` says which.
            which = getattr(vjp, "_tessera_grad_inputs", None)
            if which is None:
                which = range(len(primals))
            out = [None] * len(primals)
            for i, g in zip(which, grads):
                out[i] = varying(g, vary[i])
            return tuple(out)

        f.defvjp(fwd, bwd)
        return f(*args)


def load(path: PathLike) -> TesseraExported:
    """The exported kernel in `path` as a `jax.export.Exported` (call it with
    `.call(*arrays)`, inside `jax.jit` or not; arrays in manifest order).

    A kernel across chips (the manifest's `mesh_axes`) is called per shard
    inside `jax.shard_map` over a mesh of exactly those axes and sizes, the
    whole program's devices: its CPU branch numbers devices by partition."""
    d = pathlib.Path(path)
    man = check(d)
    if "module.mlir" not in man["files"]:
        raise ArtifactError(f"{d / 'manifest.json'}: does not name module.mlir")
    if man.get("calling_convention_version") != 10:
        raise ValueError(f"{d}: calling convention {man.get('calling_convention_version')} is not the 10 this loader knows")
    with mlir.make_ir_context():
        module = ir.Module.parse((d / "module.mlir").read_text())
        serialized = _export._module_to_bytecode(module)
    in_avals, out_avals = _avals(man["inputs"]), _avals(man["outputs"])
    n_in, n_out = len(in_avals), len(out_avals)
    return TesseraExported(
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


def _vjp_of(d: pathlib.Path, man: dict[str, Any]) -> Callable[[Any], TesseraExported] | None:
    """The loader of the exported VJP (jax.export's convention: the primals
    and the outputs' cotangents in, the inputs' cotangents out), if the
    artifact has one; `jax.grad` through `Exported.call` uses it."""
    sub = man.get("vjp")
    if sub is None:
        return None
    # The VJP's manifest is one of the files the forward's digests: a VJP
    # of another export is refused by check() above.
    if f"{sub}/manifest.json" not in man["files"]:
        raise ArtifactError(f"{d / 'manifest.json'}: names a VJP it has no digest of")
    vjp = load(d / sub)
    grad_inputs = manifest(d / sub).get("grad_inputs")
    if grad_inputs is not None:
        # Exported is a frozen dataclass; the loader's own note on it.
        object.__setattr__(vjp, "_tessera_grad_inputs", tuple(grad_inputs))
    return lambda _primal: vjp


def load_family(path: PathLike) -> tuple[dict[int, TesseraExported], int]:
    """A bucketed family (`tessera export --bucket AXIS=N,..`): a dict from
    bucket size to its `Exported`, and the bucketed axis."""
    d = pathlib.Path(path)
    fam = check(d, "buckets.json")
    for sub in fam["dirs"]:
        if f"{sub}/manifest.json" not in fam["files"]:
            raise ArtifactError(f"{d / 'buckets.json'}: has no digest of bucket {sub}")
    return {n: load(d / sub) for n, sub in zip(fam["sizes"], fam["dirs"])}, fam["axis"]
