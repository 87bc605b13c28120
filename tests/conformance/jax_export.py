"""Tessera kernels inside JAX programs, through `tessera export` artifacts.

Usage: jax_export.py TESSERA OUTDIR. For each flash-attention case (causal,
GQA, sliding window; f32 and bf16) exports the kernel, loads it with
the installed tessera-jax package (python) and calls it under jax.jit on CPU, comparing
o with jax.nn.dot_product_attention and o and lse with a float64 numpy
reference, and jax.grad through the artifact's exported VJP with JAX's
autodiff of the reference; then exports a JAX function that calls the artifact with
platforms=["tpu"] and compiles it with libtpu for v5e and v6e
(`tessera compile --module`). Masked attention too: its block tables are
constants of the artifact; forward (dead rows included) against float64 and
jax.grad against JAX's autodiff, its gradient program compiled for every
generation. Exits non-zero on any failure.
"""
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

import tessera_jax  # noqa: E402

# name: (config, q/k/v shapes [b, h, s, d], jax window (left, right) or None)
CASES = {
    "causal": ([("causal", "true")], (1, 2, 256, 64), 2, None),
    "gqa_causal": ([("causal", "true")], (2, 4, 128, 64), 1, None),
    "window": ([("causal", "true"), ("window", "64")], (1, 2, 256, 64), 2, (63, 0)),
}
TOL = {"float32": 2e-5, "bfloat16": 3e-2}


def reference(q, k, v, window):
    """Causal (windowed) attention in float64, GQA by repeating kv heads."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    i, j = np.indices(s.shape[-2:])
    hidden = j > i
    if window is not None:
        hidden |= i - j > window[0]
    s = np.where(hidden, -np.inf, s)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    lse = m + np.log(p.sum(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v, lse


def max_abs(a, b):
    """max |a - b| in float64 on the host (numpy: an eager jnp op would
    compile an XLA program per op and shape)."""
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def max_rel(a, b):
    """max |a - b| / max |b| in float64 on the host."""
    return max_abs(a, b) / float(np.abs(np.asarray(b, np.float64)).max())


def jax_reference(q, k, v, window):
    """The same attention in jnp (f32), for JAX's own autodiff."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, g, axis=1), jnp.repeat(v, g, axis=1)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    i, j = np.indices(s.shape[-2:])
    hidden = j > i
    if window is not None:
        hidden |= i - j > window[0]
    s = jnp.where(hidden, -jnp.inf, s)
    lse = jax.nn.logsumexp(s, axis=-1, keepdims=True)
    return jnp.einsum("bhqk,bhkd->bhqd", jnp.exp(s - lse), v), lse


def main():
    tessera, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    failures, lines = [], [f"# Tessera artifacts in JAX (jax {jax.__version__})", ""]
    for name, (config, (b, h, s, d), hkv, window) in CASES.items():
        for dtype in ("float32", "bfloat16"):
            case = f"{name}_{dtype}"
            d_out = out / case
            cfg = [x for k, v in config + [("dtype", {"float32": "f32", "bfloat16": "bf16"}[dtype])] for x in ("--config", f"{k}={v}")]
            kv_shape = f"{b}x{hkv}x{s}x{d}"
            shapes = ["--shape", f"q={b}x{h}x{s}x{d}", "--shape", f"k={kv_shape}", "--shape", f"v={kv_shape}"]
            subprocess.run([str(tessera), "export", "flash_attention", *cfg, *shapes, "--out", str(d_out)], check=True, capture_output=True)
            exp = tessera_jax.load(d_out)
            rng = np.random.default_rng(7)
            q, k, v = (jnp.asarray(rng.standard_normal(a.shape), a.dtype) for a in exp.in_avals)
            o, lse = jax.jit(exp.call)(q, k, v)
            # jax's attention takes [b, s, h, d].
            t = lambda x: x.transpose(0, 2, 1, 3)
            local = window if window is not None else None
            jo = jax.jit(lambda q, k, v: t(jax.nn.dot_product_attention(t(q), t(k), t(v), is_causal=True, local_window_size=local)))(q, k, v)
            ro, rlse = reference(q, k, v, window)
            err_jax = float(np.abs(np.asarray(o, np.float64) - np.asarray(jo, np.float64)).max())
            err_ref = float(np.abs(np.asarray(o, np.float64) - ro).max())
            err_lse = float(np.abs(np.asarray(lse, np.float64) - rlse).max())
            ok = max(err_jax, err_ref) <= TOL[dtype] and err_lse <= 1e-4 and not np.isnan(np.asarray(o, np.float32)).any()
            lines.append(f"- {case}: max |o - jax.nn.dot_product_attention| {err_jax:.2e}, max |o - f64| {err_ref:.2e}, max |lse - f64| {err_lse:.2e}: {'ok' if ok else 'FAILED'}")
            if not ok:
                failures.append(case)
            # jax.grad through the artifact (its exported VJP, from Tessera's
            # backward kernels) against JAX's autodiff of the reference; the
            # loss uses both outputs, so both cotangents matter.
            wo = jnp.asarray(rng.standard_normal(exp.out_avals[0].shape), jnp.float32)
            wl = jnp.asarray(rng.standard_normal(exp.out_avals[1].shape), jnp.float32)
            def loss(f):
                def l(q, k, v):
                    o, lse = f(q, k, v)
                    return (o.astype(jnp.float32) * wo).sum() + (lse * wl).sum()
                return l
            gt = jax.jit(jax.grad(loss(exp.call), argnums=(0, 1, 2)))(q, k, v)
            gj = jax.jit(jax.grad(loss(lambda q, k, v: jax_reference(q, k, v, window)), argnums=(0, 1, 2)))(q, k, v)
            errs = [max_rel(a, b) for a, b in zip(gt, gj)]
            gok = max(errs) <= {"float32": 1e-4, "bfloat16": 2e-2}[dtype]
            lines.append(f"  - jax.grad (dq, dk, dv) against JAX's autodiff of the reference, max error / max |grad|: {', '.join(f'{e:.1e}' for e in errs)}: {'ok' if gok else 'FAILED'}")
            if not gok:
                failures.append(f"{case} (grad)")
            # The same artifact inside a JAX program exported for TPU.
            def model(q, k, v, exp=exp):
                o, lse = exp.call(q, k, v)
                return o.astype(jnp.float32) * 2.0, lse
            args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in exp.in_avals]
            grad = jax.grad(loss(exp.call), argnums=(0, 1, 2))
            for what, fn in (("the forward", model), ("its gradient", grad)):
                module = jax.export.export(jax.jit(fn), platforms=["tpu"])(*args).mlir_module()
                path = out / f"{case}.{'fwd' if fn is model else 'grad'}.jax_tpu.mlir"
                path.write_text(module)
                r = subprocess.run([str(tessera), "compile", "--module", str(path), "--tpu", "v5e,v6e"], capture_output=True, text=True)
                lines.append(f"  - a JAX program calling {what}, exported for TPU, compiled with libtpu for v5e and v6e: {'ok' if r.returncode == 0 else 'FAILED'}")
                if r.returncode != 0:
                    failures.append(f"{case} (TPU compile of {what}): {r.stdout[-400:]} {r.stderr[-400:]}")
    lines += ["", "## A bucketed family", ""]
    fam_dir = out / "family"
    subprocess.run([str(tessera), "export", "flash_attention", "--config", "causal=true", "--bucket", "2=128,256",
                    "--out", str(fam_dir)], check=True, capture_output=True)
    family, axis = tessera_jax.load_family(fam_dir)
    for n, exp in sorted(family.items()):
        rng = np.random.default_rng(n)
        q, k, v = (jnp.asarray(rng.standard_normal(a.shape), a.dtype) for a in exp.in_avals)
        o, _ = jax.jit(exp.call)(q, k, v)
        err = float(np.abs(np.asarray(o, np.float64) - reference(q, k, v, None)[0]).max())
        ok = exp.in_avals[0].shape[axis] == n and err <= TOL["float32"]
        lines.append(f"- bucket {n} (axis {axis}): max |o - f64| {err:.2e}: {'ok' if ok else 'FAILED'}")
        if not ok:
            failures.append(f"bucket {n}")
    lines += ["", "## Norms", ""]
    for name in ("rms_norm", "layer_norm"):
        for dtype in ("float32", "bfloat16"):
            case = f"{name}_{dtype}"
            d_out = out / case
            cfg = ["--config", f"dtype={'f32' if dtype == 'float32' else 'bf16'}", "--config", "block_rows=16"]
            subprocess.run([str(tessera), "export", name, *cfg, "--out", str(d_out)], check=True, capture_output=True)
            exp = tessera_jax.load(d_out)
            rng = np.random.default_rng(11)
            args = [jnp.asarray(rng.standard_normal(a.shape) * (0.1 if i else 1.0) + (1.0 if i == 1 else 0.0), a.dtype)
                    for i, a in enumerate(exp.in_avals)]
            def ref(*a, name=name):
                x = a[0].astype(jnp.float32)
                if name == "rms_norm":
                    y = x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-5) * a[1].astype(jnp.float32)
                else:
                    mu = x.mean(-1, keepdims=True)
                    y = (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * a[1].astype(jnp.float32) + a[2].astype(jnp.float32)
                return (y,)
            w = jnp.asarray(rng.standard_normal(exp.out_avals[0].shape), jnp.float32)
            loss = lambda f: (lambda *a: (f(*a)[0].astype(jnp.float32) * w).sum())
            o = jax.jit(exp.call)(*args)[0]
            e_fwd = max_abs(o, jax.jit(ref)(*args)[0])
            n = len(args)
            gt = jax.jit(jax.grad(loss(exp.call), argnums=tuple(range(n))))(*args)
            gj = jax.jit(jax.grad(loss(ref), argnums=tuple(range(n))))(*args)
            errs = [max_rel(a, b) for a, b in zip(gt, gj)]
            tol = {"float32": 1e-4, "bfloat16": 3e-2}[dtype]
            ok = e_fwd <= tol * 10 and max(errs) <= tol
            lines.append(f"- {case}: max |o - jnp reference| {e_fwd:.1e}; jax.grad against JAX's autodiff, max error / max |grad|: {', '.join(f'{e:.1e}' for e in errs)}: {'ok' if ok else 'FAILED'}")
            if not ok:
                failures.append(case)
    lines += ["", "## Masked attention (tables inside the artifact)", ""]
    failures += masked_checks(tessera, out, lines)
    lines += ["", "## Every other exported VJP against a central difference of its forward", ""]
    failures += directional_checks(tessera, out, lines)
    lines += ["", "## Valid lengths out of range (not checked by the artifact)", ""]
    failures += kv_len_out_of_range(tessera, out, lines)
    lines += ["", "## Whole or refused", ""]
    failures += whole_or_refused(tessera, out, lines)
    lines += ["", "## GPU platforms (tessera export --gpu)", ""]
    failures += gpu_platform_checks(tessera, out, lines)
    if failures:
        lines += ["", "## Failures", ""] + [f"- {f}" for f in failures]
    report = "\n".join(lines) + "\n"
    (out / "report.md").write_text(report)
    print(report)
    sys.exit(1 if failures else 0)


def gpu_platform_checks(tessera, out, lines):
    """An artifact exported with --gpu carries cuda and rocm beside cpu and
    tpu: it still runs on CPU with the same answers, and a JAX program
    calling it (forward and jax.grad) lowers for cuda and for rocm with
    jax.export (platform lowering needs no device), each platform's module
    calling the kernel's Triton program through XLA's GPU custom call with
    its TTIR and launch grid. Running it needs a GPU (tests/gpu/run.sh)."""
    failures = []
    config = ["--config", "causal=true", "--shape", "q=1x2x128x64", "--shape", "k=1x2x128x64", "--shape", "v=1x2x128x64"]
    plain, gpu = out / "gpu_plain", out / "gpu_all"
    subprocess.run([str(tessera), "export", "flash_attention", *config, "--out", str(plain)], check=True, capture_output=True)
    subprocess.run([str(tessera), "export", "flash_attention", *config, "--gpu", "--out", str(gpu)], check=True, capture_output=True)
    exp, base = tessera_jax.load(gpu), tessera_jax.load(plain)
    ok = tuple(exp.platforms) == ("cpu", "tpu", "cuda", "rocm")
    lines.append(f"- platforms {list(exp.platforms)}: {'ok' if ok else 'FAILED'}")
    if not ok:
        failures.append(f"gpu platforms: {exp.platforms}")
    rng = np.random.default_rng(5)
    q, k, v = (jnp.asarray(rng.standard_normal(a.shape), a.dtype) for a in exp.in_avals)
    o, lse = jax.jit(exp.call)(q, k, v)
    bo, blse = jax.jit(base.call)(q, k, v)
    ro, _ = reference(q, k, v, None)
    same = bool((np.asarray(o) == np.asarray(bo)).all() and (np.asarray(lse) == np.asarray(blse)).all())
    err = float(np.abs(np.asarray(o, np.float64) - ro).max())
    ok = same and err <= TOL["float32"]
    lines.append(f"- on CPU: the same bits as the artifact without --gpu ({same}), max |o - f64| {err:.2e}: {'ok' if ok else 'FAILED'}")
    if not ok:
        failures.append("gpu artifact on CPU")
    w = jnp.asarray(rng.standard_normal(exp.out_avals[0].shape), jnp.float32)
    def fwd(q, k, v):
        return exp.call(q, k, v)[0] * 2.0
    grad = jax.grad(lambda q, k, v: (exp.call(q, k, v)[0] * w).sum(), argnums=(0, 1, 2))
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in exp.in_avals]
    for platform in ("cuda", "rocm"):
        for what, fn, calls in (("the forward", fwd, 1), ("its gradient", grad, 2)):
            try:
                # XLA's Triton call has no serialization compatibility
                # guarantee (nor has Pallas's): exporting a program that
                # calls it says so explicitly.
                checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
                module = jax.export.export(jax.jit(fn), platforms=[platform], disabled_checks=checks)(*args).mlir_module()
            except Exception as e:  # noqa: BLE001 - reported as a failure
                lines.append(f"- {what} lowered for {platform}: FAILED ({type(e).__name__}: {e})")
                failures.append(f"{platform} lowering of {what}")
                continue
            (out / f"gpu.{platform}.{'fwd' if fn is fwd else 'grad'}.mlir").write_text(module)
            n = module.count("__gpu$xla.gpu.triton")
            ok = n >= calls and "tt.func" in module and "grid_x" in module and "num_warps" in module
            lines.append(f"- {what} lowered for {platform} with jax.export: {n} Triton custom call(s) with their TTIR and launch grid: {'ok' if ok else 'FAILED'}")
            if not ok:
                failures.append(f"{platform} module of {what}")
    return failures


# Masked attention: (config, k/v heads, per-head visibility of (i, j) for
# the mask written in the config, soft-cap).
MASKED = {
    "local_and_causal_gqa_f32": ([("mask", "local:63:0;causal")], 1,
                                  [lambda i, j: (j <= i) & (i - j <= 63), lambda i, j: j <= i], None),
    "dead_rows_and_prefix_bf16": ([("mask", "causal:-2;prefix:32"), ("dtype", "bf16"), ("softcap", "30")], 2,
                                   [lambda i, j: j <= i - 2, lambda i, j: (j < 32) | (j <= i)], 30.0),
}


def masked_reference_jnp(q, k, v, vis, cap):
    """Masked attention in jnp (f32) with dead rows 0 and -inf, written so
    JAX's autodiff of it stays finite: `vis` is [h, sq, skv] bool (the mask
    and the segments)."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, g, axis=1), jnp.repeat(v, g, axis=1)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    if cap is not None:
        s = cap * jnp.tanh(s / cap)
    s = jnp.where(vis, s, -1e30)
    m = s.max(-1, keepdims=True)
    p = jnp.where(vis, jnp.exp(s - m), 0.0)
    l = p.sum(-1, keepdims=True)
    alive = l > 0
    o = jnp.einsum("bhqk,bhkd->bhqd", p, v) / jnp.where(alive, l, 1.0)
    lse = jnp.where(alive, m + jnp.log(jnp.where(alive, l, 1.0)), -jnp.inf)
    return o, lse


def masked_checks(tessera, out, lines):
    """`tessera export masked_attention` in JAX: the mask's block tables are
    constants of the artifact, so JAX passes q, k, v and the segment ids
    only. Forward against a float64 numpy reference (dead rows 0 and -inf),
    jax.grad through the exported VJP (Tessera's table-driven dq and dk/dv
    kernels) against JAX's autodiff of the jnp reference, and a JAX program
    calling its gradient exported for TPU and compiled with libtpu."""
    failures = []
    for case, (config, hkv, masks, cap) in MASKED.items():
        d = out / f"masked_{case}"
        cfg = [x for kv in config for x in ("--config", f"{kv[0]}={kv[1]}")]
        shapes = ["--shape", f"k=1x{hkv}x256x64", "--shape", f"v=1x{hkv}x256x64"]
        subprocess.run([str(tessera), "export", "masked_attention", *cfg, *shapes, "--out", str(d)], check=True, capture_output=True)
        exp = tessera_jax.load(d)
        names = [e["name"] for e in tessera_jax.manifest(d)["inputs"]]
        if names != ["q", "k", "v", "q_seg", "kv_seg"]:
            lines.append(f"- {case}: the artifact takes {names}, not q, k, v and the segment ids: FAILED")
            failures.append(f"masked {case} (inputs)")
            continue
        rng = np.random.default_rng(5)
        q, k, v = (jnp.asarray(rng.uniform(-1, 1, a.shape), a.dtype) for a in exp.in_avals[:3])
        seg = np.sort(rng.integers(0, 3, 256)).astype(np.int32)
        q_seg, kv_seg = jnp.asarray(seg.reshape(1, 256, 1)), jnp.asarray(seg.reshape(1, 1, 256))
        i, j = np.indices((256, 256))
        vis = np.stack([m(i, j) & (seg[:, None] == seg[None, :]) for m in masks])
        o, lse = jax.jit(exp.call)(q, k, v, q_seg, kv_seg)
        # float64 numpy reference.
        qd, kd, vd = (np.asarray(x, np.float64) for x in (q, k, v))
        g = qd.shape[1] // kd.shape[1]
        kd, vd = np.repeat(kd, g, axis=1), np.repeat(vd, g, axis=1)
        sc = qd @ kd.transpose(0, 1, 3, 2) / 8.0
        if cap is not None:
            sc = cap * np.tanh(sc / cap)
        sc = np.where(vis, sc, -np.inf)
        dead = ~vis.any(-1, keepdims=True)
        m = np.where(dead, 0.0, sc.max(-1, keepdims=True))
        pr = np.where(vis, np.exp(sc - m), 0.0)
        lsum = pr.sum(-1, keepdims=True)
        ro = np.where(dead, 0.0, (pr / np.where(dead, 1.0, lsum)) @ vd)
        rlse = np.where(dead, -np.inf, m + np.log(np.where(dead, 1.0, lsum)))
        o64, l64 = np.asarray(o, np.float64), np.asarray(lse, np.float64)
        err_o = float(np.abs(o64 - ro).max())
        fin = np.isfinite(rlse)
        err_l = float(np.abs(l64[fin] - rlse[fin]).max())
        dead_ok = bool(np.all(l64[~fin] == -np.inf)) and bool(np.all(o64[np.broadcast_to(dead, o64.shape)] == 0.0))
        tol = 2e-5 if exp.in_avals[0].dtype == jnp.float32 else 3e-2
        ok = err_o <= tol and err_l <= 1e-4 and dead_ok and not np.isnan(o64).any()
        lines.append(f"- {case}: {int(dead.sum())} dead rows; max |o - f64| {err_o:.2e}, max |lse - f64| {err_l:.2e}, dead rows 0 and -inf: {'ok' if ok else 'FAILED'}")
        if not ok:
            failures.append(f"masked {case}")
        wo = jnp.asarray(rng.standard_normal(exp.out_avals[0].shape), jnp.float32)
        wl = jnp.asarray(rng.standard_normal(exp.out_avals[1].shape), jnp.float32)
        live = jnp.asarray(~dead)

        def loss(f):
            def l(q, k, v):
                o, lse = f(q, k, v)
                return (o.astype(jnp.float32) * wo).sum() + jnp.where(live, lse * wl, 0.0).sum()
            return l
        gt = jax.jit(jax.grad(loss(lambda q, k, v: exp.call(q, k, v, q_seg, kv_seg)), argnums=(0, 1, 2)))(q, k, v)
        gj = jax.jit(jax.grad(loss(lambda q, k, v: masked_reference_jnp(q, k, v, vis[None], cap)), argnums=(0, 1, 2)))(q, k, v)
        errs = [max_rel(a, b) for a, b in zip(gt, gj)]
        gok = max(errs) <= (1e-4 if tol < 1e-3 else 3e-2) and not any(bool(np.isnan(np.asarray(a, np.float32)).any()) for a in gt)
        lines.append(f"  - jax.grad (dq, dk, dv) against JAX's autodiff of the jnp reference, max error / max |grad|: {', '.join(f'{e:.1e}' for e in errs)}: {'ok' if gok else 'FAILED'}")
        if not gok:
            failures.append(f"masked {case} (grad)")
        args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in exp.in_avals[:3]]
        grad = jax.grad(loss(lambda q, k, v: exp.call(q, k, v, q_seg, kv_seg)), argnums=(0, 1, 2))
        module = jax.export.export(jax.jit(grad), platforms=["tpu"])(*args).mlir_module()
        path = out / f"masked_{case}.grad.jax_tpu.mlir"
        path.write_text(module)
        r = subprocess.run([str(tessera), "compile", "--module", str(path), "--tpu", "all"], capture_output=True, text=True)
        lines.append(f"  - a JAX program calling its gradient, exported for TPU, compiled with libtpu for v5e, v6e, v5p and v7x: {'ok' if r.returncode == 0 else 'FAILED'}")
        if r.returncode != 0:
            failures.append(f"masked {case} (TPU compile): {r.stdout[-400:]} {r.stderr[-400:]}")
    return failures


def directional_checks(tessera, out, lines):
    """For the entries whose VJP has no JAX reference here: the derivative
    of a random projection of the outputs along a random direction, from
    jax.grad through the exported VJP, against a central difference of the
    exported forward itself (h = 1e-3, one input at a time, the projection
    summed in float64)."""
    failures = []
    for name in ("swiglu", "rope", "matmul_epilogue"):
        d = out / f"fd_{name}"
        subprocess.run([str(tessera), "export", name, "--out", str(d)], check=True, capture_output=True)
        exp = tessera_jax.load(d)
        if "vjp" not in tessera_jax.manifest(d):
            lines.append(f"- {name}: exported without a VJP: FAILED")
            failures.append(f"{name} (no VJP)")
            continue
        rng = np.random.default_rng(11)
        xs = [jnp.asarray(rng.uniform(-1, 1, a.shape), a.dtype) for a in exp.in_avals]
        ws = [jnp.asarray(rng.standard_normal(a.shape), jnp.float32) for a in exp.out_avals]
        vs = [jnp.asarray(rng.standard_normal(a.shape), a.dtype) for a in exp.in_avals]
        def f(*a):
            return sum((o.astype(jnp.float32) * w).sum() for o, w in zip(exp.call(*a), ws))
        g = jax.jit(jax.grad(f, argnums=tuple(range(len(xs)))))(*xs)
        # The projection summed in float64, so the difference measures the
        # outputs' change, not float32 summation noise.
        call = jax.jit(exp.call)
        def f64(*a):
            return sum(float((np.asarray(o, np.float64) * np.asarray(w, np.float64)).sum())
                       for o, w in zip(call(*a), ws))
        # One input at a time: the components can be large and of opposite
        # signs, and their sum small.
        h, errs = 1e-3, []
        for i, (gi, vi) in enumerate(zip(g, vs)):
            analytic = float((np.asarray(gi, np.float64) * np.asarray(vi, np.float64)).sum())
            step = lambda s: [x + s * h * v if j == i else x for j, (x, v) in enumerate(zip(xs, vs))]
            numeric = (f64(*step(1)) - f64(*step(-1))) / (2 * h)
            errs.append(abs(analytic - numeric) / max(abs(numeric), abs(analytic), 1e-6))
        ok = max(errs) <= 1e-2 and all(np.isfinite(errs))
        names = [e["name"] for e in tessera_jax.manifest(d)["inputs"]]
        lines.append(f"- {name}: d/d{', d/d'.join(names)} along random directions, relative error {', '.join(f'{e:.1e}' for e in errs)}: {'ok' if ok else 'FAILED'}")
        if not ok:
            failures.append(f"{name} (VJP)")
    return failures


def kv_len_out_of_range(tessera, out, lines):
    """The documented answer of an artifact given a valid length outside
    [0, s]: clamped into it (below 0: every row dead, o 0 and lse -inf)."""
    d = out / "kv_len"
    subprocess.run([str(tessera), "export", "flash_attention_kv_len", "--out", str(d)], check=True, capture_output=True)
    exp = tessera_jax.load(d)
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.standard_normal(a.shape), a.dtype) for a in exp.in_avals[1:])
    s = q.shape[2]
    failures = []
    for length in (-3, 0, s // 2, s + 44, 10**6):
        o, lse = jax.jit(exp.call)(jnp.asarray([length], jnp.int32), q, k, v)
        n = max(0, min(length, s))
        if n == 0:
            ok = not np.asarray(o).any() and np.isneginf(np.asarray(lse)).all()
        else:
            qq, kk, vv = (np.asarray(x, np.float64) for x in (q, k, v))
            sc = qq @ kk[:, :, :n].transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
            p = np.exp(sc - sc.max(-1, keepdims=True))
            ro = (p / p.sum(-1, keepdims=True)) @ vv[:, :, :n]
            ok = float(np.abs(np.asarray(o, np.float64) - ro).max()) <= TOL["float32"]
        lines.append(f"- kv_len {length} (s {s}): acts as {n}: {'ok' if ok else 'FAILED'}")
        if not ok:
            failures.append(f"kv_len {length}")
    return failures


def whole_or_refused(tessera, out, lines):
    """The loader takes a whole export and refuses a mixed or changed one:
    a causal forward beside a non-causal VJP (what a killed re-export left
    before exports were published whole), a changed module, a missing VJP
    file, a family with a bucket of another export; and a re-export killed
    at random points always leaves one that loads, with the right grad."""
    import random
    import shutil
    import time
    failures = []
    # The damaged copies of an earlier run would stop copytree: start clean.
    for d in out.glob("whole_*"):
        shutil.rmtree(d, ignore_errors=True)
    causal, plain = out / "whole_causal", out / "whole_plain"
    for d, cfg in ((causal, ["--config", "causal=true"]), (plain, [])):
        subprocess.run([str(tessera), "export", "flash_attention", *cfg, "--out", str(d)], check=True, capture_output=True)

    def refused(what, d, load=tessera_jax.load):
        try:
            load(d)
        except tessera_jax.ArtifactError as e:
            lines.append(f"- {what}: refused ({str(e).split(': ', 1)[-1][:90]}): ok")
            return
        lines.append(f"- {what}: loaded: FAILED")
        failures.append(what)

    mixed = out / "whole_mixed"
    shutil.copytree(causal, mixed)
    shutil.rmtree(mixed / "vjp")
    shutil.copytree(plain / "vjp", mixed / "vjp")
    refused("a causal forward with a non-causal VJP", mixed)
    changed = out / "whole_changed"
    shutil.copytree(causal, changed)
    with open(changed / "module.mlir", "a") as f:
        f.write("// edited\n")
    refused("a module changed after export", changed)
    missing = out / "whole_missing"
    shutil.copytree(causal, missing)
    (missing / "vjp" / "module.mlir").unlink()
    refused("a VJP module missing", missing)
    # The installed package's version against the manifest's: an artifact
    # of another Tessera release is refused, one of this release loads.
    other = out / "whole_other_release"
    shutil.copytree(causal, other)
    man = json.loads((other / "manifest.json").read_text())
    if man.get("tessera_version") != tessera_jax.__version__:
        lines.append(f"- the manifest names Tessera {man.get('tessera_version')!r}, the package is "
                     f"{tessera_jax.__version__}: FAILED")
        failures.append("package version")
    major, minor = (int(x) for x in tessera_jax.__version__.split(".")[:2])
    man["tessera_version"] = f"{major}.{minor + 1}.0"
    (other / "manifest.json").write_text(json.dumps(man))
    refused("an export of another Tessera release", other)
    fam_a, fam_b = out / "whole_fam_a", out / "whole_fam_b"
    for d, cfg in ((fam_a, ["--config", "causal=true"]), (fam_b, [])):
        subprocess.run([str(tessera), "export", "flash_attention", *cfg, "--bucket", "2=128,256", "--out", str(d)], check=True, capture_output=True)
    shutil.rmtree(fam_a / "2_256")
    shutil.copytree(fam_b / "2_256", fam_a / "2_256")
    refused("a family with a bucket of another export", fam_a, tessera_jax.load_family)

    # Re-exports killed at random points over a causal export: each leaves
    # the old export or the new one, whole; the grad of whichever loads
    # matches that export's own config.
    target = out / "whole_killed"
    rng = random.Random(27)
    kinds = {"causal": 0, "plain": 0}
    bad = 0
    for i in range(40):
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(causal, target)
        p = subprocess.Popen([str(tessera), "export", "flash_attention", "--out", str(target)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.0, 0.2))
        p.kill()
        p.wait()
        try:
            exp = tessera_jax.load(target)
        except tessera_jax.ArtifactError:
            bad += 1
            continue
        is_causal = tessera_jax.manifest(target)["config"]["causal"] == "true"
        kinds["causal" if is_causal else "plain"] += 1
        if i % 8 == 0:
            q, k, v = (jnp.asarray(np.random.default_rng(i + j).standard_normal(a.shape), a.dtype)
                       for j, a in enumerate(exp.in_avals))
            def loss_of(f):
                return lambda q: f(q, k, v)[0].sum()
            window = None if is_causal else "full"
            def ref(q, k, v):
                if window == "full":
                    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
                    return (jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, -1), v), None)
                return jax_reference(q, k, v, None)
            g = jax.jit(jax.grad(loss_of(exp.call)))(q)
            gr = jax.jit(jax.grad(loss_of(ref)))(q)
            err = max_rel(g, gr)
            if err > 1e-4:
                bad += 1
    ok = bad == 0
    lines.append(f"- 40 re-exports killed at 0-0.2 s: {kinds['causal']} left the old export, {kinds['plain']} the new, {bad} mixed or refused: {'ok' if ok else 'FAILED'}")
    if not ok:
        failures.append("killed re-exports")
    return failures


if __name__ == "__main__":
    main()
