"""CPU DLPack tensors (`__dlpack__`) as NumPy arrays over their memory.

The capsule is read with ctypes and released at once (its deleter called, as a DLPack consumer
must), while the array keeps the producer's object alive: the memory is the object's. This is
what mpi4py does, and unlike np.from_dlpack it holds nothing of the capsule after the call (a
producer may free its tensor description when the capsule goes). Legacy capsules carry no
read-only flag: their memory is taken as writable, as mpi4py takes it.
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


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


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
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_READ_ONLY = 1
# The names must outlive the capsules they are given to.
_USED, _USED_VERSIONED = ctypes.c_char_p(b"used_dltensor"), ctypes.c_char_p(b"used_dltensor_versioned")


class _Holder:
    def __init__(self, interface, keep):
        self.__array_interface__ = interface
        self.keep = keep


def _typestr(dt):
    code, bits, lanes = dt.code, dt.bits, dt.lanes
    if lanes == 2 and code == 2:  # two floats: a complex number (long double complex, as mpi4py's tests make it)
        return f"<c{bits * 2 // 8}"
    if lanes != 1:
        raise TypeError(f"DLPack tensors with {lanes} lanes are not supported")
    kind = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}.get(code)
    if kind is None:
        raise TypeError(f"DLPack dtype code {code} has no NumPy equivalent")
    return f"<{kind}{bits // 8}" if kind != "b" else "|b1"


def _capsule(obj):
    try:
        return obj.__dlpack__(max_version=(1, 0))
    except TypeError:
        return obj.__dlpack__()


def as_array(obj):
    """A NumPy array over the memory of obj, a tensor on the CPU with __dlpack__."""
    capsule = _capsule(obj)
    if _api.PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        managed = _ManagedVersioned.from_address(_api.PyCapsule_GetPointer(capsule, b"dltensor_versioned"))
        readonly, used = bool(managed.flags & _READ_ONLY), _USED_VERSIONED
    elif _api.PyCapsule_IsValid(capsule, b"dltensor"):
        managed = _Managed.from_address(_api.PyCapsule_GetPointer(capsule, b"dltensor"))
        readonly, used = False, _USED
    else:
        raise TypeError(f"{type(obj).__name__}.__dlpack__() did not return a DLPack capsule")
    t = managed.dl_tensor
    if t.device.device_type != 1:
        raise TypeError("the DLPack tensor is not in CPU memory")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    typestr = _typestr(t.dtype)
    itemsize = int(typestr[2:])
    strides = None if not t.strides else tuple(t.strides[i] * itemsize for i in range(t.ndim))
    data = (t.data or 0) + t.byte_offset
    interface = {"version": 3, "shape": shape, "typestr": typestr, "strides": strides,
                 "data": (data if data or not all(shape) else 0, readonly)}
    if not int(np.prod(shape)):
        interface["data"] = (0, readonly) if not data else interface["data"]
    arr = np.asarray(_Holder(interface, obj))
    _api.PyCapsule_SetName(capsule, used)  # consumed: the capsule's own destructor leaves it alone
    if managed.deleter:
        _Deleter(managed.deleter)(ctypes.addressof(managed))
    return arr
