"""MPI.Comm and Intracomm, as handles on gpucoll Communicators (Intercomm: intercomm.py; the
topology communicators: topocomm.py).

A Comm is a handle: `MPI.Comm(c)` refers to the same communicator as `c`; MPI.COMM_WORLD wraps
gpucoll.COMM_WORLD itself (one communicator, not a duplicate). The buffer methods are in
collectives.py and pointtopoint.py (mixed in here); Python-object methods go to gpucoll's own.
"""
import os
import pickle

import numpy as np
import sys
import threading
import warnings
import zlib

from ..api import comm as _core
from ..api import world as _world
from ..base.errors import InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C
from ..engines.p2p.host import CommStateFields
from . import attributes as _attrs
from . import errhandler as _eh
from .collectives import Collectives, check_root
from .composite import done
from .group import Group
from .handle import Handle
from .info import Info
from .kinds import kind, register
from .op import as_op
from .partitioned import Partitioned
from .pointtopoint import MPIShortCalls, PointToPoint, issend_state
from .ports import Ports, join
from .spawn import Spawning, parent, universe_size
from .request import Request
from .topology import TopologyMaker
from .ulfm import FaultTolerance

UNDEFINED, ERR_COMM, ERR_ARG = _C["UNDEFINED"], _C["ERR_COMM"], _C["ERR_ARG"]
IDENT, CONGRUENT, SIMILAR, UNEQUAL = _C["IDENT"], _C["CONGRUENT"], _C["SIMILAR"], _C["UNEQUAL"]
TAG_UB = 2**31 - 1  # gpucoll's message tags are 32-bit


class _CommState(CommStateFields):
    """What every handle of one communicator shares (`short`, native: CommStateFields')."""

    __slots__ = ("core", "name", "errhandler", "attrs", "info", "children", "locks", "ctx", "topo", "inter", "cls",
                 "seam", "__weakref__")

    def __init__(self, core, name, cls):
        self.core, self.name = core, name
        self.errhandler = _eh.PREDEFINED["ERRORS_RETURN"]._s
        self.attrs, self.info = {}, {}
        self.children = {}  # Create_group: (group ranks, tag) -> how many made so far
        self.locks = {}     # _comm_lock: key -> threading.Lock
        self.ctx = None     # _commctx_intra: [private duplicate, next tag]
        self.topo = None    # a topology (topology.py) of a Cartcomm, Graphcomm or Distgraphcomm
        self.inter = None   # the remote side of an Intercomm (intercomm.py)
        self.cls = cls      # the handle class of this kind of communicator (what fromint returns)
        self.run_on(core.seam)

    def run_on(self, seam):
        """Point to point runs on seam's communicator (an Intercomm's: its bridge's); `short`, its
        short paths, is what the native Send/Isend/Recv/Irecv read (one attribute, not two)."""
        self.seam, self.short = seam, seam.short


def comm_error(message, error_class=ERR_COMM):
    return InvalidUsageError(message, error_class=error_class)


class Comm(Collectives, PointToPoint, Partitioned, FaultTolerance, Handle, MPIShortCalls):
    """A communicator handle; Comm() is MPI.COMM_NULL."""

    __slots__ = ()
    _kind = "comm"

    @classmethod
    def _wrap(cls, core, name=None):
        """A new communicator's handle (None -> the null handle)."""
        if core is None:
            return cls()
        kind = Intracomm if cls is Comm else cls
        return cls._of(_CommState(core, name if name is not None else "", kind))._register()

    @classmethod
    def fromint(cls, value):
        """The handle of that integer (toint()), of its communicator's class (an Intercomm, a
        Cartcomm, ...)."""
        handle = Handle.fromint.__func__(cls, value)
        return handle if handle._s is None else handle._s.cls._of(handle._s)

    f2py = fromhandle = fromint

    def _c(self, what="communicator"):
        """The gpucoll Communicator; raises for the null handle."""
        s = self._s
        if s is None:
            raise comm_error(f"{what}: the communicator is MPI.COMM_NULL")
        return s.core

    def __repr__(self):
        if self._s is None:
            return f"<gpucoll.MPI.{type(self).__name__} COMM_NULL>"
        return f"<gpucoll.MPI.{type(self).__name__} {self.Get_name() or self._s.core.seam.id} size {self.size}>"

    # --- identity -----------------------------------------------------------------------------
    def Get_rank(self):
        return self._c("Get_rank").rank

    def Get_size(self):
        return self._c("Get_size").size

    rank = property(Get_rank)
    size = property(Get_size)

    def Get_name(self):
        return "MPI_COMM_NULL" if self._s is None else self._s.name

    def Set_name(self, name):
        self._c("Set_name")
        self._s.name = str(name)

    name = property(Get_name, Set_name)

    def Get_group(self):
        return Group._from_ranks(self._c("Get_group").world_ranks)

    group = property(Get_group)

    def Is_inter(self):
        self._c("Is_inter")
        return False

    def Is_intra(self):
        return not self.Is_inter()

    is_inter = property(Is_inter)
    is_intra = property(Is_intra)

    def Get_topology(self):
        """CART, GRAPH or DIST_GRAPH for a topology communicator, else UNDEFINED."""
        self._c("Get_topology")
        return UNDEFINED if self._s.topo is None else self._s.topo.kind

    topology = property(Get_topology)
    is_topo = property(lambda self: self._s is not None and self._s.topo is not None)

    def Compare(self, comm):
        """IDENT (same communicator), CONGRUENT (same ranks in the same order; for intercommunicators,
        in both groups), SIMILAR (the same ranks), UNEQUAL. Also callable as MPI.Comm.Compare(c1, c2)."""
        comm1, comm2 = self, comm
        comm1._c("Compare"), comm2._c("Compare")
        if comm1._s is comm2._s:
            return IDENT
        sides = []
        for c in comm1, comm2:
            inter = c._s.inter
            sides.append((c._s.core.world_ranks, None if inter is None else inter.remote))
        (la, ra), (lb, rb) = sides
        if (ra is None) != (rb is None):
            return UNEQUAL
        if la == lb and ra == rb:
            return CONGRUENT
        same = sorted(la) == sorted(lb) and sorted(ra or ()) == sorted(rb or ())
        return SIMILAR if same else UNEQUAL

    # --- life cycle -----------------------------------------------------------------------------
    def _child(self, core):
        new = type(self)._wrap(core)
        new._s.cls, new._s.topo = self._s.cls, self._s.topo
        new._s.attrs = _attrs.copy_attrs(self, self._s.attrs)
        new._s.errhandler = self._s.errhandler
        return new

    def Dup(self, info=None):
        """A new communicator with the same ranks (collective)."""
        new = self._child(self._c("Dup").Dup())
        if info is not None and info:
            new._s.info = dict(info.items())
        return new

    def Dup_with_info(self, info):
        return self.Dup(info)

    def Clone(self):
        return self.Dup()

    def Idup(self, info=None):
        """Dup, done at once (a communicator's creation in gpucoll exchanges nothing); the request
        is complete."""
        return self.Dup(info), Request()

    def Idup_with_info(self, info):
        return self.Idup(info)

    def Free(self):
        """Release the communicator (collective); this handle becomes null."""
        core = self._c("Free")
        if self._s is _world_state() or self._s is _self_state():
            raise comm_error(f"Free: {self._s.name} is predefined and cannot be freed")
        if "_agree" in self._s.attrs:  # Iagree's own communicator (ulfm.py)
            self._s.attrs.pop("_agree").Free()
        _attrs.delete_all(self, self._s.attrs)
        if self._s.ctx is not None:
            self._s.ctx[0].Free()
        core.Free()
        self._s = None


    def Disconnect(self):
        self.Free()

    def Abort(self, errorcode=0):
        """End the job: this process exits with errorcode, and gpurun stops the other ranks."""
        sys.stderr.write(f"gpucoll.MPI: Abort({errorcode}) called on rank {_world.init().rank}\n")
        sys.stderr.flush()
        os._exit(errorcode if 0 <= errorcode < 256 else 1)

    def Split(self, color=0, key=0):
        """Ranks of one color form a new communicator, ordered by key; UNDEFINED gives COMM_NULL."""
        core = self._c("Split")
        if color == UNDEFINED:
            color = None
        return Intracomm._wrap(core.Split(color, key))

    def Split_type(self, split_type, key=0, info=None):
        """COMM_TYPE_SHARED: the ranks of this rank's host (shared memory); UNDEFINED: COMM_NULL."""
        core = self._c("Split_type")
        if split_type not in (_C["COMM_TYPE_SHARED"], UNDEFINED):
            # hardware-guided splits (MPI 4) need a resource description: as under MPI when none
            # is given, this rank is left out
            split_type = UNDEFINED
        color = None
        if split_type == _C["COMM_TYPE_SHARED"]:
            hosts = sorted({core.seam.context.hosts[w] for w in core.world_ranks})
            color = hosts.index(core.host)
        return Intracomm._wrap(core.Split(color, key))

    def Create(self, group):
        """The communicator of `group`'s processes (collective over this one); COMM_NULL elsewhere."""
        core = self._c("Create")
        ranks = tuple(group._st("Create").ranks)
        missing = [w for w in ranks if w not in core.world_ranks]
        if missing:
            raise comm_error(f"Create: world ranks {missing} of the group are not in the communicator",
                             _C["ERR_GROUP"])
        comm_id = core.seam.child_id("c")  # counted on every rank, members or not
        if core.seam.context.rank not in ranks:
            return Intracomm()
        return Intracomm._wrap(_core.Communicator(core.seam.context, comm_id, ranks))

    # --- info, error handlers, attributes -------------------------------------------------------
    def Get_info(self):
        return Info.Create(self._c("Get_info") and self._s.info)

    def Set_info(self, info):
        self._c("Set_info")
        self._s.info = dict(info.items()) if info else {}

    info = property(Get_info, Set_info)

    def Get_errhandler(self):
        self._c("Get_errhandler")
        return _eh.Errhandler._of(self._s.errhandler)

    def Set_errhandler(self, errhandler):
        self._c("Set_errhandler")
        if not errhandler:
            raise comm_error("Set_errhandler: the handler is MPI.ERRHANDLER_NULL", ERR_ARG)
        self._s.errhandler = errhandler._s

    def Call_errhandler(self, errorcode):
        self._c("Call_errhandler")
        _eh.invoke(self._s.errhandler, self, errorcode)

    @classmethod
    def Create_errhandler(cls, errhandler_fn):
        return _eh.create(errhandler_fn)

    def Get_attr(self, keyval):
        core = self._c("Get_attr")
        predefined = {_C["TAG_UB"]: TAG_UB, _C["IO"]: _C["ANY_SOURCE"], _C["WTIME_IS_GLOBAL"]: False,
                      _C["UNIVERSE_SIZE"]: universe_size(), _C["APPNUM"]: 0,
                      _C["LASTUSEDCODE"]: _last_used_code()}
        if keyval in predefined and self._s is _world_state():
            return predefined[keyval]
        if keyval in predefined:
            return None
        del core
        return _attrs.get_attr(self._s.attrs, keyval, "Comm")

    def Set_attr(self, keyval, attrval):
        self._c("Set_attr")
        _attrs.set_attr(self, self._s.attrs, keyval, attrval, "Comm")

    def Delete_attr(self, keyval):
        self._c("Delete_attr")
        _attrs.delete_attr(self, self._s.attrs, keyval, "Comm")

    @staticmethod
    def Create_keyval(copy_fn=None, delete_fn=None, nopython=False):
        return _attrs.create_keyval("Comm", copy_fn, delete_fn, nopython)

    @staticmethod
    def Free_keyval(keyval):
        return _attrs.free_keyval(keyval)

    # --- buffered sends: they are eager, so an attached buffer is only kept ----------------------
    def Attach_buffer(self, buf):
        self._c("Attach_buffer")
        self._s.attrs["_bsend_buffer"] = buf

    def Detach_buffer(self):
        self._c("Detach_buffer")
        buf = self._s.attrs.pop("_bsend_buffer", None)
        if buf is None:
            raise comm_error("Detach_buffer: no buffer is attached", _C["ERR_BUFFER"])
        return buf

    def Flush_buffer(self):
        """Buffered sends have all left (gpucoll's sends are eager)."""
        self._c("Flush_buffer")

    def Iflush_buffer(self):
        self._c("Iflush_buffer")
        return Request()

    @staticmethod
    def Join(fd):
        """The intercommunicator of this process and the one at the other end of the connected
        socket fd, a process of this job (gpucoll does not join other jobs)."""
        return join(fd)

    @classmethod
    def Get_parent(cls):
        """In a process that Spawn started, the intercommunicator with its parents; else MPI.COMM_NULL."""
        return parent()

    # --- Python objects (pickle): gpucoll's own methods -------------------------------------------
    def bcast(self, obj, root=0):
        core = self._c("bcast")
        with comm_lock(self, "bcast"):  # as mpi4py: one bcast of objects at a time per communicator
            return core.bcast(obj, check_root(core, root))

    def gather(self, sendobj, root=0):
        core = self._c("gather")
        return core.gather(sendobj, check_root(core, root))

    def scatter(self, sendobj, root=0):
        core = self._c("scatter")
        root = check_root(core, root)
        if core.rank == root:  # as in mpi4py: None scatters None, any iterable is taken as a sequence
            sendobj = [None] * core.size if sendobj is None else list(sendobj)
            if len(sendobj) != core.size:
                core.scatter(sendobj, root)  # raises on every rank, naming the length
        return core.scatter(sendobj, root)

    def allgather(self, sendobj):
        return self._c("allgather").allgather(sendobj)

    def alltoall(self, sendobj):
        core = self._c("alltoall")
        sendobj = [None] * core.size if sendobj is None else list(sendobj)  # as in mpi4py
        return core.alltoall(sendobj)

    def allreduce(self, sendobj, op=None):
        return _reduce_objects(self._c("allreduce").allgather(sendobj), op)

    def reduce(self, sendobj, op=None, root=0):
        core = self._c("reduce")
        root = check_root(core, root)
        items = core.gather(sendobj, root)
        return _reduce_objects(items, op) if core.rank == root else None

    def scan(self, sendobj, op=None):
        items = self._c("scan").allgather(sendobj)
        return _reduce_objects(items[:self.rank + 1], op)

    def exscan(self, sendobj, op=None):
        items = self._c("exscan").allgather(sendobj)
        return _reduce_objects(items[:self.rank], op) if self.rank else None

    def barrier(self):
        self._c("barrier").Barrier()

    def send(self, obj, dest, tag=0):
        self._c("send").send(obj, dest, tag)

    bsend = send

    def isend(self, obj, dest, tag=0):
        core = self._c("isend")
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) <= 64 << 10:  # small: written now, as a send (complete at once)
            core.Send(np.frombuffer(data, np.uint8), dest, tag)
            return Request._of(done(name="isend"))
        return Request._of(core.isend(obj, dest, tag))

    ibsend = isend

    def issend(self, obj, dest, tag=0):
        """Send obj; the request completes once dest has matched the message."""
        payload = memoryview(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        return Request._of(issend_state(self._c("issend"), payload, dest, tag, "issend"))

    def ssend(self, obj, dest, tag=0):
        self.issend(obj, dest, tag).Wait()

    def recv(self, buf=None, source=_C["ANY_SOURCE"], tag=_C["ANY_TAG"], status=None):
        _ignored_buf(buf, "recv")
        return self._c("recv").recv(None, source, tag, status)

    def irecv(self, buf=None, source=_C["ANY_SOURCE"], tag=_C["ANY_TAG"]):
        _ignored_buf(buf, "irecv")
        return Request._of(self._c("irecv").irecv(None, source, tag))

    def sendrecv(self, sendobj, dest, sendtag=0, recvbuf=None, source=_C["ANY_SOURCE"], recvtag=_C["ANY_TAG"],
                 status=None):
        return self._c("sendrecv").sendrecv(sendobj, dest, sendtag, recvbuf, source, recvtag, status)

    # --- context manager --------------------------------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._s is not None and self._s is not _world_state() and self._s is not _self_state():
            self.Free()


def comm_lock_table(comm):
    """The communicator's named locks (mpi4py's MPI._comm_lock_table)."""
    return comm._c("_comm_lock_table") and comm._s.locks


def comm_lock(comm, key=None):
    """The communicator's lock named key, made on first use (mpi4py's MPI._comm_lock)."""
    table = comm_lock_table(comm)
    with _LOCKS_LOCK:
        return table.setdefault(key, threading.Lock())


def commctx_intra(comm):
    """The pair (a private duplicate of comm, a fresh tag), mpi4py's MPI._commctx_intra, for libraries such as
    mpi4py.util.pkl5. The duplicate is made on the first call (collective: every rank calls it in the
    same operation) and freed with comm; the tag advances on every call."""
    with comm_lock(comm, "@commctx_intra"):
        state = comm._s
        if state.ctx is None:
            state.ctx = [Intracomm._wrap(state.core.Dup()), 0]
        dup, tag = state.ctx
        state.ctx[1] = (tag + 1) % TAG_UB
        return dup, tag


_LOCKS_LOCK = threading.Lock()
_NAMES = {}


def name_count(name, ranks):
    """How many communicators named `name` over `ranks` this process has made (with this one): the
    ranks of a collective constructor that has no parent communicator (Create_from_group, ...)
    count alike, so successive ones get distinct names that every member agrees on."""
    key = (name, tuple(sorted(ranks)))
    _NAMES[key] = _NAMES.get(key, 0) + 1
    return _NAMES[key]


def _ignored_buf(buf, what):
    if buf is not None:
        warnings.warn(f"{what}(): the buf argument is ignored (gpucoll receives pickled objects of any size)",
                      UserWarning, stacklevel=3)


def _reduce_objects(items, op):
    """op over items in rank order (x0 op x1 op ...), with MPI.SUM for None."""
    from .op import PREDEFINED, Op

    op = PREDEFINED["SUM"] if op is None else op
    if not isinstance(op, Op):
        rec = as_op(op)
        op = Op._of(rec)
    if not items:
        return None
    result = items[0]
    for item in items[1:]:
        result = op(result, item)
    return result


def _last_used_code():
    from ..base.mpi_errors import added_classes, added_strings

    return max([_C["ERR_LASTCODE"], *added_classes, *added_strings])


@register
class Intracomm(TopologyMaker, Ports, Spawning, Comm):
    """An intra-communicator."""

    __slots__ = ()

    @staticmethod
    def Create_from_group(group, stringtag="org.mpi4py", info=None, errhandler=None):
        """The communicator of group's processes (collective over them, without a parent
        communicator; processes that make several tell them apart by stringtag)."""
        ranks = tuple(group._st("Create_from_group").ranks)
        world = _world.init()
        if world.rank not in ranks:
            raise InvalidUsageError("Create_from_group: this process is not in the group",
                                    error_class=_C["ERR_GROUP"])
        name = f"fromgroup[{stringtag}]"
        comm = Intracomm._wrap(_core.Communicator(world.seam.context, f"{name}{name_count(name, ranks)}", ranks))
        if info:
            comm._s.info = dict(info.items())
        if errhandler is not None:
            comm._s.errhandler = errhandler._s
        return comm

    def Create_intercomm(self, local_leader, peer_comm, remote_leader, tag=0):
        """The intercommunicator between this group and the one whose leader is remote_leader of
        peer_comm (collective over both groups; the leaders talk over peer_comm with tag)."""
        return kind("Intercomm")._from_leaders(self, local_leader, peer_comm, remote_leader, tag)

    @classmethod
    def _accepts(cls, other):
        return other._s is None or other._s.inter is None

    def Create_group(self, group, tag=0):
        """The communicator of `group` (collective over the group's processes only)."""
        core = self._c("Create_group")
        ranks = tuple(group._st("Create_group").ranks)
        if core.seam.context.rank not in ranks:
            raise comm_error("Create_group: this process is not in the group", _C["ERR_GROUP"])
        key = (ranks, tag)
        n = self._s.children[key] = self._s.children.get(key, 0) + 1
        digest = zlib.crc32(repr(ranks).encode())
        return Intracomm._wrap(_core.Communicator(core.seam.context, f"{core.seam.id}.g{digest:x}t{tag}n{n}", ranks))


_WORLD = [None]
_SELF = [None]


def _world_state():
    return _WORLD[0]._s if _WORLD[0] is not None else None


def _self_state():
    return _SELF[0]._s if _SELF[0] is not None else None


def comm_world():
    """MPI.COMM_WORLD: joins the job on first use."""
    if _WORLD[0] is None:
        _WORLD[0] = Intracomm._wrap(_world.init(), "MPI_COMM_WORLD")
    return _WORLD[0]


def comm_self():
    """MPI.COMM_SELF: a communicator of this process alone (one object, as in mpi4py)."""
    if _SELF[0] is None:
        world = _world.init()
        _SELF[0] = Intracomm._wrap(_core.Communicator(world.seam.context, f"self{world.rank}", [world.rank]),
                                   "MPI_COMM_SELF")
    return _SELF[0]
