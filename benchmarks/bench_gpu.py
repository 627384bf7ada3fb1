"""GPU collectives against NCCL (through CuPy), same sizes, same job, CUDA-event timing.

    gpurun -np 2 python benchmarks/bench_gpu.py [-b 8] [-e 1G] [-f 4] [-G 100] [--colls allreduce,allgather,bcast]

Each rank uses GPU GPUCOLL_DEVICE. Per size: warm-up, then `iters` eager launches from Python
on one stream between two CUDA events (time per operation = elapsed / iters, the slowest
rank's); with -G N, N operations are captured in one CUDA graph and the graph is replayed.
float32 SUM, out of place. Sizes are nccl-tests': the all-reduce and broadcast buffer, the
all-gather receive buffer. busbw as nccl-tests: allreduce 2(n-1)/n, allgather (n-1)/n, bcast 1.
"""
import argparse
import datetime
import json
import os
import socket
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import cupy as cp  # noqa: E402
from cupy.cuda import nccl  # noqa: E402

import gpucoll  # noqa: E402
from gpucoll.config import parse_size  # noqa: E402


def sizes(b, e, f):
    s = b
    while s <= e:
        yield s
        s *= f


def time_ops(fn, iters, stream, graph_ops=0):
    """Microseconds per operation: eager launches (or replays of a graph of graph_ops ops)."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    if graph_ops:
        with stream:
            stream.begin_capture()
            for _ in range(graph_ops):
                fn()
            g = stream.end_capture()
        g.launch(stream)
        stream.synchronize()
        reps = max(1, iters // graph_ops)
        start.record(stream)
        for _ in range(reps):
            g.launch(stream)
        end.record(stream)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) * 1e3 / (reps * graph_ops)
    start.record(stream)
    for _ in range(iters):
        fn()
    end.record(stream)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1e3 / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", default="8")
    ap.add_argument("-e", default="1G")
    ap.add_argument("-f", type=int, default=4)
    ap.add_argument("-n", "--iters", type=int, default=0, help="0: by size")
    ap.add_argument("-G", "--graph", type=int, default=0)
    ap.add_argument("--colls", default="allreduce")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    comm = gpucoll.COMM_WORLD
    n, rank = comm.size, comm.rank
    dev = int(os.environ.get("GPUCOLL_DEVICE", "0"))
    cp.cuda.Device(dev).use()
    uid = comm.bcast(nccl.get_unique_id() if rank == 0 else None)
    ncomm = nccl.NcclCommunicator(n, uid, rank)
    stream = cp.cuda.Stream(non_blocking=True)
    sp = stream.ptr
    rows = []
    if rank == 0:
        print(f"# gpucoll vs NCCL {nccl.get_version() // 10000}.{nccl.get_version() // 100 % 100}.{nccl.get_version() % 100}: {n} ranks, "
              f"{cp.cuda.runtime.getDeviceProperties(dev)['name'].decode()}, {socket.gethostname()}, "
              f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, float32 sum, "
              f"{'graph of %d ops' % args.graph if args.graph else 'eager launches'}, CUDA-event timing", flush=True)
        print(f"# {'coll':>9} {'size':>11} {'gc us':>9} {'gc algbw':>9} {'gc busbw':>9} {'nccl us':>9} "
              f"{'nc busbw':>9} {'speedup':>8} {'wrong':>5}", flush=True)
    for coll in args.colls.split(","):
        for size in sizes(parse_size(args.b), parse_size(args.e), args.f):
            count = max(1, size // 4)
            if coll == "allgather":
                count = max(1, size // 4 // n)
            iters = args.iters or max(5, min(1000, int(2e9 // max(size, 1) // 16)))
            with stream:
                if coll == "allgather":
                    x = cp.full(count, rank + 1, cp.float32)
                    y = cp.zeros(count * n, cp.float32)
                    want = cp.repeat(cp.arange(1, n + 1, dtype=cp.float32), count)
                    gc = lambda: comm.Allgather(x, y, stream=sp)  # noqa: E731
                    nc = lambda: ncomm.allGather(x.data.ptr, y.data.ptr, count, nccl.NCCL_FLOAT32, sp)  # noqa: E731
                    factor = (n - 1) / n
                    nbytes = count * n * 4
                elif coll == "bcast":
                    x = cp.full(count, 7 if rank == 0 else 0, cp.float32)
                    y = x
                    want = cp.full(count, 7, cp.float32)
                    gc = lambda: comm.Bcast(x, root=0, stream=sp)  # noqa: E731
                    nc = lambda: ncomm.bcast(x.data.ptr, count, nccl.NCCL_FLOAT32, 0, sp)  # noqa: E731
                    factor = 1.0
                    nbytes = count * 4
                else:
                    x = cp.full(count, rank + 1, cp.float32)
                    y = cp.zeros(count, cp.float32)
                    want = cp.full(count, n * (n + 1) / 2, cp.float32)
                    gc = lambda: comm.Allreduce(x, y, stream=sp)  # noqa: E731
                    nc = lambda: ncomm.allReduce(x.data.ptr, y.data.ptr, count, nccl.NCCL_FLOAT32,  # noqa: E731
                                                 nccl.NCCL_SUM, sp)
                    factor = 2 * (n - 1) / n
                    nbytes = count * 4
            for _ in range(3):
                gc()
                nc()
            stream.synchronize()
            y.fill(0) if coll != "bcast" else None
            stream.synchronize()
            gc()
            stream.synchronize()
            wrong = int((y != want).sum().get())
            comm.Barrier()
            t_gc = time_ops(gc, iters, stream, args.graph)
            comm.Barrier()
            t_nc = time_ops(nc, iters, stream, args.graph)
            t_gc = max(comm.allgather(t_gc))
            t_nc = max(comm.allgather(t_nc))
            wrong = sum(comm.allgather(wrong))
            alg = nbytes / t_gc / 1e3
            row = dict(coll=coll, bytes=nbytes, gc_us=t_gc, gc_algbw=alg, gc_busbw=alg * factor, nccl_us=t_nc,
                       nccl_busbw=nbytes / t_nc / 1e3 * factor, speedup=t_nc / t_gc, wrong=wrong)
            rows.append(row)
            if rank == 0:
                print(f"  {coll:>9} {nbytes:>11} {t_gc:9.2f} {alg:9.2f} {alg * factor:9.2f} {t_nc:9.2f} "
                      f"{row['nccl_busbw']:9.2f} {row['speedup']:7.2f}x {wrong:>5}", flush=True)
            del x, y, want
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
