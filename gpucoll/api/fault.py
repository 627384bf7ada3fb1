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
- grow (`gpurun --respawn N`): gpurun starts the program again for each failed rank, at most N
  times; the replacement calls gpucoll.rejoin() where the survivors call comm.grow() on their
  shrunk communicator, and both get a communicator of the size before the failures, each
  replacement at the number of the rank it replaces (gpucoll.replaces() says which).

Without a store (a script run alone, or a job bootstrapped by MPI) no rank can be recorded
failed and nothing is propagated: shrink is a Dup, agree the AND of every rank's flag, revoke
local to this process and its host.
"""
import json
import threading
import time
import weakref

from ..base import config, log
from ..base.errors import InvalidUsageError, ProcFailedError
from ..base.errors import TimeoutError as GpucollTimeout
from ..base.ranks import ranges
from ..bootstrap import failures

_watcher = []          # the watcher thread of this process, once started
_watcher_lock = threading.Lock()
_next_revocation = [1]  # the number of the revocation key the watcher waits for (failures.revoke_key)
# Every communicator of this process (gpucoll/api/comm.py adds each), for the watcher's revocations
# and for the forked child, which must disable what it inherited.
LIVE = weakref.WeakSet()


def live_communicators():
    """This process's communicators that are not freed."""
    return [comm for comm in list(LIVE) if not comm.seam.released]


class FaultState:
    """A communicator's fault-tolerance bookkeeping (comm.seam.fault)."""

    __slots__ = ("revoked", "agreements", "acked", "acked_ranks", "origin")

    def __init__(self):
        self.revoked = False
        self.agreements = 0   # agreements made on it so far: they name the next one
        self.acked = 0        # failed ranks acknowledged (ack_failed)
        self.acked_ranks = set()  # ... which those are
        self.origin = None    # after shrinks: the world ranks before them (what grow() gives back)


def _store(comm):
    return getattr(comm.seam.context.boot, "store", None)


def revoke(comm):
    """Revoke `comm` on every rank (see the module docstring); idempotent."""
    seam = comm.seam
    seam.check_usable("revoke")
    start_watcher(seam.context)
    if seam.fault.revoked:
        return
    revoke_here(seam.id)
    store = _store(comm)
    if store is not None and comm.size > 1:
        failures.announce_revoke(store, seam.id, _next_revocation[0])
        log.info("FT", "revoked communicator %s (rank %d of %d)", seam.id, comm.rank, comm.size)


def revoke_here(comm_id):
    """Revoke communicator `comm_id` in this process: it and the sub-communicators its
    hierarchical collectives run on (not its Dups and Splits, which are communicators of their own)."""
    for comm in live_communicators():
        cid = comm.seam.id
        if cid == comm_id or cid == f"{comm_id}.leaders" or cid.startswith(f"{comm_id}.host"):
            comm.seam.revoke_here()


def _agreement(comm, flag, what, values=True):
    """(value, failed ranks of comm): one agreement among comm's survivors (the value only
    with `values`)."""
    seam = comm.seam
    seam.check_usable(what)
    start_watcher(seam.context)
    seam.fault.agreements += 1
    store = _store(comm)
    if store is None or comm.size == 1:
        if comm.size > 1:   # no coordinator: a failure-free job's agreement (see the module docstring),
            # on a communicator of its own (comm may be revoked)
            mates = type(comm)(seam.context, f"{seam.id}.a{seam.fault.agreements}", comm.world_ranks)
            try:
                return failures.bitwise_and(mates.allgather(int(flag))), set()
            finally:
                mates.Free()
        return int(flag), set()
    name = f"{seam.id}/{seam.fault.agreements}"
    try:
        return failures.agree(store, name, comm.world_ranks, comm.rank, flag, seam.context.has_ended,
                              config.TIMEOUT.get(), values)
    except GpucollTimeout as exc:
        exc.args = (f"{what} on communicator {seam.id} (rank {comm.rank} of {comm.size}): {exc.args[0]}",)
        raise


def shrink(comm):
    """A new communicator of comm's survivors, in comm's order (collective over the survivors)."""
    _, failed = _agreement(comm, 0, "shrink", values=False)
    seam = comm.seam
    survivors = [w for r, w in enumerate(comm.world_ranks) if r not in failed]
    if failed:
        log.info("FT", "shrink of %s: rank(s) %s failed, %d survive", seam.id, ranges(sorted(failed)), len(survivors))
    shrunk = type(comm)(seam.context, f"{seam.id}.k{seam.fault.agreements}", survivors)
    # what grow() gives back: the communicator's ranks before any of its shrinks
    shrunk.seam.fault.origin = seam.fault.origin or list(comm.world_ranks)
    return shrunk


def agree(comm, flag):
    """The bitwise AND of the integer flags of comm's survivors, the same on each of them."""
    value, _ = _agreement(comm, int(flag), "agree")
    return value


def failed(comm):
    """The ranks of comm known to have failed: those gpurun recorded under --on-failure=continue
    (a rank that ended well is not one), and those this process saw end, once gpurun has said
    they failed (this process may see a death before gpurun has recorded it: an error naming a
    rank, then failed() without it, would contradict itself). Elsewhere none: a failure ends such
    a job."""
    comm.seam.check_usable("failed")
    store = _store(comm)
    if store is None or config.ON_FAILURE.get() != "continue":
        return []
    ctx = comm.seam.context
    seen = [r for r, w in enumerate(comm.world_ranks) if ctx.has_ended(w)]
    verdict = set(_failed_of(comm, store, seen))
    gone = failures.failed_world_ranks(store)
    return [r for r, w in enumerate(comm.world_ranks) if w in gone or r in verdict]


def ack_failed(comm, count=None):
    """Acknowledge the first `count` failed ranks (all when None); returns how many are
    acknowledged now (ULFM's MPI_Comm_ack_failed)."""
    known = failed(comm)
    state = comm.seam.fault
    if count is None:
        count = len(known)
    if count < 0:
        raise InvalidUsageError(f"ack_failed: count must be >= 0, not {count}")
    state.acked = max(state.acked, min(count, len(known)))
    state.acked_ranks.update(known[:state.acked])
    return state.acked


def unacknowledged(comm, ranks):
    """Those of comm's `ranks` (ranks whose process this one saw go) that failed and are not
    acknowledged: what fails a receive from ANY_SOURCE (ULFM). A rank that ended well is not
    one: gpurun's verdict on each (under --on-failure=continue) is waited for. Elsewhere none:
    there a failure ends the job."""
    store = _store(comm)
    if store is None or config.ON_FAILURE.get() != "continue":  # gpurun records verdicts only there
        return []
    return _failed_of(comm, store, [r for r in ranks if r not in comm.seam.fault.acked_ranks])


def _failed_of(comm, store, ranks):
    """Those of comm's `ranks` (whose process ended) that failed, by gpurun's verdict on each,
    waited for (it records both failures and ends in good health)."""
    world = comm.world_ranks
    timeout = config.TIMEOUT.get()
    deadline = time.monotonic() + timeout
    while ranks:
        gone = failures.failed_world_ranks(store)
        ended = failures.failed_world_ranks(store, failures.ENDED)
        undecided = [r for r in ranks if world[r] not in gone | ended]
        if not undecided:
            return [r for r in ranks if world[r] in gone]
        if time.monotonic() > deadline:
            raise GpucollTimeout(f"communicator {comm.seam.id}: the process of rank(s) {ranges(undecided)} ended, "
                                 f"and gpurun said within {timeout:g} s (GPUCOLL_TIMEOUT) neither that it "
                                 "failed nor that it ended well")
        time.sleep(0.002)
    return []


def grow(comm):
    """The communicator of comm's ranks before its shrinks, each failed rank's place taken by
    the replacement gpurun --respawn started for it (or left out where gpurun started none):
    collective over comm's ranks and the replacements, which call rejoin(). Without failures
    since the shrinks, a duplicate."""
    seam = comm.seam
    seam.check_usable("grow")
    store = _store(comm)
    if store is None:
        raise InvalidUsageError("grow: replacements come from gpurun --respawn; this job has no gpurun store")
    start_watcher(seam.context)
    seam.fault.agreements += 1
    origin = seam.fault.origin or list(comm.world_ranks)
    cid = f"{seam.id}.g{seam.fault.agreements}"
    timeout, ctx = config.TIMEOUT.get(), seam.context
    present = set(comm.world_ranks)
    members = []
    for w in origin:
        members.append(w if w in present else _replacement_of(store, w, timeout))
    members = [w for w in members if w is not None]
    record = {"comm": cid, "members": members,
              "entries": {str(w): ctx.entries[w] for w in members if w in present}}
    # The first survivor's view wins: a replacement that fails meanwhile is seen by some only.
    key = f"gpucoll/ft/grow/{cid}"
    record = failures.record(key, store.compare_set(key, None, json.dumps(record).encode()), "grown")
    members = record["members"]
    joining = [w for w in members if w not in present]
    for w in joining:
        store.compare_set(failures.grown_key(w), None, json.dumps(record).encode())
    for w in joining:
        ctx.learn({w: announced_entry(store, w, members.index(w), timeout)})
    log.info("FT", "grow of %s: %s take the places of failed ranks; size %d", seam.id,
             ", ".join(map(str, joining)) or "no replacement", len(members))
    return type(comm)(ctx, cid, members)


def _replacement_of(store, world_rank, timeout):
    """The live replacement of failed `world_rank` (following replacements that failed too), or
    None where gpurun started none."""
    while True:
        key = failures.replacement_key(world_rank)
        answer = failures.record(key, store.get(key, timeout=timeout), "replacement")
        if "none" in answer:
            log.info("FT", "no replacement for rank %d: %s", world_rank, answer["none"])
            return None
        world_rank = answer["world_rank"]
        if world_rank not in failures.failed_world_ranks(store):
            return world_rank


def announced_entry(store, world_rank, position, timeout):
    """The entry of replacement `world_rank`, once it has started (ProcFailedError if it failed first)."""
    from ..bootstrap import spawns

    deadline = time.monotonic() + timeout
    while True:
        try:
            return spawns.look_up(store, world_rank, 0.05)
        except GpucollTimeout:
            if world_rank in failures.failed_world_ranks(store):
                raise ProcFailedError(f"grow: the replacement (world rank {world_rank}) for rank {position} "
                                      "failed before it joined; shrink and grow again", ranks=[position]) from None
            if time.monotonic() > deadline:
                raise


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
    """Revoke here every communicator that another rank revokes (store keys in order). A broken
    connection is made anew (backing off up to a second); the watcher ends when the store stays
    unreachable, or keeps failing with no request answered, for GPUCOLL_INIT_TIMEOUT: the job
    has ended, or its port now belongs to something else."""
    from ..bootstrap.store import StoreClient, StoreUnreachableError

    give_up_after = config.INIT_TIMEOUT.get()
    answered = [False]  # the store answered a request since the last failure
    failing_since, delay = None, 0.05
    while True:
        try:
            with StoreClient(info.store_host, info.store_port, info.secret, timeout=3600.0,
                             connect_timeout=give_up_after) as store:
                _follow_revocations(store, answered)
        except StoreUnreachableError as exc:
            log.info("FT", "the watcher of revocations stops: %s", exc)
            return
        except Exception as exc:  # noqa: BLE001 - a request that broke: a later revoke must still wake us
            now = time.monotonic()
            if answered[0] or failing_since is None:
                answered[0], failing_since, delay = False, now, 0.05
            if now - failing_since > give_up_after:  # refused all along (not the job's store any more)
                log.warn("FT", "the watcher of revocations stops: the store has refused it for %.0f s (%s)",
                         now - failing_since, exc)
                return
            log.info("FT", "the watcher of revocations lost its store connection (%s); connecting again", exc)
            time.sleep(delay)
            delay = min(1.0, delay * 2)


def _follow_revocations(store, answered):
    while True:
        try:
            value = store.get(failures.revoke_key(_next_revocation[0]), timeout=3600.0)
        except GpucollTimeout:
            answered[0] = True
            continue
        answered[0] = True
        _next_revocation[0] += 1
        try:
            comm_id = value.decode("ascii")
        except UnicodeDecodeError:  # only a holder of the job's secret writes these keys
            log.warn("FT", "revocation %d does not name a communicator (%r); skipped", _next_revocation[0] - 1,
                     value[:64])
            continue
        log.info("FT", "communicator %s was revoked by another rank", comm_id)
        revoke_here(comm_id)
