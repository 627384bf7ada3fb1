"""A drop-in for `from mpi4py import MPI`: the names typical mpi4py programs use.

    from gpucoll import MPI          # instead of: from mpi4py import MPI
    comm = MPI.COMM_WORLD
    comm.Allreduce(MPI.IN_PLACE, [buf, MPI.DOUBLE], op=MPI.SUM)

What gpucoll does not provide raises NotImplementedError naming the missing piece.
"""
import socket
import time

from . import comm as _comm
from . import ops as _ops
from . import world as _world
from .buffers import Datatype
from .errors import GpucollError
from .p2p import ANY_SOURCE, ANY_TAG, PROC_NULL, Status
from .request import Request

Comm = Intracomm = _comm.Communicator
REQUEST_NULL = Request()  # mpi4py's null request: false, complete, ignored by Waitany
Exception = GpucollError  # noqa: A001 - mpi4py's name
IN_PLACE = _comm.IN_PLACE
UNDEFINED = _comm.UNDEFINED
Op = _ops.Op
SUM, PROD, MAX, MIN, BAND, BOR, BXOR = _ops.SUM, _ops.PROD, _ops.MAX, _ops.MIN, _ops.BAND, _ops.BOR, _ops.BXOR

# Datatypes, by the C types they stand for on x86-64 and aarch64 Linux.
BYTE = UNSIGNED_CHAR = UINT8_T = Datatype("uint8")
CHAR = SIGNED_CHAR = INT8_T = Datatype("int8")
SHORT = INT16_T = Datatype("int16")
UNSIGNED_SHORT = UINT16_T = Datatype("uint16")
INT = INT32_T = Datatype("int32")
UNSIGNED = UNSIGNED_INT = UINT32_T = Datatype("uint32")
LONG = LONG_LONG = INT64_T = Datatype("int64")
UNSIGNED_LONG = UNSIGNED_LONG_LONG = UINT64_T = Datatype("uint64")
FLOAT = Datatype("float32")
DOUBLE = Datatype("float64")
C_FLOAT_COMPLEX = COMPLEX = Datatype("complex64")
C_DOUBLE_COMPLEX = DOUBLE_COMPLEX = Datatype("complex128")
BOOL = C_BOOL = CXX_BOOL = Datatype("bool")

_MISSING = {
    "LAND": "logical reduction ops (use BAND on bool buffers)", "LOR": "logical reduction ops (use BOR)",
    "LXOR": "logical reduction ops (use BXOR)", "MAXLOC": "MAXLOC/MINLOC pair reductions",
    "MINLOC": "MAXLOC/MINLOC pair reductions", "REPLACE": "one-sided communication (RMA)",
    "Win": "one-sided communication (RMA)", "File": "MPI-IO", "Intercomm": "intercommunicators",
    "Cartcomm": "topology communicators", "Graphcomm": "topology communicators",
    "LONG_DOUBLE": "long double buffers", "Create_struct": "derived datatypes",
    "Info": "MPI_Info objects", "Group": "process groups (use Comm.Split)",
}


_COMM_SELF = None


def Wtime():
    return time.perf_counter()


def Wtick():
    return time.get_clock_info("perf_counter").resolution


def Get_processor_name():
    return socket.gethostname()


def Init():
    _world.init()


Init_thread = Init


def Is_initialized():
    return _world.initialized()


def Finalize():
    """Nothing to do: gpucoll cleans up at exit."""


def Is_finalized():
    return False


def Get_version():
    return (3, 1)


def __getattr__(name):
    if name == "COMM_WORLD":
        return _world.init()
    if name == "COMM_SELF":
        # One object, as in mpi4py: each new one would share the first one's name (and so its
        # message matching) without sharing its state.
        global _COMM_SELF
        if _COMM_SELF is None:
            world = _world.init()
            _COMM_SELF = _comm.Communicator(world._ctx, f"self{world.rank}", [world.rank])
        return _COMM_SELF
    if name in _MISSING:
        raise NotImplementedError(f"gpucoll.MPI.{name}: {_MISSING[name]} are not supported by gpucoll")
    raise AttributeError(f"gpucoll.MPI has no attribute {name!r} (mpi4py names that gpucoll lacks raise "
                         "NotImplementedError; this one is not an mpi4py name either)")


__all__ = ["COMM_WORLD", "Comm", "Intracomm", "Request", "Status", "IN_PLACE", "ANY_SOURCE", "ANY_TAG",
           "SUM", "PROD", "MAX", "MIN", "BAND", "BOR", "BXOR", "Wtime", "Get_processor_name"]
