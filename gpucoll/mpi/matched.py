"""MPI.Message: a message taken by a matched probe (Mprobe/Improbe), received only through it.

The message's bytes have arrived already (gpucoll's point to point reads whole messages), so
receiving it is a copy; MESSAGE_NO_PROC (from a probe of PROC_NULL) receives nothing.
"""
import pickle

import numpy as np

from ..base.errors import InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C
from ..base.request import CompletedRequest
from ..engines.p2p.host import truncated
from .handle import Handle
from .status import reset

PROC_NULL, ANY_TAG = _C["PROC_NULL"], _C["ANY_TAG"]


class _Matched:
    __slots__ = ("source", "tag", "payload", "__weakref__")

    def __init__(self, source, tag, payload):
        self.source, self.tag, self.payload = source, tag, payload


class Message(Handle):
    """A matched message; Message() is MPI.MESSAGE_NULL."""

    __slots__ = ()
    _kind = "message"

    @classmethod
    def _matched(cls, comm, found):
        if found[0] == PROC_NULL:
            from .handle import NAMED

            return cls(NAMED["MESSAGE_NO_PROC"])
        return cls._of(_Matched(*found))

    def __repr__(self):
        return f"<gpucoll.MPI.Message {'null' if self._s is None else self._s.source}>"

    def free(self):
        """Release a matched message that will not be received; MESSAGE_NO_PROC is left alone."""
        if not self._is_constant():
            self._s = None

    def _take(self, what):
        s = self._s
        if s is None:
            raise InvalidUsageError(f"{what}: the message is MPI.MESSAGE_NULL", error_class=_C["ERR_REQUEST"])
        if not self._is_constant():  # MPI.MESSAGE_NO_PROC itself stays (a copy of it becomes null)
            self._s = None
        return s

    def _deliver(self, s, buf, status):
        from . import message as _m
        from .hostcopy import HostStage

        stage = HostStage()  # a GPU buffer takes the bytes through a host copy
        buf = stage.spec(buf, True, "Message.Recv buf")
        if status is not None:
            reset(status)
            status.source, status.tag = s.source, s.tag
        if s.source == PROC_NULL:
            return
        msg = _m.simple(buf, False, what="Message.Recv buf")
        data = np.frombuffer(s.payload, np.uint8)
        if data.size > msg.nbytes:
            raise truncated(s.source, s.tag, data.size, msg.nbytes)
        if status is not None:
            status.nbytes = data.size
        _m.Msg(msg.raw, data.size // max(msg.t.size, 1), msg.datatype).store(data) if data.size else None
        stage.finish()

    def Recv(self, buf, status=None):
        self._deliver(self._take("Message.Recv"), buf, status)

    def Irecv(self, buf):
        from .request import Request

        s = self._take("Message.Irecv")
        self._deliver(s, buf, None)
        return Request._of(_Done(s))

    def recv(self, status=None):
        s = self._take("Message.recv")
        if status is not None:
            reset(status)
            status.source, status.tag = s.source, s.tag
            status.nbytes = 0 if s.payload is None else len(s.payload)
        return None if s.payload is None else pickle.loads(s.payload)

    def irecv(self):
        from .request import Request

        s = self._take("Message.irecv")
        value = None if s.payload is None else pickle.loads(s.payload)
        return Request._of(_Done(s, value))

    @classmethod
    def Probe(cls, comm, source=_C["ANY_SOURCE"], tag=ANY_TAG, status=None):
        return comm.Mprobe(source, tag, status)

    @classmethod
    def Iprobe(cls, comm, source=_C["ANY_SOURCE"], tag=ANY_TAG, status=None):
        return comm.Improbe(source, tag, status)

    probe = Probe
    iprobe = Iprobe


class _Done(CompletedRequest):
    """A completed receive of a matched message: its status says where the message came from."""

    __slots__ = ("source", "tag", "nbytes")

    def __init__(self, matched, value=None):
        super().__init__("Mrecv", value)
        self.source, self.tag = matched.source, matched.tag
        self.nbytes = 0 if matched.payload is None else len(matched.payload)

    def _fill(self, status):
        status.source, status.tag, status.nbytes = self.source, self.tag, self.nbytes


def no_proc():
    """MPI.MESSAGE_NO_PROC."""
    return Message._of(_Matched(PROC_NULL, ANY_TAG, None))
