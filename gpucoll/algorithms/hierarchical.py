"""The cost model of the hierarchical all-reduce (run by gpucoll/engines/hierarchical.py).

Three phases, each an ordinary collective on a sub-communicator: reduce to the host's leader
inside each host (shared memory), all-reduce among the leaders (TCP), bcast inside each host.
Against the flat schedule, by the selector's links and table::

    flat, hier = costs(nbytes, size, local_max, nhosts)
"""
from . import selector


def costs(nbytes, size, local_max, nhosts, inter="tcp", intra="shm"):
    """(flat seconds, hierarchical seconds) by the cost model."""
    flat = min(selector.cost("allreduce", a, nbytes, size, inter) for a in selector.candidates("allreduce", inter))
    cross = min(selector.cost("allreduce", a, nbytes, nhosts, inter)
                for a in selector.candidates("allreduce", inter))
    inside = 0.0
    if local_max > 1:
        inside = (selector.cost("reduce", "direct", nbytes, local_max, intra)
                  + selector.cost("bcast", "direct", nbytes, local_max, intra))
    return flat, cross + inside
