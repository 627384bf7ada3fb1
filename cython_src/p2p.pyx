# cython: language_level=3
"""Thin binding of gc_p2p.h: the process's point-to-point core (matching, progress) and its requests.

The policy (which channel reaches which peer, error texts, objects, communicators) lives in
gpucoll/engines/p2p/host.py; here every call only crosses into C, with the GIL released where it may wait.
The requests the caller holds (P2PRequest) and the short paths of plain arrays (ShortPaths)
are here too: a short call, and the wait of its request, that succeed stay in C::

    eng = P2PCore(rank, size, max_message)
    eng.set_peer(1, pid, cma=True, eager_max=16384); eng.set_channel(1, shm_channel.ptr)
    req = eng.isend(comm_key, 1, tag, buf, 0)        # any contiguous buffer
    req = eng.irecv(comm_key, ANY, ANY, out)         # out=None: into a buffer of the message's size
    req.wait(30)                                     # True once done, False after 30 s
"""
cimport cython
from cpython.object cimport PyObject, PyTypeObject
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, strchr, strcmp
from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE, PyBUF_WRITABLE, PyBUF_ANY_CONTIGUOUS,
                             PyBUF_FORMAT)
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.buffer cimport PyBuffer_FillInfo
from cpython.long cimport PyLong_AsLongLongAndOverflow


cdef extern from "gc_types.h" nogil:
    int GC_OK, GC_ERR_TIMEOUT, GC_ERR_PEER, GC_ERR_IO, GC_ERR_USAGE, GC_ERR_NOMEM, GC_ERR_REVOKED

cdef extern from "gc_chan.h" nogil:
    ctypedef struct gc_chan:
        int fd

cdef extern from "gc_p2p.h" nogil:
    int GC_P2P_ANY, GC_P2P_SYNC, GC_P2P_OFFER, GC_P2P_EAGER, GC_P2P_WAIT_LOSS
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
        uint32_t losses
    gc_p2p *gc_p2p_create(int me, int n, uint64_t max_message)
    void gc_p2p_set_peer(gc_p2p *e, int peer, int pid, int cma, int eager_max)
    int gc_p2p_grow(gc_p2p *e, int n)
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
    int gc_p2p_revoke(gc_p2p *e, uint64_t comm)
    int gc_p2p_unexpected(gc_p2p *e, uint64_t comm)
    void gc_p2p_counts(gc_p2p *e, int *posted, int *unexpected)
    int gc_p2p_wait(gc_p2p *e, gc_p2p_req **reqs, int n, int all, double timeout)
    int gc_p2p_test(gc_p2p *e, gc_p2p_req *r)
    void gc_p2p_saw_losses(gc_p2p *e, gc_p2p_req *r)
    uint32_t gc_p2p_check_peers(gc_p2p *e)
    int gc_p2p_loss_unseen(gc_p2p *e, gc_p2p_req *r)
    void gc_p2p_release(gc_p2p *e, gc_p2p_req *r)
    gc_p2p_req *gc_p2p_sent(gc_p2p *e)
    int gc_p2p_lost(gc_p2p *e, int peer, uint64_t *value, uint64_t *cut_nbytes, int32_t *cut_tag)
    int gc_p2p_raw(gc_p2p *e, int peer, const char *buf, uint64_t len)


ANY = GC_P2P_ANY
EAGER = GC_P2P_EAGER
SYNC = GC_P2P_SYNC
OFFER = GC_P2P_OFFER
WIRE_EAGER_MAX = GC_P2P_WIRE_EAGER_MAX
OFFER_MAX = GC_P2P_OFFER_MAX
# request errors
OK, PEER, NOMEM, REVOKED = GC_OK, GC_ERR_PEER, GC_ERR_NOMEM, GC_ERR_REVOKED
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


cdef char _NO_BYTES[1]


@cython.no_gc
cdef class Req:
    """One send or receive of the engine. `done` is the engine's flag (no progress made);
    `test()` makes one progress pass first."""
    cdef gc_p2p_req *r
    cdef gc_p2p *e
    cdef P2PCore eng
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

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        # The same bytes, read-only and not copied (an object receive unpickles from them): the
        # view holds this request, whose release frees them.
        cdef char *at = self.r.owned if self.r.owned != NULL else _NO_BYTES
        PyBuffer_FillInfo(buffer, self, at, <Py_ssize_t>self.r.nbytes if self.r.owned != NULL else 0, 1, flags)

    def __releasebuffer__(self, Py_buffer *buffer):
        pass

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


# --- messages as mpi4py programs write them ------------------------------------------------------
# Besides an exact ndarray, the short paths read the message forms of mpi4py's demos and tutorials
# here, in C: a bytes-like object (bytearray, memoryview, array.array, MPI.buffer: whatever the
# layers above register), `[buf, TYPE]` (all of buf, a whole number of TYPEs) and `[buf, count,
# TYPE]` (the first count TYPEs of buf), TYPE a predefined datatype of plain contiguous values
# (registered with its size by identity: predefined datatypes live as long as the process).
# Anything else declines, and the general path reads it and says what is wrong.
# The registered datatypes (compared by address: no id() object, no dict lookup per message)
# and their bytes per element; each registration keeps its datatype alive.
cdef enum:
    _MAX_SPEC_TYPES = 64
cdef PyObject *_SPEC_TYPES[_MAX_SPEC_TYPES]
cdef Py_ssize_t _SPEC_SIZES[_MAX_SPEC_TYPES]
cdef int _N_SPEC_TYPES = 0
cdef list _SPEC_KEEP = []
cdef set _BARE = set()       # types whose whole buffer is the message
cdef object _GUARDED = None  # the one bare type whose objects may hold no host bytes (MPI.buffer)


def register_datatype(datatype, Py_ssize_t size):
    """Messages `[buf, datatype]` and `[buf, count, datatype]` take the short paths (datatype: a
    predefined object that lives as long as the process; size: its bytes, contiguous)."""
    global _N_SPEC_TYPES
    for i in range(_N_SPEC_TYPES):
        if _SPEC_TYPES[i] == <PyObject *>datatype:
            _SPEC_SIZES[i] = size
            return
    if _N_SPEC_TYPES == _MAX_SPEC_TYPES:
        raise ValueError(f"register_datatype: more than {_MAX_SPEC_TYPES} datatypes")
    _SPEC_KEEP.append(datatype)
    _SPEC_TYPES[_N_SPEC_TYPES], _SPEC_SIZES[_N_SPEC_TYPES] = <PyObject *>datatype, size
    _N_SPEC_TYPES += 1


cdef inline Py_ssize_t _spec_size(object datatype):
    """Bytes per element of a registered datatype, or -1."""
    cdef PyObject *p = <PyObject *>datatype
    for i in range(_N_SPEC_TYPES):
        if _SPEC_TYPES[i] == p:
            return _SPEC_SIZES[i]
    return -1


def register_bytes_type(t, bint guarded=False):
    """Objects of exact type t are messages as they are (their whole contiguous buffer). guarded:
    t's objects say whether they hold host bytes (`_device is None and not _released`, attributes
    in their __dict__)."""
    global _GUARDED
    if guarded:
        _GUARDED = t
    else:
        _BARE.add(t)


cdef class HandleFields:
    """The field of every gpucoll.MPI handle (gpucoll/mpi/handle.py's Handle derives from this):
    the state it refers to, None for the null handle. Native, so that the short paths read a
    communicator handle's state and make request handles without an attribute lookup."""
    cdef public object _s
    cdef object __weakref__


cdef class RequestHandle(HandleFields):
    """The fields of gpucoll.MPI's Request (gpucoll/mpi/request.py subclasses this): its state (a
    request, or None once completed: MPI.REQUEST_NULL) and whether it was cancelled."""
    cdef public bint _cancelled


# gpucoll.MPI's registrations (register_mpi): the type of the requests its short paths return (a
# Python class over MPIP2PRequest and MPI.Request), its status reset and its handle registry
cdef type _HANDLE = None
cdef object _RESET = None
cdef dict _REGISTRY = None
# The buffer formats of the dtypes whose bare ndarrays are messages there (a basic datatype's: "d",
# "B", "Zf", ...), each packed in an int (its up to 3 characters and the NUL), compared with the
# format of the array's buffer packed the same way.
cdef uint32_t _BASIC_FORMATS[32]
cdef int _N_BASIC_FORMATS = 0


cdef inline uint32_t _packed_format(const char *fmt):
    """fmt's characters in one int; 0 for NULL or more than 3 characters."""
    cdef uint32_t code = 0
    cdef int i
    if fmt == NULL:
        return 0
    for i in range(4):
        if fmt[i] == 0:
            return code
        code |= (<uint32_t><unsigned char>fmt[i]) << (8 * i)
    return 0


cdef inline bint _basic_format(const char *fmt):
    cdef uint32_t code = _packed_format(fmt)
    if code == 0:
        return False
    for i in range(_N_BASIC_FORMATS):
        if _BASIC_FORMATS[i] == code:
            return True
    return False


def register_mpi(request_type, basic_formats, reset_status, dict registry):
    """The short paths called with mpi=True return requests of request_type (a subclass of MPIP2PRequest: each is
    its own MPI.Request), reset a Status with reset_status(status) and keep registry (handle
    number -> state) clean of the handles they complete; they take a bare ndarray only when its
    buffer's format is one of basic_formats (at most 32 strings of 1 to 3 characters: the
    formats of the basic datatypes' dtypes)."""
    global _HANDLE, _N_BASIC_FORMATS, _RESET, _REGISTRY
    if not issubclass(request_type, MPIP2PRequest):
        raise TypeError(f"{request_type.__name__} does not derive from MPIP2PRequest")
    formats = sorted(set(basic_formats))
    if len(formats) > 32 or any(not 0 < len(f) <= 3 for f in formats):
        raise ValueError(f"register_mpi: {formats} are not up to 32 formats of 1 to 3 characters")
    for i, f in enumerate(formats):
        encoded = f.encode("ascii")
        _BASIC_FORMATS[i] = _packed_format(encoded)
    _HANDLE, _N_BASIC_FORMATS, _RESET, _REGISTRY = request_type, len(formats), reset_status, registry
    _dealloc_as_base(request_type, MPIP2PRequest)


# A Python class over a native one is freed by CPython's generic subtype_dealloc, which looks for
# finalizers, slots and a __dict__ the class may have added before calling the native dealloc and
# dropping the instance's reference to its class: a fifth of what completing a short-path request
# costs on top of gpucoll's own. A registered handle type that adds none of them is freed by its
# native base's dealloc and that reference drop alone.
cdef extern from "Python.h":
    ctypedef void (*destructor)(PyObject *)
    ctypedef struct _TypeSlots "PyTypeObject":
        Py_ssize_t tp_basicsize, tp_dictoffset, tp_weaklistoffset
        destructor tp_dealloc, tp_finalize, tp_del
    PyTypeObject *Py_TYPE(PyObject *o)
    void Py_DECREF(PyObject *o)

cdef destructor _BASE_DEALLOC = NULL


cdef void _handle_dealloc(PyObject *o) noexcept:
    cdef PyObject *cls = <PyObject *>Py_TYPE(o)
    _BASE_DEALLOC(o)
    Py_DECREF(cls)   # a heap type's instances hold a reference to it


cdef _dealloc_as_base(type cls, type base):
    """cls's instances are freed by base's dealloc, when cls is a heap type over base that adds
    no fields, __dict__, __weakref__, finalizer or __del__ (else CPython's generic path stays)."""
    global _BASE_DEALLOC
    cdef _TypeSlots *t = <_TypeSlots *>cls
    cdef _TypeSlots *b = <_TypeSlots *>base
    if not (cls.__flags__ & (1 << 9)) or t.tp_basicsize != b.tp_basicsize or t.tp_dictoffset != b.tp_dictoffset \
            or t.tp_weaklistoffset != b.tp_weaklistoffset or t.tp_finalize != NULL or t.tp_del != NULL:
        return
    _BASE_DEALLOC = b.tp_dealloc
    t.tp_dealloc = _handle_dealloc


cdef extern from "Python.h":
    object PyObject_GenericGetDict(object o, void *context)
    PyObject *PyDict_GetItem(object d, object key)


cdef inline bint _holds_host_bytes(object obj) except -1:
    """A guarded object (MPI.buffer) holds host bytes: `_device is None and not _released`, read
    from its __dict__ (no attribute lookup through its classes)."""
    cdef dict d = PyObject_GenericGetDict(obj, NULL)
    cdef PyObject *device = PyDict_GetItem(d, "_device")
    cdef PyObject *released = PyDict_GetItem(d, "_released")
    return (device != NULL and <object>device is None and released != NULL
            and <object>released is False)


cdef inline int _host_bytes(object obj, Py_buffer *view, int flags, object ndarray, bint mpi) except -1:
    """obj's buffer when obj is a message as it is: 1, or 0 to decline. mpi: a bare ndarray only of
    a basic datatype's dtype (gpucoll.MPI reads any other as its general path says)."""
    cdef object t = type(obj)
    if t is ndarray and mpi:
        if not _plain(obj, view, flags):
            return 0
        if _basic_format(view.format):
            return 1
        PyBuffer_Release(view)
        return 0
    if t is ndarray or t in _BARE:
        return _plain(obj, view, flags)
    if t is _GUARDED and _holds_host_bytes(obj):
        return _plain(obj, view, flags)
    return 0


cdef int _message(object msg, Py_buffer *view, int flags, object ndarray, bint mpi) except -1:
    """The buffer of a message for a short path, its length the message's bytes: 1, or 0 to decline."""
    cdef object t = type(msg)
    cdef Py_ssize_t n, size
    cdef long long count = -1
    if t is not list and t is not tuple:
        return _host_bytes(msg, view, flags, ndarray, mpi)
    n = len(msg)
    if n == 3:
        if not _small_int(msg[1], 0, 1LL << 62, &count):
            return 0
    elif n != 2:
        return 0
    size = _spec_size(msg[n - 1])
    if size < 0:
        return 0
    if not _host_bytes(msg[0], view, flags, ndarray, False):
        return 0
    if count < 0:
        if size == 0 or view.len % size:
            PyBuffer_Release(view)
            return 0
    elif count * size > view.len:
        PyBuffer_Release(view)
        return 0
    else:
        view.len = count * size
    return 1


# Messages up to this size start with the GIL held: their start (an eager copy, or a match) is
# shorter than handing the GIL to another thread and taking it back.
cdef Py_ssize_t _HOLD_GIL_BYTES = 4096


cdef Req _start(P2PCore eng, bint send, uint64_t comm, int peer, int32_t tag, Py_buffer *view):
    """Start a send of, or a receive into, the buffer of view (its Req takes the view)."""
    cdef gc_p2p_req *r
    if view.len <= _HOLD_GIL_BYTES:  # a few hundred ns at most: letting the GIL go would cost more
        if send:
            r = gc_p2p_isend(eng.e, comm, peer, tag, <const char *>view.buf, <uint64_t>view.len, 0)
        else:
            r = gc_p2p_irecv(eng.e, comm, peer, tag, <char *>view.buf, <uint64_t>view.len, 0)
        return _req(eng, r, view)
    with nogil:
        if send:
            r = gc_p2p_isend(eng.e, comm, peer, tag, <const char *>view.buf, <uint64_t>view.len, 0)
        else:
            r = gc_p2p_irecv(eng.e, comm, peer, tag, <char *>view.buf, <uint64_t>view.len, 0)
    return _req(eng, r, view)


cdef Req _req(P2PCore eng, gc_p2p_req *r, Py_buffer *view):
    if r == NULL:
        if view != NULL:
            PyBuffer_Release(view)
        raise MemoryError("point to point: no memory for a request")
    cdef Req q = Req.__new__(Req)
    q.r, q.eng, q.e = r, eng, eng.e
    if view != NULL:
        q.view, q.has_view = view[0], True
    return q


cdef class P2PCore:
    """The process's engine; ranks are world ranks."""
    cdef gc_p2p *e
    cdef readonly int rank, size
    # The request of every Isend that the channel took whole at its start (the engine's
    # gc_p2p_sent: done, shared, its release a no-op)
    cdef Req sent

    def __cinit__(self, int rank, int size, uint64_t max_message):
        self.e = gc_p2p_create(rank, size, max_message)
        if self.e == NULL:
            raise MemoryError("point to point: no memory for the engine")
        self.rank, self.size = rank, size
        # never freed: requests and channels may outlive any Python object (interpreter exit)
        self.sent = Req.__new__(Req)
        self.sent.r, self.sent.e = gc_p2p_sent(self.e), self.e  # no `eng`: the core holds it

    def grow(self, int size):
        """Room for world ranks up to size - 1 (processes spawned later)."""
        cdef int ok
        with nogil:
            ok = gc_p2p_grow(self.e, size)
        if not ok:
            raise MemoryError("point to point: no memory for more peers")
        self.size = max(self.size, size)

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

    def forget(self, uint64_t comm):
        with nogil:
            gc_p2p_forget(self.e, comm)

    def revoke(self, uint64_t comm):
        """Revoke communicator `comm` here (gc_p2p_revoke): its pending receives and the offers
        made to it fail with REVOKED."""
        cdef int st
        with nogil:
            st = gc_p2p_revoke(self.e, comm)
        if st != GC_OK:
            raise MemoryError("revoking a communicator: out of memory")

    def unexpected(self, uint64_t comm):
        return gc_p2p_unexpected(self.e, comm)

    def counts(self):
        """(posted receives, unexpected messages) of every communicator."""
        cdef int posted = 0, ux = 0
        gc_p2p_counts(self.e, &posted, &ux)
        return posted, ux

    @property
    def losses(self):
        """How many peers were lost so far."""
        return self.e.losses

    def check_peers(self):
        """How many peers were lost so far, after asking whether each still lives (at most every
        100 ms): a blocking probe's loop, which waits outside the engine, looks again when it changes."""
        cdef uint32_t losses
        with nogil:
            losses = gc_p2p_check_peers(self.e)
        return losses

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


# --- requests as the caller holds them ----------------------------------------------------------
# A window of Isends and Irecvs is as fast as its requests are cheap: a request is made, waited
# for and settled here, in C, when its outcome is plain (its bytes are where they belong); the
# communicator's PointToPoint (gpucoll/engines/p2p/host.py) explains everything else: errors, timeouts,
# objects to unpickle, a GPU message that matched a host receive.

from gpucoll.base.errors import ProcFailedPendingError
from gpucoll.base.request import Request as _Request, Status as _Status

cdef int _ANY_SOURCE = GC_P2P_ANY


cdef class P2PRequest(RequestHandle):
    """A send or receive of the engine, with gpucoll.Request's interface (gpucoll/engines/p2p/host.py registers
    it as one; its lowercase and array methods are Request's own). Wait() gives up after
    GPUCOLL_TIMEOUT, naming what it waited for; a receive's status is made on first use.
    It derives from gpucoll.MPI's handle fields so that one object can be both the request and
    its MPI.Request (MPIP2PRequest); gpucoll's own API leaves those fields unused."""
    cdef public Req _native
    cdef public object _p2p, name, peer, tag, _status, _keep, _cap, _error, _value
    cdef public bint _object, _settled
    cdef readonly bint _recv
    cdef double _timeout

    def __init__(self, name, p2p, Req native_req, op, peer, tag, status=None, obj=False, keep=None, cap=0):
        self.name, self._p2p, self._native, self._recv = name, p2p, native_req, op == "recv"
        self.peer, self.tag, self._status, self._object, self._keep, self._cap = peer, tag, status, obj, keep, cap
        self._timeout = p2p._timeout

    @property
    def _op(self):
        return "recv" if self._recv else "send"

    @property
    def status(self):
        """What a receive got: made on first use (most waits never ask), from the engine once settled."""
        if self._status is None:
            self._status = _Status()
            if self._settled and self._recv:
                self._fill_status(self._status)
        return self._status

    @status.setter
    def status(self, value):
        self._status = value

    @property
    def _done(self):  # made on use: a request refers to nothing that refers back
        return _Flag(self)

    def _finish(self, value=None, error=None):
        self._value, self._error, self._settled = value, error, True

    cpdef _settle(self):
        """Turn the engine's outcome into status, value and error (once)."""
        self._settle_here()

    cdef _settle_here(self):
        """_settle's work, called without looking for an override (the exact types of a window)."""
        if self._settled:
            return
        self._settled = True
        cdef gc_p2p_req *r = self._native.r
        if r.err == GC_OK and not self._object and not (self._recv and r.rflags & GC_P2P_OFFER):
            self._keep = None
            if self._recv and self._status is not None:
                self._fill_status(self._status)
            return
        self._p2p.settle(self)

    def _fill_status(self, status):
        """Source, tag and size of what the engine received, into status."""
        cdef gc_p2p_req *r = self._native.r
        status.source = self._p2p.rank_of(r.src) if r.src >= 0 else _ANY_SOURCE
        status.tag, status.nbytes = r.rtag, r.nbytes

    def _fill(self, status):
        if not self._recv:  # a send's status stays as it is
            return
        if self._status is None and self._settled:
            self._fill_status(status)
            return
        mine = self.status
        if status is not mine:
            status.source, status.tag, status.nbytes = mine.source, mine.tag, mine.nbytes

    cdef _waited(self, int got):
        """Settle after a wait of the engine that gave got (-1: it timed out; a loss code: a
        receive from any rank has a lost peer to look at)."""
        if got <= GC_P2P_WAIT_LOSS:
            got = self._engine_wait(self._timeout)
        if got < 0:
            self._p2p.timed_out(self, self._timeout)  # raises, unless the bytes came in meanwhile
        self._settle()

    cdef int _engine_wait(self, double timeout) except -3:
        """Wait in the engine until done (0) or timeout s pass (-1); a receive from any rank
        looks at each peer lost meanwhile (_look_at_losses), which may raise."""
        cdef gc_p2p_req *one = self._native.r
        cdef gc_p2p *e = self._native.e
        cdef int got = 0
        while not one.done:
            with nogil:
                got = gc_p2p_wait(e, &one, 1, 1, timeout)
            if got > GC_P2P_WAIT_LOSS:
                return got
            self._look_at_losses()
        return 0

    cdef _look_at_losses(self):
        """ULFM: a receive from any rank, still unmatched, after a peer was lost: its
        communicator raises ProcFailedPendingError when a rank of its failed and is not
        acknowledged (the receive stays posted); else its waits go on."""
        self._p2p.any_source_lost(self)
        with nogil:
            gc_p2p_saw_losses(self._native.e, self._native.r)

    def saw_losses(self):
        """Let the waits of this receive from any rank go on past the failures known now (a
        service that takes requests from whichever rank is left)."""
        with nogil:
            gc_p2p_saw_losses(self._native.e, self._native.r)

    def Wait(self, status=None):
        return self._wait(status)

    def Test(self, status=None):
        return self._test(status)

    cdef _wait(self, status):
        cdef gc_p2p_req *one
        cdef gc_p2p *e
        cdef double timeout = self._timeout
        cdef int got = 0
        if not self._settled:
            one, e = self._native.r, self._native.e
            if not one.done:
                with nogil:
                    got = gc_p2p_wait(e, &one, 1, 1, timeout)
            self._waited(got)
        return self._outcome(status)

    cdef _test(self, status):
        if not self._ready():
            return False
        self._settle()
        return self._outcome(status)

    cdef bint _ready(self) except -1:
        """Done (one progress pass first), without settling or raising; a receive from any rank
        with a lost peer to look at raises as its Test does."""
        cdef gc_p2p_req *one
        cdef gc_p2p *e
        cdef int done = 1
        if self._settled:
            return True
        one, e = self._native.r, self._native.e
        if not one.done:
            with nogil:
                done = gc_p2p_test(e, one)
        if not done and e.losses and gc_p2p_loss_unseen(e, one):
            self._look_at_losses()
        return done != 0

    cdef _outcome(self, status):
        if status is not None:
            self._fill(status)
        if self._error is not None:
            raise self._error
        return True

    def Get_status(self):
        return self._settled or self._native.test()

    wait = _Request.wait
    test = _Request.test
    Cancel = _Request.Cancel
    Free = _Request.Free
    Waitall = staticmethod(_Request.Waitall)
    Testall = staticmethod(_Request.Testall)
    Waitany = staticmethod(_Request.Waitany)
    waitall = staticmethod(_Request.waitall)

    def __repr__(self):
        return f"<Request {self.name} {'done' if self.Get_status() else 'pending'}>"

    @staticmethod
    def _wait_any(reqs, double timeout):
        """Index of a done one of reqs (P2PRequests), waiting in the engine; -1 after timeout s."""
        return _wait_many(reqs, False, timeout)

    @staticmethod
    def _wait_all(reqs, double timeout=-1.0, bint settle=False):
        """Wait in the engine until every one of reqs (P2PRequests) is done: one native wait, so
        the rendezvous copies of a window run back to back. After timeout s (< 0: the requests'
        GPUCOLL_TIMEOUT), the first one not done raises as its own Wait would. GPU requests
        (subclasses) are left to their own Wait: a GPU receive enqueues its copy there.
        settle: also settle each here; True when every one completed without an error, so the
        caller need not Wait each (False: the caller's Wait settles, explains and raises)."""
        cdef Py_ssize_t i, n = len(reqs)
        if n == 0:
            return False
        for i in range(n):
            t = type(reqs[i])
            if t is not P2PRequest and t is not _HANDLE:
                return False
        return _wait_settle(reqs, timeout, settle)

    @staticmethod
    def _wait_handles(handles, handle_type):
        """gpucoll.MPI's Waitall of a window, in C: handles, each a live request that is its own
        handle (the short paths') or a handle of exact type handle_type on a P2PRequest (its
        `_s`), none cancelled: wait for all in one native wait, settle each, null each handle;
        True when every one completed without an error. False when the list is anything else,
        or when one failed (the handles are left for the caller's own path, which completes them
        and raises the first error)."""
        if type(handles) is not list:
            handles = list(handles)
        cdef Py_ssize_t i, n = len(handles)
        cdef list states = handles  # the handles themselves while each is its own request
        cdef RequestHandle h
        if n == 0:
            return False
        if not issubclass(handle_type, RequestHandle):
            raise TypeError(f"{handle_type.__name__} does not derive from RequestHandle")
        for i in range(n):
            o = handles[i]
            t = type(o)
            if t is not _HANDLE and t is not handle_type:
                return False
            h = <RequestHandle>o  # both types derive from it
            if h._cancelled:
                return False
            if t is _HANDLE and h._s is _LIVE:
                if states is not handles:
                    states.append(o)
            elif t is handle_type and type(h._s) is P2PRequest:
                if states is handles:
                    states = handles[:i]
                states.append(h._s)
            else:
                return False
        if not _wait_settle(states, -1.0, True):
            return False
        for i in range(n):
            (<RequestHandle>handles[i])._s = None
        return True


cdef bint _wait_settle(reqs, double timeout, bint settle) except -1:
    """P2PRequest._wait_all's work on reqs (a sequence of P2PRequests, not empty)."""
    cdef P2PRequest q
    cdef Py_ssize_t i, n = len(reqs)
    if timeout < 0:
        timeout = (<P2PRequest>reqs[0])._timeout
    if _wait_many(reqs, True, timeout, True) < 0:
        for q in reqs:
            if not q._native.r.done:
                q._waited(-1)
                return False
    if not settle:
        return False
    for i in range(n):
        q = <P2PRequest>reqs[i]
        q._settle_here()
        if q._error is not None:
            return False
    global _settled_together
    _settled_together += n
    return True


cdef unsigned long long _settled_together = 0
cdef unsigned long long _sent_at_start = 0


def sent_at_start():
    """How many Isends the channel took whole at their start, born complete (tests)."""
    return _sent_at_start


def settled_together():
    """How many requests a Waitall completed in one native call, none failing (tests)."""
    return _settled_together


cdef int _wait_many(reqs, bint all, double timeout, bint checked=False) except -2:
    """gc_p2p_wait over the engine requests of reqs (P2PRequests of one engine; checked: the
    caller has checked that each is one)."""
    cdef Py_ssize_t n = len(reqs), i
    cdef P2PRequest q
    cdef gc_p2p *e
    cdef int got
    if n == 0:
        return 0
    cdef gc_p2p_req **arr = <gc_p2p_req **>malloc(n * sizeof(gc_p2p_req *))
    if arr == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            q = <P2PRequest>reqs[i] if checked else reqs[i]
            arr[i] = q._native.r
        e = (<P2PRequest>reqs[0])._native.e
        while True:
            with nogil:
                got = gc_p2p_wait(e, arr, <int>n, all, timeout)
            if got > GC_P2P_WAIT_LOSS:
                break
            (<P2PRequest>reqs[GC_P2P_WAIT_LOSS - got])._look_at_losses()
    finally:
        free(arr)
    return got


@cython.final
cdef class _Flag:
    """Stands in for the threading.Event of a host Request: set once the engine is done with it
    (is_set makes one progress pass; wait waits in the engine, without the GIL)."""
    cdef P2PRequest req

    def __cinit__(self, P2PRequest req):
        self.req = req

    def is_set(self):
        return self.req._settled or self.req._native.test()

    def wait(self, timeout=None):
        return self.req._settled or self.req._engine_wait(-1 if timeout is None else timeout) >= 0

    def set(self):
        self.req._settled = True


# --- a request that is its own gpucoll.MPI handle ------------------------------------------------
# MPI's Request is a handle: completing it makes it MPI.REQUEST_NULL. gpucoll.MPI's handles hold
# their operation's state in `_s`; a request of the short paths is instead its own handle (one
# object per message, as on gpucoll's own API): `_s` is _LIVE until completion nulls it, and the
# handle code that reads `_s` as a state gets an OwnState view of the request.

cdef object _LIVE = True
cdef tuple _NO_ARGS = ()


@cython.final
cdef class OwnState:
    """The state of a request that is its own handle, as gpucoll.MPI's handle code reads states
    (Wait, Test and the request's fields), made when that code asks for `_s`."""
    cdef readonly P2PRequest request

    def __cinit__(self, P2PRequest request):
        self.request = request

    def Wait(self, status=None):
        return self.request._wait(status)

    def Test(self, status=None):
        return self.request._test(status)

    def __getattr__(self, name):
        return getattr(self.request, name)

    def __repr__(self):
        return P2PRequest.__repr__(self.request)


cdef class MPIP2PRequest(P2PRequest):
    """A request of gpucoll.MPI's short paths: the engine's request and its MPI.Request in one
    object (gpucoll/mpi/request.py's P2PHandle derives from this and from MPI.Request). Waiting,
    testing and the truth value are MPI's: completion nulls the handle (`_s` None) and a null
    one completes at once with an empty status."""

    cdef bint _null(self, status) except -1:
        if self._s is not None:
            return False
        if status is not None:
            _RESET(status)
        return True

    cpdef _complete(self, status):
        """Finish (done or waited for): fill status, null the handle, return the received object.
        A receive from ANY_SOURCE with a failed rank pending stays a live handle (ULFM)."""
        if status is not None:
            _RESET(status)
        try:
            self._wait(status)
        except ProcFailedPendingError:
            raise
        except BaseException:
            self._release()
            raise
        self._release()
        if self._cancelled and status is not None and hasattr(status, "cancelled"):
            status.cancelled = True
        return self._value

    cpdef _release(self):
        if _REGISTRY:  # only handles that were asked for (.handle) are registered
            _REGISTRY.pop(id(self), None)
        self._s = None

    def Wait(self, status=None):
        if not self._null(status):
            self._complete(status)
        return True

    def wait(self, status=None):
        return None if self._null(status) else self._complete(status)

    def Test(self, status=None):
        if self._null(status):
            return True
        if not self._ready():
            return False
        self._complete(status)
        return True

    def test(self, status=None):
        if self._null(status):
            return True, None
        if not self._ready():
            return False, None
        return True, self._complete(status)

    def __bool__(self):
        return self._s is not None

    def _active(self):
        return self._s is not None

    def _done(self):
        return self._s is None or self._ready()

    def _state(self):
        """`_s` as the handle code reads it: None once null, else an OwnState of this request."""
        return None if self._s is None else OwnState(self)


cdef P2PRequest _request(Req native, object p2p, str name, bint recv, object peer, object tag, object keep,
                         Py_ssize_t cap, double timeout, object status, bint mpi=False):
    """A P2PRequest over native; mpi: of gpucoll.MPI's registered type, its own live handle."""
    cdef P2PRequest q
    if mpi:  # the registered type's own tp_new (MPIP2PRequest's): `MPIP2PRequest.__new__(_HANDLE)` is a Python call;
        # register_mpi checked that it derives from MPIP2PRequest (no type test here)
        q = <P2PRequest>(<PyTypeObject *>_HANDLE).tp_new(_HANDLE, <PyObject *>_NO_ARGS, NULL)
        q._s = _LIVE
    else:
        q = P2PRequest.__new__(P2PRequest)
    q._native, q._p2p, q.name, q._recv, q.peer, q.tag = native, p2p, name, recv, peer, tag
    q._keep, q._cap, q._timeout, q._status = keep, cap, timeout, status
    return q


cdef inline bint _small_int(object v, long long lo, long long hi, long long *out):
    """v is a plain int in [lo, hi] (then *out = v)."""
    cdef int overflow = 0
    cdef long long x
    if type(v) is not int:
        return False
    x = PyLong_AsLongLongAndOverflow(v, &overflow)
    if overflow or x < lo or x > hi:
        return False
    out[0] = x
    return True


cdef long long _TAG_UB = 2147483647  # the wire's tag is an int32
TAG_UB = _TAG_UB


@cython.final
cdef class ShortPaths:
    """The short paths of one communicator's host point to point: a message in contiguous host
    memory of plain values (an array of the exact type `ndarray`, or a form _message reads), rank
    and tag plain in-range ints, and (sends) a channel that exists. Each answers done (True, or the request) or declines (False,
    None): the communicator's general path then checks everything and says what is wrong.
    mpi=True is gpucoll.MPI's flavour (register_mpi): a bare ndarray only of a basic datatype's
    dtype (MPI reads any other as its general path says), and requests that are their own
    MPI.Request."""
    cdef P2PCore eng
    cdef uint64_t key
    cdef list world
    cdef object ready, p2p, ndarray
    cdef long long size
    cdef double timeout
    # Messages taken (tests): `specs` given as [buf, TYPE] / [buf, count, TYPE], `forms` as another
    # bare object than an ndarray (the general path hands the short paths neither: it reads both)
    cdef readonly unsigned long long specs, forms
    # Set by the communicator: closed once it is freed (or inherited by a fork), grouped inside
    # comm.group() (the blocking calls then take the general path, which defers them)
    cdef public bint closed, grouped
    # The ranks the short paths reach: all of the communicator's, but for an intercommunicator's
    # bridge the remote group's alone (its first ranks; sends to the others are errors there)
    cdef public long long peers

    def __cinit__(self, P2PCore eng, uint64_t key, list world, ready, p2p, ndarray, double timeout):
        self.eng, self.key, self.world, self.ready = eng, key, world, ready
        self.p2p, self.ndarray, self.size, self.timeout = p2p, ndarray, len(world), timeout
        self.peers = self.size

    cdef inline void _count(self, buf):
        cdef object t = type(buf)
        if t is list or t is tuple:
            self.specs += 1
        elif t is not self.ndarray:
            self.forms += 1

    cdef int _dest(self, buf, dest, tag) except -3:
        """The world rank to send to, or -2 to decline."""
        cdef long long d, t
        if not _small_int(dest, 0, self.peers - 1, &d) or not _small_int(tag, 0, _TAG_UB, &t):
            return -2
        world = self.world[d]
        return world if world in self.ready else -2

    cdef int _source(self, buf, source, tag) except -3:
        """The world rank to receive from (ANY_SOURCE as is), or -2 to decline."""
        cdef long long s, t
        if not _small_int(source, -1, self.peers - 1, &s) or not _small_int(tag, -1, _TAG_UB, &t):
            return -2
        return _ANY_SOURCE if s < 0 else self.world[s]

    cdef bint _send_now(self, int world, int32_t tag, Py_buffer *view) except -1:
        """Write the message whole into the channel now (gc_p2p_send_now; the GIL held for a
        small one, as _start holds it): True, and view released; False: nothing written."""
        cdef int sent
        if view.len <= _HOLD_GIL_BYTES:
            sent = gc_p2p_send_now(self.eng.e, self.key, world, tag, <const char *>view.buf, <uint64_t>view.len)
        else:
            with nogil:
                sent = gc_p2p_send_now(self.eng.e, self.key, world, tag, <const char *>view.buf,
                                       <uint64_t>view.len)
        if sent:
            PyBuffer_Release(view)
        return sent != 0

    cpdef bint send(self, buf, dest, tag, bint mpi=False) except -1:
        """Send: True once done (small messages at once; large ones waited for), False to decline."""
        cdef Py_buffer view
        cdef int world = self._dest(buf, dest, tag)
        cdef int32_t t
        if self.closed or self.grouped or world < 0 or not _message(buf, &view, PyBUF_SIMPLE, self.ndarray, mpi):
            return False
        self._count(buf)
        t = tag
        if self._send_now(world, t, &view):
            return True
        cdef Py_ssize_t n = view.len
        cdef Req q = _start(self.eng, True, self.key, world, t, &view)
        if not (q.r.done and q.r.err == GC_OK):
            _request(q, self.p2p, "Send", False, dest, tag, buf, n, self.timeout, None).Wait()
        return True

    cpdef object isend(self, buf, dest, tag, bint mpi=False):
        """Isend: the request, or None to decline."""
        cdef Py_buffer view
        cdef int world = self._dest(buf, dest, tag)
        if self.closed or world < 0 or not _message(buf, &view, PyBUF_SIMPLE, self.ndarray, mpi):
            return None
        self._count(buf)
        cdef Py_ssize_t n = view.len
        cdef P2PRequest done
        # a small message the channel takes whole is sent now: its request is born complete,
        # over the engine's shared done request (nothing to release)
        if n <= _HOLD_GIL_BYTES and self._send_now(world, <int32_t>tag, &view):
            done = _request(self.eng.sent, self.p2p, "Isend", False, dest, tag, None, n, self.timeout, None, mpi)
            done._settled = True
            global _sent_at_start
            _sent_at_start += 1
            return done
        return _request(_start(self.eng, True, self.key, world, <int32_t>tag, &view), self.p2p, "Isend", False,
                        dest, tag, buf, n, self.timeout, None, mpi)

    cpdef object irecv(self, buf, source, tag, bint mpi=False):
        """Irecv: the request, or None to decline."""
        cdef Py_buffer view
        cdef int world = self._source(buf, source, tag)
        if self.closed or world == -2 or not _message(buf, &view, PyBUF_WRITABLE, self.ndarray, mpi):
            return None
        self._count(buf)
        cdef Py_ssize_t n = view.len
        return _request(_start(self.eng, False, self.key, world, <int32_t>tag, &view), self.p2p, "Irecv", True,
                        source, tag, buf, n, self.timeout, None, mpi)

    cpdef bint recv(self, buf, source, tag, status, bint mpi=False) except -1:
        """Recv: True once the bytes are in buf (status, if given, filled), False to decline."""
        cdef Py_buffer view
        cdef int world = self._source(buf, source, tag), got = 0
        if self.closed or self.grouped or world == -2 or not _message(buf, &view, PyBUF_WRITABLE, self.ndarray, mpi):
            return False
        self._count(buf)
        cdef Py_ssize_t n = view.len
        cdef Req q = _start(self.eng, False, self.key, world, <int32_t>tag, &view)
        cdef gc_p2p_req *one = q.r
        cdef double timeout = self.timeout
        if not one.done:
            with nogil:
                got = gc_p2p_wait(self.eng.e, &one, 1, 1, timeout)
        if got >= 0 and one.err == GC_OK and not (one.rflags & GC_P2P_OFFER):
            if status is not None:
                status.source, status.tag, status.nbytes = self.p2p.rank_of(one.src), one.rtag, one.nbytes
            return True
        # timed out, failed, a lost peer to look at, or a GPU offer whose bytes the request asks
        # for: the request explains
        cdef P2PRequest req = _request(q, self.p2p, "Recv", True, source, tag, buf, n, timeout, status)
        if got <= GC_P2P_WAIT_LOSS:
            self.p2p.wait_blocking(req)
            return True
        req._waited(got)
        req._outcome(None)
        return True


cdef class ShortCalls:
    """gpucoll.Communicator's Send, Isend, Recv and Irecv (it derives from this): its short paths
    (self._short, a ShortPaths: a native field, read with no attribute lookup) straight from the
    caller, with no Python frame between; a stream, a message they decline, or a communicator
    without them (None) takes its general path (_send, _irecv, Python)."""
    cdef public ShortPaths _short

    def Send(self, buf, dest, tag=0, stream=None):
        cdef ShortPaths sp = self._short
        if stream is not None or sp is None or not sp.send(buf, dest, tag):
            self._send(buf, dest, tag, stream, False)

    def Isend(self, buf, dest, tag=0, stream=None):
        cdef ShortPaths sp = self._short
        req = sp.isend(buf, dest, tag) if stream is None and sp is not None else None
        return self._send(buf, dest, tag, stream, True) if req is None else req

    def Recv(self, buf, source=_ANY_SOURCE, tag=-1, status=None, stream=None):
        cdef ShortPaths sp = self._short
        if stream is not None or sp is None or not sp.recv(buf, source, tag, status):
            self._enqueued(self._irecv(buf, source, tag, status, stream))

    def Irecv(self, buf, source=_ANY_SOURCE, tag=-1, stream=None):
        cdef ShortPaths sp = self._short
        req = sp.irecv(buf, source, tag) if stream is None and sp is not None else None
        return self._irecv(buf, source, tag, None, stream) if req is None else req


cdef class CommStateFields:
    """The native field of a gpucoll.MPI communicator's state (gpucoll/mpi/comm.py's _CommState
    derives from this): the short paths of the communicator its point to point runs on, which
    MPIShortCalls reads with no attribute lookup."""
    cdef public ShortPaths short


cdef inline ShortPaths _short_of(object state):
    """The short paths of a communicator handle's state; None for MPI.COMM_NULL."""
    return None if state is None else (<CommStateFields?>state).short


cdef class MPIShortCalls(HandleFields):
    """gpucoll.MPI's Send, Isend, Recv, Irecv and Barrier (its Comm derives from this): the communicator's
    short paths (ShortPaths' gpucoll.MPI flavour, mpi=True) straight from the caller, with no Python frame
    between; when they decline, the Python class's general path (_send, _isend, _recv, _irecv)
    reads the message specification and checks everything. self._s is the communicator's state
    (None: MPI.COMM_NULL); its `short`, the ShortPaths of the communicator point to point
    runs on."""

    def Send(self, buf, dest, tag=0):
        """Send buf to dest (returns once the bytes are handed over: sends are eager)."""
        cdef ShortPaths sp = _short_of(self._s)
        if sp is None or not sp.send(buf, dest, tag, True):
            self._send(buf, dest, tag)

    def Isend(self, buf, dest, tag=0):
        """Start sending buf to dest: its Request."""
        cdef ShortPaths sp = _short_of(self._s)
        req = None if sp is None else sp.isend(buf, dest, tag, True)
        return self._isend(buf, dest, tag) if req is None else req

    def Recv(self, buf, source=_ANY_SOURCE, tag=-1, status=None):
        """Receive into buf; status (an MPI.Status) gets the source, tag and size."""
        cdef ShortPaths sp = _short_of(self._s)
        if sp is None or status is not None or not sp.recv(buf, source, tag, None, True):
            self._recv(buf, source, tag, status)

    def Irecv(self, buf, source=_ANY_SOURCE, tag=-1):
        """Start receiving into buf: its Request."""
        cdef ShortPaths sp = _short_of(self._s)
        req = None if sp is None else sp.irecv(buf, source, tag, True)
        return self._irecv(buf, source, tag) if req is None else req

    def Barrier(self):
        """Return once every rank of the communicator has called Barrier (its native fast path
        where it has one, with no Python frame between)."""
        s = self._s
        if s is None:
            self._c("Barrier")  # raises: MPI.COMM_NULL
        s.core.Barrier()
