"""GPU collectives on CuPy arrays and torch tensors, checked bit for bit against NumPy.

    gpurun -np N python gpu_cases.py [--quick]

Every rank builds every rank's input from (seed, rank) and computes the expected result
with NumPy in rank order (float16/bfloat16 accumulate in float32 and round once, as the
kernels do), so every comparison is exact. Results every rank holds (allreduce, bcast,
allgather) are hashed and compared across ranks, pass by pass. Paths: "world" (defaults), "small-stage"
(GPUCOLL_GPU_STAGE_MAX=1M, GPUCOLL_GPU_COPY=sm: many staged pieces, registered kernels at small
sizes) and
"p2p-off" (GPUCOLL_P2P_DISABLE=1: through host memory, all-reduce, broadcast and reduce in 64 KiB pinned
chunks, a few cases whole). Then stream semantics,
nonblocking requests and CUDA-graph capture (CuPy and torch). --quick: only the CuPy
collectives up to medium sizes, defaults only (the 3- and 4-rank jobs).

Output: "RESULT {json}" on every rank: {"checked": n, "failures": [...], "paths": {path: comparisons},
"stats": {path: comm.stats() of that pass's communicator}}: which algorithms really ran.
"""
import faulthandler
import hashlib
import json
import os
import sys
import traceback

import numpy as np

import cupy as cp
import gpucoll
from gpu_device import one_gpu_per_rank
from gpucoll import IN_PLACE
from gpucoll.base.errors import InvalidUsageError

try:
    import torch
except ImportError:  # torch cases are skipped
    torch = None

faulthandler.enable()
QUICK = "--quick" in sys.argv
comm = gpucoll.COMM_WORLD
N, RANK = comm.size, comm.rank
DEV = one_gpu_per_rank(comm)
if torch is not None:
    torch.cuda.set_device(DEV)

OPS = {"SUM": gpucoll.SUM, "PROD": gpucoll.PROD, "MAX": gpucoll.MAX, "MIN": gpucoll.MIN, "AVG": gpucoll.AVG,
       "BAND": gpucoll.BAND, "BOR": gpucoll.BOR, "BXOR": gpucoll.BXOR}
INTS = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
FLOATS = ("float16", "bfloat16", "float32", "float64")
failures, digests, checked = [], [], [0]
current = ["world"]  # the pass (path) being run, named in every case's key


# --- data ----------------------------------------------------------------------------------
def storage(dtype):
    return np.dtype("uint16") if dtype == "bfloat16" else np.dtype(dtype)


def bf16_bits(f32):
    u = np.ascontiguousarray(f32, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_float(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def make(dtype, count, seed, rank):
    rng = np.random.default_rng(seed * 7919 + rank)
    if dtype in INTS:
        lo, hi = (0, 10) if dtype.startswith("u") else (-9, 10)
        return rng.integers(lo, hi, count).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, count).astype(bool)
    if dtype == "bfloat16":
        return bf16_bits(rng.standard_normal(count).astype(np.float32))
    if dtype.startswith("complex"):
        return (rng.standard_normal(count) + 1j * rng.standard_normal(count)).astype(dtype)
    return rng.standard_normal(count).astype(dtype)


def reduce_ref(dtype, xs, op):
    if dtype == "bool":
        fn = {"SUM": np.logical_or, "MAX": np.logical_or, "BOR": np.logical_or, "PROD": np.logical_and,
              "MIN": np.logical_and, "BAND": np.logical_and, "BXOR": np.logical_xor}[op]
        acc = xs[0]
        for x in xs[1:]:
            acc = fn(acc, x)
        return acc
    up = (lambda x: x.astype(np.float32)) if dtype == "float16" else bf16_float if dtype == "bfloat16" else (lambda x: x)
    fn = {"SUM": np.add, "AVG": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum,
          "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]
    with np.errstate(all="ignore"):
        acc = up(xs[0])
        for x in xs[1:]:
            acc = fn(acc, up(x)).astype(acc.dtype)
        if op == "AVG" and dtype.startswith("complex"):
            # GPU complex is (re, im) pairs of reals, each divided by N: NumPy's complex division
            # rounds differently where N is no power of two
            parts = acc.view(acc.real.dtype)
            acc = (parts / parts.dtype.type(N)).astype(parts.dtype).view(acc.dtype)
        elif op == "AVG":
            acc = (acc // acc.dtype.type(N)) if dtype in INTS else (acc / acc.dtype.type(N)).astype(acc.dtype)
    if dtype == "float16":
        return acc.astype(np.float16)
    if dtype == "bfloat16":
        return bf16_bits(acc)
    return acc


# --- array libraries ----------------------------------------------------------------------
class CupyLib:
    name = "cupy"

    def to_gpu(self, host, dtype):
        return cp.asarray(host)

    def empty(self, count, dtype):
        dt = np.dtype(np.bool_) if dtype == "bool" else storage(dtype)
        return cp.asarray(np.full(count * dt.itemsize, 0x5A, np.uint8)).view(dt)  # poisoned

    def to_host(self, arr, dtype):
        return cp.asnumpy(arr)


class TorchLib:
    name = "torch"
    T = None

    def _t(self, dtype):
        return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
                "float64": torch.float64, "int32": torch.int32, "int64": torch.int64, "int8": torch.int8,
                "uint8": torch.uint8}[dtype]

    def to_gpu(self, host, dtype):
        if dtype == "bfloat16":
            return torch.from_numpy(host.view(np.int16).copy()).cuda().view(torch.bfloat16)
        return torch.from_numpy(host.copy()).cuda()

    def empty(self, count, dtype):
        t = torch.full((count * storage(dtype).itemsize,), 0x5A, dtype=torch.uint8, device="cuda")
        return t.view(self._t(dtype))

    def to_host(self, t, dtype):
        if dtype == "bfloat16":
            return t.view(torch.int16).cpu().numpy().view(np.uint16)
        return t.cpu().numpy()


# --- checks -------------------------------------------------------------------------------
def fail(key, msg):
    failures.append(f"{key}: {msg}")


def compare(key, got, want, dtype, digest=False):
    checked[0] += 1
    got = np.asarray(got).reshape(-1)
    want = np.asarray(want).reshape(-1)
    if got.shape != want.shape:
        fail(key, f"shape {got.shape} != {want.shape}")
        return
    if dtype == "bool":
        same = np.array_equal(got.astype(bool), want.astype(bool))
    else:
        same = np.array_equal(got.view(np.uint8), want.astype(got.dtype).view(np.uint8))
    if not same:
        w = want.astype(got.dtype)
        bad = np.flatnonzero(got != w) if dtype != "bool" else np.flatnonzero(got.astype(bool) != w.astype(bool))
        i = int(bad[0]) if bad.size else 0
        fail(key, f"{bad.size} of {got.size} elements differ; first at {i}: got {got[i]!r} want {w[i]!r}")
    if digest:
        digests.append((key, hashlib.sha256(got.tobytes()).hexdigest()))


def run_case(lib, coll, dtype, count, op="SUM", inplace=False, root=0, seed=1):
    key = f"[{current[0]}] {lib.name} {coll} {dtype} {op} n={count} {'inplace' if inplace else 'out'} root={root}"
    if os.environ.get("GPU_CASES_TRACE"):
        print("CASE", key, file=sys.stderr, flush=True)
    try:
        _run_case(lib, key, coll, dtype, count, op, inplace, root, seed)
    except Exception as exc:
        fail(key, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}")


def _run_case(lib, key, coll, dtype, count, op, inplace, root, seed):
    xs = [make(dtype, count * (N if coll in ("reduce_scatter", "alltoall", "scatter") else 1), seed, r)
          for r in range(N)]
    mine = lib.to_gpu(xs[RANK], dtype)
    gop = OPS[op]
    if coll == "allreduce":
        if inplace:
            comm.Allreduce(IN_PLACE, mine, op=gop)
            out = mine
        else:
            out = lib.empty(count, dtype)
            comm.Allreduce(mine, out, op=gop)
        compare(key, lib.to_host(out, dtype), reduce_ref(dtype, xs, op), dtype, digest=True)
    elif coll == "reduce_scatter":
        if inplace:
            comm.Reduce_scatter_block(IN_PLACE, mine, op=gop)
            got = lib.to_host(mine, dtype)[:count]
        else:
            out = lib.empty(count, dtype)
            comm.Reduce_scatter_block(mine, out, op=gop)
            got = lib.to_host(out, dtype)
        want = reduce_ref(dtype, [x[RANK * count:(RANK + 1) * count] for x in xs], op)
        compare(key, got, want, dtype)
    elif coll == "reduce":
        out = lib.empty(count, dtype) if RANK == root else None
        if inplace and RANK == root:
            comm.Reduce(IN_PLACE, mine, op=gop, root=root)
            out = mine
        else:
            comm.Reduce(mine, out, op=gop, root=root)
        if RANK == root:
            compare(key, lib.to_host(out, dtype), reduce_ref(dtype, xs, op), dtype)
        else:
            checked[0] += 1
    elif coll == "allgather":
        want = np.concatenate(xs)
        if inplace:
            out = lib.to_gpu(np.concatenate([xs[r] if r == RANK else np.zeros_like(xs[r]) for r in range(N)]), dtype)
            comm.Allgather(IN_PLACE, out)
        else:
            out = lib.empty(count * N, dtype)
            comm.Allgather(mine, out)
        compare(key, lib.to_host(out, dtype), want, dtype, digest=True)
    elif coll == "bcast":
        buf = mine if RANK == root else lib.empty(count, dtype)
        comm.Bcast(buf, root=root)
        compare(key, lib.to_host(buf, dtype), xs[root], dtype, digest=True)
    elif coll == "alltoall":
        want = np.concatenate([x[RANK * count:(RANK + 1) * count] for x in xs])
        if inplace:
            comm.Alltoall(IN_PLACE, mine)
            out = mine
        else:
            out = lib.empty(count * N, dtype)
            comm.Alltoall(mine, out)
        compare(key, lib.to_host(out, dtype), want, dtype)
    elif coll == "gather":
        out = lib.empty(count * N, dtype) if RANK == root else None
        comm.Gather(mine, out, root=root)
        if RANK == root:
            compare(key, lib.to_host(out, dtype), np.concatenate(xs), dtype)
        else:
            checked[0] += 1
    elif coll == "scatter":
        src = lib.to_gpu(xs[root], dtype) if RANK == root else None
        out = lib.empty(count, dtype)
        comm.Scatter(src, out, root=root)
        compare(key, lib.to_host(out, dtype), xs[root][RANK * count:(RANK + 1) * count], dtype)
    else:
        raise ValueError(coll)


def ops_for(dtype):
    if dtype in INTS:
        return ("SUM", "PROD", "MAX", "MIN", "AVG", "BAND", "BOR", "BXOR")
    if dtype == "bool":
        return ("SUM", "PROD", "MAX", "MIN", "BAND", "BOR", "BXOR")
    if dtype.startswith("complex"):
        return ("SUM", "AVG")
    return ("SUM", "PROD", "MAX", "MIN", "AVG")


def collective_suite(lib, big=True):
    cupy_dtypes = INTS + ("float16", "float32", "float64", "bool", "complex64", "complex128")
    dts = cupy_dtypes if lib.name == "cupy" else ("bfloat16", "float16", "float32", "int64", "int32", "uint8")
    seed = 1
    for dtype in dts:
        for op in ops_for(dtype):
            seed += 1
            run_case(lib, "allreduce", dtype, 1001, op, inplace=seed % 2 == 0, seed=seed)
        run_case(lib, "allreduce", dtype, 77777, "SUM", seed=seed)        # two-shot
        rs_op = "BOR" if dtype == "bool" else "SUM" if dtype.startswith("complex") else "MAX"
        run_case(lib, "reduce_scatter", dtype, 1003, rs_op, seed=seed)
    sizes = (1, 2, 3, 17, 1000, 65536, 65539, 1000003) + ((5000001,) if big else ())
    for count in sizes:
        seed += 1
        run_case(lib, "allreduce", "float32", count, "SUM", inplace=count % 2 == 1, seed=seed)
    for dtype in ("float16", "bfloat16" if lib.name == "torch" else "float64"):
        for count in (5, 300001) + ((4500000,) if big else ()):
            seed += 1
            run_case(lib, "allreduce", dtype, count, "SUM", seed=seed)
            run_case(lib, "allreduce", dtype, count, "AVG", inplace=True, seed=seed)
    for count in (1, 1000, 300000) + ((3000001,) if big else ()):
        for inplace in (False, True):
            seed += 1
            run_case(lib, "reduce_scatter", "float32", count, "SUM", inplace=inplace, seed=seed)
            run_case(lib, "allgather", "float32", count, inplace=inplace, seed=seed)
            run_case(lib, "alltoall", "float32", count, inplace=inplace, seed=seed)
    for root in range(N):
        for count in (5, 100000) + ((3000000,) if big else ()):
            seed += 1
            run_case(lib, "reduce", "float32", count, "SUM", root=root, inplace=count == 5, seed=seed)
            run_case(lib, "reduce", "int64", count, "MAX", root=root, seed=seed)
            run_case(lib, "gather", "float32", count, root=root, seed=seed)
            run_case(lib, "scatter", "float32", count, root=root, seed=seed)
        for count in (3, 1 << 20) + ((5000000,) if big else ()):
            seed += 1
            run_case(lib, "bcast", "float32", count, root=root, seed=seed)
            run_case(lib, "bcast", "int8", count + 1, root=root, seed=seed)
    run_case(lib, "allgather", "uint8", 1001, seed=seed)
    if big:  # above GPUCOLL_GPU_STAGE_MAX: registered buffers, copy engines
        run_case(lib, "bcast", "float32", 17_000_001, root=N - 1, seed=seed)
        run_case(lib, "allgather", "float32", 9_000_001, seed=seed)
    for coll in ("allreduce", "allgather", "bcast", "alltoall", "reduce_scatter"):
        run_case(lib, coll, "float32", 0)


# --- streams, requests, graphs ------------------------------------------------------------
def check_streams():
    n = N
    # the current CuPy stream is the default
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        x = cp.full(4096, RANK + 1, cp.float32)
        comm.Allreduce(IN_PLACE, x)
        y = x * 2
    s.synchronize()
    compare("streams: current cupy stream", cp.asnumpy(y), np.full(4096, 2 * n * (n + 1) / 2, np.float32), "float32")
    # explicit stream= (object and raw handle)
    x = cp.full(1 << 20, RANK + 1, cp.float32)
    cp.cuda.Device().synchronize()
    comm.Allreduce(IN_PLACE, x, stream=s)
    comm.Allreduce(IN_PLACE, x, stream=s.ptr)
    s.synchronize()
    compare("streams: stream=", cp.asnumpy(x), np.full(1 << 20, n * n * (n + 1) / 2, np.float32), "float32")
    # nonblocking: Wait(stream=s2) orders s2 only; Wait() blocks the host
    s2 = cp.cuda.Stream(non_blocking=True)
    x = cp.full(300000, RANK + 1, cp.float32)
    cp.cuda.Device().synchronize()
    req = comm.Iallreduce(IN_PLACE, x, stream=s)
    req.Wait(stream=s2)
    with s2:
        z = x + 1
    s2.synchronize()
    compare("requests: Wait(stream=)", cp.asnumpy(z), np.full(300000, n * (n + 1) / 2 + 1, np.float32), "float32")
    part, out = cp.full(8, RANK, cp.int32), cp.zeros(8 * n, cp.int32)
    cp.cuda.Device().synchronize()
    req2 = comm.Iallgather(part, out, stream=s)
    req2.Wait()
    assert req2.Test() and req.Test()
    compare("requests: Wait()", cp.asnumpy(out), np.repeat(np.arange(n, dtype=np.int32), 8), "int32")
    gpucoll.Request.Waitall([comm.Iallreduce(IN_PLACE, cp.ones(16, cp.float32)) for _ in range(3)])
    checked[0] += 1
    # CUDA graph (CuPy): 5 in-place all-reduces captured once, replayed 3 times
    for count in (1024, 1 << 20):
        gs = cp.cuda.Stream(non_blocking=True)
        with gs:
            g_x = cp.ones(count, cp.float32)
            comm.Allreduce(IN_PLACE, g_x)  # warm-up outside the capture (compiles, maps)
            gs.synchronize()
            gs.begin_capture()
            for _ in range(5):
                comm.Allreduce(IN_PLACE, g_x)
            graph = gs.end_capture()
            g_x.fill(1)
            for _ in range(3):
                graph.launch(gs)
        gs.synchronize()
        compare(f"graph: cupy {count}", cp.asnumpy(g_x), np.full(count, float(n) ** 15, np.float32), "float32")
    if torch is None:
        return
    st = torch.cuda.Stream()
    with torch.cuda.stream(st):
        t = torch.full((5000,), float(RANK + 1), device="cuda")
        comm.Allreduce(IN_PLACE, t)
        t2 = t * 1
    st.synchronize()
    compare("streams: current torch stream", t2.cpu().numpy(), np.full(5000, n * (n + 1) / 2, np.float32), "float32")
    # CUDA graph (torch)
    t = torch.ones(4096, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        comm.Allreduce(IN_PLACE, t)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        comm.Allreduce(IN_PLACE, t)
    t.fill_(1)
    for _ in range(4):
        g.replay()
    torch.cuda.synchronize()
    compare("graph: torch", t.cpu().numpy(), np.full(4096, float(n) ** 4, np.float32), "float32")


def check_errors():
    x = cp.zeros((4, 4), cp.float32)[:, ::2]
    try:
        comm.Allreduce(IN_PLACE, x)
        fail("errors: non-contiguous", "no error")
    except InvalidUsageError:
        checked[0] += 1
    try:
        comm.Allreduce(np.zeros(4, np.float32), cp.zeros(4, cp.float32))
        fail("errors: host and GPU mixed", "no error")
    except InvalidUsageError:
        checked[0] += 1
    if cp.cuda.runtime.getDeviceCount() > 1:
        other = (DEV + 1) % cp.cuda.runtime.getDeviceCount()
        with cp.cuda.Device(other):
            y = cp.zeros(4, cp.float32)
        try:
            comm.Allreduce(IN_PLACE, y)
            fail("errors: wrong device", "no error")
        except InvalidUsageError as exc:
            checked[0] += 1
            if "GPU" not in str(exc):
                fail("errors: wrong device", f"message does not name the GPU: {exc}")


def check_fortran():
    """Fortran-ordered arrays are contiguous buffers too: their elements go in memory order."""
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    want = sum(base + q for q in range(N))
    for _ in range(3):  # repeated: the packed fast path leaves them to the general path
        x = cp.asfortranarray(cp.asarray(base + RANK))
        y = cp.empty((3, 4), cp.float32, order="F")
        comm.Allreduce(x, y)
        compare("fortran: cupy allreduce", cp.asnumpy(y), want, "float32")
        comm.Allreduce(IN_PLACE, x)
        compare("fortran: cupy in place", cp.asnumpy(x), want, "float32")
    b = cp.asfortranarray(cp.asarray(base * (RANK + 1)))
    comm.Bcast(b, root=0)
    compare("fortran: cupy bcast", cp.asnumpy(b), base, "float32")
    if torch is not None:
        t = torch.tensor(base + RANK, device=f"cuda:{DEV}").t()  # strides (1, 4): Fortran order
        comm.Allreduce(IN_PLACE, t)
        compare("fortran: torch transposed", t.cpu().numpy(), want.T, "float32")


def main():
    global comm
    world = comm
    paths, stats = {}, {}
    if QUICK:  # the collectives at small and medium sizes on the world only (3 and 4 ranks)
        collective_suite(CupyLib(), big=False)
        paths["world"], stats["world"] = checked[0], comm.stats()
        return report(paths, stats)
    libs = [CupyLib()] + ([TorchLib()] if torch is not None else [])
    for lib in libs:
        collective_suite(lib)
    paths["world"] = checked[0]
    stats["world"] = comm.stats()
    for name, env in (("small-stage", {"GPUCOLL_GPU_STAGE_MAX": "1M", "GPUCOLL_GPU_ONESHOT_MAX": "16K",
                                      "GPUCOLL_GPU_COPY": "sm"}),
                      ("p2p-off", {"GPUCOLL_P2P_DISABLE": "1", "GPUCOLL_GPU_HOST_CHUNK": "64K"})):
        os.environ.update(env)
        current[0] = name
        comm = world.Dup()
        before = checked[0]
        collective_suite(CupyLib(), big=False)
        if name == "p2p-off":
            if torch is not None:
                run_case(TorchLib(), "allreduce", "bfloat16", 1001, "SUM")
            os.environ["GPUCOLL_GPU_HOST_CHUNK"] = "0"  # the whole buffer at once, through pageable copies
            chunked, comm = comm, world.Dup()  # a communicator reads GPUCOLL_GPU_HOST_CHUNK once, when made
            for count in (5, 300001):
                run_case(CupyLib(), "allreduce", "float32", count, "SUM", inplace=count == 5, seed=count)
                run_case(CupyLib(), "bcast", "float64", count, root=N - 1, seed=count)
                run_case(CupyLib(), "reduce", "int32", count, "MAX", root=0, seed=count)
            comm = chunked
        paths[name] = checked[0] - before
        stats[name] = comm.stats()
        for k in env:
            del os.environ[k]
    comm = world
    current[0] = "world"
    try:
        check_streams()
    except Exception as exc:
        fail("streams", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}")
    check_errors()
    check_fortran()
    return report(paths, stats)


def report(paths, stats):
    # Every rank ran the same cases in the same order: the digests must agree entry by entry.
    table = comm.allgather(digests)
    for r, theirs in enumerate(table):
        if [key for key, _ in theirs] != [key for key, _ in digests]:
            fail("digests", f"rank {r} hashed other cases than rank {RANK}")
            continue
        for (key, dig), (_, other) in zip(digests, theirs):
            if dig != other:
                fail(key, f"results differ between rank {RANK} and rank {r}")
    print("RESULT " + json.dumps({"checked": checked[0], "failures": failures[:40], "nfail": len(failures),
                                  "paths": paths, "stats": stats, "identical": len(digests)}), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
