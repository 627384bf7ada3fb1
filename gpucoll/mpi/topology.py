"""Process topologies (Cartesian grids, graphs, distributed graphs) and their constructors.

A topology communicator is an intracommunicator (a gpucoll Communicator) whose state also
holds its topology: a Cartesian grid, a graph (every rank knows every edge) or a distributed
graph (each rank knows its own in- and out-neighbours). Ranks are never reordered (`reorder`
is allowed and ignored, as MPI allows): rank i of the new communicator is rank i of the old,
so Cart_map and Graph_map name the same ranks. This module describes who the neighbours
are; topocomm.py has the communicator classes and neighbor.py the neighbourhood collectives.
"""
import operator

from ..base.errors import InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C
from .kinds import kind as communicator_kind

UNDEFINED, PROC_NULL = _C["UNDEFINED"], _C["PROC_NULL"]
CART, GRAPH, DIST_GRAPH = _C["CART"], _C["GRAPH"], _C["DIST_GRAPH"]
UNWEIGHTED, WEIGHTS_EMPTY = _C["UNWEIGHTED"], _C["WEIGHTS_EMPTY"]
ERR_TOPOLOGY, ERR_DIMS, ERR_ARG = _C["ERR_TOPOLOGY"], _C["ERR_DIMS"], _C["ERR_ARG"]


def comm_error(message, error_class):
    return InvalidUsageError(message, error_class=error_class)


# --- argument checks (ValueError for a length mismatch, as in mpi4py) ---------------------------
def _ints(values, what, name, length=None):
    try:
        out = [operator.index(v) for v in values]
    except TypeError:
        raise TypeError(f"{what}: {name} must be a sequence of integers, not {values!r}") from None
    if length is not None and len(out) != length:
        raise ValueError(f"{what}: {len(out)} {name} given, expected {length}")
    return out


def _periods(periods, ndims, what):
    if periods is None:
        periods = False
    if isinstance(periods, bool):
        periods = [periods] * ndims
    return [int(bool(p)) for p in _ints(periods, what, "periods", ndims)]


def _weights(weights, count, what):
    """None (unweighted), [] (MPI.WEIGHTS_EMPTY) or the weights."""
    if weights is None or _is_constant(weights, UNWEIGHTED):
        return None
    if _is_constant(weights, WEIGHTS_EMPTY):
        if count > 0:
            raise ValueError(f"{what}: MPI.WEIGHTS_EMPTY given for {count} edges")
        return []
    return _ints(weights, what, "weights", count)


def _is_constant(value, constant):
    return isinstance(value, int) and not isinstance(value, bool) and value == constant


def _product(dims):
    n = 1
    for d in dims:
        n *= d
    return n


def _graph_arrays(index, edges, what):
    """(index, edges) with mpi4py's extension: an index with a leading 0 (CSR offsets) is accepted."""
    index, edges = _ints(index, what, "index"), _ints(edges, what, "edges")
    if index and index[0] == 0 and index[-1] == len(edges) and len(index) > 1:
        index = index[1:]
    prev = 0
    for i in index:
        if i < prev or i > len(edges):
            raise comm_error(f"{what}: index {index} is not a non-decreasing list of offsets into {len(edges)} "
                             "edges", ERR_ARG)
        prev = i
    return index, edges


# --- the topologies -------------------------------------------------------------------------------
class CartTopology:
    """A Cartesian topology: dims and periods; ranks map to coordinates in row-major order."""

    kind = CART

    def __init__(self, dims, periods):
        self.dims, self.periods = list(dims), list(periods)

    def coords(self, rank):
        out = []
        for d in reversed(self.dims):  # row-major: the last dimension varies fastest
            out.append(rank % d)
            rank //= d
        return out[::-1]

    def rank_of(self, coords, what="Get_cart_rank"):
        coords = _ints(coords, what, "coordinates", len(self.dims))
        rank = 0
        for c, d, p in zip(coords, self.dims, self.periods):
            if p:
                c %= d
            elif not 0 <= c < d:
                raise comm_error(f"{what}: coordinate {c} is outside a non-periodic dimension of size {d}",
                                 _C["ERR_RANK"])
            rank = rank * d + c
        return rank

    def shift(self, rank, direction, disp):
        if not 0 <= direction < len(self.dims):
            raise comm_error(f"Shift: direction {direction} is not one of the {len(self.dims)} dimensions",
                             ERR_DIMS)
        coords = self.coords(rank)

        def moved(by):
            c = coords[direction] + by
            d = self.dims[direction]
            if self.periods[direction]:
                c %= d
            elif not 0 <= c < d:
                return PROC_NULL
            return self.rank_of(coords[:direction] + [c] + coords[direction + 1:])
        return moved(-disp), moved(disp)

    def neighbors(self, rank):
        out = []
        for direction in range(len(self.dims)):
            out.extend(self.shift(rank, direction, 1))
        return out, list(out)


class GraphTopology:
    """A graph topology: MPI's index and edges arrays."""

    kind = GRAPH

    def __init__(self, index, edges):
        self.index, self.edges = list(index), list(edges)

    def of(self, rank, what="Get_neighbors"):
        if not 0 <= rank < len(self.index):
            raise comm_error(f"{what}: rank {rank} is not a node of a graph of {len(self.index)} nodes",
                             _C["ERR_RANK"])
        return self.edges[(self.index[rank - 1] if rank else 0):self.index[rank]]

    def neighbors(self, rank):
        out = self.of(rank)
        return out, list(out)


class DistGraphTopology:
    """A distributed graph topology: this rank's sources and destinations, with weights or None."""

    kind = DIST_GRAPH

    def __init__(self, sources, destinations, sourceweights, destweights):
        self.sources, self.destinations = list(sources), list(destinations)
        self.weights = None if sourceweights is None and destweights is None else (
            list(sourceweights or [1] * len(sources)), list(destweights or [1] * len(destinations)))

    def neighbors(self, rank):
        return list(self.sources), list(self.destinations)


def _make(parent, kind, topology, members, what):
    """The topology communicator of `members` (parent ranks, in order; the others get COMM_NULL)."""
    cls = communicator_kind(kind)
    core = parent._c(what)
    new = core.Split(0 if core.rank in members else None, 0)
    if new is None:
        return cls()
    handle = cls._wrap(new)
    handle._s.topo = topology
    return handle


class TopologyMaker:
    """Intracomm's topology constructors (mixed into MPI.Intracomm)."""

    __slots__ = ()

    def Create_cart(self, dims, periods=None, reorder=False):
        """A Cartesian grid of dims over the first prod(dims) ranks (the others get COMM_NULL)."""
        dims = _ints(dims, "Create_cart", "dims")
        periods = _periods(periods, len(dims), "Create_cart")
        size = self._c("Create_cart").size
        if any(d <= 0 for d in dims) or _product(dims) > size:
            raise comm_error(f"Create_cart: a grid of {dims} does not fit a communicator of {size} ranks",
                             ERR_DIMS)
        return _make(self, "Cartcomm", CartTopology(dims, periods), range(_product(dims)), "Create_cart")

    def Cart_map(self, dims, periods=None):
        """This rank's rank in the grid Create_cart would make (UNDEFINED when outside it)."""
        dims = _ints(dims, "Cart_map", "dims")
        _periods(periods, len(dims), "Cart_map")
        rank = self._c("Cart_map").rank
        return rank if rank < _product(dims) else UNDEFINED

    def Create_graph(self, index, edges, reorder=False):
        """A graph: node i's neighbours are edges[index[i-1]:index[i]] (nodes beyond the graph get
        COMM_NULL)."""
        index, edges = _graph_arrays(index, edges, "Create_graph")
        size = self._c("Create_graph").size
        if len(index) > size or any(not 0 <= e < len(index) for e in edges):
            raise comm_error(f"Create_graph: a graph of {len(index)} nodes with edges {edges} does not fit a "
                             f"communicator of {size} ranks", ERR_TOPOLOGY)
        return _make(self, "Graphcomm", GraphTopology(index, edges), range(len(index)), "Create_graph")

    def Graph_map(self, index, edges):
        index, _ = _graph_arrays(index, edges, "Graph_map")
        rank = self._c("Graph_map").rank
        return rank if rank < len(index) else UNDEFINED

    def Create_dist_graph_adjacent(self, sources, destinations, sourceweights=None, destweights=None, info=None,
                                   reorder=False):
        """A distributed graph given by each rank's own in-neighbours (sources) and out-neighbours."""
        what = "Create_dist_graph_adjacent"
        sources = [] if sources is None else _ints(sources, what, "sources")
        destinations = [] if destinations is None else _ints(destinations, what, "destinations")
        sw = _weights(sourceweights, len(sources), what)
        dw = _weights(destweights, len(destinations), what)
        self._check_ranks(sources + destinations, what)
        weighted = sw is not None or dw is not None
        topology = DistGraphTopology(sources, destinations, sw if weighted else None, dw if weighted else None)
        return _make(self, "Distgraphcomm", topology, range(self.size), what)

    def Create_dist_graph(self, sources, degrees, destinations, weights=None, info=None, reorder=False):
        """A distributed graph given by any edges from any rank: edge sources[i] -> each of its
        degrees[i] destinations. Every rank learns its in- and out-neighbours (collective)."""
        what = "Create_dist_graph"
        sources = _ints(sources, what, "sources")
        degrees = _ints(degrees, what, "degrees", len(sources))
        destinations = _ints(destinations, what, "destinations", sum(degrees))
        weights = _weights(weights, len(destinations), what)
        self._check_ranks(sources + destinations, what)
        edges, at = [], 0
        for src, degree in zip(sources, degrees):
            for k in range(degree):
                edges.append((src, destinations[at + k], None if weights is None else weights[at + k]))
            at += degree
        core = self._c(what)
        table = core.allgather((edges, weights is not None))
        weighted = any(w for _, w in table)
        me = core.rank
        ins = [(s, w) for rank_edges, _ in table for s, d, w in rank_edges if d == me]
        outs = [(d, w) for s, d, w in edges if s == me]
        topology = DistGraphTopology([s for s, _ in ins], [d for d, _ in outs],
                                     [1 if w is None else w for _, w in ins] if weighted else None,
                                     [1 if w is None else w for _, w in outs] if weighted else None)
        return _make(self, "Distgraphcomm", topology, range(core.size), what)

    def _check_ranks(self, ranks, what):
        size = self._c(what).size
        bad = [r for r in ranks if not 0 <= r < size]
        if bad:
            raise comm_error(f"{what}: ranks {bad} are not in a communicator of size {size}", _C["ERR_RANK"])
