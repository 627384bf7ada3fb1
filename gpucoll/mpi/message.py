"""Buffer arguments as mpi4py reads them -> bytes in memory, a count and a datatype.

    buf                               the whole buffer; the datatype from its format
    [buf, datatype]                   datatype: an MPI.Datatype or a type code such as 'i'
    [buf, count, datatype]            count elements (per rank where the call has blocks)
    [buf, (count, displ), datatype]   starting displ elements in
    [buf, counts, displs, datatype]   vector calls (Gatherv, ...): one count and displacement per rank
    None                              nothing (with PROC_NULL, or a count of 0)

`buf` is anything with the buffer protocol (NumPy arrays, bytearray, array.array), a CPU
DLPack tensor (`__dlpack__`) or an object with `__cuda_array_interface__` whose memory is host
memory; GPU arrays (CuPy, torch) are handed to gpucoll's GPU path untouched (`Msg.gpu`).
A message is a 1-D uint8 view (`raw`) starting at its first byte, `count` elements of
`datatype`; `data()` gives its bytes packed, `store()` writes packed bytes back.
"""
import ctypes
import operator

import numpy as np

from .._native.exporter import AddressConstant
from ..api.comm import IN_PLACE
from ..base.mpi_constants import INTEGERS as _C
from ..engines.p2p.host import PROC_NULL
from . import datatype as _dt
from .hostcopy import _cuda_loaded, _is_device_pointer, active_stage, gpu_buffer_of as _gpu_buffer
from .memory import Msg, as_array  # noqa: F401 - the message layer's names, for its users


class BottomType(AddressConstant):
    """Type of MPI.BOTTOM: the address 0, for messages whose datatype holds absolute addresses."""

    name, address = "BOTTOM", 0

    def __index__(self):
        return 0


BOTTOM = BottomType()


def is_in_place(obj):
    return obj is None or obj is IN_PLACE


# NumPy dtypes (native byte order) that stand for a predefined MPI datatype: arrays of these,
# C-contiguous and given whole, are messages as they are (the point-to-point short paths).
_BASIC_CHARS = "?bBhHiIlLqQefdgFDG"
BASIC_DTYPES = frozenset(dt for dt in map(np.dtype, _BASIC_CHARS) if _dt.for_numpy(dt) is not None)
# The same as the buffer formats of their arrays (equal dtypes, such as "l" and "q", have distinct formats).
BASIC_FORMATS = frozenset(memoryview(np.empty(0, c)).format for c in _BASIC_CHARS if np.dtype(c) in BASIC_DTYPES)


# --- bytes of a buffer object ---------------------------------------------------------------
class DeviceSpan:
    """The elements of a GPU array that [buf, count, displ, TYPE] names, as a device array of
    TYPE's dtype over the same memory (no copy); keeps the array alive."""

    def __init__(self, owner, addr, count, dtype):
        self.owner = owner
        self._interface = {"version": 3, "shape": (count,), "typestr": dtype.str, "data": (addr, False),
                           "strides": None}

    @property
    def __cuda_array_interface__(self):
        return self._interface


def _derived(t):
    """A datatype whose elements are not one basic value each, one after the other."""
    return t.np is None or t.contents is not None


def _device_span(obj, count, displ, datatype, what):
    """A DeviceSpan of count elements of a basic datatype from displacement displ of a GPU array
    (no copy); None for no elements."""
    t = datatype._t
    gpu = _gpu_buffer(obj, what)
    elements = gpu.nbytes // t.extent
    displ = 0 if displ is None else _index(displ, what, "displacement")
    count = elements - displ if count is None else _index(count, what, "count")
    if displ < 0 or count < 0 or displ + count > elements:
        raise ValueError(f"{what}: {count} elements at displacement {displ} do not fit the GPU buffer's "
                         f"{elements} {datatype.Get_name()} elements")
    return DeviceSpan(obj, gpu.addr + displ * t.extent, count, t.np) if count else None


def _device_packed(obj, count, displ, datatype, writable, what):
    """count elements of a derived datatype from displacement displ of a GPU array, gathered on
    the device into a contiguous array (of the type's one basic type, else bytes) that the GPU
    path moves, and for a buffer the call writes the scatter back, enqueued on the current
    stream after the call (so in stream order, as the call itself); (None, None) for no elements."""
    import cupy

    t = datatype._t
    name = datatype.Get_name() or "the derived datatype"
    if t.extent <= 0:
        raise ValueError(f"{what}: {name} has extent {t.extent}; a GPU buffer of it has no element count")
    gpu = _gpu_buffer(obj, what)
    displ = 0 if displ is None else _index(displ, what, "displacement")
    count = gpu.nbytes // t.extent - displ if count is None else _index(count, what, "count")
    if displ < 0 or count < 0:
        raise ValueError(f"{what}: {count} elements at displacement {displ} of {name}")
    if count == 0 or t.size == 0:
        return None, None
    where = t.byte_index(count) + displ * t.extent
    if where.min() < 0 or where.max() >= gpu.nbytes:
        raise ValueError(f"{what}: {count} elements of {name} at displacement {displ} reach outside the GPU "
                         f"buffer's {gpu.nbytes} bytes")
    with cupy.cuda.Device(gpu.device):
        memory = cupy.cuda.UnownedMemory(gpu.addr, gpu.nbytes, obj, gpu.device)
        whole = cupy.ndarray(gpu.nbytes, cupy.uint8, cupy.cuda.MemoryPointer(memory, 0))
        index = cupy.asarray(where)
        packed = whole[index]
    e = t.element()
    typed = packed.view(e.np) if e is not None and e.np is not None else packed

    def unpack():
        with cupy.cuda.Device(gpu.device):
            whole[index] = packed
    return typed, (unpack if writable else None)


def is_plain(msg):
    """Whether a message's buffer has the buffer protocol itself (not a DLPack or interface view)."""
    buf = msg[0] if isinstance(msg, (list, tuple)) and msg else msg
    if isinstance(buf, (np.ndarray, bytes, bytearray, memoryview)) or buf is None or buf is BOTTOM:
        return True
    try:
        memoryview(buf)
        return True
    except TypeError:
        return False


def _raw(arr):
    flat = arr.reshape(-1, order="A") if arr.ndim != 1 else arr
    return flat.view(np.uint8) if flat.dtype.itemsize and flat.size else np.zeros(0, np.uint8) \
        if arr.nbytes == 0 else flat.view(np.uint8)


def _inferred(arr, what):
    dt = arr.dtype
    if dt.char == "B" or dt.kind == "V" and not dt.names:
        return _dt.NAMES["BYTE"]
    if not dt.isnative:
        raise BufferError(f"{what}: the buffer's byte order is not this machine's ({dt.str})")
    t = _dt.for_numpy(dt)
    if t is None:
        raise KeyError(f"{what}: cannot map the buffer's format {dt.str!r} to an MPI datatype")
    return _dt.Datatype._of(t)


def as_datatype(value, what):
    if isinstance(value, _dt.Datatype):
        return value
    if isinstance(value, str):
        found = _dt.from_typechar(value)
        if found is None:
            raise KeyError(f"{what}: cannot map {value!r} to an MPI datatype")
        return found
    raise TypeError(f"{what}: {value!r} is not an MPI datatype")


def _is_datatype(value):
    return isinstance(value, (_dt.Datatype, str))


def _index(value, what, name):
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what}: the {name} {value!r} is not an integer") from None


def _split(msg, what, vector):
    """(buf, count, displ, datatype) of mpi4py's message forms."""
    count = displ = dtype = None
    if isinstance(msg, (list, tuple)):
        n = len(msg)
        if n == 2:
            buf, count = msg
            if _is_datatype(count):
                count, dtype = None, count
            elif isinstance(count, tuple) or (not vector and isinstance(count, list)):
                count, displ = count
        elif n == 3:
            buf, count, dtype = msg
            if isinstance(count, tuple) or (not vector and isinstance(count, list)):
                count, displ = count
        elif n == 4:
            buf, count, displ, dtype = msg
        else:
            raise ValueError(f"{what}: a message is [buf, count, displ, datatype] (2 to 4 items), not {n} items")
    else:
        buf = msg
    return buf, count, displ, dtype


def _buffer(buf, dtype, readonly, what):
    """(raw bytes, datatype, gpu object) of a message's buffer part."""
    if buf is None or buf is BOTTOM:
        if dtype is None:
            raise ValueError(f"{what}: a None buffer needs an explicit datatype")
        return np.zeros(0, np.uint8), as_datatype(dtype, what), None
    gpu = _gpu_buffer(buf, what)
    if gpu is not None:
        datatype = as_datatype(dtype, what) if dtype is not None else _dt.Datatype._of(_dt.for_numpy(
            _dt._dtypes.numpy_dtype(gpu.code)) or _dt._BY_NAME["BYTE"])
        return None, datatype, buf
    arr = as_array(buf, readonly, what)
    datatype = as_datatype(dtype, what) if dtype is not None else _inferred(arr, what)
    return _raw(arr), datatype, None


def simple(msg, readonly, rank=0, blocks=0, what="buffer"):
    """The Msg of a buffer argument; None for PROC_NULL. blocks >= 2: an inferred count is per
    block (the per-rank buffers of Gather, Scatter, Allgather, Alltoall)."""
    if rank == PROC_NULL:
        return None
    if not (isinstance(msg, (list, tuple)) or msg is None or msg is BOTTOM or _is_buffer_like(msg)):
        raise TypeError(f"{what}: expecting a buffer or a list/tuple [buf, count, datatype], not "
                        f"{type(msg).__name__}")
    buf, count, displ, dtype = _split(msg, what, vector=False)
    raw, datatype, gpu = _buffer(buf, dtype, readonly, what)
    t = datatype._t
    if buf is BOTTOM and count:
        return at_address(0, _index(count, what, "count"), datatype, what, readonly)
    if gpu is not None:
        if count is not None and blocks >= 2:  # a count per rank: the blocks of every rank
            count = _index(count, what, "count") * blocks
        if t is not None and _derived(t):
            packed, unpack = _device_packed(gpu, count, displ, datatype, not readonly, what)
            if packed is None:
                return Msg(np.zeros(0, np.uint8), 0, datatype)
            return Msg(None, None, datatype, packed, unpack=unpack)
        if count is not None or displ is not None:
            gpu = _device_span(gpu, count, displ, datatype, what)
            if gpu is None:  # no elements: an empty message, as an empty GPU array is
                return Msg(np.zeros(0, np.uint8), 0, datatype)
        return Msg(None, None, datatype, gpu)
    length = raw.size
    if displ is not None:
        displ = _index(displ, what, "displacement")
        if displ < 0:
            raise ValueError(f"{what}: negative displacement {displ}")
        if displ > 0:
            extent = _extent_for(t, what, "handle a displacement")
            if displ * extent > length:
                raise ValueError(f"{what}: displacement {displ} is out of bounds: the buffer holds "
                                 f"{length // extent} elements")
            raw = raw[displ * extent:]
            length = raw.size
    if count is not None:
        count = _index(count, what, "count")
        if count < 0:
            raise ValueError(f"{what}: negative count {count}")
        if count > 0 and buf is None:
            raise ValueError(f"{what}: the buffer is None but the count is {count}")
        if count and t is not None:
            need = (max(blocks, 1) * count - 1) * t.extent + t.true_ub
            if need > length:
                per = f" ({count} for each of {blocks} ranks)" if blocks >= 2 else ""
                raise ValueError(f"{what}: {count * max(blocks, 1)} elements{per} of {t.name or 'the datatype'} "
                                 f"need {need} bytes; the buffer holds {length}")
    elif length > 0:
        extent = _extent_for(t, what, "infer the count")
        if length % extent:
            raise ValueError(f"{what}: cannot infer the count: the buffer's {length} bytes are not a multiple "
                             f"of the datatype's extent {extent}")
        count = length // extent
        if blocks >= 2:
            if count % blocks:
                raise ValueError(f"{what}: cannot infer the count: {count} elements are not a multiple of "
                                 f"the {blocks} ranks' blocks")
            count //= blocks
    else:
        count = 0
    return Msg(raw, count, datatype, plain=is_plain(buf))


def at_address(address, count, datatype, what, readonly=True):
    """The Msg of count elements of datatype at an absolute address (MPI.BOTTOM messages, whose
    datatypes hold addresses from MPI.Get_address). GPU memory there is read through a host copy
    where the call stages such blocks (hostcopy.active_stage(); written back when it completes)."""
    t = datatype._t
    if t is None:
        raise ValueError(f"{what}: the datatype is MPI.DATATYPE_NULL")
    if count == 0:
        return Msg(np.zeros(0, np.uint8), 0, datatype)
    lo = address + min(t.true_lb, t.true_lb + (count - 1) * t.extent)
    hi = address + max(t.true_ub, t.true_ub + (count - 1) * t.extent)
    if lo <= 0:
        raise ValueError(f"{what}: with MPI.BOTTOM the datatype must hold absolute addresses "
                         f"(from MPI.Get_address); this one starts at address {lo}")
    if _cuda_loaded() and _is_device_pointer(lo):  # read as host memory, it would crash the process
        stage = active_stage()
        if stage is None:
            raise NotImplementedError(f"{what}: MPI.BOTTOM with the address of GPU memory (pass the GPU array "
                                      "itself)")
        positions, lengths = t.runs(count)
        shift = lo - address
        return Msg(stage.block(lo, hi - lo, positions - shift, lengths, not readonly), count, datatype, shift=shift)
    raw = np.ctypeslib.as_array((ctypes.c_ubyte * (hi - lo)).from_address(lo))
    return Msg(raw, count, datatype, shift=lo - address)


def _extent_for(t, what, doing):
    if t is None:
        raise ValueError(f"{what}: cannot {doing}: the datatype is MPI.DATATYPE_NULL")
    if t.extent <= 0:
        raise ValueError(f"{what}: cannot {doing}: the datatype's extent is {t.extent}")
    return t.extent


def _is_buffer_like(obj):
    if isinstance(obj, (np.ndarray, bytes, bytearray, memoryview)):
        return True
    try:
        memoryview(obj)
        return True
    except TypeError:
        return hasattr(obj, "__dlpack__") or hasattr(obj, "__cuda_array_interface__") or \
            _gpu_buffer(obj, "buffer") is not None


class VMsg:
    """A vector message: counts[i] elements at displs[i] (in extents of datatype) for rank i."""

    __slots__ = ("raw", "counts", "displs", "datatype", "t", "plain")

    def __init__(self, raw, counts, displs, datatype, plain=True):
        self.raw, self.counts, self.displs, self.datatype = raw, counts, displs, datatype
        self.t = datatype._t
        self.plain = plain

    def block(self, i):
        """Rank i's part as a Msg."""
        start = self.displs[i] * self.t.extent if self.t is not None else 0
        return Msg(self.raw[start:], self.counts[i], self.datatype, plain=self.plain)


def vector(msg, readonly, rank, blocks, what="buffer"):
    """The VMsg of a vector buffer argument; None for PROC_NULL."""
    if rank == PROC_NULL:
        return None
    if not (isinstance(msg, (list, tuple)) or msg is None or msg is BOTTOM or _is_buffer_like(msg)):
        raise TypeError(f"{what}: expecting a buffer or a list/tuple [buf, counts, displs, datatype]")
    buf, counts, displs, dtype = _split(msg, what, vector=True)
    raw, datatype, gpu = _buffer(buf, dtype, readonly, what)
    if gpu is not None:
        raise NotImplementedError(f"{what}: vector collectives on GPU buffers across an intercommunicator")
    t = datatype._t
    if counts is None:
        total = 0
        if raw.size:
            extent = _extent_for(t, what, "infer the counts")
            if raw.size % extent:
                raise ValueError(f"{what}: cannot infer the counts: {raw.size} bytes are not a multiple of the "
                                 f"datatype's extent {extent}")
            total = raw.size // extent
        counts = [total // blocks + (total % blocks > i) for i in range(blocks)]
    elif _integral(counts):
        counts = [operator.index(counts)] * blocks
    else:
        counts = _int_list(counts, blocks, what, "counts")
    if displs is None:
        displs, at = [], 0
        for c in counts:
            displs.append(at)
            at += c
    elif _integral(displs):
        displs = [operator.index(displs) * i for i in range(blocks)]
    else:
        displs = _int_list(displs, blocks, what, "displacements")
    if any(c < 0 for c in counts):
        raise ValueError(f"{what}: negative count in {counts}")
    if t is not None and any(c and (d + c - 1) * t.extent + t.true_ub > raw.size for c, d in zip(counts, displs)):
        raise ValueError(f"{what}: counts {counts} at displacements {displs} reach past the buffer's "
                         f"{raw.size // max(t.extent, 1)} elements")
    return VMsg(raw, counts, displs, datatype, plain=is_plain(buf))


def _integral(value):
    """An integer (a NumPy one, or a 0-d integer array, included), as opposed to a sequence."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
        return True
    except TypeError:
        return False


def _int_list(values, blocks, what, name):
    values = [_index(v, what, name) for v in values]
    if len(values) < blocks:
        raise ValueError(f"{what}: {len(values)} {name} given, the communicator needs {blocks}")
    return values[:blocks]


def local_pair(inbuf, inoutbuf):
    """(a, b, datatype) for Op.Reduce_local: the two messages' elements, checked to match."""
    a = simple(inbuf, True, what="inbuf")
    b = simple(inoutbuf, False, what="inoutbuf")
    if a.gpu is not None or b.gpu is not None:
        raise NotImplementedError("Reduce_local on GPU buffers")
    if a.datatype != b.datatype:
        raise ValueError(f"Reduce_local: inbuf is {a.datatype.Get_name()} but inoutbuf is "
                         f"{b.datatype.Get_name()}")
    if a.count != b.count:
        raise ValueError(f"Reduce_local: inbuf has {a.count} elements, inoutbuf {b.count}")
    x, _ = a.elements()
    y, copied = b.elements()

    def finish():
        if copied:
            b.store(y.view(np.uint8))
    return x, y, b.datatype, finish
