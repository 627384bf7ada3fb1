"""Algorithm choice by a cost model: time = alpha * steps(p) + nbytes * beta * volume(p).

The model is data, two tables a tuner can edit:

* LINKS: per transport, alpha (seconds per message step) and beta (seconds per byte).
* TABLE: per (collective, algorithm), steps(p) (message start-ups on the critical path) and
  volume(p) (bytes on the critical path, as a multiple of nbytes), as expressions of
    p     ranks            lg    ceil(log2 p)
    q     2**floor(log2 p) fold  1 if p is not a power of two, else 0
  Native algorithms (direct, and the GPU rows one-shot, two-shot, staged and registered: not
  schedules, run by their own engines) are offered only when the caller says they are available,
  and may carry their own alpha/beta.

`nbytes` is NCCL's "size" of the operation: the vector for allreduce, bcast and reduce, the
whole size * count buffer for allgather, reduce_scatter_block, gather, scatter and alltoall::

    select("bcast", nbytes=64, size=16, transport="tcp")             # "tree"
    select("bcast", nbytes=256 << 20, size=16, transport="tcp")      # "ring"
    select("allreduce", 256 << 20, 6, "tcp")                        # "ring" (rhd's fold costs)
    select("allreduce", 4096, 4, "shm", available={"direct"})       # "direct"

GPUCOLL_ALGO forces an algorithm where it exists for the collective (and transport); elsewhere
the model decides and a TUNING warning says so, once per collective.
"""
import math
import operator
from dataclasses import dataclass
from functools import lru_cache

from ..base import config, log
from ..base.errors import InvalidUsageError
from .registry import canonical


@dataclass
class Link:
    """Figures of one transport: alpha seconds per message, beta seconds per byte;
    `schedules`: whether the schedule executor runs over it (else only native rows apply)."""
    alpha: float
    beta: float
    schedules: bool = True


LINKS = {
    "shm": Link(alpha=1e-6, beta=1 / 8e9),          # shared-memory rings between ranks of a host
    "tcp": Link(alpha=20e-6, beta=1 / 1.2e9),       # sockets between hosts (10 GbE class)
    "ofi": Link(alpha=3e-6, beta=1 / 12e9),         # RDMA through libfabric (verbs, efa, cxi: 100 Gb/s class)
    "nvlink": Link(alpha=3e-6, beta=1 / 100e9, schedules=False),  # GPU peers through CUDA IPC
}


@dataclass(frozen=True)
class Entry:
    """One row of the cost table."""
    collective: str
    algorithm: str
    steps: str                      # expression of p, lg, q, fold
    volume: str                     # same; multiplies nbytes
    transports: tuple = ()          # empty: any transport
    native: bool = False            # not a schedule: needs the caller's `available`
    alpha: float = None             # overrides the link's figures (native engines)
    beta: float = None


# Intra-host collectives on one shared segment (gc_direct.h): one post per rank, each rank
# reads what it needs straight from the segment. Measured on a 2-core host (2026-11-29),
# 2 ranks, float32 allreduce: 0.7 us at 4 KiB, 51 us at 1 MiB (ring over shared-memory
# channels: 22 us and 187 us), so per byte of the call it moves at about 20 GB/s.
_MEMORY = dict(alpha=0.5e-6, beta=1 / 20e9)

# GPU collectives of the ranks of one host (gpucoll/engines/gpu/engine.py): CUDA IPC kernels over
# NVLink (or PCIe P2P). A step is one flag exchange between all ranks; the volume counts the bytes
# each rank moves over its links. "staged" algorithms go through the communicator's IPC staging
# slots (one-shot and two-shot for allreduce), "registered" ones between the callers' buffers,
# which are registered with CUDA IPC on each call (a host exchange of handles: a larger alpha).
# Figures fitted to 2 x H200 (NV18), 2 ranks, float32, eager launches, 2026-11-29: one-shot
# 6.8 us at 8 B; staged two-shot 14.1 us at 512 KiB, 18.0 us at 2 MiB, 36 us at 8 MiB; registered
# 342 GB/s busbw at 512 MiB; registered's alpha is set so that the staged-to-registered crossover
# stays at 64 MiB. One-shot moves its bytes through the same slots and links as two-shot, so it has
# two-shot's bandwidth: on 2 ranks both put the same bytes on each link, one-shot with one
# synchronisation instead of two, so it runs as long as the message fits a staging slot; on 4
# ranks to about 1 MiB, on 8 to about 320 KiB (one-shot pushes to p-1 peers). Those medium-size
# rows follow from the model, not yet from a two-GPU measurement (make calibrate-gpu fits them),
# and 4 and 8 ranks from the steps and volume expressions until they are measured there.
_GPU_ONESHOT = dict(alpha=6.8e-6, beta=1 / 330e9)
_GPU_STAGED = dict(alpha=6.0e-6, beta=1 / 330e9)
_GPU_REGISTERED = dict(alpha=9.6e-6, beta=1 / 342e9)
_NV = ("nvlink",)

GPU_TABLE = (
    Entry("allreduce", "one-shot", "1", "p-1", _NV, True, **_GPU_ONESHOT),
    Entry("allreduce", "two-shot", "2", "2*(p-1)/p", _NV, True, **_GPU_STAGED),
    Entry("allreduce", "registered", "2", "2*(p-1)/p", _NV, True, **_GPU_REGISTERED),
    Entry("reduce_scatter_block", "staged", "1", "(p-1)/p", _NV, True, **_GPU_STAGED),
    Entry("reduce_scatter_block", "registered", "2", "(p-1)/p", _NV, True, **_GPU_REGISTERED),
    Entry("allgather", "staged", "1", "(p-1)/p", _NV, True, **_GPU_STAGED),
    Entry("allgather", "registered", "2", "(p-1)/p", _NV, True, **_GPU_REGISTERED),
    Entry("bcast", "staged", "1", "1", _NV, True, **_GPU_STAGED),
    Entry("bcast", "registered", "2", "1", _NV, True, **_GPU_REGISTERED),
    Entry("alltoall", "staged", "1", "(p-1)/p", _NV, True, **_GPU_STAGED),
    Entry("alltoall", "registered", "2", "(p-1)/p", _NV, True, **_GPU_REGISTERED),
    Entry("reduce", "staged", "1", "1", _NV, True, **_GPU_STAGED),
    Entry("gather", "staged", "1", "(p-1)/p", _NV, True, **_GPU_STAGED),
    Entry("scatter", "staged", "1", "(p-1)/p", _NV, True, **_GPU_STAGED),
)

TABLE = (
    Entry("allreduce", "ring", "2*(p-1)", "2*(p-1)/p"),
    Entry("allreduce", "rhd", "2*lg", "2*(q-1)/q + 2*fold"),
    # each round's combine runs after its receive, not streamed with it: half a byte more per byte
    Entry("allreduce", "rd", "lg + fold", "1.5*(lg + fold)"),
    Entry("allreduce", "tree", "2*lg", "2*lg"),
    Entry("allreduce", "direct", "1", "1", ("shm",), True, **_MEMORY),
    Entry("reduce_scatter_block", "ring", "p-1", "(p-1)/p"),
    Entry("reduce_scatter_block", "rhd", "lg + fold", "(q-1)/q + fold*(1 + 1/p)"),
    Entry("reduce_scatter_block", "direct", "1", "1", ("shm",), True, **_MEMORY),
    Entry("allgather", "ring", "p-1", "(p-1)/p"),
    Entry("allgather", "rhd", "lg", "(p-1)/p"),
    Entry("allgather", "direct", "1", "1", ("shm",), True, **_MEMORY),
    Entry("bcast", "tree", "lg", "lg"),
    Entry("bcast", "ring", "lg + p-1", "2*(p-1)/p"),
    Entry("bcast", "direct", "1", "1", ("shm",), True, **_MEMORY),
    Entry("reduce", "tree", "lg", "lg"),
    Entry("reduce", "ring", "2*(p-1)", "2*(p-1)/p"),
    Entry("reduce", "direct", "1", "1", ("shm",), True, **_MEMORY),
    Entry("gather", "tree", "lg", "(p-1)/p"),
    Entry("gather", "direct", "1", "1", ("shm",), True, **_MEMORY),
    Entry("gather", "linear", "p-1", "(p-1)/p"),
    Entry("scatter", "tree", "lg", "(p-1)/p"),
    Entry("scatter", "direct", "1", "1", ("shm",), True, **_MEMORY),
    Entry("scatter", "linear", "p-1", "(p-1)/p"),
    Entry("alltoall", "pairwise", "p-1", "(p-1)/p"),
    Entry("alltoall", "direct", "1", "1", ("shm",), True, **_MEMORY),
    Entry("barrier", "dissemination", "lg", "0"),
    Entry("barrier", "direct", "1", "0", ("shm",), True, **_MEMORY),
) + GPU_TABLE

NATIVE = frozenset(e.algorithm for e in TABLE if e.native)


@lru_cache(maxsize=None)
def _compiled(expr):
    return compile(expr, f"<cost {expr}>", "eval")


def _terms(p):
    lg = (p - 1).bit_length()
    q = 1 << (p.bit_length() - 1)
    return {"p": p, "lg": lg, "q": q, "fold": int(q != p)}


def _evaluate(expr, terms):
    return float(eval(_compiled(expr), {"__builtins__": {}}, terms))  # noqa: S307 - our own table


def _entries(collective):
    collective = canonical(collective)
    rows = [e for e in TABLE if e.collective == collective]
    if not rows:
        known = sorted({e.collective for e in TABLE})
        raise InvalidUsageError(f"unknown collective {collective!r}; known: {', '.join(known)}")
    return rows


def _link(transport):
    try:
        return LINKS[transport]
    except (KeyError, TypeError):
        raise InvalidUsageError(f"unknown transport {transport!r}; known: {', '.join(LINKS)}") from None


def _check(nbytes, size):
    """(nbytes, size) as ints, or InvalidUsageError."""
    out = []
    for name, value in (("nbytes", nbytes), ("size", size)):
        try:
            if isinstance(value, bool):
                raise TypeError
            out.append(operator.index(value))
        except TypeError:
            raise InvalidUsageError(f"{name} must be an integer, got {value!r}") from None
    if out[0] < 0:
        raise InvalidUsageError(f"nbytes must be >= 0, got {nbytes}")
    if out[1] < 1:
        raise InvalidUsageError(f"size must be >= 1, got {size}")
    return out


def _entry_cost(entry, nbytes, size, link):
    terms = _terms(size)
    alpha = link.alpha if entry.alpha is None else entry.alpha
    beta = link.beta if entry.beta is None else entry.beta
    return alpha * _evaluate(entry.steps, terms) + nbytes * beta * _evaluate(entry.volume, terms)


def cost(collective, algorithm, nbytes, size, transport):
    """Modelled seconds of `algorithm` for one call; raises InvalidUsageError if it does not exist."""
    nbytes, size = _check(nbytes, size)
    link = _link(transport)
    named = [e for e in _entries(collective) if e.algorithm == algorithm]
    for entry in named:
        if not entry.transports or transport in entry.transports:
            return _entry_cost(entry, nbytes, size, link)
    if named:
        over = sorted({t for e in named for t in e.transports})
        raise InvalidUsageError(f"{collective} {algorithm} runs over {', '.join(over)} only, not {transport}")
    raise InvalidUsageError(f"{collective} has no algorithm {algorithm!r}; choose from "
                            f"{', '.join(e.algorithm for e in _entries(collective))}")


def candidates(collective, transport, available=()):
    """Algorithms the model may pick for `collective` over `transport`, in table order."""
    names = [e.algorithm for e in _entries(collective) if _offered(e, transport, _link(transport), available)]
    return list(dict.fromkeys(names))


def _offered(entry, transport, link, available):
    if entry.transports and transport not in entry.transports:
        return False
    return entry.algorithm in available if entry.native else link.schedules


@lru_cache(maxsize=4096)
def _best(collective, nbytes, size, transport, available):
    link = _link(transport)
    best, best_cost = None, math.inf
    for entry in _entries(collective):
        if not _offered(entry, transport, link, available):
            continue
        c = _entry_cost(entry, nbytes, size, link)
        if c < best_cost:       # strict: ties go to the earlier row
            best, best_cost = entry.algorithm, c
    return best


_warned = set()


def select(collective, nbytes, size, transport, forced=None, available=()):
    """The algorithm for one call: `forced` (default: GPUCOLL_ALGO) when it applies, else the
    cheapest by the cost table. `available` names the native algorithms ("direct", "one-shot",
    "registered", ...) the caller can run for this call; schedule algorithms are always available."""
    nbytes, size = _check(nbytes, size)
    available = frozenset(available or ())
    if forced is None:
        forced = config.ALGO.get()
    if forced != "auto":
        allowed = candidates(collective, transport, available)
        if forced in allowed:
            return forced
        known = set(config.ALGO.choices) | {e.algorithm for e in TABLE}
        if forced not in known:
            raise InvalidUsageError(f"unknown algorithm {forced!r}; known: {', '.join(sorted(known))}")
        key = (collective, forced, transport)
        if key not in _warned:
            _warned.add(key)
            log.warn("TUNING", "GPUCOLL_ALGO=%s does not apply to %s over %s (there: %s); "
                     "using the cost model", forced, collective, transport, ", ".join(allowed))
    best = _best(collective, nbytes, size, transport, available)
    if best is None:
        raise InvalidUsageError(f"no {collective} algorithm runs over {transport}"
                                + (f" among {', '.join(sorted(available))}" if available else ""))
    return best


def tune(transport, alpha=None, beta=None):
    """Change (or add) a transport's figures, e.g. from measurements; forgets cached choices."""
    link = LINKS.get(transport)
    if link is None:
        if alpha is None or beta is None:
            raise InvalidUsageError(f"a new transport {transport!r} needs both alpha and beta")
        LINKS[transport] = Link(alpha, beta)
    else:
        if alpha is not None:
            link.alpha = float(alpha)
        if beta is not None:
            link.beta = float(beta)
    _best.cache_clear()


def describe():
    """The model as lines of text, for `gpucoll info`: the link figures, then the table."""
    lines = ["transport      alpha(us)   bandwidth(GB/s)"]
    for name, link in LINKS.items():
        only = "" if link.schedules else "   (native rows only)"
        lines.append(f"{name:<14} {link.alpha * 1e6:9.2f}   {1 / link.beta / 1e9:15.2f}{only}")
    lines.append("")
    lines.append(f"{'collective':<22}{'algorithm':<15}{'steps(p)':<22}{'volume(p) x nbytes':<26}where")
    for e in TABLE:
        where = ",".join(e.transports) if e.transports else "any"
        if e.native:
            where += " (native, when available)"
        if e.alpha is not None:
            where += f" alpha={e.alpha * 1e6:g}us bw={1 / e.beta / 1e9:g}GB/s"
        lines.append(f"{e.collective:<22}{e.algorithm:<15}{e.steps:<22}{e.volume:<26}{where}")
    lines.append("")
    lines.extend(gpu_crossovers())
    return lines


def crossovers(collective, size, transport, available, top=1 << 32):
    """[(from_bytes, algorithm)]: where the model's choice changes, from 0 to `top` bytes
    (found by bisection between powers of two, so exact to the byte)."""
    def best(nbytes):
        return _best(canonical(collective), nbytes, size, transport, frozenset(available))
    points, nbytes = [(0, best(0))], 1
    while nbytes <= top:
        lo, hi = nbytes // 2, nbytes
        if best(hi) != points[-1][1]:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if best(mid) == points[-1][1] else (lo, mid)
            points.append((hi, best(hi)))
        nbytes *= 2
    return points


def gpu_crossovers(sizes=(2, 4, 8)):
    """Lines of the GPU choices by message size for a few rank counts (every algorithm available)."""
    lines = ["GPU choice by size (nvlink rows; staged up to GPUCOLL_GPU_STAGE_MAX, one-shot up to a slot)"]
    for coll in dict.fromkeys(e.collective for e in GPU_TABLE):
        algos = [e.algorithm for e in GPU_TABLE if e.collective == coll]
        for p in sizes:
            steps = crossovers(coll, p, "nvlink", algos)
            text = ", ".join(f"{_human(b)}+ {a}" for b, a in steps)
            lines.append(f"  {coll:<22}{p} ranks: {text}")
    return lines


def _human(nbytes):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if nbytes >= 1 << shift:
            value = nbytes / (1 << shift)
            return f"{value:.0f}{unit}" if value >= 100 or value == int(value) else f"{value:.1f}{unit}"
    return f"{nbytes}"
