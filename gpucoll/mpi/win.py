"""One-sided communication: MPI.Win (RMA windows).

Each window has a private duplicate of its communicator. When every process of a window is on
this host (and GPUCOLL_RMA_DIRECT is on), an origin reads and writes the target's memory itself,
under record locks for lock epochs and atomicity (winmemory.py): no round trip, no thread.
Otherwise (a window spanning hosts, a dynamic window) a service thread in every process applies
the operations other processes (and this one) target at its memory: an
origin sends a request (Put's bytes, Get's wanted bytes, an accumulate's data and op) and the
target's thread applies it and answers (an acknowledgement, or the fetched bytes). Operations on
one target are applied one at a time, in order, so each is atomic (accumulates, fetch-and-op,
compare-and-swap) as MPI requires. An origin counts the answers it awaits: Flush waits for a
target's, Fence for every target's and then synchronises the group, Unlock for its target's
before releasing the lock. Locks (exclusive or shared) are kept by the target's thread, which
grants them in request order. Post/Start/Complete/Wait are messages between the groups' main
threads. Memory is ordinary host memory (a shared-memory segment for Allocate_shared); the
memory model is MPI's unified one. The target's layout (its datatype) travels as byte offsets.
"""
import os
import threading

import numpy as np

from .._native.exporter import BufferExporter
from ..base.errors import InvalidUsageError, ProcFailedPendingError
from ..base.errors import TimeoutError as GpucollTimeout
from ..base.mpi_constants import INTEGERS as _C
from . import attributes as _attrs
from . import errhandler as _eh
from . import message as _m
from . import winmemory
from .buffer import buffer
from .composite import Composite
from .group import Group
from .handle import Handle
from .info import Info
from .op import PREDEFINED as _OPS
from .op import as_op, check
from .request import Request
from .hostcopy import HostStage

PROC_NULL, ANY_SOURCE = _C["PROC_NULL"], _C["ANY_SOURCE"]
ERR_WIN, ERR_ARG, ERR_RANK = _C["ERR_WIN"], _C["ERR_ARG"], _C["ERR_RANK"]
LOCK_EXCLUSIVE, LOCK_SHARED = _C["LOCK_EXCLUSIVE"], _C["LOCK_SHARED"]
REQUEST_TAG, ANSWER_TAG, POST_TAG, COMPLETE_TAG = -1201, -1202, -1203, -1204


def win_error(message, error_class=ERR_WIN):
    return InvalidUsageError(message, error_class=error_class)


# --- the target side: the service thread ------------------------------------------------------------
class _Target:
    """A window's memory in this process and the thread that serves the other processes' operations."""

    def __init__(self, comm, memory, disp_unit, flavor, serve):
        self.comm = comm              # the private duplicate (gpucoll Communicator)
        self.memory = memory          # 1-D uint8 array (the window's memory; empty when dynamic)
        self.disp_unit = disp_unit
        self.flavor = flavor
        self.regions = []             # dynamic windows: [(address, uint8 array)] attached
        self.exclusive = None         # the origin holding an exclusive lock
        self.shared = {}              # origin -> shared locks held
        self.waiting = []             # [(origin, lock type)] not granted yet, in request order
        self.thread = None            # the service thread (none when origins access the memory directly)
        if serve:
            self.thread = threading.Thread(target=self._serve, name=f"gpucoll-win-{comm.seam.id}", daemon=True)
            self.thread.start()

    def _where(self, disp, index):
        """The uint8 array and the byte positions an operation at displacement disp touches."""
        offset = disp if self.flavor == _C["WIN_FLAVOR_DYNAMIC"] else disp * self.disp_unit
        if self.flavor == _C["WIN_FLAVOR_DYNAMIC"]:  # displacements are addresses in attached memory
            end = offset + (int(index.max()) + 1 if index.size else 0)
            for address, region in self.regions:
                if address <= offset and end <= address + region.size:
                    return region, index + (offset - address)
            raise win_error(f"RMA: bytes [{offset}, {end}) are not in memory attached to the dynamic window")
        if index.size and (offset + int(index.min()) < 0 or offset + int(index.max()) >= self.memory.size):
            raise win_error(f"RMA: bytes from {offset} reach past the window's {self.memory.size} bytes",
                            ERR_ARG)
        return self.memory, index + offset

    def _serve(self):
        p2p = self.comm.seam.p2p
        pending = None
        while True:
            try:
                pending = pending or p2p.irecv_object(ANY_SOURCE, REQUEST_TAG)
                request = pending.wait()
                pending = None
            except GpucollTimeout:
                pending = None
                continue  # nothing came within GPUCOLL_TIMEOUT: keep serving
            except ProcFailedPendingError:
                pending.saw_losses()  # a rank failed: the others' requests still come
                continue
            except Exception:  # noqa: BLE001 - the window's communicator was freed under us
                return
            if request[0] == "stop":
                return
            origin = request[1]
            try:
                answer = self._apply(request)
            except Exception as exc:  # noqa: BLE001 - sent back: the origin raises it
                answer = ("error", f"{type(exc).__name__}: {exc}")
            if answer is not None:
                p2p.send_object(answer, origin, ANSWER_TAG)

    def _apply(self, request):
        kind, origin = request[0], request[1]
        if kind == "lock":
            self.waiting.append((origin, request[2]))
            self._grant()
            return None  # answered when granted
        if kind == "unlock":
            if self.exclusive == origin:
                self.exclusive = None
            elif self.shared.get(origin):
                self.shared[origin] -= 1
                if not self.shared[origin]:
                    del self.shared[origin]
            self._grant()
            return ("ok",)
        if kind == "sync":
            return ("ok",)
        offset, index = request[2], request[3]
        mem, where = self._where(offset, index)
        if kind == "put":
            mem[where] = request[4]
            return ("ok",)
        if kind == "get":
            return ("data", mem[where].copy())
        if kind == "acc":  # accumulate, get-accumulate, fetch-and-op: (op, dtype, data, fetch)
            op, dtype, data, fetch = request[4:8]
            old = mem[where].copy()
            mem[where] = winmemory.accumulated(old, op, dtype, data)
            return ("data", old) if fetch else ("ok",)
        if kind == "cas":
            old = mem[where].copy()
            new = winmemory.swapped(old, request[4], request[5])
            if new is not None:
                mem[where] = new
            return ("data", old)
        raise win_error(f"RMA: unknown request {kind!r}")

    def _grant(self):
        """Grant waiting locks in request order, as far as they are compatible."""
        while self.waiting:
            origin, kind = self.waiting[0]
            if self.exclusive is not None or (kind == LOCK_EXCLUSIVE and self.shared):
                return
            self.waiting.pop(0)
            if kind == LOCK_EXCLUSIVE:
                self.exclusive = origin
            else:
                self.shared[origin] = self.shared.get(origin, 0) + 1
            self.comm.seam.p2p.send_object(("ok",), origin, ANSWER_TAG)

    def stop(self):
        if self.thread is None:
            return
        me = self.comm.rank
        self.comm.seam.p2p.send_object(("stop", me), me, REQUEST_TAG)
        self.thread.join()


# --- the window handle ---------------------------------------------------------------------------------
class _WinState:
    __slots__ = ("target", "comm", "group", "base", "size", "name", "errhandler", "attrs", "info", "pending",
                 "started", "posted", "shm", "shared", "direct", "__weakref__")

    def __init__(self, target, group, base, size):
        self.target, self.comm, self.group = target, target.comm, group
        self.base, self.size = base, size   # the memory object tomemory() returns, and its bytes
        self.name = ""
        self.errhandler = _eh.PREDEFINED["ERRORS_ARE_FATAL"]._s
        self.attrs, self.info = {}, {}
        self.pending = {}       # target rank -> [(answer request, what to do with the answer)]
        self.started = ()       # Start's group (ranks), for Complete
        self.posted = []        # Post's awaited completions (requests)
        self.shm = None         # Allocate_shared: the segment
        self.shared = None      # Allocate_shared: [(offset, size, disp_unit)] per rank
        self.direct = None      # winmemory.DirectAccess when origins reach the targets' memory themselves


def _target_spec(target, origin, what):
    """(displacement, count, datatype) of the target argument (default: the origin's layout)."""
    if target is None:
        return 0, origin.count, origin.datatype
    if isinstance(target, (int, np.integer)) and not isinstance(target, bool):
        return int(target), origin.count, origin.datatype
    if isinstance(target, (list, tuple)):
        items = list(target)
        if not 1 <= len(items) <= 3:
            raise ValueError(f"{what}: a target is (displacement, count, datatype), not {len(items)} items")
        disp = int(items[0])
        count = int(items[1]) if len(items) > 1 and items[1] is not None else origin.count
        datatype = _m.as_datatype(items[2], what) if len(items) > 2 and items[2] is not None else origin.datatype
        return disp, count, datatype
    raise ValueError(f"{what}: the target must be a displacement or (displacement, count, datatype), not "
                     f"{type(target).__name__}")


class Win(Handle, BufferExporter):
    """An RMA window: memory of each process of a group that the others read and write. A window
    is a buffer too: memoryview(win) is this process's window memory (tomemory())."""

    __slots__ = ()
    _kind = "win"

    def _exported_buffer(self):
        return self.tomemory()

    def __repr__(self):
        return "<gpucoll.MPI.Win null>" if self._s is None else f"<gpucoll.MPI.Win {self._s.name or hex(id(self._s))}>"

    def _st(self, what):
        if self._s is None:
            raise win_error(f"Win.{what}: the window is MPI.WIN_NULL")
        return self._s

    # --- creation (collective) -----------------------------------------------------------------------
    @classmethod
    def _make(cls, comm, memory, base, disp_unit, flavor, info):
        core = comm._c("Win")
        if disp_unit <= 0:
            raise win_error(f"Win: disp_unit must be positive, not {disp_unit}", ERR_ARG)
        private = core.Dup()
        direct = _direct_access(private, memory, disp_unit, flavor)
        state = _WinState(_Target(private, memory, disp_unit, flavor, serve=direct is None),
                          Group._from_ranks(core.world_ranks), base, memory.size)
        state.direct = direct
        if info:
            state.info = dict(info.items())
        private.Barrier()  # every service thread runs before anyone targets it
        return cls._of(state)._register()

    @classmethod
    def Create(cls, memory, disp_unit=1, info=None, comm=None):
        """A window over memory (a buffer; None or MPI.BOTTOM: none) of each process of comm."""
        comm = _default_comm(comm)
        if memory is None or memory is _m.BOTTOM:
            raw, base = np.zeros(0, np.uint8), buffer.fromaddress(0, 0)
        else:
            raw = _bytes_of(memory, "Win.Create memory")
            base = memory
        return cls._make(comm, raw, base, disp_unit, _C["WIN_FLAVOR_CREATE"], info)

    @classmethod
    def Allocate(cls, size, disp_unit=1, info=None, comm=None):
        """A window over size new bytes in each process."""
        comm = _default_comm(comm)
        mem = buffer.allocate(_size(size, "Allocate"), True)
        return cls._make(comm, np.asarray(mem).view(np.uint8), mem, disp_unit, _C["WIN_FLAVOR_ALLOCATE"], info)

    @classmethod
    def Allocate_shared(cls, size, disp_unit=1, info=None, comm=None):
        """A window whose memory, of every process of comm (one host), is one shared segment that
        each process can address directly (Shared_query)."""
        from . import sharedmem

        comm = _default_comm(comm)
        core = comm._c("Allocate_shared")
        size = _size(size, "Allocate_shared")
        if len({core.seam.context.hosts[w] for w in core.world_ranks}) > 1:
            raise win_error("Allocate_shared: the processes of the communicator are on several hosts; split it "
                            "with Split_type(MPI.COMM_TYPE_SHARED) first", _C["ERR_RMA_SHARED"])
        table = core.allgather((size, disp_unit))
        segment, layout = sharedmem.attach(core, [s for s, _ in table])
        offset = layout[core.rank]
        raw = segment.array[offset:offset + size]
        win = cls._make(comm, raw, buffer._make(raw, segment), disp_unit, _C["WIN_FLAVOR_SHARED"], info)
        win._s.shm = segment
        win._s.shared = [(layout[k], table[k][0], table[k][1]) for k in range(core.size)]
        return win

    @classmethod
    def Create_dynamic(cls, info=None, comm=None):
        """A window with no memory until Attach; targets are addresses (MPI.Get_address)."""
        comm = _default_comm(comm)
        return cls._make(comm, np.zeros(0, np.uint8), buffer.fromaddress(0, 0), 1, _C["WIN_FLAVOR_DYNAMIC"], info)

    def Attach(self, memory):
        raw = _bytes_of(memory, "Win.Attach memory")
        target = self._st("Attach").target
        if target.flavor != _C["WIN_FLAVOR_DYNAMIC"]:
            raise win_error("Attach: the window was not made by Create_dynamic", _C["ERR_RMA_FLAVOR"])
        target.regions.append((raw.__array_interface__["data"][0] if raw.size else 0, raw))

    def Detach(self, memory):
        raw = _bytes_of(memory, "Win.Detach memory")
        target = self._st("Detach").target
        address = raw.__array_interface__["data"][0] if raw.size else 0
        for i, (a, r) in enumerate(target.regions):
            if a == address and r.size == raw.size:
                del target.regions[i]
                return
        raise win_error("Detach: that memory is not attached to the window", ERR_ARG)

    def Free(self):
        """Release the window (collective): every pending operation completes first."""
        s = self._st("Free")
        self._flush_all()
        s.comm.Barrier()  # nobody targets this process any more
        _attrs.delete_all(self, s.attrs)
        s.target.stop()
        if s.direct is not None:
            s.direct.close()
        s.comm.Free()
        if s.shm is not None:
            s.shm.close()
        self._s = None

    # --- what the window is ----------------------------------------------------------------------------
    def tomemory(self):
        """This process's window memory, as an MPI.buffer."""
        s = self._st("tomemory")
        return s.base if isinstance(s.base, buffer) else buffer(s.base)

    @property
    def attrs(self):
        """(base address, size in bytes, displacement unit)."""
        s = self._st("attrs")
        from .environment import Get_address

        return Get_address(self.tomemory()) if s.size else 0, s.size, s.target.disp_unit

    def Get_attr(self, keyval):
        s = self._st("Get_attr")
        base, size, unit = self.attrs
        predefined = {_C["WIN_BASE"]: base, _C["WIN_SIZE"]: size, _C["WIN_DISP_UNIT"]: unit,
                      _C["WIN_CREATE_FLAVOR"]: s.target.flavor, _C["WIN_MODEL"]: _C["WIN_UNIFIED"]}
        if keyval in predefined:
            return predefined[keyval]
        return _attrs.get_attr(s.attrs, keyval, "Win")

    def Set_attr(self, keyval, attrval):
        _attrs.set_attr(self, self._st("Set_attr").attrs, keyval, attrval, "Win")

    def Delete_attr(self, keyval):
        _attrs.delete_attr(self, self._st("Delete_attr").attrs, keyval, "Win")

    @staticmethod
    def Create_keyval(copy_fn=None, delete_fn=None, nopython=False):
        return _attrs.create_keyval("Win", copy_fn, delete_fn, nopython)

    @staticmethod
    def Free_keyval(keyval):
        return _attrs.free_keyval(keyval)

    flavor = property(lambda self: self.Get_attr(_C["WIN_CREATE_FLAVOR"]))
    model = property(lambda self: self.Get_attr(_C["WIN_MODEL"]))

    def Get_group(self):
        return self._st("Get_group").group.Dup()

    group = property(Get_group)
    group_size = property(lambda self: self._st("group_size").comm.size)
    group_rank = property(lambda self: self._st("group_rank").comm.rank)

    def Get_name(self):
        return "MPI_WIN_NULL" if self._s is None else self._s.name

    def Set_name(self, name):
        self._st("Set_name").name = str(name)

    name = property(Get_name, Set_name)

    def Get_info(self):
        return Info.Create(self._st("Get_info").info)

    def Set_info(self, info):
        self._st("Set_info").info = dict(info.items()) if info else {}

    info = property(Get_info, Set_info)

    def Get_errhandler(self):
        return _eh.Errhandler._of(self._st("Get_errhandler").errhandler)

    def Set_errhandler(self, errhandler):
        s = self._st("Set_errhandler")
        if not errhandler:
            raise win_error("Set_errhandler: the handler is MPI.ERRHANDLER_NULL", ERR_ARG)
        s.errhandler = errhandler._s

    def Call_errhandler(self, errorcode):
        _eh.invoke(self._st("Call_errhandler").errhandler, self, errorcode)

    @classmethod
    def Create_errhandler(cls, errhandler_fn):
        return _eh.create(errhandler_fn)

    def Shared_query(self, rank):
        """Return (buffer, displacement unit) of rank's part of a shared window (PROC_NULL: the first
        rank with memory)."""
        s = self._st("Shared_query")
        if s.shared is None:
            if rank == PROC_NULL or rank == s.comm.rank:
                return self.tomemory(), s.target.disp_unit
            raise win_error("Shared_query: only windows of Allocate_shared share memory", _C["ERR_RMA_FLAVOR"])
        if rank == PROC_NULL:
            rank = next((k for k, (_, n, _) in enumerate(s.shared) if n), 0)
        if not 0 <= rank < len(s.shared):
            raise win_error(f"Shared_query: rank {rank} is not in the window's group of {len(s.shared)}", ERR_RANK)
        offset, size, unit = s.shared[rank]
        raw = s.shm.array[offset:offset + size]
        return buffer._make(raw, s.shm), unit

    # --- operations --------------------------------------------------------------------------------
    def _checked(self, target_rank, what):
        """The window's state, once target_rank is known to be one of its ranks."""
        s = self._st(what)
        if not 0 <= target_rank < s.comm.size:
            raise win_error(f"{what}: target rank {target_rank} is out of range for a window of {s.comm.size}",
                            ERR_RANK)
        return s

    def _send(self, target_rank, request, what, answer=None):
        """Send a request to target_rank's service thread; the answer is awaited by flushes (answer:
        what to do with it)."""
        s = self._checked(target_rank, what)
        p2p = s.comm.seam.p2p
        reply = p2p.irecv_object(target_rank, ANSWER_TAG)
        p2p.send_object(request, target_rank, REQUEST_TAG)
        entry = (reply, answer, what)
        s.pending.setdefault(target_rank, []).append(entry)
        return entry

    def _finish(self, entry):
        reply, answer, what = entry
        result = reply.wait()
        if result[0] == "error":
            raise win_error(f"{what}: {result[1]}")
        if answer is not None:
            answer(result)

    def _flush(self, rank):
        pending = self._s.pending.pop(rank, [])
        first = None
        for entry in pending:
            try:
                self._finish(entry)
            except Exception as exc:  # noqa: BLE001 - every answer is awaited, the first error raised
                first = first or exc
        if first is not None:
            raise first

    def _flush_all(self):
        for rank in list(self._s.pending):
            self._flush(rank)

    def _layout(self, origin, target, what, direct):
        """Return (target displacement, where the target datatype's bytes are, the datatype) for an origin
        Msg: their runs (winmemory.runs) for direct access, else the byte positions that travel to the
        target. The target's displacement unit scales the displacement."""
        disp, count, datatype = _target_spec(target, origin, what)
        t = datatype._t
        if t.size * count != origin.nbytes:
            raise ValueError(f"{what}: the origin has {origin.nbytes} bytes, the target {count} x {t.size}")
        if direct is not None:
            return disp, winmemory.runs(datatype, count), datatype
        return disp, t.byte_index(count) if count else np.zeros(0, np.intp), datatype

    def Put(self, origin, target_rank, target=None):
        """Write origin into target_rank's window (complete at the next synchronisation)."""
        self._move(True, origin, target_rank, target, "Put")

    def Get(self, origin, target_rank, target=None):
        """Read target_rank's window into origin (there at the next synchronisation)."""
        self._move(False, origin, target_rank, target, "Get")

    def _move(self, put, origin, target_rank, target, what):
        """Put (origin's bytes to the target) or Get (the target's bytes into origin): the entry
        that the next synchronisation completes, None for PROC_NULL."""
        self._st(what)
        if target_rank == PROC_NULL:
            return None
        stage = HostStage()  # GPU origins: through a host copy
        msg = _m.simple(stage.spec(origin, not put, f"{what} origin"), put, what=f"{what} origin")
        direct = self._checked(target_rank, what).direct
        offset, index, _ = self._layout(msg, target, what, direct)
        if direct is not None:  # done when it returns
            if put:
                direct.put(target_rank, offset, index, msg.data(), what)
            else:
                _read_into(msg, lambda into: direct.get(target_rank, offset, index, into, what))
                stage.finish()
            return None
        me = self._s.comm.rank
        if put:
            return self._send(target_rank, ("put", me, offset, index, msg.data().copy()), what)
        return self._send(target_rank, ("get", me, offset, index), what,
                          lambda answer: (msg.store(answer[1]), stage.finish()))

    def _accumulate(self, origin, result, target_rank, target, op, what, fetch):
        self._st(what)
        rec = as_op(op)
        if rec.function is not None or rec.array is None:
            raise win_error(f"{what}: RMA accumulates take predefined operations only, not {rec.name}", _C["ERR_OP"])
        if target_rank == PROC_NULL:
            return None
        stage = HostStage()  # GPU origins and results: through host copies
        origin = stage.spec(origin, False, f"{what} origin")
        result = stage.spec(result, True, f"{what} result") if fetch else result
        res = _m.simple(result, False, what=f"{what} result") if fetch else None
        if origin is None or rec.name == "NO_OP":
            ref = res if res is not None else _m.simple(origin, True, what=f"{what} origin")
            msg = ref
            data = np.zeros(ref.nbytes, np.uint8)
        else:
            msg = _m.simple(origin, True, what=f"{what} origin")
            data = msg.data().copy()
        direct = self._checked(target_rank, what).direct
        offset, index, datatype = self._layout(msg, target, what, direct)
        element = datatype._t.element()
        if element is None or element.np is None:
            raise win_error(f"{what}: the target datatype must be made of one basic type", _C["ERR_TYPE"])
        check(rec, element.np, datatype)
        if direct is not None:  # atomic under the target's lock; done when it returns
            dtype, payload = element.np.str, data.tobytes()
            change = None if rec.name == "NO_OP" else lambda old: winmemory.accumulated(old, rec.name, dtype, payload)
            old = direct.update(target_rank, offset, index, change or (lambda old: None), what)
            if fetch:
                res.store(old)
                stage.finish()
            return None
        answer = (lambda a: (res.store(a[1]), stage.finish())) if fetch else None
        return self._send(target_rank, ("acc", self._s.comm.rank, offset, index, rec.name, element.np.str,
                                        data.tobytes(), fetch), what, answer)

    def Accumulate(self, origin, target_rank, target=None, op=None):
        """Set target = target op origin, element by element (atomic)."""
        self._accumulate(origin, None, target_rank, target, _OPS["SUM"] if op is None else op, "Accumulate", False)

    def Get_accumulate(self, origin, result, target_rank, target=None, op=None):
        """Set result = target, then target = target op origin (atomic)."""
        self._accumulate(origin, result, target_rank, target, _OPS["SUM"] if op is None else op,
                         "Get_accumulate", True)

    def Fetch_and_op(self, origin, result, target_rank, target_disp=0, op=None):
        """Get_accumulate of one element."""
        what = "Fetch_and_op"
        o = _m.simple(HostStage().spec(origin, False, f"{what} origin"), True, what=f"{what} origin")
        r = _m.simple(HostStage().spec(result, False, f"{what} result"), False, what=f"{what} result")
        for m, name in ((o, "origin"), (r, "result")):
            if m is not None and m.count != 1:
                raise ValueError(f"{what}: the {name} must be one element, not {m.count}")
        if o is None or r is None:
            raise ValueError(f"{what}: origin and result must be buffers of one element")
        if o.t.size != r.t.size:
            raise ValueError(f"{what}: origin and result datatypes differ in size")
        self._accumulate(origin, result, target_rank, (target_disp, 1, (o or r).datatype),
                         _OPS["SUM"] if op is None else op, what, True)

    def Compare_and_swap(self, origin, compare, result, target_rank, target_disp=0):
        """Set result = target; if target == compare: target = origin (atomic, one element)."""
        what = "Compare_and_swap"
        self._st(what)
        stage = HostStage()  # GPU buffers: through host copies
        o = _m.simple(stage.spec(origin, False, f"{what} origin"), True, what=f"{what} origin")
        c = _m.simple(stage.spec(compare, False, f"{what} compare"), True, what=f"{what} compare")
        r = _m.simple(stage.spec(result, True, f"{what} result"), False, what=f"{what} result")
        for m, name in ((o, "origin"), (c, "compare"), (r, "result")):
            if m is None or m.count != 1:
                raise ValueError(f"{what}: the {name} must be one element")
            if m.t.size != o.t.size:
                raise ValueError(f"{what}: the {name}'s datatype differs in size from the origin's")
        if target_rank == PROC_NULL:
            return
        direct = self._checked(target_rank, what).direct
        offset, index, _ = self._layout(o, (target_disp, 1, o.datatype), what, direct)
        if direct is not None:
            compared, data = c.data().tobytes(), o.data().tobytes()
            r.store(direct.update(target_rank, offset, index, lambda old: winmemory.swapped(old, compared, data),
                                  what))
            stage.finish()
            return
        self._send(target_rank, ("cas", self._s.comm.rank, offset, index, c.data().tobytes(),
                                 o.data().tobytes()), what, lambda a: (r.store(a[1]), stage.finish()))

    # request-based forms: complete when the target has answered
    def _request(self, entry, name):
        if entry is None:
            from .composite import done

            return Request._of(done(name=name))
        s = self._s
        rank = next(k for k, entries in s.pending.items() if entry in entries)

        def finish():
            if entry in s.pending.get(rank, []):
                s.pending[rank].remove(entry)
                self._finish(entry)
        return Request._of(Composite([entry[0]], finish, name))

    def Rput(self, origin, target_rank, target=None):
        return self._request(self._move(True, origin, target_rank, target, "Rput"), "Rput")

    def Rget(self, origin, target_rank, target=None):
        return self._request(self._move(False, origin, target_rank, target, "Rget"), "Rget")

    def Raccumulate(self, origin, target_rank, target=None, op=None):
        entry = self._accumulate(origin, None, target_rank, target, _OPS["SUM"] if op is None else op,
                                 "Raccumulate", False)
        return self._request(entry, "Raccumulate")

    def Rget_accumulate(self, origin, result, target_rank, target=None, op=None):
        entry = self._accumulate(origin, result, target_rank, target, _OPS["SUM"] if op is None else op,
                                 "Rget_accumulate", True)
        return self._request(entry, "Rget_accumulate")

    # --- synchronisation -----------------------------------------------------------------------------
    def Fence(self, assertion=0):
        """Complete every operation of the epoch, everywhere (collective)."""
        s = self._st("Fence")
        self._flush_all()
        s.comm.Barrier()

    def Flush(self, rank):
        """Complete this process's operations on rank's window."""
        self._st("Flush")
        self._flush(rank)

    Flush_local = Flush

    def Flush_all(self):
        self._st("Flush_all")
        self._flush_all()

    Flush_local_all = Flush_all

    def Sync(self):
        """Memory is unified: nothing to synchronise."""
        self._st("Sync")

    def Lock(self, rank, lock_type=LOCK_EXCLUSIVE, assertion=0):
        """Start an access epoch on rank's window (returns once the lock is granted)."""
        if lock_type not in (LOCK_EXCLUSIVE, LOCK_SHARED):
            raise win_error(f"Lock: lock type {lock_type} is not LOCK_EXCLUSIVE or LOCK_SHARED", _C["ERR_LOCKTYPE"])
        if rank == PROC_NULL:
            self._st("Lock")
            return
        direct = self._checked(rank, "Lock").direct
        if direct is not None:
            direct.lock(rank, lock_type == LOCK_EXCLUSIVE, "Lock")
            return
        self._finish(self._send(rank, ("lock", self._s.comm.rank, lock_type), "Lock"))
        self._s.pending[rank].pop()

    def Unlock(self, rank):
        """Complete the operations on rank's window and release its lock."""
        self._st("Unlock")
        if rank == PROC_NULL:
            return
        direct = self._checked(rank, "Unlock").direct
        if direct is not None:
            direct.unlock(rank)
            return
        self._flush(rank)
        self._send(rank, ("unlock", self._s.comm.rank), "Unlock")
        self._flush(rank)

    def Lock_all(self, assertion=0):
        for rank in range(self._st("Lock_all").comm.size):
            self.Lock(rank, LOCK_SHARED)

    def Unlock_all(self):
        for rank in range(self._st("Unlock_all").comm.size):
            self.Unlock(rank)

    def _ranks(self, group, what):
        s = self._st(what)
        worlds = s.comm.world_ranks
        return [worlds.index(w) for w in group._st(what).ranks]

    def Post(self, group, assertion=0):
        """Expose this window to group's processes until Wait (they Start, then Complete)."""
        s = self._st("Post")
        ranks = self._ranks(group, "Post")
        p2p = s.comm.seam.p2p
        s.posted = [p2p.irecv_object(r, COMPLETE_TAG) for r in ranks]
        for r in ranks:
            p2p.send_object(None, r, POST_TAG)

    def Start(self, group, assertion=0):
        """Begin an access epoch to group's windows (returns once each has posted)."""
        s = self._st("Start")
        ranks = self._ranks(group, "Start")
        for r in ranks:
            s.comm.seam.p2p.irecv_object(r, POST_TAG).wait()
        s.started = tuple(ranks)

    def Complete(self):
        """End the access epoch: the operations on Start's group are complete there."""
        s = self._st("Complete")
        for r in s.started:
            self._flush(r)
            s.comm.seam.p2p.send_object(None, r, COMPLETE_TAG)
        s.started = ()

    def Wait(self):
        """End the exposure epoch: every process of Post's group has completed."""
        s = self._st("Wait")
        for req in s.posted:
            req.wait()
        s.posted = []

    def Test(self):
        s = self._st("Test")
        if all(req.Test() for req in s.posted):
            s.posted = []
            return True
        return False


def _bytes_of(memory, what):
    """A plain uint8 NumPy array over a buffer's memory (not a copy)."""
    return np.asarray(_m._raw(_m.as_array(memory, False, what))).view(np.uint8)


def _read_into(msg, read):
    """Have read(into) fill msg's packed bytes: in place when they are its memory."""
    into = msg.data() if msg.dense() else None
    if into is None or not into.flags.c_contiguous or not into.flags.writeable:
        msg.store(read(np.empty(msg.nbytes, np.uint8)))
    else:
        read(into)


def _direct_access(comm, memory, disp_unit, flavor):
    """A winmemory.DirectAccess over every process's window when each can reach the others' memory
    (one host, one pid namespace, cross-memory attach allowed); None otherwise (collective: every
    process decides the same)."""
    ok, (pid, probe) = winmemory.possible(comm.seam.context, comm.world_ranks)
    address = memory.__array_interface__["data"][0] if memory.size else 0
    table = comm.allgather((ok and flavor != _C["WIN_FLAVOR_DYNAMIC"], pid, probe, address, memory.size, disp_unit))
    if not all(entry[0] for entry in table):
        return None
    fd, path = winmemory.lock_file()
    fds = []
    reach = path is not None and all(winmemory.readable(p, at) for _, p, at, _, _, _ in table)
    paths = comm.allgather((reach, path))
    if all(r for r, _ in paths):
        try:
            for k, (_, other) in enumerate(paths):
                fds.append(fd if k == comm.rank else os.open(other, os.O_RDWR))
        except OSError:  # not ours to open (another user's process): no direct access
            pass
    opened = comm.allgather(len(fds) == comm.size)  # and everyone has opened the files: they can go
    if path is not None:
        os.unlink(path)
    if not all(opened):
        for f in (set(fds) | {fd}) - {-1}:
            os.close(f)
        return None
    return winmemory.DirectAccess([entry[1:2] + entry[3:] for entry in table], fds)


def _default_comm(comm):
    if comm is None:
        from .comm import comm_self

        return comm_self()
    return comm


def _size(size, what):
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise win_error(f"{what}: size must be a non-negative integer, not {size!r}", ERR_ARG)
    return int(size)

