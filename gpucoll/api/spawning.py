"""Processes started by a running job (MPI's Spawn), on gpucoll's own communicator.

    comm.spawn([sys.executable, "worker.py"], nprocs=4)  # -> the parents, then the 4 children
    gpucoll.parent()                                     # in a child: the same communicator (world.py)

The root of the parents asks gpurun, through the job's store, to start the children
(gpucoll/bootstrap/spawns.py has the exchange, launcher/spawn_service.py gpurun's side). They
get the next world ranks of the job, their own COMM_WORLD, and reach the parents as any two
ranks do. Both sides then name the same communicators after the spawn's number, without a
message: here one over the parents then the children; gpucoll.MPI builds its
intercommunicator on the same spawn (gpucoll/mpi/spawn.py).
"""
from ..base import config
from ..base.errors import GpucollError, SpawnError


def start(comm, what, request, root):
    """The collective part of a spawn over `comm` (a Communicator): `request()` runs on root
    only and returns (argvs, maxprocs, wdirs), or raises; every rank gets (k, children's world
    ranks, maxprocs) or the same exception."""
    outcome = None
    if comm.rank == root:
        try:
            outcome = _ask(comm, what, *request())
        except (GpucollError, ValueError) as exc:
            outcome = exc
    outcome = comm.bcast(outcome, root)
    if isinstance(outcome, BaseException):
        raise outcome
    k, entries, maxprocs = outcome
    comm.seam.context.learn(entries)
    return k, tuple(sorted(entries)), maxprocs


def _ask(comm, what, argvs, maxprocs, wdirs):
    from ..bootstrap import spawns

    ctx = comm.seam.context
    store = getattr(ctx.boot, "store", None)
    if store is None:
        raise SpawnError(f"{what}: this job has no store to ask a launcher through: spawning needs a job that "
                         "gpurun started (not mpiexec, or a program run alone)")
    ctx.reachable()  # a single parent listens only from now
    entries = {w: ctx.entries[w] for w in comm.world_ranks}
    try:
        k, _, children = spawns.request(store, comm.world_ranks, entries, argvs, maxprocs, wdirs,
                                        config.INIT_TIMEOUT.get())
    except spawns.SpawnFailed as exc:
        raise SpawnError(f"{what}: {exc}") from None
    return k, children, maxprocs


def check_counts(what, maxprocs):
    for n in maxprocs:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SpawnError(f"{what}: cannot start {n!r} processes of a command (give 1 or more)")


def spawn(comm, argv, nprocs=1, root=0, cwd=None):
    """Communicator.spawn: start `nprocs` processes of `argv` (root's arguments count) and
    return the communicator of this communicator's ranks, then the children's (collective)."""
    def request():
        args = [argv] if isinstance(argv, str) else list(argv)
        if not args or not all(isinstance(a, str) for a in args):
            raise SpawnError(f"spawn: argv must be a command and its arguments, as strings (got {argv!r})")
        check_counts("spawn", [nprocs])
        return [args], [nprocs], [cwd]

    k, children, _ = start(comm, "spawn", request, root)
    return type(comm)(comm.seam.context, merged_name(k), tuple(comm.world_ranks) + children)


def merged_name(k):
    """The id of the communicator of spawn k's parents then children (the same on both sides)."""
    return f"spawn{k}/all"
