"""Direct shared-memory collectives, run by real processes (1 to 4 ranks on this host).

Each rank builds every rank's input from a seed, so it can compute the expected result with
NumPy itself (reducing in rank order, one rounding per step, exactly as the native code does)
and compare bit for bit; float results are also hashed and compared across ranks.
"""
import glob
import hashlib
import multiprocessing
import os
import signal
import time
import uuid
import zlib

import numpy as np
import pytest

from gpucoll.base.errors import GpucollError, LostPeerError, TimeoutError
from gpucoll.transports import shm_direct
from gpucoll.transports.shm_segment import JobSegments

CTX = multiprocessing.get_context("spawn")
SMALL_SLOT = 64 << 10  # forces rounds at modest counts
SECRET = b"test-direct-secret"

# gc_dtype / gc_op codes (cython_src/include/gc_types.h)
DT = {"int32": 4, "int64": 6, "float16": 8, "float32": 10, "float64": 11, "uint8": 1}
SUM, PROD, MAX, MIN, AVG, BAND, BOR, BXOR = range(8)
OPS_FOR = {
    "int32": (SUM, PROD, MAX, MIN, AVG, BAND, BOR, BXOR),
    "int64": (SUM, MAX, BXOR),
    "float32": (SUM, PROD, MAX, MIN, AVG),
    "float64": (SUM, MIN),
    "float16": (SUM, MAX, AVG),
}
NP_OP = {SUM: np.add, PROD: np.multiply, MAX: np.maximum, MIN: np.minimum, AVG: np.add,
         BAND: np.bitwise_and, BOR: np.bitwise_or, BXOR: np.bitwise_xor}


# ---- running ranks ---------------------------------------------------------------------------

def _entry(fn, job, rank, nranks, slot, queue, args, attached):
    try:
        group = shm_direct.create_or_attach(JobSegments(job, SECRET), "w", rank, nranks, timeout=30,
                                            slot_bytes=slot)
        # Every rank has attached before any starts: ranks that fail early (a mismatch found
        # between two of them) must not end before a slow-starting one has attached, which
        # would then wait for a creator that is gone and leave the segment's name behind.
        attached.wait(30)
        result = fn(group, *args)
        queue.put((rank, "ok", result))
    except Exception as exc:  # report to the parent, which asserts
        queue.put((rank, "error", (type(exc).__name__, str(exc), tuple(getattr(exc, "ranks", ())))))


def run_ranks(nranks, fn, *args, slot=SMALL_SLOT, expect=None, timeout=60):
    """Run fn(group, *args) on nranks processes; {rank: ("ok"|"error", payload)}."""
    job = uuid.uuid4().hex[:12]
    queue = CTX.Queue()
    attached = CTX.Barrier(nranks)
    procs = [CTX.Process(target=_entry, args=(fn, job, r, nranks, slot, queue, args, attached))
             for r in range(nranks)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < (nranks if expect is None else expect):
            rank, status, payload = queue.get(timeout=max(0.1, deadline - time.monotonic()))
            results[rank] = (status, payload)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    assert not glob.glob(f"/dev/shm/{JobSegments(job, SECRET).prefix}*"), "the segment name was left behind"
    return results


def all_ok(results):
    for rank, (status, payload) in sorted(results.items()):
        assert status == "ok", f"rank {rank}: {payload}"
    return {rank: payload for rank, (_, payload) in results.items()}


# ---- data and references ---------------------------------------------------------------------

def data(case, rank, n, dtype):
    rng = np.random.default_rng(zlib.crc32(f"{case}/{rank}".encode()))
    if dtype in ("float16", "float32", "float64"):
        return rng.standard_normal(n).astype(dtype)
    return rng.integers(-1000, 1000, n).astype(dtype)


def reference(inputs, op, nranks):
    acc = inputs[0].copy()
    for x in inputs[1:]:
        acc = NP_OP[op](acc, x)
    if op == AVG:
        acc = acc // nranks if acc.dtype.kind in "iu" else acc / acc.dtype.type(nranks)
    return acc


def addr(a):
    return a.__array_interface__["data"][0]


class Checker:
    def __init__(self, group):
        self.g, self.r, self.n = group, group.rank, group.nranks
        self.failures, self.digests = [], {}

    def expect(self, name, got, want, digest=False):
        if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(
                got.view(np.uint8), want.view(np.uint8)):
            bad = np.flatnonzero(got.view(want.dtype) != want)[:3] if got.shape == want.shape else []
            self.failures.append(f"rank {self.r} {name}: first bad indices {list(bad)}")
        if digest:
            self.digests[name] = hashlib.sha1(got.tobytes()).hexdigest()


def conformance(group, counts, oneshot_variants):
    c = Checker(group)
    g, r, n, T = c.g, c.r, c.n, 30.0
    for oneshot_max in oneshot_variants:
        if oneshot_max is not None:
            g.oneshot_max = oneshot_max
        for dtype, ops in OPS_FOR.items():
            for op in ops:
                for count in counts:
                    for inplace in (False, True):
                        case = f"ar/{dtype}/{op}/{count}/{inplace}/{oneshot_max}"
                        xs = [data(case, k, count, dtype) for k in range(n)]
                        want = reference(xs, op, n)
                        send = xs[r].copy()
                        recv = send if inplace else np.full(count, 77, dtype)
                        g.allreduce(addr(send), addr(recv), count, DT[dtype], op, T)
                        c.expect(case, recv, want, digest=True)

    for dtype in ("int32", "float16", "float64"):
        for count in counts:
            for root in range(n):
                for inplace in (False, True):
                    tag = f"{dtype}/{count}/{root}/{inplace}"
                    xs = [data("x" + tag, k, count, dtype) for k in range(n)]
                    blocks = [data("b" + tag, k, count * n, dtype) for k in range(n)]

                    buf = xs[r].copy()  # bcast
                    g.bcast(addr(buf), count, buf.itemsize, root, T)
                    c.expect("bcast/" + tag, buf, xs[root])

                    op = SUM if dtype != "int32" else BXOR  # reduce
                    send = xs[r].copy()
                    recv = send if inplace else np.zeros(count, dtype)
                    where = addr(recv) if r == root or inplace else 0  # unused off the root
                    g.reduce(addr(send), where, count, DT[dtype], op, root, T)
                    if r == root:
                        c.expect("reduce/" + tag, recv, reference(xs, op, n))

                    # gather: in place at the root means its block already sits in recv
                    recv = np.zeros(count * n, dtype)
                    send = xs[r].copy()
                    if inplace and r == root:
                        recv[r * count:(r + 1) * count] = xs[r]
                        send = recv
                    where = addr(recv) if r == root else 0
                    g.gather(addr(send), where, count, recv.itemsize, root, T)
                    if r == root:
                        c.expect("gather/" + tag, recv, np.concatenate(xs))

                    # scatter: in place at the root leaves its block in the send buffer
                    send = blocks[root].copy() if r == root else np.zeros(0, dtype)
                    recv = send if (inplace and r == root) else np.zeros(count, dtype)
                    g.scatter(addr(send), addr(recv), count, np.dtype(dtype).itemsize, root, T)
                    mine = recv[r * count:(r + 1) * count] if recv is send else recv
                    c.expect("scatter/" + tag, mine, blocks[root][r * count:(r + 1) * count])

            for inplace in (False, True):
                tag = f"{dtype}/{count}/{inplace}"
                xs = [data("x" + tag, k, count, dtype) for k in range(n)]
                blocks = [data("b" + tag, k, count * n, dtype) for k in range(n)]

                recv = np.zeros(count * n, dtype)  # allgather
                send = xs[r].copy()
                if inplace:
                    recv[r * count:(r + 1) * count] = xs[r]
                    send = recv
                g.allgather(addr(send), addr(recv), count, recv.itemsize, T)
                c.expect("allgather/" + tag, recv, np.concatenate(xs))

                send = blocks[r].copy()  # alltoall
                recv = send if inplace else np.zeros(count * n, dtype)
                g.alltoall(addr(send), addr(recv), count, send.itemsize, T)
                want = np.concatenate([blocks[k][r * count:(r + 1) * count] for k in range(n)])
                c.expect("alltoall/" + tag, recv, want)

                for op in (SUM, AVG) if dtype != "int32" else (SUM, MIN, AVG):
                    send = blocks[r].copy()  # reduce_scatter_block
                    recv = send if inplace else np.zeros(count, dtype)
                    g.reduce_scatter_block(addr(send), addr(recv), count, DT[dtype], op, T)
                    want = reference(blocks, op, n)[r * count:(r + 1) * count]
                    c.expect(f"reduce_scatter/{op}/" + tag, recv[:count], want)
    g.barrier(T)
    return c.failures, c.digests


def check_conformance(nranks, counts, oneshot_variants=(None, 0), slot=SMALL_SLOT):
    out = all_ok(run_ranks(nranks, conformance, counts, oneshot_variants, slot=slot))
    for rank, (failures, _) in out.items():
        assert not failures, failures[:10]
    digests = [out[k][1] for k in range(nranks)]
    for name in digests[0]:
        assert len({d[name] for d in digests}) == 1, f"{name}: ranks disagree bitwise"


# ---- tests -----------------------------------------------------------------------------------

@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_every_collective(nranks):
    # 40001 float32/int32 elements cross a 64 KiB slot several times; 1000 and 7 are one-shot.
    check_conformance(nranks, counts=(0, 1, 7, 1000, 40001))


def _big_allreduce(group):
    base = np.arange(3_000_000, dtype=np.float32)
    x = base * (group.rank + 1)
    y = np.empty_like(x)
    group.allreduce(addr(x), addr(y), x.size, DT["float32"], SUM, 30.0)
    group.allreduce(addr(x), addr(x), x.size, DT["float32"], MAX, 30.0)
    return bool(np.array_equal(y, base * 3) and np.array_equal(x, base * 2))


def test_default_slot_large_allreduce():
    # 12 MB through the default 4 MiB slots: many two-shot rounds, both slot parities
    assert all(all_ok(run_ranks(2, _big_allreduce, slot=4 << 20)).values())


def _failure(exc, start):
    return type(exc).__name__, str(exc), tuple(exc.ranks), time.monotonic() - start


def _die_midway(group):
    x = np.ones(1000, np.float32)
    for _ in range(3):
        group.allreduce(addr(x), addr(x), x.size, DT["float32"], SUM, 30.0)
    if group.rank == 2:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        group.allreduce(addr(x), addr(x), x.size, DT["float32"], SUM, 30.0)
    except LostPeerError as exc:
        return _failure(exc, start)
    return None


def test_killed_rank_is_named():
    results = run_ranks(3, _die_midway, expect=2)
    for rank in (0, 1):
        name, message, ranks, elapsed = all_ok({rank: results[rank]})[rank]
        assert name == "LostPeerError" and ranks == (2,), message
        assert "rank(s) 2 is gone" in message
        assert elapsed < 5.0


def _late_rank(group):
    x = np.ones(10, np.int32)
    group.barrier(10.0)
    if group.rank == 1:
        time.sleep(3.0)  # alive (not lost) but absent, well past the others' deadline
        return "late"
    start = time.monotonic()
    try:
        group.allreduce(addr(x), addr(x), x.size, DT["int32"], SUM, 0.5)
    except TimeoutError as exc:
        failure = _failure(exc, start)
    try:  # after a failure the group is unusable, and says so
        group.barrier(0.5)
    except GpucollError as exc:
        return failure, type(exc).__name__
    return failure, None


def test_timeout_names_missing_rank():
    out = all_ok(run_ranks(3, _late_rank))
    assert out[1] == "late"
    for rank in (0, 2):
        (name, message, ranks, elapsed), after = out[rank]
        assert name == "TimeoutError" and ranks == (1,), message
        assert "waiting for rank(s) 1" in message
        assert 0.5 <= elapsed < 2.5
        assert after == "GpucollError"


def _mismatched(group, case):
    """One mismatched call (case), then a barrier; what each rank got, and where."""
    me = group.rank
    group.oneshot_max = 64  # 80 B is two-shot, 40 B one-shot
    x = np.full(20, me + 1, np.float32)
    calls = {
        "count": lambda: group.allreduce(addr(x), addr(x), 20 if me == 1 else 10, DT["float32"], SUM, 5.0),
        "dtype": lambda: group.allreduce(addr(x), addr(x), 10, DT["int32"] if me == 1 else DT["float32"],
                                         SUM, 5.0),
        "op": lambda: group.allreduce(addr(x), addr(x), 10, DT["float32"], MAX if me == 1 else SUM, 5.0),
        # a two-shot reduction against a one-shot one: their first posts must not be read as data
        "rounds": lambda: group.allreduce(addr(x), addr(x), 20 if me == 1 else 3, DT["float32"], SUM, 5.0),
        "root": lambda: group.bcast(addr(x), 20, 4, 1 if me == 1 else 0, 5.0),
    }
    where = "call"
    try:
        calls[case]()
        where = "next"
        group.barrier(5.0)
        return "none", x.tolist()
    except GpucollError as exc:
        return type(exc).__name__, where, str(exc), tuple(exc.ranks)


@pytest.mark.parametrize("case", ["count", "dtype", "op", "rounds", "root"])
def test_mismatched_calls_raise_on_every_rank(case):
    out = all_ok(run_ranks(3, _mismatched, case, slot=4096 * 3))
    for rank, got in out.items():
        assert got[0] == "MismatchError", (rank, got)
        name, where, message, ranks = got
        assert "every rank must call collectives in the same order" in message, message
        # every rank compares rank 1's call in the call itself: its data (count, dtype, op,
        # rounds) or, for a rooted call, its announcement (roots: ranks 0 and 1 both take
        # themselves for the root and read from no one)
        odd = ((0, 2) if case == "root" else (0,)) if rank == 1 else (1,)  # rank 1 differs from both
        assert where == "call" and len(ranks) == 1 and ranks[0] in odd, (rank, got)
    if case == "count":
        assert "rank 1 called allreduce with 20 x float32 SUM, this rank with allreduce with 10 x float32 SUM" \
            in out[0][2]
    if case == "op":
        assert "10 x float32 MAX" in out[0][2] and "10 x float32 SUM" in out[1][2]
    if case == "root":
        assert "rank 1 called bcast with 80 B root 1, this rank with bcast with 80 B root 0" in out[0][2]
        assert f"rank {out[1][3][0]} called bcast with 80 B root 0, this rank with bcast with 80 B root 1" in out[1][2]
        assert "previous collective" not in out[2][2], out[2][2]


def _mixed_loop(group):
    """Collectives where some ranks never wait for others (roots of bcast, non-roots of
    reduce and gather): a fast rank runs ahead, and must never be taken for a mismatch."""
    n, me = group.nranks, group.rank
    x = np.zeros(4, np.int64)
    big = np.zeros(4 * n, np.int64)
    for i in range(3000):
        root = i % n
        x[:] = i if me == root else -1
        group.bcast(addr(x), 4, 8, root, 10.0)
        assert (x == i).all()
        group.reduce(addr(x), addr(x), 4, DT["int64"], SUM, (i + 1) % n, 10.0)
        group.gather(addr(x), addr(big), 4, 8, root, 10.0)
        if i % 7 == 0:
            group.barrier(10.0)
    return True


def test_no_false_mismatch_when_ranks_run_ahead():
    assert all(all_ok(run_ranks(3, _mixed_loop)).values())
