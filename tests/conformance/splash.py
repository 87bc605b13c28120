"""Tessera's masked attention beside Pallas's splash attention on the same
masks and segment ids: outputs (splash in interpret mode on the CPU, Tessera's
table-driven kernel through `tessera masked` on its JIT) against each other and
an f64 NumPy reference, and the HBM bytes each pipeline moves for q, k and v
(splash's index maps evaluated over its own mask info, as
pallas_traffic.py does; Tessera's from `tessera masked --cost`). Fails when
an output differs or Tessera moves more q/k/v bytes than splash.

libtpu's static profiler drops prefetch-driven work (splash shows 0 vmatmul),
so these kernels are ranked by bytes and executed flops here, not by that
estimate.

usage: splash.py TESSERA_BINARY OUT_DIR
"""

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import pallas_traffic as pt  # noqa: E402

S, H, D, BLOCK = 512, 2, 128, 128


def splash_mask(spec):
    """Splash's mask for one of Tessera's head specs."""
    if spec == "causal":
        return sm.CausalMask((S, S))
    if spec.startswith("local:"):
        _, left, right = spec.split(":")
        return sm.LocalMask((S, S), (int(left), int(right)), offset=0)
    if spec.startswith("chunked:"):
        return sm.ChunkedCausalMask((S, S), chunk_size=int(spec.split(":")[1]))
    if spec == "full":
        return sm.FullMask((S, S))
    raise ValueError(spec)


def visible(spec, i, j):
    if spec == "causal":
        return j <= i
    if spec.startswith("local:"):
        _, left, right = spec.split(":")
        return i - int(left) <= j <= i + int(right)
    if spec.startswith("chunked:"):
        c = int(spec.split(":")[1])
        return j <= i and j // c == i // c
    return True


def reference(specs, q, k, v, qs, ks):
    out = np.zeros(q.shape)
    scale = 1 / np.sqrt(D)
    for h, spec in enumerate(specs):
        m = np.array([[visible(spec, i, j) and qs[i] == ks[j] for j in range(S)] for i in range(S)])
        s = q[h].astype(np.float64) @ k[h].astype(np.float64).T * scale
        s = np.where(m, s, -np.inf)
        mx = s.max(-1, keepdims=True)
        alive = np.isfinite(mx)
        p = np.where(alive, np.exp(s - np.where(alive, mx, 0)), 0)
        denom = np.where(alive, p.sum(-1, keepdims=True), 1)
        out[h] = p / denom @ v[h].astype(np.float64)
    return out


def splash_bytes(kernel):
    # A traced call of the same kernel would be a cache hit, never
    # reaching the intercepted pallas_call.
    jax.clear_caches()
    pt.captured.clear()
    orig = sk.pl.pallas_call
    sk.pl.pallas_call = pt.intercept
    try:
        z = jnp.zeros((H, S, D), jnp.float32)
        jax.jit(kernel).lower(z, z, z)
    finally:
        sk.pl.pallas_call = orig
    grid_spec, shapes, dtypes, _ = pt.captured[0]
    info = kernel.fwd_mask_info
    prefetch = [None if a is None else np.asarray(a) for a in (info.data_next, info.block_mask, info.mask_next)]
    total = 0
    for spec, shape, dt in zip(grid_spec.in_specs, shapes[3:6], dtypes[3:6]):
        total += pt.count(spec, shape, np.dtype(dt).itemsize, grid_spec.grid, prefetch)[1]
    return total


def main():
    tessera, out = sys.argv[1], pathlib.Path(sys.argv[2]) / "splash"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(30)
    cases = [
        ("causal", ["causal", "causal"], False),
        ("local window 128", ["local:127:0", "local:127:0"], False),
        ("chunked causal 128", ["chunked:128", "chunked:128"], False),
        ("per head: causal, local", ["causal", "local:63:0"], False),
        ("packed sequences, causal", ["causal", "causal"], True),
    ]
    lines = ["# Masked attention beside splash attention", "",
             f"h={H}, s={S}, d={D}, blocks {BLOCK}x{BLOCK}, f32; splash in interpret mode.", "",
             "| mask | max abs Tessera - splash | max abs Tessera - f64 | q/k/v bytes splash | Tessera | ratio |",
             "|---|---|---|---|---|---|"]
    failures = []
    for name, specs, packed in cases:
        q, k, v = (rng.standard_normal((H, S, D)).astype(np.float32) for _ in range(3))
        if packed:
            cuts = np.sort(rng.choice(np.arange(1, S), 3, replace=False))
            seg = np.searchsorted(cuts, np.arange(S), side="right").astype(np.int32)
        else:
            seg = np.zeros(S, np.int32)
        for n, a in (("q", q), ("k", k), ("v", v)):
            np.save(out / f"{n}.npy", a[None])
        np.save(out / "seg.npy", seg[None])
        r = subprocess.run([tessera, "masked", "--mask", ";".join(specs), "--input", f"q={out / 'q.npy'}",
                            "--input", f"k={out / 'k.npy'}", "--input", f"v={out / 'v.npy'}",
                            "--input", f"q_seg={out / 'seg.npy'}", "--input", f"kv_seg={out / 'seg.npy'}",
                            "--block-q", str(BLOCK), "--block-k", str(BLOCK), "--cost", "--out", str(out / "o")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"{name}: tessera masked: {r.stderr.strip()}")
            continue
        cost = json.loads(r.stdout.strip().splitlines()[-1])
        t_bytes = sum(o["bytes"] for o in cost["operands"] if o["name"] in ("q", "k", "v"))
        o_t = np.load(out / "o" / "o.npy")[0].astype(np.float64)
        mask = sm.MultiHeadMask([splash_mask(s) for s in specs])
        kernel = sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1, interpret=True,
                                    block_sizes=sk.BlockSizes(block_q=BLOCK, block_kv=BLOCK, block_kv_compute=BLOCK))
        ids = sk.SegmentIds(q=jnp.asarray(seg), kv=jnp.asarray(seg)) if packed else None
        # Splash takes the scores unscaled: scale q as Tessera does.
        o_s = np.asarray(kernel(jnp.asarray(q) / np.sqrt(D), jnp.asarray(k), jnp.asarray(v), segment_ids=ids),
                         np.float64)
        ref = reference(specs, q, k, v, seg, seg)
        d_s, d_r = float(np.abs(o_t - o_s).max()), float(np.abs(o_t - ref).max())
        s_bytes = splash_bytes(sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1,
                                                  block_sizes=sk.BlockSizes(block_q=BLOCK, block_kv=BLOCK,
                                                                            block_kv_compute=BLOCK)))
        lines.append(f"| {name} | {d_s:.1e} | {d_r:.1e} | {s_bytes} | {t_bytes} | {t_bytes / s_bytes:.3f} |")
        if np.isnan(o_t).any() or d_s > 1e-4 or d_r > 1e-4:
            failures.append(f"{name}: outputs differ ({d_s:.1e} from splash, {d_r:.1e} from f64)")
        if t_bytes > s_bytes:
            failures.append(f"{name}: Tessera moves {t_bytes} q/k/v bytes, splash {s_bytes}")
    lines += ["", "Element masks: Tessera's are int32 blocks, fetched only when a partial step needs a new one; "
              "they are listed in `tessera masked --cost` and not in the q/k/v columns above."]
    if failures:
        lines += ["", "## Failures", ""] + [f"- {f}" for f in failures]
    report = "\n".join(lines) + "\n"
    (out.parent / "splash.md").write_text(report)
    print(report)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
