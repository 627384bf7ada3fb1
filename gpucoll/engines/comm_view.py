"""What an engine may use of its communicator: a narrow view, never the Communicator.

The communicator makes one CommView and gives it to its dispatcher, which gives it to the
engines. Identity (ids, ranks, the bootstrap context for segment names, the store and
liveness), the path counters, the fast-path slots that the communicator's methods try first,
and a few collective services that the engines need for their own set-up, as callables::

    view.exchange(obj)                 # every rank's object, in rank order (pickled)
    view.exchange_into(row, table)     # host all-gather of arrays (fixed size)
    view.barrier()
    sub = view.subgroup(name, world_ranks)   # the view of a new communicator
    sub.run(call); sub.free()
"""


class FastPaths:
    """The packed fast paths a communicator's methods try before they build a Call: `host`
    (the native host path, cython_src/direct.pyx HostFast) and `gpu` (a repeated GPU
    all-reduce, gpucoll/engines/gpu/engine.py). Set by the engines once a call of theirs ran;
    None while there is none (and again after Free or a fork)."""

    __slots__ = ("host", "gpu")

    def __init__(self):
        self.host = self.gpu = None


class CommView:
    """A communicator as its engines see it (see the module docstring)."""

    __slots__ = ("ctx", "id", "name", "rank", "size", "local_size", "world_ranks", "stats", "fast",
                 "exchange", "exchange_into", "barrier", "run", "free", "revoked", "failed_among", "_subgroup")

    def __init__(self, ctx, comm_id, rank, size, local_size, world_ranks, stats, fast, *, exchange,
                 exchange_into, barrier, run, free, subgroup, revoked, failed_among):
        self.ctx, self.id, self.name = ctx, comm_id, comm_id
        self.rank, self.size, self.local_size, self.world_ranks = rank, size, local_size, tuple(world_ranks)
        self.stats, self.fast = stats, fast
        self.exchange, self.exchange_into, self.barrier = exchange, exchange_into, barrier
        self.run, self.free = run, free  # run(call): a blocking collective on this communicator
        self.revoked = revoked  # revoked(): a wait found the communicator revoked by another rank
        # failed_among(ranks): those of the given ranks that failed and are not acknowledged (ULFM)
        self.failed_among = failed_among
        self._subgroup = subgroup

    def subgroup(self, comm_id, world_ranks):
        """The view of a new communicator `comm_id` of these world ranks, made locally (every
        member must make it with the same name; nothing is exchanged)."""
        return self._subgroup(comm_id, world_ranks)

    def dead_ranks(self):
        """Ranks of this communicator whose process is known to have ended (this host's)."""
        ctx = self.ctx
        return [r for r, w in enumerate(self.world_ranks) if ctx.has_ended(w)]
