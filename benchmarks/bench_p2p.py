"""Host point to point between two ranks of one host: gpucoll beside Open MPI (mpi4py).

    python benchmarks/bench_p2p.py                # 8 B to 16 MiB, factor 8
    python benchmarks/bench_p2p.py --iters 500

One run starts the same ping-pong twice: under `gpurun -np 2` with gpucoll, then under
`mpiexec -n 2` with mpi4py (skipped, with the reason, when mpi4py or mpiexec is missing).
Rank 0 sends NumPy bytes and waits for them back (blocking Send, then Recv); the one-way
time is half the median round trip, after a warm-up. The table gives both times, gpucoll's
bandwidth and the ratio (peer time / gpucoll time; above 1: gpucoll is faster).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

RANK_PROGRAM = r'''
import json, sys, time
import numpy as np
lib, sizes, iters = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
if lib == "mpi":
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
else:
    import gpucoll
    comm = gpucoll.COMM_WORLD
rank = comm.Get_rank()
peer = 1 - rank
out = {}
for nbytes in sizes:
    a, b = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    n = iters if nbytes <= (64 << 10) else max(10, iters // 20)
    times = []
    for i in range(n + 10):
        comm.Barrier() if i % 50 == 0 else None
        t0 = time.perf_counter()
        if rank == 0:
            comm.Send(a, peer, 1)
            comm.Recv(b, peer, 1)
        else:
            comm.Recv(b, peer, 1)
            comm.Send(b, peer, 1)
        if i >= 10:
            times.append(time.perf_counter() - t0)
    times.sort()
    out[nbytes] = times[len(times) // 2] / 2
if rank == 0:
    sys.stdout.write("RESULT " + json.dumps(out) + "\n")
'''


def run(argv, env=None):
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    for line in proc.stdout.splitlines():
        tail = line.split("RESULT ", 1)
        if len(tail) == 2:
            return {int(k): v for k, v in json.loads(tail[1]).items()}
    raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {proc.stderr[-1500:]}")


def human(nbytes):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000, help="round trips per size up to 64 KiB")
    ap.add_argument("--max", type=int, default=16 << 20, help="largest message in bytes")
    args = ap.parse_args()
    sizes, s = [], 8
    while s <= args.max:
        sizes.append(s)
        s *= 8
    spec = [",".join(map(str, sizes)), str(args.iters)]
    with tempfile.TemporaryDirectory() as tmp:
        prog = os.path.join(tmp, "pingpong.py")
        with open(prog, "w") as f:
            f.write(RANK_PROGRAM)
        gpurun = os.path.join(os.path.dirname(sys.executable), "gpurun")
        gpurun = [gpurun] if os.access(gpurun, os.X_OK) else [sys.executable, "-m", "gpucoll.launcher"]
        ours = run([*gpurun, "-np", "2", "--no-tag-output", sys.executable, prog, "gpucoll", *spec])
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        mpiexec = mpiexec if os.access(mpiexec, os.X_OK) else shutil.which("mpiexec")
        peer, why = None, ""
        try:
            import mpi4py  # noqa: F401
            if mpiexec is None:
                raise ImportError("no mpiexec")
            peer = run([mpiexec, "--allow-run-as-root", "--oversubscribe", "-n", "2", sys.executable, prog, "mpi",
                        *spec])
        except (ImportError, RuntimeError) as exc:
            why = f"# Open MPI skipped: {exc}"
    print("# host point to point, 2 ranks, blocking Send + Recv ping-pong; one-way time = median round trip / 2")
    if why:
        print(why)
    print(f"{'size':>10} {'gpucoll (us)':>13} {'GB/s':>7} {'Open MPI (us)':>14} {'ratio':>7}")
    for nbytes in sizes:
        t = ours[nbytes]
        p = peer[nbytes] if peer else None
        print(f"{human(nbytes):>10} {t * 1e6:13.2f} {nbytes / t / 1e9:7.3f} "
              + (f"{p * 1e6:14.2f} {p / t:7.2f}" if p else f"{'-':>14} {'-':>7}"))


if __name__ == "__main__":
    main()
