"""Ports between the groups of one job: MPI.Open_port, Close_port, Intracomm.Accept and Connect.

gpucoll does not start processes (Spawn) or join other jobs, but two groups of one job can meet
through a port as MPI's client/server calls do: a port name says which process opened it, the
connecting group's root sends its group there, the accepting group's root (the process that
opened the port) answers with its own, and each root tells its group; the result is the same
intercommunicator as Create_intercomm's (intercomm.py).
"""
import itertools

from .. import world as _world
from ..errors import InvalidUsageError
from .constants import INTEGERS as _C
from .kinds import kind

_PREFIX = "gpucoll-port:"
_OPEN = {}             # port name -> its number (ports this process opened and has not closed)
_NUMBERS = itertools.count(1)
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
    mine = (core.world_ranks, side_key(core.world_ranks, core._id, n))
    theirs = None
    if core.rank == root:
        owner, number = _parse(port_name, what)
        world = _world.init()
        tag = _PORT_TAG - number
        if accept:
            if owner != world.rank or port_name not in _OPEN:
                raise _error(f"Accept: the root must be the process that opened {port_name!r} and has not closed it")
            theirs, client = world._p2p.irecv_object(_C["ANY_SOURCE"], tag).wait()
            world._p2p.send_object(mine, client, tag)
        else:
            world._p2p.send_object((mine, world.rank), owner, tag)
            theirs = world._p2p.irecv_object(owner, tag).wait()
    remote, key = core.bcast(theirs, root)
    return kind("Intercomm")._joined(core.Dup(), remote, mine[1], key)


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
