"""MPI.Pickle and MPI.pickle: how Python objects become bytes.

gpucoll's object methods (bcast, send, allgather, ...) pickle with the standard library at the
highest protocol; MPI.pickle is mpi4py's configurable pickler, for programs that call it
themselves (its settings do not change what gpucoll's object methods use).
"""
import pickle as _std

PROTOCOL = _std.HIGHEST_PROTOCOL
THRESHOLD = 256 * 1024


class Pickle:
    """Pickle(dumps=pickle.dumps, loads=pickle.loads, protocol=None, threshold=None)."""

    PROTOCOL = PROTOCOL
    THRESHOLD = THRESHOLD

    def __init__(self, dumps=None, loads=None, protocol=None, threshold=None):
        self._dumps = dumps if dumps is not None else _std.dumps
        self._loads = loads if loads is not None else _std.loads
        self.PROTOCOL = PROTOCOL if protocol is None and dumps is None else protocol
        if self.PROTOCOL is not None and self.PROTOCOL < 0:
            self.PROTOCOL = _std.HIGHEST_PROTOCOL
        self.THRESHOLD = THRESHOLD if threshold is None else threshold

    def dumps(self, obj):
        if self.PROTOCOL is None:
            return self._dumps(obj)
        return self._dumps(obj, self.PROTOCOL)

    def loads(self, data):
        return self._loads(data)

    def dumps_oob(self, obj):
        buffers = []
        if self.PROTOCOL is not None and self.PROTOCOL >= 5 and self._dumps is _std.dumps:
            data = _std.dumps(obj, self.PROTOCOL, buffer_callback=buffers.append)
            return data, [b.raw() for b in buffers]
        return self.dumps(obj), []

    def loads_oob(self, data, buffers):
        if self._loads is _std.loads:
            return _std.loads(data, buffers=buffers)
        return self.loads(data)


pickle = Pickle()
