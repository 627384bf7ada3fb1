"""Point to point on GPU buffers (Send, Recv, Isend, Irecv, Sendrecv), in stream order.

Matching (source, tag, ANY_SOURCE, ANY_TAG, no overtaking between two ranks) is the host
engine's (gpucoll/p2p.py, the public face of cython_src/include/gc_p2p.h); only the data path
is the GPU's:

* To another process of this host, above EAGER_MAX bytes: the sender records an interprocess
  CUDA event on its stream and sends an offer instead of the bytes (an eager message flagged
  OFFER: its buffer's IPC handle, offset and size, the event's handle and a sequence number).
  The receiver maps the buffer (once per allocation, gpucoll/gpu/ipc.py), makes its stream wait
  for the sender's event, copies peer to local on that stream (copy engine over NVLink or PCIe),
  records an interprocess event of its own (one per source, reused) and answers with its
  handle; the sender's stream then waits for that event, so later work there may overwrite the
  buffer. Send returns once the receiver has answered (a rendezvous, like MPI's large sends).
  Whoever waits for an answer also serves the offers that reached its own pending GPU receives,
  so two ranks that send to each other before receiving (Sendrecv, Isend/Irecv) do not deadlock.
* To another process of this host, up to slots.SLOT_MAX bytes: through the sender's GPU outbox
  (gpucoll/gpu/slots.py): one kernel on each side, flags on the device, an envelope through
  the host engine for matching. Send returns once the copy is enqueued on its stream. Inside
  comm.group() the small sends wait for the block's end, and then every small send and
  receive of the block that shares a stream goes out in one kernel launch.
* Otherwise (another host, GPUCOLL_P2P_DISABLE=1, memory that cannot be shared, a receiver
  that cannot map it, a host receive buffer of an offer) the bytes travel through host memory:
  the sender copies them down once its stream has reached the call, the receiver copies them
  up on its stream.

A receive completes when its data is enqueued on the receiver's stream: Recv returns then;
an Irecv request's Wait() blocks until the data has landed, Wait(stream=s) makes s wait.
Point-to-point calls cannot be captured in a CUDA graph (they need the host to match them).
"""
import itertools
import pickle
import threading
import time
import weakref

import numpy as np

from .. import config, log
from ..errors import GpucollError, InvalidUsageError
from ..errors import TimeoutError as GpucollTimeout
from ..p2p import GPU_BYTES_TAG, OFFER, OFFER_FLAG, OFFER_KIND, P2PRequest, reply_tag
from ..request import Request
from . import ipc, slots, streams

EAGER_MAX = 64 << 10  # GPU messages up to this size go through host memory at once (no rendezvous)
_SEQ_MOD = 1 << 20  # offers are numbered modulo this (the number picks the answer's tag)

cuda = None  # gpucoll._native.cuda, imported on first use


def _cuda():
    global cuda
    if cuda is None:
        from .._native import cuda as _c

        cuda = _c
    return cuda


class GpuRecvRequest(P2PRequest):
    """A receive into GPU memory. Done (Test) once the data has landed; Wait() blocks until then,
    Wait(stream=s) only makes stream s wait for it."""

    __slots__ = ("target", "grouped", "__weakref__")

    def _settle(self):
        """The host engine is done with this receive: bytes in the bounce buffer, or an offer."""
        if self._settled:
            return
        self._settled = True
        target = self.target
        src, tag, nbytes, flags = self._native.status
        p2p = self._p2p
        source = p2p.rank_of(src)
        err = self._native.err
        self.status.source, self.status.nbytes = source, nbytes
        self.status.tag = tag if self._report_tag is None else self._report_tag
        if err != 0:
            self._keep = None
            self._error = p2p.error(self, err)
            return
        if flags & OFFER_FLAG:
            descriptor = self._native.data()
            if descriptor[:1] == OFFER_KIND:
                target.owner.pull(self, source, tag, descriptor)
            else:
                target.owner.slot_get(self, source, tag, descriptor)
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
            self.target.owner.check_slots(self.target.buf.device)  # the slot kernel may have given up
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
        except Exception:
            pass


class _Target:
    """Where a GPU receive puts its data: the buffer, the stream, and a host bounce buffer for
    messages that arrive as bytes (np.empty: its pages are only touched if it is used)."""

    __slots__ = ("owner", "buf", "stream", "ctx", "bounce", "event")

    def __init__(self, owner, buf, stream, ctx):
        self.owner, self.buf, self.stream, self.ctx = owner, buf, stream, ctx
        self.bounce = np.empty(buf.nbytes, np.uint8)
        self.event = cuda.event_create()  # recorded after the data's copy, for Wait()

    def upload(self, nbytes):
        cuda.set_current(self.ctx)
        if nbytes:
            cuda.memcpy_htod_async(self.buf.addr, self.bounce.__array_interface__["data"][0], nbytes, self.stream)
        cuda.event_record(self.event, self.stream)


class GpuSendRequest(P2PRequest):
    """A large send from GPU memory: its offer went out; Wait() waits for the receiver's answer
    (serving this process's own pending GPU receives meanwhile) and orders the stream after it."""

    __slots__ = ("gpu", "buf", "dest", "stream", "event", "offer_req")

    def Wait(self, status=None, stream=None):
        if not self._settled:
            self._settled = True
            try:
                self.gpu.answered(self)
            except BaseException as exc:
                self._error = exc
            finally:
                self.gpu.spare(self.event)
        return super().Wait(status)

    def Test(self, status=None):
        if not self._settled and not self._native.test():
            self.gpu.progress()
            return False
        return self.Wait()

    def wait(self, status=None, stream=None):
        self.Wait(status, stream)


class SlotSendRequest(Request):
    """A small GPU send of a comm.group() block: it goes out when the block ends."""

    def __init__(self, name):
        super().__init__(name)
        self.envelope = None  # the envelope's host request, once sent

    def Wait(self, status=None, stream=None):
        if self.envelope is None:
            raise InvalidUsageError(f"{self.name} of a GPU buffer inside comm.group() starts when the block ends: "
                                    "wait for its request after the `with` block")
        return self.envelope.Wait(status)

    def Test(self, status=None):
        return self.envelope is not None and self.envelope.Test(status)

    def wait(self, status=None, stream=None):
        self.Wait(status, stream)


class GpuPointToPoint:
    """The GPU side of one communicator's point to point (made by gpucoll.p2p.PointToPoint.gpu)."""

    def __init__(self, p2p):
        _cuda()
        self.p2p = p2p
        self._lock = threading.Lock()
        self._contexts = {}
        self._spare_events = []  # interprocess events of offers, reused once their send is done
        self._done_events = {}   # source rank -> (event, handle): recorded after each pull from it
        self._pending = weakref.WeakSet()  # GPU receives not yet settled (offers served while waiting)
        self._seq = itertools.count()
        self._outboxes = {}    # device -> slots.Outboxes
        self._deferred = []    # small sends of the open group: (outboxes, buf, stream, dest, tag, req)
        self._grouped = []     # GPU receives posted in the open group
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
            out = self._outboxes[device] = slots.Outboxes(device, ctx, self.p2p._comm.name)
        out.check()
        return out

    def check_slots(self, device):
        """Raise the timeout a slot kernel of this device recorded, if any."""
        out = self._outboxes.get(device)
        if out is not None:
            out.check()

    def _launch(self, out, stream, entries):
        out.launch(entries, stream)
        stats = self.p2p._comm._stats
        stats.p2p_slot_launches += -(-len(entries) // cuda.MAXMSGS)
        stats.p2p_slot_messages += len(entries)

    def _ipc_event(self):
        with self._lock:
            if self._spare_events:
                return self._spare_events.pop()
        event = cuda.event_create(interprocess=True)
        return event, cuda.ipc_get_event_handle(event)

    def spare(self, event):
        with self._lock:
            self._spare_events.append(event)

    def _answer(self, dest, seq, answer):
        self.p2p.send_bytes(pickle.dumps(answer), dest, reply_tag(seq), "GPU answer").Wait()

    def progress(self):
        """Serve the offers that reached this communicator's pending GPU receives."""
        for req in list(self._pending):
            if req._settled:
                self._pending.discard(req)
            elif req._native.done:
                self._pending.discard(req)
                req._settle()

    # --- sending ------------------------------------------------------------------------------
    def send(self, buf, dest, tag, stream=None, nonblocking=False, in_group=False):
        """Send buf (a GpuBuffer) to rank dest: None, or a Request with nonblocking=True."""
        p2p = self.p2p
        dest = p2p._check_peer(dest, "destination")
        ctx = self._context(buf.device)
        what = "Isend" if nonblocking else "Send"
        stream = self._stream(stream, buf, what)
        ipc_ok = p2p.same_host(dest) and not config.P2P_DISABLE.get()
        if ipc_ok and buf.nbytes <= slots.SLOT_MAX:
            if log.enabled("info", "P2P"):
                log.info("P2P", "%s %d B to rank %d tag %d via its GPU outbox slot", what, buf.nbytes, dest, tag)
            req = self._put(buf, dest, tag, stream, ctx, what, in_group)
        else:
            exported = ipc.export(buf.addr) if ipc_ok else None
            if log.enabled("info", "P2P"):
                log.info("P2P", "%s %d B to rank %d tag %d %s", what, buf.nbytes, dest, tag,
                         "offered via P2P/IPC" if exported else "via host memory")
            if exported is None:
                req = self._send_bytes(buf, dest, tag, stream, ctx, what)
            else:
                req = self._offer(buf, dest, tag, stream, exported, what)
        if nonblocking:
            return req
        req.Wait()
        return None

    def _put(self, buf, dest, tag, stream, ctx, what, in_group):
        """A small message through this rank's outbox for dest: copied in on the stream, then
        announced (in a group: both when the block ends)."""
        out = self._slots(buf.device, ctx)
        if in_group:
            req = SlotSendRequest(what)
            self._deferred.append((out, buf, stream, dest, tag, req))
            return req
        entry, envelope = out.put(buf.addr, buf.nbytes, dest)
        self._launch(out, stream, [entry])
        return self.p2p.send_bytes(envelope, dest, tag, what, OFFER_FLAG)

    def _send_bytes(self, buf, dest, tag, stream, ctx, what):
        """The bytes through host memory, once the stream has reached the call."""
        cuda.set_current(ctx)
        cuda.stream_synchronize(stream)
        host = np.empty(buf.nbytes, np.uint8)
        if buf.nbytes:
            cuda.memcpy_dtoh(host.__array_interface__["data"][0], buf.addr, buf.nbytes)
        return self.p2p.send_bytes(memoryview(host), dest, tag, what)

    def _offer(self, buf, dest, tag, stream, exported, what):
        p2p = self.p2p
        handle, offset = exported
        seq = next(self._seq) % _SEQ_MOD
        event = self._ipc_event()
        cuda.event_record(event[0], stream)  # the data is ready when the stream gets here
        reply = p2p.irecv_bytes(dest, reply_tag(seq), name=f"{what} (the answer to its offer)")
        offer = OFFER.pack(OFFER_KIND, handle, offset, buf.nbytes, event[1], seq)
        sent = p2p.send_bytes(offer, dest, tag, what, OFFER_FLAG)
        req = GpuSendRequest(what, p2p, reply._native, "recv", dest, tag, keep=offer, cap=buf.nbytes)
        req.gpu, req.buf, req.dest, req.stream, req.event, req.offer_req = self, buf, dest, stream, event, sent
        return req

    def answered(self, req):
        """Wait for the receiver's answer to req's offer and act on it."""
        p2p = self.p2p
        timeout = p2p._timeout
        deadline = time.monotonic() + timeout
        while not req._native.wait(0.0005):
            self.progress()
            if time.monotonic() > deadline:
                raise GpucollTimeout(
                    f"Send of {req.buf.nbytes} bytes from GPU memory to rank {req.dest} with tag {req.tag}: rank "
                    f"{req.dest} posted no matching receive within {timeout:g} s (GPUCOLL_TIMEOUT)")
        req.offer_req.Wait()
        if req._native.err != 0:
            raise p2p.error(req, req._native.err)
        answer = pickle.loads(req._native.data())
        if answer[0] == "done":
            cuda.stream_wait_event(req.stream, ipc.open_event(answer[1]))
        elif answer[0] == "bytes":
            self._send_bytes(req.buf, req.dest, GPU_BYTES_TAG, req.stream, self._context(req.buf.device),
                             "Send").Wait()
        # "error": the receive failed (e.g. too small a buffer) and raises there; this send is done

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
        self._pending.add(req)
        if nonblocking:
            return req
        P2PRequest.Wait(req)
        return None

    def pull(self, req, source, tag, offer):
        """An offer matched a GPU receive: copy from the sender's memory on the receive's stream."""
        target = req.target
        if len(offer) != OFFER.size:  # the engine bounds an offer's size; its layout is checked here
            req._error = GpucollError(f"rank {source} sent a malformed GPU offer ({len(offer)} bytes instead of "
                                      f"{OFFER.size})")
            return
        _, handle, offset, nbytes, event_handle, seq = OFFER.unpack(offer)
        req.status.nbytes = nbytes
        if nbytes > target.buf.nbytes:
            self._answer(source, seq, ("error", "truncated"))
            req._error = _truncated(source, tag, nbytes, target.buf.nbytes)
            return
        cuda.set_current(target.ctx)
        try:
            base = ipc.open_memory(handle)
            sender_event = ipc.open_event(event_handle)
        except GpucollError as exc:  # e.g. no peer access between the two GPUs: take the bytes instead
            log.info("P2P", "Recv %d B from rank %d tag %d via host memory: cannot map its GPU memory (%s)",
                     nbytes, source, tag, exc)
            self.ask_for_bytes(req, source, tag, offer)
            return
        cuda.stream_wait_event(target.stream, sender_event)
        if nbytes:
            cuda.memcpy_async(target.buf.addr, base + offset, nbytes, target.stream)
        done = self._done_events.get(source)
        if done is None:
            event = cuda.event_create(interprocess=True)
            done = self._done_events[source] = (event, cuda.ipc_get_event_handle(event))
        cuda.event_record(done[0], target.stream)
        cuda.event_record(target.event, target.stream)
        self._answer(source, seq, ("done", done[1]))
        if log.enabled("info", "P2P"):
            log.info("P2P", "Recv %d B from rank %d tag %d pulled via P2P/IPC", nbytes, source, tag)

    def slot_get(self, req, source, tag, descriptor):
        """A small message in the sender's outbox matched a GPU receive: read it out on the
        receive's stream (at a group's end: with the block's other slot messages)."""
        target = req.target
        out = self._slots(target.buf.device, target.ctx)
        try:
            entry, nbytes = out.get(descriptor, source, target.buf.addr, target.buf.nbytes)
        except GpucollError as exc:
            req._error = exc
            return
        req.status.nbytes = nbytes
        if nbytes > target.buf.nbytes:
            req._error = _truncated(source, tag, nbytes, target.buf.nbytes)
        if self._collecting is not None and req.grouped:
            self._collecting.setdefault((out, target.stream), []).append(entry)  # the event: end_group
        else:
            self._launch(out, target.stream, [entry])
            cuda.event_record(target.event, target.stream)
        if log.enabled("info", "P2P"):
            log.info("P2P", "Recv %d B from rank %d tag %d out of its GPU outbox slot", nbytes, source, tag)

    def slot_to_host(self, req, source, tag, descriptor):
        """A small message in the sender's outbox matched a host receive: read it out through
        device memory of this process (the GPU of its first GPU buffer, else GPUCOLL_DEVICE or 0)."""
        device = next(iter(self._contexts), None)
        if device is None:
            device = config.DEVICE.get() or 0
        ctx = self._context(device)
        out = self._slots(device, ctx)
        host = np.frombuffer(req._keep, np.uint8) if req._keep is not None else np.empty(0, np.uint8)
        capacity = host.nbytes
        try:
            entry, nbytes = out.get(descriptor, source, 0, capacity)
        except GpucollError as exc:
            req._error = exc
            return
        req.status.nbytes = nbytes
        scratch = cuda.mem_alloc(max(nbytes, 1))
        try:
            self._launch(out, 0, [(scratch,) + entry[1:]])
            cuda.stream_synchronize(0)
            out.check()
            if nbytes > capacity:
                req._error = _truncated(source, tag, nbytes, capacity)
            elif nbytes:
                cuda.memcpy_dtoh(host.__array_interface__["data"][0], scratch, nbytes)
        finally:
            cuda.mem_free(scratch)

    def end_group(self):
        """A comm.group() block ends: announce its small sends, match its GPU receives, then one
        slot launch per stream carries every small message of the block."""
        deferred, self._deferred = self._deferred, []
        received, self._grouped = self._grouped, []
        self._collecting = launches = {}
        try:
            for out, buf, stream, dest, tag, req in deferred:
                entry, envelope = out.put(buf.addr, buf.nbytes, dest)
                launches.setdefault((out, stream), []).append(entry)
                req.envelope = self.p2p.send_bytes(envelope, dest, tag, req.name, OFFER_FLAG)
            for req in received:
                P2PRequest.Wait(req)  # matched: a slot message adds its entry to `launches`
        finally:
            self._collecting = None
            for req in received:
                req.grouped = False
            for (out, stream), entries in launches.items():
                self._launch(out, stream, entries)
            for req in received:
                cuda.event_record(req.target.event, req.target.stream)

    def drop_group(self):
        """A comm.group() block raised: its small sends are dropped with it (they were never
        numbered), its receives stay posted and complete on their own."""
        for req in self._grouped:
            req.grouped = False
        self._deferred, self._grouped = [], []

    def ask_for_bytes(self, req, source, tag, offer):
        """An offer matched a GPU receive that cannot map the sender's memory: the bytes instead."""
        self.p2p.ask_for_bytes(req, source, tag, offer)
        self._pending.add(req)

    def close(self):
        self._pending = weakref.WeakSet()
        for out in self._outboxes.values():
            out.close()
        self._outboxes = {}


def _truncated(source, tag, nbytes, capacity):
    return GpucollError(f"message truncated: rank {source} sent {nbytes} bytes with tag {tag}, the receive buffer "
                        f"holds {capacity}; pass a larger buffer")
