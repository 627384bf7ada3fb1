"""MPI.buffer: a typeless, contiguous view of bytes (mpi4py's buffer and memory classes).

It is a 1-D uint8 NumPy array underneath, so it has the buffer protocol on every Python
(user-defined operations get their arguments as buffers; Alloc_mem returns one), with
mpi4py's checks on top: read-only buffers refuse writes with TypeError, a slice is assigned
only from as many bytes, strided and out-of-range indices raise IndexError.
"""
import ctypes

import numpy as np


_EMPTY = object()  # buffer() with no argument: an empty buffer (buffer(None) is an error, as in mpi4py)


class buffer(np.ndarray):  # noqa: N801 - mpi4py's name
    """Bytes in memory: buffer(obj), buffer.allocate(n), buffer.frombuffer(obj), buffer.fromaddress(a, n)."""

    def __new__(cls, obj=_EMPTY):
        if obj is _EMPTY:
            return cls._make(np.zeros(0, np.uint8), None)
        if isinstance(obj, buffer):
            return cls._make(obj.view(np.ndarray), obj.obj)
        return cls.frombuffer(obj, readonly=None)

    @classmethod
    def _make(cls, raw, obj, readonly=None):
        view = raw.view(cls)
        view._obj = obj
        view._released = False
        view._device = None
        if readonly:
            view.flags.writeable = False
        return view

    def __array_finalize__(self, parent):
        self._obj = getattr(parent, "_obj", None)
        self._released = False
        self._device = None  # (address, nbytes) of device memory: no bytes to read here

    def _host(self):
        if self._device is not None:
            raise BufferError("the buffer is in device (GPU) memory: its bytes cannot be accessed here")

    @classmethod
    def wrap(cls, array):
        """A buffer over the bytes of a contiguous NumPy array (shared, not copied)."""
        return cls._make(array.reshape(-1).view(np.uint8), array)

    @classmethod
    def allocate(cls, nbytes, clear=False):
        if not isinstance(nbytes, int) or isinstance(nbytes, bool):
            raise TypeError(f"allocate: nbytes must be an int, not {type(nbytes).__name__}")
        if nbytes < 0:
            raise ValueError(f"allocate: nbytes {nbytes} is negative")
        storage = bytearray(nbytes)  # zeroed either way; `clear` is for mpi4py's signature
        mem = cls._make(np.frombuffer(storage, np.uint8), storage)
        if nbytes:
            from ..transports import lasting

            # the storage outlives `mem` (which holds it): forgotten when `mem` goes or is released
            mem._forget = lasting.note(mem, mem.address, nbytes)
        return mem

    @classmethod
    def frombuffer(cls, obj, readonly=False):
        if obj is None or isinstance(obj, (int, float, list, tuple)):
            raise TypeError(f"a {type(obj).__name__} is not a buffer")
        try:
            view = memoryview(obj)
        except TypeError:
            view = cls._device_or_dlpack(obj, readonly)
            if isinstance(view, buffer):
                return view
        if not view.contiguous:
            raise ValueError("the buffer is not contiguous")
        raw = np.frombuffer(view.cast("B") if view.nbytes else b"", np.uint8)
        ro = view.readonly if readonly is None else (readonly or view.readonly)
        if readonly is False and view.readonly:
            raise BufferError("the object's buffer is read-only")
        return cls._make(raw, obj, ro)

    @classmethod
    def _device_or_dlpack(cls, obj, readonly):
        """A buffer over a DLPack tensor or a __cuda_array_interface__ object: its host memory, or
        (device memory) an address-only buffer whose bytes cannot be read here."""
        if hasattr(obj, "__dlpack__"):
            from . import dlpack

            t = dlpack.read(obj, writable=not readonly)
            if t.device == dlpack.kDLCPU:
                return memoryview(dlpack.as_array(obj, writable=not readonly)).cast("B")
            address, nbytes, ro = t.address, t.nbytes, t.readonly
        elif hasattr(obj, "__cuda_array_interface__"):
            from . import cai

            i = cai.read(obj, writable=not readonly)
            address, nbytes, ro = i.address, i.nbytes, i.readonly
        else:
            raise TypeError(f"a {type(obj).__name__} does not expose a buffer")
        dev = cls._make(np.zeros(0, np.uint8), obj, ro or bool(readonly))
        dev._device = (address, nbytes)
        return dev

    @classmethod
    def fromaddress(cls, address, nbytes, readonly=False):
        if nbytes < 0:
            raise ValueError(f"fromaddress: nbytes {nbytes} is negative")
        if address == 0 and nbytes > 0:
            raise ValueError("fromaddress: a NULL address with a non-zero size")
        raw = np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(address)) if nbytes else \
            np.zeros(0, np.uint8)
        return cls._make(raw.view(np.uint8), None, readonly)

    # --- properties ---------------------------------------------------------------------
    @property
    def obj(self):
        return None if self._released else self._obj

    @property
    def address(self):
        if self._released or self.size == 0 and self._obj is None:
            return 0
        if self._device is not None:
            return self._device[0]
        return self.__array_interface__["data"][0]

    @property
    def nbytes(self):
        if self._device is not None and not self._released:
            return self._device[1]
        return 0 if self._released else self.size

    @property
    def readonly(self):
        return False if self._released else not self.flags.writeable

    @property
    def format(self):
        return "B"

    def __len__(self):
        return self.nbytes

    def __bool__(self):
        """True when it holds bytes (as a sequence's truth; not NumPy's element-wise one)."""
        return self.nbytes > 0

    def release(self):
        forget = getattr(self, "_forget", None)
        if forget is not None:
            forget()
        self._released = True

    def toreadonly(self):
        return buffer._make(self.view(np.ndarray), self._obj, readonly=True)

    def cast(self, format, shape=None):  # noqa: A002 - mpi4py's name
        self._host()
        mem = memoryview(self.view(np.ndarray)).cast("B")
        return mem.cast(format) if shape is None else mem.cast(format, shape)

    def tobytes(self, order="C"):
        self._host()
        return self.view(np.ndarray).tobytes()

    def tomemory(self):
        return self

    # --- sequence -----------------------------------------------------------------------
    def _index(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise IndexError("only contiguous slices of a buffer are allowed")
            return slice(start, max(start, stop))
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            n = len(self)
            i = int(key) + n if key < 0 else int(key)
            if not 0 <= i < n:
                raise IndexError(f"buffer index {key} out of range")
            return i
        raise TypeError(f"buffer indices must be integers or slices, not {type(key).__name__}")

    def __getitem__(self, key):
        self._host()
        i = self._index(key)
        if isinstance(i, slice):
            return buffer._make(self.view(np.ndarray)[i], self._obj, self.readonly)
        return int(self.view(np.ndarray)[i])

    def __setitem__(self, key, value):
        self._host()
        if self.readonly:
            raise TypeError("the buffer is read-only")
        i = self._index(key)
        raw = self.view(np.ndarray)
        if isinstance(i, int) or isinstance(value, (int, np.integer)):
            raw[i] = value
            return
        src = np.frombuffer(memoryview(value).cast("B") if memoryview(value).nbytes else b"", np.uint8)
        if src.size != raw[i].size:
            raise ValueError(f"cannot assign {src.size} bytes to a slice of {raw[i].size}")
        raw[i] = src

    def __delitem__(self, key):
        raise NotImplementedError("buffers have a fixed size: items cannot be deleted")

    def __repr__(self):
        return f"<gpucoll.MPI.buffer {self.nbytes} bytes at {self.address:#x}>"

    def __reduce__(self):
        return (buffer, (self.tobytes(),))


memory = buffer
