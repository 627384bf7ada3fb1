# cython: language_level=3
"""Thin binding of gc_p2p.h: the process's point-to-point engine and its requests.

The policy (which channel reaches which peer, error texts, objects, communicators) lives in
gpucoll/p2p.py; here every call only crosses into C, with the GIL released where it may wait::

    eng = Engine(rank, size, max_message)
    eng.set_peer(1, pid, cma=True, eager_max=16384); eng.set_channel(1, shm_channel.ptr)
    req = eng.isend(comm_key, 1, tag, buf, 0)        # any contiguous buffer
    req = eng.irecv(comm_key, ANY, ANY, out)         # out=None: into a buffer of the message's size
    Engine.wait([req], all=True, timeout=30)         # the index of a done one, or -1
"""
cimport cython
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, free
from libc.string cimport strchr
from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE, PyBUF_WRITABLE, PyBUF_ANY_CONTIGUOUS,
                             PyBUF_FORMAT)
from cpython.bytes cimport PyBytes_FromStringAndSize


cdef extern from "gc_types.h" nogil:
    int GC_OK, GC_ERR_TIMEOUT, GC_ERR_PEER, GC_ERR_IO, GC_ERR_USAGE, GC_ERR_NOMEM

cdef extern from "gc_chan.h" nogil:
    ctypedef struct gc_chan:
        int fd

cdef extern from "gc_p2p.h" nogil:
    int GC_P2P_ANY, GC_P2P_SYNC, GC_P2P_OFFER, GC_P2P_EAGER
    int GC_P2P_TRUNCATED, GC_P2P_CANCELLED, GC_P2P_TOOBIG
    int GC_P2P_LIVE, GC_P2P_GONE, GC_P2P_BAD_KIND, GC_P2P_BAD_SIZE, GC_P2P_BAD_ID, GC_P2P_CHAN_ERR
    unsigned GC_P2P_WIRE_EAGER_MAX, GC_P2P_OFFER_MAX
    ctypedef struct gc_p2p_req:
        int done
        int err
        int src
        int32_t rtag
        uint64_t nbytes
        uint32_t rflags
        char *owned
        int where
    ctypedef struct gc_p2p:
        uint64_t progress_count
    gc_p2p *gc_p2p_create(int me, int n, uint64_t max_message)
    void gc_p2p_set_peer(gc_p2p *e, int peer, int pid, int cma, int eager_max)
    void gc_p2p_set_channel(gc_p2p *e, int peer, gc_chan *chan)
    void gc_p2p_set_share(gc_p2p *e, int on)
    void gc_p2p_copied(gc_p2p *e, uint64_t *read, uint64_t *written)
    int gc_p2p_has_channel(gc_p2p *e, int peer)
    gc_p2p_req *gc_p2p_isend(gc_p2p *e, uint64_t comm, int dest, int32_t tag, const char *buf,
                             uint64_t len, uint32_t flags)
    gc_p2p_req *gc_p2p_irecv(gc_p2p *e, uint64_t comm, int source, int32_t tag, char *buf,
                             uint64_t cap, int alloc)
    int gc_p2p_iprobe(gc_p2p *e, uint64_t comm, int source, int32_t tag, int *src, int32_t *rtag,
                      uint64_t *nbytes, uint32_t *flags, int take, gc_p2p_req **out)
    int64_t gc_p2p_peek(gc_p2p *e, uint64_t comm, int source, int32_t tag, char *out, uint64_t cap)
    int gc_p2p_withdraw(gc_p2p *e, gc_p2p_req *r, int err)
    int gc_p2p_send_now(gc_p2p *e, uint64_t comm, int dest, int32_t tag, const char *buf, uint64_t len)
    void gc_p2p_forget(gc_p2p *e, uint64_t comm)
    int gc_p2p_unexpected(gc_p2p *e, uint64_t comm)
    void gc_p2p_counts(gc_p2p *e, int *posted, int *unexpected)
    int gc_p2p_wait(gc_p2p *e, gc_p2p_req **reqs, int n, int all, double timeout)
    int gc_p2p_test(gc_p2p *e, gc_p2p_req *r)
    void gc_p2p_release(gc_p2p *e, gc_p2p_req *r)
    int gc_p2p_lost(gc_p2p *e, int peer, uint64_t *value, uint64_t *cut_nbytes, int32_t *cut_tag)
    int gc_p2p_raw(gc_p2p *e, int peer, const char *buf, uint64_t len)


ANY = GC_P2P_ANY
EAGER = GC_P2P_EAGER
SYNC = GC_P2P_SYNC
OFFER = GC_P2P_OFFER
WIRE_EAGER_MAX = GC_P2P_WIRE_EAGER_MAX
OFFER_MAX = GC_P2P_OFFER_MAX
# request errors
OK, PEER, NOMEM = GC_OK, GC_ERR_PEER, GC_ERR_NOMEM
TRUNCATED, CANCELLED, TOOBIG = GC_P2P_TRUNCATED, GC_P2P_CANCELLED, GC_P2P_TOOBIG
# why a peer is lost
LIVE, GONE, BAD_KIND, BAD_SIZE, BAD_ID, CHAN_ERR = (GC_P2P_LIVE, GC_P2P_GONE, GC_P2P_BAD_KIND,
                                                   GC_P2P_BAD_SIZE, GC_P2P_BAD_ID, GC_P2P_CHAN_ERR)

# Requests whose handle went away before the engine was done with their buffer: the buffer stays
# pinned here until the engine lets go (swept by every new request).
_orphans = []


@cython.no_gc
cdef class _Pin:
    cdef gc_p2p_req *r
    cdef gc_p2p *e
    cdef Py_buffer view
    cdef bint has_view

    cdef bint finished(self):
        return self.r.done != 0

    def __dealloc__(self):
        if self.has_view:
            PyBuffer_Release(&self.view)
        if self.r != NULL:
            gc_p2p_release(self.e, self.r)


cdef void _sweep():
    cdef _Pin pin
    if not _orphans:
        return
    keep = []
    for pin in _orphans:
        if not pin.finished():
            keep.append(pin)
    _orphans[:] = keep


@cython.no_gc
cdef class Req:
    """One send or receive of the engine. `done` is the engine's flag (no progress made);
    `test()` makes one progress pass first."""
    cdef gc_p2p_req *r
    cdef gc_p2p *e
    cdef Engine eng
    cdef Py_buffer view
    cdef bint has_view

    @property
    def done(self):
        return self.r.done != 0

    @property
    def err(self):
        return self.r.err

    @property
    def status(self):
        """(source world rank, tag, bytes of the message, flags) of a receive."""
        return self.r.src, self.r.rtag, self.r.nbytes, self.r.rflags

    @property
    def rflags(self):
        """The flags of the message a receive got (OFFER: a GPU message's envelope)."""
        return self.r.rflags

    def test(self):
        cdef int d
        with nogil:
            d = gc_p2p_test(self.e, self.r)
        return d != 0

    def wait(self, double timeout=-1):
        """True once done; False when timeout seconds passed first (< 0: no limit)."""
        cdef gc_p2p_req *one = self.r
        cdef int i
        if one.done:
            return True
        with nogil:
            i = gc_p2p_wait(self.e, &one, 1, 1, timeout)
        return i >= 0

    def withdraw(self, int err=GC_P2P_CANCELLED):
        """Take back a receive that nothing matched yet: True (it is now done with err), or False."""
        cdef int was
        with nogil:
            was = gc_p2p_withdraw(self.e, self.r, err)
        return was != 0

    def data(self):
        """The bytes of a receive made into a buffer of its own (objects, matched probes, GPU envelopes)."""
        if self.r.owned == NULL:
            return b""
        return PyBytes_FromStringAndSize(self.r.owned, <Py_ssize_t>self.r.nbytes)

    def __dealloc__(self):
        cdef _Pin pin
        if self.r == NULL:
            return
        if self.r.done or not self.has_view:
            if self.has_view:
                PyBuffer_Release(&self.view)
            gc_p2p_release(self.e, self.r)
            return
        pin = _Pin.__new__(_Pin)
        pin.r, pin.e, pin.view, pin.has_view = self.r, self.e, self.view, True
        _orphans.append(pin)


cdef int _plain(object buf, Py_buffer *view, int flags):
    """Get buf's buffer for a short path: 1, or 0 when it does not take one (not contiguous,
    read-only where flags ask for writable, or holding Python objects)."""
    try:
        PyObject_GetBuffer(buf, view, flags | PyBUF_ANY_CONTIGUOUS | PyBUF_FORMAT)
    except (BufferError, ValueError, TypeError):
        return 0
    if view.format != NULL and strchr(view.format, 79) != NULL:  # 'O': pointers to objects
        PyBuffer_Release(view)
        return 0
    return 1


cdef Req _start(Engine eng, bint send, uint64_t comm, int peer, int32_t tag, Py_buffer *view):
    """Start a send of, or a receive into, the buffer of view (its Req takes the view)."""
    cdef gc_p2p_req *r
    with nogil:
        if send:
            r = gc_p2p_isend(eng.e, comm, peer, tag, <const char *>view.buf, <uint64_t>view.len, 0)
        else:
            r = gc_p2p_irecv(eng.e, comm, peer, tag, <char *>view.buf, <uint64_t>view.len, 0)
    return _req(eng, r, view)


cdef Req _req(Engine eng, gc_p2p_req *r, Py_buffer *view):
    if r == NULL:
        if view != NULL:
            PyBuffer_Release(view)
        raise MemoryError("point to point: no memory for a request")
    cdef Req q = Req.__new__(Req)
    q.r, q.eng, q.e = r, eng, eng.e
    if view != NULL:
        q.view, q.has_view = view[0], True
    return q


cdef class Engine:
    """The process's engine; ranks are world ranks."""
    cdef gc_p2p *e
    cdef readonly int rank, size

    def __cinit__(self, int rank, int size, uint64_t max_message):
        self.e = gc_p2p_create(rank, size, max_message)
        if self.e == NULL:
            raise MemoryError("point to point: no memory for the engine")
        self.rank, self.size = rank, size
        # never freed: requests and channels may outlive any Python object (interpreter exit)

    def set_peer(self, int peer, int pid, bint cma, int eager_max):
        with nogil:
            gc_p2p_set_peer(self.e, peer, pid, cma, eager_max)

    def set_channel(self, int peer, uintptr_t ptr):
        with nogil:
            gc_p2p_set_channel(self.e, peer, <gc_chan *>ptr)

    def has_channel(self, int peer):
        return gc_p2p_has_channel(self.e, peer) != 0

    def set_share(self, bint on):
        """on: the sender of a large message within a host copies chunks of it too."""
        with nogil:
            gc_p2p_set_share(self.e, on)

    def copied(self):
        """(bytes read from senders' memory, bytes written into receivers'), rendezvous only."""
        cdef uint64_t read = 0, written = 0
        with nogil:
            gc_p2p_copied(self.e, &read, &written)
        return read, written

    def isend(self, uint64_t comm, int dest, int32_t tag, buf, uint32_t flags=0):
        cdef Py_buffer view
        cdef gc_p2p_req *r
        _sweep()
        PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE | PyBUF_ANY_CONTIGUOUS)
        with nogil:
            r = gc_p2p_isend(self.e, comm, dest, tag, <const char *>view.buf, <uint64_t>view.len, flags)
        return _req(self, r, &view)

    def irecv(self, uint64_t comm, int source, int32_t tag, buf=None):
        """Into the writable contiguous buffer buf, or (None) into one of the message's size."""
        cdef Py_buffer view
        cdef gc_p2p_req *r
        _sweep()
        if buf is None:
            with nogil:
                r = gc_p2p_irecv(self.e, comm, source, tag, NULL, 0, 1)
            return _req(self, r, NULL)
        PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS)
        with nogil:
            r = gc_p2p_irecv(self.e, comm, source, tag, <char *>view.buf, <uint64_t>view.len, 0)
        return _req(self, r, &view)

    def iprobe(self, uint64_t comm, int source, int32_t tag, bint take=False):
        """None, or (source, tag, nbytes, flags, request): the request (take=True) receives the
        message, which is no longer in the queue, into a buffer of its own."""
        cdef int src = 0, found
        cdef int32_t rtag = 0
        cdef uint64_t nbytes = 0
        cdef uint32_t flags = 0
        cdef gc_p2p_req *out = NULL
        with nogil:
            found = gc_p2p_iprobe(self.e, comm, source, tag, &src, &rtag, &nbytes, &flags, take, &out)
        if found == 0:
            return None
        if found < 0:
            raise MemoryError("point to point: no memory for a matched probe")
        return src, rtag, nbytes, flags, (_req(self, out, NULL) if take else None)

    def peek(self, uint64_t comm, int source, int32_t tag):
        """The bytes of the first arrived message matching (source, tag), left in the queue: a GPU
        message's envelope (at most GC_P2P_OFFER_MAX bytes); None when there is none, or not yet whole."""
        cdef bytearray out = bytearray(GC_P2P_OFFER_MAX)
        cdef char *at = out
        cdef int64_t n
        with nogil:
            n = gc_p2p_peek(self.e, comm, source, tag, at, GC_P2P_OFFER_MAX)
        return None if n < 0 else bytes(out[:n])

    # The short paths of blocking and nonblocking calls on plain buffers: None when buf does not
    # take them (the caller's general path then checks it and says what is wrong).
    def send(self, uint64_t comm, int dest, int32_t tag, buf):
        """Start a send: True when it is done already without error (small messages), else its Req."""
        cdef Py_buffer view
        cdef int sent
        if not _plain(buf, &view, PyBUF_SIMPLE):
            return None
        with nogil:
            sent = gc_p2p_send_now(self.e, comm, dest, tag, <const char *>view.buf, <uint64_t>view.len)
        if sent:
            PyBuffer_Release(&view)
            return True
        cdef Req q = _start(self, True, comm, dest, tag, &view)
        if q.r.done and q.r.err == GC_OK:
            return True
        return q

    def start_send(self, uint64_t comm, int dest, int32_t tag, buf):
        cdef Py_buffer view
        if not _plain(buf, &view, PyBUF_SIMPLE):
            return None
        return _start(self, True, comm, dest, tag, &view)

    def start_recv(self, uint64_t comm, int source, int32_t tag, buf):
        cdef Py_buffer view
        if not _plain(buf, &view, PyBUF_WRITABLE):
            return None
        return _start(self, False, comm, source, tag, &view)

    def recv(self, uint64_t comm, int source, int32_t tag, buf, double timeout):
        """Receive into buf, waiting up to timeout seconds: (source, tag, bytes) when its bytes are
        in buf, else its Req (timed out, failed, or a GPU offer: P2PRequest asks for the bytes)."""
        cdef Req q = self.start_recv(comm, source, tag, buf)
        if q is None:
            return None
        cdef gc_p2p_req *one = q.r
        cdef int i = 0
        if not one.done:
            with nogil:
                i = gc_p2p_wait(self.e, &one, 1, 1, timeout)
        if i >= 0 and one.err == GC_OK and not (one.rflags & GC_P2P_OFFER):
            return one.src, one.rtag, one.nbytes
        return q  # timed out, failed, or a GPU offer whose bytes the request must ask for

    def forget(self, uint64_t comm):
        with nogil:
            gc_p2p_forget(self.e, comm)

    def unexpected(self, uint64_t comm):
        return gc_p2p_unexpected(self.e, comm)

    def counts(self):
        """(posted receives, unexpected messages) of every communicator."""
        cdef int posted = 0, ux = 0
        gc_p2p_counts(self.e, &posted, &ux)
        return posted, ux

    def lost(self, int peer):
        """(why, value, bytes of the message cut off, its tag): why is LIVE while the peer is not lost."""
        cdef uint64_t value = 0, cut = 0
        cdef int32_t tag = 0
        cdef int why = gc_p2p_lost(self.e, peer, &value, &cut, &tag)
        return why, value, cut, tag

    def raw(self, int peer, const unsigned char[::1] data):
        """Write bytes straight onto peer's channel, outside the protocol (fault tests)."""
        with nogil:
            gc_p2p_raw(self.e, peer, <const char *>&data[0], data.shape[0])

    def wait(self, reqs, bint all=True, double timeout=-1):
        """Wait for all (all=True) or any of the Req objects: the index of a done one (all: 0),
        -1 when timeout seconds passed first."""
        cdef int n = len(reqs), i
        cdef Req q
        if n == 0:
            return 0
        cdef gc_p2p_req **arr = <gc_p2p_req **>malloc(n * sizeof(gc_p2p_req *))
        if arr == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                q = reqs[i]
                arr[i] = q.r
            with nogil:
                i = gc_p2p_wait(self.e, arr, n, all, timeout)
        finally:
            free(arr)
        return i
