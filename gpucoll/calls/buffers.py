"""Turn what the caller passed into (address, element count, dtype code).

Accepted: NumPy arrays, anything with the Python buffer protocol (bytearray, mmap,
array.array, memoryview), host objects with `__dlpack__` (torch CPU tensors, JAX arrays),
and mpi4py's buffer specifications `[buf, MPI.DOUBLE]`, `[buf, count, MPI.BYTE]`. Arrays on
a GPU (`__cuda_array_interface__`, `__dlpack__`) are recognised and routed to the GPU path.
"""
import numpy as np

from .._native.core import address_of
from ..base import dtypes
from ..base.call import HostBuffer  # noqa: F401 - also gpucoll.calls.buffers.HostBuffer
from ..base.errors import InvalidUsageError
from .gpu_buffers import maybe_gpu_buffer

_CODES = dtypes.CODES


class Datatype:
    """An element type named in a buffer specification (mpi4py's MPI.DOUBLE and friends)."""

    __slots__ = ("name", "code", "np")

    def __init__(self, name):
        self.name = name
        self.code = dtypes.code_of(name) if name != "bfloat16" else dtypes.BFLOAT16
        self.np = dtypes.numpy_dtype(self.code)

    def Get_size(self):
        return self.np.itemsize

    size = property(Get_size)

    def __repr__(self):
        return f"Datatype({self.name})"


def _host(array, code):
    return HostBuffer(array, code, address_of(array) if array.size else 0)


def _is_gpu_object(obj):
    if hasattr(obj, "__cuda_array_interface__"):
        return True
    dl = getattr(obj, "__dlpack_device__", None)
    if dl is not None and not isinstance(obj, np.ndarray):
        try:
            return dl()[0] in (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
        except Exception:
            return False
    return False


def _as_array(obj, what):
    if isinstance(obj, np.ndarray):
        return obj
    try:
        return np.asarray(memoryview(obj))
    except TypeError:
        pass
    if _is_gpu_object(obj):
        raise NotImplementedError(
            f"{what} is a GPU array; GPU buffers need the CUDA path (install gpucoll[cuda12] or "
            "[cuda13] on a machine with a GPU)")
    if hasattr(obj, "__dlpack__"):  # host memory shared through DLPack: results land in the caller's object
        try:
            return np.from_dlpack(obj)
        except (TypeError, ValueError, BufferError, RuntimeError) as exc:
            raise InvalidUsageError(f"{what} of type {type(obj).__name__} has __dlpack__, but NumPy cannot read "
                                    f"it ({exc}); pass a NumPy array") from None
    raise InvalidUsageError(
        f"{what} of type {type(obj).__name__} is not a buffer: pass a NumPy array, a bytearray or "
        "any object with the buffer protocol (or a CuPy/torch GPU array)")


def _from_spec(spec, what, blocks):
    """mpi4py's [buf, datatype] / [buf, count, datatype] forms. As in mpi4py, an explicit count
    is per block: the buffer holds `blocks` blocks of `count` elements (one per rank for the
    per-rank buffers of all-gather, all-to-all, gather, scatter and reduce-scatter)."""
    if len(spec) == 2:
        obj, datatype = spec
        count = None
    elif len(spec) == 3:
        obj, count, datatype = spec
        if isinstance(count, (tuple, list)):
            raise NotImplementedError(f"{what}: (count, displacement) buffer specifications are not supported")
    else:
        raise InvalidUsageError(f"{what}: a buffer specification is [buf, datatype] or [buf, count, datatype]")
    datatype = getattr(datatype, "core_datatype", None) or datatype  # gpucoll.MPI's predefined types
    if not isinstance(datatype, Datatype):
        raise InvalidUsageError(f"{what}: {datatype!r} is not a datatype such as MPI.DOUBLE")
    arr = _as_array(obj, what)
    raw = _flat(_contiguous(arr, what)).view(np.uint8)
    if raw.size % datatype.np.itemsize:
        raise InvalidUsageError(f"{what}: {raw.size} bytes is not a whole number of {datatype.name} elements")
    view = raw.view(datatype.np)
    if count is not None:
        if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 0:
            raise InvalidUsageError(f"{what}: count {count!r} must be a non-negative integer")
        total = count * blocks
        if total > view.size:
            per = f" ({count} for each of {blocks} ranks)" if blocks > 1 else ""
            raise InvalidUsageError(f"{what}: count {total}{per} exceeds the buffer's {view.size} "
                                    f"{datatype.name} elements")
        view = view[:total]
    return _host(view, datatype.code)


def _contiguous(arr, what):
    """arr, if its elements are contiguous in C or Fortran order (as mpi4py, any contiguous
    buffer is taken: the elements in memory order); else a clear error."""
    if not arr.flags.forc:
        raise InvalidUsageError(
            f"{what} is not contiguous (shape {arr.shape}, strides {arr.strides}); "
            "pass np.ascontiguousarray(x) or a contiguous slice")
    return arr


def _flat(arr):
    """The 1-D view of a contiguous array's elements in memory order (never a copy)."""
    return arr if arr.ndim == 1 else arr.reshape(-1, order="A")


def host_buffer(obj, what="buffer", writable=False, blocks=1):
    """HostBuffer for obj; raises InvalidUsageError with the reason when it cannot be used.
    blocks: how many per-rank blocks an explicit count in a buffer specification describes."""
    if type(obj) is np.ndarray:  # the common case, kept short: it is on every call's path
        flags = obj.flags
        code = _CODES.get(obj.dtype)
        if code is not None and flags.forc:
            if writable and not flags.writeable:
                raise InvalidUsageError(f"{what} is read-only; the result needs a writable buffer")
            flat = obj if obj.ndim == 1 else obj.reshape(-1, order="A")  # _flat and _host, inline
            return HostBuffer(flat, code, address_of(flat) if flat.size else 0)
    gpu = maybe_gpu_buffer(obj, what)  # GpuBuffer for CuPy/torch/CAI/DLPack GPU objects
    if gpu is not None:
        return gpu
    if isinstance(obj, (list, tuple)):
        buf = _from_spec(obj, what, blocks)
    else:
        arr = _contiguous(_as_array(obj, what), what)
        if arr.dtype.kind == "V" or arr.dtype.name not in dtypes.NAMES:
            raise InvalidUsageError(f"{what} has dtype {arr.dtype}, which gpucoll does not reduce or move; "
                                    f"use one of: {', '.join(dtypes.NAMES)}")
        buf = _host(_flat(arr), dtypes.code_of(arr.dtype))
    if writable and not buf.array.flags.writeable:
        raise InvalidUsageError(f"{what} is read-only; the result needs a writable buffer")
    return buf
