"""The native core: reductions against NumPy, shared-memory channels, the schedule executor.

Multi-rank cases start real processes (multiprocessing, spawn) that exchange over ShmChannel
with run_schedule; each rank reports its result or the exception it raised.
"""
import multiprocessing as mp
import os
import re
import signal
import time
import uuid

import numpy as np
import pytest

from gpucoll.base import errors
from gpucoll._native import core
from gpucoll.transports.shm import ShmChannels
from gpucoll.transports.shm_segment import SHM_DIR, JobSegments

# gc_types.h codes
DT = dict(int8=0, uint8=1, int16=2, uint16=3, int32=4, uint32=5, int64=6, uint64=7, float16=8,
          bfloat16=9, float32=10, float64=11, complex64=12, complex128=13, bool=14)
OPS = dict(SUM=0, PROD=1, MAX=2, MIN=3, AVG=4, BAND=5, BOR=6, BXOR=7)
SEND, RECV, REDUCE, COPY = core.SEND, core.RECV, core.REDUCE, core.COPY
INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
FLOATS = ["float16", "bfloat16", "float32", "float64"]
COMPLEX = ["complex64", "complex128"]
SECRET = b"test-native-core-secret"


# ---- reductions ----------------------------------------------------------------------------

def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(f):
    """Round to nearest even, NaN kept (quiet): the reference for bfloat16."""
    u = f.view(np.uint32).astype(np.uint64)
    out = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    out[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def valid(dtype, op):
    if dtype in INTS:
        return True
    if dtype in FLOATS:
        return op in ("SUM", "PROD", "MAX", "MIN", "AVG")
    if dtype in COMPLEX:
        return op in ("SUM", "PROD", "AVG")
    return op != "AVG"  # bool


def sample(dtype, n, rng):
    if dtype in INTS:
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    if dtype == "bool":
        return rng.integers(0, 2, n).astype(bool)
    if dtype == "bfloat16":
        return rng.integers(0, 1 << 16, n, dtype=np.uint16)  # every pattern: nan, inf, subnormals
    if dtype == "float16":
        return rng.integers(0, 1 << 16, n, dtype=np.uint16).view(np.float16)
    base = np.float32 if dtype in ("float32", "complex64") else np.float64
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(base)
    x[rng.integers(0, n, 8)] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, np.finfo(base).max, 7]
    if dtype in COMPLEX:
        y = (rng.standard_normal(n) * 10.0 ** rng.integers(-10, 10, n)).astype(base)
        return (x + 1j * y).astype(dtype)
    return x


NUMPY_OP = dict(SUM=np.add, AVG=np.add, PROD=np.multiply, MAX=np.maximum, MIN=np.minimum,
                BAND=np.bitwise_and, BOR=np.bitwise_or, BXOR=np.bitwise_xor)


def reference(dtype, op, a, b):
    fn = NUMPY_OP[op]
    with np.errstate(all="ignore"):
        if dtype == "float16":
            return fn(a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
        if dtype == "bfloat16":
            return f32_to_bf16(fn(bf16_to_f32(a), bf16_to_f32(b)))
        if dtype == "bool":
            return {"MAX": np.logical_or, "MIN": np.logical_and}.get(op, fn)(a, b)
        if dtype in COMPLEX and op == "PROD":
            # the textbook product, unfused: NumPy's own SIMD loop may use FMA on this CPU
            out = np.empty_like(a)
            out.real = a.real * b.real - a.imag * b.imag
            out.imag = a.real * b.imag + a.imag * b.real
            return out
        return fn(a, b)


def same(dtype, got, want):
    if dtype == "bfloat16":
        g, w = bf16_to_f32(got), bf16_to_f32(want)
        return np.array_equal(got[~np.isnan(g)], want[~np.isnan(w)]) and np.array_equal(
            np.isnan(g), np.isnan(w))
    if dtype in FLOATS or dtype in COMPLEX:
        # bit-exact except NaN payloads: equal_nan compares NaN positions; signed zeros are
        # checked through the bits of the non-NaN elements
        if not np.array_equal(got, want, equal_nan=True):
            return False
        m = ~np.isnan(got)
        return np.array_equal(np.signbit(got.real[m]), np.signbit(want.real[m]))
    return np.array_equal(got, want)


@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize("op", list(OPS))
def test_reduce_matches_numpy(dtype, op):
    rng = np.random.default_rng(DT[dtype] * 16 + OPS[op])
    n = 4099  # not a multiple of any vector width
    a, b = sample(dtype, n, rng), sample(dtype, n, rng)
    assert core.op_valid(DT[dtype], OPS[op]) == valid(dtype, op)
    if not valid(dtype, op):
        with pytest.raises(errors.InvalidUsageError):
            core.reduce(a.copy(), b, DT[dtype], OPS[op])
        return
    if op in ("MAX", "MIN") and (dtype in FLOATS):
        # numpy leaves the sign of max(-0.0, +0.0) to the implementation: avoid such pairs
        z = (a == 0) & (b == 0) if dtype != "bfloat16" else (bf16_to_f32(a) == 0) & (bf16_to_f32(b) == 0)
        b[z] = a[z]
    dst = a.copy()
    core.reduce(dst, b, DT[dtype], OPS[op])
    assert same(dtype, dst, reference(dtype, op, a, b))


def test_half_conversions_exhaustive():
    """Every float16 / bfloat16 pattern against a permutation of them, SUM and PROD."""
    h = np.arange(1 << 16, dtype=np.uint16)
    b = np.random.default_rng(1).permutation(h)
    for op in ("SUM", "PROD", "MAX"):
        for dtype, view in (("float16", np.float16), ("bfloat16", np.uint16)):
            a2, b2 = h.view(view), b.view(view)
            dst = a2.copy()
            core.reduce(dst, b2, DT[dtype], OPS[op])
            assert same(dtype, dst, reference(dtype, op, a2, b2)), (dtype, op)


def test_bool_reads_any_nonzero_byte_as_true():
    a = np.array([0, 2, 0, 255], np.uint8).view(bool)
    b = np.array([0, 0, 7, 1], np.uint8).view(bool)
    for op, want in (("BAND", [0, 0, 0, 1]), ("BOR", [0, 1, 1, 1]), ("BXOR", [0, 1, 1, 0])):
        dst = a.copy()
        core.reduce(dst, b, DT["bool"], OPS[op])
        assert dst.view(np.uint8).tolist() == want


@pytest.mark.parametrize("dtype", INTS + FLOATS + COMPLEX)
def test_scale_avg(dtype):
    rng = np.random.default_rng(7)
    x = sample(dtype, 1001, rng)
    for nranks in (1, 3, 300):
        buf = x.copy()
        core.scale_avg(buf, DT[dtype], nranks)
        with np.errstate(all="ignore"):
            if dtype in INTS:
                want = (x.astype(object) // nranks).astype(dtype)  # exact floor division
            elif dtype == "float16":
                want = (x.astype(np.float32) / np.float32(nranks)).astype(np.float16)
            elif dtype == "bfloat16":
                want = f32_to_bf16(bf16_to_f32(x) / np.float32(nranks))
            else:  # part by part: numpy's complex division would turn inf parts into nan
                part = x.real.dtype.type
                want = (x.view(part) / part(nranks)).view(x.dtype)
        assert same(dtype, buf, want), nranks


def test_reduce_rejects_bad_arguments():
    with pytest.raises(errors.InvalidUsageError):
        core.reduce(np.zeros(4, np.float32), np.zeros(3, np.float32), DT["float32"], OPS["SUM"])
    with pytest.raises(errors.InvalidUsageError):
        core.reduce(np.zeros(4, np.float32), np.zeros(4, np.float32), 99, OPS["SUM"])
    with pytest.raises(errors.InvalidUsageError):
        core.reduce(np.zeros(4, np.float32), np.zeros(4, np.float32), DT["float32"], OPS["BXOR"])


# ---- channels in one process -----------------------------------------------------------------

def steps(*rows):
    return np.array(rows, dtype=np.int64).reshape(-1, core.STEP_COLS)


def addr(a):
    return a.__array_interface__["data"][0]


@pytest.fixture
def pair():
    """Both ends of one channel in this process: rank 0 holds `a`, rank 1 holds `b`."""
    segs = JobSegments(f"t{uuid.uuid4().hex[:10]}", SECRET)
    lo = ShmChannels(segs, "c", 0, [os.getpid()] * 2, capacity=4096)
    hi = ShmChannels(segs, "c", 1, [os.getpid()] * 2)
    a, b = lo.channel(1), hi.channel(0)      # the attacher unlinks the name
    yield a, b, np.array([0, a.ptr], np.uint64), np.array([b.ptr, 0], np.uint64)
    lo.close()
    hi.close()


def test_channel_wraps_and_frames(pair):
    a, b, pa, pb = pair
    assert (a.side, b.side, a.capacity, b.capacity) == (0, 1, 4096, 4096)
    assert a.peer_attached and b.peer_attached and a.alive() and b.alive()
    rng = np.random.default_rng(3)
    for count in (1, 3, 100, 255, 0, 500, 7, 499):  # odd frame sizes walk the ring past its wrap
        x = rng.standard_normal(count)
        y = np.full(count, 1.5)
        core.run_schedule(steps([SEND, 1, 0, 0, count, -1, -1, 0, 0]), pa, addr(x), 0, 0, 8, DT["float64"], 0, 5)
        core.run_schedule(steps([RECV | REDUCE, -1, -1, 0, 0, 0, 1, 0, count]), pb, 0, addr(y), 0, 8,
                          DT["float64"], OPS["SUM"], 5)
        assert np.array_equal(y, 1.5 + x)


def test_count_mismatch_names_the_peer(pair):
    a, b, pa, pb = pair
    x = np.arange(8, dtype=np.int32)
    core.run_schedule(steps([SEND, 1, 0, 0, 5, -1, -1, 0, 0]), pa, addr(x), 0, 0, 4, DT["int32"], 0, 5)
    with pytest.raises(errors.InvalidUsageError, match=r"20 bytes announced, 16 expected.*step 0.*rank 0"):
        core.run_schedule(steps([RECV, -1, -1, 0, 0, 0, 1, 0, 4]), pb, 0, addr(x), 0, 4, DT["int32"], 0, 5)


def test_schedule_checks(pair):
    a, b, pa, pb = pair
    x = np.zeros(4, np.float32)
    run = lambda st, **kw: core.run_schedule(st, pa, addr(x), addr(x), 0, 4, DT["float32"], 0, 1, **kw)
    with pytest.raises(errors.InvalidUsageError, match="no channel.*rank 2"):
        run(steps([SEND, 2, 0, 0, 4, -1, -1, 0, 0]))
    with pytest.raises(errors.InvalidUsageError, match="past the end"):
        run(steps([COPY, -1, 0, 0, 5, -1, 1, 0, 5]), send_bytes=16, recv_bytes=16)
    with pytest.raises(errors.InvalidUsageError, match="not given"):
        run(steps([COPY, -1, 2, 0, 4, -1, 1, 0, 4]))
    with pytest.raises(errors.InvalidUsageError, match="not defined"):
        core.run_schedule(steps([COPY | REDUCE, -1, 0, 0, 4, -1, 1, 0, 4]), pa, addr(x), addr(x), 0, 4,
                          DT["float32"], OPS["BAND"], 1)
    with pytest.raises(errors.InvalidUsageError):
        core.run_schedule(np.zeros((1, 8), np.int64), pa, 0, 0, 0, 4, DT["float32"], 0, 1)


def test_copy_steps():
    x = np.arange(10, dtype=np.int64)
    y = np.zeros(10, np.int64)
    none = np.zeros(1, np.uint64)
    core.run_schedule(steps([COPY, -1, 0, 0, 10, -1, 1, 0, 10], [COPY | REDUCE, -1, 0, 0, 10, -1, 1, 0, 10],
                            [COPY, -1, 1, 0, 6, -1, 1, 4, 6]),  # overlapping: memmove
                      none, addr(x), addr(y), 0, 8, DT["int64"], OPS["SUM"], 1)
    assert y.tolist() == [0, 2, 4, 6, 0, 2, 4, 6, 8, 10]


# ---- real processes --------------------------------------------------------------------------

def _rank_main(rank, size, job, cap, plan, inputs, results):
    """One rank: run each (schedule, dtype, op, timeout) of plan over lazily made channels."""
    t0 = time.monotonic()
    try:
        chans = ShmChannels(JobSegments(job, SECRET), "world", rank, capacity=cap, timeout=10)
        out = []
        for item in plan[rank]:
            if item == "ready":            # tell the parent we are connected, then idle
                results.put((rank, "ready", None))
                continue
            if item == "sleep":
                time.sleep(30)
                continue
            if isinstance(item, tuple) and isinstance(item[0], str):
                time.sleep(item[1])
                continue
            st, dtype, op, timeout, peers = item
            for p in peers:
                chans.channel(p)
            send = np.ascontiguousarray(inputs[rank])
            recv = send.copy()
            scratch = np.zeros_like(send)
            t0 = time.monotonic()
            core.run_schedule(st, chans.pointers(size), addr(send), addr(recv), addr(scratch),
                              send.itemsize, DT[dtype], OPS[op], timeout,
                              send.nbytes, recv.nbytes, scratch.nbytes)
            out.append((recv, time.monotonic() - t0))
        chans.close()
        results.put((rank, "ok", out))
    except Exception as exc:  # reported to the parent, which asserts on it
        results.put((rank, "error", (type(exc).__name__, str(exc), time.monotonic() - t0)))


def run_ranks(size, plan, inputs, cap=4096, kill=None, timeout=30):
    """Start `size` ranks; kill=(rank, after 'ready' from it) SIGKILLs that rank."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    job = f"t{uuid.uuid4().hex[:10]}"
    procs = [ctx.Process(target=_rank_main, args=(r, size, job, cap, plan, inputs, results))
             for r in range(size)]
    for p in procs:
        p.start()
    got = {}
    try:
        deadline = time.monotonic() + timeout
        while len(got) < size - (kill is not None):
            rank, kind, payload = results.get(timeout=max(0.1, deadline - time.monotonic()))
            if kind == "ready":
                if kill is not None and rank == kill:
                    time.sleep(0.2)
                    os.kill(procs[rank].pid, signal.SIGKILL)
                continue
            got[rank] = (kind, payload)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
        assert not [n for n in os.listdir(SHM_DIR) if n.startswith(JobSegments(job, SECRET).prefix)]
    return got


def ring_allreduce(rank, size, count):
    """Ring all-reduce (reduce-scatter then all-gather) as a schedule, chunks of unequal size."""
    bounds = np.linspace(0, count, size + 1).astype(int)
    off = lambda c: int(bounds[c % size])
    cnt = lambda c: int(bounds[c % size + 1] - bounds[c % size])
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    rows = [[COPY, -1, 0, 0, count, -1, 1, 0, count]]
    for k in range(size - 1):
        s, r = rank - k, rank - k - 1
        rows.append([SEND | RECV | REDUCE, nxt, 1, off(s), cnt(s), prv, 1, off(r), cnt(r)])
    for k in range(size - 1):
        s, r = rank + 1 - k, rank - k
        rows.append([SEND | RECV, nxt, 1, off(s), cnt(s), prv, 1, off(r), cnt(r)])
    return steps(*rows), [nxt, prv]


@pytest.mark.parametrize("size", [2, 3, 4])  # 4 ranks on 2 cores: idle ranks must yield
def test_ring_sendrecv_and_allreduce(size):
    count = 10007  # 40 KB per rank through 4 KiB rings: many wraps, odd tail
    rng = np.random.default_rng(size)
    inputs = [rng.integers(-1000, 1000, count).astype(np.int32) for _ in range(size)]
    plan = []
    for r in range(size):
        nxt, prv = (r + 1) % size, (r - 1) % size
        shift = steps([SEND | RECV, nxt, 0, 0, count, prv, 1, 0, count])
        shift_reduce = steps([SEND | RECV | REDUCE, nxt, 0, 0, count, prv, 1, 0, count])
        zero = steps([SEND | RECV, nxt, 0, 0, 0, prv, 1, 0, 0])
        ar, peers = ring_allreduce(r, size, count)
        plan.append([(shift, "int32", "SUM", 10, [nxt, prv]), (shift_reduce, "int32", "SUM", 10, [nxt, prv]),
                     (zero, "int32", "SUM", 10, [nxt, prv]), (ar, "int32", "SUM", 10, peers),
                     (ar, "int32", "MAX", 10, peers)])
    got = run_ranks(size, plan, inputs)
    total, top = np.sum(inputs, axis=0, dtype=np.int32), np.max(inputs, axis=0)
    for r in range(size):
        kind, out = got[r]
        assert kind == "ok", out
        prv = (r - 1) % size
        assert np.array_equal(out[0][0], inputs[prv])
        assert np.array_equal(out[1][0], inputs[r] + inputs[prv])
        assert np.array_equal(out[2][0], inputs[r])       # zero-count: nothing moved
        assert np.array_equal(out[3][0], total)
        assert np.array_equal(out[4][0], top)


def test_zero_count_message_synchronises():
    inputs = [np.zeros(4, np.float32)] * 2
    zero0 = steps([RECV, -1, -1, 0, 0, 1, 1, 0, 0])
    zero1 = steps([SEND, 0, 0, 0, 0, -1, -1, 0, 0])
    plan = [[(zero0, "float32", "SUM", 10, [1])],
            [(steps([SEND | RECV, 0, 0, 0, 0, 0, 1, 0, 0])[:0], "float32", "SUM", 10, [0]), ("nap", 0.5),
             (zero1, "float32", "SUM", 10, [0])]]
    got = run_ranks(2, plan, inputs)
    assert got[1][0] == "ok", got[1]
    kind, out = got[0]
    assert kind == "ok", out
    assert out[0][1] >= 0.4  # the empty message was waited for


def test_count_mismatch_between_processes():
    inputs = [np.arange(64, dtype=np.float64)] * 2
    plan = [[(steps([SEND | RECV, 1, 0, 0, 10, 1, 1, 0, 10]), "float64", "SUM", 10, [1])],
            [(steps([SEND | RECV, 0, 0, 0, 12, 0, 1, 0, 10]), "float64", "SUM", 10, [0])]]
    got = run_ranks(2, plan, inputs)
    kind, (name, msg, _) = got[0]
    assert (kind, name) == ("error", "MismatchError")  # an InvalidUsageError too
    assert "rank 1" in msg and "96 bytes announced, 80 expected" in msg and "step 0" in msg


def test_op_mismatch_between_processes():
    # the op travels in the header: a SUM against a MAX is caught on both sides, before reducing
    inputs = [np.arange(16, dtype=np.float32)] * 2
    plan = [[(steps([SEND | RECV | REDUCE, 1, 0, 0, 16, 1, 1, 0, 16]), "float32", "SUM", 10, [1])],
            [(steps([SEND | RECV | REDUCE, 0, 0, 0, 16, 0, 1, 0, 16]), "float32", "MAX", 10, [0])]]
    got = run_ranks(2, plan, inputs)
    for r, (mine, theirs) in ((0, ("SUM", "MAX")), (1, ("MAX", "SUM"))):
        kind, (name, msg, _) = got[r]
        assert (kind, name) == ("error", "MismatchError"), got[r]
        assert f"rank {1 - r} reduces with {theirs}, this rank with {mine} at step 0" in msg, msg


def test_peer_killed_mid_exchange():
    count = 1 << 18  # 1 MiB of float32 through a 4 KiB ring: rank 0 blocks sending
    inputs = [np.ones(count, np.float32)] * 2
    plan = [[(steps([SEND | RECV, 1, 0, 0, count, 1, 1, 0, count]), "float32", "SUM", 30, [1])],
            [(steps([SEND | RECV, 0, 0, 0, 16, 0, 1, 0, 16])[:0], "float32", "SUM", 30, [0]), "ready", "sleep"]]
    got = run_ranks(2, plan, inputs, kill=1)
    kind, (name, msg, elapsed) = got[0]
    assert (kind, name) == ("error", "LostPeerError"), msg
    assert "rank 1" in msg and elapsed < 5


def test_timeout_names_the_missing_rank():
    inputs = [np.ones(16, np.float32)] * 2
    plan = [[(steps([RECV, -1, -1, 0, 0, 1, 1, 0, 16]), "float32", "SUM", 0.5, [1])],
            [(steps([SEND, 0, 0, 0, 16, -1, -1, 0, 0])[:0], "float32", "SUM", 10, [0]), ("nap", 2.0)]]
    got = run_ranks(2, plan, inputs)
    kind, (name, msg, elapsed) = got[0]
    assert (kind, name) == ("error", "TimeoutError"), msg
    assert "rank 1" in msg and "step 0" in msg and 0.5 <= elapsed < 2.0
    assert got[1][0] == "ok"


def test_segment_names_and_cleanup():
    segs = JobSegments("job/1", SECRET)
    name = ShmChannels(segs, "comm 7/coll", 5).path(2)
    # Secret-derived: nothing of the job id or communicator shows, and another secret (another
    # job) gets other names; the same job always the same one.
    assert re.fullmatch(r"/dev/shm/gpucoll-[0-9a-f]{12}-[0-9a-f]{32}", name), name
    assert name == ShmChannels(JobSegments("job/1", SECRET), "comm 7/coll", 2).path(5)
    assert name != ShmChannels(JobSegments("job/1", b"other"), "comm 7/coll", 5).path(2)
    assert os.path.basename(name).startswith(segs.prefix)
    job = f"t{uuid.uuid4().hex[:10]}"
    segs = JobSegments(job, SECRET)
    lo = ShmChannels(segs, "c", 0, [os.getpid(), os.getpid()], capacity=8192, timeout=2)
    assert lo.channel(1).capacity == 8192
    assert os.path.exists(lo.path(1))
    assert os.stat(lo.path(1)).st_mode & 0o777 == 0o600
    hi = ShmChannels(segs, "c", 1, [os.getpid(), os.getpid()], timeout=2)
    assert hi.channel(0).capacity == 8192          # the creator's size wins
    assert not os.path.exists(lo.path(1))
    assert hi.channel(0) is hi.channel(0)
    hi.close()
    assert not lo.channel(1).alive()               # a closed end reads as gone
    lo.close()
    with pytest.raises(errors.TimeoutError, match="rank 0 did not create"):
        ShmChannels(segs, "other", 1, timeout=0.2).channel(0)
    # what a job leaves is removed by the launcher's unlink_all (which knows job id and secret)
    ShmChannels(segs, "left", 0, [os.getpid(), 0], capacity=4096).channel(1)
    assert segs.unlink_all() == 1
    assert not [n for n in os.listdir(SHM_DIR) if n.startswith(segs.prefix)]