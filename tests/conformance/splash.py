"""Tessera's masked attention beside Pallas's splash attention on the same
masks and segment ids:

* forward outputs (splash in interpret mode on the CPU, Tessera's
  table-driven kernel through `tessera masked` on its JIT) against each
  other and an f64 NumPy reference;
* the HBM bytes each forward pipeline moves (splash's index maps evaluated
  over its own mask info, as pallas_traffic.py does; Tessera's from
  `tessera masked --cost`): q/k/v, the partial blocks' element masks, and
  the segment ids where the case has them. Splash's masks are bool, which
  Pallas passes to a TPU kernel as int32 (`BOOL_MEMREF_TYPE` in
  `jax/_src/pallas/mosaic/lowering.py`, converted before the custom call),
  so they are counted at the size the kernel reads;
* the backward: dq, dk and dv of splash's own VJP (its dq and dk/dv kernels
  in interpret mode) against Tessera's exported masked attention under
  `jax.vjp` (its table-driven dq and dk/dv kernels, `tessera export`) and
  an f64 NumPy gradient.

Fails when an output or gradient differs, or Tessera moves more q/k/v or
mask bytes than splash.

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
from jax._src.pallas.mosaic import lowering as mosaic_lowering

import tessera_jax  # noqa: E402

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


def probabilities(spec, q, k, qs, ks):
    """Softmax of one head's masked scores in f64; a row with no visible
    key is all zero."""
    m = np.array([[visible(spec, i, j) and qs[i] == ks[j] for j in range(S)] for i in range(S)])
    s = q.astype(np.float64) @ k.astype(np.float64).T / np.sqrt(D)
    s = np.where(m, s, -np.inf)
    mx = s.max(-1, keepdims=True)
    alive = np.isfinite(mx)
    p = np.where(alive, np.exp(s - np.where(alive, mx, 0)), 0)
    return p / np.where(alive, p.sum(-1, keepdims=True), 1)


def reference(specs, q, k, v, qs, ks):
    return np.stack([probabilities(spec, q[h], k[h], qs, ks) @ v[h].astype(np.float64)
                     for h, spec in enumerate(specs)])


def reference_grads(specs, q, k, v, qs, ks, do):
    """dq, dk, dv of sum(o * do) in f64: dP = dO V^T, dS = P (dP - rowsum(dO o)),
    dq = dS K / sqrt(d), dk = dS^T Q / sqrt(d), dv = P^T dO."""
    grads = [np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)]
    for h, spec in enumerate(specs):
        p = probabilities(spec, q[h], k[h], qs, ks)
        qh, kh, vh, doh = (x.astype(np.float64) for x in (q[h], k[h], v[h], do[h]))
        o = p @ vh
        ds = p * (doh @ vh.T - (doh * o).sum(-1, keepdims=True))
        grads[0][h] = ds @ kh / np.sqrt(D)
        grads[1][h] = ds.T @ qh / np.sqrt(D)
        grads[2][h] = p.T @ doh
    return grads


# Splash's forward operands after its three prefetch arrays, in order.
SPLASH_OPERANDS = ["q", "k", "v", "q_seg", "kv_seg", "sinks", "masks", "q_sequence"]


def kernel_itemsize(dt):
    """Bytes per element as the TPU kernel reads it: Pallas passes bool
    operands as BOOL_MEMREF_TYPE (int32)."""
    dt = np.dtype(dt)
    return np.dtype(mosaic_lowering.BOOL_MEMREF_TYPE).itemsize if dt == np.bool_ else dt.itemsize


def splash_bytes(kernel, segment_ids):
    """Bytes splash's forward pipeline moves per operand name."""
    # A traced call of the same kernel would be a cache hit, never
    # reaching the intercepted pallas_call.
    jax.clear_caches()
    pt.captured.clear()
    orig = sk.pl.pallas_call
    sk.pl.pallas_call = pt.intercept
    try:
        z = jnp.zeros((H, S, D), jnp.float32)
        jax.jit(lambda q, k, v: kernel(q, k, v, segment_ids=segment_ids)).lower(z, z, z)
    finally:
        sk.pl.pallas_call = orig
    grid_spec, shapes, dtypes, _ = pt.captured[0]
    info = kernel.fwd_mask_info
    prefetch = [None if a is None else np.asarray(a) for a in (info.data_next, info.block_mask, info.mask_next)]
    moved = {}
    for name, spec, shape, dt in zip(SPLASH_OPERANDS, grid_spec.in_specs, shapes[3:], dtypes[3:]):
        if spec is not None and shape is not None:
            moved[name] = pt.count(spec, shape, kernel_itemsize(dt), grid_spec.grid, prefetch)[1]
    return moved


def tessera_grads(tessera, out, specs, q, k, v, seg, do):
    """dq, dk, dv of sum(o * do) through Tessera's exported masked attention
    (its VJP: the table-driven dq and dk/dv kernels) under jax.vjp."""
    d = out / "export"
    shape = f"1x{H}x{S}x{D}"
    r = subprocess.run([tessera, "export", "masked_attention", "--config", f"mask={';'.join(specs)}",
                        "--config", f"block_q={BLOCK}", "--config", f"block_k={BLOCK}",
                        "--shape", f"q={shape}", "--shape", f"k={shape}", "--shape", f"v={shape}",
                        "--shape", f"q_seg=1x{S}x1", "--shape", f"kv_seg=1x1x{S}", "--out", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"tessera export: {r.stderr.strip()}")
    exp = tessera_jax.load(d)
    q_seg, kv_seg = jnp.asarray(seg.reshape(1, S, 1)), jnp.asarray(seg.reshape(1, 1, S))
    o, vjp = jax.vjp(lambda q, k, v: exp.call(q, k, v, q_seg, kv_seg)[0],
                     *(jnp.asarray(x[None]) for x in (q, k, v)))
    return [np.asarray(g[0], np.float64) for g in vjp(jnp.asarray(do[None]))]


def splash_grads(kernel, q, k, v, ids, do):
    """dq, dk, dv of sum(o * do) through splash's own VJP (interpret mode),
    with q scaled as Tessera scales it."""
    _, vjp = jax.vjp(lambda q, k, v: kernel(q / np.sqrt(D), k, v, segment_ids=ids),
                     *(jnp.asarray(x) for x in (q, k, v)))
    return [np.asarray(g, np.float64) for g in vjp(jnp.asarray(do))]


def relative(a, b):
    """Max abs difference over the max abs of b (NaN counts as a failure)."""
    scale = float(np.abs(b).max()) or 1.0
    d = float(np.abs(a - b).max()) / scale
    return float("nan") if np.isnan(a).any() else d


def bwd_kernel(mask):
    """Splash with its backward kernels at the forward's blocks, interpret mode."""
    sizes = sk.BlockSizes(block_q=BLOCK, block_kv=BLOCK, block_kv_compute=BLOCK,
                          block_q_dkv=BLOCK, block_kv_dkv=BLOCK, block_kv_dkv_compute=BLOCK,
                          block_q_dq=BLOCK, block_kv_dq=BLOCK)
    return sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1, interpret=True, block_sizes=sizes)


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
             "## Forward: outputs and HBM bytes", "",
             "| mask | max abs Tessera - splash | max abs Tessera - f64 | q/k/v bytes splash | Tessera | ratio "
             "| mask bytes splash (element masks or q positions) | Tessera | segment-id bytes splash | Tessera |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    grad_lines = ["", "## Backward: dq, dk, dv (max abs difference / max abs of the f64 gradient)", "",
                  "| mask | Tessera - splash (dq, dk, dv) | Tessera - f64 | splash - f64 |", "|---|---|---|---|"]
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
        t_moved = {o["name"]: o["bytes"] for o in cost["operands"]}
        t_bytes = sum(t_moved[n] for n in ("q", "k", "v"))
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
        s_moved = splash_bytes(sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1,
                                                  block_sizes=sk.BlockSizes(block_q=BLOCK, block_kv=BLOCK,
                                                                            block_kv_compute=BLOCK)), ids)
        s_bytes = sum(s_moved[n] for n in ("q", "k", "v"))
        # Splash's mask data: its partial blocks' element masks, or, for a
        # mask it computes from positions, the query positions it reads.
        s_mask, t_mask = s_moved.get("masks", 0) + s_moved.get("q_sequence", 0), t_moved.get("masks", 0)
        s_seg = s_moved.get("q_seg", 0) + s_moved.get("kv_seg", 0)
        t_seg = t_moved.get("q_seg", 0) + t_moved.get("kv_seg", 0)
        lines.append(f"| {name} | {d_s:.1e} | {d_r:.1e} | {s_bytes} | {t_bytes} | {t_bytes / s_bytes:.3f} "
                     f"| {s_mask} | {t_mask} | {s_seg if packed else '-'} | {t_seg} |")
        if np.isnan(o_t).any() or d_s > 1e-4 or d_r > 1e-4:
            failures.append(f"{name}: outputs differ ({d_s:.1e} from splash, {d_r:.1e} from f64)")
        if t_bytes > s_bytes:
            failures.append(f"{name}: Tessera moves {t_bytes} q/k/v bytes, splash {s_bytes}")
        if t_mask > s_mask:
            failures.append(f"{name}: Tessera moves {t_mask} element-mask bytes, splash {s_mask}")
        if packed and t_seg > s_seg:
            failures.append(f"{name}: Tessera moves {t_seg} segment-id bytes, splash {s_seg}")
        # Backward: the same inputs and a random output cotangent.
        do = rng.standard_normal((H, S, D)).astype(np.float32)
        g_ref = reference_grads(specs, q, k, v, seg, seg, do)
        try:
            g_t = tessera_grads(tessera, out, specs, q, k, v, seg, do)
        except RuntimeError as e:
            failures.append(f"{name} (backward): {e}")
            continue
        g_s = splash_grads(bwd_kernel(mask), q, k, v, ids, do)
        e_ts = [relative(a, b) for a, b in zip(g_t, g_s)]
        e_tr = [relative(a, b) for a, b in zip(g_t, g_ref)]
        e_sr = [relative(a, b) for a, b in zip(g_s, g_ref)]
        fmt = lambda es: ", ".join(f"{e:.1e}" for e in es)  # noqa: E731
        grad_lines.append(f"| {name} | {fmt(e_ts)} | {fmt(e_tr)} | {fmt(e_sr)} |")
        if not all(e <= 1e-4 for e in e_ts + e_tr):
            failures.append(f"{name}: gradients differ ({fmt(e_ts)} from splash, {fmt(e_tr)} from f64)")
    lines += grad_lines
    lines += ["", "Mask data: a mask computable from positions (causal, local, chunked, one kind on every head "
              "for splash; any mask without an explicit array for Tessera) is computed in the kernel; splash "
              "then reads its query positions as `[bq, 128]` int32 blocks, Tessera one unread mask block once. "
              "Otherwise both read int32 `[bq, bk]` element masks (splash's bool masks become int32 before its "
              "custom call), each fetched when a partial step needs a new one. Tessera always takes segment "
              "ids; where a case has none they are all 0 and splash has no such operand, so they are listed, "
              "not compared."]
    if failures:
        lines += ["", "## Failures", ""] + [f"- {f}" for f in failures]
    report = "\n".join(lines) + "\n"
    (out.parent / "splash.md").write_text(report)
    print(report)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
