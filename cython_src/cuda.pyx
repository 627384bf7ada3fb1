"""The CUDA driver API, thin (binding of gc_cuda.h; libcuda.so.1 is dlopen'ed at first use).

Pointers, streams, events, modules and functions are plain integers. Every call checks the
driver's status and raises CudaError (a GpucollError) naming the call and the error::

    from gpucoll._native import cuda
    cuda.load()                                 # raises CudaError without a driver
    ctx = cuda.primary_context(0)
    p = cuda.mem_alloc(1 << 20)
    h = cuda.ipc_get_mem_handle(p)              # 64 bytes, for another process
    q = cuda.ipc_open_mem_handle(h)             # there

Launcher keeps one kernel's parameters packed (gc_launch in gc_cuda.h): set_team() once per
communicator, then launch() rewrites the argument block and calls cuLaunchKernel, without the GIL.
Launcher.prepare() packs a whole launch once (a Prepared); Prepared.go(stream, seq) is then the
entire host cost of a repeated collective: one Python call, one cuLaunchKernel.

A launch raises DeviceTimeout, and launches nothing, once a kernel of the team has recorded
on the mapped host error word that it gave up waiting for a peer (GPUCOLL_TIMEOUT).
"""
from libc.stdint cimport uintptr_t
from libc.string cimport memcpy, memset

from gpucoll.base.errors import GpucollError


cdef extern from "gc_cuda.h" nogil:
    ctypedef int CUresult
    ctypedef int CUdevice
    ctypedef void *CUcontext
    ctypedef void *CUmodule
    ctypedef void *CUfunction
    ctypedef void *CUstream
    ctypedef void *CUevent
    ctypedef unsigned long long CUdeviceptr
    ctypedef struct CUipcMemHandle:
        char reserved[64]
    ctypedef struct CUipcEventHandle:
        char reserved[64]
    int GC_MAXRANKS
    int GC_CUDA_ERROR_NOT_READY
    int GC_ERR_DEVICE_TIMEOUT
    int GC_CU_MEMHOSTALLOC_PORTABLE
    int GC_CU_MEMHOSTALLOC_DEVICEMAP

    ctypedef struct gc_team:
        unsigned long long stage[8]
        unsigned long long flags[8]
        unsigned long long sync
        unsigned long long slot
        int rank
        int nranks
        long long timeout_ns
        unsigned long long err
        unsigned long long seq

    ctypedef struct gc_args:
        unsigned long long send
        unsigned long long recv
        unsigned long long count
        unsigned long long stride
        unsigned long long psend[8]
        unsigned long long precv[8]
        int op
        int root
        int nvalues
        int pad

    int GC_MAXFUSE
    ctypedef struct gc_multi:
        unsigned long long send[64]
        unsigned long long recv[64]
        unsigned long long count[64]
        unsigned long long offset[64]
        int op[64]
        int n

    int GC_MAXMSGS
    ctypedef struct gc_msgs:
        unsigned long long data[64]
        unsigned long long slot[64]
        unsigned long long count[64]
        unsigned long long copy[64]
        unsigned long long seq[64]
        unsigned long long peer[64]
        int mode[64]
        int n
        int nslots

    ctypedef struct gc_cuda_api:
        CUresult (*DriverGetVersion)(int *) noexcept nogil
        CUresult (*DeviceGet)(CUdevice *, int) noexcept nogil
        CUresult (*DeviceGetCount)(int *) noexcept nogil
        CUresult (*DeviceGetAttribute)(int *, int, CUdevice) noexcept nogil
        CUresult (*DeviceCanAccessPeer)(int *, CUdevice, CUdevice) noexcept nogil
        CUresult (*DeviceGetPCIBusId)(char *, int, CUdevice) noexcept nogil
        CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice) noexcept nogil
        CUresult (*CtxSetCurrent)(CUcontext) noexcept nogil
        CUresult (*CtxGetCurrent)(CUcontext *) noexcept nogil
        CUresult (*CtxSynchronize)() noexcept nogil
        CUresult (*MemHostAlloc)(void **, size_t, unsigned int) noexcept nogil
        CUresult (*MemFreeHost)(void *) noexcept nogil
        CUresult (*MemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned int) noexcept nogil
        CUresult (*MemAlloc)(CUdeviceptr *, size_t) noexcept nogil
        CUresult (*MemFree)(CUdeviceptr) noexcept nogil
        CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t) noexcept nogil
        CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) noexcept nogil
        CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t) noexcept nogil
        CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t) noexcept nogil
        CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream) noexcept nogil
        CUresult (*MemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr) noexcept nogil
        CUresult (*PointerGetAttribute)(void *, int, CUdeviceptr) noexcept nogil
        CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr) noexcept nogil
        CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned int) noexcept nogil
        CUresult (*IpcCloseMemHandle)(CUdeviceptr) noexcept nogil
        CUresult (*IpcGetEventHandle)(CUipcEventHandle *, CUevent) noexcept nogil
        CUresult (*IpcOpenEventHandle)(CUevent *, CUipcEventHandle) noexcept nogil
        CUresult (*ModuleLoadData)(CUmodule *, const void *) noexcept nogil
        CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *) noexcept nogil
        CUresult (*EventCreate)(CUevent *, unsigned int) noexcept nogil
        CUresult (*EventDestroy)(CUevent) noexcept nogil
        CUresult (*EventRecord)(CUevent, CUstream) noexcept nogil
        CUresult (*EventSynchronize)(CUevent) noexcept nogil
        CUresult (*EventQuery)(CUevent) noexcept nogil
        CUresult (*EventElapsedTime)(float *, CUevent, CUevent) noexcept nogil
        CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned int) noexcept nogil
        CUresult (*StreamSynchronize)(CUstream) noexcept nogil
        CUresult (*StreamIsCapturing)(CUstream, int *) noexcept nogil
        CUresult (*StreamCreate)(CUstream *, unsigned int) noexcept nogil
        CUresult (*StreamDestroy)(CUstream) noexcept nogil

    gc_cuda_api gc_cu
    int gc_cuda_load()
    const char *gc_cuda_load_error()
    void gc_cuda_describe(CUresult rc, char *out, size_t len)

    ctypedef struct gc_launch:
        gc_team team
        gc_args args
        gc_multi multi
        gc_msgs msgs
        void *msg_params[3]
        CUcontext ctx
        volatile unsigned long long *err_host
    void gc_launch_init(gc_launch *l)
    CUresult gc_launch_with(gc_launch *l, CUfunction fn, unsigned grid, unsigned block, CUstream stream,
                            void **params)
    CUresult gc_launch_make_current(gc_launch *l)
    CUresult gc_launch_go(gc_launch *l, CUfunction fn, unsigned grid, unsigned block, CUstream stream)


MAXRANKS = GC_MAXRANKS
MAXFUSE = GC_MAXFUSE
MAXMSGS = GC_MAXMSGS


class CudaError(GpucollError):
    """A CUDA driver call failed; `code` is the driver's status."""

    def __init__(self, message, code=-1):
        super().__init__(message)
        self.code = code


RELEASED = 1 << 62     # error word bit: the host's abort word ended the wait (coll.cu: wait_word)
ABORT_ALL = 1 << 63    # abort word bit that releases every wait; bit (peer % 63) those on one peer


class DeviceTimeout(CudaError):
    """A kernel of the team gave up waiting for a peer, or the host released it (the abort word);
    `word` is the error word: (host sequence number << 8) | (1 + the peer's rank), with
    RELEASED set for a release. The dispatcher turns it into the error that names the
    operation (gpucoll.TimeoutError; ProcFailedError or RevokedError for a release)."""

    def __init__(self, word):
        self.word = word
        self.released = bool(word & RELEASED)
        self.seq = (word & ~RELEASED) >> 8
        self.peer = (word & 0xff) - 1
        what = "was released from its wait for" if self.released else "gave up waiting for"
        super().__init__(f"a GPU kernel {what} rank {self.peer}", GC_ERR_DEVICE_TIMEOUT)


cdef int _check(CUresult rc, str what) except -1:
    cdef char text[256]
    if rc != 0:
        gc_cuda_describe(rc, text, sizeof(text))
        raise CudaError(f"{what} failed: {text.decode(errors='replace')}", rc)
    return 0


cdef int _ensure() except -1:
    if gc_cuda_load() != 0:
        raise CudaError(f"the CUDA driver is not usable: {gc_cuda_load_error().decode(errors='replace')}")
    return 0


def load():
    """Load libcuda.so.1 and cuInit(0) (once); raises CudaError when there is no usable driver."""
    _ensure()


def available():
    """True when the driver loads and sees at least one GPU."""
    cdef int n = 0
    if gc_cuda_load() != 0:
        return False
    return gc_cu.DeviceGetCount(&n) == 0 and n > 0


def driver_version():
    cdef int v = 0
    _ensure()
    _check(gc_cu.DriverGetVersion(&v), "cuDriverGetVersion")
    return v


def device_count():
    cdef int n = 0
    _ensure()
    _check(gc_cu.DeviceGetCount(&n), "cuDeviceGetCount")
    return n


def device_attribute(int device, int attribute):
    cdef int v = 0
    cdef CUdevice dev
    _ensure()
    _check(gc_cu.DeviceGet(&dev, device), "cuDeviceGet")
    _check(gc_cu.DeviceGetAttribute(&v, attribute, dev), "cuDeviceGetAttribute")
    return v


def can_access_peer(int device, int peer):
    cdef int v = 0
    cdef CUdevice a, b
    _ensure()
    _check(gc_cu.DeviceGet(&a, device), "cuDeviceGet")
    _check(gc_cu.DeviceGet(&b, peer), "cuDeviceGet")
    _check(gc_cu.DeviceCanAccessPeer(&v, a, b), "cuDeviceCanAccessPeer")
    return bool(v)


def pci_bus_id(int device):
    cdef char buf[64]
    cdef CUdevice dev
    _ensure()
    _check(gc_cu.DeviceGet(&dev, device), "cuDeviceGet")
    _check(gc_cu.DeviceGetPCIBusId(buf, 64, dev), "cuDeviceGetPCIBusId")
    return buf.decode()


def primary_context(int device):
    """Retain the device's primary context (the one CuPy and torch use) and make it current."""
    cdef CUcontext ctx
    cdef CUdevice dev
    _ensure()
    _check(gc_cu.DeviceGet(&dev, device), "cuDeviceGet")
    _check(gc_cu.DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain")
    _check(gc_cu.CtxSetCurrent(ctx), "cuCtxSetCurrent")
    return <uintptr_t>ctx


def set_current(uintptr_t ctx):
    cdef CUcontext cur = NULL
    _check(gc_cu.CtxGetCurrent(&cur), "cuCtxGetCurrent")
    if <uintptr_t>cur != ctx:
        _check(gc_cu.CtxSetCurrent(<CUcontext>ctx), "cuCtxSetCurrent")


def ctx_synchronize():
    """Wait for all work of the current context (every stream)."""
    cdef CUresult rc
    with nogil:
        rc = gc_cu.CtxSynchronize()
    _check(rc, "cuCtxSynchronize")


def host_alloc_mapped(size_t nbytes):
    """(host address, device address) of zeroed pinned host memory that kernels can write."""
    cdef void *h = NULL
    cdef CUdeviceptr d = 0
    cdef CUresult rc
    _check(gc_cu.MemHostAlloc(&h, nbytes, GC_CU_MEMHOSTALLOC_PORTABLE | GC_CU_MEMHOSTALLOC_DEVICEMAP),
           f"cuMemHostAlloc({nbytes})")
    memset(h, 0, nbytes)
    rc = gc_cu.MemHostGetDevicePointer(&d, h, 0)
    if rc != 0:
        gc_cu.MemFreeHost(h)
        _check(rc, "cuMemHostGetDevicePointer")
    return <uintptr_t>h, d


def free_host(uintptr_t h):
    _check(gc_cu.MemFreeHost(<void *>h), "cuMemFreeHost")


def read_word(uintptr_t h):
    """The u64 at host address h, read as the device may have written it."""
    return (<volatile unsigned long long *>h)[0]


_allocated = {}  # device address -> bytes, of what mem_alloc made and mem_free has not freed


def mem_alloc(size_t nbytes):
    cdef CUdeviceptr p = 0
    _check(gc_cu.MemAlloc(&p, nbytes), f"cuMemAlloc({nbytes})")
    _allocated[p] = nbytes
    return p


def mem_free(CUdeviceptr p):
    _check(gc_cu.MemFree(p), "cuMemFree")
    _allocated.pop(p, None)


def allocated():
    """(allocations, bytes) of GPU memory that gpucoll holds in this process (IPC blocks, outboxes)."""
    return len(_allocated), sum(_allocated.values())


def memset_d8(CUdeviceptr p, unsigned char value, size_t nbytes):
    cdef CUresult rc
    with nogil:
        rc = gc_cu.MemsetD8(p, value, nbytes)
    _check(rc, "cuMemsetD8")


def memcpy_async(CUdeviceptr dst, CUdeviceptr src, size_t nbytes, uintptr_t stream):
    cdef CUresult rc
    with nogil:
        rc = gc_cu.MemcpyAsync(dst, src, nbytes, <CUstream>stream)
    _check(rc, "cuMemcpyAsync")


def memcpy_dtoh(uintptr_t host, CUdeviceptr src, size_t nbytes):
    cdef CUresult rc
    with nogil:
        rc = gc_cu.MemcpyDtoH(<void *>host, src, nbytes)
    _check(rc, "cuMemcpyDtoH")


def memcpy_htod_async(CUdeviceptr dst, uintptr_t host, size_t nbytes, uintptr_t stream):
    """Host to device on `stream`; from pageable memory the call returns once `host` may be reused."""
    cdef CUresult rc
    with nogil:
        rc = gc_cu.MemcpyHtoDAsync(dst, <const void *>host, nbytes, <CUstream>stream)
    _check(rc, "cuMemcpyHtoDAsync")


def memcpy_htod(CUdeviceptr dst, uintptr_t host, size_t nbytes):
    cdef CUresult rc
    with nogil:
        rc = gc_cu.MemcpyHtoD(dst, <const void *>host, nbytes)
    _check(rc, "cuMemcpyHtoD")


def address_range(CUdeviceptr p):
    """(base, size) of the allocation that holds p."""
    cdef CUdeviceptr base = 0
    cdef size_t size = 0
    _check(gc_cu.MemGetAddressRange(&base, &size, p), "cuMemGetAddressRange")
    return base, size


def pointer_device(CUdeviceptr p):
    """Device ordinal of the memory at p."""
    cdef int dev = -1
    _check(gc_cu.PointerGetAttribute(&dev, 9, p), "cuPointerGetAttribute(DEVICE_ORDINAL)")
    return dev


def buffer_id(CUdeviceptr p):
    """The driver's unique id of the allocation holding p (never reused in the process)."""
    cdef unsigned long long bid = 0
    _check(gc_cu.PointerGetAttribute(&bid, 7, p), "cuPointerGetAttribute(BUFFER_ID)")
    return bid


def ipc_get_mem_handle(CUdeviceptr base):
    cdef CUipcMemHandle h
    _check(gc_cu.IpcGetMemHandle(&h, base), "cuIpcGetMemHandle")
    return h.reserved[:64]


def ipc_open_mem_handle(bytes handle):
    cdef CUipcMemHandle h
    cdef CUdeviceptr p = 0
    if len(handle) != 64:
        raise CudaError("an IPC memory handle is 64 bytes")
    memcpy(h.reserved, <const char *>handle, 64)
    _check(gc_cu.IpcOpenMemHandle(&p, h, 1), "cuIpcOpenMemHandle")
    return p


def ipc_close_mem_handle(CUdeviceptr p):
    _check(gc_cu.IpcCloseMemHandle(p), "cuIpcCloseMemHandle")


def module_load(bytes image):
    cdef CUmodule m = NULL
    _check(gc_cu.ModuleLoadData(&m, <const char *>image), "cuModuleLoadData")
    return <uintptr_t>m


def module_function(uintptr_t module, str name):
    cdef CUfunction f = NULL
    b = name.encode()
    _check(gc_cu.ModuleGetFunction(&f, <CUmodule>module, b), f"cuModuleGetFunction({name})")
    return <uintptr_t>f


def event_create(bint timing=False, bint interprocess=False):
    """A new event of the current context; interprocess ones (never timing) can be shared with
    ipc_get_event_handle."""
    cdef CUevent e = NULL
    cdef unsigned int flags = 0 if timing and not interprocess else 2
    if interprocess:
        flags |= 4
    _check(gc_cu.EventCreate(&e, flags), "cuEventCreate")
    return <uintptr_t>e


def ipc_get_event_handle(uintptr_t e):
    cdef CUipcEventHandle h
    _check(gc_cu.IpcGetEventHandle(&h, <CUevent>e), "cuIpcGetEventHandle")
    return h.reserved[:64]


def ipc_open_event_handle(bytes handle):
    """Another process's interprocess event, opened in the current context."""
    cdef CUipcEventHandle h
    cdef CUevent e = NULL
    if len(handle) != 64:
        raise CudaError("an IPC event handle is 64 bytes")
    memcpy(h.reserved, <const char *>handle, 64)
    _check(gc_cu.IpcOpenEventHandle(&e, h), "cuIpcOpenEventHandle")
    return <uintptr_t>e


def event_destroy(uintptr_t e):
    _check(gc_cu.EventDestroy(<CUevent>e), "cuEventDestroy")


def event_record(uintptr_t e, uintptr_t stream):
    _check(gc_cu.EventRecord(<CUevent>e, <CUstream>stream), "cuEventRecord")


def event_synchronize(uintptr_t e):
    cdef CUresult rc
    with nogil:
        rc = gc_cu.EventSynchronize(<CUevent>e)
    _check(rc, "cuEventSynchronize")


def event_query(uintptr_t e):
    """True when the work before the event is done."""
    cdef CUresult rc = gc_cu.EventQuery(<CUevent>e)
    if rc == GC_CUDA_ERROR_NOT_READY:
        return False
    _check(rc, "cuEventQuery")
    return True


def event_elapsed_ms(uintptr_t start, uintptr_t end):
    cdef float ms = 0
    _check(gc_cu.EventElapsedTime(&ms, <CUevent>start, <CUevent>end), "cuEventElapsedTime")
    return ms


def stream_wait_event(uintptr_t stream, uintptr_t e):
    _check(gc_cu.StreamWaitEvent(<CUstream>stream, <CUevent>e, 0), "cuStreamWaitEvent")


def stream_synchronize(uintptr_t stream):
    cdef CUresult rc
    with nogil:
        rc = gc_cu.StreamSynchronize(<CUstream>stream)
    _check(rc, "cuStreamSynchronize")


def stream_create():
    """A new stream of the current context that does not wait for the legacy default stream."""
    cdef CUstream s = NULL
    _check(gc_cu.StreamCreate(&s, 1), "cuStreamCreate")
    return <uintptr_t>s


def stream_destroy(uintptr_t stream):
    """Destroy a stream of stream_create (work already enqueued on it still completes)."""
    _check(gc_cu.StreamDestroy(<CUstream>stream), "cuStreamDestroy")


def stream_is_capturing(uintptr_t stream):
    cdef int status = 0
    _check(gc_cu.StreamIsCapturing(<CUstream>stream, &status), "cuStreamIsCapturing")
    return status != 0


cdef int _launch_failed(gc_launch *l, CUresult rc) except -1:
    if rc == GC_ERR_DEVICE_TIMEOUT:
        # no kernel recorded anything yet: the host set the abort word, so nothing is launched
        raise DeviceTimeout(l.err_host[0] or (l.team.seq << 8) | RELEASED)
    _check(rc, "cuLaunchKernel")
    return 0


cdef class Launcher:
    """Pre-packed launches of gpucoll's collective kernels for one communicator."""

    cdef gc_launch l

    def __cinit__(self):
        gc_launch_init(&self.l)

    def set_team(self, uintptr_t ctx, stage, flags, unsigned long long sync, unsigned long long slot,
                 int rank, int nranks, long long timeout_ns, uintptr_t err_host=0, unsigned long long err_dev=0):
        """Every rank's staging and flag pointers as mapped in this process (own included);
        err_host/err_dev: the mapped host error word (host_alloc_mapped) kernels report timeouts in."""
        cdef int i
        if nranks > GC_MAXRANKS:
            raise CudaError(f"at most {GC_MAXRANKS} ranks per GPU team")
        self.l.ctx = <CUcontext>ctx
        for i in range(nranks):
            self.l.team.stage[i] = stage[i]
            self.l.team.flags[i] = flags[i]
        self.l.team.sync = sync
        self.l.team.slot = slot
        self.l.team.rank = rank
        self.l.team.nranks = nranks
        self.l.team.timeout_ns = timeout_ns
        self.l.team.err = err_dev
        self.l.err_host = <volatile unsigned long long *>err_host

    def set_seq(self, unsigned long long seq):
        """The host sequence number that the next launches report in a timeout."""
        self.l.team.seq = seq

    def error_word(self):
        """The mapped error word: 0, or (seq << 8) | (1 + peer) once a kernel timed out (with
        RELEASED set when the abort word released it)."""
        return self.l.err_host[0] if self.l.err_host != NULL else 0

    def abort(self, unsigned long long bits):
        """Set bits of the abort word (ABORT_ALL, or 1 << (peer % 63)): kernels waiting on what
        they name return within microseconds; after ABORT_ALL no launch starts. Any thread may call it."""
        if self.l.err_host != NULL:
            self.l.err_host[1] = self.l.err_host[1] | bits

    def abort_word(self):
        return self.l.err_host[1] if self.l.err_host != NULL else 0

    def set_peer_buffers(self, psend, precv):
        """Registered buffers of every rank for the direct kernels (0 where unused)."""
        cdef int i
        for i in range(self.l.team.nranks):
            self.l.args.psend[i] = psend[i]
            self.l.args.precv[i] = precv[i]

    def launch(self, uintptr_t fn, unsigned grid, unsigned block, uintptr_t stream,
               unsigned long long send, unsigned long long recv, unsigned long long count,
               unsigned long long stride=0, int op=0, int root=0, int nvalues=1):
        cdef CUresult rc
        self.l.args.send = send
        self.l.args.recv = recv
        self.l.args.count = count
        self.l.args.stride = stride
        self.l.args.op = op
        self.l.args.root = root
        self.l.args.nvalues = nvalues
        with nogil:
            rc = gc_launch_go(&self.l, <CUfunction>fn, grid, block, <CUstream>stream)
        if rc != 0:
            _launch_failed(&self.l, rc)

    def launch_fused(self, uintptr_t fn, unsigned grid, unsigned block, uintptr_t stream, entries,
                     int nvalues=1):
        """A fused kernel over up to MAXFUSE entries (send, recv, count, staging offset, op)."""
        cdef CUresult rc
        cdef int i = 0
        if len(entries) > GC_MAXFUSE:
            raise CudaError(f"at most {GC_MAXFUSE} operations per fused launch")
        for send, recv, count, offset, op in entries:
            self.l.multi.send[i] = send
            self.l.multi.recv[i] = recv
            self.l.multi.count[i] = count
            self.l.multi.offset[i] = offset
            self.l.multi.op[i] = op
            i += 1
        self.l.multi.n = i
        self.l.args.nvalues = nvalues
        with nogil:
            rc = gc_launch_go(&self.l, <CUfunction>fn, grid, block, <CUstream>stream)
        if rc != 0:
            _launch_failed(&self.l, rc)

    def launch_msgs(self, uintptr_t fn, unsigned blocks_per_msg, unsigned block, uintptr_t stream, entries,
                    int nslots):
        """p2p_slots over up to MAXMSGS messages: (data, slot, count, copy, seq, peer, mode) each."""
        cdef CUresult rc
        cdef int i = 0
        if len(entries) > GC_MAXMSGS:
            raise CudaError(f"at most {GC_MAXMSGS} messages per point-to-point launch")
        for data, slot, count, copy, seq, peer, mode in entries:
            self.l.msgs.data[i] = data
            self.l.msgs.slot[i] = slot
            self.l.msgs.count[i] = count
            self.l.msgs.copy[i] = copy
            self.l.msgs.seq[i] = seq
            self.l.msgs.peer[i] = peer
            self.l.msgs.mode[i] = mode
            i += 1
        self.l.msgs.n = i
        self.l.msgs.nslots = nslots
        with nogil:
            rc = gc_launch_with(&self.l, <CUfunction>fn, blocks_per_msg * i, block, <CUstream>stream,
                                self.l.msg_params)
        if rc != 0:
            _launch_failed(&self.l, rc)

    def prepare(self, uintptr_t fn, unsigned grid, unsigned block, unsigned long long send,
                unsigned long long recv, unsigned long long count, unsigned long long stride=0, int op=0,
                int root=0, int nvalues=1):
        """The same launch as launch(...) would make, packed once: Prepared.go(stream, seq)."""
        cdef Prepared p = Prepared.__new__(Prepared)
        p.owner = self
        p.fn = <CUfunction>fn
        p.grid, p.block = grid, block
        p.args = self.l.args
        p.args.send = send
        p.args.recv = recv
        p.args.count = count
        p.args.stride = stride
        p.args.op = op
        p.args.root = root
        p.args.nvalues = nvalues
        return p


cdef class Prepared:
    """One packed launch of a Launcher (staged kernels only: no registered peer buffers)."""

    cdef Launcher owner
    cdef gc_args args
    cdef CUfunction fn
    cdef unsigned grid, block

    def go(self, uintptr_t stream, unsigned long long seq):
        cdef CUresult rc
        cdef gc_launch *l = &self.owner.l
        l.args.send = self.args.send
        l.args.recv = self.args.recv
        l.args.count = self.args.count
        l.args.stride = self.args.stride
        l.args.op = self.args.op
        l.args.root = self.args.root
        l.args.nvalues = self.args.nvalues
        l.team.seq = seq
        with nogil:
            rc = gc_launch_go(l, self.fn, self.grid, self.block, <CUstream>stream)
        if rc != 0:
            _launch_failed(l, rc)
