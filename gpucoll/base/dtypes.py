"""Element types: NumPy dtype <-> the native code of cython_src/include/gc_types.h."""
import numpy as np

from .errors import InvalidUsageError

# Codes mirror gc_dtype in gc_types.h.
INT8, UINT8, INT16, UINT16, INT32, UINT32, INT64, UINT64 = range(8)
FLOAT16, BFLOAT16, FLOAT32, FLOAT64, COMPLEX64, COMPLEX128, BOOL = range(8, 15)

NAMES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
         "bfloat16", "float32", "float64", "complex64", "complex128", "bool")
ITEMSIZE = (1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8, 8, 16, 1)
INTEGER = frozenset({INT8, UINT8, INT16, UINT16, INT32, UINT32, INT64, UINT64})
FLOATING = frozenset({FLOAT16, BFLOAT16, FLOAT32, FLOAT64})
COMPLEX = frozenset({COMPLEX64, COMPLEX128})

_BY_NAME = {name: code for code, name in enumerate(NAMES)}
# NumPy dtype -> code, for the dtypes NumPy itself has (bfloat16 comes through buffer specs).
CODES = {np.dtype(name): code for code, name in enumerate(NAMES) if name != "bfloat16"}


def code_of(dtype):
    """Native code of a NumPy dtype (or anything np.dtype accepts, or a dtype named
    'bfloat16' such as ml_dtypes'); raises InvalidUsageError for the rest."""
    dt = np.dtype(dtype) if not isinstance(dtype, np.dtype) else dtype
    if not dt.isnative:
        raise InvalidUsageError(f"dtype {dt.str} is not in this machine's byte order; convert it with "
                                "x.astype(x.dtype.newbyteorder('='))")
    if dt.name in _BY_NAME and dt.kind in "iufcbV":
        return _BY_NAME[dt.name]
    raise InvalidUsageError(
        f"dtype {dt} is not supported by gpucoll collectives; use one of: {', '.join(NAMES)}")


def numpy_dtype(code):
    """The NumPy dtype to view a buffer of this code with (bfloat16 is viewed as uint16)."""
    return np.dtype("uint16") if code == BFLOAT16 else np.dtype(NAMES[code])


def name(code):
    return NAMES[code]
