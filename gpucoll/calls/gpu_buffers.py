"""GPU buffer adapters: CuPy arrays, torch CUDA tensors, `__cuda_array_interface__`, `__dlpack__`.

`maybe_gpu_buffer(obj)` returns a GpuBuffer (device pointer, element count, dtype code,
device, the object) for GPU objects and None for everything else; host buffers pay one
type lookup. Contiguous buffers only, in C or Fortran order (the elements in memory order).
"""
import numpy as np

from ..base import dtypes
from ..base.errors import InvalidUsageError

_TORCH_CODES = None


class GpuBuffer:
    """A contiguous buffer in GPU memory; `obj` keeps the caller's object alive."""

    __slots__ = ("addr", "count", "code", "itemsize", "device", "obj", "kind")
    is_gpu = True

    def __init__(self, addr, count, code, device, obj, kind):
        self.addr, self.count, self.code, self.device, self.obj, self.kind = addr, count, code, device, obj, kind
        self.itemsize = dtypes.ITEMSIZE[code]

    @property
    def nbytes(self):
        return self.count * self.itemsize

    def __repr__(self):
        return f"GpuBuffer({self.kind}, device {self.device}, {self.count} x {dtypes.name(self.code)})"


_HAVE_CUPY = False


def _require_cupy(what):
    global _HAVE_CUPY
    if _HAVE_CUPY:
        return
    try:
        import cupy  # noqa: F401
    except ImportError:
        raise NotImplementedError(
            f"{what} is a GPU array; GPU buffers need CuPy for the kernels (install gpucoll[cuda12] or "
            "gpucoll[cuda13] on a machine with a GPU)") from None
    _HAVE_CUPY = True


_CODES = {}  # dtype -> code (numpy computes dtype names slowly; this is the hot path)


def _code(dtype, what):
    code = _CODES.get(dtype)
    if code is not None:
        return code
    try:
        code = _CODES[dtype] = dtypes.code_of(dtype)
        return code
    except InvalidUsageError:
        raise InvalidUsageError(f"{what} has dtype {dtype}, which gpucoll does not reduce or move; use one of: "
                                f"{', '.join(dtypes.NAMES)}") from None


def _dense(shape, strides, unit):
    """True when `strides` (in multiples of `unit`) are those of a C- or Fortran-ordered
    array of `shape`; dimensions of extent 1 have no say."""
    dims = [(d, s) for d, s in zip(shape, strides) if d > 1]
    for order in (dims[::-1], dims):  # C: the last dimension varies fastest; Fortran: the first
        step = unit
        for d, s in order:
            if s != step:
                break
            step *= d
        else:
            return True
    return False


def _noncontiguous(what, shape):
    return InvalidUsageError(f"{what} is not contiguous (shape {tuple(shape)}); pass a contiguous copy "
                             "(x.copy() / x.contiguous()) or a contiguous slice")


def _from_cupy(obj, what):
    if not (obj._c_contiguous or obj._f_contiguous):  # obj.flags builds objects on every access
        raise _noncontiguous(what, obj.shape)
    data = obj.data
    return GpuBuffer(data.ptr, obj.size, _code(obj.dtype, what), data.device_id, obj, "cupy")


def _torch_code(dtype, what):
    global _TORCH_CODES
    if _TORCH_CODES is None:
        import torch

        table = {torch.bfloat16: dtypes.BFLOAT16}
        for name in dtypes.NAMES:
            t = getattr(torch, name, None)
            if isinstance(t, torch.dtype) and t not in table:
                table[t] = dtypes.code_of(name)
        _TORCH_CODES = table
    code = _TORCH_CODES.get(dtype)
    if code is None:
        raise InvalidUsageError(f"{what} has dtype {dtype}, which gpucoll does not reduce or move")
    return code


def _from_torch(obj, what):
    if not obj.is_cuda:
        return None  # a CPU tensor: the host path decides
    if not obj.is_contiguous() and not _dense(obj.shape, obj.stride(), 1):
        raise _noncontiguous(what, obj.shape)
    return GpuBuffer(obj.data_ptr(), obj.numel(), _torch_code(obj.dtype, what), obj.device.index, obj, "torch")


def _from_cai(obj, what):
    cai = obj.__cuda_array_interface__
    shape = tuple(cai["shape"])
    dt = np.dtype(cai["typestr"])
    count = int(np.prod(shape)) if shape else 1
    strides = cai.get("strides")
    if strides is not None and count > 1 and not _dense(shape, strides, dt.itemsize):
        raise _noncontiguous(what, shape)
    ptr = int(cai["data"][0])
    from .._native import cuda

    device = cuda.pointer_device(ptr) if ptr else 0
    return GpuBuffer(ptr, count, _code(dt, what), device, obj, "cai")


def _from_dlpack(obj, what):
    import cupy

    arr = cupy.from_dlpack(obj)
    buf = _from_cupy(arr, what)
    buf.kind = "dlpack"
    buf.obj = (obj, arr)
    return buf


def _dlpack_on_gpu(obj):
    try:
        return obj.__dlpack_device__()[0] in (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
    except Exception:
        return False


def _adapter(t):
    """The adapter for objects of type t, or None when they are never GPU buffers."""
    mod = getattr(t, "__module__", "") or ""
    if mod.startswith("cupy"):
        return _from_cupy
    if mod.startswith("torch"):
        return _from_torch
    if hasattr(t, "__cuda_array_interface__"):
        return _from_cai
    if hasattr(t, "__dlpack_device__"):
        return _from_dlpack
    return None


_ADAPTERS = {t: None for t in (np.ndarray, bytes, bytearray, memoryview, list, tuple)}


def maybe_gpu_buffer(obj, what="buffer"):
    """GpuBuffer for a GPU object, None for anything else (host buffers, specs)."""
    t = type(obj)
    try:
        adapt = _ADAPTERS[t]
    except KeyError:
        adapt = _ADAPTERS[t] = _adapter(t)
    if (adapt is None or (adapt is _from_torch and not obj.is_cuda)
            or (adapt is _from_dlpack and not _dlpack_on_gpu(obj))):
        return None  # host memory (a CPU tensor, a CPU DLPack producer): the host path decides
    _require_cupy(what)
    return adapt(obj, what)
