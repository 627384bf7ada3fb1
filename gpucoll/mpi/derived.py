"""Derived datatypes: the MPI type constructors, their typemaps, and decode().

Every constructor places copies of old types at byte offsets: contiguous, vector and indexed
ones at multiples of the old extent, the h- variants and struct at byte displacements, subarray
at the offsets of a block of a multidimensional array. The new type's bounds follow MPI's
rules (lb/ub of the copies; struct's ub rounded up to its members' alignment; resized sets
them). Typemaps (byte offset, basic type) are built only when a buffer is packed, so a type of
2**31 elements costs nothing until it is used.
"""
import numpy as np

from ..base.errors import InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C

ERR_TYPE, ERR_ARG, ERR_COUNT = _C["ERR_TYPE"], _C["ERR_ARG"], _C["ERR_COUNT"]
COMBINER = {v: k[len("COMBINER_"):] for k, v in _C.items() if k.startswith("COMBINER_") and k != "COMBINER_VALUE_INDEX"}


def _ints(values, what, name, n=None):
    try:
        out = [int(v) for v in values]
    except TypeError:
        raise TypeError(f"{what}: {name} must be a sequence of integers") from None
    if n is not None and len(out) != n:
        raise ValueError(f"{what}: {len(out)} {name} given, {n} expected")
    return out


def _nonneg(value, what, name):
    value = int(value)
    if value < 0:
        raise InvalidUsageError(f"{what}: negative {name} {value}", error_class=ERR_COUNT)
    return value


def _bounds(old, offsets):
    """lb, ub, true_lb, true_ub of copies of old at byte offsets (a non-empty array)."""
    lo, hi = int(offsets.min()), int(offsets.max())
    return lo + old.lb, hi + old.ub, lo + old.true_lb, hi + old.true_ub


def _copies(old, offsets):
    """A typemap maker: old's typemap repeated at each offset."""
    def make():
        d, s, b = old.typemap()
        disps = (offsets[:, None] + d[None, :]).reshape(-1)
        return disps, np.tile(s, len(offsets)), b * len(offsets)
    return make


def new_type(T, old, offsets, combiner, contents, bounds=None):
    """A registered _Type of copies of old at offsets (or empty)."""
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1)
    if offsets.size == 0 or old.size == 0 and old.extent == 0:
        lb = ub = tlb = tub = 0
    else:
        lb, ub, tlb, tub = bounds if bounds is not None else _bounds(old, offsets)
    t = T.derived(old.size * offsets.size, lb, ub, tlb, tub, combiner, contents, _copies(old, offsets))
    return t


def contiguous(T, old, count):
    count = _nonneg(count, "Create_contiguous", "count")
    contents = ([count], [], [], [old])
    if count == 0:
        return T.derived(0, 0, 0, 0, 0, _C["COMBINER_CONTIGUOUS"], contents, lambda: _empty())
    ext = old.extent
    last = (count - 1) * ext
    lo, hi = min(0, last), max(0, last)
    bounds = (lo + old.lb, hi + old.ub, lo + old.true_lb, hi + old.true_ub)

    def make():
        return _copies(old, np.arange(count, dtype=np.int64) * ext)()
    return T.derived(old.size * count, *bounds, _C["COMBINER_CONTIGUOUS"], contents, make)


def _empty():
    return np.zeros(0, np.int64), np.zeros(0, np.int64), []


def vector(T, old, count, blocklength, stride, hvector=False):
    what = "Create_hvector" if hvector else "Create_vector"
    count, blocklength = _nonneg(count, what, "count"), _nonneg(blocklength, what, "blocklength")
    stride = int(stride)
    step = stride if hvector else stride * old.extent
    if hvector:
        combiner, contents = _C["COMBINER_HVECTOR"], ([count, blocklength], [stride], [], [old])
    else:
        combiner, contents = _C["COMBINER_VECTOR"], ([count, blocklength, stride], [], [], [old])
    if count == 0 or blocklength == 0:
        return new_type(T, old, [], combiner, contents)
    # offsets i*step + j*extent: their bounds are the sums of each term's, so that the offsets
    # themselves are made only when the type is packed (a vector of 2**31 elements costs nothing)
    span = [(count - 1) * step, (blocklength - 1) * old.extent]
    lo, hi = sum(min(0, x) for x in span), sum(max(0, x) for x in span)

    def offsets():
        return (np.arange(count, dtype=np.int64)[:, None] * step
                + np.arange(blocklength, dtype=np.int64)[None, :] * old.extent).reshape(-1)
    return T.derived(old.size * count * blocklength, lo + old.lb, hi + old.ub, lo + old.true_lb, hi + old.true_ub,
                     combiner, contents, lambda: _copies(old, offsets())())


def indexed(T, old, blocklengths, displacements, hindexed=False):
    what = "Create_hindexed" if hindexed else "Create_indexed"
    bl = [_nonneg(b, what, "blocklength") for b in _ints(blocklengths, what, "blocklengths")]
    disp = _ints(displacements, what, "displacements", len(bl))
    offsets = [(d if hindexed else d * old.extent) + j * old.extent for b, d in zip(bl, disp) for j in range(b)]
    if hindexed:
        contents = ([len(bl), *bl], disp, [], [old])
        return new_type(T, old, offsets, _C["COMBINER_HINDEXED"], contents)
    return new_type(T, old, offsets, _C["COMBINER_INDEXED"], ([len(bl), *bl, *disp], [], [], [old]))


def indexed_block(T, old, blocklength, displacements, hindexed=False):
    what = "Create_hindexed_block" if hindexed else "Create_indexed_block"
    blocklength = _nonneg(blocklength, what, "blocklength")
    disp = _ints(displacements, what, "displacements")
    offsets = [(d if hindexed else d * old.extent) + j * old.extent for d in disp for j in range(blocklength)]
    if hindexed:
        return new_type(T, old, offsets, _C["COMBINER_HINDEXED_BLOCK"], ([len(disp), blocklength], disp, [], [old]))
    return new_type(T, old, offsets, _C["COMBINER_INDEXED_BLOCK"], ([len(disp), blocklength, *disp], [], [], [old]))


def struct(T, blocklengths, displacements, types):
    what = "Create_struct"
    bl = [_nonneg(b, what, "blocklength") for b in _ints(blocklengths, what, "blocklengths")]
    disp = _ints(displacements, what, "displacements", len(bl))
    types = list(types)
    if len(types) != len(bl):
        raise ValueError(f"{what}: {len(types)} datatypes for {len(bl)} blocks")
    recs = []
    for dt in types:
        if not dt:
            raise InvalidUsageError(f"{what}: a datatype is MPI.DATATYPE_NULL", error_class=ERR_TYPE)
        recs.append(dt._t)
    blocks = [(t, np.asarray([d + j * t.extent for j in range(b)], np.int64)) for b, d, t in zip(bl, disp, recs)
              if b > 0]
    contents = ([len(bl), *bl], disp, [], recs)
    if not blocks:
        return T.derived(0, 0, 0, 0, 0, _C["COMBINER_STRUCT"], contents, _empty)
    bounds = [_bounds(t, offs) for t, offs in blocks]
    lb, ub = min(b[0] for b in bounds), max(b[1] for b in bounds)
    tlb, tub = min(b[2] for b in bounds), max(b[3] for b in bounds)
    align = max(t.align for t, _ in blocks)
    if (ub - lb) % align:  # MPI's epsilon: the extent is rounded up to the members' alignment
        ub += align - (ub - lb) % align

    def make():
        parts = [_copies(t, offs)() for t, offs in blocks]
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                [b for p in parts for b in p[2]])
    return T.derived(sum(t.size * len(offs) for t, offs in blocks), lb, ub, tlb, tub, _C["COMBINER_STRUCT"],
                     contents, make)


def subarray(T, old, sizes, subsizes, starts, order):
    what = "Create_subarray"
    sizes = _ints(sizes, what, "sizes")
    n = len(sizes)
    subsizes, starts = _ints(subsizes, what, "subsizes", n), _ints(starts, what, "starts", n)
    for size, sub, start in zip(sizes, subsizes, starts):
        if sub < 0 or start < 0 or start + sub > size or size <= 0:
            raise InvalidUsageError(f"{what}: subsizes {subsizes} at starts {starts} do not fit in sizes {sizes}",
                                    error_class=ERR_ARG)
    if order not in (_C["ORDER_C"], _C["ORDER_FORTRAN"]):
        raise InvalidUsageError(f"{what}: order {order} is neither ORDER_C nor ORDER_FORTRAN", error_class=ERR_ARG)
    dims = list(range(n)) if order == _C["ORDER_C"] else list(range(n - 1, -1, -1))
    strides, step = [0] * n, 1
    for k in reversed(dims):  # element strides of the full array, in old extents
        strides[k] = step
        step *= sizes[k]
    grids = np.meshgrid(*[np.arange(starts[k], starts[k] + subsizes[k]) for k in dims], indexing="ij")
    index = sum(g.reshape(-1) * strides[k] for g, k in zip(grids, dims)) if n else np.zeros(1, np.int64)
    offsets = np.asarray(index, np.int64) * old.extent
    contents = ([n, *sizes, *subsizes, *starts, order], [], [], [old])
    full = int(np.prod(sizes)) * old.extent
    if offsets.size:
        _, _, tlb, tub = _bounds(old, offsets)
        bounds = (old.lb, old.lb + full, tlb, tub)
    else:
        bounds = (0, 0, 0, 0)
    t = new_type(T, old, offsets, _C["COMBINER_SUBARRAY"], contents, bounds)
    t.lb, t.ub = old.lb, old.lb + full
    return t


def _owned(g, p, c, distrib, darg, what):
    """The indices of one dimension of size g that process coordinate c of p owns."""
    if distrib == _C["DISTRIBUTE_NONE"]:
        if p != 1:
            raise InvalidUsageError(f"{what}: a DISTRIBUTE_NONE dimension needs 1 process, not {p}",
                                    error_class=ERR_ARG)
        return np.arange(g)
    if distrib == _C["DISTRIBUTE_BLOCK"]:
        b = -(-g // p) if darg == _C["DISTRIBUTE_DFLT_DARG"] else darg
        if b * p < g:
            raise InvalidUsageError(f"{what}: blocks of {b} on {p} processes do not cover {g} elements",
                                    error_class=ERR_ARG)
        return np.arange(c * b, min(g, (c + 1) * b))
    if distrib == _C["DISTRIBUTE_CYCLIC"]:
        b = 1 if darg == _C["DISTRIBUTE_DFLT_DARG"] else darg
        starts = np.arange(c * b, g, p * b)
        return np.concatenate([np.arange(s, min(s + b, g)) for s in starts]) if starts.size else np.arange(0)
    raise InvalidUsageError(f"{what}: distribution {distrib} is not DISTRIBUTE_BLOCK, CYCLIC or NONE",
                            error_class=ERR_ARG)


def darray(T, old, size, rank, gsizes, distribs, dargs, psizes, order):
    """Process rank's part of a global array of gsizes distributed over a psizes process grid
    (row-major ranks): its elements, in the local array's order (C or Fortran), at their places in
    the global array; the extent is the global array's."""
    what = "Create_darray"
    gsizes = _ints(gsizes, what, "gsizes")
    n = len(gsizes)
    distribs, dargs = _ints(distribs, what, "distribs", n), _ints(dargs, what, "dargs", n)
    psizes = _ints(psizes, what, "psizes", n)
    if int(np.prod(psizes)) != size or not 0 <= rank < size:
        raise InvalidUsageError(f"{what}: a grid of {psizes} processes does not hold rank {rank} of {size}",
                                error_class=ERR_ARG)
    if order not in (_C["ORDER_C"], _C["ORDER_FORTRAN"]):
        raise InvalidUsageError(f"{what}: order {order} is neither ORDER_C nor ORDER_FORTRAN", error_class=ERR_ARG)
    coords, r = [], rank
    for p in reversed(psizes):
        coords.append(r % p)
        r //= p
    coords.reverse()
    owned = [_owned(g, p, c, d, a, what) for g, p, c, d, a in zip(gsizes, psizes, coords, distribs, dargs)]
    dims = list(range(n)) if order == _C["ORDER_C"] else list(range(n - 1, -1, -1))
    strides, step = [0] * n, 1
    for k in reversed(dims):  # element strides of the global array, in old extents
        strides[k] = step
        step *= gsizes[k]
    grids = np.meshgrid(*[owned[k] for k in dims], indexing="ij")
    index = sum(g.reshape(-1) * strides[k] for g, k in zip(grids, dims)) if n else np.zeros(1, np.int64)
    offsets = np.asarray(index, np.int64) * old.extent
    contents = ([size, rank, n, *gsizes, *distribs, *dargs, *psizes, order], [], [], [old])
    full = int(np.prod(gsizes)) * old.extent
    bounds = (old.lb, old.lb + full, *_bounds(old, offsets)[2:]) if offsets.size else (0, 0, 0, 0)
    t = new_type(T, old, offsets, _C["COMBINER_DARRAY"], contents, bounds)
    t.lb, t.ub = old.lb, old.lb + full
    return t


def resized(T, old, lb, extent):
    lb, extent = int(lb), int(extent)
    t = T.derived(old.size, lb, lb + extent, old.true_lb, old.true_ub, _C["COMBINER_RESIZED"],
                  ([], [lb, extent], [], [old]), old.typemap)
    return t


def f90(T, named, combiner, params):
    """Create_f90_integer/real/complex: a type that is the named type under another combiner."""
    t = T.derived(named.size, named.lb, named.ub, named.true_lb, named.true_ub, combiner,
                  (list(params), [], [], []), named.typemap)
    t.predefined, t.np, t.code = True, named.np, named.code
    t.typechar, t.typestr, t.name, t.base = named.typechar, named.typestr, named.name, named
    t.align = named.align
    return t


def decode(t, handle):
    """(oldtype or types, combiner name, parameters) of the derived type t as mpi4py's
    Datatype.decode() gives them; handle(t) is a Datatype of a type record (of None: DATATYPE_NULL)."""
    i, a, _, d = t.contents
    types = [handle(x) for x in d]
    old = types[0] if len(types) == 1 else handle(None)
    name = COMBINER[t.combiner]
    if name in ("DUP",):
        params = {}
    elif name == "CONTIGUOUS":
        params = {"count": i[0]}
    elif name == "VECTOR":
        params = {"count": i[0], "blocklength": i[1], "stride": i[2]}
    elif name == "HVECTOR":
        params = {"count": i[0], "blocklength": i[1], "stride": a[0]}
    elif name == "INDEXED":
        n = i[0]
        params = {"blocklengths": i[1:n + 1], "displacements": i[n + 1:2 * n + 1]}
    elif name == "HINDEXED":
        params = {"blocklengths": i[1:i[0] + 1], "displacements": list(a)}
    elif name == "INDEXED_BLOCK":
        params = {"blocklength": i[1], "displacements": i[2:]}
    elif name == "HINDEXED_BLOCK":
        params = {"blocklength": i[1], "displacements": list(a)}
    elif name == "STRUCT":
        params = {"blocklengths": i[1:i[0] + 1], "displacements": list(a), "datatypes": types}
    elif name == "SUBARRAY":
        n = i[0]
        params = {"sizes": i[1:n + 1], "subsizes": i[n + 1:2 * n + 1], "starts": i[2 * n + 1:3 * n + 1],
                  "order": i[3 * n + 1]}
    elif name == "DARRAY":
        n = i[2]
        params = {"size": i[0], "rank": i[1], "gsizes": i[3:n + 3], "distribs": i[n + 3:2 * n + 3],
                  "dargs": i[2 * n + 3:3 * n + 3], "psizes": i[3 * n + 3:4 * n + 3], "order": i[4 * n + 3]}
    elif name == "RESIZED":
        params = {"lb": a[0], "extent": a[1]}
    elif name == "F90_INTEGER":
        params = {"r": i[0]}
    elif name in ("F90_REAL", "F90_COMPLEX"):
        params = {"p": i[0], "r": i[1]}
    else:
        params = {}
    return old, name, params
