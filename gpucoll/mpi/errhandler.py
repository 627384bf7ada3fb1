"""MPI.Errhandler. Whatever handler is set, gpucoll reports errors by raising (mpi4py's default
policy, ERRORS_RETURN turned into exceptions); a handler is called only by Call_errhandler."""
import os
import sys

from ..base.errors import InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C
from .handle import Handle

MAX_USER_HANDLERS = 32  # live user-defined error handlers at a time, as in mpi4py


class _HandlerState:
    __slots__ = ("name", "function", "__weakref__")

    def __init__(self, name, function=None):
        self.name, self.function = name, function


_USER = set()


class Errhandler(Handle):
    """An error handler: what a communicator, window or file does when a call fails."""

    __slots__ = ()
    _kind = "errhandler"

    def __repr__(self):
        return f"<gpucoll.MPI.Errhandler {self._s.name if self._s else 'null'}>"

    def Free(self):
        if self._s is None:
            raise InvalidUsageError("Errhandler.Free: the handler is MPI.ERRHANDLER_NULL",
                                    error_class=_C["ERR_ARG"])
        _USER.discard(self._s)  # a user handler freed no longer counts against the limit
        self._s = None


    def __reduce__(self):
        if self._s is not None and self._s.function is not None:
            raise ValueError("cannot pickle a user-defined error handler")
        return super().__reduce__()


def create(function):
    if len(_USER) >= MAX_USER_HANDLERS:
        raise RuntimeError(f"at most {MAX_USER_HANDLERS} user-defined error handlers may exist at a time")
    state = _HandlerState("user", function)
    _USER.add(state)
    return Errhandler._of(state)._register()


def invoke(handler_state, obj, errorcode):
    """Call_errhandler: the handler set on obj, for errorcode."""
    if handler_state is None or handler_state.name == "ERRORS_RETURN":
        return
    if handler_state.function is not None:
        handler_state.function(obj, errorcode)
        return
    if errorcode != _C["SUCCESS"]:  # ERRORS_ARE_FATAL / ERRORS_ABORT
        sys.stderr.write(f"gpucoll.MPI: error {errorcode} with {handler_state.name}: aborting\n")
        sys.stderr.flush()
        os._exit(errorcode if 0 < errorcode < 256 else 1)


PREDEFINED = {name: Errhandler._of(_HandlerState(name)) for name in ("ERRORS_ARE_FATAL", "ERRORS_RETURN",
                                                                      "ERRORS_ABORT")}
PREDEFINED["ERRHANDLER_NULL"] = Errhandler()
