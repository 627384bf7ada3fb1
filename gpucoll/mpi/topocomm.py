"""The topology communicator classes: MPI.Topocomm, Cartcomm, Graphcomm and Distgraphcomm.

Handles on intracommunicators whose state holds a topology (topology.py); the neighbourhood
collectives are mixed in from neighbor.py. A handle of one of these classes accepts only a
communicator of its topology (MPI.Cartcomm(graph) raises TypeError, as in mpi4py).
"""
from ..base.mpi_constants import INTEGERS as _C
from .comm import Intracomm, comm_error
from .kinds import register
from .neighbor import Neighborhood
from .topology import CartTopology, DistGraphTopology, GraphTopology


class Topocomm(Neighborhood, Intracomm):
    """A communicator with a process topology."""

    __slots__ = ()
    _topology = None  # the topology class a handle of this class needs (None: any)

    @classmethod
    def _accepts(cls, other):
        topo = getattr(other._s, "topo", None)
        if other._s is None:
            return True
        return topo is not None and (cls._topology is None or topo.kind == cls._topology.kind)

    def _t(self, what):
        self._c(what)
        return self._s.topo

    def Get_topology(self):
        return self._t("Get_topology").kind

    topology = property(Get_topology)
    is_topo = property(lambda self: True)

    @property
    def inoutedges(self):
        return self._t("inoutedges").neighbors(self.rank)

    inedges = property(lambda self: self.inoutedges[0])
    outedges = property(lambda self: self.inoutedges[1])
    degrees = property(lambda self: tuple(len(e) for e in self.inoutedges))
    indegree = property(lambda self: self.degrees[0])
    outdegree = property(lambda self: self.degrees[1])


@register
class Cartcomm(Topocomm):
    """A Cartesian grid of processes (row-major: the last coordinate varies fastest)."""

    __slots__ = ()
    _topology = CartTopology

    def Get_dim(self):
        return len(self._t("Get_dim").dims)

    dim = ndim = property(Get_dim)

    def Get_topo(self):
        """Return (dims, periods, coords of this rank)."""
        t = self._t("Get_topo")
        return list(t.dims), list(t.periods), t.coords(self.rank)

    topo = property(Get_topo)
    dims = property(lambda self: self.Get_topo()[0])
    periods = property(lambda self: self.Get_topo()[1])
    coords = property(lambda self: self.Get_topo()[2])

    def Get_cart_rank(self, coords):
        return self._t("Get_cart_rank").rank_of(coords)

    def Get_coords(self, rank):
        t = self._t("Get_coords")
        if not 0 <= rank < self.size:
            raise comm_error(f"Get_coords: rank {rank} is out of range for a grid of {self.size}", _C["ERR_RANK"])
        return t.coords(rank)

    def Shift(self, direction, disp):
        """Return (source, dest): the ranks disp steps back and forward along direction (PROC_NULL off a
        non-periodic edge)."""
        return self._t("Shift").shift(self.rank, direction, disp)

    def Sub(self, remain_dims):
        """The sub-grids that keep the dimensions where remain_dims is true (one per slice)."""
        t = self._t("Sub")
        remain = [bool(r) for r in remain_dims]
        if len(remain) != len(t.dims):
            raise ValueError(f"Sub: {len(remain)} entries in remain_dims for a grid of {len(t.dims)} dimensions")
        coords = t.coords(self.rank)
        color = 0
        for keep, c, d in zip(remain, coords, t.dims):
            if not keep:
                color = color * d + c
        new = self._c("Sub").Split(color, self.rank)
        handle = Cartcomm._wrap(new)
        handle._s.topo = CartTopology([d for k, d in zip(remain, t.dims) if k],
                                      [p for k, p in zip(remain, t.periods) if k])
        return handle


@register
class Graphcomm(Topocomm):
    """A graph of processes that every rank knows whole."""

    __slots__ = ()
    _topology = GraphTopology

    def Get_dims(self):
        t = self._t("Get_dims")
        return len(t.index), len(t.edges)

    dims = property(Get_dims)
    nnodes = property(lambda self: self.Get_dims()[0])
    nedges = property(lambda self: self.Get_dims()[1])

    def Get_topo(self):
        t = self._t("Get_topo")
        return list(t.index), list(t.edges)

    topo = property(Get_topo)
    index = property(lambda self: self.Get_topo()[0])
    edges = property(lambda self: self.Get_topo()[1])

    def Get_neighbors_count(self, rank):
        return len(self._t("Get_neighbors_count").of(rank, "Get_neighbors_count"))

    def Get_neighbors(self, rank):
        return list(self._t("Get_neighbors").of(rank))

    neighbors = property(lambda self: self.Get_neighbors(self.rank))
    nneighbors = property(lambda self: self.Get_neighbors_count(self.rank))


@register
class Distgraphcomm(Topocomm):
    """A distributed graph: each rank knows its own in- and out-neighbours."""

    __slots__ = ()
    _topology = DistGraphTopology

    def Get_dist_neighbors_count(self):
        """Return (indegree, outdegree, weighted)."""
        t = self._t("Get_dist_neighbors_count")
        return len(t.sources), len(t.destinations), t.weights is not None

    def Get_dist_neighbors(self):
        """Return (sources, destinations, (sourceweights, destweights) or None)."""
        t = self._t("Get_dist_neighbors")
        weights = None if t.weights is None else (list(t.weights[0]), list(t.weights[1]))
        return list(t.sources), list(t.destinations), weights
