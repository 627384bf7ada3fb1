"""MPI.Group: an ordered set of processes (world ranks), and the set operations on groups.

Groups are local objects: nothing here communicates. A communicator's group lists its world
ranks; Comm.Create / Create_group turn a group back into a communicator.
"""
from ..base.errors import InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C
from .handle import Handle

UNDEFINED, PROC_NULL = _C["UNDEFINED"], _C["PROC_NULL"]
IDENT, SIMILAR, UNEQUAL = _C["IDENT"], _C["SIMILAR"], _C["UNEQUAL"]
ERR_GROUP, ERR_RANK, ERR_ARG = _C["ERR_GROUP"], _C["ERR_RANK"], _C["ERR_ARG"]


class _GroupState:
    __slots__ = ("ranks", "__weakref__")

    def __init__(self, ranks):
        self.ranks = tuple(ranks)  # world ranks in group order

    @property
    def me(self):
        """This process's world rank."""
        from ..api.world import init

        return init().rank


def group_error(message, error_class=ERR_GROUP):
    return InvalidUsageError(message, error_class=error_class)


class Group(Handle):
    """An ordered set of processes; Group() is MPI.GROUP_NULL."""

    __slots__ = ()
    _kind = "group"

    @classmethod
    def _from_ranks(cls, ranks):
        return cls._of(_GroupState(ranks))._register()

    def _st(self, what):
        if self._s is None:
            raise group_error(f"{what}: the group is MPI.GROUP_NULL")
        return self._s

    def __repr__(self):
        return "<gpucoll.MPI.Group null>" if self._s is None else f"<gpucoll.MPI.Group {list(self._s.ranks)}>"

    def Get_size(self):
        return len(self._st("Get_size").ranks)

    def Get_rank(self):
        s = self._st("Get_rank")
        return s.ranks.index(s.me) if s.me in s.ranks else UNDEFINED

    size = property(Get_size)
    rank = property(Get_rank)

    def Dup(self):
        s = self._st("Dup")
        return Group._from_ranks(s.ranks)

    def Free(self):
        self._st("Free")
        self._s = None


    def Translate_ranks(self, ranks=None, group=None):
        """The ranks in `group` (default: the world's order) of the processes with `ranks` here."""
        s = self._st("Translate_ranks")
        if ranks is None:
            ranks = range(len(s.ranks))
        other = None if group is None else group._st("Translate_ranks").ranks
        out = []
        for r in ranks:
            if r == PROC_NULL:
                out.append(PROC_NULL)
                continue
            if not 0 <= r < len(s.ranks):
                raise group_error(f"Translate_ranks: rank {r} is not in a group of {len(s.ranks)}", ERR_RANK)
            world = s.ranks[r]
            if other is None:
                out.append(world)
            else:
                out.append(other.index(world) if world in other else UNDEFINED)
        return out

    def Compare(self, group):
        a, b = self._st("Compare").ranks, group._st("Compare").ranks
        if a == b:
            return IDENT
        return SIMILAR if sorted(a) == sorted(b) else UNEQUAL

    def _new(self, ranks):
        return Group._from_ranks(ranks)

    def Union(self, group):
        a, b = self._st("Union").ranks, group._st("Union").ranks
        return self._new(a + tuple(r for r in b if r not in a))

    def Intersection(self, group):
        a, b = self._st("Intersection").ranks, group._st("Intersection").ranks
        return self._new(tuple(r for r in a if r in b))

    Intersect = Intersection

    def Difference(self, group):
        a, b = self._st("Difference").ranks, group._st("Difference").ranks
        return self._new(tuple(r for r in a if r not in b))

    def _checked(self, ranks, what):
        s = self._st(what)
        ranks = list(ranks)
        for r in ranks:
            if not 0 <= r < len(s.ranks):
                raise group_error(f"{what}: rank {r} is not in a group of {len(s.ranks)}", ERR_RANK)
        if len(set(ranks)) != len(ranks):
            raise group_error(f"{what}: the ranks {ranks} repeat", ERR_RANK)
        return s, ranks

    def Incl(self, ranks):
        s, ranks = self._checked(ranks, "Incl")
        return self._new(s.ranks[r] for r in ranks)

    def Excl(self, ranks):
        s, ranks = self._checked(ranks, "Excl")
        return self._new(w for i, w in enumerate(s.ranks) if i not in ranks)

    @staticmethod
    def _expand(ranges, what):
        out = []
        for first, last, stride in ranges:
            if stride == 0:
                raise group_error(f"{what}: a stride of 0", ERR_ARG)
            out.extend(range(first, last + (1 if stride > 0 else -1), stride))
        return out

    def Range_incl(self, ranges):
        return self.Incl(self._expand(ranges, "Range_incl"))

    def Range_excl(self, ranges):
        return self.Excl(self._expand(ranges, "Range_excl"))

    @classmethod
    def Create_from_session_pset(cls, session, pset_name):
        """The group of a session's process set ("mpi://WORLD", "mpi://SELF")."""
        return session.Create_group(pset_name)

    def __reduce__(self):
        if self._s is not None and self._named_name() is None:
            raise ValueError(f"cannot pickle {self!r}: only predefined groups can be pickled")
        return super().__reduce__()


def empty_group():
    return Group._of(_GroupState(()))
