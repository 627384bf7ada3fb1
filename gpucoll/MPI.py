"""A drop-in for `from mpi4py import MPI`: mpi4py's API over gpucoll.

    from gpucoll import MPI          # instead of: from mpi4py import MPI
    comm = MPI.COMM_WORLD
    comm.Allreduce(MPI.IN_PLACE, [buf, MPI.DOUBLE], op=MPI.SUM)

Every name of mpi4py.MPI exists here. What gpucoll does not provide (spawning processes, the
name service, C-level handles, ...) raises NotImplementedError naming the missing feature when
it is called (gpucoll/mpi/unsupported.py lists them). The pieces live in
gpucoll/mpi/, one concept per module.
"""
from .api import comm as _core_comm
from .base.errors import GpucollError
from .base.mpi_constants import INTEGERS as _INTEGERS
from .mpi import datatype as _datatype
from .mpi import docs as _docs
from .mpi import errhandler as _errhandler
from .mpi import op as _op
from .mpi import unsupported as _unsupported
from .mpi.buffer import buffer, memory  # noqa: F401
from .mpi.comm import Comm, Intracomm  # noqa: F401
from .mpi.comm import comm_lock as _comm_lock  # noqa: F401 - mpi4py's internals that mpi4py.util uses
from .mpi.comm import comm_lock_table as _comm_lock_table  # noqa: F401
from .mpi.comm import comm_self as _comm_self
from .mpi.comm import comm_world as _comm_world
from .mpi.comm import commctx_intra as _commctx_intra  # noqa: F401
from .mpi.datatype import Datatype  # noqa: F401
from .mpi.environment import *  # noqa: F401,F403 - Init, Wtime, Get_error_class, Alloc_mem, ...
from .mpi.environment import BUFFER_AUTOMATIC, _set_abort_status, _typealign, _typecode  # noqa: F401
from .mpi.errhandler import Errhandler  # noqa: F401
from .mpi.file import File
from .mpi.group import Group, empty_group
from .mpi.handle import NAMED as _NAMED
from .mpi.info import Info
from .mpi.intercomm import Intercomm  # noqa: F401
from .mpi.intercomm import commctx_inter as _commctx_inter  # noqa: F401
from .mpi.matched import Message, no_proc
from .mpi.message import BOTTOM
from .mpi.op import Op  # noqa: F401
from .mpi.pickler import Pickle, pickle  # noqa: F401
from .mpi.request import REQUEST_NULL, Grequest, Prequest, Request  # noqa: F401
from .mpi.session import Session  # noqa: F401
from .mpi.status import Status  # noqa: F401
from .mpi.topocomm import Cartcomm, Distgraphcomm, Graphcomm, Topocomm  # noqa: F401
from .mpi.win import Win

Exception = GpucollError  # noqa: A001 - mpi4py's name; every gpucoll error carries an MPI error class
IN_PLACE = _core_comm.IN_PLACE
InPlaceType = type(IN_PLACE)
BottomType = type(BOTTOM)
BufferAutomaticType = type(BUFFER_AUTOMATIC)

globals().update(_INTEGERS)
globals().update(_datatype.NAMES)
globals().update(_op.PREDEFINED)
globals().update(_errhandler.PREDEFINED)
_typedict = _datatype.typedict()
_typedict_c = _datatype.typedict("c")
_typedict_f = _datatype.typedict("f")
_keyval_registry = {}

COMM_NULL = Comm()
GROUP_NULL = Group()
GROUP_EMPTY = empty_group()
INFO_NULL = Info()
INFO_ENV = Info.Create_env()
MESSAGE_NULL = Message()
MESSAGE_NO_PROC = no_proc()
WIN_NULL, FILE_NULL, SESSION_NULL = Win(), File(), Session()
_NAMED.update(COMM_NULL=COMM_NULL, GROUP_NULL=GROUP_NULL, GROUP_EMPTY=GROUP_EMPTY, INFO_NULL=INFO_NULL,
              INFO_ENV=INFO_ENV, MESSAGE_NULL=MESSAGE_NULL, MESSAGE_NO_PROC=MESSAGE_NO_PROC, WIN_NULL=WIN_NULL,
              FILE_NULL=FILE_NULL, SESSION_NULL=SESSION_NULL, **_errhandler.PREDEFINED)
for _handle in _NAMED.values():
    if _handle:
        _handle._register()  # so that Class.fromhandle(h.handle) finds the predefined ones too

_unsupported.install(globals())
_docs.sign(globals())
del _core_comm, _datatype, _docs, _errhandler, _op, _unsupported, _handle  # mpi4py.MPI holds no modules: neither does this


def __dir__():
    return sorted([*globals(), "COMM_WORLD", "COMM_SELF"])


def __getattr__(name):
    # COMM_WORLD and COMM_SELF join the job on first use, so that importing never blocks.
    if name == "COMM_WORLD":
        value = _comm_world()
    elif name == "COMM_SELF":
        value = _comm_self()
    else:
        raise AttributeError(f"module 'gpucoll.MPI' has no attribute {name!r}: it is not an mpi4py.MPI name "
                             "either")
    _NAMED[name] = value
    return value
