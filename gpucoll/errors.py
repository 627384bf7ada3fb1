"""The exceptions gpucoll raises: one base class, one subclass per kind of failure."""
from .mpi.exception import MPIErrorInfo


class GpucollError(MPIErrorInfo, RuntimeError):
    """Base class of every error gpucoll raises on purpose. It is also gpucoll.MPI.Exception:
    it carries an MPI error class (gpucoll/mpi/exception.py)."""


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


class MismatchError(InvalidUsageError):
    """Ranks called the same collective with different counts, dtypes, ops, roots or kinds.

    Found by the direct engine's call signatures and the executor's message headers, or by the
    full cross-check of GPUCOLL_DEBUG_CHECKS=1. `ranks` names the ranks whose call differed."""
