"""Point to point on GPU buffers (Send, Recv, Isend, Irecv, Sendrecv), in stream order.

Matching (source, tag, ANY_SOURCE, ANY_TAG, no overtaking between two ranks) is the host
engine's (gpucoll/engines/p2p/host.py, the public face of cython_src/include/gc_p2p.h); only the data path
is the GPU's:

* To another process of this host: through the sender's outbox (gpucoll/engines/p2p/outboxes.py), with
  flags on the device and one envelope through the host engine, never an answer. Up to
  slots.SLOT_MAX bytes the message is copied into a slot and out of it by one kernel on each
  side. Above, the receiver copies straight from the sender's buffer on the copy engine, on a
  stream of its own per source that first waits for the point its receive was posted at: a
  rank whose stream already waits for its own send to be read (Isend ... Wait before the
  matching Irecv's Wait) cannot hold back the copy its peer waits for. Send returns once its
  work is enqueued, for a large message including the wait for the receiver's copy; an
  Isend request enqueues that wait at Wait()/Test(). Inside comm.group() sends wait for the
  block's end, and then every small send and receive of the block that shares a stream goes
  out in one kernel launch.
* Otherwise (another host, GPUCOLL_P2P_DISABLE=1, memory that cannot be shared) the bytes
  travel through host memory: the sender copies them down once its stream has reached the
  call, the receiver copies them up on its stream.

A receive completes when its data is enqueued on the receiver's stream: Recv returns then;
an Irecv request's Wait() blocks until the data has landed, Wait(stream=s) makes s wait. A
host buffer that receives a GPU message from a process of its host reads it through CUDA.
Point-to-point calls cannot be captured in a CUDA graph (they need the host to match them).
"""
import numpy as np

from ..._native import cuda
from ...base import config, log
from ...base.errors import GpucollError, InvalidUsageError
from ...base.request import Request
from ..gpu import ipc, streams
from . import outboxes as slots
from .host import OFFER_FLAG, P2PRequest, truncated



class GpuRecvRequest(P2PRequest):
    """A receive into GPU memory. Done (Test) once the data has landed; Wait() blocks until then,
    Wait(stream=s) only makes stream s wait for it."""

    __slots__ = ("target", "grouped")

    def _settle(self):
        """The host engine is done with this receive: bytes in the bounce buffer, or an envelope."""
        if self._settled:
            return
        self._settled = True
        target = self.target
        src, tag, nbytes, flags = self._native.status
        p2p = self._p2p
        source = p2p.rank_of(src)
        err = self._native.err
        self.status.source, self.status.tag, self.status.nbytes = source, tag, nbytes
        if err != 0:
            self._keep = None
            self._error = p2p.error(self, err)
            return
        if flags & OFFER_FLAG:
            target.owner.arrived(self, source, tag, self._native.data())
            return
        try:
            target.upload(nbytes)
        except GpucollError as exc:
            self._error = exc

    def Wait(self, status=None, stream=None):
        super().Wait(status)  # the copy is enqueued (raises the receive's error or its timeout)
        if stream is not None:
            cuda.stream_wait_event(streams.handle(stream), self.target.event)
        else:
            cuda.event_synchronize(self.target.event)
            self.target.owner.check_slots(self.target.buf.device)  # a slot kernel may have given up
        return True

    def Test(self, status=None):
        if super().Test(status) and cuda.event_query(self.target.event):
            self.target.owner.check_slots(self.target.buf.device)
            return True
        return False

    def wait(self, status=None, stream=None):
        self.Wait(status, stream)

    def __del__(self):
        try:
            cuda.event_destroy(self.target.event)
            cuda.event_destroy(self.target.posted)
        except Exception:
            pass


class _Target:
    """Where a GPU receive puts its data: the buffer, the stream, the receive's place in that
    stream, and a host bounce buffer for messages that arrive as bytes (np.empty: its pages
    are only touched if it is used)."""

    __slots__ = ("owner", "buf", "stream", "ctx", "bounce", "event", "posted")

    def __init__(self, owner, buf, stream, ctx):
        self.owner, self.buf, self.stream, self.ctx = owner, buf, stream, ctx
        self.bounce = np.empty(buf.nbytes, np.uint8)
        self.event = cuda.event_create()   # recorded after the data's copy, for Wait()
        self.posted = cuda.event_create()  # where the receive was posted: a large copy starts after it
        cuda.event_record(self.posted, stream)

    def upload(self, nbytes):
        cuda.set_current(self.ctx)
        if nbytes:
            cuda.memcpy_htod_async(self.buf.addr, self.bounce.__array_interface__["data"][0], nbytes, self.stream)
        cuda.event_record(self.event, self.stream)


class GpuSendRequest(Request):
    """An Isend of GPU memory to a process of this host. Wait()/Test() complete it in stream
    order: for a large message its stream then waits, on the device, until the receiver has
    read the buffer. In a comm.group() block it starts when the block ends."""

    def __init__(self, name, gpu, stream):
        super().__init__(name)
        self.gpu, self.stream = gpu, stream
        self.envelope = None  # the envelope's host request, once sent
        self.finish = None    # (outboxes, WAIT_FREE entry) of a large message

    def Wait(self, status=None, stream=None):
        if self.envelope is None:
            raise InvalidUsageError(f"{self.name} of a GPU buffer inside comm.group() starts when the block ends: "
                                    "wait for its request after the `with` block")
        self.envelope.Wait(status)
        if self.finish is not None:
            (out, entry), self.finish = self.finish, None
            self.gpu._launch(out, self.stream, [entry])
        return True

    def Test(self, status=None):
        return self.envelope is not None and self.envelope.Test(status) and self.Wait(status)

    def wait(self, status=None, stream=None):
        self.Wait(status, stream)


class GpuPointToPoint:
    """The GPU side of one communicator's point to point (made by PointToPoint.gpu_side, gpucoll/engines/p2p/host.py)."""

    def __init__(self, p2p):
        self.p2p = p2p
        self._contexts = {}
        self._outboxes = {}      # device -> slots.Outboxes
        self._side = {}          # (device, source) -> stream of the large copies from that source
        self._deferred = []      # sends of the open group: (outboxes, buf, exported, stream, dest, tag, req)
        self._grouped = []       # GPU receives posted in the open group
        self._collecting = None  # at a group's end: (outboxes, stream) -> slot entries of its receives

    # --- helpers ----------------------------------------------------------------------------
    def _context(self, device):
        ctx = self._contexts.get(device)
        if ctx is None:
            ctx = self._contexts[device] = cuda.primary_context(device)
        cuda.set_current(ctx)
        return ctx

    def _stream(self, stream, buf, what):
        stream = streams.resolve(stream, buf)
        if cuda.stream_is_capturing(stream):
            raise InvalidUsageError(f"{what} on a GPU buffer cannot be captured in a CUDA graph (the host matches "
                                    "point-to-point messages); issue it outside the capture")
        return stream

    def _slots(self, device, ctx):
        out = self._outboxes.get(device)
        if out is None:
            out = self._outboxes[device] = slots.Outboxes(device, ctx, self.p2p.view)
        out.check()
        return out

    def _side_stream(self, device, source):
        side = self._side.get((device, source))
        if side is None:
            side = self._side[(device, source)] = cuda.stream_create()
        return side

    def check_slots(self, device):
        """Raise the timeout a slot kernel of this device recorded, if any."""
        out = self._outboxes.get(device)
        if out is not None:
            out.check()

    def _launch(self, out, stream, entries):
        out.launch(entries, stream)
        stats = self.p2p.view.stats
        stats.p2p_slot_launches += -(-len(entries) // cuda.MAXMSGS)
        stats.p2p_slot_messages += len(entries)

    # --- sending ------------------------------------------------------------------------------
    def send(self, buf, dest, tag, stream=None, nonblocking=False, in_group=False):
        """Send buf (a GpuBuffer) to rank dest: None, or a Request with nonblocking=True."""
        p2p = self.p2p
        dest = p2p._check_peer(dest, "destination")
        ctx = self._context(buf.device)
        what = "Isend" if nonblocking else "Send"
        stream = self._stream(stream, buf, what)
        exported = None
        if p2p.same_host(dest) and not config.P2P_DISABLE.get():
            exported = True if buf.nbytes <= slots.SLOT_MAX else ipc.export(buf.addr)
        if log.enabled("info", "P2P"):
            how = ("via host memory" if exported is None else
                   "via its GPU outbox slot" if exported is True else "announced for a pull over P2P/IPC")
            log.info("P2P", "%s %d B to rank %d tag %d %s", what, buf.nbytes, dest, tag, how)
        if exported is None:
            req = self._send_bytes(buf, dest, tag, stream, ctx, what)
        else:
            req = GpuSendRequest(what, self, stream)
            out = self._slots(buf.device, ctx)
            if in_group:
                self._deferred.append((out, buf, exported, stream, dest, tag, req))
                return req
            entry, envelope = self._number(out, buf, exported, dest, req)
            self._launch(out, stream, [entry])
            req.envelope = self.p2p.send_bytes(envelope, dest, tag, what, OFFER_FLAG)
        if nonblocking:
            return req
        req.Wait()
        return None

    @staticmethod
    def _number(out, buf, exported, dest, req):
        """Give a send its message number: (the entry that puts or announces it, its envelope,
        to be sent once that entry is enqueued); a large one's req.finish waits for its reader."""
        if exported is True:
            return out.put(buf.addr, buf.nbytes, dest)
        entry, wait, envelope = out.announce(exported, buf.nbytes, dest)
        req.finish = (out, wait)
        return entry, envelope

    def _send_bytes(self, buf, dest, tag, stream, ctx, what):
        """The bytes through host memory, once the stream has reached the call."""
        cuda.set_current(ctx)
        cuda.stream_synchronize(stream)
        host = np.empty(buf.nbytes, np.uint8)
        if buf.nbytes:
            cuda.memcpy_dtoh(host.__array_interface__["data"][0], buf.addr, buf.nbytes)
        return self.p2p.send_bytes(memoryview(host), dest, tag, what)

    # --- receiving ----------------------------------------------------------------------------
    def recv(self, buf, source, tag, status=None, stream=None, nonblocking=False, in_group=False):
        """Receive into buf (a GpuBuffer): the request of an Irecv, or None once a Recv's data
        is enqueued on its stream."""
        ctx = self._context(buf.device)
        stream = self._stream(stream, buf, "Irecv" if nonblocking else "Recv")
        target = _Target(self, buf, stream, ctx)
        req = self.p2p.recv_into(memoryview(target.bounce), source, tag, status,
                                 "Irecv" if nonblocking else "Recv", request_type=GpuRecvRequest)
        req.target, req.grouped = target, in_group
        if in_group:
            self._grouped.append(req)
        if nonblocking:
            return req
        P2PRequest.Wait(req)
        return None

    def arrived(self, req, source, tag, descriptor):
        """An envelope matched a GPU receive: read the message out of the sender's outbox (a
        small one, at a group's end with the block's others) or its buffer (a large one)."""
        target = req.target
        cuda.set_current(target.ctx)
        out = self._slots(target.buf.device, target.ctx)
        try:
            kind, slot, data, nbytes, seq = out.envelope(descriptor, source)
        except GpucollError as exc:
            req._error = exc
            return
        req.status.nbytes = nbytes
        fits = nbytes <= target.buf.nbytes
        if not fits:
            req._error = truncated(source, tag, nbytes, target.buf.nbytes)
        if kind == slots.SMALL_KIND:
            entry = out.get(slot, nbytes, seq, source, target.buf.addr, target.buf.nbytes)
            if self._collecting is not None and req.grouped:
                self._collecting.setdefault((out, target.stream), []).append(entry)  # the event: end_group
            else:
                self._launch(out, target.stream, [entry])
                cuda.event_record(target.event, target.stream)
            how = "out of its GPU outbox slot"
        else:
            side = self._side_stream(target.buf.device, source)
            cuda.stream_wait_event(side, target.posted)
            self._launch(out, side, [out.steps(slot, seq, source, slots.WAIT_READY)])
            if fits and nbytes:
                cuda.memcpy_async(target.buf.addr, data, nbytes, side)
            self._launch(out, side, [out.steps(slot, seq, source, slots.SET_FREE)])
            cuda.event_record(target.event, side)
            if self._collecting is None or not req.grouped:
                cuda.stream_wait_event(target.stream, target.event)
            # else end_group joins the streams after its launches: the receive's stream must
            # announce this block's own large sends before it waits for the peer's
            how = "pulled via P2P/IPC"
        if log.enabled("info", "P2P"):
            log.info("P2P", "Recv %d B from rank %d tag %d %s", nbytes, source, tag, how)

    def to_host(self, req, source, tag, descriptor):
        """An envelope matched a host receive: read the message through CUDA on the GPU of this
        process's first GPU buffer (else GPUCOLL_DEVICE, else 0), on the source's copy stream."""
        host = np.frombuffer(req._keep, np.uint8) if req._keep is not None else np.empty(0, np.uint8)
        try:
            device = next(iter(self._contexts), None)
            if device is None:
                device = config.DEVICE.get() or 0
            out = self._slots(device, self._context(device))
        except GpucollError as exc:
            req._error = GpucollError(
                f"rank {source} sent this host buffer a message from GPU memory, which a process of its host reads "
                f"through CUDA, but this process cannot use CUDA ({exc}); set GPUCOLL_P2P_DISABLE=1 on every rank "
                "to send GPU messages as host bytes")
            return
        try:
            kind, slot, data, nbytes, seq = out.envelope(descriptor, source)
        except GpucollError as exc:
            req._error = exc
            return
        req.status.nbytes = nbytes
        side = self._side_stream(device, source)
        self._launch(out, side, [out.steps(slot, seq, source, slots.WAIT_READY)])
        cuda.stream_synchronize(side)
        out.check()
        if nbytes > host.nbytes:
            req._error = truncated(source, tag, nbytes, host.nbytes)
        elif nbytes:
            cuda.memcpy_dtoh(host.__array_interface__["data"][0], data, nbytes)
        self._launch(out, side, [out.steps(slot, seq, source, slots.SET_FREE)])

    # --- groups -------------------------------------------------------------------------------
    def end_group(self):
        """A comm.group() block ends: number its sends and announce them, match its GPU
        receives, then one slot launch per stream carries every small message of the block
        (and the announcements of its large ones)."""
        deferred, self._deferred = self._deferred, []
        received, self._grouped = self._grouped, []
        self._collecting = launches = {}
        try:
            for out, buf, exported, stream, dest, tag, req in deferred:
                entry, envelope = self._number(out, buf, exported, dest, req)
                launches.setdefault((out, stream), []).append(entry)
                # sent before the launch: the receiver's kernel waits for the ready words
                req.envelope = self.p2p.send_bytes(envelope, dest, tag, req.name, OFFER_FLAG)
            for req in received:
                P2PRequest.Wait(req)  # matched: a small message adds its entry to `launches`
        finally:
            self._collecting = None
            for req in received:
                req.grouped = False
            for (out, stream), entries in launches.items():
                self._launch(out, stream, entries)
            for req in received:
                target = req.target
                cuda.stream_wait_event(target.stream, target.event)  # a large copy's side stream, if any
                cuda.event_record(target.event, target.stream)

    def revoke(self):
        """Release this rank's slot kernels that wait (ULFM's revoke)."""
        for out in self._outboxes.values():
            out.revoke()

    def drop_group(self):
        """A comm.group() block raised: its sends are dropped with it (they were never
        numbered), its receives stay posted and complete on their own."""
        for req in self._grouped:
            req.grouped = False
        self._deferred, self._grouped = [], []

    def close(self):
        """Release the outboxes and side streams; raises a timeout a slot kernel recorded."""
        error = None
        for out in self._outboxes.values():
            try:
                out.close()  # waits for the device: nothing of ours still runs on the copy streams
            except GpucollError as exc:
                error = error or exc
        self._outboxes = {}
        for (device, _), side in self._side.items():
            self._context(device)
            cuda.stream_destroy(side)
        self._side = {}
        if error is not None:
            raise error
