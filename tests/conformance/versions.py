"""The version matrix: Tessera with the oldest and the newest jax/libtpu it supports.

Usage: versions.py TESSERA OUTDIR LIBTPU_OLD LIBTPU_NEW [--full], run by the Python of a
venv holding the newer jax (0.12.0.1) and tessera-jax; tests/conformance/run.sh
runs the rest of the conformance suite with jax 0.11.2 and libtpu 0.0.48.1.

* An artifact loads and runs in this jax: flash attention (causal, f32) exported
  by `tessera export`, called under jax.jit on CPU against a float64 reference,
  its gradient through the exported VJP against JAX's autodiff, and a JAX
  program calling it exported for TPU and compiled with the newer libtpu.
* Every preset compiles with the newer libtpu (`tessera compile presets --tpu
  v5e`, one child process per compile; the older one, the pinned libtpu, is
  the one `cargo test` compiles every preset with for every generation); a
  preset that fails to compile is a failure.
* With --full, every preset's static schedule estimate with both libtpus
  (`tessera estimate presets --tpu v5e`, the two versions side by side): an
  estimate that moves more than 5% between the two is reported (a silent
  change in the compiler is a finding, not a failure); a preset that fails to
  compile with either is a failure.

Writes OUTDIR/versions.md; exits non-zero on a failure.
"""
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

import tessera_jax
from jax_export import jax_reference, reference

MOVE = 0.05


def with_libtpu(tessera, libtpu, *args):
    """Starts `tessera ARGS...` with `libtpu` as its TPU compiler."""
    env = dict(os.environ, TESSERA_LIBTPU=str(libtpu))
    return subprocess.Popen([str(tessera), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def estimates(tessera, libtpu):
    """Starts `tessera estimate presets --tpu v5e --json` with `libtpu`."""
    return with_libtpu(tessera, libtpu, "estimate", "presets", "--tpu", "v5e", "--json", "--no-trace")


def collect(proc):
    out, err = proc.communicate()
    try:
        rows = json.loads(out)
    except json.JSONDecodeError:
        return None, f"exit {proc.returncode}: {err.strip()[-600:]}"
    return {r["kernel"]: r for r in rows}, (err.strip() if proc.returncode else "")


def compiles(tessera, libtpu):
    """Starts `tessera compile presets --tpu v5e` with `libtpu`."""
    return with_libtpu(tessera, libtpu, "compile", "presets", "--tpu", "v5e")


def compiled_presets(proc, name, lines, failures):
    """Reads `tessera compile presets`: every preset must compile."""
    out, err = proc.communicate()
    ok = sum(1 for line in out.splitlines() if line.strip().startswith("v5e") and " ok " in line)
    failed = [line.strip() for line in out.splitlines() if "FAILED" in line]
    lines += ["", f"## Every preset compiled with libtpu {name} (v5e)", "",
              f"{ok} compiled, {len(failed)} failed (schedule estimates beside the older libtpu's: --full)."]
    if proc.returncode != 0 or failed or ok == 0:
        failures.append(f"tessera compile presets with libtpu {name} (exit {proc.returncode}): "
                        f"{'; '.join(failed)[:600]} {err.strip()[-300:]}")


def artifact(tessera, out, libtpu, lines, failures):
    d = out / "versions_flash_attention"
    subprocess.run([str(tessera), "export", "flash_attention", "--config", "causal=true",
                    "--shape", "q=1x2x256x64", "--shape", "k=1x2x256x64", "--shape", "v=1x2x256x64",
                    "--out", str(d)], check=True, capture_output=True)
    exp = tessera_jax.load(d)
    rng = np.random.default_rng(11)
    q, k, v = (jnp.asarray(rng.standard_normal(a.shape), a.dtype) for a in exp.in_avals)
    o, lse = jax.jit(exp.call)(q, k, v)
    ro, rlse = reference(q, k, v, None)
    err_o = float(np.abs(np.asarray(o, np.float64) - ro).max())
    err_lse = float(np.abs(np.asarray(lse, np.float64) - rlse).max())
    ok = err_o <= 2e-5 and err_lse <= 1e-4 and not np.isnan(np.asarray(o)).any()
    lines.append(f"- flash attention (causal, f32) called under jax.jit on CPU: max |o - f64| {err_o:.2e}, "
                 f"max |lse - f64| {err_lse:.2e}: {'ok' if ok else 'FAILED'}")
    if not ok:
        failures.append("artifact forward")
    wo = jnp.asarray(rng.standard_normal(exp.out_avals[0].shape), jnp.float32)

    def loss(f):
        return lambda q, k, v: (f(q, k, v)[0] * wo).sum()

    gt = jax.jit(jax.grad(loss(exp.call), argnums=(0, 1, 2)))(q, k, v)
    gj = jax.grad(loss(lambda q, k, v: jax_reference(q, k, v, None)), argnums=(0, 1, 2))(q, k, v)
    errs = [float(jnp.abs(a - b).max() / jnp.abs(b).max()) for a, b in zip(gt, gj)]
    gok = max(errs) <= 1e-4
    lines.append(f"- jax.grad through its exported VJP against JAX's autodiff, max error / max |grad|: "
                 f"{', '.join(f'{e:.1e}' for e in errs)}: {'ok' if gok else 'FAILED'}")
    if not gok:
        failures.append("artifact gradient")
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in exp.in_avals]
    module = jax.export.export(jax.jit(lambda q, k, v: exp.call(q, k, v)[0] * 2.0), platforms=["tpu"])(*args)
    path = out / "versions_flash_attention.jax_tpu.mlir"
    path.write_text(module.mlir_module())
    r = subprocess.run([str(tessera), "compile", "--module", str(path), "--tpu", "v5e"],
                       env=dict(os.environ, TESSERA_LIBTPU=str(libtpu)), capture_output=True, text=True)
    cok = r.returncode == 0
    lines.append(f"- a JAX program calling it, exported for TPU, compiled with libtpu {libtpu.parent.name} "
                 f"for v5e: {'ok' if cok else 'FAILED'}")
    if not cok:
        failures.append(f"TPU compile of the JAX program: {r.stdout[-400:]} {r.stderr[-400:]}")


def main():
    tessera, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    old, new = pathlib.Path(sys.argv[3]), pathlib.Path(sys.argv[4])
    full = "--full" in sys.argv[5:]
    names = (old.parent.name, new.parent.name)
    failures = []
    lines = [f"# The version matrix: jax {jax.__version__} with libtpu {names[1]}, beside libtpu {names[0]}", ""]
    # The compiles start first: child processes the artifact checks overlap with.
    procs = [estimates(tessera, old), estimates(tessera, new)] if full else [compiles(tessera, new)]
    lines += ["## An artifact in this jax", ""]
    artifact(tessera, out, new, lines, failures)
    if not full:
        compiled_presets(procs[0], names[1], lines, failures)
        finish(out, lines, failures)
        return
    (a, err_a), (b, err_b) = (collect(p) for p in procs)
    lines += ["", f"## Every preset compiled with both (v5e), libtpu's schedule estimates", "",
              f"Estimates that move more than {MOVE:.0%} are findings, listed first; a compile that fails is a failure.", ""]
    for name, rows, err in ((names[0], a, err_a), (names[1], b, err_b)):
        if rows is None or err:
            failures.append(f"estimate presets with libtpu {name}: {err}")
    a, b = a or {}, b or {}
    table, moved, blind = [], [], []
    for k in sorted(set(a) | set(b)):
        cells = []
        for rows, lib, name in ((a, old, names[0]), (b, new, names[1])):
            r = rows.get(k, {})
            if r.get("cycles") is not None:
                cells.append(r["cycles"])
                continue
            # No estimate: the profiler's blind spot (it aborts on some
            # programs, and not on the same ones in both versions) is a
            # finding; the plain compile must still pass.
            why = r.get("error", "no row").split(": ", 1)[-1][:160]
            compiled = subprocess.run([str(tessera), "compile", k, "--tpu", "v5e"], capture_output=True, text=True,
                                      env=dict(os.environ, TESSERA_LIBTPU=str(lib)))
            if compiled.returncode != 0:
                failures.append(f"{k}: does not compile with libtpu {name}: {compiled.stdout[-300:]} {compiled.stderr[-300:]}")
            blind.append(f"- {k}, libtpu {name}: no estimate ({why}); compiled: "
                         f"{'ok' if compiled.returncode == 0 else 'FAILED'}")
            cells.append(None)
        ca, cb = cells
        if ca is None or cb is None:
            table.append(f"| {k} | {ca or '-'} | {cb or '-'} | - |")
            continue
        change = cb / ca - 1.0
        row = f"| {k} | {ca} | {cb} | {change:+.1%} |"
        (moved if abs(change) > MOVE else table).append(row)
    head = [f"| preset | cycles, libtpu {names[0]} | cycles, libtpu {names[1]} | change |", "|---|---:|---:|---:|"]
    lines += [f"{len(moved)} of {len(a.keys() | b.keys())} presets moved more than {MOVE:.0%}; "
              f"{len(blind)} estimates missing where the profiler aborted (listed after the table).", ""]
    lines += head + moved + table
    if blind:
        lines += ["", "### No estimate (the static profiler aborted; the plain compile checked instead)", ""] + blind
    finish(out, lines, failures)


def finish(out, lines, failures):
    """Writes versions.md and exits non-zero on a failure."""
    if failures:
        lines += ["", "## Failures", ""] + [f"- {f}" for f in failures]
    (out / "versions.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:12]))
    if failures:
        print("versions: FAILED:\n" + "\n".join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
