"""The fault-tolerance calls of MPI 5 (ULFM) on communicators, for a job without failures.

gpucoll does not recover from a lost rank: an operation that needs it raises LostPeerError and
gpurun ends the job. So a communicator in use never holds failed ranks: Get_failed is empty,
Ack_failed acknowledges none, Agree is the bitwise AND of every rank's flag (both groups of an
intercommunicator), Shrink a Dup. Revoke, which must interrupt the other ranks' pending calls,
is not supported (unsupported.py).
"""
import numpy as np

from .composite import Composite, done
from .group import Group
from .kinds import kind
from .request import Request


def _band(values):
    out = -1
    for v in values:
        out &= v
    return out


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

    def Is_revoked(self):
        self._c("Is_revoked")
        return False

    def Get_failed(self):
        self._c("Get_failed")
        return Group._from_ranks(())

    def Ack_failed(self, num_to_ack=None):
        self._c("Ack_failed")
        return 0

    def Agree(self, flag):
        """The bitwise AND of every rank's integer flag (collective)."""
        flag = int(flag)
        value = _band(self.allgather(flag))
        inter = self._s.inter
        if inter is not None:  # allgather gave the remote group's flags: add this group's
            value &= _band(self._s.core.allgather(flag))
        return value

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
        """A communicator of the live ranks: all of them (a Dup)."""
        return self.Dup()

    def Ishrink(self):
        return self.Dup(), Request._of(done(name="Ishrink"))
