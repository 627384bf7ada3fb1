"""Fault tolerance through the job's store: who failed, what was revoked, what the survivors agreed.

The store (gpurun's, which outlives any rank) is the coordinator:

- `gpucoll/ft/failed`: the world ranks gpurun saw end with a failure, a JSON list that only
  gpurun writes (`gpurun --on-failure=continue`, launcher/job.py);
- `gpucoll/ft/revoke/<n>` (n from the counter `gpucoll/ft/revoke/count`): the id of the n-th
  revoked communicator; every rank's watcher thread (gpucoll/api/fault.py) waits for the next;
- `gpucoll/ft/agree/<name>/<rank>` and `.../decision`: one agreement (shrink and agree are
  both one). Each survivor posts its flag, waits until every rank of the communicator has
  posted or is known to have failed, and offers the result with compare-and-set: the first
  offer wins and every survivor adopts it, so all of them see the same failed set and the same
  value even when a rank dies during the agreement (a rank that posted before dying is counted
  by some and not by others until the decision settles it).

It tolerates any number of rank failures; it does not tolerate the loss of the store, which is
gpurun's: a job whose gpurun is gone has ended anyway (its ranks die with it).
"""
import json
import time

from ..base.errors import TimeoutError as GpucollTimeout

FAILED = "gpucoll/ft/failed"
REVOKE_COUNT = "gpucoll/ft/revoke/count"
_POLL_S = 0.005   # how long one wait for a missing rank's post lasts before the failures are read again


def revoke_key(n):
    return f"gpucoll/ft/revoke/{n}"


def replacement_key(world_rank):
    """gpurun's answer for failed `world_rank`: {"world_rank": its replacement} or {"none": why}."""
    return f"gpucoll/ft/replacement/{world_rank}"


def grown_key(world_rank):
    """The communicator that the survivors' grow() made with replacement `world_rank`:
    {"comm": id, "members": world ranks, "entries": {world rank: entry}}."""
    return f"gpucoll/ft/grown/{world_rank}"


def failed_world_ranks(store):
    """The world ranks gpurun has recorded as failed (an empty set before any, or without gpurun)."""
    if not store.num_keys(FAILED):
        return set()
    return set(json.loads(store.get(FAILED, timeout=1.0)))


def announce_revoke(store, comm_id):
    """Tell every rank's watcher that communicator `comm_id` is revoked."""
    n = store.add(REVOKE_COUNT, 1)
    store.set(revoke_key(n), comm_id.encode())


def agree(store, name, world_ranks, rank, flag, has_ended, timeout):
    """One fault-tolerant agreement among the ranks `world_ranks` of a communicator (this
    process is `rank` of them), named `name` (the same on every rank, never reused).

    Returns (the bitwise AND of the flags of the ranks counted, the ranks of the communicator
    that the decision counts as failed), the same on every survivor. `has_ended(world_rank)`
    says what this process sees itself (same host); the store says what gpurun saw."""
    base = f"gpucoll/ft/agree/{name}"
    store.set(f"{base}/{rank}", str(int(flag)).encode())
    decision_key = f"{base}/decision"
    deadline = time.monotonic() + timeout
    flags = {}
    failed = set()
    pending = [r for r in range(len(world_ranks)) if r != rank]
    flags[rank] = int(flag)
    while pending:
        if store.num_keys(decision_key):   # another survivor has decided: nothing to wait for
            break
        gone = failed_world_ranks(store)
        still = []
        for r in pending:
            if store.num_keys(f"{base}/{r}"):
                flags[r] = int(store.get(f"{base}/{r}", timeout=1.0))
            elif world_ranks[r] in gone or has_ended(world_ranks[r]):
                failed.add(r)
            else:
                still.append(r)
        pending = still
        if not pending:
            break
        if time.monotonic() >= deadline:
            err = GpucollTimeout(f"agreement {name}: rank(s) {', '.join(map(str, pending))} neither took part "
                                 f"nor failed within {timeout:g} s")
            err.ranks = tuple(pending)
            raise err
        try:
            store.wait([f"{base}/{pending[0]}"], timeout=_POLL_S)
        except GpucollTimeout:
            pass
    value = -1
    for r, f in flags.items():
        if r not in failed:
            value &= f
    offer = json.dumps({"value": value, "failed": sorted(failed)}).encode()
    decided = json.loads(store.compare_set(decision_key, None, offer))
    return decided["value"], set(decided["failed"])


class FailureBoard:
    """gpurun's side: the failed ranks it records (StoreServer.put_threadsafe from its loop)."""

    def __init__(self, server):
        self._server = server
        self.failed = []

    def record(self, world_rank):
        self.failed.append(world_rank)
        self._server.put_threadsafe(FAILED, json.dumps(self.failed).encode())

    def replaced(self, world_rank, replacement, why=None):
        """Say which world rank replaces failed `world_rank` (None: none will, because `why`)."""
        answer = {"world_rank": replacement} if replacement is not None else {"none": why}
        self._server.put_threadsafe(replacement_key(world_rank), json.dumps(answer).encode())

