"""Tagged point-to-point messages (Send/Recv, Isend/Irecv, send/recv of objects).

The data path is native (cython_src/include/gc_p2p.h, through gpucoll._native.p2p): one
engine per process does MPI's matching (source, tag, ANY_SOURCE, ANY_TAG, no overtaking
between two ranks, an unexpected queue, probes) and moves the bytes over one channel per
peer process (shared memory within a host, TCP between hosts, both authenticated;
transports/links.py opens them on first use). Small messages are eager: a Send returns
once its bytes are in the channel, whether or not the receive is posted. Large ones wait
for their receive (as MPI's large sends do): within a host the receiver then copies them
straight out of the sender's memory (one copy), between hosts the sender streams them.
Nothing runs behind the caller's back: every call and every Wait makes progress, with the
GIL released while it waits.

A communicator's messages carry its key (a hash of its id); a message's source is the world
rank whose channel it came on, translated into the communicator's rank here.
"""
import hashlib
import os
import pickle
import struct

import numpy as np

from . import config, log
from ._native import p2p as _engine
from .errors import GpucollError, InvalidUsageError, LostPeerError, TruncationError
from .errors import TimeoutError as GpucollTimeout
from .request import CompletedRequest, Request

ANY_SOURCE = -1
ANY_TAG = -1
PROC_NULL = -2  # a peer that does not exist: sends to it and receives from it do nothing, at once
TAG_UB = 2**31 - 1  # the largest user tag
RESERVED_TAG_MAX = -1000  # tags at or below this are gpucoll's own (objects, MPI's composite calls)
OBJECT_GATHER_TAG = -1001
OBJECT_SCATTER_TAG = -1002
def truncated(source, tag, nbytes, capacity):
    """MPI's truncation error: the message is larger than the receive buffer."""
    return TruncationError(f"message truncated: rank {source} sent {nbytes} bytes with tag {tag}, the receive "
                           f"buffer holds {capacity}; pass a larger buffer")


def _memory_bytes():
    """This host's physical memory: no object message larger than that can be received here."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 1 << 40


MAX_MESSAGE = _memory_bytes()


def comm_key(comm_id):
    return int.from_bytes(hashlib.blake2b(comm_id.encode(), digest_size=8).digest(), "big")


def _native():
    return _engine


# A message flagged OFFER carries an envelope, not the data: the data waits in the sender's GPU
# memory (gpucoll/gpu/slots.py), and a host receive reads it through the communicator's GPU side.
OFFER_FLAG = _engine.OFFER
# The 48-byte header of every frame on a point-to-point channel (gc_p2p_hdr in gc_p2p.h), for tools
# and tests: communicator key, tag, kind | flags, bytes, send id, address, status (native byte order).
FRAME = struct.Struct("=QiIQQQq")
EAGER = _engine.EAGER


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


class Engine:
    """The process's point to point: the native engine and the links that feed it (made by
    world.Context)."""

    def __init__(self, ctx):
        from .transports.links import Links

        self.ctx = ctx
        self.native = _native().Engine(ctx.rank, ctx.size, MAX_MESSAGE)
        self.native.set_share(config.P2P_SHARED_COPY.get())
        self.links = Links(ctx, self.native)
        self._told = set()  # lost peers whose reason was logged

    def why_lost(self, world_rank, what):
        """The text of a failure with world rank `world_rank`, logged once per peer."""
        native = _native()
        why, value, cut, tag = self.native.lost(world_rank)
        me = self.ctx.rank
        if why == native.BAD_SIZE:
            text = (f"rank {me} dropped its connection: it sent a frame announcing {value} bytes, more than "
                    f"the {native.WIRE_EAGER_MAX} an eager message may have")
        elif why == native.BAD_KIND:
            text = f"rank {me} dropped its connection: it sent a frame of unknown kind {value:#x}"
        elif why == native.BAD_ID:
            text = f"rank {me} dropped its connection: it answered a message it was never sent ({value})"
        elif why == native.CHAN_ERR:
            text = f"its channel failed (status -{value}; the process ended or crashed)"
        else:
            text = "its process ended or crashed (its channel closed)"
        if cut and what == "Recv":
            text += f" in the middle of a {cut}-byte message with tag {tag}"
        if why not in (native.LIVE, native.GONE) and world_rank not in self._told:
            self._told.add(world_rank)
            log.warn("P2P", "point-to-point channel from rank %d: %s", world_rank, text)
        return text


class _Flag:
    """Stands in for the threading.Event of a host Request: set once the engine is done with it
    (is_set makes one progress pass; wait waits in the engine, without the GIL)."""

    __slots__ = ("req",)

    def __init__(self, req):
        self.req = req

    def is_set(self):
        return self.req._settled or self.req._native.test()

    def wait(self, timeout=None):
        if self.req._settled:
            return True
        return self.req._native.wait(-1 if timeout is None else timeout)

    def set(self):
        self.req._settled = True


class P2PRequest(Request):
    """A send or receive of the native engine. Wait() gives up after GPUCOLL_TIMEOUT, naming
    what it waited for; a receive's status is filled in when it completes."""

    __slots__ = ("_native", "_p2p", "_settled", "_op", "peer", "tag", "_status", "_object", "_keep", "_cap")

    def __init__(self, name, p2p, native_req, op, peer, tag, status=None, obj=False, keep=None, cap=0):
        # Request.__init__'s threading.Event is not needed (on every call's path: set fields directly;
        # the short paths pass every argument by position, which costs less than keywords)
        (self.name, self._error, self._value, self._native, self._p2p, self._settled, self._op, self.peer, self.tag,
         self._status, self._object, self._keep, self._cap) = (
            name, None, None, native_req, p2p, False, op, peer, tag, status, obj, keep, cap)

    @property
    def status(self):
        """What a receive got: made on first use (most waits never ask), from the engine once settled."""
        if self._status is None:
            self._status = Status()
            if self._settled and self._op == "recv":
                self._fill_status(self._status)
        return self._status

    @status.setter
    def status(self, value):
        self._status = value

    @property
    def _done(self):  # made on use: a request refers to nothing that refers back (no cycle to collect)
        return _Flag(self)

    def _finish(self, value=None, error=None):
        self._value, self._error, self._settled = value, error, True

    def _settle(self):
        """Turn the engine's outcome into status, value and error (once)."""
        if self._settled:
            return
        self._settled = True
        p2p, native = self._p2p, _native()
        err = self._native.err
        if self._op == "recv":
            if self._status is not None:  # the caller's Status, or one asked for while pending
                self._fill_status(self._status)
            if err == native.OK and self._native.rflags & native.OFFER:  # a GPU message for a host buffer
                src, tag, _, _ = self._native.status
                p2p.gpu_message_to_host(self, p2p.rank_of(src), tag, self._native.data())
                return
        if err == native.OK:
            if self._object:
                try:
                    data = self._native.data()
                    self._value = pickle.loads(data) if data else None  # an empty message is None
                except Exception as exc:  # the receiver's error, raised by its wait()
                    self._error = exc
            self._keep = None
            return
        self._keep = None
        self._error = p2p.error(self, err)

    def _fill_status(self, status):
        """Source, tag and size of what the engine received, into status."""
        src, tag, nbytes, _ = self._native.status
        status.source = self._p2p.rank_of(src) if src >= 0 else ANY_SOURCE
        status.tag = tag
        status.nbytes = nbytes

    def _fill(self, status):
        if self._op != "recv":  # a send's status stays as it is (Request._fill)
            return
        mine = self.status
        if status is not mine:
            status.source, status.tag, status.nbytes = mine.source, mine.tag, mine.nbytes

    def Wait(self, status=None):
        if not self._settled:
            timeout = self._p2p._timeout
            if not self._native.wait(timeout):
                self._timed_out(timeout)
            self._settle()
        return self._outcome(status)

    def Test(self, status=None):
        if not self._settled:
            if not self._native.test():
                return False
            self._settle()
        return self._outcome(status)

    def _outcome(self, status):
        if status is not None:
            self._fill(status)
        if self._error is not None:
            raise self._error
        return True

    @staticmethod
    def _wait_any(reqs, timeout):
        """Index of a done one of reqs (P2PRequests), waiting in the engine; -1 after timeout s."""
        return reqs[0]._p2p._native.wait([r._native for r in reqs], False, timeout)

    @staticmethod
    def _wait_all(reqs, timeout):
        """Wait in the engine until every one of reqs (P2PRequests) is done: one native wait, so
        the rendezvous copies of a window run back to back (the caller's Wait then settles each).
        After timeout s, the first one not done raises as its own Wait would. GPU requests
        (subclasses) are left to their own Wait: a GPU receive enqueues its copy there."""
        if type(reqs[0]) is not P2PRequest:
            return
        if reqs[0]._p2p._native.wait([r._native for r in reqs], True, timeout) < 0:
            next(r for r in reqs if not r._native.done)._timed_out(timeout)

    def _timed_out(self, timeout):
        p2p = self._p2p
        src = "any rank" if self.peer == ANY_SOURCE else f"rank {self.peer}"
        tag = "any tag" if self.tag == ANY_TAG else f"tag {self.tag}"
        if self._op == "recv":
            if self._native.withdraw():
                self._settled = True
                raise GpucollTimeout(f"{self.name} on rank {p2p._comm.rank}: no message from {src} with {tag} "
                                     f"within {timeout:g} s (GPUCOLL_TIMEOUT)")
            if self._native.wait(timeout):  # matched: its bytes are on their way
                return
            raise GpucollTimeout(f"{self.name} on rank {p2p._comm.rank}: the message from {src} with {tag} was "
                                 f"matched but its bytes did not arrive within {2 * timeout:g} s (GPUCOLL_TIMEOUT)")
        raise GpucollTimeout(f"{self.name} of {self._cap} bytes from rank {p2p._comm.rank} to {src} with {tag}: "
                             f"not received within {timeout:g} s (GPUCOLL_TIMEOUT); a large send waits for its "
                             "receive, as in MPI: when two ranks send to each other first, use Sendrecv or Isend")


class _ProcNullRequest(CompletedRequest):
    """A receive from PROC_NULL: done at once, its status says so."""

    __slots__ = ()

    def _fill(self, status):
        status.source, status.tag, status.nbytes = PROC_NULL, ANY_TAG, 0


class PointToPoint:
    """Point-to-point messaging of one communicator."""

    def __init__(self, comm):
        self._comm = comm
        self._ctx = comm._ctx
        self._key = comm_key(comm._id)
        self._world = list(comm.world_ranks)
        self._ranks = {w: r for r, w in enumerate(self._world)}
        self._engine = self._ctx.p2p
        self._native = self._engine.native
        self._ready = self._engine.links.ready
        self._size = len(self._world)
        self._timeout = config.TIMEOUT.get()
        self.gpu = None  # gpucoll.gpu.p2p.GpuPointToPoint, made by the communicator for the first GPU buffer

    # --- ranks and tags ---------------------------------------------------------------------------
    def _check_peer(self, peer, what):
        if isinstance(peer, bool) or not isinstance(peer, (int, np.integer)) or not 0 <= peer < self._comm.size:
            raise InvalidUsageError(f"{what} rank {peer!r} is out of range for a communicator of size "
                                    f"{self._comm.size}")
        return int(peer)

    @staticmethod
    def _check_tag(tag, wildcard):
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)):
            raise InvalidUsageError(f"message tag {tag!r} is not allowed: use an integer from 0 to {TAG_UB}")
        tag = int(tag)
        if 0 <= tag <= TAG_UB or (wildcard and tag == ANY_TAG) or tag <= RESERVED_TAG_MAX:
            return tag
        raise InvalidUsageError(f"message tag {tag} is not allowed: use an integer from 0 to {TAG_UB}"
                                + (" (or ANY_TAG)" if wildcard else ""))

    def rank_of(self, world_rank):
        return self._ranks.get(world_rank, ANY_SOURCE)

    def same_host(self, rank):
        """True when `rank` is another process on this host (CUDA IPC can reach its memory)."""
        world = self._world[rank]
        return rank != self._comm.rank and self._ctx.hosts[world] == self._ctx.hosts[self._ctx.rank]

    def error(self, req, err):
        """The exception of a request that the engine finished with status err."""
        native = _native()
        comm_rank = self._comm.rank
        if err == native.TRUNCATED:
            st = req.status
            return truncated(st.source, st.tag, st.nbytes, req._cap)
        if err == native.CANCELLED:
            return InvalidUsageError(f"communicator {self._comm.name} was freed while this receive was pending")
        if err == native.TOOBIG:
            return GpucollError(f"{req.name} on rank {comm_rank}: a message of {req.status.nbytes} bytes is larger "
                                "than this host's memory")
        if err == native.PEER:
            peer = req.peer if req.peer >= 0 else req.status.source
            what = "Recv from" if req._op == "recv" else "Send to"
            why = self._engine.why_lost(self._world[peer], "Recv" if req._op == "recv" else "Send")
            return LostPeerError(f"{what} rank {peer}: {why}", ranks=[peer])
        if err == native.NOMEM:
            return MemoryError(f"{req.name}: out of memory")
        return GpucollError(f"{req.name}: point-to-point status {err}")

    # --- sends ------------------------------------------------------------------------------------
    def _start_send(self, data, dest, tag, name, flags=0):
        """The request of a send of bytes `data` (done at once to PROC_NULL)."""
        if dest == PROC_NULL:
            return CompletedRequest(name)
        dest = self._check_peer(dest, "destination")
        tag = self._check_tag(tag, False)
        world = self._world[dest]
        self._engine.links.ensure(world)
        req = self._native.isend(self._key, world, tag, data, flags)
        return P2PRequest(name, self, req, "send", dest, tag, keep=data, cap=len(data))

    @staticmethod
    def _payload(buf):
        return memoryview(buf.array).cast("B") if buf.count else memoryview(b"")

    def send(self, buf, dest, tag):
        self._start_send(self._payload(buf), dest, tag, "Send").Wait()

    # The short paths of Communicator.Send / Recv: a C-contiguous NumPy array of plain values, an
    # in-range rank and tag, a channel that exists. False: take the general path (which checks
    # everything and says what is wrong).
    def _send_world(self, dest, tag):
        """The world rank to send to for the short paths, or None."""
        if type(dest) is not int or type(tag) is not int or not 0 <= tag <= TAG_UB or not 0 <= dest < self._size:
            return None
        world = self._world[dest]
        return world if world in self._ready else None

    def send_array(self, arr, dest, tag):
        world = self._send_world(dest, tag)
        if world is None:
            return False
        got = self._native.send(self._key, world, tag, arr)
        if got is True:
            return True
        if got is None:
            return False
        P2PRequest("Send", self, got, "send", dest, tag, keep=arr, cap=arr.nbytes).Wait()  # waits and explains
        return True

    def _short_request(self, start, op, world, arr, peer, tag):
        """The P2PRequest of a nonblocking short path (start: the engine's start_send or
        start_recv), or None to take the general path."""
        req = None if world is None else start(self._key, world, tag, arr)
        return None if req is None else P2PRequest("I" + op, self, req, op, peer, tag, None, False, arr, arr.nbytes)

    def isend_array(self, arr, dest, tag):
        """Isend's short path: the request, or None to take the general path."""
        return self._short_request(self._native.start_send, "send", self._send_world(dest, tag), arr, dest, tag)

    def _recv_world(self, source, tag):
        """The world rank to receive from for the short paths (ANY_SOURCE as is), or None."""
        if type(source) is not int or type(tag) is not int or not (0 <= tag <= TAG_UB or tag == ANY_TAG):
            return None
        if 0 <= source < self._size:
            return self._world[source]
        return ANY_SOURCE if source == ANY_SOURCE else None

    def irecv_array(self, arr, source, tag):
        """Irecv's short path: the request, or None to take the general path."""
        return self._short_request(self._native.start_recv, "recv", self._recv_world(source, tag), arr, source, tag)

    def recv_array(self, arr, source, tag, status):
        world = self._recv_world(source, tag)
        got = None if world is None else self._native.recv(self._key, world, tag, arr, self._timeout)
        if got is None:
            return False
        if type(got) is tuple:
            if status is not None:
                status.source, status.tag, status.nbytes = self._ranks.get(got[0], ANY_SOURCE), got[1], got[2]
            return True
        P2PRequest("Recv", self, got, "recv", source, tag, status, keep=arr, cap=arr.nbytes).Wait()
        return True

    def isend(self, buf, dest, tag):
        return self._start_send(self._payload(buf), dest, tag, "Isend")

    def issend(self, payload, dest, tag, name="Issend"):
        """A synchronous send: complete once the receiver has matched it."""
        return self._start_send(payload, dest, tag, name, _native().SYNC)

    def send_bytes(self, payload, dest, tag, name="send", flags=0):
        """Start sending bytes (a GPU message's envelope: flags=OFFER); the request."""
        return self._start_send(payload, dest, tag, name, flags)

    def send_object(self, obj, dest, tag):
        self.isend_object(obj, dest, tag, "send").Wait()

    def isend_object(self, obj, dest, tag, name="isend"):
        if dest == PROC_NULL:
            return CompletedRequest(name)
        dest = self._check_peer(dest, "destination")
        return self._start_send(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dest, tag, name)

    # --- receives ---------------------------------------------------------------------------------
    def _post(self, buf, source, tag, status, name, obj=False, request_type=None):
        if source not in (ANY_SOURCE, PROC_NULL):
            source = self._check_peer(source, "source")
        tag = self._check_tag(tag, True)
        if source == PROC_NULL:  # MPI: done at once, no data, source PROC_NULL and tag ANY_TAG
            if status is not None:
                status.source, status.tag, status.nbytes = PROC_NULL, ANY_TAG, 0
            return _ProcNullRequest(name)
        world = ANY_SOURCE if source == ANY_SOURCE else self._world[source]
        native = self._native.irecv(self._key, world, tag, buf)
        return (request_type or P2PRequest)(name, self, native, "recv", source, tag, status, obj=obj, keep=buf,
                                            cap=0 if buf is None else len(buf))

    def irecv(self, buf, source, tag, status=None, name="Irecv"):
        view = memoryview(buf.array).cast("B") if buf.count else memoryview(bytearray(0))
        return self._post(view, source, tag, status, name)

    def recv_into(self, view, source, tag, status=None, name="Irecv", request_type=None):
        """A receive into a writable byte view (the GPU side's bounce buffers)."""
        return self._post(view, source, tag, status, name, request_type=request_type)

    def irecv_object(self, source, tag, status=None, name="irecv"):
        return self._post(None, source, tag, status, name, obj=True)

    # --- probes and withdrawing -----------------------------------------------------------------
    def probe(self, source, tag, take):
        """The first arrived message matching (source, tag) as (source, tag, nbytes, flags,
        request): a matched probe (take) takes it off the queue and its request receives it into
        a buffer of its own. None when none has arrived."""
        world = ANY_SOURCE if source == ANY_SOURCE else self._world[self._check_peer(source, "source")]
        found = self._native.iprobe(self._key, world, self._check_tag(tag, True), take)
        if found is None:
            return None
        src, tg, nbytes, flags, native = found
        rank = self.rank_of(src)
        req = None
        if native is not None:
            req = P2PRequest("Mrecv", self, native, "recv", rank, tg)
        return rank, tg, nbytes, flags, req

    def peek(self, source, tag):
        """The bytes of the first arrived message from rank `source` with `tag`, left where they
        are (a GPU message's envelope: probes report the size it announces); None if not whole."""
        return self._native.peek(self._key, self._world[self._check_peer(source, "source")], tag)

    def gpu_message_to_host(self, req, source, tag, envelope):
        """A GPU message matched a host receive: read it out of the sender's GPU memory."""
        self._comm._gpu_p2p().to_host(req, source, tag, envelope)

    def withdraw(self, req):
        """Take back a receive that nothing matched yet: True when it was still unmatched (it is
        then finished without error)."""
        if isinstance(req, P2PRequest) and req._op == "recv" and not req._settled and req._native.withdraw():
            req._finish()
            return True
        return False

    def unexpected(self):
        """How many arrived messages of this communicator wait for a receive."""
        return self._native.unexpected(self._key)

    def close(self):
        if self.gpu is not None:
            self.gpu.close()
        self._native.forget(self._key)
