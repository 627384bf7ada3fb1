"""OFI transport: libfabric between hosts (RDMA on verbs, efa, cxi, psm3; its tcp provider elsewhere).

One `OfiEndpoint` per process holds the domain (gpucoll._native.ofi.OfiDomain: fabric, domain,
one reliable-datagram endpoint, completion queue, address vector) and a channel per
(communicator, peer). A channel is met through the process's TCP listener: one socket that
proves the job's secret like every other (transports/tcp.py, purpose OFI), on which the two
sides swap their endpoint addresses, channel ids and slot sizes, post their receives and say
so. The socket then stays with the channel as its control line: the peer's end closing
means the peer is gone. Bytes never pass through Python::

    serve(ctx.tcp(), ctx.ofi)                       # at start-up: the listener meets peers
    ep = OfiEndpoint(ctx.tcp(), "tcp;ofi_rxm", "eth0")
    ch = ep.channel(peer, ctx.tcp_addresses[peer], "world/coll")
    sock.chan_send_all(ch.ptr, b"...")
"""
import os
import struct
import threading
import time

from ..base import config, log
from ..base.errors import ConfigError, LostPeerError, TimeoutError
from . import lasting
from .handshake import Purpose
from .net import is_software, ofi_module

# One eager message at most (a multiple of the channel's alignment): below the eager limit of
# libfabric's rxm (16 KiB with its header) and efa (about 8 KiB), above which the provider adds
# a rendezvous of its own to every message.
SLOT_BYTES = 8 << 10
# Receive slots posted per channel: GPUCOLL_BUFFSIZE / (2 * SLOT_BYTES), within these bounds (a
# provider matches an arriving message against the posted receives in turn: hundreds of them
# per channel cost microseconds on every message).
MIN_SLOTS, MAX_SLOTS = 8, 64
_READY = b"\x01"
_LEN = struct.Struct("<I")
_BLOB_MAX = 4096


class OfiEndpoint:
    """tcp: this process's TcpEndpoint (its listener meets the channels); provider: libfabric's
    provider name; interface: the TCP listener's interface (ifaces.Interface), whose address a
    software provider (tcp) binds to.

    Of two peers the lower world rank connects the control socket and meets the channel in
    channel(); the higher one's listener hands the socket to accept() (serve() below), which
    meets it at once on its own thread, so a peer that needs a channel never waits for the
    other to ask for it too (point to point asks from one side only). libfabric is loaded and
    the domain opened only when a first channel is met (loading it takes a few tenths of a
    second: a rank waiting for a peer that is already gone says so first)."""

    def __init__(self, tcp, provider, interface=None):
        self._tcp, self._provider, self._interface = tcp, provider, interface
        self._ofi = None
        self._domain = None
        self._opening = threading.Lock()
        self._cond = threading.Condition()
        self._channels = {}     # (comm id, peer) -> OfiChannel
        self._failed = {}       # (comm id, peer) -> why the peer's attempt failed here

    @property
    def domain(self):
        """The process's OfiDomain, opened on first use."""
        with self._opening:
            if self._domain is None:
                ofi = ofi_module()
                source = self._interface.address if self._interface is not None and is_software(self._provider) \
                    else None
                try:
                    d = ofi.OfiDomain(self._provider, None, ofi.MR_VERBS, source=source)
                except ofi.OfiUnavailable as exc:
                    raise ConfigError(f"{config.NET.name}: libfabric's {self._provider} does not open here: {exc}. "
                                      f"Set {config.NET.name}=tcp to use sockets.") from None
                log.info("NET", "OFI endpoint of rank %d: %s, fabric %s, domain %s; registration honours %s "
                         "(the provider asks for %s); inject %d B; GPU memory %s", self._tcp.rank, d.provider,
                         d.fabric, d.domain, "|".join(d.mr_mode) or "nothing",
                         "|".join(d.provider_mr_mode) or "nothing", d.inject_size,
                         "registered directly (FI_HMEM)" if d.hmem else "staged through host memory")
                lasting.watch(d)  # MPI.Alloc_mem's memory: registered once for its life
                self._ofi, self._domain = ofi, d
            return self._domain

    def channel(self, peer_rank, peer_address, comm_id, timeout=None, check=None):
        """The channel to world rank `peer_rank` for communicator `comm_id`, met on first use."""
        key = (str(comm_id), int(peer_rank))
        ch = self._channels.get(key)
        if ch is not None and not ch.closed:
            return ch
        timeout = config.TIMEOUT.get() if timeout is None else float(timeout)
        if self._tcp.rank > key[1]:
            return self._await(key, peer_address, timeout, check)
        ctl = self._tcp.connect(key[1], peer_address, Purpose.OFI, key[0], timeout, check)
        ch = self._meet(ctl, key, peer_address, timeout)
        with self._cond:
            self._channels[key] = ch
        return ch

    def accept(self, conn, claim):
        """The higher rank's side: a peer connected for a channel (on a thread of its own)."""
        key = (claim.comm_id, claim.sender)
        address = "%s:%d" % conn.getpeername()[:2]
        try:
            ch = self._meet(conn, key, address, config.TIMEOUT.get())
        except Exception as exc:
            with self._cond:
                self._failed[key] = str(exc)
                self._cond.notify_all()
            raise
        with self._cond:
            old = self._channels.pop(key, None)
            self._channels[key] = ch
            self._failed.pop(key, None)
            self._cond.notify_all()
        if old is not None:
            old.close()

    def _await(self, key, address, timeout, check):
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if check is not None:
                    check()
                ch = self._channels.get(key)
                if ch is not None and not ch.closed:
                    return ch
                if key in self._failed:
                    raise LostPeerError(f"rank {self._tcp.rank}: the OFI channel rank {key[1]} opened for "
                                        f"{key[0]!r} failed: {self._failed.pop(key)}", ranks=(key[1],))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"rank {self._tcp.rank}: rank {key[1]} at {address} did not open its OFI "
                                       f"channel for {key[0]!r} within {timeout:g} s")
                self._cond.wait(min(left, 0.25))

    def _meet(self, ctl, key, address, timeout):
        """Build the channel on the control socket `ctl` (taken: closed here, a duplicate stays with
        the channel): swap set-up messages, post the receives, wait for the peer's word."""
        comm_id, peer = key
        try:
            domain = self.domain
            nslots = min(MAX_SLOTS, max(MIN_SLOTS, config.BUFFSIZE.get() // (2 * SLOT_BYTES)))
            ch = self._ofi.OfiChannel(domain, os.dup(ctl.fileno()), peer=peer, slot_bytes=SLOT_BYTES,
                                      nslots=nslots, rma_min=config.OFI_RMA_MIN.get(), address=address)
            try:
                _swap(ctl, ch, timeout, self._ofi.OfiUnavailable)
            except (OSError, ValueError, EOFError) as exc:
                ch.close()
                raise LostPeerError(f"rank {self._tcp.rank}: setting up the OFI channel with rank {peer} at "
                                    f"{address} failed: {exc}", ranks=(peer,)) from None
            except BaseException:
                ch.close()
                raise
        finally:
            ctl.close()
        log.info("NET", "rank %d <-> rank %d at %s: OFI channel, comm %s, %d slots of %d B, reads from %d B",
                 self._tcp.rank, peer, address, comm_id, nslots, SLOT_BYTES, ch.rma_min)
        return ch

    def stats(self):
        """{(communicator id, peer): OfiChannel.stats()} of the open channels."""
        with self._cond:
            return {key: ch.stats() for key, ch in self._channels.items() if not ch.closed}

    def close(self):
        with self._cond:
            chans, self._channels = list(self._channels.values()), {}
        for ch in chans:
            ch.close()
        if self._domain is not None:
            self._domain.close()

    def __repr__(self):
        return f"<OfiEndpoint {self._provider} {self._domain!r}>"


def _swap(ctl, ch, timeout, unavailable):
    ctl.settimeout(timeout)
    blob = ch.setup_blob()
    ctl.sendall(_LEN.pack(len(blob)) + blob)
    n, = _LEN.unpack(_recv_exact(ctl, _LEN.size))
    if not 0 < n <= _BLOB_MAX:
        raise ValueError(f"a set-up message of {n} bytes")
    try:
        ch.connect(_recv_exact(ctl, n))
    except unavailable as exc:
        raise ConfigError(str(exc)) from None
    ctl.sendall(_READY)
    if _recv_exact(ctl, 1) != _READY:
        raise ValueError("an unexpected ready word")


def serve(tcp, endpoint):
    """Have `tcp`'s listener hand OFI control sockets to endpoint().accept on a thread each
    (endpoint: a callable returning the process's OfiEndpoint, made on first need)."""
    def accepted(conn, claim):
        threading.Thread(target=_accept, args=(endpoint, conn, claim), daemon=True,
                         name=f"gpucoll-ofi-accept-{claim.sender}").start()

    tcp.serve(Purpose.OFI, accepted)


def _accept(endpoint, conn, claim):
    try:
        endpoint().accept(conn, claim)
    except Exception as exc:  # the peer's side fails on its own (the socket closes); say why here
        conn.close()
        log.warn("NET", "OFI channel asked for by rank %d (%s): %s", claim.sender, claim.comm_id, exc)


def _recv_exact(sock, n):
    out = bytearray()
    while len(out) < n:
        part = sock.recv(n - len(out))
        if not part:
            raise EOFError("the peer closed the control socket")
        out += part
    return bytes(out)
