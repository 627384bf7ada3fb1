"""Ports between the groups of one job: MPI.Open_port, Close_port, Intracomm.Accept and Connect;
Comm.Join between two processes of one job connected by a socket.

gpucoll does not start processes (Spawn) or join other jobs, but two groups of one job can meet
through a port as MPI's client/server calls do: a port name says which process opened it, the
connecting group's root sends its group there, the accepting group's root (the process that
opened the port) answers with its own, and each root tells its group; the result is the same
intercommunicator as Create_intercomm's (intercomm.py). Join sends each side's job, world rank
and join number over the socket: two processes of one job then make the intercommunicator of
their two one-process groups; a process of another job is refused (NotImplementedError).
"""
import itertools
import os
import socket
import struct

from ..api import comm as _core
from ..api import world as _world
from ..base.errors import InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C
from .kinds import kind
from .unsupported import Unsupported

_PREFIX = "gpucoll-port:"
_OPEN = {}             # port name -> its number (ports this process opened and has not closed)
_NUMBERS = itertools.count(1)
_JOINS = itertools.count(1)
_PORT_TAG = -100000    # world point-to-point tags of port handshakes: _PORT_TAG - port number


def _error(message):
    return InvalidUsageError(message, error_class=_C["ERR_PORT"])


def Open_port(info=None):
    """A new port name of this process."""
    n = next(_NUMBERS)
    name = f"{_PREFIX}{_world.init().rank}:{n}"
    _OPEN[name] = n
    return name


def Close_port(port_name):
    if _OPEN.pop(port_name, None) is None:
        raise _error(f"Close_port: {port_name!r} is not a port this process opened")


# --- the name service: service name -> port name, in the job's store -----------------------------
_LOCAL_NAMES = {}  # a job of one process with no store keeps its names here


def _names(what):
    """(the job's store, or None for the process-local table)."""
    world = _world.init()
    store = getattr(world.seam.context.boot, "store", None)
    if store is None and world.seam.context.size > 1:
        raise Unsupported(f"{what}: the name service needs the job's store (gpurun, srun or torchrun jobs); "
                          "this job was started by an MPI launcher")
    return store


def _service_key(service_name, what):
    if not isinstance(service_name, str) or not service_name:
        raise InvalidUsageError(f"{what}: the service name must be a non-empty string", error_class=_C["ERR_ARG"])
    return f"gpucoll/names/{service_name}"


def Publish_name(service_name, port_name, info=None):
    """Publish port_name under service_name for the whole job."""
    key, store = _service_key(service_name, "Publish_name"), _names("Publish_name")
    if store is None:
        held = _LOCAL_NAMES.setdefault(key, port_name)
    else:
        held = store.compare_set(key, None, port_name.encode()).decode()
    if held != port_name:
        raise InvalidUsageError(f"Publish_name: {service_name!r} is published already (as {held!r})",
                                error_class=_C["ERR_SERVICE"])


def Unpublish_name(service_name, port_name, info=None):
    key, store = _service_key(service_name, "Unpublish_name"), _names("Unpublish_name")
    held = _LOCAL_NAMES.get(key) if store is None else _lookup(store, key)
    if held != port_name:
        raise InvalidUsageError(f"Unpublish_name: {service_name!r} is not published as {port_name!r}",
                                error_class=_C["ERR_SERVICE"])
    if store is None:
        del _LOCAL_NAMES[key]
    else:
        store.delete(key)


def Lookup_name(service_name, info=None):
    """The port name published under service_name."""
    key, store = _service_key(service_name, "Lookup_name"), _names("Lookup_name")
    held = _LOCAL_NAMES.get(key) if store is None else _lookup(store, key)
    if held is None:
        raise InvalidUsageError(f"Lookup_name: nothing is published as {service_name!r}", error_class=_C["ERR_NAME"])
    return held


def _lookup(store, key):
    from ..base.errors import TimeoutError as GpucollTimeout

    try:
        return store.get(key, timeout=0.001).decode()
    except GpucollTimeout:
        return None


def _parse(port_name, what):
    try:
        owner, n = port_name[len(_PREFIX):].split(":") if port_name.startswith(_PREFIX) else (None, None)
        return int(owner), int(n)
    except (TypeError, ValueError, AttributeError):
        raise _error(f"{what}: {port_name!r} is not a port name of this job (MPI.Open_port makes them)") from None


def side_key(worlds, comm_id, n):
    """The name one group gives its side of a new intercommunicator (Create_intercomm, Accept,
    Connect): unique to the parent communicator and its n-th intercommunicator, ordered by the
    group's lowest world rank."""
    return f"{comm_id}#{n}@{min(worlds)}"


def _meet(intra, port_name, root, accept):
    what = "Accept" if accept else "Connect"
    core = intra._c(what)
    n = intra._s.children[("inter",)] = intra._s.children.get(("inter",), 0) + 1
    mine = (core.world_ranks, side_key(core.world_ranks, core.seam.id, n))
    theirs = None
    if core.rank == root:
        owner, number = _parse(port_name, what)
        world = _world.init()
        tag = _PORT_TAG - number
        if accept:
            if owner != world.rank or port_name not in _OPEN:
                raise _error(f"Accept: the root must be the process that opened {port_name!r} and has not closed it")
            theirs, client = world.seam.p2p.irecv_object(_C["ANY_SOURCE"], tag).wait()
            world.seam.p2p.send_object(mine, client, tag)
        else:
            world.seam.p2p.send_object((mine, world.rank), owner, tag)
            theirs = world.seam.p2p.irecv_object(owner, tag).wait()
    remote, key = core.bcast(theirs, root)
    return kind("Intercomm")._joined(core.Dup(), remote, mine[1], key)


def _exchange(fd, data):
    """Send data over the connected socket fd and receive the other side's (both send first)."""
    with socket.socket(fileno=os.dup(fd)) as sock:  # a handle of our own: the caller's fd stays open
        sock.sendall(struct.pack("!I", len(data)) + data)
        received = b""
        while len(received) < 4 or len(received) < 4 + struct.unpack("!I", received[:4])[0]:
            chunk = sock.recv(4096)
            if not chunk:
                raise _error("Join: the other side closed the socket before it said who it is")
            received += chunk
    return received[4:]


def join(fd):
    """Comm.Join: the intercommunicator of this process and the one at the other end of the
    connected socket fd, both of this job (one process on each side)."""
    world = _world.init()
    n = next(_JOINS)
    job_id = world.seam.context.job_id
    theirs = _exchange(fd, f"{job_id}|{world.rank}|{n}".encode()).decode(errors="replace")
    job, rank, number = theirs.rsplit("|", 2)
    if job != str(job_id):
        raise Unsupported(f"Join: the other side is a process of another job ({job!r}); gpucoll joins "
                          "processes of one job only")
    rank = int(rank)
    local = _core.Communicator(world.seam.context, f"join{n}@{world.rank}", (world.rank,))
    return kind("Intercomm")._joined(local, (rank,), f"join{n}@{world.rank}", f"join{number}@{rank}")


class Ports:
    """Intracomm.Accept and Connect (mixed into MPI.Intracomm)."""

    __slots__ = ()

    def Accept(self, port_name, info=None, root=0):
        """The intercommunicator with the group that connects to port_name (collective; root opened
        the port)."""
        return _meet(self, port_name, root, True)

    def Connect(self, port_name, info=None, root=0):
        """The intercommunicator with the group that accepts on port_name (collective)."""
        return _meet(self, port_name, root, False)
