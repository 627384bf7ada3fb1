"""The bootstrap: rank, size, local rank and host, plus a small allgather and barrier.

Three exchanges behind one interface: the TCP store (gpurun, Slurm, torchrun-style),
mpi4py (MPI launchers), and the trivial one of a singleton. They only carry start-up
traffic (host names, addresses); collectives run over the transports.
"""
import os
import socket
import sys
import time

from ..base import config, log
from ..base.errors import BootstrapError, StoreError
from ..base.errors import TimeoutError as GpucollTimeout
from ..base.ranks import ranges
from ..transports.ifaces import server_address
from .detect import LaunchInfo, detect
from .host_identity import host_labels, machine_key


class Bootstrap:
    """Base: identity of this rank and the exchange primitives.

    After `connect()`, `rank`, `size`, `local_rank`, `local_size`, `host` and `hosts`
    (the host of every rank: its name, told apart from other machines of that name by
    host_identity) are known."""

    method = "none"

    def __init__(self, info: LaunchInfo):
        self.info = info
        self.rank = info.rank
        self.size = info.size
        self.job_id = info.job_id
        self.host = _host_name(info.rank)
        self.hosts = None
        self.local_rank = info.local_rank
        self.local_size = info.local_size
        self.store = None

    def allgather(self, data: bytes):
        """Every rank's bytes, in rank order."""
        raise NotImplementedError

    def barrier(self):
        self.allgather(b"")

    def close(self):
        pass

    def _learn_hosts(self):
        """One exchange of host names and machine keys; local rank/size follow unless the launcher said."""
        mine = f"{self.host}\n{machine_key()}".encode()
        identities = [tuple(b.decode().split("\n", 1)) for b in self.allgather(mine)]
        self.hosts = host_labels(identities)
        if self.hosts[self.rank] != self.host:
            log.info("BOOTSTRAP", "other machines (boot id or namespaces differ) are also named %s: this one "
                     "counts as host %s", self.host, self.hosts[self.rank])
        self.host = self.hosts[self.rank]
        same = [r for r, h in enumerate(self.hosts) if h == self.host]
        local_rank, local_size = same.index(self.rank), len(same)
        if self.local_rank is None:
            self.local_rank = local_rank
        if self.local_size is None:
            self.local_size = local_size
        if (self.local_rank, self.local_size) != (local_rank, local_size) and not config.TEST_HOST.get():
            log.warn("BOOTSTRAP", "launcher says local rank %s of %s, host names say %d of %d; using %d of %d",
                     self.local_rank, self.local_size, local_rank, local_size, local_rank, local_size)
            self.local_rank, self.local_size = local_rank, local_size


def _host_name(rank):
    """This rank's host name; GPUCOLL_TEST_HOST makes ranks of one machine act as other hosts."""
    pretend = config.TEST_HOST.get()
    if pretend:
        return pretend.replace("%r", str(rank))
    return socket.gethostname()


class SingletonBootstrap(Bootstrap):
    method = "singleton"

    def allgather(self, data):
        return [bytes(data)]


class MpiBootstrap(Bootstrap):
    """Exchange through mpi4py's COMM_WORLD; used only at start-up."""

    method = "mpi"

    def __init__(self, info):
        from mpi4py import MPI

        self._comm = MPI.COMM_WORLD
        info.rank, info.size = self._comm.Get_rank(), self._comm.Get_size()
        super().__init__(info)
        if self.size > 1:
            _abort_job_on_uncaught_exception(self._comm)

    def allgather(self, data):
        return [bytes(d) for d in self._comm.allgather(bytes(data))]

    def barrier(self):
        self._comm.Barrier()


def _abort_job_on_uncaught_exception(comm):
    """Make an exception that ends this rank end the whole MPI job, as `python -m mpi4py` does.

    Under mpiexec, a rank whose script raises goes on to MPI_Finalize at exit, which waits for
    the other ranks: it neither exits nor dies, so the others, blocked in a collective with it,
    would only give up at GPUCOLL_TIMEOUT. This sys.excepthook lets the hook in place (the
    default one prints the traceback) do its work first, then calls MPI_Abort, after which
    the launcher stops every rank and exits non-zero. Only the main thread's uncaught
    exceptions end a Python process, so threading.excepthook is left alone: a worker thread
    that dies does not end its rank, and must not end the job."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        try:
            previous(kind, value, tb)
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                comm.Abort(1)

    sys.excepthook = hook


class StoreBootstrap(Bootstrap):
    """Exchange through the TCP rendezvous store.

    allgather: every rank sets `ag/<seq>/<rank>` and gathers `ag/<seq>/` (the store answers
    once every rank's key is there): two requests per rank whatever the size, and no rank
    reads the others' keys one by one."""

    def __init__(self, info):
        super().__init__(info)
        self.method = info.method
        self._timeout = config.INIT_TIMEOUT.get()
        self._seq = 0
        self._server = None
        # The processes of a spawn (MPI's Spawn) join their own COMM_WORLD under keys of their own.
        self._ns = f"spawn/{info.spawn[0]}/" if info.spawn else ""
        if info.replaces:  # a replacement (gpurun --respawn) joins a COMM_WORLD of its own too
            self._ns = f"replace/{info.replaces[1]}/"
        from .store import StoreClient

        if info.host_store and info.rank == 0:  # rank 0 serves (torchrun-style): only it loads the server
            from .store_server import StoreServer

            self._server = self._serve(StoreServer, info)
        self.address = f"{info.store_host}:{info.store_port}"
        try:
            self.store = StoreClient(info.store_host, info.store_port, info.secret,
                                     timeout=self._timeout, connect_timeout=self._timeout)
        except GpucollTimeout as exc:
            raise BootstrapError(
                f"rank {info.rank} could not reach the rendezvous store at {self.address} within "
                f"{self._timeout:g} s (GPUCOLL_INIT_TIMEOUT): {exc}") from None
        self._check_size()

    @staticmethod
    def _serve(StoreServer, info):
        try:
            return StoreServer(server_address(info.store_host, info.one_host), info.store_port,
                               info.secret).start()
        except StoreError as exc:
            raise BootstrapError(
                f"rank 0 could not serve the rendezvous store on port {info.store_port}: {exc}. "
                "Another job may hold the port: set MASTER_PORT or GPUCOLL_STORE to a free one.") from None

    def _check_size(self):
        """All ranks must agree on the size; the first to register fixes it."""
        mine = str(self.size).encode()
        stored = self.store.compare_set(self._ns + "gpucoll/size", None, mine)
        if stored != mine:
            raise BootstrapError(
                f"rank {self.rank} was started with a world size of {self.size}, but other ranks of this "
                f"job registered {stored.decode()} at the store {self.address}. Every rank must see the same "
                "size (WORLD_SIZE / SLURM_NTASKS / -np).")

    def _missing(self, keys):
        missing = []
        for rank, key in keys:
            try:
                self.store.get(key, timeout=0.001)
            except GpucollTimeout:
                missing.append(rank)
        return missing

    def allgather(self, data):
        seq = self._seq
        self._seq += 1
        prefix = f"{self._ns}ag/{seq}/"
        self.store.set(prefix + str(self.rank), bytes(data))
        deadline = time.monotonic() + self._timeout
        try:
            return self.store.gather(prefix, self.size, timeout=self._timeout)
        except GpucollTimeout:
            waited = max(0.0, self._timeout - (deadline - time.monotonic()))
            missing = self._missing([(r, prefix + str(r)) for r in range(self.size)])
            who = f"rank(s) {ranges(missing)} never joined" if missing else "the store did not answer"
            raise BootstrapError(
                f"bootstrap exchange #{seq} timed out after {waited:.0f} s: {who} "
                f"(store {self.address}, size {self.size}). Check that every rank was started and "
                "can reach the store; GPUCOLL_INIT_TIMEOUT sets the wait.") from None

    def close(self):
        if self.store is not None:
            self.store.close()
        # The store lives as long as rank 0's process: others may still be reading it.


_KINDS = {"singleton": SingletonBootstrap, "mpi": MpiBootstrap}


def connect(info=None):
    """Detect the launch environment and join the other ranks."""
    info = info or detect()
    kind = _KINDS.get(info.method, StoreBootstrap)
    t0 = time.monotonic()
    boot = kind(info)
    boot._learn_hosts()
    log.set_rank(boot.rank)
    log.info("BOOTSTRAP", "rank %d of %d (local %d of %d) on %s via %s in %.1f ms, pid %d", boot.rank, boot.size,
             boot.local_rank, boot.local_size, boot.host, boot.method, (time.monotonic() - t0) * 1e3, os.getpid())
    return boot
