"""What MPI handle classes share (Group, Info, Errhandler, Message, Comm, ...).

A handle object refers to a state object (`_s`); None is the class's null handle. Two handles
are equal when they refer to the same state; `Cls(h)` is a new handle on h's state; the
predefined handles (COMM_NULL, GROUP_EMPTY, ...) pickle back to themselves and copies of them
to equal handles, as in mpi4py.
"""
NAMED = {}  # name -> the predefined handle object (MPI.GROUP_EMPTY, MPI.INFO_NULL, ...)


def named(name):
    return NAMED[name]


class Handle:
    __slots__ = ("_s", "__weakref__")
    _kind = None  # handles of one kind compare with each other (Comm and Intracomm, ...)

    def __init__(self, other=None):
        if other is None:
            self._s = None
        elif isinstance(other, Handle) and isinstance(other, self._base()):
            self._s = other._s
        else:
            raise TypeError(f"{type(self).__name__}() takes a {self._base().__name__} or None, not "
                            f"{type(other).__name__}")

    @classmethod
    def _base(cls):
        """The class whose handles this one copies (Comm for Intracomm, ...)."""
        return cls

    @classmethod
    def _of(cls, state):
        obj = cls.__new__(cls)
        obj._s = state
        return obj

    def __bool__(self):
        return self._s is not None

    def __eq__(self, other):
        if not isinstance(other, Handle) or other._kind != self._kind:
            return NotImplemented
        return self._s is other._s

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash(self.handle)

    @property
    def handle(self):
        return 0 if self._s is None else id(self._s)

    def toint(self):
        return self.handle

    py2f = toint

    @classmethod
    def fromint(cls, value):
        return cls._of(_LIVE.get(value)) if value else cls()

    f2py = fromhandle = fromint

    def _register(self):
        _LIVE[id(self._s)] = self._s
        return self

    def _named_name(self):
        for name, obj in NAMED.items():
            if type(obj) is type(self) and obj._s is self._s:
                return name
        return None

    def __reduce__(self):
        name = self._named_name()
        if name is None:
            raise ValueError(f"cannot pickle {self!r}: only predefined handles can be pickled")
        return (named, (name,)) if NAMED[name] is self else (type(self), (NAMED[name],))


_LIVE = {}  # handle -> state, for fromint
