"""The IPC memory of one communicator's GPU ranks, set up once and mapped by every rank.

Each rank allocates one block (cuMemAlloc): flags that peers write, a local sync word,
and staging slots that peers push into (layout in gpucoll/kernels/coll.cu). The ranks
exchange the block's IPC handle with the communicator's own object allgather and open each
other's blocks once. A word of pinned host memory, mapped for the device, is where a kernel
that gives up waiting for a peer (GPUCOLL_TIMEOUT) records which; the host reads it without
synchronising (gpucoll/engines/gpu/engine.py raises it as gpucoll.TimeoutError); the next word
is the abort word, which the host sets when a peer's process ends (gpucoll/transports/
process_watch.py tells the team from a thread of its own) or the communicator is revoked: every
kernel still waiting then returns within microseconds, and no later launch starts. Caller buffers
of the "registered" algorithms are registered per call (their IPC handles exchanged by the GPU
engine; every peer allocation is opened once, in the process's cache of
gpucoll/engines/gpu/ipc.py).
"""
import threading

from ..._native import cuda
from ...base import config, log
from ...base.errors import GpucollError
from ...transports import process_watch
from . import ipc

MAXR = 8
MAXB = 256
FLAGS_BYTES = MAXR * MAXB * 8
SYNC_OFFSET = FLAGS_BYTES
STAGE_OFFSET = FLAGS_BYTES + 4096
ALIGN = 256


def _round_up(n, a):
    return (n + a - 1) // a * a


class Team:
    """GPU resources of a communicator. `ok` is False when the ranks cannot use P2P/IPC
    (then `reason` says why and the dispatcher stages through host memory)."""

    def __init__(self, view, device):
        self.view, self.device = view, device
        self.rank, self.size = view.rank, view.size
        self.ctx = cuda.primary_context(device)
        sm_count = cuda.device_attribute(device, 16)
        self.arch = cuda.device_attribute(device, 75) * 10 + cuda.device_attribute(device, 76)
        self.base = 0
        self.peers_mapped = []
        self.launcher = None
        self.err_host = 0
        self.lost = []          # ranks whose process ended while the team was up
        self.revoked = False
        self._watch = None
        self._abort_lock = threading.Lock()  # the watcher thread's abort() against close()
        self.ok, self.reason = True, ""
        self.links = {}
        if self.size > MAXR:
            self.ok, self.reason = False, f"more than {MAXR} ranks"

        devices = view.exchange((device, cuda.pci_bus_id(device), sm_count))
        self.devices = [d for d, _, _ in devices]
        # Kernels on registered buffers run one block per SM; every rank must launch the same
        # grid (block b waits for the peers' block b), so the team's smallest GPU sets it.
        self.sms = min(sms for _, _, sms in devices)
        if self.rank == 0 and view.local_size == view.size:
            _warn_idle_gpus(view.name, devices, cuda.device_count())
        if view.local_size != view.size:
            mine_ok, why = False, "ranks on other hosts"  # CUDA IPC stops at the host
        elif config.P2P_DISABLE.get():
            mine_ok, why = False, "GPUCOLL_P2P_DISABLE=1"
        elif len({bus for _, bus, _ in devices}) != self.size and not config.GPU_SHARED_IPC.get():
            mine_ok, why = False, "several ranks share a GPU (GPUCOLL_GPU_SHARED_IPC=1 uses IPC anyway)"
        else:
            bad = [d for d, _, _ in devices if d != device and not cuda.can_access_peer(device, d)]
            mine_ok, why = not bad, f"no P2P access from GPU {device} to GPU(s) {bad}"
        oneshot = config.GPU_ONESHOT_MAX.get() or 0
        stage_max = config.GPU_STAGE_MAX.get()
        self.stage_max = stage_max
        self.slot = _round_up(max(oneshot, -(-stage_max // self.size), 4096), ALIGN)
        total = STAGE_OFFSET + 4 * self.size * self.slot
        handle = b""
        if mine_ok and self.ok:
            self.base = cuda.mem_alloc(total)
            cuda.memset_d8(self.base, 0, STAGE_OFFSET)
            cuda.stream_synchronize(0)
            handle = cuda.ipc_get_mem_handle(self.base)
        table = view.exchange((mine_ok and self.ok, why, handle))
        failed = [(r, w) for r, (ok, w, _) in enumerate(table) if not ok]
        if failed:
            self.ok = False
            self.reason = "; ".join(f"rank {r}: {w}" for r, w in failed)
            self.close()
            log.info("INIT", "GPU collectives on communicator %s stage through host memory (%s)",
                     view.name, self.reason)
            return
        stage, flags = [], []
        for r, (_, _, h) in enumerate(table):
            ptr = self.base if r == self.rank else cuda.ipc_open_mem_handle(h)
            if r != self.rank:
                self.peers_mapped.append(ptr)
            stage.append(ptr + STAGE_OFFSET)
            flags.append(ptr)
        self.launcher = cuda.Launcher()
        timeout_ns = int(config.TIMEOUT.get() * 1e9)
        self.err_host, err_dev = cuda.host_alloc_mapped(64)
        self.launcher.set_team(self.ctx, stage, flags, self.base + SYNC_OFFSET, self.slot, self.rank, self.size,
                               timeout_ns, self.err_host, err_dev)
        view.exchange(None)  # every rank mapped every block before anyone signals
        self._pids = {view.ctx.watch_pid(w): r for r, w in enumerate(view.world_ranks) if r != self.rank}
        self._watch = process_watch.watch(self._pids, self._peer_ended)
        if log.enabled("info", "INIT"):
            log.info("INIT", "GPU team on communicator %s: rank %d GPU %d, peers %s via P2P/IPC (%s), "
                     "%d B of IPC memory, staging slot %d B", view.name, self.rank, device,
                     self.devices, self.link_summary(), total, self.slot)

    def link_summary(self):
        from ...transports import gpu_topology as topology

        try:
            table = topology.links()
        except Exception:
            table = {}
        kinds = set()
        for d in self.devices:
            if d != self.device:
                link = table.get((self.device, d), "")
                kinds.add("NVLink" if link.startswith("NV") else (link or "P2P"))
        return ",".join(sorted(kinds)) or "-"

    def _peer_ended(self, pid):
        """(The watcher thread.) A collective needs every rank: release every wait."""
        self.lost.append(self._pids[pid])
        self.abort()

    def abort(self, revoked=False):
        """Release the kernels that wait and refuse later launches (any thread)."""
        with self._abort_lock:
            if revoked:
                self.revoked = True
            if self.launcher is not None:
                self.launcher.abort(cuda.ABORT_ALL)

    def aborted(self):
        return self.launcher is not None and self.launcher.abort_word() != 0

    def error_word(self):
        """Non-zero once a kernel gave up waiting for a peer: (seq << 8) | (1 + the peer's rank)."""
        return self.launcher.error_word() if self.launcher is not None else 0

    def close(self):
        if self.base:
            cuda.set_current(self.ctx)
        if self._watch is not None:
            process_watch.unwatch(self._watch)
            self._watch = None
        if self.lost:  # the registered buffers of ranks that ended (their blocks are below)
            ipc.close_from({pid for pid, r in self._pids.items() if r in self.lost})
        for ptr in self.peers_mapped:
            try:
                cuda.ipc_close_mem_handle(ptr)
            except GpucollError:
                pass
        self.peers_mapped = []
        with self._abort_lock:
            if self.launcher is not None:
                self.launcher.set_team(self.ctx, [], [], 0, 0, self.rank, 0, 0)  # forget the error word first
                self.launcher = None
        if self.err_host:
            try:
                cuda.free_host(self.err_host)
            except GpucollError:
                pass
            self.err_host = 0
        if self.base:
            try:
                cuda.mem_free(self.base)
            except GpucollError:
                pass
            self.base = 0


def _warn_idle_gpus(name, devices, visible):
    """Ranks on one GPU while others sit idle is what a script that never selects a device
    gets (its buffers all land on the current device, GPU 0): correct, but slow. Say it once."""
    buses = [bus for _, bus, _ in devices]
    shared = len(set(buses)) < len(buses)
    if shared and len(set(buses)) < visible:
        log.warn("INIT", "communicator %s: its %d ranks put their GPU buffers on %d of this host's %d GPUs (GPUs %s), "
                 "so ranks share a GPU and others stay idle; for one GPU per rank, select it before allocating, "
                 "e.g. cupy.cuda.Device(view.local_rank %% %d).use() or torch.cuda.set_device(...)",
                 name, len(devices), len(set(buses)), visible, sorted({d for d, _, _ in devices}), visible)
