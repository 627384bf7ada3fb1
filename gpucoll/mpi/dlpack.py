"""DLPack tensors (`__dlpack__`) as typed views of their memory.

The capsule is read with ctypes and kept alive by the view for as long as the view lives (its
own destructor then calls the producer's deleter); the memory is the producer's object's. This
is how mpi4py uses DLPack buffers: a capsule may be used again, and nothing is freed while an
operation still uses the memory. The tensor is checked as mpi4py checks it: a valid capsule of
the version asked for, a non-negative shape and strides, C or Fortran contiguous, writable when
written. Unknown element types are moved as bytes.
"""
import ctypes

import numpy as np


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_READ_ONLY = 1
kDLCPU, kDLCUDA = 1, 2
_FORMATS = {(0, 8): "b", (0, 16): "h", (0, 32): "i", (0, 64): "l", (1, 8): "B", (1, 16): "H", (1, 32): "I",
            (1, 64): "L", (2, 16): "e", (2, 32): "f", (2, 64): "d", (2, 128): "g", (5, 64): "F", (5, 128): "D",
            (5, 256): "G", (6, 8): "?"}


class _Holder:
    """An __array_interface__ whose memory other objects own (kept alive in `keep`)."""

    def __init__(self, interface, keep):
        self.__array_interface__ = interface
        self.keep = keep


def device_of(obj):
    """(device type, device id) from __dlpack_device__, checked as mpi4py checks it."""
    device = obj.__dlpack_device__()
    if not isinstance(device, tuple):
        raise TypeError(f"__dlpack_device__() returned {type(device).__name__}, not a tuple")
    kind, ident = device  # ValueError for a tuple of another length
    if not isinstance(kind, int) or not isinstance(ident, int):
        raise TypeError(f"__dlpack_device__() returned {device!r}: expecting two integers")
    return kind, ident


def _capsule(obj, kind):
    try:
        if kind == kDLCPU:
            return obj.__dlpack__(max_version=(1, 0), copy=False), 1
        return obj.__dlpack__(stream=-1, max_version=(1, 0), copy=False), 1
    except TypeError:
        return (obj.__dlpack__() if kind == kDLCPU else obj.__dlpack__(stream=-1)), 0


def _contiguous(shape, strides, order, unit=1):
    """Whether strides (in units: 1 for elements, the item size for bytes) lay shape out densely."""
    size = unit
    dims = range(len(shape)) if order == "F" else range(len(shape) - 1, -1, -1)
    for i in dims:
        if shape[i] > 1 and strides[i] != size:
            return False
        size *= shape[i]
    return True


def _format(code, bits, lanes):
    if lanes != 1:
        if code == 2 and lanes == 2 and bits in (32, 64, 128):
            return {32: "F", 64: "D", 128: "G"}[bits]
        return "B"
    return _FORMATS.get((code, bits), "B")


class Tensor:
    """What a DLPack tensor describes: address, byte size, element format, device, read-only."""

    __slots__ = ("address", "nbytes", "format", "device", "readonly", "capsule")


def read(obj, writable):
    """The Tensor of obj's DLPack export (the capsule stays referenced by it)."""
    kind, _ = device_of(obj)
    capsule, version = _capsule(obj, kind)
    name = b"dltensor_versioned" if version else b"dltensor"
    if capsule is None or not _api.PyCapsule_IsValid(capsule, name):
        raise BufferError("dlpack: the object did not return a valid, unused DLPack capsule")
    address = _api.PyCapsule_GetPointer(capsule, name)
    if version:
        managed = _ManagedVersioned.from_address(address)
        if managed.version.major < 1:
            raise BufferError(f"dlpack: unexpected version {managed.version.major}.{managed.version.minor}")
        readonly = bool(managed.flags & _READ_ONLY)
    else:
        managed = _Managed.from_address(address)
        readonly = False
    t = managed.dl_tensor
    if t.ndim < 0:
        raise BufferError("dlpack: the number of dimensions is negative")
    if t.ndim > 0 and not t.shape:
        raise BufferError("dlpack: the shape is NULL")
    shape = [t.shape[i] for i in range(t.ndim)]
    if any(n < 0 for n in shape):
        raise BufferError(f"dlpack: negative shape {shape}")
    if t.strides:
        strides = [t.strides[i] for i in range(t.ndim)]
        if any(n < 0 for n in strides):
            raise BufferError(f"dlpack: negative strides {strides}")
        if not (_contiguous(shape, strides, "C") or _contiguous(shape, strides, "F")):
            raise BufferError(f"dlpack: the tensor is not contiguous (shape {shape}, strides {strides})")
    if readonly and writable:
        raise BufferError("dlpack: the tensor is read-only")
    out = Tensor()
    count = int(np.prod(shape)) if shape else 1
    out.address = (t.data or 0) + t.byte_offset
    out.nbytes = count * ((t.dtype.bits * t.dtype.lanes + 7) // 8)
    out.format = _format(t.dtype.code, t.dtype.bits, t.dtype.lanes)
    out.device, out.readonly, out.capsule = kind, readonly, capsule
    return out


def as_array(obj, writable=False):
    """A NumPy array over the host memory of obj's DLPack tensor (its element type's, or bytes)."""
    t = read(obj, writable)
    dt = np.dtype(t.format) if t.format != "B" else np.dtype(np.uint8)
    n = t.nbytes // dt.itemsize if dt.itemsize else 0
    interface = {"version": 3, "shape": (n,), "typestr": dt.str, "strides": None,
                 "data": (t.address if n else 0, t.readonly)}
    return np.asarray(_Holder(interface, (obj, t.capsule)))
