"""MPI sessions: MPI.Session, Group.Create_from_session_pset and Intracomm.Create_from_group.

A gpucoll job has the two process sets every MPI library has: "mpi://WORLD" (every rank of
the job) and "mpi://SELF" (this process). A session is a local object that names them; a
group of a process set becomes a communicator with Intracomm.Create_from_group, collective over
the group's processes, which tell their communicators apart by the string tag.
"""
from ..api import world as _world
from ..base.errors import InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C
from . import errhandler as _eh
from .group import Group
from .handle import Handle
from .info import Info

ERR_SESSION, ERR_ARG = _C["ERR_SESSION"], _C["ERR_ARG"]
PSETS = ("mpi://WORLD", "mpi://SELF")


def _pset_ranks(name):
    world = _world.init()
    return tuple(range(world.size)) if name == "mpi://WORLD" else (world.rank,)


class _SessionState:
    __slots__ = ("errhandler", "info", "buffer", "__weakref__")

    def __init__(self, errhandler, info):
        self.errhandler, self.info, self.buffer = errhandler, info, None


class Session(Handle):
    """An MPI session: access to the process sets of the job (Session() is MPI.SESSION_NULL)."""

    __slots__ = ()
    _kind = "session"

    def __repr__(self):
        return f"<gpucoll.MPI.Session {'null' if self._s is None else hex(id(self._s))}>"

    def _st(self, what):
        if self._s is None:
            raise InvalidUsageError(f"Session.{what}: the session is MPI.SESSION_NULL", error_class=ERR_SESSION)
        return self._s

    @classmethod
    def Init(cls, info=None, errhandler=None):
        """A new session (local: nothing is exchanged)."""
        handler = _eh.PREDEFINED["ERRORS_RETURN"] if errhandler is None else errhandler
        return cls._of(_SessionState(handler._s, dict(info.items()) if info else {}))._register()

    def Finalize(self):
        self._st("Finalize")
        self._s = None

    def free(self):
        """Finalize the session unless it is MPI.SESSION_NULL."""
        if self._s is not None:
            self.Finalize()

    def Get_num_psets(self, info=None):
        self._st("Get_num_psets")
        return len(PSETS)

    def Get_nth_pset(self, n, info=None):
        self._st("Get_nth_pset")
        if not 0 <= n < len(PSETS):
            raise InvalidUsageError(f"Session.Get_nth_pset: {n} is not one of the {len(PSETS)} process sets",
                                    error_class=ERR_ARG)
        return PSETS[n]

    def _pset(self, name, what):
        self._st(what)
        if name not in PSETS:
            raise InvalidUsageError(f"Session.{what}: no process set is named {name!r} (there are {PSETS})",
                                    error_class=ERR_ARG)
        return _pset_ranks(name)

    def Get_pset_info(self, pset_name):
        """An Info with the set's "mpi_size"."""
        return Info.Create({"mpi_size": str(len(self._pset(pset_name, "Get_pset_info")))})

    def Create_group(self, pset_name):
        return Group._from_ranks(self._pset(pset_name, "Create_group"))

    def Get_info(self):
        return Info.Create(dict(self._st("Get_info").info, thread_level="MPI_THREAD_MULTIPLE"))

    # --- error handlers (kept and called by Call_errhandler; errors are always raised) ------------
    @classmethod
    def Create_errhandler(cls, errhandler_fn):
        return _eh.create(errhandler_fn)

    def Get_errhandler(self):
        return _eh.Errhandler._of(self._st("Get_errhandler").errhandler)

    def Set_errhandler(self, errhandler):
        state = self._st("Set_errhandler")
        if not errhandler:
            raise InvalidUsageError("Session.Set_errhandler: the handler is MPI.ERRHANDLER_NULL", error_class=ERR_ARG)
        state.errhandler = errhandler._s

    def Call_errhandler(self, errorcode):
        _eh.invoke(self._st("Call_errhandler").errhandler, self, errorcode)

    # --- buffered sends: they are eager, so an attached buffer is only kept ------------------------
    def Attach_buffer(self, buf):
        self._st("Attach_buffer").buffer = buf

    def Detach_buffer(self):
        state = self._st("Detach_buffer")
        if state.buffer is None:
            raise InvalidUsageError("Session.Detach_buffer: no buffer is attached", error_class=_C["ERR_BUFFER"])
        buf, state.buffer = state.buffer, None
        return buf

    def Flush_buffer(self):
        self._st("Flush_buffer")

    def Iflush_buffer(self):
        from .request import Request

        self._st("Iflush_buffer")
        return Request()


def group_of_pset(session, pset_name):
    """Group.Create_from_session_pset."""
    return session.Create_group(pset_name)
