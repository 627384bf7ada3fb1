"""MPI.Pickle and MPI.pickle: how Python objects become bytes.

gpucoll's object methods (bcast, send, allgather, ...) pickle with the standard library at the
highest protocol; MPI.pickle is mpi4py's configurable pickler, for programs and libraries
(mpi4py.util.pkl5) that call it themselves: its settings do not change what gpucoll's object
methods use.
"""
import pickle as _std

DEFAULT_THRESHOLD = 256 * 1024  # out-of-band buffers from this size on (dumps_oob)


class Pickle:
    """Pickle(dumps=pickle.dumps, loads=pickle.loads, protocol=None, threshold=None)."""

    # class-level defaults (mpi4py's Pickle has them as attributes of the class too)
    PROTOCOL = property(lambda self: self._protocol, lambda self, value: self._set_protocol(value))
    THRESHOLD = property(lambda self: self._threshold, lambda self, value: self._set_threshold(value))

    def __init__(self, dumps=None, loads=None, protocol=None, threshold=None):
        self._dumps = dumps if dumps is not None else _std.dumps
        self._loads = loads if loads is not None else _std.loads
        self._protocol = None
        self._threshold = DEFAULT_THRESHOLD
        if dumps is None:  # the standard pickle: its highest protocol unless told otherwise
            self.PROTOCOL = protocol
        else:
            self._protocol = protocol
        self.THRESHOLD = threshold

    def _set_protocol(self, protocol):
        if protocol is None:
            protocol = _std.HIGHEST_PROTOCOL if self._dumps is _std.dumps else None
        elif protocol < 0:
            protocol = _std.HIGHEST_PROTOCOL
        self._protocol = protocol

    def _set_threshold(self, threshold):
        self._threshold = DEFAULT_THRESHOLD if threshold is None else int(threshold)

    def dumps(self, obj):
        if self._protocol is None:
            return self._dumps(obj)
        return self._dumps(obj, self._protocol)

    def loads(self, data):
        return self._loads(data)

    def dumps_oob(self, obj):
        """Return (pickle data, out-of-band buffers): buffers of THRESHOLD bytes or more travel apart."""
        from .buffer import buffer

        buffers = []
        threshold = self._threshold

        def callback(pickle_buffer):
            raw = pickle_buffer.raw()
            if raw.nbytes >= threshold:
                buffers.append(buffer(raw))
                return False
            return True
        protocol = max(self._protocol if self._protocol is not None else _std.HIGHEST_PROTOCOL, 5)
        return self._dumps(obj, protocol, buffer_callback=callback), buffers

    def loads_oob(self, data, buffers):
        return self._loads(data, buffers=buffers)


pickle = Pickle()
