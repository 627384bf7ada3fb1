"""TCP transport: one listening socket per process, striped channels to peers.

Each process opens a `TcpEndpoint`, publishes `endpoint.address` ("ip:port") through the
bootstrap, and asks for a channel per (communicator, peer) when it needs one. Of two
peers, the lower world rank connects its GPUCOLL_NSOCKS sockets and the higher one
accepts them. Every socket starts with the job's handshake (handshake.py): both sides
prove the job's secret, and the connector's claim (its rank, the target rank, the
communicator, the stripe and the stripe count) is bound to that proof, so the acceptor
files the socket under what it proved. The channel (`gpucoll._native.sock.TcpChannel`)
then owns the sockets and the executor drives it without the GIL through `channel.ptr`::

    ep = TcpEndpoint(rank, secret)               # binds the GPUCOLL_SOCKET_IFNAME interface
    store.set(f"tcp/{rank}", ep.address)
    ch = ep.channel(peer, store.get(f"tcp/{peer}"), comm_id="world")
    sock.chan_send_all(ch.ptr, b"...")
"""
import errno
import socket
import threading
import time

from .._native import sock as _sock
from ..base import config, log
from ..base.errors import ConfigError, InvalidUsageError, LostPeerError, TimeoutError
from . import handshake, ifaces
from .handshake import Claim, HandshakeError, Purpose

# The stripe unit: large enough that a syscall moves a lot, small enough that several
# sockets share a medium message.
CHUNK_BYTES = 512 << 10
# 0 keeps Linux's buffer autotuning, which grows past what an explicit SO_SNDBUF/SO_RCVBUF
# may (net.core.[rw]mem_max caps those, and setting them switches autotuning off).
SOCKBUF = 0
_HELLO_TIMEOUT = handshake.HANDSHAKE_TIMEOUT


def _split(address):
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidUsageError(f"not an ip:port address: {address!r}")
    return host, int(port)


class TcpEndpoint:
    """This process's TCP presence: a listener on one interface, whose connections are
    authenticated concurrently (handshake.PeerListener) and filed by (communicator, peer),
    and a cache of channels.

    rank: this process's world rank. secret: the job's secret (bytes). interface: the
    ifaces.Interface to listen on; else ifname, an interface spec in
    GPUCOLL_SOCKET_IFNAME's syntax (``"lo"``, ``"=eth0"``, ``"^docker"``); else the
    variable decides.
    """

    def __init__(self, rank, secret, ifname=None, interface=None):
        self.rank = int(rank)
        self._secret = bytes(secret)
        if interface is None:
            source = "ifname" if ifname is not None else None
            interface = ifaces.select_interface(ifname, source=source)
        self.interface = interface
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            _sock.tune_socket(listener.fileno(), SOCKBUF)   # accepted sockets inherit it
            listener.bind((self.interface.address, 0))
            listener.listen(128)
        except BaseException:
            listener.close()
            raise
        self._cond = threading.Condition()
        self._filed = {}        # (comm_id, peer) -> {stripe index: (socket, nsocks)}
        self._channels = {}     # (comm_id, peer) -> TcpChannel
        self._closed = False
        host, port = listener.getsockname()
        self.address = f"{host}:{port}"
        self._handlers = {}     # purpose -> called with each such connection (links.py: P2P, ofi.py: OFI)
        self._early = []        # connections whose purpose had no handler yet
        self._listener = handshake.PeerListener(listener, self._secret, (Purpose.TCP, Purpose.P2P, Purpose.OFI),
                                                self.rank,
                                                self._file, f"the TCP listener of rank {self.rank} at {self.address}")
        log.info("NET", "TCP endpoint of rank %d listens on %s (%s)", self.rank, self.address,
                 self.interface.name)

    # -- accepting ---------------------------------------------------------------------
    def serve(self, purpose, on_peer):
        """Hand every authenticated connection of `purpose` (P2P, OFI) to on_peer(conn, claim), on
        the listener's thread (it must not block); those that came before are handed over now."""
        with self._cond:
            self._handlers[purpose] = on_peer
            early = [(c, cl) for c, cl in self._early if cl.purpose == purpose]
            self._early = [(c, cl) for c, cl in self._early if cl.purpose != purpose]
        for conn, claim in early:
            on_peer(conn, claim)

    def _file(self, conn, claim):
        """A peer proved the secret and its claim (on the listener's thread)."""
        if claim.purpose != Purpose.TCP:
            with self._cond:
                on_peer = self._handlers.get(claim.purpose)
                if on_peer is None:  # a peer that started sooner: kept until the handler is set
                    self._early.append((conn, claim))
                    return
            on_peer(conn, claim)
            return
        if claim.sender == self.rank or claim.sender < 0:
            raise ValueError(f"a channel from rank {claim.sender} to rank {self.rank} makes no sense")
        if not 1 <= claim.nsocks <= _sock.MAX_SOCKS or claim.stripe >= claim.nsocks:
            raise ValueError(f"stripe {claim.stripe} of {claim.nsocks} is not a valid stripe")
        with self._cond:
            if self._closed:
                raise ValueError("the endpoint is closed")
            slots = self._filed.setdefault((claim.comm_id, claim.sender), {})
            old = slots.get(claim.stripe)
            if old is not None:
                old[0].close()
            slots[claim.stripe] = (conn, claim.nsocks)
            self._cond.notify_all()

    # -- channels ----------------------------------------------------------------------
    def channel(self, peer_rank, peer_address, comm_id=0, nsocks=None, timeout=None,
                ring_bytes=None, chunk_bytes=CHUNK_BYTES, check=None):
        """The channel to world rank `peer_rank` (listening at `peer_address`) for
        communicator `comm_id`, built on first use and cached.

        nsocks defaults to GPUCOLL_NSOCKS and must agree on both sides; ring_bytes to
        GPUCOLL_BUFFSIZE; timeout (seconds to connect or be connected) to GPUCOLL_TIMEOUT
        (channels are made in a collective, which the peer may reach late). `check()` is
        called about every 0.25 s while waiting and may raise to stop (a peer known to have
        ended). Raises gpucoll.TimeoutError naming the peer and its address.
        """
        peer_rank = int(peer_rank)
        comm_id = str(comm_id)
        key = (comm_id, peer_rank)
        ch = self._channels.get(key)
        if ch is not None and not ch.closed:
            return ch
        nsocks = config.NSOCKS.get() if nsocks is None else int(nsocks)
        ring_bytes = config.BUFFSIZE.get() if ring_bytes is None else int(ring_bytes)
        ring_bytes = -(-ring_bytes // _sock.ALIGN) * _sock.ALIGN
        fds = self._sockets(peer_rank, peer_address, comm_id, nsocks, timeout, check)
        try:
            ch = _sock.TcpChannel(fds, peer=peer_rank, ring_bytes=ring_bytes, chunk_bytes=chunk_bytes,
                                  address=peer_address)
        except BaseException:
            for fd in fds:
                socket.close(fd)
            raise
        self._channels[key] = ch
        log.info("NET", "rank %d <-> rank %d at %s: TCP channel, comm %s, %d sockets, ring %d B, chunk %d B",
                 self.rank, peer_rank, peer_address, comm_id, nsocks, ring_bytes, chunk_bytes)
        return ch

    def _sockets(self, peer_rank, peer_address, comm_id, nsocks, timeout, check):
        """`nsocks` connected sockets to world rank `peer_rank` for `comm_id`, each proven by the
        job's handshake (file descriptors): the lower rank connects, the higher one takes what
        its listener filed."""
        peer_rank = int(peer_rank)
        if peer_rank == self.rank:
            raise InvalidUsageError(f"rank {self.rank} asked for a TCP channel to itself")
        if self._closed:
            raise InvalidUsageError("the TCP endpoint is closed")
        if not 1 <= nsocks <= _sock.MAX_SOCKS:
            raise InvalidUsageError(f"nsocks={nsocks}: a TCP channel takes 1 to {_sock.MAX_SOCKS} sockets")
        timeout = config.TIMEOUT.get() if timeout is None else float(timeout)
        if self.rank < peer_rank:
            return self._connect(peer_rank, peer_address, str(comm_id), nsocks, timeout, check)
        return self._await(peer_rank, peer_address, str(comm_id), nsocks, timeout, check)

    def connect(self, peer_rank, peer_address, purpose, comm_id, timeout=None, check=None):
        """One socket to world rank `peer_rank`, proven by the job's handshake, whose claim says
        `purpose` and `comm_id` (the peer's handler for that purpose takes it). The caller owns it."""
        timeout = config.TIMEOUT.get() if timeout is None else float(timeout)
        fd, = self._connect(int(peer_rank), peer_address, str(comm_id), 1, timeout, check, purpose)
        return socket.socket(fileno=fd)

    def _connect(self, peer, address, comm_id, nsocks, timeout, check=None, purpose=Purpose.TCP):
        host, port = _split(address)
        deadline = time.monotonic() + timeout
        socks = []
        try:
            for index in range(nsocks):
                s = _connect_retrying(host, port, deadline, peer, address, self.rank, timeout, check)
                socks.append(s)
                claim = Claim(purpose, self.rank, peer, comm_id, index, nsocks)
                try:
                    handshake.connect(s, self._secret, claim, _HELLO_TIMEOUT)
                except (HandshakeError, OSError) as exc:
                    raise _lost(self.rank, peer, address, f"the handshake failed: {exc}") from None
            return [s.detach() for s in socks]
        finally:
            for s in socks:
                s.close()    # no-op once detached

    def _await(self, peer, address, comm_id, nsocks, timeout, check=None):
        key = (comm_id, peer)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if check is not None:
                    check()
                slots = self._filed.get(key, {})
                mismatch = [n for _, n in slots.values() if n != nsocks]
                if mismatch:
                    raise ConfigError(
                        f"rank {peer} at {address} opens {mismatch[0]} sockets per peer but rank "
                        f"{self.rank} expects {nsocks}: set {config.NSOCKS.name} alike on every rank")
                if len(slots) == nsocks and all(i in slots for i in range(nsocks)):
                    del self._filed[key]
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"rank {self.rank}: rank {peer} at {address} connected {len(slots)} of {nsocks} "
                        f"sockets for communicator {comm_id!r} within {timeout:g} s "
                        f"(this rank listens on {self.address})")
                self._cond.wait(min(left, 0.25))
        return [slots[i][0].detach() for i in range(nsocks)]

    def close(self):
        """Close every channel, the listener and the sockets not yet claimed."""
        if self._closed:
            return
        with self._cond:
            self._closed = True
        self._listener.close()
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        with self._cond:
            for slots in self._filed.values():
                for s, _ in slots.values():
                    s.close()
            self._filed.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<TcpEndpoint rank={self.rank} {self.address} ({self.interface.name})>"


def _lost(rank, peer, address, why):
    return LostPeerError(f"rank {rank}: TCP connection to rank {peer} at {address}: {why}", ranks=(peer,))


def _connect_retrying(host, port, deadline, peer, address, rank, timeout, check=None):
    """Connect, retrying with backoff while the peer is not listening yet (refused,
    unreachable for a moment) until the deadline or until check() raises."""
    delay = 0.01
    last = None
    while True:
        if check is not None and last is not None:
            check()
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        _sock.tune_socket(s.fileno(), SOCKBUF)   # before connect: the window scale depends on it
        left = deadline - time.monotonic()
        s.settimeout(max(left, 0.001))
        try:
            s.connect((host, port))
            s.settimeout(_HELLO_TIMEOUT)
            return s
        except OSError as exc:
            s.close()
            last = exc
            transient = isinstance(exc, (ConnectionRefusedError, socket.timeout)) or exc.errno in (
                errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT,
                errno.ECONNABORTED, errno.EAGAIN)
            if not transient:
                raise _lost(rank, peer, address, f"connect failed: {exc}") from exc
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"rank {rank}: could not connect to rank {peer} at {address} within "
                               f"{timeout:g} s (last error: {last})")
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.5)
