"""MPI's Spawn through the job's store: what the parents' root, gpurun and the children say.

The processes a Spawn starts get the next world ranks of the job (after every process started
before them), so that the parents and the children reach each other as any two ranks do. The
exchange, for spawn number k (from the counter key):

1. the parents' root sets `gpucoll/spawn/k/parents` (the parents' world ranks and what their
   Context knows of each: pid, host, TCP address), then `gpucoll/spawn/k/request` (commands,
   process counts, working directories);
2. gpurun, which watches the request keys, starts the children with GPUCOLL_SPAWN=k:base
   and answers `gpucoll/spawn/k/started` (the first world rank, or why it could not start them);
3. each child joins its own COMM_WORLD (the bootstrap's keys under `spawn/k/`), reads the
   parents' record and sets `gpucoll/spawn/k/child/i` and `gpucoll/universe/w` (its entry);
4. the parents' root gathers the children's entries and gives them to the other parents. A
   child that ends before it joined is reported by gpurun in `gpucoll/spawn/k/failed`.

Any process can read `gpucoll/universe/w` to learn a spawned process it has not heard of (a
child that reaches a parent before the parent's Spawn has returned).
"""
import json
import time

from ..base.errors import GpucollError
from ..base.errors import TimeoutError as GpucollTimeout

COUNT = "gpucoll/spawn/count"
SERVICE = "gpucoll/spawn/service"   # set by a launcher that starts spawned processes (gpurun on one host):
                                    # {"universe_size": --universe-size where its user gave it, else null}
PREFIX = "gpucoll/spawn/"
REQUEST = "/request"


def key(k, what):
    return f"{PREFIX}{k}/{what}"


def universe_key(world_rank):
    return f"gpucoll/universe/{world_rank}"


def spawn_of(request_key):
    """The spawn number of a request key, or None for any other key."""
    if not request_key.startswith(PREFIX) or not request_key.endswith(REQUEST):
        return None
    middle = request_key[len(PREFIX):-len(REQUEST)]
    return int(middle) if middle.isdigit() else None


class SpawnFailed(GpucollError):
    """The children could not be started, or one ended before it joined."""


def _load(data):
    return json.loads(data.decode() if isinstance(data, bytes) else data)


def request(store, parents, entries, commands, maxprocs, wdirs, timeout):
    """At the parents' root: start the children and wait until every one has joined.

    parents: the parents' world ranks; entries: {world rank: entry} of them; commands: one argv
    per command; maxprocs: processes of each. Returns (k, base, {world rank: entry} of the
    children). Raises SpawnFailed saying why, GpucollTimeout after `timeout` seconds."""
    try:
        store.get(SERVICE, timeout=0.001)
    except GpucollTimeout:
        raise SpawnFailed("the launcher of this job does not start processes: Spawn needs a job that "
                          "gpurun started on one host (not srun, mpiexec, torchrun or gpurun --hosts)") from None
    k = store.add(COUNT, 1)
    store.set(key(k, "parents"), json.dumps({"ranks": list(parents),
                                              "entries": {str(w): e for w, e in entries.items()}}).encode())
    store.set(key(k, "request"), json.dumps({"commands": commands, "maxprocs": maxprocs,
                                              "wdirs": wdirs}).encode())
    started = _load(store.get(key(k, "started"), timeout=timeout))
    if started.get("error"):
        raise SpawnFailed(started["error"])
    base, total = started["base"], sum(maxprocs)
    deadline = time.monotonic() + timeout
    while True:
        try:
            joined = store.gather(key(k, "child/"), total, timeout=0.2)
            break
        except GpucollTimeout:
            failed = _failed(store, k)
            if failed is not None:
                raise SpawnFailed(f"spawned process {failed['index']} (world rank {failed['rank']}, "
                                  f"{failed['command']!r}) ended before it joined: {failed['how']}") from None
            if time.monotonic() > deadline:
                raise GpucollTimeout(f"Spawn: not every one of the {total} spawned processes joined within "
                                     f"{timeout:g} s (GPUCOLL_INIT_TIMEOUT)") from None
    return k, base, {base + i: _load(e) for i, e in enumerate(joined)}


def _failed(store, k):
    try:
        return _load(store.get(key(k, "failed"), timeout=0.001))
    except GpucollTimeout:
        return None


def announce(store, world_rank, entry):
    """Make this process's entry known to any process of the job (look_up)."""
    store.set(universe_key(world_rank), json.dumps(entry).encode())


def join(store, k, index, world_rank, entry, timeout):
    """In a child: tell the parents this process's entry; return the parents' record
    (their world ranks, and {world rank: entry})."""
    record = _load(store.get(key(k, "parents"), timeout=timeout))
    announce(store, world_rank, entry)
    store.set(key(k, f"child/{index}"), json.dumps(entry).encode())
    return record["ranks"], {int(w): e for w, e in record["entries"].items()}


def universe_size(store):
    """The number of processes the launcher lets run at once when its user set it, else None."""
    try:
        return _load(store.get(SERVICE, timeout=0.001)).get("universe_size")
    except GpucollTimeout:
        return None


def look_up(store, world_rank, timeout):
    """The entry of a spawned process (it sets it as it joins)."""
    return _load(store.get(universe_key(world_rank), timeout=timeout))
