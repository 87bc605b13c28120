"""Tessera's side of Triton: compiles Tessera's Triton programs for GPU
targets and runs them under Triton's interpreter on the CPU.

Run by the Tessera runtime in a child process, with the Python of the
Triton installation that `.ci/setup.sh` makes (Triton 3.9.0, NumPy):

    runner.py serve            requests on stdin, answers on stdout (below)
    runner.py compile          one compile request on stdin, its report on stdout

A request is one line of JSON, then the bytes it announces; an answer is
one line of JSON, then the bytes it announces. `serve` answers `run`
requests until its input ends.

run:     {"op": "run", "source", "function", "grid": [x, y, z],
          "params": [{"name", "dtype", "shape", "bytes", "alias"}]}
         then each param's bytes (none for one that aliases an earlier
         param: it is that buffer). Answer: {"ok": true, "sizes": [..]}
         then every param's bytes after the run, or {"ok": false, "error",
         "loc"}.
compile: {"op": "compile", "jobs": [{"source", "function", "signature":
          {name: type}, "targets": [[backend, arch, warp_size, name, max_shared]],
          "num_warps", "num_stages", "fit": bool, "keep": dir or null}]}.
         With "fit", a target's compile takes fewer stages until the
         program fits its shared memory, and more warps when ptxas runs
         out of registers. Answer: one JSON line per job and
         target, in order, naming its job.

The interpreter is Triton's own (`TRITON_INTERPRET=1`); what this file adds
is the glue a non-PyTorch caller needs, each piece the meaning of the same
program, not a different one:

* Triton's interpreter takes PyTorch tensors; `HostArray` gives it a NumPy
  array through the three methods it calls (the data pointer, the storage,
  the dtype's name).
* `patch_interpreter` (interpreter.py, run before this file): where the
  interpreter's meaning of an op is not the GPU's (bf16 dots and
  rounding, libdevice, NaN-propagating max/min).
"""

import hashlib
import json
import linecache
import os
import re
import sys
import time
import traceback

INTERPRET = len(sys.argv) > 1 and sys.argv[1] == "serve"
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import numpy as np  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LOC = re.compile(r"#\s*(\S+:\d+:\d+)\s*$")
REPORT = "tessera-report "
PROGRAMS = {}


def program(source, function):
    """The `@triton.jit` function `function` of `source`, executed once
    per source (cached by its hash) as a module whose lines inspect and
    tracebacks can read."""
    key = hashlib.sha256(source.encode()).hexdigest()[:16]
    if key not in PROGRAMS:
        filename = f"<tessera:{function}:{key}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        module = {"__name__": f"tessera_{key}"}
        exec(compile(source, filename, "exec"), module)
        PROGRAMS[key] = (filename, module)
    filename, module = PROGRAMS[key]
    return filename, module[function]


def rust_loc(filename, lineno):
    """The Rust location a program line names, if any."""
    lines = linecache.getlines(filename)
    if lineno and 0 < lineno <= len(lines):
        m = LOC.search(lines[lineno - 1].rstrip("\n"))
        if m:
            return m.group(1)
    return None


def error_loc(exc, filename):
    """The Rust location of the program line an exception came from."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename == filename:
            return rust_loc(filename, frame.lineno)
    lineno = getattr(exc, "lineno", None)
    node = getattr(exc, "node", None)
    if lineno is None and node is not None:
        lineno = getattr(node, "lineno", None)
    # Triton's CompilationError numbers lines within the function it was
    # compiling (`node.lineno` in `src`): find that line in the program.
    src = getattr(exc, "src", None)
    if src is not None and node is not None and getattr(node, "lineno", None):
        wanted = src.split("\n")[node.lineno - 1:node.lineno]
        for n, text in enumerate(linecache.getlines(filename), start=1):
            if wanted and text.rstrip("\n") == wanted[0]:
                return rust_loc(filename, n)
        return None
    if lineno is not None:
        return rust_loc(filename, lineno)
    return None


# ---- the interpreter's glue ----

NP_DTYPES = {
    "float32": np.float32,
    "bfloat16": np.uint16,
    "float16": np.float16,
    "int32": np.int32,
    "int8": np.int8,
    "bool": np.bool_,
    "float8_e4m3fn": np.uint8,
    "float8_e5m2": np.uint8,
}


class DTypeName:
    """What Triton reads of a torch dtype: its name after `torch.`."""

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return "torch." + self.name


# One object per dtype, alive for the process: Triton's argument
# specialization caches what it read of a dtype object by its identity, so a
# fresh object per array (whose identity Python reuses once it is freed)
# would give one array another's dtype.
DTYPE_NAMES = {name: DTypeName(name) for name in NP_DTYPES}


class HostArray:
    """A NumPy array as Triton's interpreter sees a tensor on the host."""

    def __init__(self, array, dtype):
        self.array = array
        self.dtype = DTYPE_NAMES[dtype]

    def data_ptr(self):
        return self.array.ctypes.data

    def untyped_storage(self):
        return self

    def cpu(self):
        return self

    def new_empty(self, *args, **kwargs):
        return self

    def set_(self, *args):
        return self

    def storage_offset(self):
        return 0

    def size(self):
        return self.array.shape

    def stride(self):
        return tuple(s // self.array.itemsize for s in self.array.strides)

    def copy_(self, other):
        return self


def read_exact(stream, n):
    data = stream.read(n)
    if len(data) != n:
        raise EOFError(f"expected {n} bytes, got {len(data)}")
    return data


def run(request, stdin):
    filename, fn = program(request["source"], request["function"])
    arrays = []
    for p in request["params"]:
        if p.get("alias") is not None:
            arrays.append(arrays[p["alias"]])
            continue
        raw = read_exact(stdin, p["bytes"])
        a = np.frombuffer(raw, dtype=NP_DTYPES[p["dtype"]]).copy()
        arrays.append(HostArray(a, p["dtype"]))
    grid = tuple(request["grid"])
    try:
        with np.errstate(all="ignore"):
            fn[grid](*arrays)
    except Exception as e:  # noqa: BLE001 - every failure is an answer
        cause = e.__cause__ or e
        loc = error_loc(cause, filename) or error_loc(e, filename)
        return {"ok": False, "error": f"{type(cause).__name__}: {cause}", "loc": loc}, []
    out = [a.array.tobytes() for a in arrays]
    return {"ok": True, "sizes": [len(b) for b in out]}, out


def serve():
    patch_interpreter()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        line = stdin.readline()
        if not line:
            return
        request = json.loads(line)
        try:
            answer, payload = run(request, stdin)
        except EOFError:
            return
        stdout.write(json.dumps(answer).encode() + b"\n")
        for b in payload:
            stdout.write(b)
        stdout.flush()


# ---- the compiler ----

NVIDIA_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def nvidia_stats(cubin, keep):
    """Registers, spills, shared memory and tensor-core instructions of a
    cubin, read with the CUDA tools Triton ships (no GPU needed)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        usage = subprocess.run([os.path.join(NVIDIA_BIN, "cuobjdump"), "-res-usage", path],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([os.path.join(NVIDIA_BIN, "cuobjdump"), "-sass", path],
                              capture_output=True, text=True, check=True).stdout
    if keep:
        with open(os.path.join(keep, "kernel.sass"), "w") as f:
            f.write(sass)
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    regs, stack, shared, local = (int(x) for x in m.groups()) if m else (0, 0, 0, 0)
    # Hopper's warpgroup MMAs: HGMMA (f16/bf16/tf32), QGMMA (fp8), IGMMA (int8).
    hgmma = len(re.findall(r"\b[HQI]GMMA\.", sass))
    hmma = len(re.findall(r"\bHMMA\.", sass))
    imma = len(re.findall(r"\bIMMA\.", sass))
    tc_sm100 = len(re.findall(r"\bUTC[A-Z]*MMA", sass))
    return {
        "registers": regs,
        # Spilled registers live in the stack frame (local memory).
        "spill_bytes": max(stack, local),
        "stack_bytes": stack,
        "static_shared": shared,
        "tensor_core": {"HGMMA": hgmma, "HMMA": hmma, "IMMA": imma, "UTCMMA": tc_sm100},
        "instructions": len(re.findall(r"^\s+/\*[0-9a-f]{4}\*/", sass, re.M)),
    }


def amd_stats(amdgcn):
    """VGPRs, SGPRs, spills, LDS and MFMA instructions of an AMD kernel."""
    def meta(key):
        m = re.search(r"\." + key + r":\s+(\d+)", amdgcn)
        return int(m.group(1)) if m else 0

    return {
        "registers": meta("vgpr_count"),
        "sgprs": meta("sgpr_count"),
        "spill_bytes": meta("vgpr_spill_count") * 4 + meta("sgpr_spill_count") * 4,
        "stack_bytes": meta("private_segment_fixed_size"),
        "static_shared": meta("group_segment_fixed_size"),
        "tensor_core": {"MFMA": len(re.findall(r"^\s+v_mfma", amdgcn, re.M))},
        "instructions": len(re.findall(r"^\s+[sv]_[a-z0-9_]+", amdgcn, re.M)),
    }


def ttir_only(src, gpu, options):
    # Triton's front end and its TTIR passes only (what XLA's Triton custom
    # call compiles), the steps triton.compile starts with.
    from triton._C.libtriton import ir
    from triton.compiler.compiler import make_backend

    backend = make_backend(gpu)
    options = backend.parse_options(dict(options, **src.parse_options()))
    stages = {}
    backend.add_stages(stages, options, src.language)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(gpu, options, backend.get_codegen_implementation(options),
                         backend.get_module_map(), context)
    return str(stages["ttir"](module, {}))


def compile_one(request, target):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    backend, arch, warp, name, max_shared = target
    filename, fn = program(request["source"], request["function"])
    # f32 dots on tensor cores at f32's precision (the program's F32_DOT).
    fn.fn.__globals__["F32_DOT"] = tl.constexpr("tf32x3" if backend == "cuda" else "ieee")
    signature = request["signature"]
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(signature.values()) if t.startswith("*")}
    src = ASTSource(fn=fn, signature=signature, constexprs={}, attrs=attrs)
    gpu = GPUTarget(backend, int(arch) if backend == "cuda" else arch, warp)
    stages, warps = request["num_stages"], request["num_warps"]
    if request.get("ttir_only"):
        try:
            text = ttir_only(src, gpu, {"num_warps": warps, "num_stages": stages})
        except Exception as e:  # noqa: BLE001 - every failure is a report
            return {"target": name, "ok": False, "error": f"{type(e).__name__}: {e}",
                    "loc": error_loc(e, filename)}
        return {"target": name, "ok": True, "ttir": text}
    start = time.perf_counter()
    while True:
        options = {"num_warps": warps, "num_stages": stages}
        try:
            compiled = triton.compile(src, target=gpu, options=options)
        except Exception as e:  # noqa: BLE001 - every failure is a report
            # With "fit", twice the warps when ptxas runs out of registers
            # (each thread then holds half as much of every tile).
            if request.get("fit") and "Register allocation failed" in str(e) and warps < 8:
                warps *= 2
                continue
            return {"target": name, "ok": False, "error": f"{type(e).__name__}: {e}",
                    "loc": error_loc(e, filename)}
        # With "fit", fewer pipeline stages until the buffers fit the
        # target's shared memory (a program over it cannot launch).
        shared = compiled.metadata.shared
        if not request.get("fit") or shared <= max_shared or stages == 1:
            break
        # Shared memory grows about linearly with the stages: jump to the
        # count that should fit (one compile, not one per stage dropped).
        stages = max(1, min(stages - 1, stages * max_shared // shared))
    seconds = time.perf_counter() - start
    asm = compiled.asm
    keep = request.get("keep")
    if keep:
        keep = os.path.join(keep, name)
        os.makedirs(keep, exist_ok=True)
        for kind, text in asm.items():
            mode = "wb" if isinstance(text, bytes) else "w"
            with open(os.path.join(keep, f"kernel.{kind}"), mode) as f:
                f.write(text)
    if backend == "cuda":
        stats = nvidia_stats(asm["cubin"], keep)
        code = len(asm["cubin"])
    else:
        stats = amd_stats(asm["amdgcn"])
        code = len(asm["hsaco"])
    report = {"target": name, "ok": True, "seconds": seconds, "code_bytes": code,
              "shared": compiled.metadata.shared, "stages": stages, "warps": warps}
    report.update(stats)
    return report


def compile_main():
    request = json.loads(sys.stdin.buffer.readline())
    for n, job in enumerate(request["jobs"]):
        for target in job["targets"]:
            report = compile_one(job, target)
            report["job"] = n
            # Marked: Triton and its tools may print lines of their own.
            sys.stdout.write(REPORT + json.dumps(report) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    if INTERPRET:
        serve()
    elif len(sys.argv) > 1 and sys.argv[1] == "compile":
        compile_main()
    else:
        sys.stderr.write(__doc__)
        sys.exit(2)
