"""The point-to-point methods of MPI.Comm over gpucoll's point to point.

Messages travel as their packed bytes (a view of the buffer when its layout is contiguous).
gpucoll's small sends are eager (complete once their bytes are in the channel), large ones wait
for their receive, as MPI allows; buffered (Bsend) and ready (Rsend) sends are sends. A
synchronous send (Ssend) completes only when the receiver has matched the message: it travels
marked, and the receiver's engine answers the match (gpucoll/engines/p2p/host.py, SYNC). Probe, Iprobe,
Mprobe and Improbe look at the messages that arrived; a matched probe takes the message (and
answers a synchronous one). A message from GPU memory arrives as an envelope: Probe and Iprobe
report the size it announces; a matched probe of one is not supported.
"""
import time

import numpy as np

from ..base import config
from ..base.errors import GpucollError, InvalidUsageError
from ..base.errors import TimeoutError as GpucollTimeout
from ..base.mpi_constants import INTEGERS as _C
from ..base.request import Status as GpucollStatus
from ..calls.build import user_tag
from ..engines.p2p import host as _p2p
from ..engines.p2p.host import MPIShortCalls
from . import message as _m
from .buffer import buffer as _buffer
from .composite import Composite
from .datatype import plain_predefined
from .hostcopy import HostStage
from .matched import Message
from .request import _REGISTRY, P2PHandle, Prequest, Request
from .status import reset

ANY_SOURCE, ANY_TAG, PROC_NULL = _C["ANY_SOURCE"], _C["ANY_TAG"], _C["PROC_NULL"]
# The hot path of Send, Isend, Recv and Irecv tries the communicator's point-to-point short paths
# first (comm.seam: gpucoll._native.p2p.ShortPaths), which read in C an exact ndarray, bytes-like
# objects (MPI.buffer, bytearray, ...) and [buf, TYPE] / [buf, count, TYPE] of the predefined
# datatypes registered below, and decline anything else; then the general path reads the message
# specification and checks everything. A bare NumPy array is its message only when its dtype is a
# basic datatype's (checked there too: ShortPaths with mpi=True, whose requests are their own MPI.Request:
# P2PHandle).
_p2p.register_mpi(P2PHandle, _m.BASIC_FORMATS, reset, _REGISTRY)


def _proc_null_status(status):
    if status is not None:
        reset(status)
        status.source = PROC_NULL


def _withdraw(state):
    """Take back a posted receive whose paired send failed, or that a lost rank failed (a stale
    receive would take the next message meant for another call): True when it was unmatched."""
    part = state.parts[0] if isinstance(state, Composite) else state
    p2p = getattr(part, "_p2p", None)
    return p2p is not None and p2p.withdraw(part)


def _wait_blocking(core, state, status):
    """Wait for the receive of a blocking call (taken back if a lost rank fails it unmatched)."""
    core.seam.p2p.wait_blocking(state, status, take_back=_withdraw)


def _check_peer(core, rank, name, what, wildcard=False):
    """MPI.Exception(ERR_RANK) for a rank that is not PROC_NULL (ANY_SOURCE) nor in the communicator."""
    if rank == PROC_NULL or (wildcard and rank == ANY_SOURCE):
        return
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < core.size:
        raise InvalidUsageError(f"{what}: {name} rank {rank!r} is out of range for a communicator of size "
                                f"{core.size}", error_class=_C["ERR_RANK"])


def _as_rank(value):
    """A rank given as a float (nprocs / 2 in Python 3) is truncated to an int, as mpi4py's C-int
    arguments take it; anything else is left for the checks."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _check_tag(tag, what, wildcard=False):
    """MPI.Exception(ERR_TAG) for a tag that is not >= 0 (or ANY_TAG where a receive allows it)."""
    if wildcard and tag == ANY_TAG:
        return
    if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or not 0 <= tag <= 2**31 - 1:
        raise InvalidUsageError(f"{what}: message tag {tag!r} is not allowed: use an integer from 0 to 2**31-1",
                                error_class=_C["ERR_TAG"])


def issend_state(core, payload, dest, tag, what):
    """A synchronous send of payload (bytes) started: complete once dest has matched it."""
    from ..base.request import CompletedRequest

    if dest == PROC_NULL:
        return CompletedRequest(what)
    return core.seam.p2p.issend(payload, dest, user_tag(tag), what)




class PointToPoint:
    """Mixed into MPI.Comm (which supplies `_c()`, and derives from MPIShortCalls too, last: its
    Send, Isend, Recv and Irecv)."""

    __slots__ = ()

    # --- sends ---------------------------------------------------------------------------------
    def _send_bytes(self, buf, dest, what):
        _check_peer(self._c(what), dest, "destination", what)
        msg = _m.simple(buf, True, dest, what=f"{what} buf")
        if msg is None:
            return np.zeros(0, np.uint8)
        if msg.gpu is not None:
            return msg.gpu
        return msg.data()  # a copy for DLPack and interface views (see message.Msg.plain)

    # Send, Isend, Recv and Irecv are MPIShortCalls' (native: the short paths first); below, their
    # general paths.
    def _send(self, buf, dest, tag):
        core = self._c("Send")
        dest = _as_rank(dest)
        _check_tag(tag, "Send")
        core.Send(self._send_bytes(buf, dest, "Send"), dest, tag)

    Bsend = Rsend = MPIShortCalls.Send

    def _isend(self, buf, dest, tag):
        core = self._c("Isend")
        dest = _as_rank(dest)
        _check_tag(tag, "Isend")
        data = self._send_bytes(buf, dest, "Isend")
        return Request._of(core.Isend(data, dest, tag))

    Ibsend = Irsend = MPIShortCalls.Isend

    def _issend(self, buf, dest, tag, what):
        dest = _as_rank(dest)
        core = self._c(what)
        _check_tag(tag, what)
        # synchronous sends run on host memory: a GPU buffer's bytes go from a host copy
        data = self._send_bytes(HostStage().spec(buf, False, what), dest, what)
        if not isinstance(data, np.ndarray):
            raise NotImplementedError(f"{what} of this GPU buffer (synchronous sends are on host memory)")
        payload = memoryview(data).cast("B") if data.size else memoryview(b"")
        return issend_state(core, payload, dest, tag, what)

    def Ssend(self, buf, dest, tag=0):
        """Send buf; return once dest has matched the message (a receive or a matched probe)."""
        self._issend(buf, dest, tag, "Ssend").Wait()

    def Issend(self, buf, dest, tag=0):
        return Request._of(self._issend(buf, dest, tag, "Issend"))

    def Send_init(self, buf, dest, tag=0):
        return Prequest._persistent(lambda: self.Isend(buf, dest, tag))

    Bsend_init = Rsend_init = Send_init

    def Ssend_init(self, buf, dest, tag=0):
        return Prequest._persistent(lambda: self.Issend(buf, dest, tag))

    # --- receives ---------------------------------------------------------------------------------
    def _irecv_state(self, buf, source, tag, what):
        """The state of a started receive into buf (a gpucoll request, or a composite that
        unpacks into a non-contiguous layout)."""
        from .collectives import _Landing

        core = self._c(what)
        source = _as_rank(source)
        _check_peer(core, source, "source", what, wildcard=True)
        _check_tag(tag, what, wildcard=True)
        msg = _m.simple(buf, False, source, what=f"{what} buf")
        if msg is None:
            return core.Irecv(np.zeros(0, np.uint8), PROC_NULL, tag)
        if msg.gpu is not None:
            state = core.Irecv(msg.gpu, source, tag)
            if msg.unpack is None:
                return state
            return Composite([state], msg.unpack, what, status_part=state)  # a derived datatype's layout
        land = _Landing(msg)
        state = core.Irecv(land.buf, source, tag)
        if land.direct:
            return state
        return Composite([state], lambda: land.finish(state.status.nbytes), what, status_part=state)

    def _recv(self, buf, source, tag, status):
        s = self._s
        if s is not None and status is not None:  # the short path, with a status to fill
            reset(status)
            if s.short.recv(buf, source, tag, status, True):
                return
        self._c("Recv").seam.check_alive()   # a freed or revoked communicator raises, PROC_NULL or not
        if source == PROC_NULL:
            _proc_null_status(status)
            return
        state = self._irecv_state(buf, source, tag, "Recv")
        if status is not None:
            reset(status)
        _wait_blocking(self._c("Recv"), state, status)

    def _irecv(self, buf, source, tag):
        self._c("Irecv")
        return Request._of(self._irecv_state(buf, source, tag, "Irecv"))

    def Recv_init(self, buf, source=ANY_SOURCE, tag=ANY_TAG):
        return Prequest._persistent(lambda: self.Irecv(buf, source, tag))

    # --- both ways ----------------------------------------------------------------------------------
    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE, recvtag=ANY_TAG, status=None):
        dest, source = _as_rank(dest), _as_rank(source)
        data = self._send_bytes(sendbuf, dest, "Sendrecv")  # both messages are checked before anything starts
        self._sendrecv(data, dest, sendtag, recvbuf, source, recvtag, status, "Sendrecv")

    def Sendrecv_replace(self, buf, dest, sendtag=0, source=ANY_SOURCE, recvtag=ANY_TAG, status=None):
        """Send buf, then receive into the same buf."""
        data = self._send_bytes(buf, dest, "Sendrecv_replace")
        data = data.copy() if isinstance(data, np.ndarray) else data
        self._sendrecv(data, dest, sendtag, buf, source, recvtag, status, "Sendrecv_replace")

    def _sendrecv(self, data, dest, sendtag, recvbuf, source, recvtag, status, what):
        core = self._c(what)
        recv = None if source == PROC_NULL else self._irecv_state(recvbuf, source, recvtag, what)
        try:
            core.Send(data, dest, sendtag)
        except BaseException:
            _withdraw(recv)
            raise
        if recv is None:
            _proc_null_status(status)
            return
        if status is not None:
            reset(status)
        _wait_blocking(core, recv, status)

    def _isendrecv(self, data, dest, sendtag, recvbuf, source, recvtag, what):
        core = self._c(what)
        recv = self._irecv_state(recvbuf, source, recvtag, what)
        try:
            send = core.Isend(data, dest, sendtag)
        except BaseException:
            _withdraw(recv)
            raise
        return Request._of(Composite([recv, send], None, what, status_part=recv))

    def Isendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE, recvtag=ANY_TAG):
        data = self._send_bytes(sendbuf, dest, "Isendrecv")
        return self._isendrecv(data, dest, sendtag, recvbuf, source, recvtag, "Isendrecv")

    def Isendrecv_replace(self, buf, dest, sendtag=0, source=ANY_SOURCE, recvtag=ANY_TAG):
        data = self._send_bytes(buf, dest, "Isendrecv_replace")
        data = data.copy() if isinstance(data, np.ndarray) else data
        return self._isendrecv(data, dest, sendtag, buf, source, recvtag, "Isendrecv_replace")

    # --- probes ---------------------------------------------------------------------------------------
    def _find(self, source, tag, take, what):
        """The first arrived message matching (source, tag), as (source, tag, payload, nbytes); taken
        off the arrived ones with its payload when `take` (a matched probe, else payload None); None
        when none has arrived."""
        core = self._c(what)
        found = core.seam.p2p.probe(source, tag, False)
        if found is None:
            return None
        if found[3] & _p2p.OFFER_FLAG:  # a GPU message: its envelope says how large it is
            from ..engines.p2p.outboxes import message_size
            envelope = core.seam.p2p.peek(found[0], found[1])
            if envelope is None:
                return None  # still arriving
            nbytes = message_size(envelope)
            if nbytes is None:
                raise GpucollError(f"{what}: rank {found[0]} sent a GPU message whose envelope is not one "
                                   f"({len(envelope)} bytes); are both ranks running the same gpucoll?")
            if not take:
                return found[0], found[1], None, nbytes
            # A matched probe takes it now: received into host memory (the GPU path reads it there
            # through CUDA); a receive of exactly its source and tag matches this first one (unless
            # another thread takes it first: then the next such message, as long as it arrived).
            payload, got = np.empty(nbytes, np.uint8), GpucollStatus()
            core.Recv(payload, found[0], found[1], got)
            return found[0], found[1], payload[:got.nbytes], got.nbytes
        if not take:
            return found[0], found[1], None, found[2]
        src, tg, nbytes, _, req = core.seam.p2p.probe(found[0], found[1], True)
        req.Wait()  # within a host a large message is read from the sender's memory now
        return src, tg, req._native.data(), nbytes

    def _probe(self, source, tag, take, block, what):
        if source == PROC_NULL:
            self._c(what)
            return (PROC_NULL, ANY_TAG, None, 0)
        found = self._find(source, tag, take, what)
        if found is not None:
            return found
        p2p = self._c(what).seam.p2p
        if not block:
            p2p.check_probe(source, what)  # a failed source: an error, not "nothing yet" (ULFM)
            return None
        timeout = config.TIMEOUT.get()
        deadline, delay = time.monotonic() + timeout, 0.00002
        while found is None:
            p2p.check_probe(source, what)  # a failed source ends the wait (ULFM)
            if time.monotonic() > deadline:
                src = "any rank" if source == ANY_SOURCE else f"rank {source}"
                raise GpucollTimeout(f"{what}: no message from {src} with "
                                     f"{'any tag' if tag == ANY_TAG else f'tag {tag}'} within {timeout:g} s "
                                     "(GPUCOLL_TIMEOUT)")
            time.sleep(delay)
            delay = min(delay * 2, 0.001)
            found = self._find(source, tag, take, what)
        return found

    @staticmethod
    def _fill(status, found):
        if status is not None:
            reset(status)
            status.source, status.tag = found[0], found[1]
            status.nbytes = found[3]

    def Probe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Wait until a matching message has arrived (without receiving it); True."""
        self._fill(status, self._probe(source, tag, False, True, "Probe"))
        return True

    def Iprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Whether a matching message has arrived (without receiving it)."""
        found = self._probe(source, tag, False, False, "Iprobe")
        if found is None:
            return False
        self._fill(status, found)
        return True

    def Mprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Wait for a matching message and take it: only the returned Message receives it."""
        found = self._probe(source, tag, True, True, "Mprobe")
        self._fill(status, found)
        return Message._matched(self, found[:3])

    def Improbe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        found = self._probe(source, tag, True, False, "Improbe")
        if found is None:
            return None
        self._fill(status, found)
        return Message._matched(self, found[:3])

    # Python objects
    def probe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return self.Probe(source, tag, status)

    def iprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return self.Iprobe(source, tag, status)

    def mprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return self.Mprobe(source, tag, status)

    def improbe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return self.Improbe(source, tag, status)


# mpi4py's demos write messages as [MPI.Alloc_mem(n), n, MPI.BYTE], [array, MPI.DOUBLE] or a
# bytearray: these take the native short paths too, not only bare arrays.
_p2p.register_bytes_type(_buffer, guarded=True)  # its objects may stand for device memory
for _datatype in plain_predefined():
    _p2p.register_datatype(_datatype, _datatype.Get_size())
