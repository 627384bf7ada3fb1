"""Surviving a lost rank, as MPI's ULFM defines it: revoke, shrink, agree, failed, ack_failed.

    try:
        comm.Allreduce(gpucoll.IN_PLACE, x)
    except (gpucoll.ProcFailedError, gpucoll.RevokedError):
        comm.revoke()              # the others leave whatever they wait in on comm
        comm = comm.shrink()       # the survivors, the same communicator on every one of them

A rank that dies makes the operations that need it raise ProcFailedError (LostPeerError) on the
survivors that take part, from the liveness the transports already watch; under
`gpurun --on-failure=continue` the job goes on and gpurun records the failure in the store.

- revoke: this rank's pending and later operations on the communicator raise RevokedError at
  once; the other ranks learn it from the store through a watcher thread (started with the job
  under --on-failure=continue, else at this process's first fault-tolerance call), and on this
  host straight from the communicator's shared segment. A rank blocked in a collective of the
  communicator, in a receive on it, or in a rendezvous send to a rank that revoked, leaves it
  with RevokedError.
- shrink and agree: one agreement through the store (gpucoll/bootstrap/failures.py): every
  survivor gets the same failed set and value, even when a rank dies during it.

Without a store (a script run alone, or a job bootstrapped by MPI) no rank can be recorded
failed and nothing is propagated: shrink is a Dup, agree the AND of every rank's flag, revoke
local to this process and its host.
"""
import threading

from ..base import config, log
from ..base.errors import InvalidUsageError
from ..base.errors import TimeoutError as GpucollTimeout
from ..base.ranks import ranges
from ..bootstrap import failures

_watcher = []          # the watcher thread of this process, once started
_watcher_lock = threading.Lock()


def _store(comm):
    return getattr(comm._ctx.boot, "store", None)


def _ft_state(comm):
    if comm._ft is None:
        comm._ft = {"agreements": 0, "acked": 0}
    return comm._ft


def revoke(comm):
    """Revoke `comm` on every rank (see the module docstring); idempotent."""
    comm._check_not_freed("revoke")
    start_watcher(comm._ctx)
    if comm._revoked:
        return
    revoke_here(comm._id)
    store = _store(comm)
    if store is not None and comm.size > 1:
        failures.announce_revoke(store, comm._id)
        log.info("FT", "revoked communicator %s (rank %d of %d)", comm._id, comm.rank, comm.size)


def revoke_here(comm_id):
    """Revoke communicator `comm_id` in this process: it and the sub-communicators its
    hierarchical collectives run on (not its Dups and Splits, which are communicators of their own)."""
    from .comm import live_communicators

    for comm in live_communicators():
        cid = comm._id
        if cid == comm_id or cid == f"{comm_id}.leaders" or cid.startswith(f"{comm_id}.host"):
            comm._revoke_here()


def _agreement(comm, flag, what):
    """(value, failed ranks of comm): one agreement among comm's survivors."""
    comm._check_not_freed(what)
    start_watcher(comm._ctx)
    state = _ft_state(comm)
    state["agreements"] += 1
    store = _store(comm)
    if store is None or comm.size == 1:
        if comm.size > 1:   # no coordinator: a failure-free job's agreement (see the module docstring)
            return _and(comm._allgather_objects(int(flag), what)), set()
        return int(flag), set()
    name = f"{comm._id}/{state['agreements']}"
    try:
        return failures.agree(store, name, comm.world_ranks, comm.rank, flag, comm._ctx.has_ended,
                              config.TIMEOUT.get())
    except GpucollTimeout as exc:
        exc.args = (f"{what} on communicator {comm._id} (rank {comm.rank} of {comm.size}): {exc.args[0]}",)
        raise


def _and(values):
    out = -1
    for v in values:
        out &= int(v)
    return out


def shrink(comm):
    """A new communicator of comm's survivors, in comm's order (collective over the survivors)."""
    _, failed = _agreement(comm, 0, "shrink")
    state = _ft_state(comm)
    survivors = [w for r, w in enumerate(comm.world_ranks) if r not in failed]
    if failed:
        log.info("FT", "shrink of %s: rank(s) %s failed, %d survive", comm._id, ranges(sorted(failed)), len(survivors))
    from .comm import Communicator

    return Communicator(comm._ctx, f"{comm._id}.k{state['agreements']}", survivors)


def agree(comm, flag):
    """The bitwise AND of the integer flags of comm's survivors, the same on each of them."""
    value, _ = _agreement(comm, int(flag), "agree")
    return value


def failed(comm):
    """The ranks of comm known to have failed: those gpurun recorded under --on-failure=continue
    (a rank that ended well is not one), else those whose process this host sees ended."""
    comm._check_not_freed("failed")
    store = _store(comm)
    if store is not None and config.ON_FAILURE.get() == "continue":
        gone = failures.failed_world_ranks(store)
        return [r for r, w in enumerate(comm.world_ranks) if w in gone]
    has_ended = comm._ctx.has_ended
    return [r for r, w in enumerate(comm.world_ranks) if has_ended(w)]


def ack_failed(comm, count=None):
    """Acknowledge the first `count` failed ranks (all when None); returns how many are
    acknowledged now (ULFM's MPI_Comm_ack_failed)."""
    known = len(failed(comm))
    state = _ft_state(comm)
    if count is None:
        count = known
    if count < 0:
        raise InvalidUsageError(f"ack_failed: count must be >= 0, not {count}")
    state["acked"] = max(state["acked"], min(count, known))
    return state["acked"]


# --- the watcher --------------------------------------------------------------------------------
def start_watcher(ctx):
    """Start this process's watcher of revocations (once; only where the job has a store)."""
    info = getattr(ctx.boot, "info", None)
    if getattr(ctx.boot, "store", None) is None or info is None or not getattr(info, "store_host", None):
        return
    with _watcher_lock:
        if _watcher:
            return
        thread = threading.Thread(target=_watch, args=(info,), name="gpucoll-revocations", daemon=True)
        _watcher.append(thread)
        thread.start()


def _watch(info):
    """Revoke here every communicator that another rank revokes (store keys in order)."""
    from ..bootstrap.store import StoreClient

    n = 1
    try:
        with StoreClient(info.store_host, info.store_port, info.secret, timeout=3600.0,
                         connect_timeout=config.INIT_TIMEOUT.get()) as store:
            while True:
                try:
                    comm_id = store.get(failures.revoke_key(n), timeout=3600.0).decode()
                except GpucollTimeout:
                    continue
                n += 1
                log.info("FT", "communicator %s was revoked by another rank", comm_id)
                revoke_here(comm_id)
    except Exception as exc:  # the store is gone: the job is ending; nothing to watch any more
        log.info("FT", "the watcher of revocations stops: %s", exc)
