"""MPI reduction operations: the predefined ones, user-defined ones (Op.Create), and how each
combines two NumPy arrays (what the composite reductions and Reduce_local run).

An Op that gpucoll's engines have (SUM, PROD, MAX, MIN, BAND, BOR, BXOR) carries it as `core`:
a reduction with it on a dtype the engines have goes to them. Everything else (LAND, LOR,
LXOR, MAXLOC, MINLOC, REPLACE, NO_OP, user functions, long double) is combined here with
NumPy, in rank order: result = x0 op x1 op ... op x(n-1), the order MPI defines for
non-commutative operations.
"""
import numpy as np

from ..base import ops as _core
from ..base.errors import InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C

ERR_OP = _C["ERR_OP"]
MAX_USER_OPS = 32  # live user-defined operations at a time, as in mpi4py


def op_error(message):
    return InvalidUsageError(message, error_class=ERR_OP)


class _OpRec:
    """What an Op handle refers to."""

    __slots__ = ("name", "handle", "core", "array", "py", "function", "commute", "predefined")

    def __init__(self, name, handle, core=None, array=None, py=None, function=None, commute=True,
                 predefined=True):
        self.name, self.handle, self.core, self.array, self.py = name, handle, core, array, py
        self.function, self.commute, self.predefined = function, commute, predefined


class Op:
    """A reduction operation handle (MPI.SUM, MPI.MAXLOC, Op.Create(f), ...)."""

    __slots__ = ("_r", "_foreign", "__weakref__")

    def __new__(cls, op=None):
        obj = object.__new__(cls)
        obj._r, obj._foreign = None, False
        if op is not None:
            if not isinstance(op, Op):
                raise TypeError(f"Op() takes an Op or None, not {type(op).__name__}")
            obj._r = op._r
        return obj

    @classmethod
    def _of(cls, rec):
        obj = object.__new__(cls)
        obj._r, obj._foreign = rec, False
        return obj

    def __bool__(self):
        return self._r is not None

    def __eq__(self, other):
        if not isinstance(other, Op):
            return NotImplemented
        return self._r is other._r

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # a handle (Free nulls it): unhashable, as in mpi4py

    def __lt__(self, other):
        raise TypeError("operations are not ordered")

    __le__ = __gt__ = __ge__ = __lt__

    def __repr__(self):
        return f"<gpucoll.MPI.Op {self._r.name if self._r else 'OP_NULL'}>"

    def __reduce__(self):
        r = self._r
        if r is None or r.predefined:
            name = "OP_NULL" if r is None else r.name
            if r is None and self is not PREDEFINED["OP_NULL"]:
                return (type(self), ())
            return (_canonical, (name,)) if self is PREDEFINED.get(name) else (type(self), (PREDEFINED[name],))
        if self._foreign:
            raise ValueError("cannot pickle a user-defined Op made by Op.fromint: its function is unknown")
        return (_recreate, (r.function, r.commute))

    def _rec(self, what):
        if self._r is None:
            raise op_error(f"{what}: the operation is MPI.OP_NULL")
        return self._r

    # --- handles ---------------------------------------------------------------------
    @property
    def handle(self):
        return 0 if self._r is None else self._r.handle

    def toint(self):
        return self.handle

    py2f = toint

    @classmethod
    def fromint(cls, value):
        rec = _BY_HANDLE.get(value)
        op = cls._of(rec)
        op._foreign = rec is not None and not rec.predefined
        return op

    f2py = fromhandle = fromint

    # --- mpi4py API --------------------------------------------------------------------
    @classmethod
    def Create(cls, function, commute=False):
        """A user-defined operation: function(invec, inoutvec, datatype) sets inoutvec to
        invec op inoutvec (both are MPI.buffer views of the bytes)."""
        if not callable(function):
            raise TypeError("Op.Create needs a callable")
        if len(_USER) >= MAX_USER_OPS:
            raise RuntimeError(f"Op.Create: at most {MAX_USER_OPS} user-defined operations may exist at a time; "
                               "Free() some first")
        rec = _OpRec(getattr(function, "__name__", "user op"), _next_handle(), function=function,
                     commute=bool(commute), predefined=False)
        _USER[rec.handle] = rec
        _BY_HANDLE[rec.handle] = rec
        return cls._of(rec)

    def Free(self):
        r = self._rec("Op.Free")
        if r.predefined:
            raise op_error(f"Op.Free: {r.name} is predefined and cannot be freed")
        _USER.pop(r.handle, None)
        _BY_HANDLE.pop(r.handle, None)
        self._r = None

    def free(self):
        """Free a user-defined operation; null and predefined ones are left alone (a copy of a
        predefined one becomes null)."""
        r = self._r
        if r is None or any(self is v for v in PREDEFINED.values()):
            return
        if r.predefined:
            self._r = None
            return
        self.Free()

    def Is_commutative(self):
        return self._rec("Is_commutative").commute

    is_commutative = property(Is_commutative)

    @property
    def is_predefined(self):
        return self._r is None or self._r.predefined

    def Reduce_local(self, inbuf, inoutbuf):
        """Compute inoutbuf = inbuf op inoutbuf, on this rank only (GPU buffers through host memory)."""
        from .message import local_pair
        from .hostcopy import HostStage

        stage = HostStage()
        a, b, datatype, finish = local_pair(stage.spec(inbuf, False, "Reduce_local inbuf"),
                                            stage.spec(inoutbuf, True, "Reduce_local inoutbuf"))
        combine(self, a, b, datatype)
        finish()
        stage.finish()

    def __call__(self, x, y):
        """Return x op y for Python objects (what the object methods, such as allreduce, use)."""
        r = self._r
        if r is None:
            raise ValueError("MPI.OP_NULL cannot be called")
        if r.function is not None:
            return r.function(x, y, None)
        return r.py(x, y)


def _canonical(name):
    return PREDEFINED[name]


def _recreate(function, commute):
    return Op.Create(function, commute)


_USER = {}       # handle -> _OpRec of live user-defined operations
_BY_HANDLE = {}  # handle -> _OpRec
_handles = [100]


def _next_handle():
    _handles[0] += 1
    return _handles[0]


# --- combining arrays: inout = a op inout ----------------------------------------------------
def _logical(fn):
    def run(a, b):
        b[...] = fn(a != 0, b != 0)
    return run


def _loc(better):
    """MAXLOC/MINLOC on (value, index) records: the better value, the lower index on a tie."""
    def run(a, b):
        av, bv, ai, bi = a["value"], b["value"], a["index"], b["index"]
        take = better(av, bv) | ((av == bv) & (ai < bi))
        b[take] = a[take]
    return run


def _numeric(fn):
    def run(a, b):
        fn(a, b, out=b)
    return run


def _replace(a, b):
    b[...] = a


def _py_loc(better):
    def run(u, v):
        (x, i), (y, j) = u, v
        if better(y, x) or (y == x and j < i):
            return (y, j)
        return (x, i)
    return run


_SPECS = (  # name, handle (Open MPI's), core op, array kernel, Python function
    ("MAX", 1, _core.MAX, _numeric(np.maximum), lambda x, y: y if y > x else x),
    ("MIN", 2, _core.MIN, _numeric(np.minimum), lambda x, y: y if y < x else x),
    ("SUM", 3, _core.SUM, _numeric(np.add), lambda x, y: x + y),
    ("PROD", 4, _core.PROD, _numeric(np.multiply), lambda x, y: x * y),
    ("LAND", 5, None, _logical(np.logical_and), lambda x, y: x and y),
    ("BAND", 6, _core.BAND, _numeric(np.bitwise_and), lambda x, y: x & y),
    ("LOR", 7, None, _logical(np.logical_or), lambda x, y: x or y),
    ("BOR", 8, _core.BOR, _numeric(np.bitwise_or), lambda x, y: x | y),
    ("LXOR", 9, None, _logical(np.logical_xor), lambda x, y: bool(x) != bool(y)),
    ("BXOR", 10, _core.BXOR, _numeric(np.bitwise_xor), lambda x, y: x ^ y),
    ("MAXLOC", 11, None, _loc(np.greater), _py_loc(lambda y, x: y > x)),
    ("MINLOC", 12, None, _loc(np.less), _py_loc(lambda y, x: y < x)),
    ("REPLACE", 13, None, _replace, lambda x, y: y),
    ("NO_OP", 14, None, lambda a, b: None, lambda x, y: x),
)
PREDEFINED = {"OP_NULL": Op()}
for _name, _handle, _c, _array, _py in _SPECS:
    _rec = _OpRec(_name, _handle, _c, _array, _py)
    _BY_HANDLE[_handle] = _rec
    PREDEFINED[_name] = Op._of(_rec)
# gpucoll's own AVG (no MPI name): accepted wherever an MPI op is, reduced by the engines only.
_BY_HANDLE[15] = AVG_REC = _OpRec("AVG", 15, _core.AVG, None, None)

_BITWISE = frozenset({"BAND", "BOR", "BXOR"})
_ORDERED = frozenset({"MAX", "MIN"})


def as_op(op):
    """The _OpRec of an MPI Op or of one of gpucoll's own ops (gpucoll.SUM, gpucoll.AVG)."""
    if isinstance(op, Op):
        if op._r is None:
            raise op_error("the reduction operation is MPI.OP_NULL")
        return op._r
    if isinstance(op, _core.Op):
        if op is _core.AVG:
            return AVG_REC
        return PREDEFINED[op.name]._r
    raise TypeError(f"op must be an MPI.Op (MPI.SUM, MPI.MAX, ...), not {type(op).__name__}")


def check(rec, elem_dt, datatype):
    """Raise when the predefined op `rec` is not defined on elements of NumPy dtype elem_dt."""
    if rec.function is not None or rec.name in ("REPLACE", "NO_OP"):
        return
    kind = elem_dt.kind
    if rec.name in ("MAXLOC", "MINLOC"):
        if elem_dt.names != ("value", "index"):
            raise op_error(f"{rec.name} needs a (value, index) pair type such as MPI.DOUBLE_INT, not "
                           f"{datatype.Get_name()}")
        return
    if elem_dt.names is not None or kind in "SUV":
        raise op_error(f"{rec.name} is not defined on {datatype.Get_name()}")
    if rec.name in _BITWISE and kind not in "iub":
        raise op_error(f"{rec.name} is a bitwise operation: it needs an integer or bool type, not "
                       f"{datatype.Get_name()}")
    if rec.name in _ORDERED and kind == "c":
        raise op_error(f"{rec.name} is not defined on complex numbers ({datatype.Get_name()})")


def combine(op, a, b, datatype):
    """b = a op b, elementwise: a, b are NumPy arrays of one element dtype (b is written)."""
    rec = op if isinstance(op, _OpRec) else as_op(op)
    if rec.function is not None:
        from .buffer import buffer

        rec.function(buffer.wrap(a), buffer.wrap(b), datatype)
        return
    if rec.array is None:  # AVG: the engines' own, with no meaning element by element
        raise op_error("gpucoll.AVG is reduced by gpucoll's engines only; this call needs a combined "
                       "reduction (use MPI.SUM and divide)")
    check(rec, b.dtype, datatype)
    if b.size:
        rec.array(a, b)
