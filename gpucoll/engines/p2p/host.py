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
import array
import hashlib
import os
import pickle
import struct

import numpy as np

from ..._native import p2p as _engine
from ...base import config, log
from ...base.errors import (GpucollError, InvalidUsageError, LostPeerError, ProcFailedPendingError, RevokedError,
                            TruncationError)
from ...base.errors import TimeoutError as GpucollTimeout
from ...base.ranks import ranges
from ...base.request import CompletedRequest, Request, Status  # noqa: F401 (Status: gpucoll.engines.p2p.host.Status)

ANY_SOURCE = ANY_TAG = _engine.ANY  # the engine's wildcard, for sources and tags alike
PROC_NULL = -2  # a peer that does not exist: sends to it and receives from it do nothing, at once
TAG_UB = _engine.TAG_UB  # the largest user tag (2**31 - 1)
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
# memory (gpucoll/engines/p2p/outboxes.py), and a host receive reads it through the communicator's GPU side.
OFFER_FLAG = _engine.OFFER
# The 48-byte header of every frame on a point-to-point channel (gc_p2p_hdr in gc_p2p.h), for tools
# and tests: communicator key, tag, kind | flags, bytes, send id, address, status (native byte order).
FRAME = struct.Struct("=QiIQQQq")
EAGER = _engine.EAGER


class ProcessP2P:
    """The process's point to point: its native core (gpucoll._native.p2p.P2PCore) and the links
    that feed it (made by gpucoll/api/world.py's Context)."""

    def __init__(self, ctx):
        from ...transports.links import Links

        self.ctx = ctx
        self.native = _native().P2PCore(ctx.rank, ctx.size, MAX_MESSAGE)
        self.native.set_share(config.P2P_SHARED_COPY.get())
        self.links = Links(ctx, self.native)
        self._told = set()  # lost peers whose reason was logged

    def add_peers(self, world_ranks):
        """Processes spawned after this one started (Context.learn)."""
        self.links.add_peers(world_ranks)

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


# The requests of sends and receives are native (gpucoll._native.p2p.P2PRequest): a plain outcome
# is settled there; PointToPoint.settle and timed_out below explain the others.
P2PRequest = _engine.P2PRequest
Request.register(P2PRequest)

# What the short paths take besides a NumPy array (cython_src/p2p.pyx, _message): bytes-like
# objects as they are, and the message forms of the datatypes gpucoll.MPI registers.
register_datatype = _engine.register_datatype
register_bytes_type = _engine.register_bytes_type
# gpucoll.MPI's handles derive from HandleFields (their state `_s`, native), its Request from
# RequestHandle; its short paths (ShortPaths, mpi=True) return requests that are their own handle
# (MPIP2PRequest, read as a state through OwnState), of the type it registers with its basic dtypes.
HandleFields, RequestHandle, register_mpi = _engine.HandleFields, _engine.RequestHandle, _engine.register_mpi
MPIP2PRequest, OwnState = _engine.MPIP2PRequest, _engine.OwnState
# Its Comm derives from MPIShortCalls (Send, Isend, Recv and Irecv native up to the short paths,
# which they find in the state's native field: CommStateFields.short).
MPIShortCalls, CommStateFields = _engine.MPIShortCalls, _engine.CommStateFields
# gpucoll.Communicator derives from ShortCalls, the same for its own Send, Isend, Recv and Irecv.
ShortCalls = _engine.ShortCalls
for _t in (bytearray, bytes, memoryview, array.array):
    register_bytes_type(_t)


class _ProcNullRequest(CompletedRequest):
    """A receive from PROC_NULL: done at once, its status says so."""

    __slots__ = ()

    def _fill(self, status):
        status.source, status.tag, status.nbytes = PROC_NULL, ANY_TAG, 0


class PointToPoint:
    """Point-to-point messaging of one communicator."""

    def __init__(self, view, make_gpu_side):
        self.view = view  # the communicator as engines see it (gpucoll/engines/comm_view.py)
        self._ctx = view.ctx
        self._key = comm_key(view.id)
        self._world = list(view.world_ranks)
        self._ranks = {w: r for r, w in enumerate(self._world)}
        self._engine = self._ctx.p2p
        self._native = self._engine.native
        self._ready = self._engine.links.ready
        self._size = len(self._world)
        self._timeout = config.TIMEOUT.get()
        # Send/Isend/Recv/Irecv of a plain NumPy array (gpucoll._native.p2p.ShortPaths)
        self.short = _engine.ShortPaths(self._native, self._key, self._world, self._ready, self, np.ndarray,
                                        self._timeout)
        self.gpu = None  # the GPU side (gpucoll/engines/p2p/gpu.py), made for the first GPU buffer
        self._losses_looked = 0  # the engine's lost peers that ANY_SOURCE receives and probes looked at
        self._make_gpu_side = make_gpu_side  # (it imports this module: made by the communicator)

    def gpu_side(self):
        """The GPU side of this communicator's point to point, made on first use."""
        if self.gpu is None:
            self.gpu = self._make_gpu_side(self)
        return self.gpu

    # --- ranks and tags ---------------------------------------------------------------------------
    def _check_peer(self, peer, what):
        if isinstance(peer, bool) or not isinstance(peer, (int, np.integer)) or not 0 <= peer < self.view.size:
            raise InvalidUsageError(f"{what} rank {peer!r} is out of range for a communicator of size "
                                    f"{self.view.size}")
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
        return rank != self.view.rank and self._ctx.hosts[world] == self._ctx.hosts[self._ctx.rank]

    def error(self, req, err):
        """The exception of a request that the engine finished with status err."""
        native = _native()
        comm_rank = self.view.rank
        if err == native.TRUNCATED:
            st = req.status
            return truncated(st.source, st.tag, st.nbytes, req._cap)
        if err == native.CANCELLED:
            return InvalidUsageError(f"communicator {self.view.name} was freed while this receive was pending")
        if err == native.TOOBIG:
            return GpucollError(f"{req.name} on rank {comm_rank}: a message of {req.status.nbytes} bytes is larger "
                                "than this host's memory")
        if err == native.PEER:
            peer = req.peer if req.peer >= 0 else req.status.source
            what = "Recv from" if req._op == "recv" else "Send to"
            why = self._engine.why_lost(self._world[peer], "Recv" if req._op == "recv" else "Send")
            return LostPeerError(f"{what} rank {peer}: {why}", ranks=[peer])
        if err == native.REVOKED:
            self.view.revoked()   # a receiver refused this send: its revoke reached this rank first
            return RevokedError(f"{req.name} on rank {comm_rank}: communicator {self.view.name} was revoked")
        if err == native.NOMEM:
            return MemoryError(f"{req.name}: out of memory")
        return GpucollError(f"{req.name}: point-to-point status {err}")

    def settle(self, req):
        """The outcome of a request that is not a plain success (P2PRequest settles those itself):
        an object to unpickle, a GPU message for a host buffer, or an error."""
        native = _native()
        err = req._native.err
        if req._recv:
            if req._status is not None:  # the caller's Status, or one asked for while pending
                req._fill_status(req._status)
            if err == native.OK and req._native.rflags & native.OFFER:  # a GPU message for a host buffer
                src, tag, _, _ = req._native.status
                self.gpu_message_to_host(req, self.rank_of(src), tag, req._native.data())
                return
        req._keep = None
        if err != native.OK:
            req._error = self.error(req, err)
            return
        try:
            with memoryview(req._native) as data:   # the received bytes themselves, not a copy
                req._value = pickle.loads(data) if data.nbytes else None  # an empty message is None
        except Exception as exc:  # the receiver's error, raised by its wait()
            req._error = exc

    # --- a lost rank and receives from ANY_SOURCE (ULFM) ------------------------------------------
    def failed_unacknowledged(self):
        """The ranks of this communicator whose process this one saw go and that failed, not
        acknowledged (comm.ack_failed)."""
        live, me = _native().LIVE, self.view.rank
        seen = [r for r, w in enumerate(self._world) if r != me and self._native.lost(w)[0] != live]
        return self.view.failed_among(seen) if seen else []

    def _any_source_failures(self, losses):
        """The failed, unacknowledged ranks a receive or probe from ANY_SOURCE must report, the
        engine having lost `losses` peers: looked up once per loss while there are none (a rank
        that ended well costs each later receive from any rank nothing)."""
        if losses == self._losses_looked:
            return []
        failed = self.failed_unacknowledged()
        if not failed:
            self._losses_looked = losses
        return failed

    def any_source_lost(self, req):
        """A receive from ANY_SOURCE, unmatched, after a peer was lost: ProcFailedPendingError
        when a rank of this communicator failed and is not acknowledged (the receive stays
        posted: a later message from another rank still completes it); else nothing."""
        failed = self._any_source_failures(self._native.losses)
        if failed:
            raise ProcFailedPendingError(self._failed_text(f"{req.name} from any rank", failed)
                                         + "; the receive is still posted (ack_failed(), then wait again, or "
                                         "revoke and shrink)", ranks=failed)

    def _failed_text(self, what, failed):
        return f"{what} on rank {self.view.rank}: rank(s) {ranges(failed)} of communicator {self.view.name} failed"

    def wait_blocking(self, req, status=None, take_back=None, stream=None):
        """Wait() of a receive that its caller does not hand out (a blocking Recv, a Sendrecv's
        receive): when a lost rank fails it while unmatched, it is taken back first, so no later
        message lands in a buffer the caller has left, and the error is ProcFailedError (MPI's
        ERR_PROC_FAILED). take_back(req): True when it was still unmatched (default: withdraw);
        stream: a GPU receive's, which its Wait makes wait."""
        while True:
            try:
                return req.Wait(status) if stream is None else req.Wait(status, stream=stream)
            except ProcFailedPendingError as exc:
                if (take_back or self.withdraw)(req):
                    raise LostPeerError(self._failed_text(f"{req.name} from any rank", exc.ranks),
                                        ranks=exc.ranks) from None
                # matched meanwhile: its bytes come from a live rank

    def check_probe(self, source, what):
        """A probe that found nothing from source (ANY_SOURCE too): raise ProcFailedError when its
        rank failed (any unacknowledged rank of this communicator for ANY_SOURCE), as ULFM's probes do."""
        losses = self._native.check_peers()
        if source == ANY_SOURCE:
            failed = self._any_source_failures(losses)
        else:
            failed = [source] if self._native.lost(self._world[source])[0] != _native().LIVE else []
        if failed:
            raise LostPeerError(self._failed_text(what, failed), ranks=failed)

    def timed_out(self, req, timeout):
        """A request waited timeout seconds: raise, naming what it waited for (a receive that was
        matched meanwhile gets as long again for its bytes, and returns if they came)."""
        src = "any rank" if req.peer == ANY_SOURCE else f"rank {req.peer}"
        tag = "any tag" if req.tag == ANY_TAG else f"tag {req.tag}"
        if req._recv:
            if req._native.withdraw():
                req._settled = True
                raise GpucollTimeout(f"{req.name} on rank {self.view.rank}: no message from {src} with {tag} "
                                     f"within {timeout:g} s (GPUCOLL_TIMEOUT)")
            if req._native.wait(timeout):  # matched: its bytes are on their way
                return
            raise GpucollTimeout(f"{req.name} on rank {self.view.rank}: the message from {src} with {tag} was "
                                 f"matched but its bytes did not arrive within {2 * timeout:g} s (GPUCOLL_TIMEOUT)")
        raise GpucollTimeout(f"{req.name} of {req._cap} bytes from rank {self.view.rank} to {src} with {tag}: "
                             f"not received within {timeout:g} s (GPUCOLL_TIMEOUT); a large send waits for its "
                             "receive, as in MPI: when two ranks send to each other first, use Sendrecv or Isend")

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
        self.gpu_side().to_host(req, source, tag, envelope)

    def withdraw(self, req):
        """Take back a receive that nothing matched yet: True when it was still unmatched (it is
        then finished without error)."""
        if isinstance(req, P2PRequest) and req._recv and not req._settled and req._native.withdraw():
            req._finish()
            return True
        return False

    def unexpected(self):
        """How many arrived messages of this communicator wait for a receive."""
        return self._native.unexpected(self._key)

    def revoke(self):
        """Fail this communicator's pending receives and the offers made to it (ULFM's revoke), and
        release the waits of its GPU messages on the device."""
        self._native.revoke(self._key)
        if self.gpu is not None:
            self.gpu.revoke()

    def close(self):
        try:
            if self.gpu is not None:
                self.gpu.close()
        finally:
            self._native.forget(self._key)
