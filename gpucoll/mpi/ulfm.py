"""The fault-tolerance calls of MPI 5 (ULFM) on communicators: gpucoll/api/fault.py's, with
mpi4py's names.

Revoke, Is_revoked, Shrink, Agree, Get_failed and Ack_failed are the gpucoll communicator's
revoke, is_revoked, shrink, agree, failed and ack_failed. On an intercommunicator, Revoke
revokes both groups' communicators; Shrink and Agree there are the failure-free forms (a Dup,
the AND of both groups' flags). Iagree, nonblocking, is an all-reduce on a communicator of its
own: it does not tolerate a failure during it (Agree does).
"""
import numpy as np

from ..bootstrap.failures import bitwise_and
from .composite import Composite, done
from .group import Group
from .kinds import kind
from .request import Request



def _agreement(comm):
    """The communicator Iagree runs on: its own, so that an agreement in progress does not take the
    place of the collectives the program calls meanwhile (made on first use, with no exchange)."""
    from ..api import comm as _core

    attrs = comm._s.attrs
    if "_agree" not in attrs:
        core = comm._c("Iagree")
        attrs["_agree"] = kind("Intracomm")._wrap(_core.Communicator(core.seam.context, f"{core.seam.id}.agree", core.world_ranks))
    return attrs["_agree"]


class FaultTolerance:
    """Mixed into MPI.Comm (which supplies `_c()`, `allgather`, `Dup`, `Iallreduce`)."""

    __slots__ = ()

    def Revoke(self):
        """Make every pending and later operation on this communicator raise an MPI.Exception of
        class ERR_REVOKED, on every rank."""
        self._c("Revoke").revoke()
        if self._s.inter is not None:
            self._s.inter.bridge.revoke()

    def Is_revoked(self):
        return self._c("Is_revoked").is_revoked()

    def Get_failed(self):
        return Group._from_ranks(tuple(self._c("Get_failed").failed()))

    def Ack_failed(self, num_to_ack=None):
        return self._c("Ack_failed").ack_failed(num_to_ack)

    def Agree(self, flag):
        """The bitwise AND of every surviving rank's integer flag (collective)."""
        flag = int(flag)
        inter = self._s.inter
        if inter is None:
            return self._c("Agree").agree(flag)
        value = bitwise_and(self.allgather(flag))  # the remote group's flags, then this group's
        return value & bitwise_and(self._s.core.allgather(flag))

    def Iagree(self, flag):
        """Agree on a buffer of one C int, which holds the result once the request completes."""
        view = memoryview(flag)
        if view.nbytes != np.dtype(np.intc).itemsize:
            raise ValueError(f"Iagree: the flag must be a buffer of one C int, not {view.nbytes} bytes")
        out = np.frombuffer(view, dtype=np.intc)
        if self._s is not None and self._s.inter is not None:
            out[0] = self.Agree(int(out[0]))
            return Request._of(done(name="Iagree"))
        from .op import PREDEFINED

        mine, result = out.copy(), np.empty(1, np.intc)
        state = _agreement(self).Iallreduce(mine, result, PREDEFINED["BAND"])._s

        def finish():
            out[0] = result[0]
        return Request._of(Composite([state], finish, "Iagree"))

    def Shrink(self):
        """A communicator of the surviving ranks (collective over them)."""
        if self._s is not None and self._s.inter is not None:
            return self.Dup()
        return kind("Intracomm")._wrap(self._c("Shrink").shrink())

    def Ishrink(self):
        return self.Shrink(), Request._of(done(name="Ishrink"))
