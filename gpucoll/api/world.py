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

from ..base import config, log, stacks
from ..base.errors import InvalidUsageError
from ..bootstrap import connect


class Context:
    """What every communicator of this process shares.

    World ranks number every process of the job: the ranks gpurun started first (COMM_WORLD of
    each of them), then the processes that MPI's Spawn started, each spawn's block after the
    last (gpucoll/mpi/spawn.py). `rank` is this process's world rank, `world_ranks` its
    COMM_WORLD's, `size` one more than the highest world rank it knows of; what it knows of
    another process (pid, host, TCP address) sits in lists indexed by world rank, None where
    it knows nothing yet (learn() adds processes)."""

    def __init__(self, boot):
        self.boot = boot
        self.job_id = boot.job_id
        spawn = getattr(boot.info, "spawn", None)
        replaces = getattr(boot.info, "replaces", None)
        base = spawn[1] if spawn else replaces[1] if replaces else 0
        self.rank, self.size = base + boot.rank, base + boot.size
        self.world_ranks = range(base, base + boot.size)
        self.secret = boot.info.secret or _fresh_secret(boot)
        self.interface = _listen_interface(boot)
        self._tcp = None
        self._ofi = None
        self._ofi_lock = threading.Lock()   # the listener's threads may ask for it too
        self._learn_lock = threading.Lock()
        self.pidns = _pid_namespace()
        mine = {"pid": os.getpid(), "pidns": self.pidns, "host": boot.host}
        if self.size > 1:
            mine["tcp"] = self.tcp().address
            from ..transports import ofi

            ofi.serve(self.tcp(), self.ofi)  # a peer may meet an OFI channel before this rank needs one
        table = [json.loads(b) for b in boot.allgather(json.dumps(mine).encode())]
        for entry, host in zip(table, boot.hosts):
            entry["host"] = host  # the bootstrap's label (host_identity): machines of one name told apart
        self.entries = {}
        self.pids, self.hosts, self.tcp_addresses, self._watchable = [], [], [], []
        self._record(dict(zip(self.world_ranks, table)))
        self.spawn = spawn            # (spawn number, first world rank) in a spawned process, else None
        self.spawn_parents = None     # there: the world ranks of the parents
        if spawn:
            from ..bootstrap import spawns

            self.spawn_parents, parents = spawns.join(boot.store, spawn[0], boot.rank, self.rank,
                                                      self.entries[self.rank], config.INIT_TIMEOUT.get())
            self._record(parents)  # before any parent is reached
        self.replaces = replaces[0] if replaces else None  # the failed world rank this process replaces
        if replaces:  # the survivors' grow() looks this process up (fault.py)
            from ..bootstrap import spawns

            spawns.announce(boot.store, self.rank, self.entries[self.rank])
        from ..engines.p2p.host import ProcessP2P

        self.p2p = ProcessP2P(self)  # point to point of every communicator (after the table: links need it)

    def _record(self, entries):
        """Note what `entries` ({world rank: {pid, pidns, tcp, host}}) says; the new world ranks."""
        new = [w for w in sorted(entries) if w not in self.entries]
        if not new:
            return new
        self.size = max(self.size, new[-1] + 1)
        for table in (self.pids, self.hosts, self.tcp_addresses, self._watchable):
            table.extend([None] * (self.size - len(table)))
        me = self.hosts[self.rank] if self.rank < len(self.hosts) and self.hosts[self.rank] else self.boot.host
        for w in new:
            e = self.entries[w] = entries[w]
            self.pids[w], self.hosts[w], self.tcp_addresses[w] = e["pid"], e["host"], e.get("tcp")
            # A pid says whether a process lives only on its host and in its pid namespace.
            self._watchable[w] = e.get("pidns") == self.pidns != 0 and e["host"] == me
        return new

    def reachable(self):
        """This process's entry, with a TCP address that takes announcements (a job of one
        process listens only once it spawns others)."""
        entry = self.entries[self.rank]
        if entry.get("tcp") is None:
            from ..transports import ofi

            entry["tcp"] = self.tcp_addresses[self.rank] = self.tcp().address
            ofi.serve(self.tcp(), self.ofi)
            self.p2p.links.serve()
        return entry

    def look_up(self, world_rank):
        """Learn world rank `world_rank`, a process spawned after this one joined, from the store
        (on a connection of its own: the listener's threads call this)."""
        from ..bootstrap import spawns
        from ..bootstrap.store import StoreClient

        info = self.boot.info
        if getattr(self.boot, "store", None) is None:
            raise InvalidUsageError(f"world rank {world_rank} is not a process of this job")
        timeout = config.INIT_TIMEOUT.get()
        with StoreClient(info.store_host, info.store_port, info.secret, timeout=timeout,
                         connect_timeout=timeout) as store:
            self.learn({world_rank: spawns.look_up(store, world_rank, timeout)})

    def learn(self, entries):
        """Processes started after this one joined (MPI's Spawn): {world rank: entry}."""
        with self._learn_lock:
            new = self._record(entries)
            if new:
                self.p2p.add_peers(new)

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
            stacks.install()  # under gpurun: a rank that hangs can show where (docs/launcher.md)
            bad = config.check_all()
            if bad:
                log.warn("ENV", "unknown variable(s) %s: nothing reads them (a typo?)", ", ".join(bad))
            from .comm import Communicator

            started = time.monotonic()
            ctx = Context(connect())
            spawn = getattr(ctx.boot.info, "spawn", None)
            name = f"spawn{spawn[0]}" if spawn else f"replace{ctx.rank}" if ctx.replaces is not None else "world"
            _world = Communicator(ctx, name, ctx.world_ranks)
            store = getattr(ctx.boot, "store", None)
            log.info("BOOTSTRAP", "COMM_WORLD ready in %.1f ms after %d store request(s)",
                     (time.monotonic() - started) * 1e3, store.requests if store is not None else 0)
            _owner_pid = os.getpid()
            atexit.register(_finalize)
            if config.ON_FAILURE.get() == "continue":  # revocations must reach ranks that never ask
                from .fault import start_watcher

                start_watcher(ctx)
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


_parent = []  # the communicator parent() made


def parent():
    """In a process that a spawn started (Communicator.spawn, MPI's Spawn): the communicator of
    its parents, then the spawned processes, the one the parents' spawn returned; None elsewhere."""
    from .comm import Communicator
    from .spawning import merged_name

    ctx = init().seam.context
    if ctx.spawn is None:
        return None
    if not _parent:
        _parent.append(Communicator(ctx, merged_name(ctx.spawn[0]), tuple(ctx.spawn_parents) + tuple(ctx.world_ranks)))
    return _parent[0]


def replaces():
    """In a process that gpurun --respawn started: the world rank of the failed rank it replaces
    (call rejoin() to take its place); None elsewhere."""
    return init().seam.context.replaces


def rejoin():
    """In a replacement (replaces() is not None): the communicator that the survivors' grow()
    makes, with this process at the failed rank's number (collective with their grow();
    gpucoll/api/fault.py)."""
    from ..bootstrap import failures
    from .comm import Communicator
    from .fault import announced_entry, start_watcher

    ctx = init().seam.context
    if ctx.replaces is None:
        raise InvalidUsageError("rejoin(): this process is not a replacement (gpucoll.replaces() is None); "
                                "ranks that survived a failure call grow() on their communicator")
    start_watcher(ctx)
    store, timeout = ctx.boot.store, config.TIMEOUT.get()
    key = failures.grown_key(ctx.rank)
    record = failures.record(key, store.get(key, timeout=timeout), "grown")
    members = record["members"]
    entries = {int(w): e for w, e in record["entries"].items()}
    for i, w in enumerate(members):  # the other replacements of the same grow
        if w != ctx.rank and w not in entries:
            entries[w] = announced_entry(store, w, i, timeout)
    ctx.learn({w: e for w, e in entries.items() if w != ctx.rank})
    return Communicator(ctx, record["comm"], members)


def world():
    if _world is None:
        raise InvalidUsageError("gpucoll is not initialised: call gpucoll.init() or use gpucoll.COMM_WORLD")
    return _world
