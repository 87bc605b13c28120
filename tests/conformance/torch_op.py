"""Tessera kernels inside PyTorch programs: `tessera export --gpu`
artifacts loaded with tessera_torch and run on the CPU (Triton's
interpreter, the programs a GPU compiles), against
torch.nn.functional.scaled_dot_product_attention and float64.

    torch_op.py TESSERA OUT

1. flash attention (bf16, causal) forward and its autograd backward against
   SDPA in float64; the same call inside a small nn.Module whose projection
   weights get their gradients through it.
2. rms_norm (f32), whose VJP runs array steps between kernels, forward and
   backward against float64.
3. Bad use: an artifact exported without --gpu, and tensors of the wrong
   shape, each a clear error.

Writes OUT/report.md (max abs and relative errors); exits 1 on a failed
check. NaN never passes.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile

import tessera_torch  # first: with no GPU it makes Triton interpret
import torch

FAILED: list[str] = []
LINES: list[str] = []


def check(name: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    """Max abs and rel error of `got` against float64 `want`."""
    g, w = got.detach().double(), want.detach().double()
    err = (g - w).abs()
    nan = bool(torch.isnan(g).any() or torch.isnan(w).any())
    max_abs = float(err.max())
    max_rel = float((err / w.abs().clamp_min(1e-30)).max())
    ok = not nan and max_abs <= tol
    LINES.append(f"| {name} | {max_abs:.2e} | {max_rel:.2e} | {tol:.1e} | {'ok' if ok else '**FAILED**'} |")
    if not ok:
        FAILED.append(f"{name}: max abs {max_abs:.3e} > {tol} (NaN: {nan})")


def export(tessera: str, out: pathlib.Path, *args: str) -> pathlib.Path:
    subprocess.run([tessera, "export", *args, "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    return out


def attention(tessera: str, tmp: pathlib.Path) -> None:
    art = export(tessera, tmp / "fa", "flash_attention", "--config", "dtype=bf16", "--config", "causal=true",
                 "--shape", "q=1x2x128x64", "--shape", "k=1x2x128x64", "--shape", "v=1x2x128x64", "--gpu")
    op = tessera_torch.load(art)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    o, lse = op(q, k, v)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
    check("flash attention o vs SDPA (f64)", o, ref, 2e-2)
    # The log-sum-exp of each row's scaled scores.
    s = (q64 @ k64.transpose(-1, -2)) / 8.0
    s = s.masked_fill(torch.ones(128, 128, dtype=torch.bool).triu(1), float("-inf"))
    check("flash attention lse (f64)", lse, torch.logsumexp(s, -1, keepdim=True), 1e-2)
    do = torch.randn_like(o)
    o.backward(do)
    ref.backward(do.double())
    for name, a, b in (("dq", q, q64), ("dk", k, k64), ("dv", v, v64)):
        check(f"flash attention {name} vs SDPA backward (f64)", a.grad, b.grad, 5e-2)

    class Block(torch.nn.Module):
        """Projections around a Tessera attention call."""

        def __init__(self, attend):
            super().__init__()
            self.attend = attend
            self.qkv = torch.nn.Linear(64, 3 * 64, bias=False)

        def forward(self, x):
            q, k, v = self.qkv(x).unflatten(-1, (3, 64)).unbind(-2)
            return self.attend(q, k, v)

    torch.manual_seed(1)
    tessera_block = Block(lambda q, k, v: op(q, k, v)[0]).to(torch.bfloat16)
    ref_block = Block(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    ref_block = ref_block.double()
    ref_block.qkv.weight.data.copy_(tessera_block.qkv.weight.data.double())
    x = torch.randn(1, 2, 128, 64, dtype=torch.bfloat16)
    tessera_block(x).float().square().mean().backward()
    ref_block(x.double()).square().mean().backward()
    want = ref_block.qkv.weight.grad
    # Relative to the gradient's scale (small: a mean over 16k squares).
    check("nn.Module: projection weight gradient", tessera_block.qkv.weight.grad, want,
          2e-2 * float(want.abs().max()))


def rms_norm(tessera: str, tmp: pathlib.Path) -> None:
    art = export(tessera, tmp / "rms", "rms_norm", "--gpu")
    op = tessera_torch.load(art)
    torch.manual_seed(2)
    x = torch.randn(64, 256, requires_grad=True)
    gamma = torch.randn(256, requires_grad=True)
    (o,) = op(x, gamma)
    x64, g64 = x.detach().double().requires_grad_(), gamma.detach().double().requires_grad_()
    ref = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + 1e-6) * g64
    check("rms_norm o (f64)", o, ref, 1e-4)
    do = torch.randn_like(o)
    o.backward(do)
    ref.backward(do.double())
    check("rms_norm dx (f64)", x.grad, x64.grad, 1e-4)
    check("rms_norm dgamma (f64)", gamma.grad, g64.grad, 1e-3)


def bad_use(tessera: str, tmp: pathlib.Path) -> None:
    plain = export(tessera, tmp / "plain", "add")
    try:
        tessera_torch.load(plain)
        FAILED.append("an artifact without --gpu was loaded")
    except tessera_torch.ArtifactError as e:
        ok = "--gpu" in str(e)
        LINES.append(f"| artifact without --gpu | `{e}` | | | {'ok' if ok else '**FAILED**'} |")
        if not ok:
            FAILED.append(f"the error does not name --gpu: {e}")
    op = tessera_torch.load(export(tessera, tmp / "add", "add", "--gpu"))
    try:
        op(torch.zeros(3, 3), torch.zeros(3, 3))
        FAILED.append("tensors of the wrong shape were taken")
    except ValueError as e:
        ok = "float32" in str(e) and "[3, 3]" in str(e)
        LINES.append(f"| wrong shape | `{e}` | | | {'ok' if ok else '**FAILED**'} |")
        if not ok:
            FAILED.append(f"the shape error does not name what it takes and got: {e}")


def main() -> int:
    tessera, out = sys.argv[1], pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    LINES.extend([f"tessera_torch, torch {torch.__version__}, on the CPU (Triton's interpreter)", "",
                  "| check | max abs | max rel | tolerance | result |", "|---|---|---|---|---|"])
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        attention(tessera, tmp)
        rms_norm(tessera, tmp)
        bad_use(tessera, tmp)
    (out / "report.md").write_text("\n".join(LINES) + "\n")
    print("\n".join(LINES))
    if FAILED:
        print("torch_op: FAILED:\n" + "\n".join(FAILED), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
