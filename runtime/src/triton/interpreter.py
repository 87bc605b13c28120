"""Where Triton's interpreter does not compute what a GPU computes for a
Tessera program, the GPU's meaning: run before Triton's interpreter runs
a Tessera program, by the Tessera runtime's Triton child (runner.py, which
this file precedes) and by `tessera_torch` on CPU tensors (the package's
`_interpreter.py` is this file). Imports inside the function: the caller
sets TRITON_INTERPRET before Triton is imported.

* The interpreter stores bf16 as its bits and multiplies those bits in
  `tl.dot`; `create_dot` below widens bf16 operands to f32 first (exact),
  which is what the tensor cores compute.
* The interpreter rounds f32 to bf16 by truncation; `.to(tl.bfloat16)`
  means rounding to nearest even (what the GPU does), so `cast_impl`
  below rounds so.
* The interpreter has no libdevice; the three libdevice functions Tessera
  programs call (`tanh`, `log1p`, `pow`, on f32) are given NumPy's.
* A reduction with Tessera's NaN-propagating max/min runs through the
  interpreter's element-by-element loop (seconds per block); it is handed
  to NumPy's `max`/`min` (which propagate NaN, the helpers' meaning).

Patches Triton's interpreter classes for the whole process, once.
"""

_PATCHED = []


def patch_interpreter():
    """Patches Triton's interpreter (see the module docs); idempotent."""
    if _PATCHED:
        return
    _PATCHED.append(True)
    import numpy as np
    import triton.language as tl
    from triton.language.extra import libdevice
    from triton.runtime import interpreter as ti

    def as_f32(h):
        if h.dtype.scalar == tl.bfloat16:
            return ti.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
        return h

    dot = ti.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return dot(self, as_f32(a), as_f32(b), d, input_precision, max_num_imprecise_acc)

    ti.InterpreterBuilder.create_dot = create_dot

    cast = ti.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = src.data.astype(np.float32).view(np.uint32)
            rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
            nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
            out = np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x40), rounded).astype(np.uint16)
            return ti.TensorHandle(out, dst_type.scalar)
        return cast(self, src, dst_type)

    ti.InterpreterBuilder.cast_impl = cast_impl

    def numpy_fn(f):
        def call(*args, **kwargs):
            data = [a.handle.data for a in args]
            with np.errstate(all="ignore"):
                out = f(*data).astype(data[0].dtype)
            return tl.core.tensor(ti.TensorHandle(out, args[0].handle.dtype.scalar), args[0].type)
        return call

    libdevice.tanh = numpy_fn(np.tanh)
    libdevice.log1p = numpy_fn(np.log1p)
    libdevice.pow = numpy_fn(np.power)

    reduce = ti.ReduceOps.apply_impl

    def apply_impl(self, input):
        name = getattr(getattr(self.combine_fn, "fn", None), "__name__", "")
        if name in ("_tsr_max", "_tsr_min"):
            f = np.max if name == "_tsr_max" else np.min
            return self.min_max(input[0], val_reduce_op=f)
        return reduce(self, input)

    ti.ReduceOps.apply_impl = apply_impl
