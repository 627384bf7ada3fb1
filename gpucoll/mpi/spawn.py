"""MPI's dynamic processes: Intracomm.Spawn, Spawn_multiple and Comm.Get_parent, under gpurun.

The spawn itself is gpucoll's (gpucoll/api/spawning.py): the children get the next world ranks
of the job and reach their parents as any two ranks do. Both sides then build the same
intercommunicator as Create_intercomm (intercomm.py), named after the spawn's number: the
parents from Spawn, the children from Get_parent, without any message.
"""
import os

from ..api import comm as _core
from ..api import spawning as _spawning
from ..api import world as _world
from ..base.errors import SpawnError
from ..base.mpi_constants import INTEGERS as _C
from .kinds import kind

SUCCESS = _C["SUCCESS"]
_parent = None  # the children's intercommunicator with their parents, made on first Get_parent


def _keys(k, parents, base):
    """The two sides' names of the intercommunicator of spawn k (as intercomm.make sorts them)."""
    return f"spawn{k}/parents@{min(parents)}", f"spawn{k}/children@{base}"


def _argv(command, args, what):
    if not isinstance(command, (str, os.PathLike)):
        raise ValueError(f"{what}: the command must be a string or a path, not {type(command).__name__}")
    if args is None:
        args = []
    elif isinstance(args, (str, os.PathLike)):
        args = [args]
    return [os.fspath(command), *(os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args)]


def _per_command(value, count, what, name):
    """`value` for each of `count` commands: one value for all, or a sequence of `count`."""
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(f"{what}: {len(value)} {name} for {count} commands")
        return list(value)
    return [value] * count


def _wdir(info, what):
    """The working directory the info asks for (None: gpurun's), refusing a host it cannot serve."""
    items = dict(info.items()) if info is not None and getattr(info, "_s", True) is not None else {}
    host = items.get("host")
    if host is not None and host not in ("localhost", _world.init().host):
        raise SpawnError(f"{what}: info host={host!r}: gpurun starts spawned processes on the parents' host "
                     f"({_world.init().host}) only")
    return items.get("wdir")


def _request(what, commands, args, maxprocs, infos):
    """The root's reading of the arguments: (argvs, maxprocs, wdirs)."""
    if not isinstance(commands, (list, tuple)):
        raise ValueError(f"{what}: the commands must be a list, one per program")
    count = len(commands)
    args = [None] * count if args is None else _per_command(args, count, what, "argument lists")
    if args and not isinstance(args[0], (list, tuple, type(None))) and count:
        raise ValueError(f"{what}: the arguments must be one list per command")
    maxprocs = _per_command(1 if maxprocs is None else maxprocs, count, what, "process counts")
    infos = _per_command(infos, count, what, "infos")
    _spawning.check_counts(what, maxprocs)
    argvs = [_argv(c, a, what) for c, a in zip(commands, args)]
    return argvs, maxprocs, [_wdir(i, what) for i in infos]


def spawn(intra, what, commands, args, maxprocs, infos, root, errcodes, single):
    """Spawn / Spawn_multiple (collective over intra; only root's arguments count)."""
    from .collectives import check_root

    core = intra._c(what)
    root = check_root(core, root)
    k, children, sizes = _spawning.start(core, what, lambda: _request(what, commands, args, maxprocs, infos),
                                         root)
    if errcodes is not None:
        errcodes[:] = [SUCCESS] * sizes[0] if single else [[SUCCESS] * n for n in sizes]
    mine, theirs = _keys(k, core.world_ranks, children[0])
    local = _core.Communicator(core.seam.context, f"spawn{k}/parents", core.world_ranks)
    return kind("Intercomm")._joined(local, children, mine, theirs)


def parent():
    """Comm.Get_parent: the intercommunicator with the parents in a spawned process (the same
    handle until it is disconnected, then MPI.COMM_NULL), else MPI.COMM_NULL."""
    global _parent
    world = _world.init()
    ctx = world.seam.context
    if ctx.spawn is None:
        return kind("Intercomm")()
    if _parent is None:
        k, base = ctx.spawn
        theirs, mine = _keys(k, ctx.spawn_parents, base)
        local = _core.Communicator(ctx, f"spawn{k}/children", world.world_ranks)
        _parent = kind("Intercomm")._joined(local, tuple(ctx.spawn_parents), mine, theirs)
    return _parent


def universe_size():
    """MPI.UNIVERSE_SIZE: gpurun's --universe-size where it was given, else the size of COMM_WORLD."""
    from ..bootstrap import spawns

    world = _world.init()
    if not _universe:
        store = getattr(world.seam.context.boot, "store", None)
        _universe.append(spawns.universe_size(store) if store is not None else None)
    return _universe[0] or world.size


_universe = []


class Spawning:
    """Intracomm.Spawn and Spawn_multiple (mixed into MPI.Intracomm)."""

    __slots__ = ()

    def Spawn(self, command, args=None, maxprocs=1, info=None, root=0, errcodes=None):
        """Start maxprocs processes of command (root's arguments count) and return the
        intercommunicator with them (collective)."""
        return spawn(self, "Spawn", [command], None if args is None else [args], maxprocs, info, root,
                     errcodes, True)

    def Spawn_multiple(self, command, args=None, maxprocs=None, info=None, root=0, errcodes=None):
        """Start maxprocs[i] processes of command[i] with args[i] and info[i]; one intercommunicator
        with all of them, in command order (collective)."""
        return spawn(self, "Spawn_multiple", command, args, maxprocs, info, root, errcodes, False)
