"""Tagged point-to-point messages (Send/Recv, Isend/Irecv, send/recv of objects).

Every process keeps one inbox: a listening socket and one reader thread. A sender
opens one connection per destination process, proves the job's secret in the job's
handshake (transports/handshake.py, which also proves the inbox to the sender), and
writes framed messages (communicator key, tag, length, kind, payload). A frame's source
is the world rank that connection proved, translated into the communicator's rank; a
frame's length is checked before anything is allocated for it. The reader matches each
message against the receives posted on that communicator, in arrival order, and reads
the payload straight into the matching buffer; a message nobody waits for yet is kept
until a receive asks for it. So a Send never waits for its Recv (as an eager MPI send),
messages between two ranks never overtake each other, and ANY_SOURCE / ANY_TAG work.
"""
import hashlib
import os
import pickle
import selectors
import socket
import struct
import threading
import time

import numpy as np

from . import config, log
from .engine import OrderedEngine
from .errors import GpucollError, InvalidUsageError, LostPeerError
from .errors import TimeoutError as GpucollTimeout
from .request import CompletedRequest, Request
from .transports import handshake
from .transports.handshake import Claim, HandshakeError, Purpose

ANY_SOURCE = -1
ANY_TAG = -1
PROC_NULL = -2  # a peer that does not exist: sends to it and receives from it do nothing, at once
OBJECT_GATHER_TAG = -1001  # tags below zero are reserved for gpucoll's object methods
OBJECT_SCATTER_TAG = -1002
GPU_REPLY_TAG = -1003  # a GPU receiver's answer to an offer (gpucoll/gpu/p2p.py)
GPU_BYTES_TAG = -1004  # the bytes of an offer that the receiver could not map

BYTES, OFFER = 0, 1  # frame kinds: the payload is the message / describes GPU memory to pull
# A synchronous send (gpucoll.MPI's Ssend) is a BYTES message whose kind is SYNC | (n << 8): the
# receiver answers the match with an empty message tagged SYNC_ACK_TAG - n, which completes the send.
SYNC = 2
SYNC_ACK_TAG = -2000
_FRAME = struct.Struct("!QiQI")  # communicator key, tag, payload bytes, kind
_ONE_WRITE_MAX = 64 << 10  # payloads up to this size are copied behind their header and written at once
_OFFER_MAX = 4096  # an offer describes GPU memory (gpucoll/gpu/p2p.py: 144 bytes): never more
_DISCARD_CHUNK = 1 << 20  # the bytes of a message too large for its receive are read away in these


def _memory_bytes():
    """This host's physical memory: no message larger than that can be received here."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 1 << 40


MAX_MESSAGE = _memory_bytes()


class _BadFrame(Exception):
    """An authenticated peer sent a frame that breaks the format or the limits: that peer is dropped."""


def comm_key(comm_id):
    return int.from_bytes(hashlib.blake2b(comm_id.encode(), digest_size=8).digest(), "big")


class Status:
    """Source, tag and size of a received message (mpi4py's Status)."""

    def __init__(self):
        self.source = ANY_SOURCE
        self.tag = ANY_TAG
        self.nbytes = 0

    def Get_source(self):
        return self.source

    def Get_tag(self):
        return self.tag

    def Get_count(self, datatype=None):
        size = 1 if datatype is None else datatype.Get_size()
        return self.nbytes // size

    def Get_elements(self, datatype=None):
        return self.Get_count(datatype)


class _Posted:
    """A receive waiting for its message."""

    __slots__ = ("source", "tag", "view", "request", "status", "want_bytes", "owner", "gpu", "report_tag")

    def __init__(self, source, tag, view, request, status, want_bytes, owner=None, gpu=None):
        self.source, self.tag, self.view = source, tag, view
        self.request, self.status, self.want_bytes = request, status, want_bytes
        self.owner = owner          # the PointToPoint that posted it (answers offers)
        self.gpu = gpu              # GPU receives: where the bytes go (gpucoll/gpu/p2p.py)
        self.report_tag = None      # the tag the status reports, when it is not the frame's

    def matches(self, source, tag):
        return self.source in (ANY_SOURCE, source) and (self.tag == tag or (self.tag == ANY_TAG and tag >= 0))


class _Box:
    """Per-communicator matching state (created on first use from either side)."""

    def __init__(self):
        self.unexpected = []  # (sender's world rank, tag, bytes, kind) in arrival order
        self.posted = []


class Inbox:
    """The process-wide listener and reader thread; see the module docstring.

    secret: the job's secret; rank, size: this process's world rank and the world's size;
    host: the address to listen on (loopback in a one-host job)."""

    def __init__(self, secret, rank, size, host):
        self.rank, self.size = rank, size
        self._lock = threading.Lock()
        self._boxes = {}  # comm key -> _Box
        self._members = {}  # comm key -> {world rank: comm rank}
        self._worlds = {}  # comm key -> world rank of each comm rank
        self._lost = {}  # world rank -> why its connection is gone
        self._sel = selectors.DefaultSelector()
        listener = socket.create_server((host, 0), backlog=1024)
        self.address = "%s:%d" % listener.getsockname()[:2]
        # The handshakes run on the listener's thread: no client, silent or not, holds up delivery.
        self._listener = handshake.PeerListener(listener, secret, Purpose.P2P, rank, self._take_peer,
                                                f"the point-to-point inbox of rank {rank} at {self.address}")
        self._thread = threading.Thread(target=self._loop, name="gpucoll-inbox", daemon=True)
        self._thread.start()
        log.info("NET", "point-to-point inbox of rank %d listens on %s", rank, self.address)

    def box(self, key):
        with self._lock:
            return self._boxes.setdefault(key, _Box())

    # --- reader thread ---------------------------------------------------------------
    def _take_peer(self, conn, claim):
        """A sender proved the secret and its world rank (on the listener's thread)."""
        if not 0 <= claim.sender < self.size:
            raise ValueError(f"rank {claim.sender} is out of range for a job of {self.size} ranks")
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sel.register(conn, selectors.EVENT_READ, claim.sender)  # epoll: safe while select() waits

    def _loop(self):
        while True:
            for key, _ in self._sel.select():
                self._read_frame(key.fileobj, key.data)

    def _source(self, key, world_rank):
        """The sender's rank in communicator `key`, or None while that communicator is not
        known here yet (its messages wait, filed by world rank). Call with the lock held."""
        members = self._members.get(key)
        if members is None:
            return None
        if world_rank not in members:
            raise _BadFrame(f"a frame for a communicator that rank {world_rank} is not a member of")
        return members[world_rank]

    def _match(self, box, key, world_rank, tag):
        """(source, the posted receive the message fills or None); the receive is taken."""
        with self._lock:
            source = self._source(key, world_rank)
            posted = None if source is None else next((p for p in box.posted if p.matches(source, tag)), None)
            if posted is not None:
                box.posted.remove(posted)
            return source, posted

    def _read_frame(self, conn, world_rank):
        try:
            key, tag, nbytes, kind = _FRAME.unpack(_recv_exact(conn, _FRAME.size))
        except (OSError, ConnectionError):
            self._drop(conn, world_rank, "its connection closed (the process ended or crashed)")
            return
        source = posted = None
        try:
            limit = _OFFER_MAX if kind == OFFER else MAX_MESSAGE
            if kind & 0xFF not in (BYTES, OFFER, SYNC) or (kind > 0xFF and kind & 0xFF != SYNC):
                raise _BadFrame(f"a frame of unknown kind {kind}")
            if nbytes > limit:
                raise _BadFrame(f"a frame announcing {nbytes} bytes, more than the {limit} a "
                                f"{'GPU offer' if kind == OFFER else 'message'} may have here")
            box = self.box(key)
            source, posted = self._match(box, key, world_rank, tag)
            if posted is None or kind == OFFER:
                payload = bytearray(nbytes)
                _recv_into(conn, memoryview(payload))
                if posted is None:  # a receive may have been posted while the payload arrived
                    source, posted = self._match(box, key, world_rank, tag)
                    if posted is None:
                        with self._lock:
                            box.unexpected.append((world_rank, tag, payload, kind))
                        return
                _deliver(posted, source, tag, memoryview(payload), kind)
            else:
                _deliver_from_socket(posted, source, tag, nbytes, conn, kind)
        except (OSError, ConnectionError):
            # The receive being filled is no longer posted: _drop names it, else its Wait
            # would block for ever.
            self._drop(conn, world_rank, "its connection closed (the process ended or crashed)",
                       posted, source, f" in the middle of a {nbytes}-byte message with tag {tag}")
        except Exception as exc:  # _BadFrame, MemoryError, ...: drop that peer, the reader lives on
            why = f"rank {self.rank} dropped its connection: it sent {exc}" if isinstance(exc, _BadFrame) else \
                f"rank {self.rank} dropped its connection after an error ({type(exc).__name__}: {exc})"
            log.warn("P2P", "point-to-point connection from rank %d: %s", world_rank, why)
            self._drop(conn, world_rank, why, posted, source, f" (a {nbytes}-byte message with tag {tag})")

    def _drop(self, conn, world_rank, why, posted=None, source=None, what=""):
        """Close a sender's connection and fail the receives that wait for that rank only."""
        try:
            self._sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()
        if posted is not None and not posted.request._done.is_set():
            posted.request._finish(error=LostPeerError(f"Recv from rank {source}: {why}{what}", ranks=[source]))
        failed = []
        with self._lock:
            self._lost.setdefault(world_rank, why)
            for key, members in self._members.items():
                rank = members.get(world_rank)
                box = self._boxes.get(key)
                if rank is None or box is None:
                    continue
                for p in [p for p in box.posted if p.source == rank]:
                    box.posted.remove(p)
                    failed.append(p)
        for p in failed:
            p.request._finish(error=LostPeerError(f"Recv from rank {p.source}: {why} before the message arrived",
                                                  ranks=[p.source]))

    def register(self, key, world_ranks):
        with self._lock:
            members = self._members[key] = {w: r for r, w in enumerate(world_ranks)}
            self._worlds[key] = list(world_ranks)
            box = self._boxes.get(key)
            strays = [m for m in box.unexpected if m[0] not in members] if box is not None else []
            for m in strays:
                box.unexpected.remove(m)
        for world, tag, _, _ in strays:
            log.warn("P2P", "dropped a message with tag %d from rank %d: that rank is not a member of the "
                     "communicator it was sent on", tag, world)

    def unregister(self, key, why):
        """Forget a freed communicator: drop its unread messages and fail its pending receives."""
        with self._lock:
            self._members.pop(key, None)
            self._worlds.pop(key, None)
            box = self._boxes.pop(key, None)
        for posted in box.posted if box is not None else ():
            posted.request._finish(error=InvalidUsageError(why))

    # --- matching for receives ---------------------------------------------------------
    def post(self, key, posted):
        box = self.box(key)
        with self._lock:
            members = self._members[key]
            for i, (world, tag, payload, kind) in enumerate(box.unexpected):
                source = members[world]
                if posted.matches(source, tag):
                    del box.unexpected[i]
                    break
            else:
                if self._lost and posted.source != ANY_SOURCE:
                    why = self._lost.get(self._worlds[key][posted.source])
                    if why is not None:
                        raise LostPeerError(f"Recv from rank {posted.source}: {why}", ranks=[posted.source])
                box.posted.append(posted)
                return
        _deliver(posted, source, tag, memoryview(payload), kind)

    def deliver_local(self, key, source, tag, payload):
        """A message from this very process (an acknowledgement to ourselves), matched as if it had
        arrived: no round trip through our own socket."""
        box = self.box(key)
        with self._lock:
            posted = next((p for p in box.posted if p.matches(source, tag)), None)
            if posted is None:
                box.unexpected.append((self._worlds[key][source], tag, bytearray(payload), BYTES))
                return
            box.posted.remove(posted)
        _deliver(posted, source, tag, memoryview(payload))

    def find_unexpected(self, key, source, tag, take):
        """The first arrived, unreceived message of communicator `key` that matches (source, tag)
        (ANY_TAG: user tags only), as (source rank, tag, payload, kind), removed when `take`;
        None when none has arrived. What probes read."""
        box = self.box(key)
        with self._lock:
            members = self._members[key]
            for i, (world, tg, payload, kind) in enumerate(box.unexpected):
                src = members[world]
                if source in (ANY_SOURCE, src) and (tag == tg or (tag == ANY_TAG and tg >= 0)):
                    if take:
                        del box.unexpected[i]
                    return src, tg, payload, kind
        return None

    def withdraw(self, key, posted):
        box = self.box(key)
        with self._lock:
            if posted in box.posted:
                box.posted.remove(posted)
                return True
        return False


def _recv_exact(conn, n):
    data = bytearray(n)
    _recv_into(conn, memoryview(data))
    return bytes(data)


def _recv_into(conn, view):
    while len(view):
        got = conn.recv_into(view)
        if not got:
            raise ConnectionError("connection closed")
        view = view[got:]


def _check_fits(posted, source, tag, nbytes):
    if posted.want_bytes is not None and nbytes > posted.want_bytes:
        return GpucollError(
            f"message truncated: rank {source} sent {nbytes} bytes with tag {tag}, the receive buffer "
            f"holds {posted.want_bytes}; pass a larger buffer")
    return None


def _deliver(posted, source, tag, payload, kind=BYTES):
    if kind == OFFER:  # the message is in the sender's GPU memory: the receive's owner answers
        posted.owner.answer_offer(posted, source, tag, bytes(payload))
        return
    error = _check_fits(posted, source, tag, len(payload))
    if error is None and posted.view is not None:
        posted.view[:len(payload)] = payload
    acknowledge(posted.owner, source, kind)  # before the receive completes: the sender is done first
    _complete(posted, source, tag, len(payload), error, payload)


def _discard(conn, nbytes):
    """Read away a message that its receive cannot hold, in bounded pieces."""
    scratch = memoryview(bytearray(min(nbytes, _DISCARD_CHUNK)))
    while nbytes:
        step = min(nbytes, len(scratch))
        _recv_into(conn, scratch[:step])
        nbytes -= step


def _deliver_from_socket(posted, source, tag, nbytes, conn, kind=BYTES):
    error = _check_fits(posted, source, tag, nbytes)
    payload = None
    if error is not None:
        _discard(conn, nbytes)
    elif posted.view is not None:
        _recv_into(conn, posted.view[:nbytes])
    else:  # an object: its pickle, at most MAX_MESSAGE bytes (checked before)
        payload = memoryview(_recv_exact(conn, nbytes))
    acknowledge(posted.owner, source, kind)
    _complete(posted, source, tag, nbytes, error, payload)


def acknowledge(owner, source, kind):
    """Answer the match of a synchronous send (kind SYNC | n << 8) with its acknowledgement."""
    if kind & 0xFF != SYNC or owner is None:
        return
    tag = SYNC_ACK_TAG - (kind >> 8)
    if owner._comm.world_ranks[source] == owner._ctx.rank:
        owner._ctx.inbox.deliver_local(owner._key, owner._comm.rank, tag, b"")
        return
    try:
        owner.send_now(b"", source, tag)
    except (GpucollError, OSError) as exc:  # the sender is gone: its send fails on its own side
        log.warn("P2P", "could not acknowledge a synchronous send from rank %d: %s", source, exc)


def _complete(posted, source, tag, nbytes, error, payload):
    if posted.status is not None:
        reported = tag if posted.report_tag is None else posted.report_tag
        posted.status.source, posted.status.tag, posted.status.nbytes = source, reported, nbytes
    if posted.gpu is not None:  # the bytes are in host memory: the GPU side copies them up
        posted.gpu.landed(posted, nbytes, error)
        return
    value = None
    if error is None and posted.view is None:  # an object receive
        try:
            value = pickle.loads(payload) if len(payload) else None  # an empty message is None
        except Exception as exc:  # the receiver's error, raised by its wait(); the reader thread lives on
            error = exc
    posted.request._finish(value, error)


class PointToPoint:
    """Point-to-point messaging of one communicator."""

    def __init__(self, comm):
        self._comm = comm
        self._ctx = comm._ctx
        self._key = comm_key(comm._id)
        self._ctx.inbox.register(self._key, comm.world_ranks)
        self._senders = {}
        self._conns = {}
        self._lock = threading.Lock()
        self._timeout = config.TIMEOUT.get()
        self._gpu = None  # gpucoll.gpu.p2p.GpuPointToPoint, made by the first GPU buffer either way

    def _check_peer(self, peer, what):
        if not isinstance(peer, (int, np.integer)) or not 0 <= peer < self._comm.size:
            raise InvalidUsageError(f"{what} rank {peer!r} is out of range for a communicator of size "
                                    f"{self._comm.size}")
        return int(peer)

    def _connection(self, dest):
        world = self._comm.world_ranks[dest]
        conn = self._conns.get(world) or self._ctx.p2p_connections.get(world)
        if conn is None:
            conn = self._ctx.connect_p2p(world)
        self._conns[world] = conn
        return conn

    def _sender(self, dest):
        with self._lock:
            engine = self._senders.get(dest)
            if engine is None:
                engine = self._senders[dest] = OrderedEngine(f"{self._comm._id}-send{dest}")
            return engine

    def gpu(self):
        """GPU buffers' point to point on this communicator (gpucoll/gpu/p2p.py)."""
        with self._lock:
            if self._gpu is None:
                from .gpu.p2p import GpuPointToPoint

                self._gpu = GpuPointToPoint(self)
            return self._gpu

    def same_host(self, rank):
        """True when `rank` is another process on this host (CUDA IPC can reach its memory)."""
        world = self._comm.world_ranks[rank]
        return rank != self._comm.rank and self._ctx.hosts[world] == self._ctx.hosts[self._ctx.rank]

    def send_now(self, payload, dest, tag, kind=BYTES):
        """Write one frame in the calling thread, beside the ordered sends (answers to offers:
        they must not queue behind a send that waits for this very answer)."""
        self._send_task(payload, dest, tag, kind)()

    def answer_offer(self, posted, source, tag, offer):
        """A sender offers GPU memory for a posted receive (called by the inbox's reader)."""
        if posted.gpu is not None:
            posted.gpu.owner.pull(posted, source, tag, offer)
            return
        # A host receive: ask for the bytes, which then fill it like any message.
        self.gpu().ask_for_bytes(posted, source, tag)

    def _send_task(self, payload, dest, tag, kind=BYTES):
        header = _FRAME.pack(self._key, tag, len(payload), kind)

        def task():
            conn, lock = self._connection(dest)
            try:
                with lock:
                    if len(payload) <= _ONE_WRITE_MAX:  # one segment: one wake-up on the other side
                        conn.sendall(header + payload)
                    else:
                        conn.sendall(header)
                        conn.sendall(payload)
            except OSError as exc:
                raise LostPeerError(f"Send to rank {dest} failed: {exc} (the process ended or crashed)",
                                    ranks=[dest]) from None
        return task

    @staticmethod
    def _payload(buf):
        return memoryview(buf.array).cast("B") if buf.count else memoryview(b"")

    def send(self, buf, dest, tag):
        if dest == PROC_NULL:
            return
        dest = self._check_peer(dest, "destination")
        self._sender(dest).run(self._send_task(self._payload(buf), dest, int(tag)))

    def isend(self, buf, dest, tag):
        if dest == PROC_NULL:
            return CompletedRequest("Isend")
        dest = self._check_peer(dest, "destination")
        return self._sender(dest).submit(self._send_task(self._payload(buf), dest, int(tag)), "Isend")

    def send_object(self, obj, dest, tag):
        if dest == PROC_NULL:
            return
        dest = self._check_peer(dest, "destination")
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self._sender(dest).run(self._send_task(memoryview(data), dest, int(tag)))

    def isend_object(self, obj, dest, tag):
        if dest == PROC_NULL:
            return CompletedRequest("isend")
        dest = self._check_peer(dest, "destination")
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        return self._sender(dest).submit(self._send_task(memoryview(data), dest, int(tag)), "isend")

    def _post(self, view, source, tag, status, want_bytes, name, gpu=None, request_type=None):
        if source not in (ANY_SOURCE, PROC_NULL):
            source = self._check_peer(source, "source")
        req = (request_type or _TimedRequest)(name, self, source, tag)
        # Keep a status even when the caller passed none: Wait(status)/Test(status) copy it.
        req.status = status if status is not None else Status()
        if source == PROC_NULL:  # MPI: done at once, no data, source PROC_NULL and tag ANY_TAG
            req.status.source, req.status.tag, req.status.nbytes = PROC_NULL, ANY_TAG, 0
            req._finish()
            return req
        posted = _Posted(source, int(tag), view, req, req.status, want_bytes, self, gpu)
        req.posted = posted
        self._ctx.inbox.post(self._key, posted)
        return req

    def repost(self, posted, source, offer_tag):
        """Post `posted` again for the bytes of an offer it matched, which `source` then sends
        with GPU_BYTES_TAG; its status reports the offer's tag."""
        again = _Posted(source, GPU_BYTES_TAG, posted.view, posted.request, posted.status, posted.want_bytes,
                        self, posted.gpu)
        again.report_tag = offer_tag
        posted.request.posted = again
        self._ctx.inbox.post(self._key, again)

    def irecv(self, buf, source, tag, status=None):
        view = memoryview(buf.array).cast("B") if buf.count else memoryview(bytearray(0))
        return self._post(view, source, tag, status, buf.nbytes, "Irecv")

    def irecv_object(self, source, tag, status=None):
        return self._post(None, source, tag, status, None, "irecv")

    def close(self):
        for engine in self._senders.values():
            engine.close()
        if self._gpu is not None:
            self._gpu.close()
        self._ctx.inbox.unregister(self._key, f"communicator {self._comm.name} was freed while this receive "
                                              "was pending")


class _TimedRequest(Request):
    """A receive request whose Wait gives up after GPUCOLL_TIMEOUT, naming what it waited for."""

    __slots__ = ("p2p", "source", "tag", "posted", "status")

    def __init__(self, name, p2p, source, tag):
        super().__init__(name)
        self.p2p, self.source, self.tag, self.posted, self.status = p2p, source, tag, None, None

    def _fill(self, status):
        if status is not self.status and self.status is not None:
            status.source, status.tag, status.nbytes = self.status.source, self.status.tag, self.status.nbytes

    def Wait(self, status=None):
        timeout = self.p2p._timeout
        if not self._done.wait(timeout):
            if self.p2p._ctx.inbox.withdraw(self.p2p._key, self.posted):
                src = "any rank" if self.source == ANY_SOURCE else f"rank {self.source}"
                tag = "any tag" if self.tag == ANY_TAG else f"tag {self.tag}"
                raise GpucollTimeout(
                    f"{self.name} on rank {self.p2p._comm.rank}: no message from {src} with {tag} within "
                    f"{timeout:g} s (GPUCOLL_TIMEOUT)")
            self._done.wait()
        return super().Wait(status)


def connect_to(address, secret, my_rank, target_rank, timeout):
    """Open the sending connection to world rank `target_rank`'s inbox at `address` and run
    the job's handshake on it (both sides prove the secret; the connection is bound to
    `my_rank`)."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        try:
            conn = socket.create_connection((host, int(port)), timeout=timeout)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise LostPeerError(f"cannot open a point-to-point connection to rank {target_rank} at "
                                    f"{address}: {exc}", ranks=[target_rank]) from None
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
    try:
        handshake.connect(conn, secret, Claim(Purpose.P2P, my_rank, target_rank), handshake.HANDSHAKE_TIMEOUT)
    except (HandshakeError, OSError) as exc:
        conn.close()
        raise LostPeerError(f"point-to-point connection to rank {target_rank} at {address}: the handshake "
                            f"failed: {exc}", ranks=[target_rank]) from None
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn, threading.Lock()
