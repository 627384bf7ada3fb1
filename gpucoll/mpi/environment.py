"""gpucoll.MPI's module-level functions: initialisation, versions, timers, error classes and
codes, memory, addresses and buffered-send buffers."""
import ctypes
import os
import socket
import sys
import time

from .. import __version__
from .._native.exporter import AddressConstant
from ..api import world as _world
from ..base import mpi_errors as _exc
from ..base.errors import GpucollError, InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C
from .buffer import buffer

__all__ = ["Init", "Init_thread", "Finalize", "Is_initialized", "Is_finalized", "Query_thread", "Is_thread_main",
           "Get_version", "Get_library_version", "get_vendor", "Get_processor_name", "Wtime", "Wtick", "Pcontrol",
           "Get_error_class", "Get_error_string", "Add_error_class", "Add_error_code", "Add_error_string",
           "Remove_error_class", "Remove_error_code", "Remove_error_string", "Alloc_mem", "Free_mem", "Get_address",
           "Aint_add", "Aint_diff", "Compute_dims", "Attach_buffer", "Detach_buffer", "Flush_buffer",
           "Iflush_buffer", "Get_abi_version", "Get_abi_info", "Get_abi_fortran_info",
           "Open_port", "Close_port", "Publish_name", "Unpublish_name", "Lookup_name"]

_finalized = [False]


def Init():
    """Join the job (gpucoll.MPI joins on first use of COMM_WORLD; this does it now)."""
    _world.init()


def Init_thread(required=_C["THREAD_MULTIPLE"]):
    _world.init()
    return _C["THREAD_MULTIPLE"]


def Finalize():
    """Nothing to release early: gpucoll ends its connections at exit."""
    _finalized[0] = True


_abort_status = [0]


def _set_abort_status(status):
    """Set the status this process ends with at exit, as MPI_Abort would end it (non-zero: gpurun
    then stops the job); mpi4py.run and mpi4py.futures' workers call it on an error they catch."""
    import atexit

    try:
        code = int(status)
    except (TypeError, ValueError):
        code = 0 if status is None else 1  # sys.exit's convention for a status that is not a number
    if code and not _abort_status[0]:
        atexit.register(_abort_at_exit)
    _abort_status[0] = code


def _abort_at_exit():
    code = _abort_status[0]
    if code:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if 0 < code < 256 else 1)


def Is_initialized():
    return _world.initialized()


def Is_finalized():
    return _finalized[0]


def Query_thread():
    return _C["THREAD_MULTIPLE"]  # every call is thread-safe in gpucoll


def Is_thread_main():
    import threading

    return threading.current_thread() is threading.main_thread()


def Get_version():
    return (_C["VERSION"], _C["SUBVERSION"])


def Get_library_version():
    return f"gpucoll {__version__} (mpi4py's API over gpucoll's engines)"


def get_vendor():
    """The pair ('gpucoll', version): programs that special-case MPI libraries see that this is none of them."""
    return ("gpucoll", tuple(int(p) for p in __version__.split(".")[:3]))


def Get_processor_name():
    return socket.gethostname()


def Wtime():
    return time.perf_counter()


def Wtick():
    return time.get_clock_info("perf_counter").resolution


def Pcontrol(level):
    """Profiling control: gpucoll has no profiling layer to switch, so this does nothing."""
    if not isinstance(level, int):
        raise TypeError("Pcontrol takes an int level")


# --- error classes and codes ---------------------------------------------------------------------
def Get_error_class(errorcode):
    return _exc.error_class_of(errorcode)


def Get_error_string(errorcode):
    return _exc.error_string_of(errorcode)


def _last_used():
    return max([_C["ERR_LASTCODE"], *_exc.added_classes, *_exc.added_strings])


def Add_error_class():
    code = _last_used() + 1
    _exc.added_classes[code] = code
    return code


def Add_error_code(errorclass):
    if errorclass not in _exc.added_classes.values() and not _C["SUCCESS"] <= errorclass <= _C["ERR_LASTCODE"]:
        raise InvalidUsageError(f"Add_error_code: {errorclass} is not an error class", error_class=_C["ERR_ARG"])
    code = _last_used() + 1
    _exc.added_classes[code] = errorclass
    return code


def Add_error_string(errorcode, string):
    if errorcode not in _exc.added_classes:
        raise InvalidUsageError(f"Add_error_string: {errorcode} was not added by Add_error_class/code",
                                error_class=_C["ERR_ARG"])
    _exc.added_strings[errorcode] = string


def _removable(code, what):
    if code not in _exc.added_classes:
        raise InvalidUsageError(f"{what}: {code} was not added by this program", error_class=_C["ERR_ARG"])


def Remove_error_class(errorclass):
    _removable(errorclass, "Remove_error_class")
    if any(c != errorclass and k == errorclass for c, k in _exc.added_classes.items()) or \
            errorclass in _exc.added_strings:
        raise InvalidUsageError("Remove_error_class: its codes or string are still there", error_class=_C["ERR_ARG"])
    del _exc.added_classes[errorclass]


def Remove_error_code(errorcode):
    _removable(errorcode, "Remove_error_code")
    if _exc.added_classes[errorcode] == errorcode or errorcode in _exc.added_strings:
        raise InvalidUsageError("Remove_error_code: it is a class, or its string is still there",
                                error_class=_C["ERR_ARG"])
    del _exc.added_classes[errorcode]


def Remove_error_string(errorcode):
    _removable(errorcode, "Remove_error_string")
    _exc.added_strings.pop(errorcode, None)


# --- memory and addresses -----------------------------------------------------------------------------
def Alloc_mem(size, info=None):
    """Size bytes of memory, as an MPI.buffer (ordinary host memory in gpucoll)."""
    return buffer.allocate(size, True)


def Free_mem(mem):
    mem.release()


def Get_address(location):
    """The address of a buffer's first byte (BOTTOM and None: 0)."""
    from .message import as_array

    if location is None:
        return 0
    if isinstance(location, AddressConstant):  # BOTTOM, IN_PLACE, BUFFER_AUTOMATIC: their address
        return int(location)
    if isinstance(location, buffer):
        return location.address  # 0 for MPI.buffer.fromaddress(0, 0), as a dynamic window's memory
    arr = as_array(location, True, "Get_address")
    return arr.__array_interface__["data"][0] if arr.size else ctypes.addressof(ctypes.c_char.from_buffer(
        bytearray(1)))


def Aint_add(base, disp):
    return base + disp


def Aint_diff(addr1, addr2):
    return addr1 - addr2


def Compute_dims(nnodes, dims):
    """Split nnodes into len(dims) factors as evenly as possible; non-zero entries of dims are kept."""
    if isinstance(dims, int):
        dims = [0] * dims
    dims = list(dims)
    fixed = 1
    for d in dims:
        if d < 0:
            raise InvalidUsageError(f"Compute_dims: negative dimension {d}", error_class=_C["ERR_DIMS"])
        if d:
            fixed *= d
    free = [i for i, d in enumerate(dims) if d == 0]
    if fixed == 0 or nnodes % fixed:
        raise InvalidUsageError(f"Compute_dims: {nnodes} nodes cannot be split with fixed dimensions {dims}",
                                error_class=_C["ERR_DIMS"])
    rest = nnodes // fixed
    if not free:
        if rest != 1:
            raise InvalidUsageError(f"Compute_dims: dimensions {dims} do not multiply to {nnodes}",
                                    error_class=_C["ERR_DIMS"])
        return dims
    factors = [1] * len(free)
    for p in _prime_factors(rest):  # largest primes first, each onto the smallest dimension so far
        factors[factors.index(min(factors))] *= p
    for i, f in zip(free, sorted(factors, reverse=True)):
        dims[i] = f
    return dims


def _prime_factors(n):
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return sorted(out, reverse=True)


# --- buffered sends: gpucoll's sends are eager, so the attached buffer is only kept ------------------------
_attached = [None]


def Attach_buffer(buf):
    from .message import as_array

    if buf is not _C and not isinstance(buf, BufferAutomaticType):
        arr = as_array(buf, False, "Attach_buffer") if not isinstance(buf, buffer) else buf
        if not arr.flags.writeable:
            raise BufferError("Attach_buffer: the buffer is read-only")
    _attached[0] = buf


def Detach_buffer():
    buf, _attached[0] = _attached[0], None
    if buf is None:
        raise GpucollError(_C["ERR_BUFFER"])
    return buf


def Flush_buffer():
    """Buffered sends have all left (they are eager): nothing to wait for."""


def Iflush_buffer():
    from .request import Request

    return Request()


from .ports import Close_port, Lookup_name, Open_port, Publish_name, Unpublish_name  # noqa: E402,F401 - MPI module functions


def Get_abi_version():
    """The pair (-1, -1): gpucoll implements mpi4py's API, not the MPI 5 binary interface."""
    return (-1, -1)


def Get_abi_info():
    """The sizes of MPI's address, count and offset integers (what gpucoll.MPI's AINT, COUNT and
    OFFSET datatypes are)."""
    from .datatype import NAMES
    from .info import Info

    return Info.Create({f"mpi_{name}_size": str(NAMES[name.upper()].Get_size()) for name in ("aint", "count",
                                                                                           "offset")})


def Get_abi_fortran_info():
    """MPI.INFO_NULL: gpucoll has no Fortran binding."""
    from .info import Info

    return Info()


class BufferAutomaticType(AddressConstant):
    """Type of MPI.BUFFER_AUTOMATIC: buffered sends take their buffer themselves (the MPI ABI's -2)."""

    name, address = "BUFFER_AUTOMATIC", -2


BUFFER_AUTOMATIC = BufferAutomaticType()


def _typealign(datatype):
    """Alignment of a named datatype (and of one that stands for it: Dup, Create_f90_*); None for
    derived ones, as mpi4py gives it (mpi4py.util.dtlib uses it)."""
    t = datatype._rec("_typealign")
    if t.contents is not None and t.base is None:
        return None
    return t.align


def _typecode(datatype):
    try:
        return datatype.tocode()
    except ValueError:
        return None
