"""Host memory under messages: as_array (a NumPy array over a buffer object's memory, not
copied) and Msg (count elements of a datatype in such memory, packed and stored in typemap
order). A leaf of gpucoll.MPI's datatypes: Datatype.Pack/Unpack and message.py build on it; it
reads a datatype only through its record (`datatype._t`)."""
import numpy as np

from ..base.errors import InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C

ERR_TYPE = _C["ERR_TYPE"]


def as_array(obj, readonly, what):
    """A NumPy array over the memory of a host buffer object (not copied); raises for others."""
    if isinstance(obj, np.ndarray):
        arr = obj
    else:
        try:
            arr = np.asarray(memoryview(obj))
        except TypeError:
            arr = None
        if arr is None and hasattr(obj, "__dlpack__"):
            from . import dlpack

            arr = dlpack.as_array(obj, writable=not readonly)
        elif arr is None and hasattr(obj, "__cuda_array_interface__"):
            from . import cai

            arr = cai.as_array(obj, writable=not readonly)
        if arr is None:
            raise TypeError(f"{what}: a {type(obj).__name__} is not a buffer (expecting an object with the "
                            "buffer protocol, DLPack or __cuda_array_interface__, or a list/tuple "
                            "[buf, count, datatype])")
    if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
        raise BufferError(f"{what}: the buffer is not contiguous (shape {arr.shape}, strides {arr.strides}); "
                          "pass a contiguous copy")
    if not readonly and not arr.flags.writeable:
        raise BufferError(f"{what}: the buffer is read-only; the result needs a writable buffer")
    return arr



class Msg:
    """count elements of datatype, starting at raw[0] (raw: the bytes from there to the buffer's
    end). gpu: the caller's GPU object, passed to gpucoll's GPU path as it is."""

    __slots__ = ("raw", "count", "datatype", "t", "gpu", "shift", "plain", "unpack")

    def __init__(self, raw, count, datatype, gpu=None, shift=0, plain=True, unpack=None):
        self.raw, self.count, self.datatype, self.gpu = raw, count, datatype, gpu
        # a GPU message of a derived datatype: gpu is a packed copy, and unpack() (None for a
        # buffer the call only reads) puts what the call wrote into the caller's layout
        self.unpack = unpack
        self.t = datatype._t
        self.shift = shift  # raw[0] is this many bytes past the first element's address (BOTTOM messages)
        # False for DLPack and interface views: gpucoll's threads get copies, never the view itself,
        # so that the exporter's capsule is let go in the caller's thread
        self.plain = plain

    def with_count(self, count):
        """The same buffer and datatype with another count."""
        return Msg(self.raw, count, self.datatype, self.gpu, self.shift, self.plain)

    def sub(self, start, count):
        """count elements from byte `start` of this message's memory."""
        return Msg(self.raw[start:], count, self.datatype, self.gpu, self.shift, self.plain)

    @property
    def nbytes(self):
        """Bytes of data (packed): count x the datatype's size."""
        return self.count * self.t.size if self.t is not None else 0

    def dense(self):
        """True when the packed bytes are the memory itself: elements one after the other, each
        one run of bytes (then data() is a view and received bytes land in place)."""
        t = self.t
        return t is None or self.count == 0 or (self.plain and self._contiguous())

    def _contiguous(self):
        return self.shift == 0 and self.t.contiguous()

    def span(self):
        return self.raw[:self.count * self.t.extent] if self.t is not None else self.raw[:0]

    def data(self):
        """The message's bytes, packed (a view when the layout is dense)."""
        if self.count == 0 or self.t is None:
            return np.zeros(0, np.uint8)
        if self.dense():
            return self.span()
        if self._contiguous():
            return self.span().copy()
        return self.raw[self.t.byte_index(self.count) - self.shift]

    def store(self, data):
        """Write packed bytes (as data() gives them) into the message's memory; fewer bytes (a
        shorter message received) fill the first elements, in typemap order, and leave the rest."""
        if self.count == 0 or self.t is None or len(data) == 0:
            return
        if self._contiguous():
            self.span()[:len(data)] = data
        else:
            self.raw[self.t.byte_index(self.count)[:len(data)] - self.shift] = data

    def elements(self):
        """A NumPy array of the elements (what reductions work on) and whether it is a copy
        that store() must write back."""
        t = self.t
        if t.np is not None and t.np.itemsize == t.extent and t.lb == 0 and self.shift == 0 and self.plain:
            return self.span().view(t.np), False
        e = t.element()
        if e is None or e.np is None:
            raise InvalidUsageError(f"reductions need a datatype made of one basic type; {t.name or 'this one'} "
                                    "mixes several", error_class=ERR_TYPE)
        return self.data().copy().view(e.np), True
