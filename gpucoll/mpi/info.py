"""MPI.Info: string key/value hints. gpucoll takes none of them into account, but keeps them:
programs set and read them as they do under MPI."""
import sys

from ..base.errors import InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C
from .handle import Handle

ERR_INFO, ERR_INFO_KEY, ERR_INFO_NOKEY = _C["ERR_INFO"], _C["ERR_INFO_KEY"], _C["ERR_INFO_NOKEY"]


class _InfoState:
    __slots__ = ("items", "__weakref__")

    def __init__(self, items=()):
        self.items = dict(items)


def info_error(message, error_class=ERR_INFO):
    return InvalidUsageError(message, error_class=error_class)


class Info(Handle):
    """Key/value hints; Info() is MPI.INFO_NULL, Info.Create() a new empty one."""

    __slots__ = ()
    _kind = "info"

    def __repr__(self):
        return "<gpucoll.MPI.Info null>" if self._s is None else f"<gpucoll.MPI.Info {self._s.items}>"

    def _st(self, what):
        if self._s is None:
            raise info_error(f"{what}: the info is MPI.INFO_NULL")
        return self._s

    @classmethod
    def Create(cls, items=None):
        if items is not None and not hasattr(items, "keys") and not isinstance(items, (list, tuple)):
            raise TypeError(f"Info.Create takes a mapping or a sequence of pairs, not {type(items).__name__}")
        return cls._of(_InfoState(dict(items or ())))._register()

    @classmethod
    def Create_env(cls, args=None):
        """The environment's info (MPI_INFO_ENV's keys), as gpucoll knows it."""
        argv = [sys.executable] + sys.argv if args is None else list([args] if isinstance(args, str) else args)
        env = {"command": argv[0] if argv else "", "argv": " ".join(argv[1:]), "thread_level": "MPI_THREAD_MULTIPLE"}
        return cls._of(_InfoState(env))._register()

    def Free(self):
        self._st("Info.Free")
        if self._named_name() is not None and self is not None and self._s is not None and \
                self._named_name() == "INFO_ENV":
            raise info_error("Info.Free: MPI.INFO_ENV is predefined")
        self._s = None


    def Dup(self):
        return type(self)._of(_InfoState(self._st("Info.Dup").items))._register()

    def Get(self, key, maxlen=-1):
        _key(key)
        return self._st("Info.Get").items.get(key)

    def Set(self, key, value):
        _key(key)
        if not isinstance(value, str):
            raise TypeError(f"info values are strings, not {type(value).__name__}")
        self._st("Info.Set").items[key] = value

    def Delete(self, key):
        _key(key)
        items = self._st("Info.Delete").items
        if key not in items:
            raise info_error(f"Info.Delete: no key {key!r}", ERR_INFO_NOKEY)
        del items[key]

    def Get_nkeys(self):
        return len(self._st("Info.Get_nkeys").items)

    def Get_nthkey(self, n):
        keys = list(self._st("Info.Get_nthkey").items)
        if not 0 <= n < len(keys):
            raise info_error(f"Info.Get_nthkey: no key number {n} (there are {len(keys)})", ERR_INFO_KEY)
        return keys[n]

    # --- the mapping face (the null info is an empty mapping that refuses writes) ----------------
    def _items(self):
        return {} if self._s is None else self._s.items

    def _writable(self):
        if self._s is None:
            raise KeyError("MPI.INFO_NULL holds no keys")
        return self._s.items

    def __len__(self):
        return len(self._items())

    def __contains__(self, key):
        return key in self._items()

    def __iter__(self):
        return iter(list(self._items()))

    def __getitem__(self, key):
        if self._s is None:
            raise KeyError(key)
        return self._s.items[key]

    def __setitem__(self, key, value):
        self._writable()
        self.Set(key, value)

    def __delitem__(self, key):
        del self._writable()[key]

    def get(self, key, default=None):
        return self._items().get(key, default)

    def keys(self):
        return list(self._items())

    def values(self):
        return list(self._items().values())

    def items(self):
        return list(self._items().items())

    def update(self, other=(), **kwds):
        items = self._writable()
        for k, v in (dict(other) if not hasattr(other, "keys") else dict(other.items())).items():
            items[k] = v
        items.update(kwds)

    def pop(self, key, *default):
        if self._s is None:
            if default:
                return default[0]
            raise KeyError(key)
        return self._s.items.pop(key, *default)

    def popitem(self):
        return self._writable().popitem()

    def copy(self):
        return type(self)() if self._s is None else self.Dup()

    def clear(self):
        if self._s is not None:
            self._s.items.clear()

    def __reduce__(self):
        if self._s is None or self._named_name() is not None:
            return super().__reduce__()
        return (_create, (type(self), self.items()))


def _create(cls, items):
    return cls.Create(items)


def _key(key):
    if not isinstance(key, str):
        raise TypeError(f"info keys are strings, not {type(key).__name__}")
