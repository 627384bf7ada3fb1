"""MPI datatypes: the predefined ones (sizes of 64-bit Linux, names and handles as mpi4py has
them on Open MPI) and derived ones built from them.

A datatype is a typemap: (byte displacement, basic type) entries, with a lower bound and an
extent. Buffers of a type whose typemap is one contiguous run of one basic type are used in
place; other types are packed into a contiguous temporary on the way in and unpacked on the
way out (`pack` / `unpack`, NumPy fancy indexing over the bytes). A `Datatype` object is a
handle: `Datatype(t)` refers to the same type as `t`, and `Free()` nulls only that handle.
"""
import re
import weakref

import numpy as np

from ..base import dtypes as _dtypes
from ..base.errors import InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C
from . import derived as _derived
from .attributes import copy_attrs, create_keyval, delete_all, delete_attr, free_keyval, get_attr, set_attr
from .hostcopy import HostStage
from .memory import Msg, as_array

ERR_TYPE, ERR_ARG, ERR_KEYVAL = _C["ERR_TYPE"], _C["ERR_ARG"], _C["ERR_KEYVAL"]
_INT_MAX = 2**31 - 1  # the largest count of MPI 3.1's C interface


def type_error(message):
    return InvalidUsageError(message, error_class=ERR_TYPE)


class _Type:
    """The type behind Datatype handles: sizes and bounds, and a typemap built when needed."""

    __slots__ = ("name", "np", "size", "lb", "ub", "true_lb", "true_ub", "combiner", "contents", "predefined",
                 "handle", "typechar", "typestr", "code", "committed", "attrs", "align", "_make", "_map",
                 "_contiguous", "_index", "base", "__weakref__")

    def __init__(self, name, np_dtype, size, lb, ub, true_lb, true_ub, combiner=0, contents=None,
                 predefined=False, typechar=None, typestr=None, make=None):
        self.name, self.np, self.size, self.lb, self.ub = name, np_dtype, size, lb, ub
        self.true_lb, self.true_ub = true_lb, true_ub
        self.combiner, self.contents, self.predefined = combiner, contents, predefined
        self.typechar, self.typestr = typechar, typestr
        self.code = None if np_dtype is None or np_dtype.names else _core_code(np_dtype)
        self.handle = None
        self.committed = predefined
        self.attrs = {}
        self.align = np_dtype.alignment if np_dtype is not None else max(size, 1)
        self._make, self._map, self._contiguous, self._index = make, None, None, {}
        self.base = None  # Dup and Create_f90_*: the predefined type this one stands for

    @classmethod
    def derived(cls, size, lb, ub, true_lb, true_ub, combiner, contents, make):
        """A new registered derived type (contents: ints, addresses, counts, old _Types)."""
        t = cls("", None, size, lb, ub, true_lb, true_ub, combiner, contents, make=make)
        olds = contents[3] if contents else ()
        t.align = max([o.align for o in olds] or [1])
        return _register(t)

    @property
    def extent(self):
        return self.ub - self.lb

    def typemap(self):
        """(byte offsets, byte sizes, basic _Types) of one element, in typemap order."""
        if self._map is None:
            if self._make is None:  # a basic type
                self._map = (np.zeros(1 if self.size else 0, np.int64), np.full(1 if self.size else 0, self.size,
                                                                                np.int64), [self] if self.size else [])
            else:
                self._map = self._make()
        return self._map

    @property
    def basics(self):
        return self.typemap()[2]

    def element(self):
        """The one basic type all entries share (None when they differ): what a reduction on
        this type reduces, element by element."""
        basics = self.basics
        first = basics[0] if basics else None
        return first if all(b is first for b in basics) else None

    def contiguous(self):
        """True when an element's bytes are [0, size) in typemap order and elements follow each
        other with no gap: then a buffer of this type is its own packed form."""
        if self._contiguous is None:
            ok = self.lb == 0 and self.extent == self.size and self.true_lb == 0 and self.true_ub == self.size
            if ok and self._make is not None:
                if self.size > (1 << 24):
                    ok = False  # too large to check here; packed, which is always right
                else:
                    offs, sizes, _ = self.typemap()
                    ok = bool(offs.size == 0 or (offs[0] == 0 and (offs[1:] == (offs + sizes)[:-1]).all()))
            self._contiguous = ok
        return self._contiguous

    def runs(self, count):
        """(byte positions from the buffer start, lengths) of the runs of consecutive bytes that
        count elements cover, in typemap order."""
        if count == 0:
            return np.zeros(0, np.intp), np.zeros(0, np.intp)
        if self.contiguous():
            return np.zeros(1, np.intp), np.array([count * self.size], np.intp)
        index = self.byte_index(count)
        first = np.concatenate(([0], np.flatnonzero(np.diff(index) != 1) + 1))
        return index[first], np.diff(np.concatenate((first, [index.size])))

    def byte_index(self, count):
        """Offsets (from the buffer start) of the bytes of `count` elements, in typemap order."""
        one = self._index.get("one")
        if one is None:
            offs, sizes, _ = self.typemap()
            one = np.concatenate([np.arange(o, o + n, dtype=np.intp) for o, n in zip(offs, sizes)]) \
                if offs.size else np.zeros(0, np.intp)
            self._index["one"] = one
        return (np.arange(count, dtype=np.intp)[:, None] * self.extent + one[None, :]).reshape(-1)


def _core_code(dt):
    """gpucoll's native dtype code for a NumPy dtype, None when the engines lack it."""
    try:
        return _dtypes.code_of(dt)
    except InvalidUsageError:
        return None


class Datatype:
    """An MPI datatype handle (MPI.INT, MPI.DOUBLE, ... and derived types)."""

    __slots__ = ("_t", "__weakref__")

    def __new__(cls, datatype=None):
        obj = object.__new__(cls)
        obj._t = None
        if datatype is not None:
            if not isinstance(datatype, Datatype):
                raise TypeError(f"Datatype() takes a Datatype or None, not {type(datatype).__name__}")
            obj._t = datatype._t
        return obj

    # --- handle semantics ----------------------------------------------------------
    def __bool__(self):
        return self._t is not None

    def __eq__(self, other):
        if not isinstance(other, Datatype):
            return NotImplemented
        return self._t is other._t

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # a handle (Free nulls it): unhashable, as in mpi4py

    def __lt__(self, other):
        raise TypeError("datatypes are not ordered")

    __le__ = __gt__ = __ge__ = __lt__

    def __repr__(self):
        return f"<gpucoll.MPI.Datatype {self.Get_name() or 'unnamed'}>"

    def __reduce__(self):
        t = self._t
        if t is None:
            return (_null, ()) if self is DATATYPE_NULL else (type(self), ())
        if t.predefined and t.contents is None:
            name = _CANONICAL_NAME[t.handle]
            return (_predefined, (name,)) if NAMES[name] is self else (type(self), (NAMES[name],))
        # a derived type travels as how it was made: its constructor, old type(s) and parameters
        old, combiner, params = self.decode()
        return (_rebuild, (old, combiner, params))

    def _rec(self, what="datatype"):
        if self._t is None:
            raise type_error(f"{what}: the datatype is MPI.DATATYPE_NULL")
        return self._t

    @classmethod
    def _of(cls, t):
        obj = object.__new__(cls)
        obj._t = t
        return obj

    @property
    def handle(self):
        return 0 if self._t is None else self._t.handle

    def toint(self):
        return self.handle

    py2f = toint

    @classmethod
    def fromint(cls, value):
        return cls._of(_BY_HANDLE.get(value)) if value else cls()

    f2py = fromhandle = fromint

    def free(self):
        """Free a derived datatype; null and predefined ones are left alone (a copy of a predefined
        one becomes null)."""
        t = self._t
        if t is None or any(self is v for v in NAMES.values()):
            return
        if t.predefined and t.contents is None:
            self._t = None
            return
        self.Free()

    # --- sizes ----------------------------------------------------------------------
    def Get_size(self):
        return self._rec().size

    size = property(Get_size)

    def Get_extent(self):
        t = self._rec()
        return t.lb, t.extent

    def Get_true_extent(self):
        t = self._rec()
        return t.true_lb, t.true_ub - t.true_lb

    lb = property(lambda self: self._rec().lb)
    ub = property(lambda self: self._rec().ub)
    extent = property(lambda self: self._rec().extent)
    true_lb = property(lambda self: self._rec().true_lb)
    true_ub = property(lambda self: self._rec().true_ub)
    true_extent = property(lambda self: self._rec().true_ub - self._rec().true_lb)

    # --- names, codes ---------------------------------------------------------------
    def Get_name(self):
        return "MPI_DATATYPE_NULL" if self._t is None else self._t.name

    def Set_name(self, name):
        self._rec().name = str(name)

    name = property(Get_name, Set_name)

    @property
    def typechar(self):
        t = self._t
        if t is None:
            return ""
        return t.typechar if t.typechar is not None else "V"

    @property
    def typestr(self):
        t = self._t
        if t is None:
            return ""
        return t.typestr if t.typestr is not None else f"V{t.extent}"

    def tocode(self):
        t = self._t
        if t is None or t.typechar is None or t.typechar == "V":
            raise ValueError(f"{self!r} has no type code (it is not one basic type)")
        while t.base is not None:
            t = t.base
        return _CODE_OF.get(t.name, t.typechar)

    @classmethod
    def fromcode(cls, code):
        t = _TYPEDICT.get(code)
        if t is None:
            raise ValueError(f"cannot map the type code {code!r} to an MPI datatype")
        return cls._of(t)

    @property
    def core_datatype(self):
        """gpucoll's own Datatype for a type of one native element (so that gpucoll's Communicator
        takes [buf, MPI.DOUBLE] as well); None for the others."""
        t = self._t
        while t is not None and t.base is not None:
            t = t.base
        if t is None or t.code is None or t.contents is not None:
            return None
        from ..calls.buffers import Datatype as CoreDatatype

        return CoreDatatype(_dtypes.name(t.code))

    @property
    def is_named(self):
        return self._t is not None and self._t.combiner == _C["COMBINER_NAMED"]

    @property
    def is_predefined(self):
        return self._t is None or self._t.predefined

    # --- life cycle -----------------------------------------------------------------
    def Commit(self):
        self._rec("Commit").committed = True
        return self

    def Free(self):
        t = self._rec("Free")
        if t.predefined and t.contents is None:
            raise type_error(f"Free: {t.name} is a predefined datatype and cannot be freed")
        if t.attrs:
            delete_all(self, t.attrs)
        self._t = None

    def Dup(self):
        t = self._rec("Dup")
        new = _Type.derived(t.size, t.lb, t.ub, t.true_lb, t.true_ub, _C["COMBINER_DUP"], ([], [], [], [t]),
                            t.typemap)
        new.np, new.code, new.typechar, new.typestr = t.np, t.code, t.typechar, t.typestr
        new.base = t if t.typechar not in (None, "V") else None
        new.name = f"Dup {t.name}" if t.name else ""
        new.committed = t.committed
        new.attrs = copy_attrs(self, t.attrs) if t.attrs else {}
        return type(self)._of(new)

    Create_dup = Dup

    # --- derived datatypes (gpucoll/mpi/derived.py) ---------------------------------------
    def Create_contiguous(self, count):
        if isinstance(count, int) and count > _INT_MAX:
            # what mpi4py builds on an MPI 3.1 library (the version gpucoll.MPI reports): the whole
            # INT_MAX blocks as a vector and the rest as a contiguous type, side by side in a struct
            blocks, rest = divmod(count, _INT_MAX)
            parts = (self.Create_vector(blocks, _INT_MAX, _INT_MAX), self.Create_contiguous(rest))
            return type(self).Create_struct([1, 1], [0, blocks * _INT_MAX * self.extent], parts)
        return type(self)._of(_derived.contiguous(_Type, self._rec("Create_contiguous"), count))

    def Create_vector(self, count, blocklength, stride):
        return type(self)._of(_derived.vector(_Type, self._rec("Create_vector"), count, blocklength, stride))

    def Create_hvector(self, count, blocklength, stride):
        return type(self)._of(_derived.vector(_Type, self._rec("Create_hvector"), count, blocklength, stride, True))

    def Create_indexed(self, blocklengths, displacements):
        return type(self)._of(_derived.indexed(_Type, self._rec("Create_indexed"), blocklengths, displacements))

    def Create_hindexed(self, blocklengths, displacements):
        return type(self)._of(_derived.indexed(_Type, self._rec("Create_hindexed"), blocklengths, displacements,
                                               True))

    def Create_indexed_block(self, blocklength, displacements):
        return type(self)._of(_derived.indexed_block(_Type, self._rec("Create_indexed_block"), blocklength,
                                                     displacements))

    def Create_hindexed_block(self, blocklength, displacements):
        return type(self)._of(_derived.indexed_block(_Type, self._rec("Create_hindexed_block"), blocklength,
                                                     displacements, True))

    @classmethod
    def Create_struct(cls, blocklengths, displacements, datatypes):
        return cls._of(_derived.struct(_Type, blocklengths, displacements, datatypes))

    def Create_subarray(self, sizes, subsizes, starts, order=_C["ORDER_C"]):
        return type(self)._of(_derived.subarray(_Type, self._rec("Create_subarray"), sizes, subsizes, starts,
                                                order))

    def Create_darray(self, size, rank, gsizes, distribs, dargs, psizes, order=_C["ORDER_C"]):
        return type(self)._of(_derived.darray(_Type, self._rec("Create_darray"), size, rank, gsizes, distribs,
                                              dargs, psizes, order))

    def Create_resized(self, lb, extent):
        return type(self)._of(_derived.resized(_Type, self._rec("Create_resized"), lb, extent))

    Resized = Create_resized

    @classmethod
    def Create_f90_integer(cls, r):
        name = "INT8_T" if r <= 2 else "SHORT" if r <= 4 else "INT" if r <= 9 else "LONG" if r <= 18 else None
        return cls._of(_derived.f90(_Type, _f90_base(name, "integer", r), _C["COMBINER_F90_INTEGER"], [r]))

    @classmethod
    def Create_f90_real(cls, p, r):
        name = "FLOAT" if p <= 6 and r <= 37 else "DOUBLE" if p <= 15 and r <= 307 else "LONG_DOUBLE" \
            if p <= 18 and r <= 4931 else None
        return cls._of(_derived.f90(_Type, _f90_base(name, "real", (p, r)), _C["COMBINER_F90_REAL"], [p, r]))

    @classmethod
    def Create_f90_complex(cls, p, r):
        name = "C_FLOAT_COMPLEX" if p <= 6 and r <= 37 else "C_DOUBLE_COMPLEX" if p <= 15 and r <= 307 else \
            "C_LONG_DOUBLE_COMPLEX" if p <= 18 and r <= 4931 else None
        return cls._of(_derived.f90(_Type, _f90_base(name, "complex", (p, r)), _C["COMBINER_F90_COMPLEX"], [p, r]))

    # --- packing ----------------------------------------------------------------------
    def Pack_size(self, count, comm=None):
        return count * self._rec("Pack_size").size

    def Pack(self, inbuf, outbuf, position, comm=None):
        """Pack inbuf's elements of this type (as many as fit in it) into outbuf at byte `position`;
        the position after them."""
        t = self._rec("Pack")
        stage = HostStage()  # GPU buffers: through host copies (never NumPy over device memory)
        raw = _bytes_of(as_array(stage.spec(inbuf, False, "Pack inbuf"), True, "Pack inbuf"))
        data = Msg(raw, raw.size // t.extent if t.extent > 0 else 0, self).data()
        out = _bytes_of(as_array(stage.spec(outbuf, True, "Pack outbuf"), False, "Pack outbuf"))
        if position < 0 or position + data.size > out.size:
            raise InvalidUsageError(f"Pack: {data.size} bytes at position {position} do not fit in {out.size}",
                                    error_class=_C["ERR_TRUNCATE"])
        out[position:position + data.size] = data
        stage.finish()
        return position + data.size

    def Unpack(self, inbuf, position, outbuf, comm=None):
        """Fill outbuf with elements of this type (as many as it holds) from inbuf's bytes at
        `position`; the position after them."""
        t = self._rec("Unpack")
        stage = HostStage()  # GPU buffers: through host copies (never NumPy over device memory)
        src = _bytes_of(as_array(stage.spec(inbuf, False, "Unpack inbuf"), True, "Unpack inbuf"))
        raw = _bytes_of(as_array(stage.spec(outbuf, True, "Unpack outbuf"), False, "Unpack outbuf"))
        msg = Msg(raw, raw.size // t.extent if t.extent > 0 else 0, self)
        n = msg.nbytes
        if position < 0 or position + n > src.size:
            raise InvalidUsageError(f"Unpack: {n} bytes at position {position} are past the {src.size} given",
                                    error_class=_C["ERR_TRUNCATE"])
        msg.store(src[position:position + n])
        stage.finish()
        return position + n

    # --- envelope and contents ------------------------------------------------------
    def Get_envelope(self):
        t = self._rec("Get_envelope")
        if t.contents is None:
            return (0, 0, 0, 0, t.combiner)
        i, a, c, d = t.contents
        return (len(i), len(a), len(c), len(d), t.combiner)

    envelope = property(Get_envelope)
    combiner = property(lambda self: self.Get_envelope()[-1])

    def Get_contents(self):
        t = self._rec("Get_contents")
        if t.contents is None:
            raise type_error(f"Get_contents: {t.name} is a named datatype")
        i, a, c, d = t.contents
        return list(i), list(a), list(c), [Datatype._of(x) for x in d]

    contents = property(Get_contents)

    def decode(self):
        t = self._rec("decode")
        if t.contents is None:
            return self, "NAMED", {}
        return _derived.decode(t, Datatype._of)

    # --- attributes (Create_keyval/Set_attr/...) ---------------------------------------
    def Get_attr(self, keyval):
        return get_attr(self._rec("Get_attr").attrs, keyval, "Datatype")

    def Set_attr(self, keyval, attrval):
        set_attr(self, self._rec("Set_attr").attrs, keyval, attrval, "Datatype")

    def Delete_attr(self, keyval):
        delete_attr(self, self._rec("Delete_attr").attrs, keyval, "Datatype")

    @staticmethod
    def Create_keyval(copy_fn=None, delete_fn=None, nopython=False):
        return create_keyval("Datatype", copy_fn, delete_fn, nopython)

    @staticmethod
    def Free_keyval(keyval):
        return free_keyval(keyval)

    # --- predefined lookups -----------------------------------------------------------
    @staticmethod
    def Get_value_index(value, index):
        if not value or not index:
            raise type_error("Get_value_index: a datatype is MPI.DATATYPE_NULL")
        if index._t is not _BY_NAME["INT"]:
            return Datatype()
        pair = _VALUE_INDEX.get(_CANONICAL_NAME.get(value._t.handle))
        return Datatype._of(_BY_NAME[pair]) if pair else Datatype()

    @staticmethod
    def Match_size(typeclass, size):
        table = {_C["TYPECLASS_INTEGER"]: ("INTEGER1", "INTEGER2", "INTEGER4", "INTEGER8"),
                 _C["TYPECLASS_REAL"]: ("REAL4", "REAL8", "REAL16"),
                 _C["TYPECLASS_COMPLEX"]: ("COMPLEX8", "COMPLEX16"),
                 _C["TYPECLASS_LOGICAL"]: ("LOGICAL1", "LOGICAL2", "LOGICAL4", "LOGICAL8")}
        for name in table.get(typeclass, ()):
            if _BY_NAME[name].size == size:
                return Datatype._of(_BY_NAME[name])
        raise InvalidUsageError(f"Match_size: no type of class {typeclass} has {size} bytes",
                                error_class=ERR_ARG)


def _f90_base(name, kind, args):
    if name is None:
        raise InvalidUsageError(f"Create_f90_{kind}{args}: no {kind} type has that precision and range",
                                error_class=ERR_ARG)
    return _BY_NAME[name]


def _bytes_of(arr):
    flat = arr.reshape(-1, order="A")
    return flat.view(np.uint8) if flat.size else np.zeros(0, np.uint8)


def _rebuild(old, combiner, params):
    if combiner == "DUP":
        return old.Dup()
    if combiner.startswith("F90_"):
        return getattr(Datatype, f"Create_{combiner.lower()}")(**params)
    if combiner == "STRUCT":
        return Datatype.Create_struct(**params).Commit()
    return getattr(old, f"Create_{combiner.lower()}")(**params).Commit()


def _null():
    return DATATYPE_NULL


def _predefined(name):
    return NAMES[name]


# --- the predefined types ------------------------------------------------------------------
# (names sharing one handle, MPI name, NumPy format or None, size, extent, typechar, typestr, handle)
_PREDEFINED = (
    (("AINT",), "MPI_AINT", "i8", 8, 8, "p", "i8", 66),
    (("BOOL", "C_BOOL"), "MPI_C_BOOL", "?", 1, 1, "?", "b1", 68),
    (("BYTE",), "MPI_BYTE", "u1", 1, 1, "B", "u1", 1),
    (("CHAR",), "MPI_CHAR", "S1", 1, 1, "c", "S1", 34),
    (("CHARACTER",), "MPI_CHARACTER", "S1", 1, 1, "c", "S1", 5),
    (("COMPLEX", "F_COMPLEX", "F_FLOAT_COMPLEX"), "MPI_COMPLEX", "c8", 8, 8, "F", "c8", 18),
    (("COMPLEX16",), "MPI_COMPLEX16", "c16", 16, 16, "D", "c16", 20),
    (("COMPLEX32",), "MPI_COMPLEX32", None, 0, 0, "G", "c32", 21),
    (("COMPLEX8",), "MPI_COMPLEX8", "c8", 8, 8, "F", "c8", 19),
    (("COUNT",), "MPI_COUNT", "i8", 8, 8, "p", "i8", 72),
    (("CXX_BOOL",), "MPI_CXX_BOOL", "?", 1, 1, "?", "b1", 54),
    (("CXX_DOUBLE_COMPLEX",), "MPI_CXX_DOUBLE_COMPLEX", "c16", 16, 16, "D", "c16", 56),
    (("CXX_FLOAT_COMPLEX",), "MPI_CXX_FLOAT_COMPLEX", "c8", 8, 8, "F", "c8", 55),
    (("CXX_LONG_DOUBLE_COMPLEX",), "MPI_CXX_LONG_DOUBLE_COMPLEX", "G", 32, 32, "G", "c32", 57),
    (("C_COMPLEX", "C_FLOAT_COMPLEX"), "MPI_C_COMPLEX", "c8", 8, 8, "F", "c8", 69),
    (("C_DOUBLE_COMPLEX",), "MPI_C_DOUBLE_COMPLEX", "c16", 16, 16, "D", "c16", 70),
    (("C_LONG_DOUBLE_COMPLEX",), "MPI_C_LONG_DOUBLE_COMPLEX", "G", 32, 32, "G", "c32", 71),
    (("DOUBLE", "FLOAT64_T"), "MPI_DOUBLE", "f8", 8, 8, "d", "f8", 46),
    (("DOUBLE_COMPLEX", "F_DOUBLE_COMPLEX"), "MPI_DOUBLE_COMPLEX", "c16", 16, 16, "D", "c16", 22),
    (("DOUBLE_PRECISION", "F_DOUBLE"), "MPI_DOUBLE_PRECISION", "f8", 8, 8, "d", "f8", 17),
    (("FLOAT", "FLOAT32_T"), "MPI_FLOAT", "f4", 4, 4, "f", "f4", 45),
    (("FLOAT16_T",), "MPI_SHORT_FLOAT", "f2", 2, 2, "e", "f2", 74),
    (("F_BOOL", "LOGICAL"), "MPI_LOGICAL", "i4", 4, 4, "i", "i4", 6),
    (("F_FLOAT", "REAL"), "MPI_REAL", "f4", 4, 4, "f", "f4", 13),
    (("F_INT", "INTEGER"), "MPI_INTEGER", "i4", 4, 4, "i", "i4", 7),
    (("INT", "SIGNED_INT"), "MPI_INT", "i4", 4, 4, "i", "i4", 39),
    (("INT16_T", "SINT16_T"), "MPI_INT16_T", "i2", 2, 2, "h", "i2", 60),
    (("INT32_T", "SINT32_T"), "MPI_INT32_T", "i4", 4, 4, "i", "i4", 62),
    (("INT64_T", "SINT64_T"), "MPI_INT64_T", "i8", 8, 8, "l", "i8", 64),
    (("INT8_T", "SINT8_T"), "MPI_INT8_T", "i1", 1, 1, "b", "i1", 58),
    (("INTEGER1",), "MPI_INTEGER1", "i1", 1, 1, "b", "i1", 8),
    (("INTEGER2",), "MPI_INTEGER2", "i2", 2, 2, "h", "i2", 9),
    (("INTEGER4",), "MPI_INTEGER4", "i4", 4, 4, "i", "i4", 10),
    (("INTEGER8",), "MPI_INTEGER8", "i8", 8, 8, "l", "i8", 11),
    (("LOGICAL1",), "MPI_LOGICAL1", "?", 1, 1, "?", "b1", 29),
    (("LOGICAL2",), "MPI_LOGICAL2", "i2", 2, 2, "h", "i2", 30),
    (("LOGICAL4",), "MPI_LOGICAL4", "i4", 4, 4, "i", "i4", 31),
    (("LOGICAL8",), "MPI_LOGICAL8", "i8", 8, 8, "l", "i8", 32),
    (("LONG", "SIGNED_LONG"), "MPI_LONG", "i8", 8, 8, "l", "i8", 41),
    (("LONG_DOUBLE",), "MPI_LONG_DOUBLE", "g", 16, 16, "g", "f16", 47),
    (("LONG_LONG", "SIGNED_LONG_LONG"), "MPI_LONG_LONG_INT", "i8", 8, 8, "q", "i8", 43),
    (("OFFSET",), "MPI_OFFSET", "i8", 8, 8, "p", "i8", 67),
    (("PACKED",), "MPI_PACKED", "u1", 1, 1, "B", "u1", 2),
    (("REAL16",), "MPI_REAL16", "g", 16, 16, "g", "f16", 16),
    (("REAL4",), "MPI_REAL4", "f4", 4, 4, "f", "f4", 14),
    (("REAL8",), "MPI_REAL8", "f8", 8, 8, "d", "f8", 15),
    (("SHORT", "SIGNED_SHORT"), "MPI_SHORT", "i2", 2, 2, "h", "i2", 37),
    (("SIGNED_CHAR",), "MPI_SIGNED_CHAR", "i1", 1, 1, "b", "i1", 36),
    (("UINT16_T",), "MPI_UINT16_T", "u2", 2, 2, "H", "u2", 61),
    (("UINT32_T",), "MPI_UINT32_T", "u4", 4, 4, "I", "u4", 63),
    (("UINT64_T",), "MPI_UINT64_T", "u8", 8, 8, "L", "u8", 65),
    (("UINT8_T",), "MPI_UINT8_T", "u1", 1, 1, "B", "u1", 59),
    (("UNSIGNED", "UNSIGNED_INT"), "MPI_UNSIGNED", "u4", 4, 4, "I", "u4", 40),
    (("UNSIGNED_CHAR",), "MPI_UNSIGNED_CHAR", "u1", 1, 1, "B", "u1", 35),
    (("UNSIGNED_LONG",), "MPI_UNSIGNED_LONG", "u8", 8, 8, "L", "u8", 42),
    (("UNSIGNED_LONG_LONG",), "MPI_UNSIGNED_LONG_LONG", "u8", 8, 8, "Q", "u8", 44),
    (("UNSIGNED_SHORT",), "MPI_UNSIGNED_SHORT", "u2", 2, 2, "H", "u2", 38),
    (("WCHAR",), "MPI_WCHAR", "U1", 4, 4, "U", "U1", 33),
    # gpucoll reduces and moves bfloat16 (Open MPI 5 has no MPI_BFLOAT16_T: there it is null)
    (("BFLOAT16_T",), "MPI_BFLOAT16_T", None, 2, 2, None, None, 75),
)
# Pair types of MAXLOC/MINLOC: (names, MPI name, value type, C struct layout, handle).
_PAIRS = (
    (("FLOAT_INT",), "MPI_FLOAT_INT", "FLOAT", "f4", 48),
    (("DOUBLE_INT",), "MPI_DOUBLE_INT", "DOUBLE", "f8", 49),
    (("LONG_DOUBLE_INT",), "MPI_LONG_DOUBLE_INT", "LONG_DOUBLE", "g", 50),
    (("LONG_INT",), "MPI_LONG_INT", "LONG", "i8", 51),
    (("INT_INT", "TWOINT"), "MPI_2INT", "INT", "i4", 52),
    (("SHORT_INT",), "MPI_SHORT_INT", "SHORT", "i2", 53),
)
_VALUE_INDEX = {"SHORT": "SHORT_INT", "INT": "INT_INT", "LONG": "LONG_INT", "FLOAT": "FLOAT_INT",
                "DOUBLE": "DOUBLE_INT", "LONG_DOUBLE": "LONG_DOUBLE_INT"}
# Names that are null here, as under Open MPI 5.
NULL_NAMES = ("COMPLEX4", "INTEGER16", "LOGICAL16", "REAL2")

_BY_NAME = {}     # every predefined name -> _Type (which keeps the predefined ones alive)
_BY_HANDLE = weakref.WeakValueDictionary()  # handle -> _Type, for fromint (derived types die with their handles)
_next_handle = [1000]


def _register(t, handle=None):
    if handle is None:
        handle = _next_handle[0]
        _next_handle[0] += 1
    t.handle = handle
    _BY_HANDLE[handle] = t
    return t


for _names, _mpi_name, _fmt, _size, _extent, _char, _str, _handle in _PREDEFINED:
    _np = np.dtype(_fmt) if _fmt else (np.dtype("u2") if _names[0] == "BFLOAT16_T" else None)
    _t = _Type(_mpi_name, _np, _size, 0, _extent, 0, _size, predefined=True, typechar=_char, typestr=_str)
    if _names[0] == "BFLOAT16_T":
        _t.code = _dtypes.BFLOAT16
    _register(_t, _handle)
    for _n in _names:
        _BY_NAME[_n] = _t

for _names, _mpi_name, _value, _fmt, _handle in _PAIRS:
    _v = _BY_NAME[_value]
    _layout = np.dtype([("value", _fmt), ("index", "i4")], align=True)  # the C struct {value; int}
    _offset = _layout.fields["index"][1]
    _t = _Type(_mpi_name, _layout, _v.size + 4, 0, _layout.itemsize, 0, _offset + 4, predefined=True,
               typechar="V", typestr=f"V{_layout.itemsize}",
               make=(lambda v=_v, o=_offset: (np.array([0, o], np.int64), np.array([v.size, 4], np.int64),
                                              [v, _BY_NAME["INT"]])))
    _register(_t, _handle)
    for _n in _names:
        _BY_NAME[_n] = _t

# mpi4py's type codes (MPI._typedict and friends): NumPy/struct characters -> datatypes
_TYPEDICT_C = {"?": "C_BOOL", "b": "SIGNED_CHAR", "h": "SHORT", "i": "INT", "l": "LONG", "q": "LONG_LONG",
               "B": "UNSIGNED_CHAR", "H": "UNSIGNED_SHORT", "I": "UNSIGNED", "L": "UNSIGNED_LONG",
               "Q": "UNSIGNED_LONG_LONG", "f": "FLOAT", "d": "DOUBLE", "g": "LONG_DOUBLE",
               "F": "C_FLOAT_COMPLEX", "D": "C_DOUBLE_COMPLEX", "G": "C_LONG_DOUBLE_COMPLEX", "b1": "C_BOOL",
               "i1": "INT8_T", "i2": "INT16_T", "i4": "INT32_T", "i8": "INT64_T", "u1": "UINT8_T",
               "u2": "UINT16_T", "u4": "UINT32_T", "u8": "UINT64_T", "f2": "FLOAT16_T", "f4": "FLOAT",
               "c8": "C_FLOAT_COMPLEX", "f8": "DOUBLE", "c16": "C_DOUBLE_COMPLEX", "f16": "LONG_DOUBLE",
               "c32": "C_LONG_DOUBLE_COMPLEX"}
_TYPEDICT = dict(_TYPEDICT_C, e="FLOAT16_T", Zf="C_FLOAT_COMPLEX", Zd="C_DOUBLE_COMPLEX",
                 Zg="C_LONG_DOUBLE_COMPLEX", n="COUNT", N="UNSIGNED_LONG", p="AINT", P="UNSIGNED_LONG",
                 c="CHAR", a="CHAR", S="CHAR", S1="CHAR", s="CHAR", U="WCHAR", U1="WCHAR", u="UINT16_T",
                 w="WCHAR", M="INT64_T", M8="INT64_T", m="INT64_T", m8="INT64_T", **{"1s": "CHAR", "1u": "UINT16_T",
                                                                                   "1w": "WCHAR"})
_TYPEDICT_F = {"l": "LOGICAL", "i": "INTEGER", "r": "REAL", "s": "REAL", "d": "DOUBLE_PRECISION", "c": "COMPLEX",
               "z": "DOUBLE_COMPLEX", "l1": "LOGICAL1", "l2": "LOGICAL2", "l4": "LOGICAL4", "l8": "LOGICAL8",
               "i1": "INTEGER1", "i2": "INTEGER2", "i4": "INTEGER4", "i8": "INTEGER8", "r4": "REAL4",
               "r8": "REAL8", "r16": "REAL16", "c8": "COMPLEX8", "c16": "COMPLEX16", "c32": "COMPLEX32"}
_TYPEDICT = {k: _BY_NAME[v] for k, v in _TYPEDICT.items()}
# The code tocode() gives: the sized form (typestr) for fixed-width and sized Fortran types and
# C's bool, the character (typechar) for the rest.
_SIZED = re.compile(r"MPI_(U?INT\d+_T|C_BOOL|(INTEGER|REAL|COMPLEX|LOGICAL)\d+)$")
_CODE_OF = {t.name: t.typestr if _SIZED.match(t.name) else t.typechar for t in _BY_HANDLE.values() if t.typechar}

DATATYPE_NULL = Datatype()
_OBJECTS = {}  # one Datatype object per predefined type: aliases (BOOL, C_BOOL) are the same object
NAMES = {name: _OBJECTS.setdefault(t.handle, Datatype._of(t)) for name, t in _BY_NAME.items()}
NAMES.update({name: Datatype() for name in NULL_NAMES}, DATATYPE_NULL=DATATYPE_NULL)
_CANONICAL_NAME = {}
for _n, _t in _BY_NAME.items():
    _CANONICAL_NAME.setdefault(_t.handle, _n)


def plain_predefined():
    """The predefined datatypes whose elements are one basic value each, contiguous (size equal
    to extent, no lower bound): a buffer of them is its bytes as they are."""
    return [d for d in _OBJECTS.values()
            if d._t.size > 0 and d._t.lb == 0 and d._t.size == d._t.extent
            and d._t.np is not None and d._t.np.names is None]


def typedict(which=""):
    """mpi4py's MPI._typedict (which=""), _typedict_c ("c") and _typedict_f ("f")."""
    if which == "f":
        return {k: Datatype._of(_BY_NAME[v]) for k, v in _TYPEDICT_F.items()}
    if which == "c":
        return {k: Datatype._of(_BY_NAME[v]) for k, v in _TYPEDICT_C.items()}
    return {k: Datatype._of(t) for k, t in _TYPEDICT.items()}


def from_typechar(code):
    """The datatype of a type code in a buffer specification ([buf, 'i']), or None."""
    t = _TYPEDICT.get(code)
    return None if t is None else Datatype._of(t)


def for_numpy(dt):
    """The predefined datatype that NumPy dtype `dt` stands for (None when there is none)."""
    t = _TYPEDICT.get(dt.char) if dt.kind != "V" else None
    if t is None and dt.kind in "iufcb":
        t = _TYPEDICT.get(f"{dt.kind if dt.kind != 'b' else 'b'}{dt.itemsize}")
    return t



