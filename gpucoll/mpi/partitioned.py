"""Partitioned point to point (MPI 4): Psend_init, Precv_init, and the Prequest's Pready/Parrived.

A partitioned send goes as one message once every partition has been marked ready (Pready):
gpucoll's point to point moves whole messages, so a partition does not travel before the
others; Parrived reports the whole message's arrival (true for every partition at once). The
message matches like any other with the same tag.
"""
from ..base.errors import InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C
from .request import Prequest, request_error


def _partitions(value, what):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidUsageError(f"{what}: partitions must be a positive integer, not {value!r}",
                                error_class=_C["ERR_ARG"])
    return value


class PartitionedSend:
    """The state of a started partitioned send: the send starts when the last partition is ready."""

    def __init__(self, start_send, partitions):
        self.start_send, self.partitions = start_send, partitions
        self.ready = set()
        self.send = None
        self._value = None

    def pready(self, parts):
        for p in parts:
            if not 0 <= p < self.partitions:
                raise request_error(f"Pready: partition {p} is not one of the {self.partitions} partitions")
            if p in self.ready:
                raise request_error(f"Pready: partition {p} is already marked ready")
            self.ready.add(p)
        if len(self.ready) == self.partitions and self.send is None:
            self.send = self.start_send()._s

    def parrived(self, p):
        raise request_error("Parrived: this is a partitioned send (Parrived is for receives)")

    def Test(self, status=None):
        return self.send is not None and self.send.Test(status)

    def Wait(self, status=None):
        if self.send is None:
            missing = sorted(set(range(self.partitions)) - self.ready)
            raise request_error(f"Wait: partitions {missing} of the partitioned send were never marked ready "
                                "(Pready): the send cannot complete")
        return self.send.Wait(status)


class PartitionedRecv:
    """The state of a started partitioned receive: a receive of the whole message."""

    def __init__(self, recv, partitions):
        self.recv, self.partitions = recv, partitions
        self._value = None

    def pready(self, parts):
        raise request_error("Pready: this is a partitioned receive (Pready is for sends)")

    def parrived(self, p):
        if not 0 <= p < self.partitions:
            raise request_error(f"Parrived: partition {p} is not one of the {self.partitions} partitions")
        return bool(self.recv.Test(None))

    def Test(self, status=None):
        return self.recv.Test(status)

    def Wait(self, status=None):
        return self.recv.Wait(status)


class Partitioned:
    """Psend_init and Precv_init (mixed into MPI.Comm, which supplies Isend and Irecv)."""

    __slots__ = ()

    def Psend_init(self, buf, partitions, dest, tag=0, info=None):
        """A persistent send of buf in `partitions` parts; after Start(), Pready(i) marks part i."""
        parts = _partitions(partitions, "Psend_init")
        self._c("Psend_init")
        return Prequest._persistent(lambda: _handle(PartitionedSend(lambda: self.Isend(buf, dest, tag), parts)))

    def Precv_init(self, buf, partitions, source, tag=0, info=None):
        """A persistent receive into buf in `partitions` parts (Parrived(i) asks after part i)."""
        parts = _partitions(partitions, "Precv_init")
        self._c("Precv_init")
        return Prequest._persistent(lambda: _handle(PartitionedRecv(self.Irecv(buf, source, tag)._s, parts)))


def _handle(state):
    return Prequest._of(state)
