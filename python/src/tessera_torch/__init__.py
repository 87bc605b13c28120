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

__all__ = ["ArtifactError", "CallError", "TesseraOp", "load", "Steps"]

STEPS_FORMAT, STEPS_VERSION = "tessera-triton-steps", 2


class CallError(ValueError):
    """A call whose tensors the artifact's signature does not take: the
    wrong count, dtype, shape or device (a `meta` tensor, tensors on two
    devices), named by argument."""

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


def _launch(program: dict[str, Any], args: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Runs one Triton program on `args` (scalar prefetch, then inputs) and
    returns its outputs, fresh tensors on `device` (the arguments', or the
    CPU for a kernel that takes none)."""
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


_ROLES = ("prefetch", "input", "output", "workspace")
_STEP_OPS = ("kernel", "constant", "literal", "iota", "unary", "binary", "compare", "select", "convert",
             "reshape", "transpose", "broadcast", "slice", "concat", "reduce")
_NAMED = {"unary": UNARY, "binary": BINARY, "compare": COMPARE, "reduce": {"sum": 0, "max": 0, "min": 0}}
# The most elements one array of a triton.json may declare (2^40): a
# tampered shape is refused before anything is allocated from it.
_MAX_ELEMENTS = 1 << 40


class _Shape:
    """Checks a triton.json's structure before anything runs from it: each
    field there with its type and range, value numbers in order. A file
    that fails is an ArtifactError naming the file and the field."""

    def __init__(self, path: pathlib.Path):
        self.path = path

    def fail(self, field: str, what: str) -> None:
        raise ArtifactError(f"{self.path}: `{field}` {what}; export it again with this Tessera")

    def get(self, d: Any, key: str, kind: type, field: str) -> Any:
        if not isinstance(d, dict) or key not in d:
            self.fail(field, "is missing")
        v = d[key]
        # bool is an int in Python: a count never is one.
        if not isinstance(v, kind) or (isinstance(v, bool) and kind is int):
            self.fail(field, f"is {type(v).__name__}, not {kind.__name__}")
        return v

    def count(self, d: Any, key: str, field: str, below: int | None = None) -> int:
        v = self.get(d, key, int, field)
        if v < 0 or (below is not None and v >= below):
            self.fail(field, f"is {v}, outside 0..{below if below is not None else ''}")
        return v

    def shape(self, d: Any, field: str) -> None:
        dims = self.get(d, "shape", list, f"{field}.shape")
        n = 1
        for j in range(len(dims)):
            n *= self._dim(dims[j], f"{field}.shape[{j}]")
        if n > _MAX_ELEMENTS:
            self.fail(f"{field}.shape", f"has {n} elements, more than 2^40")
        if self.get(d, "dtype", str, f"{field}.dtype") not in DTYPES:
            self.fail(f"{field}.dtype", f"is {d['dtype']!r}, not one of {', '.join(DTYPES)}")

    def _dim(self, v: Any, field: str) -> int:
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            self.fail(field, f"is {v!r}, not a size")
        return v

    def values(self, d: Any, key: str, field: str, defined: int) -> list[int]:
        vs = self.get(d, key, list, field)
        for j, v in enumerate(vs):
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < defined:
                self.fail(f"{field}[{j}]", f"is {v!r}, not one of the {defined} values defined before it")
        return vs

    def digests(self, pr: dict[str, Any], f: str) -> None:
        """Each field of a program against its recorded digest (the
        exporter's `field_digest`: a string's UTF-8, else its compact JSON
        with sorted keys), so a program changed after export never runs."""
        digests = self.get(pr, "digests", dict, f"{f}.digests")
        for key, v in pr.items():
            if key == "digests" or key.startswith("_"):
                continue
            data = v.encode() if isinstance(v, str) else json.dumps(v, sort_keys=True, separators=(",", ":")).encode()
            if digests.get(key) != hashlib.sha256(data).hexdigest():
                self.fail(f"{f}.{key}", "is not what it was at export (its digest differs)")

    def program(self, d: Any) -> list[tuple[str, list[int]]]:
        """Checks a steps program; returns its outputs' (dtype, shape)."""
        if not isinstance(d, dict):
            self.fail("(top level)", "is not an object")
        inputs = self.get(d, "inputs", list, "inputs")
        for i, e in enumerate(inputs):
            self.shape(e, f"inputs[{i}]")
        programs = self.get(d, "programs", list, "programs")
        for i, pr in enumerate(programs):
            f = f"programs[{i}]"
            self.get(pr, "source", str, f"{f}.source")
            self.digests(pr, f)
            fn = self.get(pr, "function", str, f"{f}.function")
            if not fn.isidentifier():
                self.fail(f"{f}.function", f"is {fn!r}, not a Python identifier")
            grid = self.get(pr, "grid", list, f"{f}.grid")
            if not 1 <= len(grid) <= 3:
                self.fail(f"{f}.grid", f"has {len(grid)} dims, not 1 to 3")
            for j, g in enumerate(grid):
                if self._dim(g, f"{f}.grid[{j}]") == 0:
                    self.fail(f"{f}.grid[{j}]", "is 0")
            self.count(pr, "num_warps", f"{f}.num_warps")
            self.count(pr, "num_stages", f"{f}.num_stages")
            ws = self.count(pr, "workspace_bytes", f"{f}.workspace_bytes")
            if ws > _MAX_ELEMENTS:
                self.fail(f"{f}.workspace_bytes", f"is {ws}, more than 2^40")
            params = self.get(pr, "params", list, f"{f}.params")
            for j, q in enumerate(params):
                g = f"{f}.params[{j}]"
                if self.get(q, "role", str, f"{g}.role") not in _ROLES:
                    self.fail(f"{g}.role", f"is {q['role']!r}, not one of {', '.join(_ROLES)}")
                if q["role"] != "workspace":
                    self.shape(q, g)
                alias = q.get("alias")
                if q["role"] == "output" and alias is not None:
                    if not isinstance(alias, int) or isinstance(alias, bool) or not 0 <= alias < j \
                            or params[alias].get("role") not in ("prefetch", "input"):
                        self.fail(f"{g}.alias", f"is {alias!r}, not an earlier input's index")
        # The type (dtype, shape) of every value, in order: a step's args
        # must have the types its program or op takes.
        types: list[tuple[str, list[int]]] = [(e["dtype"], e["shape"]) for e in inputs]
        for i, fx in enumerate(self.get(d, "fixed", list, "fixed") if "fixed" in d else []):
            self.count(fx, "index", f"fixed[{i}].index", below=len(inputs))
            self.get(fx, "data", str, f"fixed[{i}].data")
        steps = self.get(d, "steps", list, "steps")
        for i, st in enumerate(steps):
            f = f"steps[{i}]"
            op = self.get(st, "op", str, f"{f}.op")
            if op not in _STEP_OPS:
                self.fail(f"{f}.op", f"is {op!r}, not a step this loader knows")
            args = self.values(st, "args", f"{f}.args", len(types))
            out = self.get(st, "out", list, f"{f}.out")
            if out != list(range(len(types), len(types) + len(out))):
                self.fail(f"{f}.out", f"is {out}, not the next values ({len(types)}, ...)")
            if op == "kernel":
                pr = programs[self.count(st, "program", f"{f}.program", below=len(programs))]
                takes = [(q["dtype"], q["shape"]) for q in pr["params"] if q["role"] in ("prefetch", "input")]
                gives = [(q["dtype"], q["shape"]) for q in pr["params"] if q["role"] == "output"]
                if [types[a] for a in args] != takes:
                    self.fail(f"{f}.args", f"are {[types[a] for a in args]}, its program takes {takes}")
                if len(out) != len(gives):
                    self.fail(f"{f}.out", f"names {len(out)} values, its program gives {len(gives)}")
                types += gives
            else:
                self.shape(st, f)
                if op in _NAMED and self.get(st, "name", str, f"{f}.name") not in _NAMED[op]:
                    self.fail(f"{f}.name", f"is {st['name']!r}, not a {op} op this loader knows")
                if len(out) != 1:
                    self.fail(f"{f}.out", f"names {len(out)} values, a {op} step gives one")
                types.append((st["dtype"], st["shape"]))
        outputs = self.values(d, "outputs", "outputs", len(types))
        return [types[o] for o in outputs]


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
        self.output_types = _Shape(p).program(d)
        self.path = p
        self.inputs: list[dict[str, Any]] = d["inputs"]
        self.programs: list[dict[str, Any]] = d["programs"]
        for i, program in enumerate(self.programs):
            program["_file"], program["_index"] = p, i
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
            return _launch(program, a, device)
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
        shape = _Shape(d / "manifest.json")
        self.name: str = shape.get(man, "kernel", str, "kernel")
        for key in ("inputs", "outputs"):
            for i, e in enumerate(shape.get(man, key, list, key)):
                shape.shape(e, f"{key}[{i}]")
        self.manifest = man
        self.forward = Steps(d / "triton.json")
        for key, have in (("inputs", [(e["dtype"], e["shape"]) for e in self.forward.free_inputs()]),
                          ("outputs", self.forward.output_types)):
            said = [(e["dtype"], e["shape"]) for e in man[key]]
            if said != have:
                shape.fail(key, f"are {said}, its triton.json's are {have}")
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
        self._check(tensors)
        return tuple(self._op(list(tensors)))

    def _check(self, tensors: tuple[Any, ...]) -> None:
        """The call's tensors against the manifest's inputs: their count,
        each one's type, dtype and shape, one device for all, and not the
        `meta` device (it holds no data). Non-contiguous tensors are taken
        (the kernel gets a contiguous copy). Raises CallError naming the
        argument and what it takes."""
        want = self.manifest["inputs"]
        names = [str(w.get("name", i)) for i, w in enumerate(want)]
        if len(tensors) != len(want):
            raise CallError(
                f"{self.name}: takes {len(want)} tensors ({', '.join(names) or 'none'}), got {len(tensors)}")
        first: torch.device | None = None
        for i, (t, w, name) in enumerate(zip(tensors, want, names)):
            arg = f"{self.name}: argument {i} (`{name}`)"
            if not isinstance(t, torch.Tensor):
                raise CallError(f"{arg} is a {type(t).__name__}, not a torch.Tensor")
            if t.device.type == "meta":
                raise CallError(f"{arg} is on the meta device, which holds no data; pass a CPU or GPU tensor")
            dtype, shape = _torch_dtype(w["dtype"]), tuple(w["shape"])
            if t.dtype != dtype or tuple(t.shape) != shape:
                raise CallError(f"{arg} takes {w['dtype']}{list(shape)}, got {t.dtype}{list(t.shape)}")
            if first is None:
                first = t.device
            elif t.device != first:
                raise CallError(f"{arg} is on {t.device}, argument 0 on {first}; pass every tensor on one device")

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
        device = xs[0].device if xs else torch.device("cpu")
        return [torch.empty(tuple(o["shape"]), dtype=_torch_dtype(o["dtype"]), device=device) for o in outs]

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
