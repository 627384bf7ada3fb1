"""MPI.Status: source, tag, error, size and cancellation of a completed operation.

The fields live in one int32 array (`tomemory()` is a view of it, as mpi4py's is of MPI_Status);
gpucoll's point to point fills `source`, `tag` and `nbytes` (it is a gpucoll.Status).
"""
import numpy as np

from ..base.errors import InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C
from ..engines.p2p.host import ANY_SOURCE, ANY_TAG
from ..engines.p2p.host import Status as _CoreStatus

_SOURCE, _TAG, _ERROR, _CANCELLED, _COUNT_LO, _COUNT_HI = range(6)


class Status(_CoreStatus):
    """A message's status: a gpucoll.Status with the whole API of mpi4py's Status."""

    __slots__ = ("_f",)

    def __init__(self, status=None):
        if status is not None and not isinstance(status, _CoreStatus):
            raise TypeError(f"Status() takes a Status or nothing, not {type(status).__name__}")
        self._f = np.zeros(6, np.int32)
        if status is None:
            self._f[_SOURCE], self._f[_TAG] = ANY_SOURCE, ANY_TAG
        elif isinstance(status, Status):
            self._f[:] = status._f
        else:
            self.source, self.tag, self.nbytes = status.source, status.tag, status.nbytes

    # --- fields (gpucoll's point to point sets source, tag and nbytes) ---------------------
    source = property(lambda self: int(self._f[_SOURCE]), lambda self, v: self._f.__setitem__(_SOURCE, v))
    tag = property(lambda self: int(self._f[_TAG]), lambda self, v: self._f.__setitem__(_TAG, v))
    error = property(lambda self: int(self._f[_ERROR]), lambda self, v: self._f.__setitem__(_ERROR, v))

    @property
    def nbytes(self):
        return int(self._f[_COUNT_LO].astype(np.uint32)) | (int(self._f[_COUNT_HI]) << 32)

    @nbytes.setter
    def nbytes(self, value):
        value = int(value)
        self._f[_COUNT_LO] = np.uint32(value & 0xFFFFFFFF).view(np.int32)
        self._f[_COUNT_HI] = value >> 32

    @property
    def cancelled(self):
        return bool(self._f[_CANCELLED])

    @cancelled.setter
    def cancelled(self, flag):
        self._f[_CANCELLED] = bool(flag)

    @property
    def count(self):
        return self.nbytes

    @count.setter
    def count(self, value):
        self.nbytes = value

    def Get_source(self):
        return self.source

    def Set_source(self, source):
        self.source = source

    def Get_tag(self):
        return self.tag

    def Set_tag(self, tag):
        self.tag = tag

    def Get_error(self):
        return self.error

    def Set_error(self, error):
        self.error = error

    def Get_count(self, datatype=None):
        """Elements of datatype (default MPI.BYTE) received; UNDEFINED when not a whole number."""
        size = _size(datatype, "Get_count")
        if size == 0:
            return 0 if self.nbytes == 0 else _C["UNDEFINED"]
        return self.nbytes // size if self.nbytes % size == 0 else _C["UNDEFINED"]

    def Get_elements(self, datatype):
        """Basic elements received (for a derived datatype: of the basic types in it)."""
        size = _size(datatype, "Get_elements")
        t = getattr(datatype, "_t", None)
        if t is None or not t.basics or size == 0:
            return self.Get_count(datatype)
        whole, rest = divmod(self.nbytes, size)
        elements, done = whole * len(t.basics), 0
        for b in t.basics:  # a partial last element counts the basic elements that fit
            if done + b.size > rest:
                break
            done += b.size
            elements += 1
        return elements if done == rest else _C["UNDEFINED"]

    def Set_elements(self, datatype, count):
        self.nbytes = _size(datatype, "Set_elements") * count if count != _C["UNDEFINED"] else 0

    def Is_cancelled(self):
        return self.cancelled

    def Set_cancelled(self, flag):
        self.cancelled = flag

    def tomemory(self):
        """The status fields as a writable memory of C ints (writes change the status)."""
        return memoryview(self._f)

    def py2f(self):
        return [int(v) for v in self._f]

    @classmethod
    def f2py(cls, arg):
        status = cls()
        status._f[:len(arg)] = arg
        return status

    def __reduce__(self):
        return (_status, (type(self), self.py2f()))

    def __eq__(self, other):
        if not isinstance(other, Status):
            return NotImplemented
        return bool((self._f == other._f).all())

    __hash__ = None

    def __repr__(self):
        return (f"<gpucoll.MPI.Status source={self.source} tag={self.tag} error={self.error} "
                f"bytes={self.nbytes}{' cancelled' if self.cancelled else ''}>")


def _status(cls, fields):
    return cls.f2py(fields)


def _size(datatype, what):
    if datatype is None:
        return 1
    if not datatype:
        raise InvalidUsageError(f"{what}: the datatype is MPI.DATATYPE_NULL", error_class=_C["ERR_TYPE"])
    return datatype.Get_size()


def reset(status):
    """What an empty status reads (a null or inactive request's): ANY_SOURCE, ANY_TAG, nothing."""
    status.source, status.tag, status.nbytes = ANY_SOURCE, ANY_TAG, 0
    if isinstance(status, Status):
        status.error, status.cancelled = _C["SUCCESS"], False
