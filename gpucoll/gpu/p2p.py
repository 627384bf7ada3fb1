"""Point to point on GPU buffers (Send, Recv, Isend, Irecv, Sendrecv), in stream order.

Matching (source, tag, ANY_SOURCE, ANY_TAG, no overtaking between two ranks) is the host
inbox's (gpucoll/p2p.py); only the data path is the GPU's:

* To another process of this host, above EAGER_MAX bytes: the sender records an interprocess
  CUDA event on its stream and sends an offer (its buffer's IPC handle, offset and size, the
  event's handle) instead of the bytes. The receiver's progress thread maps the buffer (once
  per allocation, gpucoll/gpu/ipc.py), makes its stream wait for the sender's event, copies
  peer to local on that stream (copy engine over NVLink or PCIe), records an interprocess
  event of its own and answers with its handle; the sender's stream then waits for that event,
  so later work there may overwrite the buffer. Send returns once the receiver has answered
  (a rendezvous, like MPI's large sends); the answer comes from a progress thread, so two ranks
  that send to each other before receiving (Sendrecv, Isend/Irecv) do not deadlock.
* Otherwise (small messages, another host, GPUCOLL_P2P_DISABLE=1, memory that cannot be shared,
  a receiver that cannot map it, a host receive buffer) the bytes travel through host memory:
  the sender copies them down once its stream has reached the call, the receiver copies them
  up on its stream.

A receive completes when its data is enqueued on the receiver's stream: Recv returns then;
an Irecv request's Wait() blocks until the data has landed, Wait(stream=s) makes s wait.
Point-to-point calls cannot be captured in a CUDA graph (they need the host to match them).
"""
import functools
import pickle
import struct
import threading

import numpy as np

from .. import config, log
from ..engine import OrderedEngine
from ..errors import GpucollError, InvalidUsageError
from ..errors import TimeoutError as GpucollTimeout
from ..p2p import GPU_BYTES_TAG, GPU_REPLY_TAG, OFFER, _TimedRequest
from . import ipc, streams

EAGER_MAX = 64 << 10  # GPU messages up to this size go through host memory at once (no rendezvous)
_OFFER = struct.Struct("!64sQQ64s")  # memory handle, offset, bytes, event handle

cuda = None  # gpucoll._native.cuda, imported on first use


def _cuda():
    global cuda
    if cuda is None:
        from .._native import cuda as _c

        cuda = _c
    return cuda


class _Target:
    """Where a GPU receive puts its data: the buffer, the stream, and a host bounce buffer for
    messages that arrive as bytes (np.empty: its pages are only touched if it is used)."""

    __slots__ = ("owner", "buf", "stream", "ctx", "bounce", "event")

    def __init__(self, owner, buf, stream, ctx):
        self.owner, self.buf, self.stream, self.ctx = owner, buf, stream, ctx
        self.bounce = np.empty(buf.nbytes, np.uint8)
        self.event = cuda.event_create()  # recorded after the data's copy, for Wait()

    def landed(self, posted, nbytes, error):
        """The message arrived as bytes in the bounce buffer (called by the inbox's reader)."""
        self.owner._progress(self._upload, posted, nbytes, error)

    def _upload(self, posted, nbytes, error):
        if error is None and nbytes:
            cuda.set_current(self.ctx)
            cuda.memcpy_htod_async(self.buf.addr, self.bounce.__array_interface__["data"][0], nbytes, self.stream)
        if error is None:
            cuda.event_record(self.event, self.stream)
        posted.request._finish(error=error)


class GpuRecvRequest(_TimedRequest):
    """Done (Test) once the data has landed; Wait() blocks until then, Wait(stream=s) only makes
    stream s wait for it."""

    __slots__ = ("target",)

    def Wait(self, status=None, stream=None):
        super().Wait(status)  # the copy is enqueued (raises the receive's error or its timeout)
        if stream is not None:
            cuda.stream_wait_event(streams.handle(stream), self.target.event)
        else:
            cuda.event_synchronize(self.target.event)
        return True

    def Test(self, status=None):
        return super().Test(status) and cuda.event_query(self.target.event)

    def wait(self, status=None, stream=None):
        self.Wait(status, stream)

    def __del__(self):
        try:
            cuda.event_destroy(self.target.event)
        except Exception:
            pass


class GpuPointToPoint:
    """The GPU side of one communicator's point to point (made by gpucoll.p2p.PointToPoint.gpu)."""

    def __init__(self, p2p):
        _cuda()
        self.p2p = p2p
        self._engine = OrderedEngine(f"{p2p._comm._id}-gpu-p2p")
        self._lock = threading.Lock()
        self._contexts = {}
        self._spare_events = []  # interprocess events of offers, reused once their send is done
        self._done_events = {}   # source rank -> (event, handle): recorded after each pull from it

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

    def _ipc_event(self):
        with self._lock:
            if self._spare_events:
                return self._spare_events.pop()
        event = cuda.event_create(interprocess=True)
        return event, cuda.ipc_get_event_handle(event)

    def _progress(self, fn, posted, *args):
        """Run fn on the progress thread; its errors fail the receive instead of the thread."""
        def task():
            try:
                fn(posted, *args)
            except GpucollError as exc:
                posted.request._finish(error=exc)
        self._engine.submit(task, "gpu-p2p")

    def _answer(self, dest, answer):
        self.p2p.send_now(memoryview(pickle.dumps(answer)), dest, GPU_REPLY_TAG)

    # --- sending ------------------------------------------------------------------------------
    def send(self, buf, dest, tag, stream=None, nonblocking=False):
        """Send buf (a GpuBuffer) to rank dest: None, or a Request with nonblocking=True."""
        p2p = self.p2p
        dest = p2p._check_peer(dest, "destination")
        ctx = self._context(buf.device)
        stream = self._stream(stream, buf, "Isend" if nonblocking else "Send")
        offer = buf.nbytes > EAGER_MAX and p2p.same_host(dest) and not config.P2P_DISABLE.get()
        event = self._ipc_event()
        cuda.event_record(event[0], stream)  # the data is ready when the stream gets here
        task = functools.partial(self._send, buf, dest, tag, stream, ctx, event, offer)
        engine = p2p._sender(dest)
        return engine.submit(task, "Isend") if nonblocking else engine.run(task)

    def _send(self, buf, dest, tag, stream, ctx, event, offer):
        cuda.set_current(ctx)
        try:
            exported = ipc.export(buf.addr) if offer else None
            if log.enabled("info", "P2P"):
                log.info("P2P", "Send %d B to rank %d tag %d %s", buf.nbytes, dest, tag,
                         "offered via P2P/IPC" if exported else "via host memory")
            if exported is None:
                self._send_bytes(buf, dest, tag, event)
            else:
                self._offer(buf, dest, tag, stream, event, exported)
        finally:
            with self._lock:
                self._spare_events.append(event)

    def _send_bytes(self, buf, dest, tag, event):
        cuda.event_synchronize(event[0])
        host = np.empty(buf.nbytes, np.uint8)
        if buf.nbytes:
            cuda.memcpy_dtoh(host.__array_interface__["data"][0], buf.addr, buf.nbytes)
        self.p2p._send_task(memoryview(host), dest, tag)()

    def _offer(self, buf, dest, tag, stream, event, exported):
        p2p = self.p2p
        handle, offset = exported
        reply = p2p.irecv_object(dest, GPU_REPLY_TAG)  # posted before the offer can be answered
        p2p._send_task(memoryview(_OFFER.pack(handle, offset, buf.nbytes, event[1])), dest, tag, OFFER)()
        try:
            answer = reply.wait()
        except GpucollTimeout:
            raise GpucollTimeout(
                f"Send of {buf.nbytes} bytes from GPU memory to rank {dest} with tag {tag}: rank {dest} posted no "
                f"matching receive within {p2p._timeout:g} s (GPUCOLL_TIMEOUT)") from None
        if answer[0] == "done":
            cuda.stream_wait_event(stream, ipc.open_event(answer[1]))
        elif answer[0] == "bytes":
            self._send_bytes(buf, dest, GPU_BYTES_TAG, event)
        # "error": the receive failed (e.g. too small a buffer) and raises there; this send is done

    # --- receiving ----------------------------------------------------------------------------
    def recv(self, buf, source, tag, status=None, stream=None, nonblocking=False):
        """Receive into buf (a GpuBuffer): the request of an Irecv, or None once a Recv's data
        is enqueued on its stream."""
        ctx = self._context(buf.device)
        stream = self._stream(stream, buf, "Irecv" if nonblocking else "Recv")
        target = _Target(self, buf, stream, ctx)
        req = self.p2p._post(memoryview(target.bounce), source, tag, status, buf.nbytes,
                             "Irecv" if nonblocking else "Recv", gpu=target, request_type=GpuRecvRequest)
        req.target = target
        if nonblocking:
            return req
        _TimedRequest.Wait(req)
        return None

    def pull(self, posted, source, tag, offer):
        """An offer matched a GPU receive (called by the inbox's reader): copy on the progress thread."""
        self._progress(self._pull, posted, source, tag, offer)

    def _pull(self, posted, source, tag, offer):
        if len(offer) != _OFFER.size:  # the inbox bounds an offer's size; its layout is checked here
            self._answer(source, ("error", "malformed offer"))
            posted.request._finish(error=GpucollError(
                f"rank {source} sent a malformed GPU offer ({len(offer)} bytes instead of {_OFFER.size})"))
            return
        handle, offset, nbytes, event_handle = _OFFER.unpack(offer)
        target = posted.gpu
        status = posted.status
        if status is not None:
            status.source, status.tag, status.nbytes = source, tag, nbytes
        if nbytes > posted.want_bytes:
            self._answer(source, ("error", "truncated"))
            posted.request._finish(error=GpucollError(
                f"message truncated: rank {source} sent {nbytes} bytes with tag {tag}, the receive buffer holds "
                f"{posted.want_bytes}; pass a larger buffer"))
            return
        cuda.set_current(target.ctx)
        try:
            base = ipc.open_memory(handle)
            sender_event = ipc.open_event(event_handle)
        except GpucollError as exc:  # e.g. no peer access between the two GPUs: take the bytes instead
            log.info("P2P", "Recv %d B from rank %d tag %d via host memory: cannot map its GPU memory (%s)",
                     nbytes, source, tag, exc)
            self._ask(posted, source, tag)
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
        self._answer(source, ("done", done[1]))
        posted.request._finish()
        if log.enabled("info", "P2P"):
            log.info("P2P", "Recv %d B from rank %d tag %d pulled via P2P/IPC", nbytes, source, tag)

    def ask_for_bytes(self, posted, source, tag):
        """An offer matched a receive that cannot pull it (a host buffer): ask for the bytes."""
        self._progress(self._ask, posted, source, tag)

    def _ask(self, posted, source, tag):
        self.p2p.repost(posted, source, tag)
        self._answer(source, ("bytes",))

    def close(self):
        self._engine.close()
