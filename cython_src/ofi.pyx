# cython: language_level=3
"""Thin binding of gc_ofichan.h: libfabric loaded at run time, the process's OFI domain and its
channels. Built only where libfabric's headers were present at build time (setup.py).

Python holds the policy (gpucoll/transports/ofi.py): which provider, the authenticated TCP
control socket each channel keeps, the exchange of addresses on it::

    load()                                           # dlopen libfabric.so.1 (raises OfiUnavailable)
    dom = OfiDomain("tcp;ofi_rxm", "lo", mr_extra=MR_VERBS)
    ch = OfiChannel(dom, ctl_fd, peer=1, slot_bytes=32768, nslots=64, rma_min=256 << 10)
    ... send ch.setup_blob() on the control socket, read the peer's ...
    ch.connect(peer_blob)
    sock.chan_send_all(ch.ptr, b"...")
"""
from libc.stdint cimport uint32_t, uint64_t, uintptr_t
from libc.string cimport memcpy

import struct


cdef extern from "gc_types.h":
    int GC_ERR_NOMEM

cdef extern from "gc_chan.h" nogil:
    cdef struct gc_chan:
        int fd
        int peer

cdef extern from "<rdma/fabric.h>" nogil:
    cdef struct fi_fabric_attr:
        char *name
        char *prov_name
        uint32_t prov_version
    cdef struct fi_domain_attr:
        char *name
        uint64_t mr_mode
    cdef struct fi_tx_attr:
        size_t inject_size
    cdef struct fi_ep_attr:
        size_t max_msg_size
    cdef struct fi_info:
        fi_info *next
        uint64_t caps
        fi_tx_attr *tx_attr
        fi_ep_attr *ep_attr
        fi_domain_attr *domain_attr
        fi_fabric_attr *fabric_attr
    uint64_t FI_HMEM
    uint32_t FI_MAJOR(uint32_t)
    uint32_t FI_MINOR(uint32_t)

cdef extern from "gc_ofichan.h" nogil:
    ctypedef struct gc_ofi_lib_t:
        void *handle
        void (*freeinfo)(fi_info *)
        uint32_t (*version)()
    gc_ofi_lib_t gc_ofi_lib
    char *gc_ofi_why
    int GC_OFI_NAME_MAX
    uint64_t GC_OFI_MR_VERBS
    ctypedef struct gc_ofi_dom:
        fi_info *info
        uint64_t mr_mode
        uint64_t prov_mr_mode
        size_t inject_max
        char *name
        size_t namelen
        int nchans
        uint64_t n_regs, n_reg_hits
    ctypedef struct gc_ofichan:
        gc_chan base
        uint32_t id
        size_t slot_bytes
        uint32_t nslots
        uint64_t n_eager, n_rma, read_bounce, read_direct
    int gc_ofi_load(const char *path)
    const char *gc_ofi_strerror(int err)
    fi_info *gc_ofi_getinfo(const char *provider, const char *domain, const char *source, uint64_t mr_extra)
    gc_ofi_dom *gc_ofi_dom_create(fi_info *info, uint64_t mr_extra)
    void gc_ofi_dom_destroy(gc_ofi_dom *d)
    int gc_ofi_region_add(gc_ofi_dom *d, uintptr_t base, size_t length)
    void gc_ofi_region_drop(gc_ofi_dom *d, uintptr_t base)
    int gc_ofichan_create(gc_ofi_dom *d, int ctl_fd, int peer, size_t slot_bytes, uint32_t nslots,
                          size_t rma_min, gc_ofichan **out)
    int gc_ofichan_connect(gc_ofichan *ch, const void *peer_name, size_t namelen, uint32_t peer_id,
                           size_t peer_slot_bytes, uint32_t peer_nslots)
    void gc_ofichan_destroy(gc_ofichan *ch)

MR_VERBS = GC_OFI_MR_VERBS
_MR_BITS = ((1 << 2, "FI_MR_LOCAL"), (1 << 4, "FI_MR_VIRT_ADDR"), (1 << 5, "FI_MR_ALLOCATED"),
            (1 << 6, "FI_MR_PROV_KEY"), (1 << 9, "FI_MR_ENDPOINT"), (1 << 10, "FI_MR_HMEM"))
# setup blob: channel id, slot bytes, slots, then the endpoint's address
_BLOB = struct.Struct("<IQI")


class OfiUnavailable(RuntimeError):
    """libfabric cannot be used here: the message says why."""


def _why():
    return (<bytes>gc_ofi_why).decode(errors="replace")


def mr_names(uint64_t bits):
    """The FI_MR_* names of mr_mode bits."""
    return [name for bit, name in _MR_BITS if bits & bit]


def load(path=None):
    """Load libfabric (idempotent); returns its version "major.minor". Raises OfiUnavailable."""
    cdef bytes p = (path or "").encode()
    if gc_ofi_load(p) != 0:
        raise OfiUnavailable(_why())
    v = gc_ofi_lib.version()
    return f"{FI_MAJOR(v)}.{FI_MINOR(v)}"


cdef fi_info *_getinfo(provider, domain, source, uint64_t mr_extra):
    """fi_getinfo with gpucoll's hints (NULL when nothing fits: gc_ofi_why says why)."""
    cdef bytes prov = (provider or "").encode(), dom = (domain or "").encode(), src = (source or "").encode()
    cdef const char *p = NULL
    cdef const char *d = NULL
    cdef const char *s = NULL
    if provider:
        p = prov
    if domain:
        d = dom
    if source:
        s = src
    return gc_ofi_getinfo(p, d, s, mr_extra)


def interfaces(provider=None, domain=None, uint64_t mr_extra=0):
    """[(provider, fabric, domain, hmem)] for every fabric interface that has what gpucoll's
    channel needs (tagged messages, RMA reads, reliable datagrams); [] when none."""
    load()
    cdef fi_info *info = _getinfo(provider, domain, None, mr_extra)
    cdef fi_info *cur = info
    out = []
    while cur != NULL:
        out.append((cur.fabric_attr.prov_name.decode(), cur.fabric_attr.name.decode(),
                    cur.domain_attr.name.decode(), bool(cur.caps & FI_HMEM)))
        cur = cur.next
    if info != NULL:
        gc_ofi_lib.freeinfo(info)
    return out


cdef class OfiDomain:
    """The process's fabric, domain, endpoint, completion queue and address vector.

    provider: e.g. "tcp;ofi_rxm", "verbs;ofi_rxm", "efa" (None: the first that fits); domain: its
    name (an interface for tcp, a device for verbs; None: the first); source: a local address to
    bind (the software providers: the TCP listener's IP); mr_extra: FI_MR_* bits to honour on top
    of what the provider asks (MR_VERBS: the verbs provider's).
    """
    cdef gc_ofi_dom *d
    cdef readonly str provider, fabric, domain

    def __cinit__(self, provider=None, domain=None, uint64_t mr_extra=0, source=None):
        load()
        cdef fi_info *info = _getinfo(provider, domain, source, mr_extra)
        if info == NULL:
            raise OfiUnavailable(_why())
        self.provider = info.fabric_attr.prov_name.decode()
        self.fabric = info.fabric_attr.name.decode()
        self.domain = info.domain_attr.name.decode()
        self.d = gc_ofi_dom_create(info, mr_extra)
        if self.d == NULL:
            raise OfiUnavailable(f"{self.provider} on {self.domain}: {_why()}")

    @property
    def address(self):
        """This endpoint's address (bytes, the provider's format)."""
        return (<char *>self.d.name)[:self.d.namelen] if self.d != NULL else b""

    @property
    def mr_mode(self):
        """The FI_MR_* names honoured (the provider's and those asked for)."""
        return mr_names(self.d.mr_mode) if self.d != NULL else []

    @property
    def provider_mr_mode(self):
        """The FI_MR_* names the provider itself asks for."""
        return mr_names(self.d.prov_mr_mode) if self.d != NULL else []

    @property
    def inject_size(self):
        return self.d.inject_max if self.d != NULL else 0

    @property
    def hmem(self):
        """True when the provider registers device memory (GPUDirect RDMA)."""
        return bool(self.d.info.caps & FI_HMEM) if self.d != NULL else False

    @property
    def channels(self):
        return self.d.nchans if self.d != NULL else 0

    def add_region(self, uintptr_t base, size_t length):
        """Memory that lives until drop_region(base): reads into it keep one registration."""
        if self.d != NULL and gc_ofi_region_add(self.d, base, length):
            raise MemoryError("no memory to note an OFI region")

    def drop_region(self, uintptr_t base):
        """The memory add_region named is being freed: its registration goes."""
        if self.d != NULL:
            gc_ofi_region_drop(self.d, base)

    def stats(self):
        """Local registrations made for reads, and reads that reused one."""
        return {"registrations": self.d.n_regs, "reused": self.d.n_reg_hits} if self.d != NULL else {}

    def close(self):
        """Close the endpoint and everything under it, once no channel is open."""
        if self.d != NULL and self.d.nchans == 0:
            gc_ofi_dom_destroy(self.d)
            self.d = NULL

    def __dealloc__(self):
        if self.d != NULL and self.d.nchans == 0:
            gc_ofi_dom_destroy(self.d)
            self.d = NULL

    def __repr__(self):
        return f"<OfiDomain {self.provider} {self.fabric}/{self.domain} mr={'|'.join(self.mr_mode)}>"


cdef class OfiChannel:
    """A gc_chan to one peer over the domain's endpoint. ctl_fd: the channel's authenticated TCP
    control socket (owned from here on: closed with the channel; the peer's end closing means
    the peer is gone). Set up by handing setup_blob() to the peer and connect() its blob."""
    cdef gc_ofichan *c
    cdef readonly OfiDomain dom
    cdef public str address
    cdef readonly size_t rma_min

    def __cinit__(self, OfiDomain dom, int ctl_fd, int peer=-1, size_t slot_bytes=32 << 10,
                  uint32_t nslots=64, size_t rma_min=256 << 10, str address=""):
        if dom.d == NULL:
            raise OfiUnavailable("the OFI domain is closed")
        r = gc_ofichan_create(dom.d, ctl_fd, peer, slot_bytes, nslots, rma_min, &self.c)
        if r == GC_ERR_NOMEM:
            raise MemoryError(f"OFI channel to rank {peer}: out of memory")
        if r:
            raise OfiUnavailable(f"OFI channel to rank {peer} ({slot_bytes} B x {nslots} slots): "
                                 f"{gc_ofi_strerror(r).decode()}")
        self.dom = dom
        self.address = address
        self.rma_min = rma_min

    def setup_blob(self):
        """What the peer needs to reach this channel (id, slot sizes, the endpoint's address)."""
        return _BLOB.pack(self.c.id, self.c.slot_bytes, self.c.nslots) + self.dom.address

    def connect(self, bytes blob):
        """Take the peer's setup_blob(): post this side's receives. The channel carries bytes
        once the peer has done the same (the caller waits for its word on the control socket)."""
        if len(blob) <= _BLOB.size or len(blob) - _BLOB.size > GC_OFI_NAME_MAX:
            raise OfiUnavailable(f"OFI channel to rank {self.peer}: a set-up message of {len(blob)} bytes "
                                 "makes no sense")
        peer_id, slot_bytes, nslots = _BLOB.unpack_from(blob)
        if slot_bytes != self.c.slot_bytes or nslots != self.c.nslots:
            raise OfiUnavailable(f"OFI channel to rank {self.peer}: it uses {nslots} slots of {slot_bytes} B, "
                                 f"this rank {self.c.nslots} of {self.c.slot_bytes} B: set GPUCOLL_BUFFSIZE "
                                 "alike on every rank")
        cdef bytes name = blob[_BLOB.size:]
        r = gc_ofichan_connect(self.c, <const char *>name, len(name), peer_id, slot_bytes, nslots)
        if r:
            raise OfiUnavailable(f"OFI channel to rank {self.peer}: {gc_ofi_strerror(r).decode()}")

    @property
    def ptr(self):
        """Address of the gc_chan (0 once closed); valid while this object lives."""
        return <uintptr_t>self.c

    def stats(self):
        """Messages sent eager and as RMA (read by the peer); bytes this side read one-sided, through
        the bounce ring and straight into the caller's memory. Read without the domain's lock."""
        if self.c == NULL:
            return {}
        return {"eager": self.c.n_eager, "rma": self.c.n_rma, "read_bounce": self.c.read_bounce,
                "read_direct": self.c.read_direct}

    @property
    def peer(self):
        return self.c.base.peer if self.c != NULL else -1

    @property
    def closed(self):
        return self.c == NULL

    def close(self):
        """Cancel what is posted, close the control socket. Idempotent."""
        if self.c != NULL:
            gc_ofichan_destroy(self.c)
            self.c = NULL

    def __dealloc__(self):
        if self.c != NULL:
            gc_ofichan_destroy(self.c)
            self.c = NULL

    def __repr__(self):
        return f"<OfiChannel peer={self.peer} via {self.dom.provider} ptr={self.ptr:#x}>"
