"""The exceptions gpucoll raises: one base class, one subclass per kind of failure; and
`native_error`, the one place where a failed native status becomes one of them."""
import os

from .mpi_errors import MPIErrorInfo
from .ranks import ranges

# The native layer's failure statuses: GC_ERR_* of cython_src/include/gc_types.h (a test reads
# the header and checks these numbers).
NATIVE_TIMEOUT, NATIVE_PEER, NATIVE_IO, NATIVE_USAGE, NATIVE_NOMEM, NATIVE_MISMATCH, NATIVE_REVOKED = (
    -1, -2, -3, -4, -5, -6, -7)

MISMATCH_RULE = ("every rank must call collectives in the same order with matching counts, dtypes, "
                 "ops and roots")


class GpucollError(MPIErrorInfo, RuntimeError):
    """Base class of every error gpucoll raises on purpose. It is also gpucoll.MPI.Exception:
    it carries an MPI error class (gpucoll/base/mpi_errors.py)."""


class ConfigError(GpucollError, ValueError):
    """A GPUCOLL_* variable (or a launcher option) holds a value that is not allowed."""


class InvalidUsageError(GpucollError, ValueError):
    """The caller passed arguments that cannot work: wrong sizes, dtypes, roots, devices."""


class BootstrapError(GpucollError):
    """The ranks could not find each other: inconsistent environment, unreachable store."""


class StoreError(GpucollError):
    """The rendezvous store refused or dropped a request."""


class AuthenticationError(StoreError):
    """The store secret did not match: the client is not part of this job."""


class TimeoutError(GpucollError, TimeoutError):  # noqa: A001 - also an instance of the builtin
    """A blocking wait passed its deadline; the message names what was waited for and who is missing."""


class SharedMemoryError(GpucollError):
    """A shared-memory segment of this job cannot be used safely: its name is held by a file
    that this job did not make (another user's, another job's), so no rank writes into it."""


class LostPeerError(GpucollError):
    """A peer rank or host went away in the middle of an operation."""

    def __init__(self, message, ranks=()):
        super().__init__(message)
        self.ranks = tuple(ranks)


# ULFM's name for it (MPI class ERR_PROC_FAILED): survivors catch it, then revoke, shrink or agree.
ProcFailedError = LostPeerError


class ProcFailedPendingError(LostPeerError):
    """A nonblocking receive from ANY_SOURCE whose communicator lost a rank that is not yet
    acknowledged (MPI's ERR_PROC_FAILED_PENDING): the receive is still posted; after
    comm.ack_failed() its Wait goes on (a message from another rank still completes it)."""


class RevokedError(GpucollError):
    """The communicator was revoked (comm.revoke() on any rank): every pending and later
    operation on it raises this; shrink() still works (MPI's ERR_REVOKED)."""


class SpawnError(GpucollError):
    """Processes could not be spawned: no launcher that starts them, too many, a command that
    cannot run or that ended before it joined (MPI's ERR_SPAWN)."""


class TruncationError(InvalidUsageError):
    """A message is larger than the receive buffer that matched it (MPI's ERR_TRUNCATE)."""


class MismatchError(InvalidUsageError):
    """Ranks called the same collective with different counts, dtypes, ops, roots or kinds.

    Found by the direct engine's call signatures and the executor's message headers, or by the
    full cross-check of GPUCOLL_DEBUG_CHECKS=1. `ranks` names the ranks whose call differed."""



# The exceptions are public as gpucoll.<Name> (gpucoll/__init__.py): tracebacks, reprs and pickles
# name them so, not by the module that happens to define them.
for _cls in (GpucollError, ConfigError, InvalidUsageError, BootstrapError, StoreError, AuthenticationError,
             TimeoutError, SharedMemoryError, LostPeerError, TruncationError, MismatchError, SpawnError,
             RevokedError):
    _cls.__module__ = "gpucoll"
del _cls

def native_error(status, what, ranks=(), detail="", waited=None, err_no=0):
    """The one error path of the native layer (cython_src/core.pyx, sock.pyx, direct.pyx): the
    exception to raise for failed status `status` (a GC_ERR_* code) of `what` (the operation and
    where it stood, e.g. "step 3, receiving from rank 1"). `ranks`: the peers it lost or waited
    for, named in the message and in the exception's `ranks`; `detail`: what else the native
    side knows (a mismatch's two calls, a usage error's reason); `waited`: seconds waited
    before a timeout; `err_no`: the OS error of an I/O failure."""
    ranks = tuple(r for r in ranks if r >= 0)
    who = f"rank(s) {ranges(ranks)}" if ranks else "the peer"
    more = f" ({detail})" if detail else ""
    if status == NATIVE_PEER:
        err = LostPeerError(f"{what}: {who} is gone: its connection closed or its process ended{more}")
    elif status == NATIVE_TIMEOUT:
        after = f" after {waited:.3g} s" if waited is not None else ""
        err = TimeoutError(f"{what}: timed out{after}{f' waiting for {who}' if ranks else ''}{more}")
    elif status == NATIVE_REVOKED:
        err = RevokedError(f"{what}: the communicator was revoked")
    elif status == NATIVE_MISMATCH:
        err = MismatchError(f"{what}{f': {detail}' if detail else ''}; {MISMATCH_RULE}")
    elif status == NATIVE_USAGE:
        err = InvalidUsageError(f"{what}: {detail or 'invalid arguments'}")
    elif status == NATIVE_NOMEM:
        return MemoryError(f"{what}: out of memory")
    elif status == NATIVE_IO:
        reason = f"{os.strerror(err_no)} (errno {err_no})" if err_no else "I/O error"
        err = GpucollError(f"{what}: {reason}{f' with {who}' if ranks else ''}{more}")
    else:
        err = GpucollError(f"{what}: native status {status}{more}")
    err.ranks = ranks
    return err
