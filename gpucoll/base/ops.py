"""Reduction operations, mpi4py-style objects carrying the native code of gc_op."""
from . import dtypes
from .errors import InvalidUsageError


class Op:
    """A reduction operation (gpucoll.SUM, MAX, ...). `code` is the native gc_op."""

    __slots__ = ("name", "code", "py")

    def __init__(self, name, code, py):
        self.name = name
        self.code = code
        self.py = py  # how the object methods (allreduce of Python objects) combine two values

    def __repr__(self):
        return f"gpucoll.{self.name}"

    def check(self, dtype_code):
        """Raise InvalidUsageError when this op makes no sense for the dtype."""
        if self.code in _BITWISE and dtype_code not in dtypes.INTEGER and dtype_code != dtypes.BOOL:
            raise InvalidUsageError(
                f"{self.name} is a bitwise operation; it needs an integer or bool buffer, not "
                f"{dtypes.name(dtype_code)}")
        if dtype_code in dtypes.COMPLEX and self.code not in (SUM.code, PROD.code, AVG.code):
            raise InvalidUsageError(f"{self.name} is not defined on complex numbers ({dtypes.name(dtype_code)}); "
                                    "use SUM, PROD or AVG")


SUM = Op("SUM", 0, lambda a, b: a + b)
PROD = Op("PROD", 1, lambda a, b: a * b)
MAX = Op("MAX", 2, lambda a, b: b if b > a else a)
MIN = Op("MIN", 3, lambda a, b: b if b < a else a)
AVG = Op("AVG", 4, None)
BAND = Op("BAND", 5, lambda a, b: a & b)
BOR = Op("BOR", 6, lambda a, b: a | b)
BXOR = Op("BXOR", 7, lambda a, b: a ^ b)
_BITWISE = frozenset({5, 6, 7})
ALL = (SUM, PROD, MAX, MIN, AVG, BAND, BOR, BXOR)


def as_op(op):
    if isinstance(op, Op):
        return op
    if isinstance(op, str):
        for candidate in ALL:
            if candidate.name == op.upper():
                return candidate
    raise InvalidUsageError(f"unknown reduction op {op!r}; use one of {', '.join(o.name for o in ALL)}")
