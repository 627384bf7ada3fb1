"""MPI's dynamic processes: Intracomm.Spawn, Spawn_multiple and Comm.Get_parent, under gpurun.

The parents' root asks gpurun through the job's store to start the children
(gpucoll/bootstrap/spawns.py has the exchange, launcher/spawn_service.py gpurun's side); the
children get the next world ranks of the job, so the parents and the children reach each
other as any two ranks do. Both sides then build the same intercommunicator as
Create_intercomm (intercomm.py), named after the spawn's number: the parents from Spawn, the
children from Get_parent, without any message.
"""
import os

from ..api import comm as _core
from ..api import world as _world
from ..base import config
from ..base.errors import GpucollError, InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C
from .kinds import kind

ERR_SPAWN, SUCCESS = _C["ERR_SPAWN"], _C["SUCCESS"]
_parent = None  # the children's intercommunicator with their parents, made on first Get_parent


def _error(message):
    return InvalidUsageError(message, error_class=ERR_SPAWN)


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
        raise _error(f"{what}: info host={host!r}: gpurun starts spawned processes on the parents' host "
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
    for n in maxprocs:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise _error(f"{what}: cannot start {n!r} processes of a command (give 1 or more)")
    argvs = [_argv(c, a, what) for c, a in zip(commands, args)]
    return argvs, maxprocs, [_wdir(i, what) for i in infos]


def spawn(intra, what, commands, args, maxprocs, infos, root, errcodes, single):
    """Spawn / Spawn_multiple (collective over intra; only root's arguments count)."""
    from .collectives import check_root

    core = intra._c(what)
    root = check_root(core, root)
    ctx = core.seam.context
    outcome = None
    if core.rank == root:
        try:
            outcome = _start(ctx, core, what, *_request(what, commands, args, maxprocs, infos))
        except (GpucollError, ValueError) as exc:
            outcome = exc
    outcome = core.bcast(outcome, root)
    if isinstance(outcome, BaseException):
        raise outcome
    k, base, entries, sizes = outcome
    ctx.learn(entries)
    if errcodes is not None:
        errcodes[:] = [SUCCESS] * sizes[0] if single else [[SUCCESS] * n for n in sizes]
    mine, theirs = _keys(k, core.world_ranks, base)
    local = _core.Communicator(ctx, f"spawn{k}/parents", core.world_ranks)
    return kind("Intercomm")._joined(local, tuple(sorted(entries)), mine, theirs)


def _start(ctx, core, what, argvs, maxprocs, wdirs):
    from ..bootstrap import spawns

    store = getattr(ctx.boot, "store", None)
    if store is None:
        raise _error(f"{what}: this job has no store to ask a launcher through: Spawn needs a job that gpurun "
                     "started (not mpiexec, or a program run alone)")
    ctx.reachable()  # a single parent listens only from now
    entries = {w: ctx.entries[w] for w in core.world_ranks}
    try:
        k, base, children = spawns.request(store, core.world_ranks, entries, argvs, maxprocs, wdirs,
                                           config.INIT_TIMEOUT.get())
    except spawns.SpawnFailed as exc:
        raise _error(f"{what}: {exc}") from None
    return k, base, children, maxprocs


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
