"""Tessera's random numbers against jax.random, bit for bit.

Usage: jax_random.py TESSERA OUTDIR. Exports `random_bits` (plain and with
one folded key per row) and `dropout` (f32 and bf16, ragged blocks), loads
each with tessera-jax and calls it under jax.jit on the CPU with keys made
by jax (`jax.random.key`, and `jax.random.split` for keys whose both words
are random), comparing with `jax.random.bits`, `jax.random.fold_in` and a
flax-style dropout (`jnp.where(jax.random.bernoulli(key, 1 - rate, shape),
x / (1 - rate), 0)`): the words and the kept positions must be identical,
the kept values within the dtype's rounding; and jax.grad through the
dropout artifact's VJP (the same mask on the cotangent). The other paths (interpreter,
JITs, PJRT, Triton's interpreter) equal the same u32 reference in the Rust
tests, so they equal jax too. Writes OUTDIR/report.md; exits non-zero on a
difference.
"""
import pathlib
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

import tessera_jax


def keys():
    """Keys as jax makes them: small seeds (first word 0) and split keys."""
    out = [jax.random.key(0), jax.random.key(42), jax.random.key(2**31 - 1)]
    out += list(jax.random.split(jax.random.key(7), 3))
    return out


def words(key):
    return np.asarray(jax.random.key_data(key)).view(np.int32)


def export(tessera, name, config, shapes, d):
    args = [str(tessera), "export", name, "--out", str(d)]
    for k, v in config:
        args += ["--config", f"{k}={v}"]
    for k, v in shapes:
        args += ["--shape", f"{k}={v}"]
    subprocess.run(args, check=True, capture_output=True)
    return tessera_jax.load(d)


def main():
    tessera, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Tessera's random numbers against jax.random", "",
             f"jax {jax.__version__}, threefry partitionable: {jax.config.jax_threefry_partitionable}", "",
             "| case | keys | elements | differing | max abs (kept values) | ok |", "|---|---|---|---|---|---|"]
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        m, n = 48, 384
        bits = export(tessera, "random_bits", [("m", m), ("n", n), ("bm", 16), ("bn", 256)], [], tmp / "bits")
        folded = export(tessera, "random_bits", [("m", m), ("n", n), ("bm", 16), ("bn", 256), ("fold_rows", "true")], [],
                        tmp / "folded")
        for name, exp, want in [
            ("random_bits", bits, lambda k: jax.random.bits(k, (m, n), jnp.uint32)),
            ("random_bits fold_rows", folded,
             lambda k: jax.vmap(lambda r: jax.random.bits(jax.random.fold_in(k, r), (n,), jnp.uint32))(jnp.arange(m))),
        ]:
            call = jax.jit(exp.call)
            diff = 0
            for key in keys():
                got = np.asarray(call(jnp.asarray(words(key)))[0])
                ref = np.asarray(want(key)).view(np.int32)
                diff += int((got != ref).sum())
            ok = diff == 0
            failed |= not ok
            lines.append(f"| {name} | {len(keys())} | {m * n} | {diff} | – | {'yes' if ok else 'NO'} |")
        for dtype, tol in [("f32", 1e-6), ("bf16", 1e-2)]:
            rate, shape = 0.25, (100, 300)
            exp = export(tessera, "dropout", [("dtype", dtype), ("rate", rate), ("bm", 16), ("bn", 256)],
                         [("x", "x".join(map(str, shape)))], tmp / f"dropout_{dtype}")
            jdt = jnp.float32 if dtype == "f32" else jnp.bfloat16
            call = jax.jit(exp.call)
            diff, worst = 0, 0.0
            for i, key in enumerate(keys()):
                x = jax.random.uniform(jax.random.key(100 + i), shape, jnp.float32, 0.5, 1.5).astype(jdt)
                got = np.asarray(call(jnp.asarray(words(key)), x)[0]).astype(np.float64)
                keep = np.asarray(jax.random.bernoulli(key, 1 - rate, shape))
                ref = np.where(keep, np.asarray(x, np.float64) / (1 - rate), 0.0)
                diff += int(((got != 0) != keep).sum())
                worst = max(worst, float(np.abs(got - ref).max()))
            ok = diff == 0 and worst <= tol * 2
            failed |= not ok
            lines.append(f"| dropout {dtype}, rate {rate}, {shape[0]}x{shape[1]} | {len(keys())} | {shape[0] * shape[1]} | "
                         f"{diff} | {worst:.1e} | {'yes' if ok else 'NO'} |")
            if dtype == "f32":
                # jax.grad through the artifact's VJP (the forward kernel on
                # the cotangent): the gradient is the mask over 1 - rate.
                key = keys()[-1]
                w = jax.random.normal(jax.random.key(5), shape, jnp.float32)
                x = jax.random.normal(jax.random.key(6), shape, jnp.float32)
                k = jnp.asarray(words(key))
                g = np.asarray(jax.jit(jax.grad(lambda x: (exp.call(k, x)[0] * w).sum()))(x), np.float64)
                keep = np.asarray(jax.random.bernoulli(key, 1 - rate, shape))
                ref = np.where(keep, np.asarray(w, np.float64) / (1 - rate), 0.0)
                gdiff = int(((g != 0) != keep).sum())
                gworst = float(np.abs(g - ref).max())
                ok = gdiff == 0 and gworst <= 1e-6
                failed |= not ok
                lines.append(f"| jax.grad of dropout f32 (the VJP) | 1 | {shape[0] * shape[1]} | {gdiff} | {gworst:.1e} | "
                             f"{'yes' if ok else 'NO'} |")
    report = "\n".join(lines) + "\n"
    (out / "report.md").write_text(report)
    print(report)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
