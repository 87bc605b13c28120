"""Tessera's decomposed flash attention on a GPU through the CUDA PJRT
plugin, against jax.nn.dot_product_attention and an f64 reference.

usage: h200_attention.py DIR [--platform cuda|cpu]

DIR holds fa_s{S}_causal_{true,false}.mlir (tests/gpu/prepare.sh writes
them): StableHLO modules `@main(q, k, v) -> (o, lse)` over f32[1, 8, S, 128].
Each is wrapped as a jax.export.Exported for the platform and called under
jax.jit; prints per shape the median time of Tessera's module and of
jax.nn.dot_product_attention (cudnn or XLA's, as jax picks), and both
errors against an f64 reference on the first 64 query rows of every head.
Depends only on jax and numpy.
"""
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.export import _export
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir


def exported(text, platform, shape):
    with mlir.make_ir_context():
        module = ir.Module.parse(text)
        serialized = _export._module_to_bytecode(module)
    b, h, s, d = shape
    aval = jax.core.ShapedArray(shape, jnp.float32)
    lse = jax.core.ShapedArray((b, h, s, 1), jnp.float32)
    return jax.export.Exported(
        fun_name="flash_attention", in_tree=jax.tree_util.tree_structure(((0, 1, 2), {})),
        in_avals=(aval,) * 3, out_tree=jax.tree_util.tree_structure((0, 1)), out_avals=(aval, lse),
        _in_named_shardings=(None,) * 3, _out_named_shardings=(None,) * 2,
        in_shardings_hlo=(None,) * 3, out_shardings_hlo=(None,) * 2, nr_devices=1,
        platforms=(platform,), ordered_effects=(), unordered_effects=(), disabled_safety_checks=(),
        mlir_module_serialized=serialized, calling_convention_version=10,
        module_kept_var_idx=(0, 1, 2), uses_global_constants=False, _get_vjp=None)


def median_time(f, *args, reps=10):
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2]


def reference(q, k, v, causal, rows):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("bhqd,bhkd->bhqk", q[:, :, :rows], k) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.arange(k.shape[2])[None, :] <= np.arange(rows)[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)


def main():
    d = pathlib.Path(sys.argv[1])
    platform = sys.argv[sys.argv.index("--platform") + 1] if "--platform" in sys.argv else "cuda"
    print(f"devices: {jax.devices()}")
    print("| S | causal | Tessera ms | jax.nn.dot_product_attention ms | ratio | Tessera max abs err | jax max abs err |")
    print("|---|---|---|---|---|---|---|")
    for f in sorted(d.glob("fa_s*_causal_*.mlir"), key=lambda p: (int(p.name.split("_")[1][1:]), p.name)):
        s = int(f.name.split("_")[1][1:])
        causal = f.name.endswith("true.mlir")
        shape = (1, 8, s, 128)
        keys = jax.random.split(jax.random.PRNGKey(s), 3)
        q, k, v = (jax.random.uniform(kk, shape, jnp.float32, -1, 1) for kk in keys)
        exp = exported(f.read_text(), platform, shape)
        ours = jax.jit(lambda q, k, v: exp.call(q, k, v)[0])
        # jax's layout is [b, s, h, d].
        theirs = jax.jit(lambda q, k, v: jnp.swapaxes(jax.nn.dot_product_attention(
            *(jnp.swapaxes(x, 1, 2) for x in (q, k, v)), is_causal=causal), 1, 2))
        t_ours, t_theirs = median_time(ours, q, k, v), median_time(theirs, q, k, v)
        want = reference(q, k, v, causal, 64)
        e_ours = np.abs(np.asarray(ours(q, k, v))[:, :, :64] - want).max()
        e_theirs = np.abs(np.asarray(theirs(q, k, v))[:, :, :64] - want).max()
        print(f"| {s} | {causal} | {t_ours * 1e3:.2f} | {t_theirs * 1e3:.2f} | {t_ours / t_theirs:.2f} | {e_ours:.2e} | {e_theirs:.2e} |")
        if not (e_ours < 1e-3):
            print(f"error: Tessera's result is off by {e_ours}", file=sys.stderr)
            sys.exit(1)


main()
