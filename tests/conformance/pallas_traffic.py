"""HBM traffic of Pallas's own flash attention against Tessera's, counted
by the same rule: a block moves when its index changes between consecutive
grid steps (row-major), an output block is written back when its index
changes and at the end, and a block at an array's edge moves its in-bounds
part.

Pallas's side: jax.experimental.pallas.ops.tpu.flash_attention's
pallas_call is intercepted while the op is traced on CPU (nothing runs), its
grid and BlockSpecs are kept, and the index maps are evaluated in Python over
the grid. A valid kv length is given to Pallas as segment ids; sliding
windows are compared with splash attention (LocalMask), the Pallas kernel
that has them, its index maps evaluated with its own block-sparse mask info.
Tessera's side: `tessera cost flash_attention[_kv_len] --json` at the same
shapes, block sizes and mask. Fails if Tessera moves more bytes than Pallas
on any configuration.

usage: pallas_traffic.py TESSERA_BINARY OUT_DIR
"""

import itertools
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import flash_attention as fa

captured = []


def intercept(kernel, *args, grid_spec=None, out_shape=None, **kwargs):
    def call(*operands):
        captured.append((grid_spec, [None if o is None else o.shape for o in operands], [None if o is None else o.dtype for o in operands], out_shape))
        outs = out_shape if isinstance(out_shape, (list, tuple)) else [out_shape]
        res = [None if o is None else jnp.zeros(o.shape, o.dtype) for o in outs]
        return res if isinstance(out_shape, (list, tuple)) else res[0]

    return call


def count(spec, shape, itemsize, grid, prefetch):
    """Blocks and bytes one operand moves."""
    last, blocks, nbytes, changes = None, 0, 0, []
    for point in itertools.product(*[range(g) for g in grid]):
        idx = tuple(int(np.asarray(i)) for i in spec.index_map(*point, *prefetch))
        if idx != last:
            changes.append(idx)
            last = idx
    block = [b if isinstance(b, int) else 1 for b in spec.block_shape]
    for idx in changes:
        elems = 1
        for n, s, b in zip(shape, block, idx):
            elems *= max(0, min(s, n - b * s))
        nbytes += elems * itemsize
        blocks += 1
    return blocks, nbytes


def pallas_traffic(b, h, s, d, causal, block, kv_len=None):
    captured.clear()
    orig = fa.pl.pallas_call
    fa.pl.pallas_call = intercept
    try:
        q = jnp.zeros((b, h, s, d), jnp.float32)
        sizes = fa.BlockSizes(block_q=block, block_k_major=block, block_k=block, block_b=1)
        seg = None
        if kv_len is not None:
            # A valid length as Pallas expresses it: keys past it in
            # another segment than every query.
            ids = jnp.asarray(np.broadcast_to((np.arange(s) < kv_len).astype(np.int32), (b, s)))
            seg = fa.SegmentIds(q=jnp.ones((b, s), jnp.int32), kv=ids)
        jax.jit(lambda q, k, v: fa.flash_attention(q, k, v, segment_ids=seg, causal=causal, sm_scale=0.125, block_sizes=sizes)).lower(q, q, q)
    finally:
        fa.pl.pallas_call = orig
    grid_spec, shapes, dtypes, _ = captured[0]
    grid = grid_spec.grid
    prefetch = []
    result = {"in": 0, "out": 0, "operands": {}}
    names = ["q", "k", "v"]
    # q, k, v (the optional bias and segment ids are absent: None).
    for name, spec, shape, dt in zip(names, grid_spec.in_specs, shapes, dtypes):
        blocks, nbytes = count(spec, shape, np.dtype(dt).itemsize, grid, prefetch)
        result["operands"][name] = {"blocks": blocks, "bytes": nbytes}
        result["in"] += nbytes
    outs = grid_spec.out_specs if isinstance(grid_spec.out_specs, (list, tuple)) else [grid_spec.out_specs]
    blocks, nbytes = count(outs[0], (b, h, s, d), 4, grid, prefetch)
    result["operands"]["o"] = {"blocks": blocks, "bytes": nbytes}
    result["out"] += nbytes
    return result


def splash_traffic(h, s, d, causal, block, window):
    """Pallas's splash attention (the Pallas kernel with sliding windows)
    under a local mask matching Tessera's window: keys j with i - w < j <= i
    (causal) or |i - j| < w."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    sides = (window - 1, 0 if causal else window - 1)
    mask = sm.MultiHeadMask([sm.LocalMask((s, s), sides, offset=0) for _ in range(h)])
    kernel = sk.make_splash_mha(mask, block_sizes=sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block),
                                head_shards=1, q_seq_shards=1)
    captured.clear()
    orig = sk.pl.pallas_call
    sk.pl.pallas_call = intercept
    try:
        q = jnp.zeros((h, s, d), jnp.float32)
        jax.jit(kernel).lower(q, q, q)
    finally:
        sk.pl.pallas_call = orig
    grid_spec, shapes, dtypes, _ = captured[0]
    info = kernel.fwd_mask_info
    prefetch = [None if a is None else np.asarray(a) for a in (info.data_next, info.block_mask, info.mask_next)]
    result = {"in": 0, "out": 0, "operands": {}}
    # Operands: the three mask-info arrays (scalar prefetch), then q, k, v.
    for name, spec, shape, dt in zip(["q", "k", "v"], grid_spec.in_specs, shapes[3:], dtypes[3:]):
        blocks, nbytes = count(spec, shape, np.dtype(dt).itemsize, grid_spec.grid, prefetch)
        result["operands"][name] = {"blocks": blocks, "bytes": nbytes}
        result["in"] += nbytes
    blocks, nbytes = count(grid_spec.out_specs[3], (h, s, d), 4, grid_spec.grid, prefetch)
    result["operands"]["o"] = {"blocks": blocks, "bytes": nbytes}
    result["out"] = nbytes
    return result


def tessera_traffic(binary, out_dir, b, h, s, d, causal, block, kv_len=None, window=None):
    kernel = "flash_attention" if kv_len is None else "flash_attention_kv_len"
    cmd = [binary, "cost", kernel, "--json",
           "--config", f"causal={'true' if causal else 'false'}",
           "--config", f"block_q={block}", "--config", f"block_k={block}",
           "--config", "sm_scale=0.125", "--config", f"window={window or 'none'}"]
    for n in ("q", "k", "v"):
        cmd += ["--shape", f"{n}={b}x{h}x{s}x{d}"]
    if kv_len is not None:
        path = f"{out_dir}/kv_len.npy"
        np.save(path, np.array([kv_len], np.int32))
        cmd += ["--input", f"kv_len={path}"]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)[0]
    ops = {o["name"]: o for o in out["operands"]}
    return {"in": sum(ops[n]["bytes"] for n in ("q", "k", "v")), "out": ops["o"]["bytes"], "operands": ops}


def main():
    binary, out_dir = sys.argv[1], sys.argv[2]
    rows, failed = [], False
    configs = [(1, 2, 1024, 128, 128, None), (2, 2, 512, 128, 128, None), (1, 1, 2048, 128, 256, None),
               (1, 2, 1024, 128, 128, 600), (1, 1, 2048, 128, 256, 1000)]
    for (b, h, s, d, block, kv_len) in configs:
        for causal in (False, True):
            p = pallas_traffic(b, h, s, d, causal, block, kv_len)
            t = tessera_traffic(binary, out_dir, b, h, s, d, causal, block, kv_len)
            # q, k, v only: Pallas also reads its segment ids.
            ok = t["in"] <= p["in"] and t["out"] <= p["out"]
            failed |= not ok
            rows.append(f"| {b}x{h}x{s}x{d} | {block} | {causal} | {kv_len or '-'} | {p['in']} | {t['in']} | {t['in'] / p['in']:.3f} | {p['out']} | {t['out']} | {'ok' if ok else 'MORE'} |")
    # Sliding windows: against splash attention, Pallas's kernel that has
    # them (flash_attention has none).
    for (h, s, d, block, window) in [(2, 1024, 128, 128, 256), (1, 2048, 128, 256, 512), (2, 1024, 128, 128, 100)]:
        for causal in (True, False):
            p = splash_traffic(h, s, d, causal, block, window)
            t = tessera_traffic(binary, out_dir, 1, h, s, d, causal, block, window=window)
            ok = t["in"] <= p["in"] and t["out"] <= p["out"]
            failed |= not ok
            rows.append(f"| 1x{h}x{s}x{d} | {block} | {causal} | window {window} (splash) | {p['in']} | {t['in']} | {t['in'] / p['in']:.3f} | {p['out']} | {t['out']} | {'ok' if ok else 'MORE'} |")
    table = "\n".join([
        "| b x h x s x d | block | causal | valid kv length | Pallas q,k,v HBM->VMEM B | Tessera | ratio | Pallas o VMEM->HBM | Tessera o | |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
    ])
    with open(f"{out_dir}/pallas_traffic.md", "w") as f:
        f.write("# Flash attention traffic: Tessera vs Pallas (same pipeline rule)\n\n" + table + "\n")
    print(table)
    if failed:
        print("pallas_traffic: Tessera moves more bytes than Pallas on some configuration", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
