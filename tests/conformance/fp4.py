"""Tessera's 4-bit codecs against ml_dtypes, bit for bit.

Usage: fp4.py TESSERA OUTDIR. Runs tests/conformance/fp4_codecs.kir (the
codecs kernel of tests/it/language/packed.rs, printed) with `tessera run
--backend all` on every byte value (packed two per byte in Tessera's halves
layout) and on f32 values full of rounding cases, and compares every
backend's outputs with ml_dtypes: int4 and float4_e2m1fn codes read as
values, float8_e8m0fnu scales (NaN written as -1 by the kernel), f32 values
converted to float4_e2m1fn and float8_e8m0fnu codes, and the bytes packed
back. Then which TPU generations multiply 4-bit types natively, as libtpu
says: Pallas dots of float4_e2m1fn, int4, float8_e4m3fn and bf16 operands
exported for platforms=["tpu"] and compiled with `tessera compile --module`
for every generation (the bf16 control must compile everywhere). Writes
OUTDIR/report.md; exits non-zero on a difference.
"""
import pathlib
import subprocess
import sys
import tempfile

import ml_dtypes
import numpy as np

NATIVE = {"float4_e2m1fn": "float4_e2m1fn", "int4": "int4",
          "float8_e4m3fn": "float8_e4m3fn", "bfloat16": "bfloat16"}

ROWS, COLS = 8, 128
KIR = pathlib.Path(__file__).with_name("fp4_codecs.kir")


def inputs(rng):
    w = np.arange(ROWS * COLS, dtype=np.int64) % 256
    rng.shuffle(w)
    w = w.astype(np.uint8).reshape(ROWS, COLS)
    cases = [0.0, -0.0, 0.25, 0.2500001, 0.75, 0.7499999, 1.25, 1.2500001, 1.75,
             2.5, 2.5000002, 3.5, 5.0, 5.0000005, 6.0, 7.0, 100.0, -5.1, -0.25,
             1.4, 1.5, 1.4999999, 3.0, 3.4e38, 1e-30, -1.0, np.inf, -np.inf, np.nan]
    n = 2 * ROWS * COLS
    mags = (1 + rng.random(n - len(cases))) * 2.0 ** rng.integers(-30, 30, n - len(cases))
    signs = rng.choice([-1.0, 1.0], n - len(cases))
    x = np.concatenate([np.array(cases), signs * mags]).astype(np.float32)
    return w, x.reshape(2 * ROWS, COLS)


def expected(w, x):
    lo, hi = w & 15, w >> 4
    rows = np.concatenate([lo, hi], axis=0)
    lanes = np.concatenate([lo, hi], axis=1)
    scale = w.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        return {
            "rows": rows.astype(np.int32),
            "lanes": lanes.astype(np.int32),
            # ml_dtypes reads one int4 per byte: the nibble, sign-extended.
            "int4": rows.astype(np.uint8).view(ml_dtypes.int4).astype(np.int32),
            "e2m1": rows.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32),
            "e8m0": np.where(np.isnan(scale), -1.0, scale).astype(np.float32),
            "to_e2m1": x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8).astype(np.int32),
            "to_e8m0": x.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8).astype(np.int32),
            "repacked": w.view(np.int8),
        }


def native_dots(tessera, d):
    """Per dtype, per generation: does libtpu compile a Pallas dot of it?"""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    rows = {}
    for name in NATIVE:
        dt = getattr(jnp, name)
        acc = jnp.int32 if name == "int4" else jnp.float32

        def kernel(a_ref, b_ref, o_ref, acc=acc):
            o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=acc)

        f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((256, 256), acc))
        arg = jax.ShapeDtypeStruct((256, 256), dt)
        text = jax.export.export(jax.jit(f), platforms=["tpu"])(arg, arg).mlir_module()
        path = d / f"dot_{name}.mlir"
        path.write_text(text)
        r = subprocess.run([str(tessera), "compile", "--module", str(path), "--tpu", "all"],
                           capture_output=True, text=True)
        gens = {}
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] in ("v5e", "v5p", "v6e", "v7x"):
                gens[parts[0]] = parts[1] == "ok"
        rows[name] = gens
    return rows


def main():
    tessera, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    w, x = inputs(np.random.default_rng(2026))
    want = expected(w, x)
    lines = ["# 4-bit codecs against ml_dtypes " + ml_dtypes.__version__, ""]
    failed = False
    with tempfile.TemporaryDirectory() as d:
        d = pathlib.Path(d)
        np.save(d / "w.npy", w.view(np.int8))
        np.save(d / "x.npy", x)
        subprocess.run([str(tessera), "run", str(KIR), "--input", f"w={d / 'w.npy'}",
                        "--input", f"x={d / 'x.npy'}", "--out", str(d / "out"),
                        "--backend", "all"], check=True)
        backends = sorted(p.name for p in (d / "out").iterdir() if p.is_dir())
        lines += ["| backend | " + " | ".join(want) + " |",
                  "|---|" + "---|" * len(want)]
        for b in backends:
            cells = []
            for name, expect in want.items():
                got = np.load(d / "out" / b / f"{name}.npy")
                same = got.shape == expect.shape and np.array_equal(
                    got.astype(np.float64), expect.astype(np.float64))
                bad = 0 if same else int(np.sum(got.astype(np.float64) != expect.astype(np.float64)))
                cells.append("same" if same else f"**{bad} differ**")
                failed |= not same
            lines.append(f"| {b} | " + " | ".join(cells) + " |")
        if len(backends) < 5:
            lines.append(f"\nonly {len(backends)} backends ran: {backends}")
            failed = True
        native = native_dots(tessera, d)
        gens = ["v5e", "v5p", "v6e", "v7x"]
        lines += ["", "## A Pallas dot of each type, compiled by libtpu", "",
                  "| operands | " + " | ".join(gens) + " |", "|---|" + "---|" * len(gens)]
        for name, g in native.items():
            cells = ["compiles" if g.get(x) else "refused" for x in gens]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        if not all(native["bfloat16"].get(x) for x in gens):
            lines.append("\nthe bf16 control did not compile everywhere")
            failed = True
    report = "\n".join(lines) + "\n"
    (out / "report.md").write_text(report)
    print(report)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
