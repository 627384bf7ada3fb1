# cython: language_level=3
"""Buffer export for Python classes: Python 3.11 has no __buffer__, so a class whose objects must
be buffers (memoryview(MPI.Win) is the window's memory, as in mpi4py) derives from
BufferExporter and defines _exported_buffer(): the object whose buffer it exports. The consumer's
view then refers to that object (it keeps the memory alive and releases it).

AddressConstant is the base of MPI's address constants (IN_PLACE, BOTTOM, BUFFER_AUTOMATIC),
which mpi4py makes int-like zero-byte buffers that no object owns."""
from cpython.buffer cimport PyBUF_FORMAT, PyBUF_ND, PyBUF_STRIDES, PyObject_GetBuffer


cdef class BufferExporter:
    """Exports the buffer of self._exported_buffer()."""

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyObject_GetBuffer(self._exported_buffer(), view, flags)


cdef const char *_BYTE_FORMAT = b"B"


def _integral(value):
    try:
        return value.__index__()
    except (AttributeError, TypeError):
        return None


cdef class AddressConstant:
    """An address constant: a subclass sets `name` and `address`. It compares and hashes as the
    integer address (and equal to any object of its own class), converts with int(), is true
    when the address is not 0, exports a buffer of 0 bytes at the address whose memoryview has
    no owning object (.obj is None), supports no arithmetic, and pickles by its name."""

    def __int__(self):
        return self.address

    def __bool__(self):
        return self.address != 0

    def __hash__(self):
        return hash(self.address)

    def __eq__(self, value):
        if isinstance(value, type(self)):
            return True
        number = _integral(value)
        return NotImplemented if number is None else self.address == number

    def __ne__(self, value):
        if isinstance(value, type(self)):
            return False
        number = _integral(value)
        return NotImplemented if number is None else self.address != number

    def __getbuffer__(self, Py_buffer *view, int flags):
        # view.obj stays None, which Cython turns into NULL: a view of no object
        view.buf = <void *><Py_ssize_t>self.address
        view.len = 0
        view.readonly = 0
        view.itemsize = 1
        view.format = <char *>_BYTE_FORMAT if flags & PyBUF_FORMAT else NULL
        view.ndim = 1
        view.shape = &view.len if flags & PyBUF_ND else NULL
        view.strides = &view.itemsize if flags & PyBUF_STRIDES == PyBUF_STRIDES else NULL
        view.suboffsets = NULL
        view.internal = NULL

    def __repr__(self):
        return self.name

    def __reduce__(self):
        return self.name
