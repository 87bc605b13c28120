"""Tessera's kernels across chips beside Pallas's TPU interpret mode.

The same protocols written in Pallas (remote copies around a ring, the
collective matmul's "slot free" handshake) run under
`interpret=pltpu.InterpretParams(detect_races=True)` inside `shard_map` over
4 CPU devices, on the same inputs as `tessera run FILE.kir` (the kernel files
in tests/conformance/mesh/, pinned to the Rust kernels by a test) on its
checking interpreter and its SPMD program on PJRT CPU devices. Checked:

* outputs agree with Pallas's (copies bit for bit, matmuls within f32
  rounding) and with an f64 NumPy reference;
* the race Pallas's detector finds in the collective matmul without its
  handshake is found by Tessera's interpreter too (at the copy's line), in
  some of the interleavings it tries, and neither reports one in the
  correct protocol.

Usage: pallas_mesh.py TESSERA_BINARY OUT_DIR. Writes OUT_DIR/pallas_mesh.md;
exits non-zero on any failed check.
"""

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

DEVICES = 4
M, K, N = 8, 128, 128
KIR = Path(__file__).parent / "mesh"


def interpret():
    return pltpu.InterpretParams(detect_races=True)


def races_found():
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    return bool(ipc.races is not None and ipc.races.races_found)


def reset():
    pltpu.reset_tpu_interpret_mode_state()


def remote(src, dst, send, recv, device):
    return pltpu.make_async_remote_copy(
        src, dst, send, recv, device_id=(device,), device_id_type=pl.DeviceIdType.MESH
    )


def ring_all_gather_kernel(x_ref, o_ref, send, recv, local):
    me = jax.lax.axis_index("x")
    right = jax.lax.rem(me + 1, DEVICES)
    own = pltpu.make_async_copy(x_ref, o_ref.at[pl.ds(me * M, M)], local)
    own.start()
    own.wait()
    for s in range(DEVICES - 1):
        out_block = jax.lax.rem(me + DEVICES - s, DEVICES)
        in_block = jax.lax.rem(me + 2 * DEVICES - s - 1, DEVICES)
        out_rows = o_ref.at[pl.ds(out_block * M, M)]
        in_rows = o_ref.at[pl.ds(in_block * M, M)]
        send_now = remote(out_rows, out_rows, send.at[s], recv.at[s], right)
        send_now.start()
        remote(in_rows, in_rows, send.at[s], recv.at[s], right).wait_recv()
        send_now.wait_send()


def gather_matmul_kernel(handshake):
    def kernel(x_ref, w_ref, o_ref, buf, send, recv, local, free):
        me = jax.lax.axis_index("x")
        right = jax.lax.rem(me + 1, DEVICES)
        left = jax.lax.rem(me + DEVICES - 1, DEVICES)
        own = pltpu.make_async_copy(x_ref, buf.at[0], local)
        own.start()
        own.wait()
        w = w_ref[...]
        for s in range(DEVICES):
            slot, nxt = s % 2, (s + 1) % 2
            more = s + 1 < DEVICES
            if more:
                fwd = remote(buf.at[slot], buf.at[nxt], send.at[slot], recv.at[nxt], right)
                if handshake and s > 0:
                    pl.semaphore_wait(free, 1)
                fwd.start()
            block = jax.lax.rem(me + DEVICES - s, DEVICES)
            y = jnp.dot(buf[slot], w, preferred_element_type=jnp.float32)
            o_ref[pl.ds(block * M, M), :] = y
            if more:
                fwd.wait_send()
                fwd.wait_recv()
            if handshake and s + 2 < DEVICES:
                pl.semaphore_signal(
                    free, 1, device_id=(left,), device_id_type=pl.DeviceIdType.MESH
                )

    return kernel


def mesh():
    return jax.make_mesh(
        (DEVICES,), ("x",), axis_types=(jax.sharding.AxisType.Auto,)
    )


def run_pallas_all_gather(x):
    call = pl.pallas_call(
        ring_all_gather_kernel,
        out_shape=jax.ShapeDtypeStruct((DEVICES * M, N), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[
            pltpu.SemaphoreType.DMA((DEVICES,)),
            pltpu.SemaphoreType.DMA((DEVICES,)),
            pltpu.SemaphoreType.DMA(()),
        ],
        interpret=interpret(),
    )
    f = jax.shard_map(
        lambda xs: call(xs[0])[None],
        mesh=mesh(),
        in_specs=P("x"),
        out_specs=P("x"),
        check_vma=False,
    )
    return np.asarray(jax.jit(f)(x))


def run_pallas_gather_matmul(x, w, handshake):
    call = pl.pallas_call(
        gather_matmul_kernel(handshake),
        out_shape=jax.ShapeDtypeStruct((DEVICES * M, N), jnp.float32),
        grid=(1,),
        in_specs=[
            pl.BlockSpec(memory_space=pl.ANY),
            pl.BlockSpec((K, N), lambda i: (0, 0)),
        ],
        out_specs=pl.BlockSpec((DEVICES * M, N), lambda i: (0, 0)),
        scratch_shapes=[
            pltpu.VMEM((2, M, K), jnp.float32),
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.REGULAR,
        ],
        interpret=interpret(),
    )
    f = jax.shard_map(
        lambda xs, ws: call(xs[0], ws[0])[None],
        mesh=mesh(),
        in_specs=(P("x"), P("x")),
        out_specs=P("x"),
        check_vma=False,
    )
    return np.asarray(jax.jit(f)(x, w))


def pallas_access(kind, text):
    """One access of a race Pallas reports, by the line it names."""
    if "fwd.start" in text:
        return "remote copy writes"
    if "own.start" in text:
        return "local copy writes"
    return "kernel reads" if kind == "read" else "kernel writes"


def tessera_access(text):
    """The access at the kernel-file line of a Tessera race error."""
    if text.strip().startswith("dma_start"):
        return "remote copy writes" if " to %" in text else "local copy writes"
    return "kernel reads" if " load " in f" {text.strip()} " else "kernel writes"


def tessera_run(binary, kir, inputs, out, backend, seed=0):
    args = [binary, "run", str(KIR / kir), "--backend", backend, "--out", str(out)]
    args += ["--seed", str(seed)]
    for name, path in inputs.items():
        args += ["--input", f"{name}={path}"]
    return subprocess.run(args, capture_output=True, text=True)


def main():
    binary, out = sys.argv[1], Path(sys.argv[2]) / "mesh"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(29)
    lines = ["# Kernels across chips: Tessera beside Pallas's TPU interpret mode", ""]
    lines.append(f"{DEVICES} CPU devices, `shard_map` over mesh axis `x`; Pallas with "
                 "`InterpretParams(detect_races=True)`.")
    lines.append("")
    lines.append("| kernel | path | max abs vs Pallas | max abs vs f64 | races |")
    lines.append("|---|---|---|---|---|")
    failures = []

    def compare(kernel, got, pallas, ref, exact, races):
        for path, arr in got.items():
            d_p = float(np.max(np.abs(arr.astype(np.float64) - pallas)))
            d_r = float(np.max(np.abs(arr.astype(np.float64) - ref)))
            lines.append(f"| {kernel} | tessera {path} | {d_p:.2e} | {d_r:.2e} | none |")
            tol = 0.0 if exact else 1e-4
            if np.isnan(arr).any() or d_p > tol or d_r > tol:
                failures.append(f"{kernel} on {path}: {d_p:.2e} from Pallas, {d_r:.2e} from f64")
        d_r = float(np.max(np.abs(pallas - ref)))
        lines.append(f"| {kernel} | pallas interpret | 0 | {d_r:.2e} | {races} |")

    def run_paths(kir, inputs, want):
        got = {}
        for backend in ("interp", "pjrt"):
            r = tessera_run(binary, kir, inputs, out / kir / backend, backend)
            if r.returncode != 0:
                failures.append(f"tessera run {kir} --backend {backend}: {r.stderr.strip()}")
                continue
            got[backend] = np.load(out / kir / backend / f"{want}.npy")
        return got

    # Ring all-gather.
    x = rng.standard_normal((DEVICES, M, N)).astype(np.float32)
    np.save(out / "gather_x.npy", x)
    reset()
    pallas = run_pallas_all_gather(x).astype(np.float64)
    pallas_races = races_found()
    if pallas_races:
        failures.append("Pallas finds a race in the ring all-gather")
    ref = np.broadcast_to(np.concatenate(list(x.astype(np.float64))), pallas.shape)
    got = run_paths("all_gather.kir", {"x": out / "gather_x.npy"}, "o")
    compare("ring all-gather", got, pallas, ref, True, "found" if pallas_races else "none")

    # Collective matmul, with its handshake.
    x = rng.standard_normal((DEVICES, M, K)).astype(np.float32)
    w1 = rng.standard_normal((K, N)).astype(np.float32)
    w = np.broadcast_to(w1, (DEVICES, K, N)).copy()
    np.save(out / "mm_x.npy", x)
    np.save(out / "mm_w.npy", w)
    reset()
    pallas = run_pallas_gather_matmul(x, w, True).astype(np.float64)
    pallas_races = races_found()
    if pallas_races:
        failures.append("Pallas finds a race in the collective matmul with its handshake")
    full = np.concatenate(list(x.astype(np.float64))) @ w1.astype(np.float64)
    ref = np.broadcast_to(full, pallas.shape)
    inputs = {"x": out / "mm_x.npy", "w": out / "mm_w.npy"}
    got = run_paths("all_gather_matmul.kir", inputs, "o")
    compare("collective matmul", got, pallas, ref, False, "found" if pallas_races else "none")

    # Without the handshake: Pallas's detector and Tessera's interpreter,
    # each race classified by the two accesses it names.
    reset()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        run_pallas_gather_matmul(x, w, False)
        jax.effects_barrier()
    pallas_races = races_found()
    reset()
    source = Path(__file__).read_text().splitlines()
    pallas_kinds = set()
    for block in buf.getvalue().split("RACE DETECTED")[1:]:
        accesses = []
        for line in block.splitlines():
            line = line.strip()
            if line.startswith(("read of", "write of")) and "pallas_mesh.py:" in line:
                n = int(line.split("pallas_mesh.py:")[1].split(":")[0])
                accesses.append(pallas_access(line.split()[0], source[n - 1]))
        if len(accesses) == 2:
            pallas_kinds.add(frozenset(accesses))
    kir = (KIR / "all_gather_matmul_no_handshake.kir").read_text().splitlines()
    seeds, found, tessera_kinds = 64, 0, set()
    for seed in range(seeds):
        r = tessera_run(binary, "all_gather_matmul_no_handshake.kir", inputs,
                        out / "no_handshake", "interp", seed)
        if r.returncode == 0:
            continue
        found += 1
        marker = "all_gather_matmul_no_handshake.kir:"
        if "[dma-race]" not in r.stderr or marker not in r.stderr or "remote copy" not in r.stderr:
            failures.append(f"no-handshake seed {seed}: not a race with a remote copy: {r.stderr.strip()}")
            continue
        n = int(r.stderr.split(marker)[1].split(":")[0])
        tessera_kinds.add(frozenset([tessera_access(kir[n - 1]), "remote copy writes"]))
    clean = 0
    for seed in range(seeds):
        r = tessera_run(binary, "all_gather_matmul.kir", inputs, out / "handshake", "interp", seed)
        clean += r.returncode == 0

    def names(kinds):
        return "; ".join(sorted(" / ".join(sorted(k)) for k in kinds)) or "none"

    lines.append("")
    lines.append("Collective matmul without its handshake (a sender overwrites a slot its "
                 "neighbour still reads):")
    lines.append("")
    lines.append(f"* Pallas's race detector: {names(pallas_kinds)}.")
    lines.append(f"* Tessera's interpreter, {found} of {seeds} interleavings report a "
                 f"`dma-race`: {names(tessera_kinds)}.")
    lines.append(f"* With the handshake: {clean} of {seeds} interleavings run clean on "
                 "Tessera, and Pallas finds no race.")
    if not pallas_races or not pallas_kinds:
        failures.append("Pallas's detector missed the no-handshake race (the cross-check has no anchor)")
    missed = pallas_kinds - tessera_kinds
    if missed:
        failures.append(f"races Pallas finds that Tessera's interpreter did not: {names(missed)}")
    if clean != seeds:
        failures.append(f"the handshake protocol failed in {seeds - clean} interleavings")
    lines.append("")
    if failures:
        lines.append("## Failures")
        lines.extend(f"* {f}" for f in failures)
    (out.parent / "pallas_mesh.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
