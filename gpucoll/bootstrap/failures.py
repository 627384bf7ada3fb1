"""Fault tolerance through the job's store: who failed, what was revoked, what the survivors agreed.

The store (gpurun's, which outlives any rank) is the coordinator:

- `gpucoll/ft/failed`: the world ranks gpurun saw end with a failure, a JSON list that only
  gpurun writes (`gpurun --on-failure=continue`, launcher/job.py); `gpucoll/ft/ended`: those it
  saw end well (exit status 0), so that a survivor which saw a process go can tell the two apart;
- `gpucoll/ft/revoke/<n>`: the id of the n-th revoked communicator (n = 1, 2, ... without gaps:
  each is set with compare-and-set on the first free number); every rank's watcher thread
  (gpucoll/api/fault.py) waits for the next;
- `gpucoll/ft/agree/<name>/f/<rank>` and `.../decision`: one agreement (shrink and agree are
  both one). Each survivor posts its flag, waits until every rank of the communicator has
  posted or is known to have failed, and offers the result with compare-and-set: the first
  offer wins and every survivor adopts it, so all of them see the same failed set and the same
  value even when a rank dies during the agreement (a rank that posted before dying is counted
  by some and not by others until the decision settles it);
- `gpucoll/ft/replacement/<w>`: gpurun's answer for failed world rank w under --respawn (the
  world rank of its replacement, or why there is none); `gpucoll/ft/grow/<id>`: the membership
  of grown communicator <id>, decided by the first survivor's compare-and-set;
  `gpucoll/ft/grown/<w>`: the same record for replacement w, which rejoin() reads.

It tolerates any number of rank failures; it does not tolerate the loss of the store, which is
gpurun's: a job whose gpurun is gone has ended anyway (its ranks die with it).
"""
import json
import time

from ..base.errors import GpucollError
from ..base.errors import TimeoutError as GpucollTimeout

FAILED = "gpucoll/ft/failed"
ENDED = "gpucoll/ft/ended"
_POLL_S = 0.02   # how long one wait for the others' posts lasts before the failures are read again


def revoke_key(n):
    return f"gpucoll/ft/revoke/{n}"


def replacement_key(world_rank):
    """gpurun's answer for failed `world_rank`: {"world_rank": its replacement} or {"none": why}."""
    return f"gpucoll/ft/replacement/{world_rank}"


def grown_key(world_rank):
    """The communicator that the survivors' grow() made with replacement `world_rank`:
    {"comm": id, "members": world ranks, "entries": {world rank: entry}}."""
    return f"gpucoll/ft/grown/{world_rank}"


def _ints(x):
    return isinstance(x, list) and all(type(i) is int for i in x)


# The records of these keys, each as JSON: what shape it has, and a check of it.
SHAPES = {
    "failed": ("a JSON list of world ranks", _ints),
    "flag": ("an integer flag", lambda r: type(r) is int),
    "decision": ('{"value": int, "failed": [ranks]}',
                 lambda r: isinstance(r, dict) and type(r.get("value")) is int and _ints(r.get("failed"))),
    "replacement": ('{"world_rank": int} or {"none": why}',
                    lambda r: isinstance(r, dict) and (type(r.get("world_rank")) is int or isinstance(r.get("none"), str))),
    "grown": ('{"comm": id, "members": [world ranks], "entries": {...}}',
              lambda r: isinstance(r, dict) and isinstance(r.get("comm"), str) and _ints(r.get("members"))
              and isinstance(r.get("entries"), dict)),
}


def record(key, value, kind):
    """The JSON record `value` of store key `key`, checked against SHAPES[kind]: a value of
    another shape raises an error that names the key (only gpurun and the job's ranks, which hold
    its secret, write these keys)."""
    shape, valid = SHAPES[kind]
    try:
        decoded = json.loads(value)
        ok = valid(decoded)
    except (ValueError, UnicodeDecodeError, RecursionError):
        ok = False
    if not ok:
        raise GpucollError(f"the job's store holds {bytes(value[:60])!r} at {key}, which is not {shape}; "
                           "only gpurun and the job's ranks write there (did a program holding the job's secret "
                           "write over it?)")
    return decoded


def bitwise_and(values):
    """The bitwise AND of integer flags (-1 for none): what an agreement gives."""
    out = -1
    for v in values:
        out &= int(v)
    return out


def _value(store, key):
    """The value of `key`, or None while it is absent (one request)."""
    try:
        return store.get(key, timeout=0.0)
    except GpucollTimeout:
        return None


def failed_world_ranks(store, key=FAILED):
    """The world ranks gpurun has recorded as failed (an empty set before any, or without gpurun);
    key=ENDED: those it recorded as ended well."""
    value = _value(store, key)
    return set(record(key, value, "failed")) if value is not None else set()


def announce_revoke(store, comm_id, first):
    """Tell every rank's watcher that communicator `comm_id` is revoked: the first free key from
    revoke_key(first) on (the watcher of this process has read those before it), one request
    unless others revoke at the same time. Returns the key's number."""
    n, mine = first, comm_id.encode()
    while store.compare_set(revoke_key(n), None, mine) != mine:
        n += 1
    return n


def agree(store, name, world_ranks, rank, flag, has_ended, timeout, values=True):
    """One fault-tolerant agreement among the ranks `world_ranks` of a communicator (this
    process is `rank` of them), named `name` (the same on every rank, never reused).

    Returns (the bitwise AND of the flags of the ranks counted, the ranks of the communicator
    that the decision counts as failed), the same on every survivor. `has_ended(world_rank)`
    says what this process sees itself (same host); the store says what gpurun saw, read when a
    wait for the others' posts times out. Without `values` (a shrink) the value is -1. Three
    requests per rank when no rank dies during it (four with values): post, one wait for the
    others' posts, (their flags,) offer."""
    flags = f"gpucoll/ft/agree/{name}/f/"
    decision_key = f"gpucoll/ft/agree/{name}/decision"
    store.set(flags + str(rank), str(int(flag)).encode())
    n = len(world_ranks)
    deadline = time.monotonic() + timeout
    dead, gone = set(), set()
    while True:
        dead |= {r for r, w in enumerate(world_ranks) if r != rank and (w in gone or has_ended(w))}
        waiting = [flags + str(r) for r in range(n) if r != rank and r not in dead]
        left = deadline - time.monotonic()
        try:
            store.wait(waiting, timeout=max(0.0, min(_POLL_S, left)))
            break
        except GpucollTimeout:
            decided = _value(store, decision_key)
            if decided is not None:   # another survivor has decided: what it saw is the answer
                decided = record(decision_key, decided, "decision")
                return decided["value"], set(decided["failed"])
            gone = failed_world_ranks(store)
            if left <= 0:
                missing = [r for r in range(n) if r not in dead and _value(store, flags + str(r)) is None]
                err = GpucollTimeout(f"agreement {name}: rank(s) {', '.join(map(str, missing))} neither took "
                                     f"part nor failed within {timeout:g} s")
                err.ranks = tuple(missing)
                raise err from None
    # A rank that posted before it died is counted: the decision says so for every survivor.
    failed = {r for r in dead if _value(store, flags + str(r)) is None}
    value = -1
    if values:
        if failed:
            posted = {r: _value(store, flags + str(r)) for r in range(n) if r not in failed}
        else:
            posted = dict(enumerate(store.gather(flags, n, timeout=1.0)))
        value = bitwise_and(record(flags + str(r), v, "flag") for r, v in posted.items() if v is not None)
    offer = json.dumps({"value": value, "failed": sorted(failed)}).encode()
    decided = record(decision_key, store.compare_set(decision_key, None, offer), "decision")
    return decided["value"], set(decided["failed"])


class FailureBoard:
    """gpurun's side: the ranks it saw fail, and those it saw end well (StoreServer.put_threadsafe
    from its loop)."""

    def __init__(self, server):
        self._server = server
        self.failed = []
        self.ended = []

    def record(self, world_rank):
        self.failed.append(world_rank)
        self._server.put_threadsafe(FAILED, json.dumps(self.failed).encode())

    def ended_well(self, world_rank):
        self.ended.append(world_rank)
        self._server.put_threadsafe(ENDED, json.dumps(self.ended).encode())

    def replaced(self, world_rank, replacement, why=None):
        """Say which world rank replaces failed `world_rank` (None: none will, because `why`)."""
        answer = {"world_rank": replacement} if replacement is not None else {"none": why}
        self._server.put_threadsafe(replacement_key(world_rank), json.dumps(answer).encode())

