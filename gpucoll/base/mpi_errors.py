"""MPI error classes on gpucoll's exceptions.

Every gpucoll error (errors.GpucollError, which is MPI.Exception) carries an MPI error class:
the one it was raised with (`InvalidUsageError(msg, error_class=ERR_ROOT)`), else its kind's
(invalid usage: ERR_ARG; a lost peer: ERR_PROC_FAILED; others: ERR_OTHER). As in mpi4py,
`MPI.Exception(MPI.ERR_ARG)` makes one from a code, compares and hashes as that code, and
its str() is the error string. This module imports nothing from gpucoll: errors.py uses it.
"""
from .mpi_constants import INTEGERS

SUCCESS = INTEGERS["SUCCESS"]
ERR_UNKNOWN = INTEGERS["ERR_UNKNOWN"]
ERR_LASTCODE = INTEGERS["ERR_LASTCODE"]

_TEXT = {
    "SUCCESS": "no errors", "ERR_BUFFER": "invalid buffer pointer", "ERR_COUNT": "invalid count argument",
    "ERR_TYPE": "invalid datatype", "ERR_TAG": "invalid tag", "ERR_COMM": "invalid communicator",
    "ERR_RANK": "invalid rank", "ERR_REQUEST": "invalid request", "ERR_ROOT": "invalid root",
    "ERR_GROUP": "invalid group", "ERR_OP": "invalid reduce operation", "ERR_TOPOLOGY": "invalid topology",
    "ERR_DIMS": "invalid dimension argument", "ERR_ARG": "invalid argument of some other kind",
    "ERR_UNKNOWN": "unknown error", "ERR_TRUNCATE": "message truncated", "ERR_OTHER": "known error not in list",
    "ERR_INTERN": "internal error", "ERR_IN_STATUS": "error code is in status", "ERR_PENDING": "pending request",
    "ERR_ACCESS": "invalid access mode", "ERR_AMODE": "invalid amode argument", "ERR_ASSERT": "invalid assert",
    "ERR_BAD_FILE": "invalid file name", "ERR_BASE": "invalid base", "ERR_CONVERSION": "data conversion error",
    "ERR_DISP": "invalid displacement", "ERR_DUP_DATAREP": "duplicate data representation",
    "ERR_FILE_EXISTS": "file exists", "ERR_FILE_IN_USE": "file in use", "ERR_FILE": "invalid file",
    "ERR_INFO_KEY": "invalid info key", "ERR_INFO_NOKEY": "info key not defined",
    "ERR_INFO_VALUE": "invalid info value", "ERR_INFO": "invalid info object", "ERR_IO": "input/output error",
    "ERR_KEYVAL": "invalid key value", "ERR_LOCKTYPE": "invalid lock", "ERR_NAME": "name not found",
    "ERR_NO_MEM": "out of memory", "ERR_NOT_SAME": "objects are not identical", "ERR_NO_SPACE": "no space left",
    "ERR_NO_SUCH_FILE": "no such file", "ERR_PORT": "invalid port", "ERR_QUOTA": "quota exceeded",
    "ERR_READ_ONLY": "read-only file system", "ERR_RMA_CONFLICT": "RMA conflict",
    "ERR_RMA_SYNC": "RMA synchronization error", "ERR_SERVICE": "invalid service name",
    "ERR_SIZE": "invalid size", "ERR_SPAWN": "could not spawn processes",
    "ERR_UNSUPPORTED_DATAREP": "unsupported data representation",
    "ERR_UNSUPPORTED_OPERATION": "operation not supported", "ERR_WIN": "invalid window",
    "ERR_RMA_RANGE": "RMA target out of range", "ERR_RMA_ATTACH": "memory cannot be attached",
    "ERR_RMA_FLAVOR": "wrong window flavor", "ERR_RMA_SHARED": "memory cannot be shared",
    "ERR_PROC_ABORTED": "process aborted", "ERR_PROC_FAILED": "process failed",
    "ERR_PROC_FAILED_PENDING": "process failed, request pending", "ERR_REVOKED": "communicator revoked",
    "ERR_SESSION": "invalid session", "ERR_VALUE_TOO_LARGE": "value too large", "ERR_ABI": "ABI mismatch",
}
# Class -> text; where two names share a value (ERR_ERRHANDLER, ERR_LASTCODE, ERR_ABI) the first wins.
STRINGS = {}
for _name, _text in _TEXT.items():
    STRINGS.setdefault(INTEGERS[_name], f"MPI_{_name}: {_text}")
STRINGS.setdefault(ERR_LASTCODE, "MPI_ERR_LASTCODE: last error code")

# Error codes and classes that a program added (Add_error_class, Add_error_code, Add_error_string).
added_classes = {}   # code -> its class
added_strings = {}   # code -> string


def error_class_of(code):
    """MPI_Error_class: the class of an error code."""
    if code in added_classes:
        return added_classes[code]
    if SUCCESS <= code <= ERR_LASTCODE:
        return code
    return ERR_UNKNOWN


def error_string_of(code):
    if code in added_strings or code in added_classes:
        return added_strings.get(code, "")
    return STRINGS.get(code, f"MPI_ERR_UNKNOWN: unknown error code {code}")


# The class of gpucoll's own errors, by the name of the nearest class in their MRO that has one.
_KIND_CLASS = {"InvalidUsageError": INTEGERS["ERR_ARG"], "LostPeerError": INTEGERS["ERR_PROC_FAILED"],
               "ProcFailedPendingError": INTEGERS["ERR_PROC_FAILED_PENDING"],
               "TruncationError": INTEGERS["ERR_TRUNCATE"], "SpawnError": INTEGERS["ERR_SPAWN"],
               "RevokedError": INTEGERS["ERR_REVOKED"],
               "MismatchError": INTEGERS["ERR_OTHER"], "TimeoutError": INTEGERS["ERR_OTHER"]}


class MPIErrorInfo:
    """The MPI side of gpucoll's base exception (see the module docstring)."""

    def __init__(self, *args, error_class=None):
        code = args[0] if len(args) == 1 else None
        if isinstance(code, int) and not isinstance(code, bool):
            if code < SUCCESS:
                code = ERR_UNKNOWN
            super().__init__(error_string_of(code))
            self._mpi_code, self._from_code = code, True
        else:
            super().__init__(*args)
            self._mpi_code, self._from_code = error_class, False

    @property
    def error_code(self):
        code = getattr(self, "_mpi_code", None)
        if code is not None:
            return code
        for kind in type(self).__mro__:
            if kind.__name__ in _KIND_CLASS:
                return _KIND_CLASS[kind.__name__]
        return INTEGERS["ERR_OTHER"]

    @property
    def error_class(self):
        return error_class_of(self.error_code)

    @property
    def error_string(self):
        return error_string_of(self.error_code)

    def Get_error_code(self):
        return self.error_code

    def Get_error_class(self):
        return self.error_class

    def Get_error_string(self):
        return self.error_string

    def __int__(self):
        return self.error_code

    def __bool__(self):
        return self.error_code != SUCCESS

    def __hash__(self):
        return hash(self.error_code)

    def __repr__(self):
        if getattr(self, "_from_code", False):
            return f"MPI.Exception({self.error_code})"
        return super().__repr__()

    def _other(self, other):
        """The code to compare with: an int's, or another error's when both were made from codes
        (errors raised with a message are equal only to themselves)."""
        if isinstance(other, MPIErrorInfo):
            if other is self or (getattr(self, "_from_code", False) and getattr(other, "_from_code", False)):
                return other.error_code
            return None
        if isinstance(other, int) and not isinstance(other, bool):
            return other
        return None

    def __eq__(self, other):
        value = self._other(other)
        if value is None:
            return other is self if isinstance(other, MPIErrorInfo) else NotImplemented
        return self.error_code == value

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __lt__(self, other):
        value = self._other(other)
        return NotImplemented if value is None else self.error_code < value

    def __le__(self, other):
        value = self._other(other)
        return NotImplemented if value is None else self.error_code <= value

    def __gt__(self, other):
        value = self._other(other)
        return NotImplemented if value is None else self.error_code > value

    def __ge__(self, other):
        value = self._other(other)
        return NotImplemented if value is None else self.error_code >= value
