"""Algorithm choice by a cost model: time = alpha * steps(p) + nbytes * beta * volume(p).

The model is data, two tables a tuner can edit:

* LINKS: per transport, alpha (seconds per message step) and beta (seconds per byte).
* TABLE: per (collective, algorithm), steps(p) (message start-ups on the critical path) and
  volume(p) (bytes on the critical path, as a multiple of nbytes), as expressions of
    p     ranks            lg    ceil(log2 p)
    q     2**floor(log2 p) fold  1 if p is not a power of two, else 0
  Native algorithms (direct, one-shot, two-shot: not schedules, run by their own engines) are
  offered only when the caller says they are available, and may carry their own alpha/beta.

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

from .. import config, log
from ..errors import InvalidUsageError
from .registry import canonical


@dataclass
class Link:
    """Figures of one transport: alpha seconds per message, beta seconds per byte."""
    alpha: float
    beta: float


LINKS = {
    "shm": Link(alpha=1e-6, beta=1 / 8e9),          # shared-memory rings between ranks of a host
    "tcp": Link(alpha=20e-6, beta=1 / 1.2e9),       # sockets between hosts (10 GbE class)
    "ib": Link(alpha=3e-6, beta=1 / 12e9),          # RDMA verbs
    "nvlink": Link(alpha=3e-6, beta=1 / 100e9),     # GPU peers through CUDA IPC
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

TABLE = (
    Entry("allreduce", "ring", "2*(p-1)", "2*(p-1)/p"),
    Entry("allreduce", "rhd", "2*lg", "2*(q-1)/q + 2*fold"),
    Entry("allreduce", "tree", "2*lg", "2*lg"),
    Entry("allreduce", "direct", "1", "1", ("shm",), True, **_MEMORY),
    Entry("allreduce", "one-shot", "1", "p-1", ("nvlink",), True),
    Entry("allreduce", "two-shot", "2", "2*(p-1)/p", ("nvlink",), True),
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
)

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
    for entry in _entries(collective):
        if entry.algorithm == algorithm:
            if entry.transports and transport not in entry.transports:
                raise InvalidUsageError(f"{collective} {algorithm} runs over {', '.join(entry.transports)} "
                                        f"only, not {transport}")
            return _entry_cost(entry, nbytes, size, link)
    raise InvalidUsageError(f"{collective} has no algorithm {algorithm!r}; choose from "
                            f"{', '.join(e.algorithm for e in _entries(collective))}")


def candidates(collective, transport, available=()):
    """Algorithms the model may pick for `collective` over `transport`, in table order."""
    _link(transport)
    return [e.algorithm for e in _entries(collective)
            if (not e.transports or transport in e.transports)
            and (not e.native or e.algorithm in available)]


@lru_cache(maxsize=4096)
def _best(collective, nbytes, size, transport, available):
    link = _link(transport)
    best, best_cost = None, math.inf
    for entry in _entries(collective):
        if entry.transports and transport not in entry.transports:
            continue
        if entry.native and entry.algorithm not in available:
            continue
        c = _entry_cost(entry, nbytes, size, link)
        if c < best_cost:       # strict: ties go to the earlier row
            best, best_cost = entry.algorithm, c
    return best


_warned = set()


def select(collective, nbytes, size, transport, forced=None, available=()):
    """The algorithm for one call: `forced` (default: GPUCOLL_ALGO) when it applies, else the
    cheapest by the cost table. `available` names the native algorithms ("direct", "one-shot",
    "two-shot") the caller can run for this call; schedule algorithms are always available."""
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
    return _best(collective, nbytes, size, transport, available)


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
        lines.append(f"{name:<14} {link.alpha * 1e6:9.2f}   {1 / link.beta / 1e9:15.2f}")
    lines.append("")
    lines.append(f"{'collective':<22}{'algorithm':<15}{'steps(p)':<22}{'volume(p) x nbytes':<26}where")
    for e in TABLE:
        where = ",".join(e.transports) if e.transports else "any"
        if e.native:
            where += " (native, when available)"
        if e.alpha is not None:
            where += f" alpha={e.alpha * 1e6:g}us bw={1 / e.beta / 1e9:g}GB/s"
        lines.append(f"{e.collective:<22}{e.algorithm:<15}{e.steps:<22}{e.volume:<26}{where}")
    return lines
