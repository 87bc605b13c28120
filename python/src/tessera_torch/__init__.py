"""Tessera kernels in PyTorch programs: a `tessera export --gpu` directory
as a `torch.library` custom op with its autograd.

    import tessera_torch
    attn = tessera_torch.load("out/flash_attention")   # every file's SHA-256 checked
    o, lse = attn(q, k, v)          # CUDA tensors: Triton compiles the kernels for the GPU;
                                    # CPU tensors: Triton's interpreter (slow, the same program)
    o.float().sum().backward()      # through the exported VJP (vjp/triton.json)

What runs is the artifact's `triton.json` (written by `export --gpu`): the
kernels' Triton programs, the same ones the artifact's `cuda` and `rocm`
branches hand XLA, and the array ops between them, each run with its
PyTorch equivalent. The backward reuses the forward's outputs where the
exported VJP would run the forward again. The op is registered once per
artifact as `tessera::<kernel>_<digest>` (with a fake implementation, so
`torch.compile` traces through it).

On CPU tensors the programs run under Triton's interpreter with the same
patches the Tessera runtime applies there (`_interpreter.py`: bf16 dots and
rounding as the GPU computes them), which patch Triton's interpreter for
the whole process. Triton interprets or compiles for the whole process,
chosen by TRITON_INTERPRET when triton is imported: importing tessera_torch
first on a machine without a GPU sets it; with a GPU, pass GPU tensors. Depends on torch, triton and numpy (the `torch` extra),
not on jax.
"""
from __future__ import annotations

import hashlib
import json
import linecache
import os
import pathlib
import sys
import threading
from typing import Any, Callable

import torch

from tessera_artifact import ArtifactError, PathLike, check, manifest

__all__ = ["ArtifactError", "TesseraOp", "load", "Steps"]

STEPS_FORMAT, STEPS_VERSION = "tessera-triton-steps", 1

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int32": torch.int32,
    "int8": torch.int8,
    "bool": torch.bool,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}

# Without a GPU, Triton can only interpret, and it must know before it is
# imported.
if "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

_FUNCTIONS: dict[tuple[str, str], Any] = {}
_OPS: dict[str, "TesseraOp"] = {}
# Pipeline stages that fit, per program, where fewer than it asks.
_STAGES: dict[tuple[str, str], int] = {}
_LOCK = threading.Lock()


def _program_key(program: dict[str, Any]) -> str:
    """The program's identity (its source's hash), kept in the program's
    dict: every launch looks it up."""
    key = program.get("_key")
    if key is None:
        key = program["_key"] = hashlib.sha256(program["source"].encode()).hexdigest()[:16]
    return key


def _interpreting() -> bool:
    """Whether this process's Triton interprets: decided when triton is
    imported (its language helpers are made then), from TRITON_INTERPRET."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.zeros, InterpretedFunction)


def _function(program: dict[str, Any], device: torch.device) -> Any:
    """The program's `@triton.jit` function, made once per program:
    interpreted for CPU tensors, compiled for GPU ones."""
    interpret = device.type == "cpu"
    key = (_program_key(program), device.type)
    fn = _FUNCTIONS.get(key)
    if fn is not None:
        return fn
    if interpret != _interpreting():
        raise RuntimeError(
            f"tensors on {device}, but this process's Triton "
            + ("interprets (TRITON_INTERPRET=1 when triton was imported): pass CPU tensors"
               if not interpret else
               "compiles for GPUs: Triton runs CPU tensors only under its interpreter, chosen before "
               "triton is imported; set TRITON_INTERPRET=1 first (tessera_torch does so on import "
               "when no GPU is present and triton is not yet imported)"))
    with _LOCK:
        fn = _FUNCTIONS.get(key)
        if fn is not None:
            return fn
        import triton.language as tl

        if interpret:
            from . import _interpreter

            _interpreter.patch_interpreter()
        filename = f"<tessera:{program['function']}:{key[0]}>"
        source = program["source"]
        # Triton reads a function's source through inspect (linecache).
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        module: dict[str, Any] = {"__name__": f"tessera_{key[0]}"}
        exec(compile(source, filename, "exec"), module)  # noqa: S102 - the artifact's program
        if not interpret:
            # f32 dots at f32's accuracy on the tensor cores (3xTF32 on
            # NVIDIA; AMD's matrix cores multiply f32), as `compile --gpu`.
            hip = getattr(torch.version, "hip", None) is not None
            module["F32_DOT"] = tl.constexpr("ieee" if hip else "tf32x3")
        fn = module[program["function"]]
        _FUNCTIONS[key] = fn
        return fn


def _launch(program: dict[str, Any], args: list[torch.Tensor]) -> list[torch.Tensor]:
    """Runs one Triton program on `args` (scalar prefetch, then inputs) and
    returns its outputs, fresh tensors on the arguments' device."""
    device = args[0].device
    fn = _function(program, device)
    params = program["params"]
    taken = [p for p in params if p["role"] in ("prefetch", "input")]
    if len(taken) != len(args):
        raise ValueError(f"{program['function']}: {len(args)} arguments, the program takes {len(taken)}")
    buffers: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    given = iter(args)
    for p in params:
        dtype, shape = DTYPES[p["dtype"]], tuple(p["shape"])
        role = p["role"]
        if role in ("prefetch", "input"):
            t = next(given)
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise ValueError(
                    f"{program['function']}: `{p['name']}` takes {p['dtype']}{list(shape)}, "
                    f"got {t.dtype}{list(t.shape)}")
            buffers.append(t.contiguous())
        elif role == "output":
            if p["alias"] is not None:
                # An in-out operand: its output is its input's buffer, a
                # copy here, so the caller's tensor is left as it was.
                t = buffers[p["alias"]].clone()
                buffers[p["alias"]] = t
            else:
                t = torch.zeros(shape, dtype=dtype, device=device)
            buffers.append(t)
            outputs.append(t)
        else:
            buffers.append(torch.zeros(program["workspace_bytes"], dtype=torch.int8, device=device))
    grid = tuple(program["grid"])
    if device.type == "cpu":
        fn[grid](*buffers)
        return outputs
    from triton.runtime.errors import OutOfResources

    key = (_program_key(program), device.type)
    with torch.cuda.device(device):
        while True:
            stages = _STAGES.get(key, program["num_stages"])
            try:
                fn[grid](*buffers, num_warps=program["num_warps"], num_stages=stages)
                return outputs
            except OutOfResources:
                # Fewer pipeline stages until the buffers fit this GPU's
                # shared memory (what `compile --gpu` does).
                if stages <= 1:
                    raise
                _STAGES[key] = stages - 1


def _not(x: torch.Tensor) -> torch.Tensor:
    return torch.logical_not(x) if x.dtype == torch.bool else torch.bitwise_not(x)


def _div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # Integer division truncates toward zero (StableHLO's, C's).
    return torch.div(a, b) if a.is_floating_point() else torch.div(a, b, rounding_mode="trunc")


def _logical(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    ops = {"and": (torch.logical_and, torch.bitwise_and),
           "or": (torch.logical_or, torch.bitwise_or),
           "xor": (torch.logical_xor, torch.bitwise_xor)}[name]
    return lambda a, b: ops[0](a, b) if a.dtype == torch.bool else ops[1](a, b)


UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "exp2": torch.exp2, "log": torch.log,
    "log1p": torch.log1p, "tanh": torch.tanh, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "sin": torch.sin, "cos": torch.cos, "erf": torch.erf, "logistic": torch.sigmoid,
    "floor": torch.floor, "ceil": torch.ceil, "not": _not,
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": _div, "rem": torch.fmod,
    "max": torch.maximum, "min": torch.minimum, "pow": torch.pow,
    "and": _logical("and"), "or": _logical("or"), "xor": _logical("xor"),
}
COMPARE = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}


def _broadcast(x: torch.Tensor, dims: list[int], shape: tuple[int, ...]) -> torch.Tensor:
    """Input dim i becomes output dim dims[i]; the others are repeated."""
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    x = x.permute(order) if order != list(range(len(dims))) else x
    view = [1] * len(shape)
    for i in order:
        view[dims[i]] = x.shape[order.index(i)]
    return x.reshape(view).expand(shape)


def _literal(data: str, dtype: torch.dtype, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    raw = bytearray(bytes.fromhex(data))
    if not raw:
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.frombuffer(raw, dtype=dtype).reshape(shape).to(device)


class Steps:
    """A `triton.json` steps program (`graph` steps form): Triton
    programs and the array ops between them, run with PyTorch."""

    def __init__(self, path: PathLike):
        p = pathlib.Path(path)
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise ArtifactError(f"{p}: cannot read it ({e})") from None
        if d.get("format") != STEPS_FORMAT or d.get("format_version") != STEPS_VERSION:
            raise ArtifactError(
                f"{p}: not a {STEPS_FORMAT} version {STEPS_VERSION} program; export it again with this Tessera")
        self.path = p
        self.inputs: list[dict[str, Any]] = d["inputs"]
        self.programs: list[dict[str, Any]] = d["programs"]
        self.steps: list[dict[str, Any]] = d["steps"]
        self.outputs: list[int] = d["outputs"]
        self.fixed: dict[int, dict[str, Any]] = {f["index"]: f for f in d.get("fixed", [])}

    def free_inputs(self) -> list[dict[str, Any]]:
        """The inputs a caller passes (the others are fixed in the program)."""
        return [e for i, e in enumerate(self.inputs) if i not in self.fixed]

    def run(self, args: list[torch.Tensor],
            known: Callable[[dict[str, Any], dict[str, Any]], list[torch.Tensor] | None] | None = None,
            ) -> list[torch.Tensor]:
        """The outputs on `args` (the free inputs, in order). `known(step,
        program)` may give a kernel step's outputs without running it."""
        free = self.free_inputs()
        if len(args) != len(free):
            raise ValueError(f"{self.path}: takes {len(free)} tensors, got {len(args)}")
        device = args[0].device if args else torch.device("cpu")
        values: list[torch.Tensor] = []
        given = iter(args)
        for i, e in enumerate(self.inputs):
            dtype, shape = DTYPES[e["dtype"]], tuple(e["shape"])
            if i in self.fixed:
                values.append(_literal(self.fixed[i]["data"], dtype, shape, device))
                continue
            t = next(given)
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise ValueError(f"{self.path}: input {i} is {e['dtype']}{list(shape)}, got {t.dtype}{list(t.shape)}")
            if t.device != device:
                raise ValueError(f"{self.path}: input {i} is on {t.device}, input 0 on {device}; pass them on one device")
            values.append(t)
        for s in self.steps:
            for o, v in zip(s["out"], self._step(s, values, device, known)):
                if o != len(values):
                    raise ArtifactError(f"{self.path}: step results out of order ({o}, expected {len(values)})")
                values.append(v)
        return [values[o] for o in self.outputs]

    def _step(self, s: dict[str, Any], values: list[torch.Tensor], device: torch.device,
              known: Callable[..., list[torch.Tensor] | None] | None) -> list[torch.Tensor]:
        a = [values[i] for i in s["args"]]
        op = s["op"]
        if op == "kernel":
            program = self.programs[s["program"]]
            if known is not None:
                outs = known(s, program)
                if outs is not None:
                    return outs
            return _launch(program, a)
        dtype, shape = DTYPES[s["dtype"]], tuple(s["shape"])
        if op == "constant":
            r = torch.full(shape, s["value"], dtype=dtype, device=device)
        elif op == "literal":
            r = _literal(s["data"], dtype, shape, device)
        elif op == "iota":
            n = shape[s["dim"]]
            view = [1] * len(shape)
            view[s["dim"]] = n
            r = torch.arange(n, device=device).reshape(view).expand(shape).to(dtype)
        elif op == "unary":
            r = UNARY[s["name"]](a[0])
        elif op == "binary":
            r = BINARY[s["name"]](a[0], a[1])
        elif op == "compare":
            r = COMPARE[s["name"]](a[0], a[1])
        elif op == "select":
            r = torch.where(a[0], a[1], a[2])
        elif op == "convert":
            r = a[0] != 0 if dtype == torch.bool else a[0].to(dtype)
        elif op == "reshape":
            r = a[0].reshape(shape)
        elif op == "transpose":
            r = a[0].permute(s["perm"])
        elif op == "broadcast":
            r = _broadcast(a[0], s["dims"], shape)
        elif op == "slice":
            r = a[0][tuple(slice(b, e) for b, e in zip(s["start"], s["limit"]))]
        elif op == "concat":
            r = torch.cat(a, dim=s["axis"])
        elif op == "reduce":
            axes = tuple(s["axes"])
            x = a[0].float() if a[0].is_floating_point() else a[0]
            if s["name"] == "sum":
                r = x.sum(dim=axes)
                if s["mean"]:
                    count = 1
                    for ax in axes:
                        count *= a[0].shape[ax]
                    r = r / count
            elif s["name"] == "max":
                r = x.amax(dim=axes)
            else:
                r = x.amin(dim=axes)
        else:
            raise ArtifactError(f"{self.path}: unknown step `{op}`; export it again with this Tessera")
        return [r.to(dtype).reshape(shape).contiguous()]


class TesseraOp:
    """A loaded artifact, callable on tensors (manifest order); its outputs
    as a tuple. Differentiable when the artifact has a VJP."""

    def __init__(self, path: PathLike):
        d = pathlib.Path(path)
        man = check(d)
        if "triton.json" not in man["files"]:
            raise ArtifactError(
                f"{d}: has no triton.json (the Triton programs); export it with `tessera export --gpu`")
        self.name: str = man["kernel"]
        self.manifest = man
        self.forward = Steps(d / "triton.json")
        self.vjp: Steps | None = None
        self.grad_inputs: list[int] | None = None
        sub = man.get("vjp")
        if sub is not None:
            # The VJP's manifest is one the forward's digests cover, and it
            # covers its own triton.json: a mixed directory is refused.
            vman = check(d / sub)
            if f"{sub}/manifest.json" not in man["files"] or "triton.json" not in vman["files"]:
                raise ArtifactError(f"{d}: its VJP has no checked triton.json; export it again with --gpu")
            self.vjp = Steps(d / sub / "triton.json")
            self.grad_inputs = manifest(d / sub).get("grad_inputs")
        digest = hashlib.sha256((d / "triton.json").read_bytes()).hexdigest()[:12]
        self.op_name = f"tessera::{_identifier(self.name)}_{digest}"
        self._op = _register(self)

    def __call__(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self._op(list(tensors)))

    def _reuse_forward(self, xs: list[torch.Tensor], outs: list[torch.Tensor]):
        """A VJP step that runs the forward kernel on the primals again gets
        the forward's outputs instead."""
        fwd_step = self.forward.steps[0] if len(self.forward.steps) == 1 else None
        if fwd_step is None or fwd_step["op"] != "kernel":
            return None
        source = self.forward.programs[fwd_step["program"]]["source"]
        primals = list(range(len(self.forward.inputs)))

        def known(step: dict[str, Any], program: dict[str, Any]):
            if program["source"] == source and step["args"] == primals:
                return list(outs)
            return None

        return known


def _identifier(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def _register(t: TesseraOp) -> Any:
    with _LOCK:
        if t.op_name in _OPS:
            return _OPS[t.op_name]._op
    fwd, vjp = t.forward, t.vjp
    outs = t.manifest["outputs"]

    @torch.library.custom_op(t.op_name, mutates_args=())
    def op(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return fwd.run(list(xs))

    @op.register_fake
    def _(xs):
        return [xs[0].new_empty(tuple(o["shape"]), dtype=_torch_dtype(o["dtype"])) for o in outs]

    if vjp is not None:
        def setup_context(ctx, inputs, output):
            (xs,) = inputs
            ctx.n = len(xs)
            ctx.save_for_backward(*xs, *output)

        def backward(ctx, grads):
            saved = ctx.saved_tensors
            xs, ys = list(saved[:ctx.n]), list(saved[ctx.n:])
            cts = [g.contiguous() if g is not None else torch.zeros_like(y) for g, y in zip(grads, ys)]
            gs = vjp.run(xs + cts, known=t._reuse_forward(xs, ys))
            which = t.grad_inputs if t.grad_inputs is not None else range(ctx.n)
            out: list[torch.Tensor | None] = [None] * ctx.n
            for i, g in zip(which, gs):
                out[i] = g
            return (out,)

        op.register_autograd(backward, setup_context=setup_context)
    with _LOCK:
        _OPS[t.op_name] = t
    return op


def _torch_dtype(name: str) -> torch.dtype:
    """A manifest's dtype name (JAX's, which are torch's too) as torch's."""
    if name not in DTYPES:
        raise ArtifactError(f"dtype `{name}` has no torch equivalent here")
    return DTYPES[name]


def load(path: PathLike) -> TesseraOp:
    """The artifact in `path` (written by `tessera export --gpu`) as a
    callable PyTorch op with autograd: `load(dir)(*tensors)` returns the
    outputs as a tuple. Raises ArtifactError when the directory is not a
    whole export or has no Triton programs."""
    return TesseraOp(path)
