# cython: language_level=3
"""Thin binding of gc_tcpchan.h: the TCP channel object, and blocking helpers over any channel.

Python creates and connects the sockets (gpucoll/transports/tcp.py holds that policy);
`TcpChannel` takes their descriptors and from then on owns them. The executor drives a
channel through its `gc_chan` function table without the GIL; `.ptr` is that table's
address::

    ch = TcpChannel([s.detach() for s in socks], peer=1, address="10.0.0.2:41234")
    chan_send_all(ch.ptr, b"hello", timeout=10)
    data = chan_recv_exact(ch.ptr, 5, timeout=10)
    ch.close()
"""
from libc.stdint cimport uintptr_t
from libc.string cimport strerror
from libc.errno cimport errno
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE, PyBUF_WRITABLE

import weakref

from gpucoll.base import config
from gpucoll.base.errors import InvalidUsageError, native_error


cdef extern from "gc_types.h":
    int GC_OK, GC_ERR_TIMEOUT, GC_ERR_PEER, GC_ERR_IO, GC_ERR_USAGE, GC_ERR_NOMEM

cdef extern from "gc_chan.h" nogil:
    cdef struct gc_chan:
        int fd
        int peer
    int GC_CHAN_ALIGN

cdef extern from "gc_tcpchan.h" nogil:
    ctypedef struct gc_tcpchan:
        gc_chan base
        int nsocks
    int GC_TCP_MAX_SOCKS
    int gc_tcp_tune(int fd, int sockbuf)
    int gc_tcpchan_create(const int *fds, int nsocks, size_t ring_bytes, size_t chunk_bytes,
                          int peer, gc_tcpchan **out)
    void gc_tcpchan_destroy(gc_tcpchan *t)
    int gc_chan_xfer(gc_chan *c, const void *sbuf, size_t slen, void *rbuf, size_t rlen,
                     double timeout, size_t *sdone, size_t *rdone)

ALIGN = GC_CHAN_ALIGN
MAX_SOCKS = GC_TCP_MAX_SOCKS

# ptr -> TcpChannel, so that errors raised from a bare address can name the peer's ip:port.
_live = weakref.WeakValueDictionary()


cdef int check(int status, str what, int peer, int err, double waited=-1.0) except -1:
    """A GC_* status -> errors.native_error (the one error path), or nothing."""
    if status >= 0:
        return 0
    raise native_error(status, what, (peer,), "", waited if waited >= 0 else None, err)


def tune_socket(int fd, int sockbuf=0):
    """TCP_NODELAY, and SO_SNDBUF/SO_RCVBUF of sockbuf bytes when > 0 (call before
    connect or listen, so the window scale fits)."""
    cdef int r = gc_tcp_tune(fd, sockbuf)
    if r < 0:
        raise OSError(-r, strerror(-r).decode())


cdef class TcpChannel:
    """A gc_chan over connected TCP sockets to one peer, striped in chunk_bytes chunks.

    fds: the sockets in stripe order (index i here is index i on the peer); the channel
    owns them once built. ring_bytes: receive ring, a multiple of 16. `peer` (settable)
    is the rank that error messages name; `address` is the peer's ip:port.
    """
    cdef gc_tcpchan *c
    cdef object __weakref__
    cdef public str address
    cdef readonly size_t ring_bytes
    cdef readonly size_t chunk_bytes

    def __cinit__(self, fds, int peer=-1, size_t ring_bytes=4 << 20, size_t chunk_bytes=512 << 10,
                  str address=""):
        cdef int cfds[64]   # GC_TCP_MAX_SOCKS
        cdef int n = len(fds)
        if n < 1 or n > GC_TCP_MAX_SOCKS:
            raise InvalidUsageError(f"a TCP channel needs 1 to {GC_TCP_MAX_SOCKS} sockets, got {n}")
        if ring_bytes == 0 or ring_bytes % GC_CHAN_ALIGN:
            raise InvalidUsageError(f"ring_bytes={ring_bytes} must be a positive multiple of {GC_CHAN_ALIGN}")
        if chunk_bytes == 0:
            raise InvalidUsageError("chunk_bytes must be positive")
        for i in range(n):
            cfds[i] = fds[i]
        self.address = address
        self.ring_bytes = ring_bytes
        self.chunk_bytes = chunk_bytes
        cdef int status, err
        status = gc_tcpchan_create(cfds, n, ring_bytes, chunk_bytes, peer, &self.c)
        err = errno
        check(status, f"creating the TCP channel to rank {peer} at {address}", peer, err)
        _live[<uintptr_t>self.c] = self

    @property
    def ptr(self):
        """Address of the gc_chan (0 once closed); valid while this object lives."""
        return <uintptr_t>self.c

    @property
    def fd(self):
        """The epoll descriptor to poll for POLLIN while idle, or -1 once closed."""
        return self.c.base.fd if self.c != NULL else -1

    @property
    def nsocks(self):
        return self.c.nsocks if self.c != NULL else 0

    @property
    def peer(self):
        return self.c.base.peer if self.c != NULL else -1

    @peer.setter
    def peer(self, int value):
        if self.c != NULL:
            self.c.base.peer = value

    @property
    def closed(self):
        return self.c == NULL

    def close(self):
        """Close the sockets and free the ring. Idempotent."""
        if self.c != NULL:
            _live.pop(<uintptr_t>self.c, None)
            gc_tcpchan_destroy(self.c)
            self.c = NULL

    def __dealloc__(self):
        if self.c != NULL:
            gc_tcpchan_destroy(self.c)
            self.c = NULL

    def __repr__(self):
        return f"<TcpChannel peer={self.peer} {self.address} nsocks={self.nsocks} ptr={self.ptr:#x}>"


cdef gc_chan *_chan(ptr) except NULL:
    cdef uintptr_t p = ptr.ptr if hasattr(ptr, "ptr") else ptr
    if p == 0:
        raise InvalidUsageError("the channel is closed (null gc_chan address)")
    return <gc_chan *>p


cdef int _xfer(gc_chan *c, const void *sbuf, size_t slen, void *rbuf, size_t rlen, timeout,
               str what) except -1:
    cdef double t = config.TIMEOUT.get() if timeout is None else float(timeout)
    cdef size_t sdone = 0, rdone = 0
    cdef int status, err
    with nogil:
        status = gc_chan_xfer(c, sbuf, slen, rbuf, rlen, t, &sdone, &rdone)
        err = errno
    if status < 0:
        ch = _live.get(<uintptr_t>c)
        where = f" at {ch.address}" if ch is not None and ch.address else ""
        progress = []
        if slen:
            progress.append(f"sent {sdone} of {slen} bytes")
        if rlen:
            progress.append(f"received {rdone} of {rlen} bytes")
        check(status, f"{what} with rank {c.peer}{where} ({', '.join(progress)})", c.peer, err, t)
    return 0


def chan_sendrecv(ptr, data, size_t nrecv, timeout=None, out=None):
    """Send all of `data` (any buffer) while receiving `nrecv` bytes, both directions at
    once, without the GIL. Returns the received bytes (a bytearray, or `out` filled).
    `ptr` is a gc_chan address or an object with `.ptr`; timeout defaults to GPUCOLL_TIMEOUT."""
    cdef gc_chan *c = _chan(ptr)
    cdef Py_buffer sb, rb
    if out is None:
        out = bytearray(nrecv)
    PyObject_GetBuffer(data, &sb, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(out, &rb, PyBUF_WRITABLE)
        try:
            if <size_t>rb.len < nrecv:
                raise InvalidUsageError(f"out holds {rb.len} bytes, fewer than {nrecv}")
            _xfer(c, sb.buf, sb.len, rb.buf, nrecv, timeout, "sendrecv")
        finally:
            PyBuffer_Release(&rb)
    finally:
        PyBuffer_Release(&sb)
    return out


def chan_send_all(ptr, data, timeout=None):
    """Send all of `data` (any buffer) on the channel; returns once the kernel took it."""
    cdef gc_chan *c = _chan(ptr)
    cdef Py_buffer sb
    PyObject_GetBuffer(data, &sb, PyBUF_SIMPLE)
    try:
        _xfer(c, sb.buf, sb.len, NULL, 0, timeout, "send")
    finally:
        PyBuffer_Release(&sb)


def chan_recv_exact(ptr, size_t n, timeout=None, out=None):
    """Receive exactly n bytes; returns a bytearray (or `out`, a writable buffer, filled)."""
    cdef gc_chan *c = _chan(ptr)
    cdef Py_buffer rb
    if out is None:
        out = bytearray(n)
    PyObject_GetBuffer(out, &rb, PyBUF_WRITABLE)
    try:
        if <size_t>rb.len < n:
            raise InvalidUsageError(f"out holds {rb.len} bytes, fewer than {n}")
        _xfer(c, NULL, 0, rb.buf, n, timeout, "receive")
    finally:
        PyBuffer_Release(&rb)
    return out
