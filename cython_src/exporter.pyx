# cython: language_level=3
"""Buffer export for Python classes: Python 3.11 has no __buffer__, so a class whose objects must
be buffers (memoryview(MPI.Win) is the window's memory, as in mpi4py) derives from
BufferExporter and defines _exported_buffer(): the object whose buffer it exports. The consumer's
view then refers to that object (it keeps the memory alive and releases it)."""
from cpython.buffer cimport PyObject_GetBuffer


cdef class BufferExporter:
    """Exports the buffer of self._exported_buffer()."""

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyObject_GetBuffer(self._exported_buffer(), view, flags)
