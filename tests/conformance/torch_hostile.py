"""tessera_torch against hostile input: artifacts and calls from someone
else, each judged. Issue 70's findings 1 and 8 as named checks, then
generated cases with a fixed seed:

* `artifact`: an exported artifact with one byte flipped in one file, or
  one field of `triton.json` or `manifest.json` replaced by a value of
  another type or range (and the manifest's digests recomputed, so the
  structure check, not the digest, must catch it). Each load must be an
  ArtifactError naming the file, or a load whose op then computes the
  kernel's answer or refuses the call with a tessera_torch error.
* `call`: a loaded op called with tensors of random count, dtype, shape
  and device (`cpu`, `meta`), or with things that are not tensors. Each
  call must return the kernel's answer (when the tensors are what the
  artifact takes) or raise CallError naming the argument.

Any other exception, a wrong answer or a marker file written by a name is
a failure.

    torch_hostile.py TESSERA OUT [--full]

Writes OUT/hostile_torch.md (cases and held per surface); exits 1 on a
failure. 2,000 cases per surface, 10,000 with --full.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile

import tessera_torch  # first: with no GPU it makes Triton interpret
import torch

FAILED: list[str] = []

DOUBLE = """kernel @double {
  target v5e, vmem_limit default
  grid [2 parallel]
  in @x: f32[16, 128] vmem block [8, 128] at (g0, 0) row_major
  out @o: f32[16, 128] vmem block [8, 128] at (g0, 0) row_major
body:
  %0 = load @x[0:8, 0:128] : f32[8, 128]
  %1 = add %0, %0 : f32[8, 128]
  store @o[0:8, 0:128], %1 : f32[8, 128]
}
"""

THREE = """kernel @three {
  target v5e, vmem_limit default
  grid [1 parallel]
  out @o: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
body:
  %0 = constant 3.0 : f32[8, 128]
  store @o[0:8, 0:128], %0 : f32[8, 128]
}
"""


def fail(what: str) -> None:
    FAILED.append(what)


def export(tessera: str, kir: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    subprocess.run([tessera, "export", str(kir), "--gpu", "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    return out


def resign(art: pathlib.Path) -> None:
    """Recomputes the manifest's digests of the files it names (what an
    editor who knows the format does)."""
    m = json.loads((art / "manifest.json").read_text())
    if isinstance(m, dict) and isinstance(m.get("files"), dict):
        for rel in list(m["files"]):
            f = art / rel
            if f.is_file():
                m["files"][rel] = hashlib.sha256(f.read_bytes()).hexdigest()
        (art / "manifest.json").write_text(json.dumps(m))


def expect(kind: type[BaseException], what: str, says: str, f, *args) -> None:
    try:
        f(*args)
        fail(f"{what}: no {kind.__name__}")
    except kind as e:
        if says not in str(e):
            fail(f"{what}: the error does not say `{says}`: {e}")
    except Exception as e:  # noqa: BLE001 - any other error is the finding
        fail(f"{what}: {type(e).__name__} instead of {kind.__name__}: {e}")


def named(tessera: str, tmp: pathlib.Path, double: pathlib.Path) -> None:
    """The findings, each a check."""
    # 1. A file name never runs as code: the export from a path holding
    # Python computes 2x and writes no marker.
    marker = tmp / "pwned"
    folder = tmp / f"k\nopen({str(marker)!r}, 'w').close()\n#\u2028open({str(marker)!r}, 'w').close()".replace("/", "\\x2f")
    folder.mkdir()
    (folder / "double.kir").write_text(DOUBLE)
    art = export(tessera, folder / "double.kir", tmp / "named")
    x = torch.randn(16, 128)
    (o,) = tessera_torch.load(art)(x)
    if not torch.equal(o, x + x) or marker.exists():
        fail(f"a kernel file's name ran as code (marker {marker.exists()}, max err {float((o - 2 * x).abs().max())})")
    # 8. Every call checked.
    op = tessera_torch.load(double)
    expect(tessera_torch.CallError, "a meta tensor", "meta device", op, torch.empty(16, 128, device="meta"))
    expect(tessera_torch.CallError, "two tensors for one", "takes 1 tensors (x), got 2", op, x, x)
    expect(tessera_torch.CallError, "a list", "not a torch.Tensor", op, [1.0])
    expect(tessera_torch.CallError, "an f64 tensor", "takes float32[16, 128]", op, x.double())
    (o,) = op(x.t().contiguous().t())  # a non-contiguous tensor is taken
    if not torch.equal(o, x + x):
        fail("a non-contiguous input gave another answer")
    three = tessera_torch.load(export(tessera, tmp / "three.kir", tmp / "three"))
    (o,) = three()
    if not torch.equal(o, torch.full((8, 128), 3.0)):
        fail("a kernel with no inputs did not compute its constant")
    # A tampered program: its source changed, the digests recomputed.
    bad = tmp / "tampered"
    shutil.copytree(double, bad)
    steps = json.loads((bad / "triton.json").read_text())
    steps["programs"][0]["source"] += "\nimport os\n"
    (bad / "triton.json").write_text(json.dumps(steps))
    resign(bad)
    expect(tessera_torch.ArtifactError, "a changed source", "programs[0].source`", tessera_torch.load, bad)
    # A manifest naming a file outside the directory.
    out = tmp / "outside"
    shutil.copytree(double, out)
    m = json.loads((out / "manifest.json").read_text())
    m["files"]["../double/manifest.json"] = "0" * 64
    (out / "manifest.json").write_text(json.dumps(m))
    expect(tessera_torch.ArtifactError, "a path outside", "not a plain path", tessera_torch.load, out)


def mutations(rng: random.Random) -> list[object]:
    return [None, True, -1, 0, 2**62, 1.5, "x", "", [], [0], [-1, 2], {}, {"a": 1}, [[1]], "float64", "\n"]


def paths(v: object, at: tuple = ()) -> list[tuple]:
    """Every (key path) of a JSON value."""
    out = [at]
    if isinstance(v, dict):
        for k, x in v.items():
            out += paths(x, at + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out += paths(x, at + (i,))
    return out


def edit(v: object, at: tuple, new: object) -> object:
    if not at:
        return new
    v[at[0]] = edit(v[at[0]], at[1:], new)
    return v


def artifact_cases(n: int, rng: random.Random, tmp: pathlib.Path, double: pathlib.Path) -> int:
    held = 0
    x = torch.randn(16, 128)
    for i in range(n):
        art = tmp / f"case{i}"
        shutil.copytree(double, art)
        names = ["manifest.json", "triton.json", "module.mlir"]
        what = ""
        if i % 3 == 0:
            f = art / rng.choice(names)
            b = bytearray(f.read_bytes())
            j = rng.randrange(len(b))
            b[j] ^= 1 << rng.randrange(8)
            f.write_bytes(bytes(b))
            what = f"byte {j} of {f.name} flipped"
        else:
            name = rng.choice(names[:2])
            f = art / name
            doc = json.loads(f.read_text())
            at = rng.choice(paths(doc)[1:])
            new = rng.choice(mutations(rng))
            doc = edit(doc, at, new)
            f.write_text(json.dumps(doc))
            if name != "manifest.json":
                resign(art)
            what = f"{name} {list(at)} = {new!r}"
        ok = True
        try:
            op = tessera_torch.load(art)
            try:
                (o,) = op(x)
                # A load that took the edit must still compute 2x: only
                # fields that do not change the program may be edited.
                if not torch.equal(o, x + x):
                    ok = False
                    fail(f"artifact case {i} ({what}): loaded and computed another answer")
            except (tessera_torch.CallError, tessera_torch.ArtifactError):
                pass
        except tessera_torch.ArtifactError as e:
            if "\n" in str(e).strip():
                ok = False
                fail(f"artifact case {i} ({what}): a multi-line error: {e!r}")
        except Exception as e:  # noqa: BLE001 - the finding
            ok = False
            fail(f"artifact case {i} ({what}): {type(e).__name__}: {e}")
        held += ok
        shutil.rmtree(art)
    return held


def call_cases(n: int, rng: random.Random, op: tessera_torch.TesseraOp) -> int:
    held = 0
    dtypes = [torch.float32, torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.bool]
    for i in range(n):
        count = rng.choice([0, 1, 1, 1, 2, 3])
        args: list[object] = []
        for _ in range(count):
            r = rng.random()
            if r < 0.1:
                args.append(rng.choice([None, 1.0, "x", [1.0], (16, 128)]))
                continue
            shape = rng.choice([(16, 128), (16, 128), (128, 16), (16, 128, 1), (0,), (), (2048,)])
            device = "meta" if rng.random() < 0.2 else "cpu"
            args.append(torch.ones(shape, dtype=rng.choice(dtypes), device=device))
        valid = (len(args) == 1 and isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu"
                 and args[0].dtype == torch.float32 and tuple(args[0].shape) == (16, 128))
        ok = True
        try:
            (o,) = op(*args)
            if not valid or not torch.equal(o, args[0] + args[0]):
                ok = False
                fail(f"call case {i}: {[getattr(a, 'shape', a) for a in args]} was taken")
        except tessera_torch.CallError as e:
            if valid or "argument" not in str(e) and "takes" not in str(e):
                ok = False
                fail(f"call case {i}: {e}")
        except Exception as e:  # noqa: BLE001 - the finding
            ok = False
            fail(f"call case {i}: {type(e).__name__}: {e}")
        held += ok
    return held


def main() -> int:
    tessera, out = sys.argv[1], pathlib.Path(sys.argv[2])
    n = 10_000 if "--full" in sys.argv[3:] else 2_000
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(70)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        (tmp / "double.kir").write_text(DOUBLE)
        (tmp / "three.kir").write_text(THREE)
        double = export(tessera, tmp / "double.kir", tmp / "double")
        before = len(FAILED)
        named(tessera, tmp, double)
        rows.append(("named findings (1, 8)", 7, 7 - (len(FAILED) - before)))
        rows.append(("artifact", n, artifact_cases(n, rng, tmp, double)))
        rows.append(("call", n, call_cases(n, rng, tessera_torch.load(double))))
    lines = [f"tessera_torch against hostile input (seed 70), torch {torch.__version__}", "",
             "| surface | cases | held |", "|---|---|---|"]
    lines += [f"| {s} | {c} | {h} |" for s, c, h in rows]
    (out / "hostile_torch.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    # The suite's table rows (run.sh gathers them into hostile.md).
    notes = {"artifact": ("artifacts", "flipped bytes, edited fields (digests recomputed); tessera_torch.load"),
             "call": ("tessera_torch calls", "counts, dtypes, shapes, meta tensors, non-tensors")}
    (out / "hostile").mkdir(parents=True, exist_ok=True)
    for s, c, h in rows:
        if s in notes:
            name, note = notes[s]
            (out / "hostile" / f"{name.replace(' ', '_')}.md").write_text(f"| {name} | {c} | {h} | seed 70: {note} |\n")
    if FAILED:
        print(f"torch_hostile: FAILED ({len(FAILED)}):\n" + "\n".join(FAILED[:40]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
