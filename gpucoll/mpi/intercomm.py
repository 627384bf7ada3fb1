"""Intercommunicators: MPI.Intercomm, Intracomm.Create_intercomm, Merge, and their collectives.

An intercommunicator joins two disjoint groups. Its state holds the local group's own gpucoll
Communicator (`core`: ranks, size, the local group) and a `bridge`: a gpucoll Communicator over
both groups, remote group first, that both sides name alike (so their messages meet) but that
each side lists in its own order. On this side's bridge, rank j IS remote rank j, so the
point-to-point methods (pointtopoint.py) run on it unchanged, and local rank i is bridge rank
R + i (R: the remote size). Collectives across the two groups are point-to-point messages over
the bridge, posted at the call (as the vector collectives, collectives.py `_vector`), with MPI's
root convention: the root passes MPI.ROOT, the rest of its group MPI.PROC_NULL, and the other
group the root's rank in the remote group. Reductions fold the remote group's contributions in
rank order.
"""
import numpy as np

from ..api import comm as _core
from ..base.errors import InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C
from . import attributes as _attrs
from . import message as _m
from .collectives import _fold, _no_gpu, _wait_if, _wblocks
from .comm import Comm, Intracomm, comm_error, name_count
from .composite import VCOLL_TAG, Composite, done
from .group import Group
from .kinds import register
from .op import as_op, check
from .ports import side_key
from .request import Request
from .staging import device_buffer, staged, through_host

ROOT, PROC_NULL, UNDEFINED = _C["ROOT"], _C["PROC_NULL"], _C["UNDEFINED"]
ERR_ROOT, ERR_COMM, ERR_RANK = _C["ERR_ROOT"], _C["ERR_COMM"], _C["ERR_RANK"]


class InterSide:
    """What an intercommunicator knows of the other group, and its bridge."""

    __slots__ = ("remote", "bridge", "children")

    def __init__(self, remote, bridge):
        self.remote = tuple(remote)  # the remote group's world ranks, in its rank order
        self.bridge = bridge          # gpucoll Communicator: remote ranks, then local ranks
        self.children = 0             # Dup/Split/Merge counter: names children alike on every rank


def _bridge(ctx, name, local, remote):
    return _core.Communicator(ctx, name, tuple(remote) + tuple(local))


def _attach(handle, remote, bridge):
    """Make handle the intercommunicator of its group with `remote` over `bridge`: point to point
    runs on the bridge, whose short paths reach the remote group's ranks only (its first ones)."""
    handle._s.inter = InterSide(remote, bridge)
    handle._s.run_on(bridge.seam)
    bridge.seam.p2p.short.peers = len(remote)
    return handle


def make(local_core, remote, my_key, their_key, cls=None):
    """The Intercomm of local_core with the remote group (world ranks); the bridge is named by
    both sides' keys, lower group first, so that both sides give it the same name."""
    keys = sorted([my_key, their_key], key=lambda k: int(k.rsplit("@", 1)[1]))
    bridge = _bridge(local_core.seam.context, f"ic[{keys[0]}|{keys[1]}]", local_core.world_ranks, remote)
    return _attach((cls or Intercomm)._wrap(local_core), remote, bridge)


def create_intercomm(intra, local_leader, peer_comm, remote_leader, tag):
    """Intracomm.Create_intercomm: the leaders swap their groups over peer_comm (with tag), then
    each tells its own group."""
    core = intra._c("Create_intercomm")
    if not 0 <= local_leader < core.size:
        raise comm_error(f"Create_intercomm: local leader {local_leader} is out of range for a group of "
                         f"{core.size}", ERR_RANK)
    n = intra._s.children[("inter",)] = intra._s.children.get(("inter",), 0) + 1
    mine = (core.world_ranks, side_key(core.world_ranks, core.seam.id, n))
    theirs = None
    if core.rank == local_leader:
        peer = peer_comm._c("Create_intercomm")
        peer.send(mine, remote_leader, tag)  # sends are eager: both leaders send first
        theirs = peer.recv(None, remote_leader, tag)
    remote, key = core.bcast(theirs, local_leader)
    if set(remote) & set(core.world_ranks):
        raise comm_error("Create_intercomm: the two groups overlap", ERR_COMM)
    return make(core.Dup(), remote, mine[1], key)


@register
class Intercomm(Comm):
    """An intercommunicator: point to point and collectives between two disjoint groups."""

    __slots__ = ()

    @classmethod
    def _accepts(cls, other):
        return other._s is None or other._s.inter is not None

    @staticmethod
    def _from_leaders(intra, local_leader, peer_comm, remote_leader, tag):
        """Intracomm.Create_intercomm (which finds this class by name, kinds.py)."""
        return create_intercomm(intra, local_leader, peer_comm, remote_leader, tag)

    @classmethod
    def _joined(cls, local_core, remote, my_key, their_key):
        """The intercommunicator of Accept and Connect (ports.py), as make() builds it."""
        return make(local_core, remote, my_key, their_key, cls)

    def _c(self, what="communicator"):
        """The bridge (remote ranks first): what point to point and the collectives use."""
        super()._c(what)
        return self._s.inter.bridge

    def _local(self, what):
        super()._c(what)
        return self._s.core

    # --- point to point: pointtopoint.py's methods on the bridge, ranks checked against the remote
    # group (the bridge's other ranks are this group's own)
    def _check_remote(self, rank, what, wildcard=False):
        rsize = self.Get_remote_size()
        if rank == PROC_NULL or (wildcard and rank == _C["ANY_SOURCE"]):
            return
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < rsize:
            raise InvalidUsageError(f"{what}: rank {rank!r} is out of range for a remote group of size {rsize}",
                                    error_class=ERR_RANK)

    def _send_bytes(self, buf, dest, what):
        self._check_remote(dest, what)
        return super()._send_bytes(buf, dest, what)

    def _irecv_state(self, buf, source, tag, what):
        self._check_remote(source, what, wildcard=True)
        return super()._irecv_state(buf, source, tag, what)

    def _find(self, source, tag, take, what):
        self._check_remote(source, what, wildcard=True)
        return super()._find(source, tag, take, what)

    # --- identity ----------------------------------------------------------------------------
    def Get_rank(self):
        return self._local("Get_rank").rank

    def Get_size(self):
        return self._local("Get_size").size

    rank = property(Get_rank)
    size = property(Get_size)

    def Get_group(self):
        return Group._from_ranks(self._local("Get_group").world_ranks)

    group = property(Get_group)

    def Get_remote_size(self):
        self._local("Get_remote_size")
        return len(self._s.inter.remote)

    def Get_remote_group(self):
        self._local("Get_remote_group")
        return Group._from_ranks(self._s.inter.remote)

    remote_size = property(Get_remote_size)
    remote_group = property(Get_remote_group)

    def Is_inter(self):
        self._local("Is_inter")
        return True

    is_inter = property(Is_inter)
    is_intra = property(lambda self: not self.Is_inter())

    # --- life cycle ------------------------------------------------------------------------------
    def _next(self):
        self._s.inter.children += 1
        return self._s.inter.children

    def _derived(self, local_core, remote, suffix):
        """A new intercomm of local_core with `remote`, its bridge named after this one's."""
        bridge_name = f"{self._s.inter.bridge.seam.id}.{suffix}"
        bridge = _bridge(local_core.seam.context, bridge_name, local_core.world_ranks, remote)
        return _attach(type(self)._wrap(local_core), remote, bridge)

    def Dup(self, info=None):
        """A new intercommunicator between the same groups (collective over both)."""
        core = self._local("Dup")
        new = self._derived(core.Dup(), self._s.inter.remote, f"d{self._next()}")
        new._s.errhandler = self._s.errhandler
        new._s.attrs = _attrs.copy_attrs(self, self._s.attrs)
        if info is not None and info:
            new._s.info = dict(info.items())
        return new

    def Free(self):
        """Release both the local communicator and the bridge (collective); the handle becomes null."""
        core = self._local("Free")
        _attrs.delete_all(self, self._s.attrs)
        if self._s.ctx is not None:
            for comm in self._s.ctx[0], self._s.ctx[2]:
                comm.Free()
        core.Free()
        self._s.inter.bridge.Free()
        self._s = None

    def _exchange_tables(self, mine, what):
        """Every local rank's `mine` and every remote rank's, through the leaders (rank 0 each)."""
        core, bridge = self._local(what), self._s.inter.bridge
        local = core.allgather(mine)
        remote = None
        if core.rank == 0:
            req = bridge.seam.p2p.irecv_object(0, VCOLL_TAG)
            bridge.seam.p2p.send_object(local, 0, VCOLL_TAG)
            remote = req.wait()
        return local, core.bcast(remote, 0)

    def Split(self, color=0, key=0):
        """Each group split by color; ranks of one color in both groups form a new intercomm
        (COMM_NULL where either side of a color is empty, or for UNDEFINED)."""
        core = self._local("Split")
        color = None if color == UNDEFINED else color
        local, remote = self._exchange_tables((color, key), "Split")
        n = self._next()
        mine = core.Split(color, key)
        if color is None:
            return Intercomm()
        others = sorted((k, r) for r, (c, k) in enumerate(remote) if c == color)
        if not others:
            mine.Free()
            return Intercomm()
        worlds = tuple(self._s.inter.remote[r] for _, r in others)
        return self._derived(mine, worlds, f"s{n}c{color}")

    def Split_type(self, split_type, key=0, info=None):
        """COMM_TYPE_SHARED: the ranks of each host in both groups; anything else: COMM_NULL."""
        core = self._local("Split_type")
        color = UNDEFINED
        if split_type == _C["COMM_TYPE_SHARED"]:
            hosts = sorted(set(core.seam.context.hosts))
            color = hosts.index(core.host)
        return self.Split(color, key)

    def Merge(self, high=False):
        """The intracommunicator of both groups: the group that passed high=False first (the
        group of the lower world ranks first when both passed the same)."""
        core = self._local("Merge")
        local, remote = self._exchange_tables(bool(high), "Merge")
        n = self._next()
        mine, theirs = local[0], remote[0]
        inter = self._s.inter
        first_local = (not mine and theirs) or (mine == theirs and min(core.world_ranks) < min(inter.remote))
        worlds = core.world_ranks + inter.remote if first_local else inter.remote + core.world_ranks
        return Intracomm._wrap(_core.Communicator(core.seam.context, f"{inter.bridge.seam.id}.m{n}", worlds))

    @classmethod
    def Create_from_groups(cls, local_group, local_leader, remote_group, remote_leader, stringtag="org.mpi4py",
                           info=None, errhandler=None):
        """The intercommunicator of two disjoint groups, without a parent communicator (collective
        over both groups; every process names both groups alike)."""
        from .comm import comm_world

        world = comm_world()._s.core
        lranks = tuple(local_group._st("Create_from_groups").ranks)
        rranks = tuple(remote_group._st("Create_from_groups").ranks)
        if world.seam.context.rank not in lranks:
            raise comm_error("Create_from_groups: this process is not in the local group", _C["ERR_GROUP"])
        if set(lranks) & set(rranks):
            raise comm_error("Create_from_groups: the two groups overlap", _C["ERR_GROUP"])
        name = f"fg[{stringtag}]"
        local = _core.Communicator(world.seam.context, f"{name}{name_count(name, lranks)}@{min(lranks)}", lranks)
        handle = make(local, rranks, f"{name}{name_count(name, lranks + rranks)}@{min(lranks)}",
                      f"{name}{name_count(name, lranks + rranks)}@{min(rranks)}", cls)
        if errhandler is not None:
            handle._s.errhandler = errhandler._s
        return handle

    # --- collectives across the groups -------------------------------------------------------------
    def _root(self, root, what):
        """The role: 'root' (this rank is the root), 'idle' (PROC_NULL) or the remote root's rank."""
        if root == ROOT:
            return "root"
        if root == PROC_NULL:
            return "idle"
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or \
                not 0 <= root < self.Get_remote_size():
            raise InvalidUsageError(f"{what}: root {root!r} is not MPI.ROOT, MPI.PROC_NULL or a rank of the remote "
                                    f"group of {self.Get_remote_size()}", error_class=ERR_ROOT)
        return int(root)

    def _post(self, what, sends, recvs, blocking, finish=None):
        state = self._vector(what, sends, recvs, None)
        if finish is not None:
            state = Composite([state], finish, f"I{what.lower()}")
        return _wait_if(state, blocking)

    def Barrier(self):
        self._barrier(True)

    def Ibarrier(self):
        return Request._of(self._barrier(False))

    def _barrier(self, blocking):
        """Returns once every rank of the remote group has entered it."""
        empty = np.zeros(0, np.uint8)
        peers = range(self.Get_remote_size())
        return self._post("Barrier", [(j, empty) for j in peers], [(j, _m.Msg(empty, 0, _byte())) for j in peers],
                          blocking)

    def Bcast(self, buf, root=0):
        self._bcast(buf, root, True)

    def _rooted(self, what, root, blocking, at_root, at_leaf):
        """A rooted collective across the groups: the root posts at_root()'s (sends, receives),
        each rank of the other group at_leaf(root's rank)'s, the root's group's others nothing."""
        role = self._root(root, what)
        if role == "idle":
            return _wait_if(done(name=f"I{what.lower()}"), blocking)
        sends, receives = at_root() if role == "root" else at_leaf(role)
        return self._post(what, sends, receives, blocking)

    @staticmethod
    def _host(buf, readonly, what, name):
        msg = _m.simple(buf, readonly, what=f"{what} {name}")
        _no_gpu(msg, what)
        return msg

    def _bcast(self, buf, root, blocking):
        if device_buffer(buf, "Bcast") is not None:  # the buffer through a host copy
            return staged("bcast", [(buf, True, "buf")], lambda host: self._bcast(host, root, blocking), blocking)

        def at_root():
            data = self._host(buf, True, "Bcast", "buf").data()
            return [(j, data) for j in range(self.Get_remote_size())], []
        return self._rooted("Bcast", root, blocking, at_root,
                            lambda role: ([], [(role, self._host(buf, False, "Bcast", "buf"))]))

    @through_host
    def _gather(self, sendbuf, recvbuf, root, blocking, vector=False):
        what = "Gatherv" if vector else "Gather"
        return self._rooted(
            what, root, blocking,
            lambda: ([], list(enumerate(_blocks_of(recvbuf, False, self.Get_remote_size(), vector, what)))),
            lambda role: ([(role, self._host(sendbuf, True, what, "sendbuf").data())], []))

    def _gatherv(self, sendbuf, recvbuf, root, blocking):
        return self._gather(sendbuf, recvbuf, root, blocking, True)

    @through_host
    def _scatter(self, sendbuf, recvbuf, root, blocking, vector=False):
        what = "Scatterv" if vector else "Scatter"

        def at_root():
            blocks = _blocks_of(sendbuf, True, self.Get_remote_size(), vector, what)
            return [(j, b.data()) for j, b in enumerate(blocks)], []
        return self._rooted(what, root, blocking, at_root,
                            lambda role: ([], [(role, self._host(recvbuf, False, what, "recvbuf"))]))

    def _scatterv(self, sendbuf, recvbuf, root, blocking):
        return self._scatter(sendbuf, recvbuf, root, blocking, True)

    @through_host
    def _allgather(self, sendbuf, recvbuf, blocking, vector=False):
        what = "Allgatherv" if vector else "Allgather"
        rsize = self.Get_remote_size()
        s = _m.simple(sendbuf, True, what=f"{what} sendbuf")
        _no_gpu(s, what)
        data = s.data()
        recvs = _blocks_of(recvbuf, False, rsize, vector, what)
        return self._post(what, [(j, data) for j in range(rsize)], list(enumerate(recvs)), blocking)

    def _allgatherv(self, sendbuf, recvbuf, blocking):
        return self._allgather(sendbuf, recvbuf, blocking, True)

    @through_host
    def _alltoall(self, sendbuf, recvbuf, blocking, kind=""):
        what = "Alltoall" + kind
        rsize = self.Get_remote_size()
        if kind == "w":
            sends = _wblocks(sendbuf, True, rsize, f"{what} sendbuf")
            recvs = _wblocks(recvbuf, False, rsize, f"{what} recvbuf")
        else:
            sends = _blocks_of(sendbuf, True, rsize, kind == "v", what)
            recvs = _blocks_of(recvbuf, False, rsize, kind == "v", what)
        return self._post(what, [(j, b.data()) for j, b in enumerate(sends)], list(enumerate(recvs)), blocking)

    def _alltoallv(self, sendbuf, recvbuf, blocking):
        return self._alltoall(sendbuf, recvbuf, blocking, "v")

    def _alltoallw(self, sendbuf, recvbuf, blocking):
        return self._alltoall(sendbuf, recvbuf, blocking, "w")

    def _reduced(self, what, recv, rec, sources, blocking, sends=()):
        """Receive one contribution (packed) from each remote rank in `sources` and fold them, in
        rank order, into recv (a Msg)."""
        out, copied = recv.elements()
        check(rec, out.dtype, recv.datatype)
        bufs = [np.empty(recv.nbytes, np.uint8) for _ in sources]
        parts = [(j, _m.Msg(buf, recv.nbytes, _byte())) for j, buf in zip(sources, bufs)]

        def finish():
            chunks = [buf.view(out.dtype) for buf in bufs]
            out[...] = _fold(chunks, rec, recv.datatype, len(chunks))
            if copied:
                recv.store(out.view(np.uint8))
        return self._post(what, list(sends), parts, blocking, finish)

    def Allreduce(self, sendbuf, recvbuf, op=None):
        self._allreduce(sendbuf, recvbuf, _SUM if op is None else op, True)

    @through_host
    def _allreduce(self, sendbuf, recvbuf, op, blocking):
        """This group's recvbuf = op over the remote group's sendbufs."""
        rec = as_op(op)
        s = _m.simple(sendbuf, True, what="Allreduce sendbuf")
        r = _m.simple(recvbuf, False, what="Allreduce recvbuf")
        _no_gpu(s, "Allreduce")
        _no_gpu(r, "Allreduce")
        data = s.data()
        rsize = self.Get_remote_size()
        return self._reduced("Allreduce", r, rec, range(rsize), blocking, [(j, data) for j in range(rsize)])

    @through_host
    def _reduce(self, sendbuf, recvbuf, op, root, blocking):
        role = self._root(root, "Reduce")
        rec = as_op(op)
        if role == "idle":
            return _wait_if(done(name="Ireduce"), blocking)
        if role == "root":
            r = _m.simple(recvbuf, False, what="Reduce recvbuf")
            _no_gpu(r, "Reduce")
            return self._reduced("Reduce", r, rec, range(self.Get_remote_size()), blocking)
        s = _m.simple(sendbuf, True, what="Reduce sendbuf")
        _no_gpu(s, "Reduce")
        return self._post("Reduce", [(role, s.data())], [], blocking)

    def _not_inter(self, *args, **kwargs):
        raise comm_error("Scan and Exscan are not defined on intercommunicators", ERR_COMM)

    _scan = _not_inter

    # --- Python objects ----------------------------------------------------------------------------
    def _objects(self, what, sends, sources):
        """Send (dest, obj) pairs and receive one object from each of sources, over the bridge."""
        p2p = self._c(what).seam.p2p
        recvs = [p2p.irecv_object(j, VCOLL_TAG) for j in sources]
        Composite([p2p.isend_object(obj, j, VCOLL_TAG) for j, obj in sends]).Wait()
        return [r.wait() for r in recvs]

    def barrier(self):
        self.Barrier()

    def bcast(self, obj, root=0):
        role = self._root(root, "bcast")
        if role == "root":
            self._objects("bcast", [(j, obj) for j in range(self.Get_remote_size())], [])
        elif role != "idle":
            return self._objects("bcast", [], [role])[0]
        return None

    def gather(self, sendobj, root=0):
        role = self._root(root, "gather")
        if role == "root":
            return self._objects("gather", [], range(self.Get_remote_size()))
        if role != "idle":
            self._objects("gather", [(role, sendobj)], [])
        return None

    def scatter(self, sendobj, root=0):
        role = self._root(root, "scatter")
        if role == "root":
            rsize = self.Get_remote_size()
            items = [None] * rsize if sendobj is None else list(sendobj)
            if len(items) != rsize:
                raise ValueError(f"scatter: {len(items)} objects for a remote group of {rsize}")
            self._objects("scatter", list(enumerate(items)), [])
        elif role != "idle":
            return self._objects("scatter", [], [role])[0]
        return None

    def allgather(self, sendobj):
        rsize = self.Get_remote_size()
        return self._objects("allgather", [(j, sendobj) for j in range(rsize)], range(rsize))

    def alltoall(self, sendobj):
        rsize = self.Get_remote_size()
        items = [None] * rsize if sendobj is None else list(sendobj)
        if len(items) != rsize:
            raise ValueError(f"alltoall: {len(items)} objects for a remote group of {rsize}")
        return self._objects("alltoall", list(enumerate(items)), range(rsize))

    def allreduce(self, sendobj, op=None):
        from .comm import _reduce_objects

        return _reduce_objects(self.allgather(sendobj), op)

    def reduce(self, sendobj, op=None, root=0):
        from .comm import _reduce_objects

        items = self.gather(sendobj, root)
        return None if items is None else _reduce_objects(items, op)

    def scan(self, *args, **kwargs):
        self._not_inter()

    exscan = scan


def commctx_inter(comm):
    """The tuple (a private duplicate of comm, a fresh tag, a private duplicate
    of the local group, whether this is the low group), mpi4py's MPI._commctx_inter, made on the
    first call (collective)."""
    from .comm import comm_lock

    with comm_lock(comm, "@commctx_inter"):
        state = comm._s
        if state.ctx is None:
            local = Intracomm._wrap(comm._local("_commctx_inter").Dup())
            low = min(state.core.world_ranks) < min(state.inter.remote)
            state.ctx = [comm.Dup(), 0, local, low]
        dup, tag, local, low = state.ctx
        state.ctx[1] = (tag + 1) % (2**31 - 1)
        return dup, tag, local, low


def _byte():
    from .datatype import NAMES

    return NAMES["BYTE"]


def _blocks_of(msg, readonly, count, vector, what):
    """count per-rank Msgs of a buffer argument (vector: [buf, counts, displs, type])."""
    if vector:
        v = _m.vector(msg, readonly, 0, count, what=f"{what} {'sendbuf' if readonly else 'recvbuf'}")
        return [v.block(k) for k in range(count)]
    m = _m.simple(msg, readonly, 0, count, what=f"{what} {'sendbuf' if readonly else 'recvbuf'}")
    _no_gpu(m, what)
    step = m.count * m.t.extent if m.t is not None else 0
    return [m.sub(k * step, m.count) for k in range(count)]


def _sum():
    from .op import PREDEFINED

    return PREDEFINED["SUM"]


_SUM = _sum()
