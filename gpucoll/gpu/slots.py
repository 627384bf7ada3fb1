"""Small GPU messages between processes of one host: outboxes in GPU memory, flags on the device.

A message of up to SLOT_MAX bytes to another process of this host goes GPU to GPU with no host
copy and no handshake. The sender owns one outbox per destination (a cuMemAlloc block, made on
the first message to it): SLOTS slots of a header (ready and free words, one per kernel block)
and SLOT_MAX bytes. Message n of the pair (numbered by the sender) uses slot n % SLOTS:

* put (the sender, in its stream's order): the p2p_slots kernel waits until the slot's previous
  message was read out, copies the caller's bytes in and raises the slot's ready words to n + 1;
  the host then sends the receiver an envelope (an OFFER-flagged message: DESCRIPTOR) through
  the host engine, which does the matching (source, tag, ANY_SOURCE, order between a pair).
* get (the receiver, once the envelope matched a receive): the kernel waits for the ready words,
  copies the bytes out of the sender's outbox over P2P (the outbox is mapped once per sender,
  gpucoll/gpu/ipc.py) and raises the slot's free words to n + 1, in the sender's memory.

Both sides are one kernel launch on the caller's stream, and every message of a `comm.group()`
block rides in one launch. A sender that runs SLOTS messages ahead of its receiver makes its
stream wait on the device (as NCCL's sends do); a kernel that waits longer than GPUCOLL_TIMEOUT
gives up and records the peer in a mapped host word, raised as gpucoll.TimeoutError by the next
point-to-point call of the communicator or by a receive's Wait. Layout in gpucoll/kernels/coll.cu.
"""
import collections
import struct
import threading

from .. import config
from ..errors import GpucollError
from ..errors import TimeoutError as GpucollTimeout
from . import ipc
from .kernels import Kernels

SLOTS = 32
SLOT_BLOCKS = 4        # blocks per message (coll.cu: SLOT_BLOCKS)
SLOT_HEADER = 256      # ready words, free words (coll.cu: SLOT_HEADER)
SLOT_MAX = 64 << 10    # the largest message that goes through a slot
STRIDE = SLOT_HEADER + SLOT_MAX
THREADS = 256
KIND = b"S"            # first byte of a DESCRIPTOR (an offer's is gpucoll.p2p.OFFER_KIND)
# kind, the outbox's IPC handle, the slot's offset in it, bytes, message number
DESCRIPTOR = struct.Struct("!c64sQQQ")

_kernels = {}  # arch -> Kernels, shared by every communicator of the process
_kernels_lock = threading.Lock()


def _cuda():
    from .._native import cuda

    return cuda


def kernels(arch):
    with _kernels_lock:
        k = _kernels.get(arch)
        if k is None:
            k = _kernels[arch] = Kernels(arch)
        return k


class Outboxes:
    """One device's outboxes and slot kernel launches for one communicator's point to point."""

    def __init__(self, device, ctx, name):
        cuda = _cuda()
        self.device, self.ctx, self.name = device, ctx, name
        arch = cuda.device_attribute(device, 75) * 10 + cuda.device_attribute(device, 76)
        self.fn = kernels(arch).copy()["p2p_slots"]
        self.err_host, err_dev = cuda.host_alloc_mapped(64)
        self.launcher = cuda.Launcher()
        self.launcher.set_team(ctx, [], [], 0, 0, 0, 0, int(config.TIMEOUT.get() * 1e9), self.err_host, err_dev)
        self._boxes = {}  # destination rank -> (base, IPC handle)
        self._sent = collections.Counter()  # destination rank -> messages numbered so far
        self._lock = threading.Lock()

    def _box(self, dest):
        box = self._boxes.get(dest)
        if box is None:
            cuda = _cuda()
            cuda.set_current(self.ctx)
            base = cuda.mem_alloc(SLOTS * STRIDE)
            try:
                for i in range(SLOTS):
                    cuda.memset_d8(base + i * STRIDE, 0, SLOT_HEADER)
                cuda.ctx_synchronize()
                box = (base, cuda.ipc_get_mem_handle(base))
            except BaseException:
                cuda.mem_free(base)
                raise
            self._boxes[dest] = box
        return box

    def put(self, addr, nbytes, dest):
        """A message of nbytes at addr to rank dest: (launch entry, envelope bytes)."""
        with self._lock:
            base, handle = self._box(dest)
            seq = self._sent[dest]
            self._sent[dest] = seq + 1
        offset = (seq % SLOTS) * STRIDE
        entry = (addr, base + offset, nbytes, nbytes, seq, dest, 1)
        return entry, DESCRIPTOR.pack(KIND, handle, offset, nbytes, seq)

    def get(self, descriptor, source, addr, capacity):
        """The launch entry that reads the message a DESCRIPTOR announced into capacity bytes at
        addr (nothing copied when it does not fit: the slot is freed all the same), and its size."""
        if len(descriptor) != DESCRIPTOR.size:
            raise GpucollError(f"rank {source} sent a malformed GPU message envelope ({len(descriptor)} bytes "
                               f"instead of {DESCRIPTOR.size})")
        _, handle, offset, nbytes, seq = DESCRIPTOR.unpack(descriptor)
        if nbytes > SLOT_MAX or offset % STRIDE or offset >= SLOTS * STRIDE:
            raise GpucollError(f"rank {source} sent a GPU message envelope outside its outbox (offset {offset}, "
                               f"{nbytes} bytes)")
        _cuda().set_current(self.ctx)
        try:
            base = ipc.open_memory(handle)
        except GpucollError as exc:
            raise GpucollError(f"cannot map rank {source}'s GPU memory to receive its message ({exc}); set "
                               "GPUCOLL_P2P_DISABLE=1 on every rank to send GPU messages through host memory") from None
        copy = nbytes if nbytes <= capacity else 0
        return (addr, base + offset, nbytes, copy, seq, source, 0), nbytes

    def launch(self, entries, stream):
        """Every entry in one launch (or a few: at most MAXMSGS messages each) on stream."""
        cuda = _cuda()
        try:
            for i in range(0, len(entries), cuda.MAXMSGS):
                self.launcher.launch_msgs(self.fn, SLOT_BLOCKS, THREADS, stream, entries[i:i + cuda.MAXMSGS], SLOTS)
        except cuda.DeviceTimeout:
            self.check()
            raise

    def check(self):
        """Raise the timeout a slot kernel recorded, if any."""
        word = self.launcher.error_word() if self.launcher is not None else 0
        if word:
            peer = word - 1
            raise GpucollTimeout(
                f"point to point on GPU (communicator {self.name}): a GPU message to or from rank {peer} waited "
                f"more than {config.TIMEOUT.get():g} s (GPUCOLL_TIMEOUT) on the device; rank {peer} fell behind "
                f"by more than {SLOTS} small messages or stopped, and this communicator's GPU point to point "
                "cannot go on")

    def close(self):
        cuda = _cuda()
        if self.launcher is None:
            return
        cuda.set_current(self.ctx)
        cuda.ctx_synchronize()  # no slot kernel of ours still runs
        self.launcher.set_team(self.ctx, [], [], 0, 0, 0, 0, 0)  # forget the error word first
        self.launcher = None
        for base, _ in self._boxes.values():
            try:
                cuda.mem_free(base)
            except GpucollError:
                pass
        self._boxes = {}
        cuda.free_host(self.err_host)
