"""The GPU side of tests/gpu/run.sh: runs on a CUDA machine with python3
holding torch, triton and jax[cuda]; needs no Tessera binary (its inputs
were prepared by `run.sh --prepare`).

    device.py cases INPUTS OUT [--shard I/N]   every catalog kernel's Triton program vs its f64 reference
    device.py merge OUT                         the shards' results as one table (cases.md)
    device.py bench INPUTS OUT [--warm I/N]     flash attention fwd/bwd: Tessera, SDPA, Triton's tutorial
    device.py jax INPUTS OUT                    the exported artifact through JAX on the GPU (fwd and grad)
    device.py tune INPUTS OUT [--warm I/N]      the attention backward's dq and dk/dv programs at other
                                                blocks, warps and stages (how its GPU rule was chosen)

Each writes its results under OUT as JSON and a Markdown table. Numbers are
compared here, in float64, with the case's tolerance: |out - ref| <= abs +
rel * |ref| elementwise; NaN never passes.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import sys
import time
import traceback

import numpy as np
import torch

# `cpu` runs the same code under Triton's interpreter: a dry run of the
# plumbing on a machine without a GPU (slow; cases only).
DEVICE = os.environ.get("TESSERA_GPU_DEVICE", "cuda")


def sync() -> None:
    if DEVICE != "cpu":
        torch.cuda.synchronize()


def tensor(path: pathlib.Path, dtype: str, shape: list[int], device: str) -> torch.Tensor:
    """A case's array: little-endian bytes of its dtype."""
    import tessera_torch

    raw = bytearray(path.read_bytes())
    t = torch.frombuffer(raw, dtype=tessera_torch.DTYPES[dtype]) if raw else torch.zeros(0, dtype=tessera_torch.DTYPES[dtype])
    return t.reshape(shape).to(device)


def compare(out: torch.Tensor, ref: np.ndarray, abs_tol: float, rel_tol: float) -> dict:
    """Max abs and rel error, NaN count and worst error over tolerance."""
    a = out.detach().to("cpu").to(torch.float64).numpy().reshape(-1)
    r = ref.reshape(-1)
    if a.shape != r.shape:
        return {"ok": False, "error": f"{a.size} elements, reference {r.size}"}
    nan = int(np.isnan(a).sum() + np.isnan(r).sum())
    with np.errstate(all="ignore"):
        err = np.where(a == r, 0.0, np.abs(a - r))
        err = np.where(np.isnan(err), 0.0, err)
        allowed = abs_tol + rel_tol * np.abs(r)
        ratio = np.where(allowed > 0, err / np.where(allowed > 0, allowed, 1), np.where(err > 0, np.inf, 0.0))
        rel = err / np.maximum(np.abs(r), np.finfo(np.float64).tiny)
    worst = float(ratio.max()) if ratio.size else 0.0
    return {"ok": nan == 0 and worst <= 1.0, "max_abs": float(err.max()) if err.size else 0.0,
            "max_rel": float(rel.max()) if rel.size else 0.0, "nan": nan, "worst_over_tol": worst}


def cases(inputs: pathlib.Path, out: pathlib.Path, shard: tuple[int, int]) -> None:
    import tessera_torch

    index = json.loads((inputs / "cases" / "cases.json").read_text())
    results = []
    for n, c in enumerate(index["cases"]):
        if n % shard[1] != shard[0]:
            continue
        row = {"n": n, "name": c["name"]}
        if "skipped" in c:
            row["skipped"] = c["skipped"]
            results.append(row)
            continue
        try:
            args = [tensor(inputs / "cases" / a["file"], a["dtype"], a["shape"], DEVICE) for a in c["inputs"]]
            t = time.perf_counter()
            outs = tessera_torch._launch(c["program"], args)
            sync()
            row["seconds"] = time.perf_counter() - t
            row["outputs"] = []
            for o, spec in zip(outs, c["outputs"]):
                ref = np.frombuffer((inputs / "cases" / spec["reference"]).read_bytes(), dtype="<f8")
                stats = compare(o, ref, spec["abs"], spec["rel"])
                stats["name"] = spec["name"]
                row["outputs"].append(stats)
            row["ok"] = all(s["ok"] for s in row["outputs"])
        except Exception as e:  # noqa: BLE001 - every failure is a row
            row["ok"] = False
            row["error"] = f"{type(e).__name__}: {e}"[:400]
            traceback.print_exc()
        results.append(row)
        print(f"case {n} {c['name']}: {'ok' if row.get('ok') or 'skipped' in row else 'FAILED'}", flush=True)
    (out / f"cases_{shard[0]}.json").write_text(json.dumps(results))


def merge(out: pathlib.Path) -> int:
    rows = []
    for f in sorted(out.glob("cases_*.json")):
        rows.extend(json.loads(f.read_text()))
        f.unlink()
    rows.sort(key=lambda r: r["n"])
    (out / "cases.json").write_text(json.dumps(rows, indent=1))
    lines = ["| kernel | output | max abs | max rel | err/tol | NaN | result |", "|---|---|---|---|---|---|---|"]
    ran = passed = 0
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['name']} | | | | | | skipped: {r['skipped'][:120]} |")
            continue
        ran += 1
        passed += bool(r.get("ok"))
        if "error" in r:
            lines.append(f"| {r['name']} | | | | | | **error**: {r['error'][:160]} |")
            continue
        for s in r["outputs"]:
            lines.append(f"| {r['name']} | {s['name']} | {s['max_abs']:.2e} | {s['max_rel']:.2e} | "
                         f"{s['worst_over_tol']:.3f} | {s['nan']} | {'ok' if s['ok'] else '**MISMATCH**'} |")
    head = f"{passed} of {ran} catalog kernels within tolerance on the GPU ({len(rows) - ran} skipped by rule)\n\n"
    (out / "cases.md").write_text(head + "\n".join(lines) + "\n")
    print(head.strip())
    return 0 if passed == ran else 1


# ---- flash attention timings ----

def sdpa_reference(q, k, v, causal):
    """Attention in float64 (the oracle for the bench's numbers)."""
    q, k, v = (x.double() for x in (q, k, v))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def tutorial(inputs: pathlib.Path):
    """Triton's tutorial fused attention, if its source was brought
    (never part of Tessera): its autotuning limited to four configs."""
    src = inputs / "baselines" / "06-fused-attention.py"
    if not src.is_file():
        return None
    import triton

    real = triton.autotune

    def few(configs=None, *a, **kw):
        configs = list(configs if configs is not None else kw.pop("configs"))
        keep = [c for c in configs if c.kwargs.get("BLOCK_M") == 128 and c.kwargs.get("BLOCK_N") in (64, 128)
                and c.num_warps == 8 and c.num_stages in (3, 4)]
        return real(keep or configs[:4], *a, **kw)

    triton.autotune = few
    try:
        module = {"__name__": "triton_tutorial_fused_attention", "__file__": str(src)}
        exec(compile(src.read_text(), str(src), "exec"), module)  # noqa: S102 - the baseline's source
    finally:
        triton.autotune = real
    return module["attention"]


def flops(b, h, s, d, causal, bwd):
    f = 4.0 * b * h * s * s * d
    if causal:
        f *= 0.5
    return f * (2.5 if bwd else 1.0)


def bench(inputs: pathlib.Path, out: pathlib.Path, warm: tuple[int, int] | None) -> None:
    import tessera_torch
    import triton

    spec = json.loads((inputs / "bench" / "bench.json").read_text())
    b, h, d = spec["batch"], spec["heads"], spec["head_dim"]
    tut = tutorial(inputs)
    rows = []
    for n, case in enumerate(spec["cases"]):
        if warm is not None and n % warm[1] != warm[0]:
            continue
        s, causal = case["seq"], case["causal"]
        op = tessera_torch.load(inputs / "bench" / case["dir"])
        torch.manual_seed(n)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        row = {"seq": s, "causal": causal}
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        o, lse = op(qg, kg, vg)
        do = torch.randn_like(o)
        o.backward(do, retain_graph=True)
        torch.cuda.synchronize()
        if warm is not None:
            if tut is not None:
                q16, k16, v16 = (x.half().requires_grad_() for x in (q, k, v))
                to = tut(q16, k16, v16, causal, 1.0 / math.sqrt(d))
                if causal:
                    to.backward(do.half())
                torch.cuda.synchronize()
            print(f"warm {n}: S={s} causal={causal}", flush=True)
            continue
        if s <= 4096:
            # Numbers against float64 on a slice of heads (the whole is large).
            ref = sdpa_reference(q[:1, :2], k[:1, :2], v[:1, :2], causal)
            row["fwd_max_abs"] = float((o[:1, :2].double() - ref).abs().max())
            qr, kr, vr = (x[:1, :2].double().requires_grad_() for x in (q, k, v))
            sdpa_reference(qr, kr, vr, causal).backward(do[:1, :2].double())
            row["dq_max_abs"] = float((qg.grad[:1, :2].double() - qr.grad).abs().max())
            row["dq_scale"] = float(qr.grad.abs().max())
        with torch.no_grad():
            row["tessera_fwd_ms"] = triton.testing.do_bench(lambda: op(q, k, v), warmup=10, rep=40)
        row["tessera_bwd_ms"] = triton.testing.do_bench(lambda: o.backward(do, retain_graph=True), warmup=5, rep=40)
        with torch.no_grad():
            row["sdpa_fwd_ms"] = triton.testing.do_bench(
                lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal), warmup=10, rep=40)
        qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
        so = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
        row["sdpa_bwd_ms"] = triton.testing.do_bench(lambda: so.backward(do, retain_graph=True), warmup=5, rep=40)
        if tut is not None:
            q16, k16, v16 = (x.half().requires_grad_() for x in (q, k, v))
            scale = 1.0 / math.sqrt(d)
            with torch.no_grad():
                row["tutorial_fwd_ms"] = triton.testing.do_bench(lambda: tut(q16, k16, v16, causal, scale),
                                                                 warmup=10, rep=40)
            if causal:  # the tutorial's backward is written for causal attention only
                to = tut(q16, k16, v16, causal, scale)
                do16 = do.half()
                row["tutorial_bwd_ms"] = triton.testing.do_bench(lambda: to.backward(do16, retain_graph=True),
                                                                 warmup=5, rep=40)
        for key in [k for k in row if k.endswith("_ms")]:
            row[key.replace("_ms", "_tflops")] = flops(b, h, s, d, causal, "bwd" in key) / (row[key] * 1e-3) / 1e12
        rows.append(row)
        print(json.dumps(row), flush=True)
        del qg, kg, vg, o, lse, so, qs, ks, vs
        torch.cuda.empty_cache()
    if warm is not None:
        return
    (out / "bench.json").write_text(json.dumps({"spec": spec, "rows": rows}, indent=1))
    lines = [f"Flash attention, bf16, batch {b}, heads {h}, head dim {d}, {torch.cuda.get_device_name()}; "
             "TFLOP/s (forward 4·B·H·S²·D, halved when causal; backward 2.5× that), ratios Tessera/peer. "
             "Triton's tutorial runs at fp16 (its kernels are written for fp16; same FLOPs and bytes), "
             "its forward autotuned over 4 configs (BLOCK_M 128, BLOCK_N 64/128, 3/4 stages, 8 warps), "
             "its backward causal only.", "",
             "| S | causal | Tessera fwd | SDPA fwd | tutorial fwd | fwd / SDPA | fwd / tutorial | "
             "Tessera bwd | SDPA bwd | tutorial bwd | bwd / SDPA | fwd err (f64) | dq err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def f(r, key):
        return f"{r[key]:.0f}" if key in r else "–"

    def e(r, key):
        return f"{r[key]:.1e}" if key in r else "–"

    def ratio(r, a, b):
        return f"{r[a] / r[b]:.2f}" if a in r and b in r else "–"

    for r in rows:
        lines.append(
            f"| {r['seq']} | {r['causal']} | {f(r, 'tessera_fwd_tflops')} | {f(r, 'sdpa_fwd_tflops')} | "
            f"{f(r, 'tutorial_fwd_tflops')} | {ratio(r, 'tessera_fwd_tflops', 'sdpa_fwd_tflops')} | "
            f"{ratio(r, 'tessera_fwd_tflops', 'tutorial_fwd_tflops')} | {f(r, 'tessera_bwd_tflops')} | "
            f"{f(r, 'sdpa_bwd_tflops')} | {f(r, 'tutorial_bwd_tflops')} | "
            f"{ratio(r, 'tessera_bwd_tflops', 'sdpa_bwd_tflops')} | "
            f"{e(r, 'fwd_max_abs')} | {e(r, 'dq_max_abs')} |")
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


# ---- the backward's launch shapes ----

TUNE_WARPS = (4, 8)
TUNE_STAGES = (2, 3, 4)


def tune(inputs: pathlib.Path, out: pathlib.Path, warm: tuple[int, int] | None) -> None:
    """Times the VJP's dq and dk/dv programs alone, on random inputs of
    their shapes, for each exported block variant (the forward's blocks,
    from which the backward's GPU rule derives its own) and each warps x
    stages: the table the attention backward's GPU rule is read from."""
    import tessera_torch
    import triton

    spec = json.loads((inputs / "tune" / "tune.json").read_text())
    jobs, seen = [], set()
    for case in spec["cases"]:
        programs = json.loads((inputs / "tune" / case["dir"] / "vjp" / "triton.json").read_text())["programs"]
        for p in programs:
            part = "dkv" if "_dkv_" in p["function"] else "dq" if "_dq_" in p["function"] else None
            if part is None:
                continue
            shape = (case["seq"], case["causal"], part, case[part])
            if shape in seen:  # another variant's program of the same blocks
                continue
            seen.add(shape)
            for w in TUNE_WARPS:
                for st in TUNE_STAGES:
                    jobs.append((case, part, p, w, st))
    rows = []
    for n, (case, part, p, w, st) in enumerate(jobs):
        if warm is not None and n % warm[1] != warm[0]:
            continue
        torch.manual_seed(0)
        args = [torch.randn(q["shape"], device="cuda").to(tessera_torch.DTYPES[q["dtype"]])
                for q in p["params"] if q["role"] in ("prefetch", "input")]
        prog = dict(p, num_warps=w, num_stages=st)
        row = {"seq": case["seq"], "causal": case["causal"], "part": part,
               "blocks": case[part], "warps": w, "stages": st, "default": (w, st) == (p["num_warps"], p["num_stages"])}
        tessera_torch._STAGES.clear()
        try:
            tessera_torch._launch(prog, args)
            torch.cuda.synchronize()
            if tessera_torch._STAGES:
                row["skipped"] = "shared memory"
            elif warm is None:
                row["ms"] = triton.testing.do_bench(lambda: tessera_torch._launch(prog, args), warmup=5, rep=30)
        except Exception as e:  # a config Triton refuses is a row, not a stop
            row["skipped"] = f"{type(e).__name__}: {str(e)[:80]}"
        if warm is None:
            rows.append(row)
            print(json.dumps(row), flush=True)
    if warm is not None:
        return
    (out / "tune.json").write_text(json.dumps(rows, indent=1))
    lines = ["The attention backward's programs alone (ms), bf16, "
             f"batch {spec['batch']}, heads {spec['heads']}, head dim {spec['head_dim']}, "
             f"{torch.cuda.get_device_name()}; * the exported default launch.", "",
             "| S | causal | part | blocks (q x k) | " + " | ".join(f"w{w} s{st}" for w in TUNE_WARPS for st in TUNE_STAGES) + " |",
             "|---|---|---|---|" + "---|" * (len(TUNE_WARPS) * len(TUNE_STAGES))]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["seq"], r["causal"], r["part"], r["blocks"]), []).append(r)
    for (s, c, part, blocks), rs in sorted(groups.items(), key=str):
        cells = []
        for r in rs:
            cell = f"{r['ms']:.3f}" if "ms" in r else "–"
            cells.append(cell + ("*" if r["default"] else ""))
        lines.append(f"| {s} | {c} | {part} | {blocks} | " + " | ".join(cells) + " |")
    (out / "tune.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


# ---- JAX ----

def jax_check(inputs: pathlib.Path, out: pathlib.Path) -> int:
    import jax
    import jax.numpy as jnp
    import tessera_jax

    d = inputs / "jax"
    exp = tessera_jax.load(d / "artifact")
    spec = json.loads((d / "spec.json").read_text())
    rng = np.random.default_rng(3)
    shape = spec["shape"]
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    dev = jax.devices()[0]
    lines = [f"JAX {jax.__version__} on {dev.platform} ({dev.device_kind}): `tessera_jax.load` of an `export --gpu` "
             f"artifact ({spec['what']}), its `{dev.platform}` branch (XLA's Triton custom call)", ""]
    args = [jax.device_put(jnp.asarray(x, dtype=jnp.bfloat16), dev) for x in (q, k, v)]
    o, lse = jax.jit(exp.call)(*args)
    ref = sdpa_reference(*(torch.from_numpy(np.asarray(a.astype(jnp.float32))) for a in args), spec["causal"])
    fwd = float(np.abs(np.asarray(o.astype(jnp.float32), dtype=np.float64) - ref.numpy()).max())

    def loss(q, k, v):
        return exp.call(q, k, v)[0].astype(jnp.float32).sum()

    dq = jax.jit(jax.grad(loss))(*args)
    qr, kr, vr = (torch.from_numpy(np.asarray(a.astype(jnp.float32))).double().requires_grad_() for a in args)
    sdpa_reference(qr, kr, vr, spec["causal"]).sum().backward()
    dq_err = float(np.abs(np.asarray(dq.astype(jnp.float32), dtype=np.float64) - qr.grad.numpy()).max())
    hlo = jax.jit(exp.call).lower(*args).as_text()
    ok = fwd <= spec["fwd_tol"] and dq_err <= spec["dq_tol"] and "__gpu$xla.gpu.triton" in hlo
    lines += [f"- forward max abs error against float64 attention: {fwd:.2e} (tolerance {spec['fwd_tol']})",
              f"- jax.grad dq max abs error against float64: {dq_err:.2e} (tolerance {spec['dq_tol']}; |dq| max "
              f"{float(qr.grad.abs().max()):.2f})",
              f"- the lowered program calls `__gpu$xla.gpu.triton`: {'__gpu$xla.gpu.triton' in hlo}",
              f"- result: {'ok' if ok else '**FAILED**'}"]
    (out / "jax.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


def shard_arg(argv: list[str], flag: str) -> tuple[int, int] | None:
    if flag in argv:
        i, n = argv[argv.index(flag) + 1].split("/")
        return int(i), int(n)
    return None


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode == "merge":
        return merge(pathlib.Path(argv[1]))
    inputs, out = pathlib.Path(argv[1]), pathlib.Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    if mode == "cases":
        cases(inputs, out, shard_arg(argv, "--shard") or (0, 1))
        return 0
    if mode == "bench":
        bench(inputs, out, shard_arg(argv, "--warm"))
        return 0
    if mode == "jax":
        return jax_check(inputs, out)
    if mode == "tune":
        tune(inputs, out, shard_arg(argv, "--warm"))
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
