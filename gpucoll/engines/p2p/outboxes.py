"""GPU messages between processes of one host: outboxes in GPU memory, flags on the device.

The sender owns one outbox per destination (a cuMemAlloc block, made on the first message to
it): SLOTS slots of a header (ready and free words, one per kernel block) and SLOT_MAX bytes.
Message n of the pair (numbered by the sender) uses slot n % SLOTS, whatever its size; the host
engine carries an envelope (an OFFER-flagged message: SMALL or LARGE below) and does the matching
(source, tag, ANY_SOURCE, order between a pair). No host round trip, no answer:

* small (up to SLOT_MAX bytes): the sender's p2p_slots kernel waits until the slot's previous
  message was read out, copies the bytes in and raises the ready words to n + 1; the
  receiver's, once the envelope matched, waits for them, copies the bytes out over P2P and
  raises the slot's free words to n + 1, in the sender's memory.
* large: the bytes stay in the sender's buffer. The sender's kernel only raises the ready
  words when its stream reaches the send (after the slot's previous message was read), and
  the envelope carries the buffer's IPC handle. The receiver, on a stream of its own that
  first waits for the point its receive was posted at, waits for the ready words, copies
  from the sender's buffer on the copy engine and raises the free words; its receive stream
  then waits for that copy. The sender's stream waits for the free words where the send
  completes (Send: at once; Isend: at Wait/Test), so later work there may overwrite the buffer.

Receivers read from the sender's memory (its outbox, or its buffer), so the communicator's Free
and the process's exit first wait until every message sent through the outboxes was read.

Memory handles are mapped once per allocation (gpucoll/engines/gpu/ipc.py). A sender SLOTS messages
ahead of its receiver makes its stream wait on the device (as NCCL's sends do); a kernel that
waits longer than GPUCOLL_TIMEOUT gives up and records the peer in a mapped host word, raised
as gpucoll.TimeoutError by the next point-to-point call of the communicator, by a receive's
Wait, or by the communicator's Free; one that nothing raised by the time the process exits is
reported then (settle_at_exit()). When a peer's process ends, the abort word releases the
kernels that wait on it (and only those) at once, and the same calls raise ProcFailedError
naming it; a revoke releases them all (RevokedError). Layout and steps in
gpucoll/kernels/coll.cu (p2p_slots).
"""
import collections
import struct
import threading
import weakref

from ..._native import cuda
from ...base import config
from ...base.errors import GpucollError, ProcFailedError, RevokedError
from ...base.errors import TimeoutError as GpucollTimeout
from ...transports import process_watch
from ..gpu import ipc
from ..gpu.kernels import Kernels

SLOTS = 32
SLOT_BLOCKS = 4        # blocks per message (coll.cu: SLOT_BLOCKS)
SLOT_HEADER = 256      # ready words, free words (coll.cu: SLOT_HEADER)
SLOT_MAX = 64 << 10    # the largest message that goes through a slot
STRIDE = SLOT_HEADER + SLOT_MAX
THREADS = 256
# The kernel's steps (coll.cu)
WAIT_PREV, COPY_IN, SET_READY, WAIT_READY, COPY_OUT, SET_FREE, WAIT_FREE = 1, 2, 4, 8, 16, 32, 64
PUT, GET = WAIT_PREV | COPY_IN | SET_READY, WAIT_READY | COPY_OUT | SET_FREE
ANNOUNCE = WAIT_PREV | SET_READY
# Envelopes: kind, the outbox's IPC handle, the slot's offset in it, bytes, message number; a
# large one also the IPC handle of the sender's buffer and the offset in that allocation.
SMALL = struct.Struct("!c64sQQQ")
LARGE = struct.Struct("!c64sQQQ64sQ")
SMALL_KIND, LARGE_KIND = b"S", b"L"

_kernels = {}  # arch -> Kernels, shared by every communicator of the process
_kernels_lock = threading.Lock()
_open = weakref.WeakSet()  # every Outboxes not closed yet (settle_at_exit)


def message_size(envelope):
    """The size of the GPU message an envelope announces (probes report it), or None when the
    bytes are not an envelope."""
    layout = {SMALL_KIND: SMALL, LARGE_KIND: LARGE}.get(envelope[:1])
    if layout is None or len(envelope) != layout.size:
        return None
    return layout.unpack(envelope)[3]


def kernels(arch):
    with _kernels_lock:
        k = _kernels.get(arch)
        if k is None:
            k = _kernels[arch] = Kernels(arch)
        return k


class Outboxes:
    """One device's outboxes and slot kernel launches for one communicator's point to point."""

    def __init__(self, device, ctx, view):
        self.device, self.ctx, self.name = device, ctx, view.name
        arch = cuda.device_attribute(device, 75) * 10 + cuda.device_attribute(device, 76)
        self.fn = kernels(arch).copy()["p2p_slots"]
        self.err_host, err_dev = cuda.host_alloc_mapped(64)
        self.launcher = cuda.Launcher()
        self.launcher.set_team(ctx, [], [], 0, 0, 0, 0, int(config.TIMEOUT.get() * 1e9), self.err_host, err_dev)
        self._boxes = {}  # destination rank -> (base, IPC handle)
        self._sent = collections.Counter()  # destination rank -> messages numbered so far
        self._lock = threading.Lock()
        self.heard = False  # whether a recorded timeout was raised to the program
        self.lost, self.revoked = set(), False
        self._pid_of = {r: view.ctx.watch_pid(w) for r, w in enumerate(view.world_ranks) if r != view.rank}
        self._rank_of = {pid: r for r, pid in self._pid_of.items() if pid}
        self._watch = process_watch.watch(self._rank_of, self._peer_ended)
        _open.add(self)

    def _peer_ended(self, pid):
        """(The watcher thread.) Release the waits on that rank only: messages between live
        ranks go on."""
        rank = self._rank_of[pid]
        self._abort(1 << (rank % 63), lost=rank)

    def revoke(self):
        self._abort(cuda.ABORT_ALL, revoked=True)

    def _abort(self, bits, lost=None, revoked=False):
        with self._lock:
            if lost is not None:
                self.lost.add(lost)
            self.revoked = self.revoked or revoked
            if self.launcher is not None:
                self.launcher.abort(bits)

    def _box(self, dest):
        box = self._boxes.get(dest)
        if box is None:
            cuda.set_current(self.ctx)
            base = cuda.mem_alloc(SLOTS * STRIDE)
            try:
                cuda.memset_d8(base, 0, SLOTS * STRIDE)  # every ready and free word at 0
                cuda.ctx_synchronize()
                box = (base, cuda.ipc_get_mem_handle(base))
            except BaseException:
                cuda.mem_free(base)
                raise
            self._boxes[dest] = box
        return box

    def _number(self, dest):
        """(base, handle of the outbox for dest, the next message number, its slot's offset)."""
        with self._lock:
            base, handle = self._box(dest)
            seq = self._sent[dest]
            self._sent[dest] = seq + 1
        return base, handle, seq, (seq % SLOTS) * STRIDE

    def put(self, addr, nbytes, dest):
        """A small message of nbytes at addr to rank dest: (launch entry, envelope)."""
        base, handle, seq, offset = self._number(dest)
        entry = (addr, base + offset, nbytes, nbytes, seq, dest, PUT)
        return entry, SMALL.pack(SMALL_KIND, handle, offset, nbytes, seq)

    def announce(self, exported, nbytes, dest):
        """A large message in the caller's buffer (exported: its IPC handle and offset) to rank
        dest: (launch entry that raises the ready words, the entry that later waits for the
        free words, envelope)."""
        base, handle, seq, offset = self._number(dest)
        slot = base + offset
        return ((0, slot, 0, 0, seq, dest, ANNOUNCE), (0, slot, 0, 0, seq, dest, WAIT_FREE),
                LARGE.pack(LARGE_KIND, handle, offset, nbytes, seq, *exported))

    def _map(self, handle, source):
        cuda.set_current(self.ctx)
        try:
            return ipc.open_memory(handle, self._pid_of.get(source, 0))
        except GpucollError as exc:
            raise GpucollError(f"cannot map rank {source}'s GPU memory to receive its message ({exc}); set "
                               "GPUCOLL_P2P_DISABLE=1 on every rank to send GPU messages through host memory") from None

    def envelope(self, descriptor, source):
        """What an envelope says: (kind, slot address here, the message's bytes' address here
        (in the slot, or the sender's buffer), bytes, message number)."""
        kind = descriptor[:1]
        layout = LARGE if kind == LARGE_KIND else SMALL
        if kind not in (SMALL_KIND, LARGE_KIND) or len(descriptor) != layout.size:
            raise GpucollError(f"rank {source} sent a malformed GPU message envelope ({len(descriptor)} bytes, "
                               f"kind {kind!r})")
        fields = layout.unpack(descriptor)
        _, handle, offset, nbytes, seq = fields[:5]
        if (kind == SMALL_KIND and nbytes > SLOT_MAX) or offset % STRIDE or offset >= SLOTS * STRIDE:
            raise GpucollError(f"rank {source} sent a GPU message envelope outside its outbox (offset {offset}, "
                               f"{nbytes} bytes)")
        slot = self._map(handle, source) + offset
        data = self._map(fields[5], source) + fields[6] if kind == LARGE_KIND else slot + SLOT_HEADER
        return kind, slot, data, nbytes, seq

    @staticmethod
    def get(slot, nbytes, seq, source, addr, capacity):
        """The entry that reads a small message into capacity bytes at addr (nothing copied when
        it does not fit: the slot is freed all the same)."""
        return (addr, slot, nbytes, nbytes if nbytes <= capacity else 0, seq, source, GET)

    @staticmethod
    def steps(slot, seq, source, mode):
        """An entry of the words alone (a large message's WAIT_READY, SET_FREE)."""
        return (0, slot, 0, 0, seq, source, mode)

    def launch(self, entries, stream):
        """Every entry in one launch (or a few: at most MAXMSGS messages each) on stream."""
        try:
            self._launch_all(cuda, entries, stream)
        except cuda.DeviceTimeout as exc:
            self.check()
            if exc.released:  # refused: every wait released (a revoke), nothing recorded
                raise self._released_error(exc.peer) from None
            raise

    def _launch_all(self, cuda, entries, stream):
        for i in range(0, len(entries), cuda.MAXMSGS):
            self.launcher.launch_msgs(self.fn, SLOT_BLOCKS, THREADS, stream, entries[i:i + cuda.MAXMSGS], SLOTS)

    def settle(self):
        """Wait until every message put in these outboxes was read, or its wait gave up (at most
        GPUCOLL_TIMEOUT, recorded as a timeout): receivers read them from this process's memory,
        which Free and exit take away."""
        cuda.set_current(self.ctx)
        # a slot holds the latest of the messages numbered into it: the last SLOTS per destination
        entries = [self.steps(base + (seq % SLOTS) * STRIDE, seq, dest, WAIT_FREE)
                   for dest, (base, _) in self._boxes.items()
                   for seq in range(max(0, self._sent[dest] - SLOTS), self._sent[dest])]
        stream = cuda.stream_create() if entries else None
        try:
            if entries:
                self._launch_all(cuda, entries, stream)
        except cuda.DeviceTimeout:
            pass  # a kernel already gave up: timeout() says on whom
        cuda.ctx_synchronize()  # no slot kernel of ours still runs
        if stream is not None:
            cuda.stream_destroy(stream)

    def check(self):
        """Raise the timeout a slot kernel recorded, if any."""
        error = self.timeout()
        if error is not None:
            self.heard = True
            raise error

    def timeout(self):
        """The gpucoll.TimeoutError for the timeout a slot kernel recorded, or None."""
        word = self.launcher.error_word() if self.launcher is not None else 0
        if not word:
            return None
        peer = (word & ~cuda.RELEASED) - 1
        if word & cuda.RELEASED:
            return self._released_error(peer)
        return GpucollTimeout(
            f"point to point on GPU (communicator {self.name}): a GPU message to or from rank {peer} waited "
            f"more than {config.TIMEOUT.get():g} s (GPUCOLL_TIMEOUT) on the device; rank {peer} fell behind "
            f"by more than {SLOTS} small messages or stopped, and this communicator's GPU point to point "
            "cannot go on")

    def _released_error(self, peer):
        where = f"point to point on GPU (communicator {self.name})"
        if peer in self.lost:
            return ProcFailedError(f"{where}: rank {peer} failed (the process ended) while a GPU message to or "
                                   "from it waited on the device; its wait was released", ranks=[peer])
        if self.lost and not self.revoked:  # a rank above 62 whose bit it shares (peer % 63)
            lost = sorted(self.lost)
            return ProcFailedError(f"{where}: rank(s) {lost} failed (the process ended); the wait of a GPU "
                                   f"message with rank {peer} was released with theirs", ranks=lost)
        return RevokedError(f"{where}: the communicator was revoked while a GPU message to or from rank {peer} "
                            "waited on the device; its wait was released")

    def close(self):
        """Release the outboxes once no slot kernel of ours runs; raises the timeout one of them
        recorded (after releasing), so Free does not drop it. What this process mapped of
        ranks that ended is unmapped."""
        if self.launcher is None:
            return
        process_watch.unwatch(self._watch)
        self.settle()
        error = self.timeout()
        if self.lost:
            ipc.close_from({self._pid_of[r] for r in self.lost})
        with self._lock:
            self.launcher.set_team(self.ctx, [], [], 0, 0, 0, 0, 0)  # forget the error word first
            self.launcher = None
        _open.discard(self)
        for base, _ in self._boxes.values():
            try:
                cuda.mem_free(base)
            except GpucollError:
                pass
        self._boxes = {}
        cuda.free_host(self.err_host)
        if error is not None:
            raise error


def settle_at_exit():
    """At exit: waits until the messages of every open outbox were read (their receivers read
    this process's memory, gone with it), then returns the timeouts slot kernels recorded that
    nothing raised to the program."""
    opened = [out for out in list(_open) if out.launcher is not None]
    for out in opened:
        out.settle()
    return [error for error in (out.timeout() for out in opened if not out.heard) if error is not None]
