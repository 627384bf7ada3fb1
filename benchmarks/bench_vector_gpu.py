"""Alltoallv and Allgatherv of CuPy arrays as CUDA-aware mpi4py programs write them: gpucoll.MPI under
gpurun beside a GPU peer, N ranks of one host.

    python benchmarks/bench_vector_gpu.py --np 2 --repeats 3 --json bench-results/vector-gpu-np2.json

gpucoll's side: `from gpucoll import MPI`, `comm.Alltoallv([send, counts, displs, MPI.DOUBLE], [recv,
...])` and `comm.Allgatherv(mine, [recv, counts, displs, MPI.DOUBLE])` on float64 CuPy arrays, equal
blocks (a size is what each rank receives). The peer (--peer, default auto): Open MPI through
mpi4py under mpiexec when its build is CUDA-aware (MPI.Query_cuda_support()), else NCCL through
cupy.cuda.nccl under gpurun (Alltoallv as one group of ncclSend/ncclRecv, one pair per rank;
Allgatherv of equal blocks as ncclAllGather), which needs a GPU per rank; with neither, the
table has gpucoll's columns only and says why. Rank r uses GPU r % (GPUs); ranks that share a
GPU run gpucoll's IPC kernels (GPUCOLL_GPU_SHARED_IPC=1). Each cell: the slowest rank's time
per call over a loop ended by a device synchronisation, median [min-max] over the runs, which
alternate; every run checks one more call's output on every rank (#wrong; a wrong element makes
the exit status 1). NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and the like).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_vector import _run, table  # noqa: E402
from gpucoll.bench import context  # noqa: E402
from gpucoll.bench.gpu import MULTICAST_OFF  # noqa: E402
from gpucoll.bench.launchers import beside_python, gpurun_argv, open_mpi_env  # noqa: E402
from gpucoll.bench.sizes import parse_size  # noqa: E402

KINDS = ("alltoallv", "allgatherv")

RANK_PROGRAM = r'''
import json, sys, time
import cupy as cp
import numpy as np
lib = sys.argv[1]
if lib == "nccl":
    import gpucoll
    from cupy.cuda import nccl
    comm = gpucoll.COMM_WORLD
    n, r = comm.size, comm.rank
else:
    if lib == "gpucoll":
        from gpucoll import MPI
    else:
        from mpi4py import MPI
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
cp.cuda.Device(r % cp.cuda.runtime.getDeviceCount()).use()
if lib == "nccl":
    uid = nccl.get_unique_id() if r == 0 else None
    uid = comm.bcast(bytes(uid) if isinstance(uid, (bytes, bytearray)) else uid)
    nc = nccl.NcclCommunicator(n, uid, r)
sizes, iters = [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
stream = cp.cuda.get_current_stream()
out = {}
for nbytes in sizes:
    k = max(1, nbytes // 8 // n)                                   # elements per block
    counts, displs = [k] * n, [j * k for j in range(n)]
    send = (r * n + cp.arange(n * k) // k).astype(cp.float64)     # block j: r * n + j
    recv = cp.empty(n * k, cp.float64)
    mine = cp.full(k, float(r))                                    # allgatherv: rank r's block is r
    want = {"allgatherv": np.repeat(np.arange(n) + 0.0, k), "alltoallv": np.repeat(np.arange(n) * n + r + 0.0, k)}
    if lib == "nccl":
        def alltoallv():
            nccl.groupStart()
            for j in range(n):
                nc.send(send.data.ptr + displs[j] * 8, counts[j], nccl.NCCL_FLOAT64, j, stream.ptr)
                nc.recv(recv.data.ptr + displs[j] * 8, counts[j], nccl.NCCL_FLOAT64, j, stream.ptr)
            nccl.groupEnd()
        calls = {"alltoallv": alltoallv,
                 "allgatherv": lambda: nc.allGather(mine.data.ptr, recv.data.ptr, k, nccl.NCCL_FLOAT64, stream.ptr)}
    else:
        calls = {"allgatherv": lambda: comm.Allgatherv(mine, [recv, counts, displs, MPI.DOUBLE]),
                 "alltoallv": lambda: comm.Alltoallv([send, counts, displs, MPI.DOUBLE],
                                                     [recv, counts, displs, MPI.DOUBLE])}
    row = {}
    reps = max(5, min(iters, (iters * 65536) // max(nbytes, 1)))
    for kind in sys.argv[4].split(","):
        fn = calls[kind]
        for _ in range(3):
            fn()
        stream.synchronize()
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        stream.synchronize()
        dt = comm.allreduce((time.perf_counter() - t0) / reps, op=MPI.MAX if lib != "nccl" else gpucoll.MAX)
        recv.fill(-1.0)  # one more call into a wiped buffer, checked: the timed ones ran the same way
        fn()
        stream.synchronize()
        wrong = int((cp.asnumpy(recv) != want[kind]).sum())
        wrong = comm.allreduce(wrong, op=MPI.SUM if lib != "nccl" else gpucoll.SUM)
        row[kind] = {"t": dt, "wrong": wrong}
    out[nbytes] = row
if r == 0:
    print("RESULT " + json.dumps(out), flush=True)
'''

CUDA_AWARE_PROBE = "from mpi4py import MPI; print(MPI.Query_cuda_support())"


def gpu_count():
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def choose_peer(wanted, nranks, mpiexec, env):
    """(peer name or None, why, label): the peer this machine can run."""
    reasons = []
    if wanted in ("auto", "mpi"):
        if mpiexec is None:
            reasons.append("no mpiexec")
        else:
            probe = subprocess.run([mpiexec, "-n", "1", sys.executable, "-c", CUDA_AWARE_PROBE], capture_output=True,
                                   text=True, env=env, timeout=120)
            if probe.stdout.strip() == "True":
                return "mpi", "", "Open MPI"
            reasons.append("this Open MPI is not CUDA-aware (MPI.Query_cuda_support() is "
                           f"{probe.stdout.strip() or 'unknown: ' + probe.stderr.strip()[-200:]})")
    if wanted in ("auto", "nccl"):
        gpus = gpu_count()
        if gpus >= nranks:
            return "nccl", "", "NCCL"
        reasons.append(f"NCCL runs one rank per GPU and this machine has {gpus} GPU(s) for {nranks} ranks")
    return None, "; ".join(reasons), "peer"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=2, help="ranks (2)")
    ap.add_argument("--min", type=parse_size, default=1 << 10, help="smallest size: bytes each rank receives (1K)")
    ap.add_argument("--max", type=parse_size, default=64 << 20, help="largest size (64M)")
    ap.add_argument("--factor", type=int, default=4, help="size step (4)")
    ap.add_argument("--iters", type=int, default=200, help="calls per size up to 64 KiB, fewer above (200)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each library, alternating (3)")
    ap.add_argument("--peer", choices=("auto", "mpi", "nccl", "none"), default="auto")
    ap.add_argument("--json", help="write the settings, every run and the rows here")
    args = ap.parse_args()
    sizes, s = [], max(args.min, 8 * args.np)
    while s <= args.max:
        sizes.append(s)
        s *= args.factor
    env = dict(os.environ, **open_mpi_env())
    for key, value in MULTICAST_OFF.items():
        env.setdefault(key, value)
    if args.np > gpu_count():
        env["GPUCOLL_GPU_SHARED_IPC"] = "1"
    mpiexec = beside_python("mpiexec")
    peer, why, label = (None, "--peer none", "peer") if args.peer == "none" else \
        choose_peer(args.peer, args.np, mpiexec, env)
    if peer is None:
        print(f"# no peer: {why}", file=sys.stderr)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        prog = os.path.join(tmp, "vector_gpu.py")
        with open(prog, "w") as f:
            f.write(RANK_PROGRAM)
        spec = [",".join(map(str, sizes)), str(args.iters), ",".join(KINDS)]
        gpurun = [*gpurun_argv(), "-np", str(args.np), "--no-tag-output", sys.executable, prog]
        for i in range(args.repeats):
            print(f"# run {i + 1}/{args.repeats} ...", file=sys.stderr)
            run = {"gpucoll": _run([*gpurun, "gpucoll", *spec], env)}
            if peer == "mpi":
                run["peer"] = _run([mpiexec, "--oversubscribe", "-n", str(args.np), sys.executable, prog, "mpi", *spec],
                                   env)
            elif peer == "nccl":
                run["peer"] = _run([*gpurun, "nccl", *spec], env)
            runs.append(run)
    where = f"of one host, {'sharing GPUs' if args.np > gpu_count() else 'a GPU each'}, CuPy arrays in vector specs"
    if peer is None:
        print(f"\n# no peer in this table: {why}")
    rows = [row for kind in KINDS for row in table(kind, runs, sizes, args.np, label, where)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(settings=context.describe(command=" ".join(sys.argv), np=args.np, sizes=sizes,
                                                     iters=args.iters, repeats=args.repeats, peer=peer or why),
                           rows=rows), f, indent=1)
    return 1 if any(r["gpucoll_wrong"] or r["peer_wrong"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
