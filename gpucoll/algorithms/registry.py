"""Which schedule generator implements which (collective, algorithm), and one door to all of them.

    from gpucoll.algorithms import schedule
    s = schedule("bcast", "tree", rank=2, size=8, count=1 << 20, root=3)

Generators are cached (functools.lru_cache), so asking again for the same call is a dict lookup.
"""
from ..base.errors import InvalidUsageError
from . import dissemination, linear, pairwise, rhd, ring, tree

# collective -> {algorithm: generator}. Order is the order `gpucoll info` lists them.
GENERATORS = {
    "allreduce": {"ring": ring.allreduce, "tree": tree.allreduce, "rhd": rhd.allreduce,
                  "rd": rhd.allreduce_doubling},
    "reduce_scatter_block": {"ring": ring.reduce_scatter_block, "rhd": rhd.reduce_scatter_block},
    "allgather": {"ring": ring.allgather, "rhd": rhd.allgather},
    "bcast": {"tree": tree.bcast, "ring": ring.bcast},
    "reduce": {"tree": tree.reduce, "ring": ring.reduce},
    "gather": {"tree": tree.gather, "linear": linear.gather},
    "scatter": {"tree": tree.scatter, "linear": linear.scatter},
    "alltoall": {"pairwise": pairwise.alltoall},
    "barrier": {"dissemination": dissemination.barrier},
}

COLLECTIVES = tuple(GENERATORS)
ROOTED = frozenset({"bcast", "reduce", "gather", "scatter"})
# Other spellings callers use for the same collective.
ALIASES = {"reduce_scatter": "reduce_scatter_block"}


def canonical(collective):
    """The registry's name of `collective` ("reduce_scatter" -> "reduce_scatter_block")."""
    return ALIASES.get(collective, collective) if isinstance(collective, str) else collective


def algorithms(collective):
    """Names of the schedule algorithms for `collective`."""
    return tuple(_generators(collective))


def _generators(collective):
    try:
        return GENERATORS[canonical(collective)]
    except (KeyError, TypeError):
        raise InvalidUsageError(f"unknown collective {collective!r}; "
                                f"known: {', '.join(COLLECTIVES)}") from None


def schedule(collective, algorithm, rank, size, count=0, root=0, inplace=True):
    """The Schedule of `rank` for one call of `collective` by `algorithm`.

    `count` is MPI's: elements of the vector (allreduce, bcast, reduce), per rank (allgather,
    gather, scatter, reduce_scatter_block's result) or per peer (alltoall). `root` is used by
    rooted collectives only. `inplace` matters to alltoall only (see pairwise.alltoall); every
    other schedule is correct whether or not buffers 0 and 1 alias."""
    gens = _generators(collective)
    collective = canonical(collective)
    try:
        gen = gens[algorithm]
    except (KeyError, TypeError):
        raise InvalidUsageError(f"{collective} has no algorithm {algorithm!r}; "
                                f"choose from {', '.join(gens)}") from None
    if collective in ROOTED:
        if root is None:
            raise InvalidUsageError(f"{collective} needs a root")
        return gen(rank, size, count, root)
    if collective == "alltoall":
        return gen(rank, size, count, bool(inplace))
    return gen(rank, size, count)
