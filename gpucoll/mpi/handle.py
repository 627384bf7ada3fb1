"""What MPI handle classes share (Group, Info, Errhandler, Message, Comm, ...).

A handle object refers to a state object (`_s`); None is the class's null handle. Two handles
are equal when they refer to the same state; `Cls(h)` is a new handle on h's state; the
predefined handles (COMM_NULL, GROUP_EMPTY, ...) pickle back to themselves and copies of them
to equal handles, as in mpi4py.
"""
import weakref

from ..engines.p2p.host import HandleFields

NAMED = {}  # name -> the predefined handle object (MPI.GROUP_EMPTY, MPI.INFO_NULL, ...)


def named(name):
    return NAMED[name]


class Handle(HandleFields):
    __slots__ = ()  # `_s` and weak references: HandleFields' (native)
    _kind = None  # handles of one kind compare with each other (Comm and Intracomm, ...)

    def __new__(cls, other=None):
        # The copy is made here, not in __init__, so that subclasses that override __new__ (as
        # mpi4py's own tests do) get a working object.
        obj = HandleFields.__new__(cls)
        obj._s = None
        if other is not None:
            if not isinstance(other, Handle) or other._kind != cls._kind or not cls._accepts(other):
                raise TypeError(f"{cls.__name__}() takes a handle of its kind or None, not {type(other).__name__}")
            obj._s = other._s
        return obj

    @classmethod
    def _accepts(cls, other):
        """Whether a handle of this kind may be viewed as a cls (an Intercomm of an intracommunicator
        may not)."""
        return True

    @classmethod
    def _of(cls, state):
        obj = HandleFields.__new__(cls)
        obj._s = state
        return obj

    __hash__ = None  # handles are mutable (Free nulls them): unhashable, as in mpi4py

    def __lt__(self, other):
        raise TypeError(f"handles of {type(self).__name__} are not ordered")

    __le__ = __gt__ = __ge__ = __lt__

    def _is_constant(self):
        """True for the predefined handle objects themselves (MPI.COMM_WORLD, MPI.GROUP_EMPTY, ...)."""
        return any(obj is self for obj in NAMED.values())

    def _of_constant(self):
        """True when this handle refers to a predefined object's state (a copy of a constant)."""
        return any(type(obj)._kind == self._kind and obj._s is self._s for obj in NAMED.values() if obj)

    def free(self):
        """Free the object unless it is null or predefined; a copy of a predefined handle becomes null."""
        if self._s is None or self._is_constant():
            return
        if self._of_constant():
            self._s = None
            return
        self.Free()

    def __bool__(self):
        return self._s is not None

    def __eq__(self, other):
        if not isinstance(other, Handle) or other._kind != self._kind:
            return NotImplemented
        return self._s is other._s

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

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
            if obj is self:
                return name
        for name, obj in NAMED.items():
            if obj._kind == self._kind and obj._s is self._s:
                return name
        return None

    def __reduce__(self):
        if self._s is None and not self._is_constant():
            return (type(self), ())
        name = self._named_name()
        if name is None:
            raise ValueError(f"cannot pickle {self!r}: only predefined handles can be pickled")
        return (named, (name,)) if NAMED[name] is self else (type(self), (NAMED[name],))


_LIVE = weakref.WeakValueDictionary()  # handle -> state, for fromint (states die with their handles)
