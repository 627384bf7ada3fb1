"""The process-wide context and COMM_WORLD.

`init()` runs the bootstrap once, exchanges what every rank needs to reach every
other (host, pid, point-to-point and transport addresses) and builds COMM_WORLD.
The one listener of the process (the TCP endpoint, which also takes the announcements of
point-to-point channels) binds to loopback when every rank is on this host, else to the
interface that GPUCOLL_SOCKET_IFNAME selects or the one that reaches the store; only peers
that prove the job's secret get through it.
"""
import atexit
import json
import os
import sys
import threading
import time

from ..base import config, log
from ..base.errors import InvalidUsageError
from ..bootstrap import connect


class Context:
    """What every communicator of this process shares."""

    def __init__(self, boot):
        self.boot = boot
        self.rank, self.size, self.job_id = boot.rank, boot.size, boot.job_id
        self.secret = boot.info.secret or _fresh_secret(boot)
        self.hosts = boot.hosts
        self.interface = _listen_interface(boot)
        self._tcp = None
        self._ofi = None
        self._ofi_lock = threading.Lock()   # the listener's threads may ask for it too
        mine = {"pid": os.getpid(), "pidns": _pid_namespace()}
        if self.size > 1:
            mine["tcp"] = self.tcp().address
            from ..transports import ofi

            ofi.serve(self.tcp(), self.ofi)  # a peer may meet an OFI channel before this rank needs one
        table = [json.loads(b) for b in boot.allgather(json.dumps(mine).encode())]
        self.pids = [t["pid"] for t in table]
        # A pid says whether a process lives only on its host and in its pid namespace.
        self._watchable = [t.get("pidns") == mine["pidns"] != 0 and h == self.hosts[self.rank]
                           for t, h in zip(table, self.hosts)]
        self.tcp_addresses = [t.get("tcp") for t in table]
        from ..engines.p2p.host import ProcessP2P

        self.p2p = ProcessP2P(self)  # point to point of every communicator (after the table: links need it)

    def watch_pid(self, world_rank):
        """The pid of `world_rank` when this process can tell whether it lives (same host, same
        pid namespace), else 0."""
        return self.pids[world_rank] if self._watchable[world_rank] else 0

    def has_ended(self, world_rank):
        """True once the process of `world_rank` is known to be gone (only a process that
        watch_pid can see; of the others nothing is known here)."""
        from ..transports.shm import pid_alive

        pid = self.watch_pid(world_rank)
        return bool(pid) and not pid_alive(pid)

    def tcp(self):
        """This process's TCP endpoint (listening from start-up, so peers can reach it)."""
        if self._tcp is None:
            from ..transports.tcp import TcpEndpoint

            self._tcp = TcpEndpoint(self.rank, self.secret, interface=self.interface)
        return self._tcp

    def ofi(self):
        """This process's OFI endpoint (libfabric), opened when a first channel between hosts needs it."""
        with self._ofi_lock:
            if self._ofi is None:
                from ..transports.net import between_hosts
                from ..transports.ofi import OfiEndpoint

                self._ofi = OfiEndpoint(self.tcp(), between_hosts().provider, self.interface)
            return self._ofi


def _pid_namespace():
    """The inode of this process's pid namespace (0 when unknown)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _fresh_secret(boot):
    """The secret of a job whose launcher hands out none (MPI, a singleton): rank 0 draws
    one and the bootstrap's own exchange (MPI's, for mpiexec) gives it to the others."""
    mine = os.urandom(16) if boot.rank == 0 else b""
    return boot.allgather(mine)[0]


def _listen_interface(boot):
    """Loopback when every rank runs on this host, else the chosen interface."""
    from ..transports import ifaces

    single_host = len(set(boot.hosts)) == 1
    return ifaces.listen_interface(single_host, getattr(boot.info, "store_host", None))


_lock = threading.Lock()
_world = None
_owner_pid = None  # the process that made _world (a forked child inherits it, not its job)


def init():
    """Join the job (idempotent) and return COMM_WORLD."""
    global _world, _owner_pid
    with _lock:
        if _world is None:
            bad = config.check_all()
            if bad:
                log.warn("ENV", "unknown variable(s) %s: nothing reads them (a typo?)", ", ".join(bad))
            from .comm import Communicator

            started = time.monotonic()
            ctx = Context(connect())
            _world = Communicator(ctx, "world", range(ctx.size))
            store = getattr(ctx.boot, "store", None)
            log.info("BOOTSTRAP", "COMM_WORLD ready in %.1f ms after %d store request(s)",
                     (time.monotonic() - started) * 1e3, store.requests if store is not None else 0)
            _owner_pid = os.getpid()
            atexit.register(_finalize)
        return _world


def initialized():
    return _world is not None


def _finalize():
    """At exit: GPU messages still on the device are read or time out (and a timeout nothing
    raised is reported); rank 0 of a job whose store lives in rank 0 waits until the others are
    done with it, so no rank loses the store while still shutting down."""
    world = _world
    if world is None or _owner_pid != os.getpid():  # a forked child: the job's store is the parent's
        return
    _settle_gpu_messages()
    boot = world.seam.context.boot
    if not getattr(boot, "info", None) or not boot.info.host_store or world.size == 1:
        return
    try:
        if boot.store.add("gpucoll/finished", 1) >= world.size:
            boot.store.set("gpucoll/all-finished", b"1")
        if boot._server is not None:
            boot.store.wait(["gpucoll/all-finished"], timeout=30)
    except Exception:  # the job is ending anyway; never turn exit into a hang or a traceback
        pass


def _settle_gpu_messages():
    slots = sys.modules.get("gpucoll.engines.p2p.outboxes")  # loaded only where GPU point to point ran
    if slots is None:
        return
    try:
        for error in slots.settle_at_exit():
            log.warn("P2P", "at exit: %s (no call of the communicator raised it before the program ended)", error)
    except Exception as exc:  # the CUDA context may already be torn down; exit must go on
        log.warn("P2P", "at exit: could not wait for GPU point-to-point messages on the device: %s", exc)


def world():
    if _world is None:
        raise InvalidUsageError("gpucoll is not initialised: call gpucoll.init() or use gpucoll.COMM_WORLD")
    return _world
