"""Objects with `__cuda_array_interface__` as typed views of their memory.

The interface dict is checked as mpi4py checks it (data, typestr and shape are required;
native or no byte order; no mask; a non-negative size; C or Fortran contiguous; writable when
written; a `descr` other than the typestr's is ignored with a RuntimeWarning). The memory is
the device's when CUDA knows the pointer; otherwise (no CUDA in this process, or host memory
described this way) it is host memory, used in place.
"""
import sys
import warnings

import numpy as np

from .dlpack import _contiguous, _Holder

_KINDS = {("b", 1): "?", ("i", 1): "b", ("i", 2): "h", ("i", 4): "i", ("i", 8): "l", ("u", 1): "B",
          ("u", 2): "H", ("u", 4): "I", ("u", 8): "L", ("f", 2): "e", ("f", 4): "f", ("f", 8): "d",
          ("f", 16): "g", ("c", 8): "F", ("c", 16): "D", ("c", 32): "G"}
_NATIVE = "<" if sys.byteorder == "little" else ">"


class Interface:
    __slots__ = ("address", "nbytes", "format", "readonly")


def read(obj, writable):
    """The checked Interface of obj.__cuda_array_interface__."""
    cai = obj.__cuda_array_interface__
    if not isinstance(cai, dict):
        raise TypeError(f"__cuda_array_interface__ is a {type(cai).__name__}, not a dict")
    data, typestr, shape = cai["data"], cai["typestr"], cai["shape"]
    strides, descr, mask = cai.get("strides"), cai.get("descr"), cai.get("mask")
    if not isinstance(data, tuple):
        raise TypeError(f"__cuda_array_interface__['data'] is a {type(data).__name__}, not a tuple")
    if len(data) != 2:
        raise ValueError(f"__cuda_array_interface__['data'] has {len(data)} items, not (pointer, read-only)")
    pointer, readonly = data
    if not isinstance(typestr, str):
        raise TypeError(f"__cuda_array_interface__['typestr'] is a {type(typestr).__name__}, not a str")
    if not isinstance(shape, tuple):
        raise TypeError(f"__cuda_array_interface__['shape'] is a {type(shape).__name__}, not a tuple")
    if strides is not None and not isinstance(strides, tuple):
        raise TypeError(f"__cuda_array_interface__['strides'] is a {type(strides).__name__}, not a tuple")
    if descr is not None and not isinstance(descr, list):
        raise TypeError(f"__cuda_array_interface__['descr'] is a {type(descr).__name__}, not a list")
    size = 1
    for n in shape:
        size *= int(n)
    if pointer is None and size == 0:
        pointer = 0
    order, kind, itemsize = typestr[:1], typestr[1:2], int(typestr[2:])
    if order in "<>" and order != _NATIVE:
        raise BufferError(f"__cuda_array_interface__: typestr {typestr!r} is not in this machine's byte order")
    if order not in "<>|":
        raise BufferError(f"__cuda_array_interface__: typestr {typestr!r} has no known byte order")
    if mask is not None:
        raise BufferError("__cuda_array_interface__: masked arrays are not supported")
    if size < 0:
        raise BufferError(f"__cuda_array_interface__: negative size (shape {shape})")
    if strides is not None:
        if not (_contiguous(list(shape), strides, "C", itemsize) or _contiguous(list(shape), strides, "F", itemsize)):
            raise BufferError(f"__cuda_array_interface__: not contiguous (shape {shape}, strides {strides})")
    if readonly and writable:
        raise BufferError("__cuda_array_interface__: the buffer is read-only")
    if descr is not None and (len(descr) != 1 or tuple(descr[0]) != ("", typestr)):
        warnings.warn("__cuda_array_interface__: ignoring 'descr' key", RuntimeWarning, stacklevel=3)
    out = Interface()
    out.address, out.nbytes, out.readonly = int(pointer), size * itemsize, bool(readonly)
    out.format = _KINDS.get((kind, itemsize), "B")
    return out


def as_array(obj, writable=False):
    """A NumPy array over the (host) memory an interface describes."""
    i = read(obj, writable)
    dt = np.dtype(i.format) if i.format != "B" else np.dtype(np.uint8)
    n = i.nbytes // dt.itemsize
    interface = {"version": 3, "shape": (n,), "typestr": dt.str, "strides": None,
                 "data": (i.address if n else 0, i.readonly)}
    return np.asarray(_Holder(interface, obj))
