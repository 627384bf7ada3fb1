"""Direct shared-memory allreduce vs Open MPI (mpi4py Allreduce), measured in the same run.

    .venv/bin/python benchmarks/bench_direct_vs_mpi.py [--ranks 2,4] [--min 4] [--max 64M] [--rounds 2]

For each rank count it starts that many processes running gpucoll's direct allreduce, then the
same count under .venv/bin/mpiexec running mpi4py's Allreduce, both float32 SUM out of place,
and prints the median time per call and the ratio (gpucoll / MPI: below 1 is faster). Each
size is warmed up, then timed as the median over repetitions of a loop of calls on rank 0.
With --rounds R both sides run R times, alternating, and each keeps its best median (the
machine is shared: this filters out bursts of foreign load).
"""
import argparse
import json
import os
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.path.dirname(sys.executable)
REPS = 7


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B").rstrip("I")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def sizes(lo, hi):
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 4
    return out


def iterations(nbytes):
    """Calls per timed loop: the same on every rank (it must be, for a collective)."""
    return max(3, min(2000, int(64e6 / max(nbytes, 32 << 10))))


def measure(prepare, barrier, nbytes, rank, nranks):
    """prepare(send, recv) returns the call to time (buffer addresses taken once, outside)."""
    import numpy as np

    n = max(1, nbytes // 4)
    send = np.full(n, rank + 1, np.float32)
    recv = np.empty_like(send)
    allreduce = prepare(send, recv)
    iters = iterations(nbytes)
    for _ in range(max(2, iters // 10)):
        allreduce()
    times = []
    for _ in range(REPS):
        barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            allreduce()
        times.append((time.perf_counter() - t0) / iters)
    expected = nranks * (nranks + 1) // 2
    if recv[0] != expected or recv[-1] != expected:
        raise SystemExit(f"wrong result: {recv[0]} != {expected}")
    return sorted(times)[REPS // 2]


def worker_direct(args):
    sys.path.insert(0, ROOT)
    from gpucoll.transports import shm_direct
    from gpucoll.transports.shm_segment import JobSegments

    # The job id is random and private to the benchmark's own processes: it serves as the secret.
    group = shm_direct.create_or_attach(JobSegments(args.job, args.job.encode()), "bench", args.rank,
                                        args.nranks, timeout=60)
    code_f32, code_sum = 10, 0

    def prepare(send, recv):
        call, s, r, n = group.allreduce, send.ctypes.data, recv.ctypes.data, send.size
        return lambda: call(s, r, n, code_f32, code_sum, 60.0)

    return run_sizes(args, prepare, lambda: group.barrier(60.0), args.rank, args.nranks)


def worker_mpi(args):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD

    def prepare(send, recv):
        call, op = comm.Allreduce, MPI.SUM
        return lambda: call(send, recv, op)

    return run_sizes(args, prepare, comm.Barrier, comm.rank, comm.size)


def run_sizes(args, prepare, barrier, rank, nranks):
    result = {s: measure(prepare, barrier, s, rank, nranks) for s in sizes(args.min, args.max)}
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)


def launch(kind, nranks, lo, hi):
    common = [f"--min={lo}", f"--max={hi}", f"--nranks={nranks}"]
    script = os.path.abspath(__file__)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if kind == "mpi":
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd = [os.path.join(BIN, "mpiexec"), "--oversubscribe", "-n", str(nranks), sys.executable,
               script, "--worker=mpi"] + common
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)]
    else:
        job = uuid.uuid4().hex[:12]
        procs = [subprocess.Popen([sys.executable, script, "--worker=direct", f"--rank={r}",
                                   f"--job={job}"] + common, stdout=subprocess.PIPE, text=True,
                                  env=env) for r in range(nranks)]
    result = None
    for p in procs:
        out, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"{kind} with {nranks} ranks failed (exit {p.returncode})")
        for line in out.splitlines():
            if line.startswith("RESULT "):
                result = {int(k): v for k, v in json.loads(line[7:]).items()}
    return result


def human(n):
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= div:
            return f"{n // div}{unit}"
    return str(n)


def fmt_time(t):
    return f"{t * 1e6:10.1f}" if t < 1e-2 else f"{t * 1e6:10.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--min", default="4")
    ap.add_argument("--max", default="64M")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--worker", choices=("direct", "mpi"))
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--nranks", type=int, default=0)
    ap.add_argument("--job", default="")
    args = ap.parse_args()
    args.min, args.max = parse_size(args.min), parse_size(args.max)
    if args.worker == "direct":
        return worker_direct(args)
    if args.worker == "mpi":
        return worker_mpi(args)

    counts = [int(x) for x in args.ranks.split(",")]
    best = {}
    for _ in range(args.rounds):
        for n in counts:
            for kind in ("direct", "mpi"):
                res = launch(kind, n, args.min, args.max)
                prev = best.get((kind, n), {})
                best[(kind, n)] = {s: min(t, prev.get(s, t)) for s, t in res.items()}

    print(f"allreduce float32 SUM, out of place, {os.cpu_count()} cores; "
          f"time per call in us (median of {REPS} loops, best of {args.rounds} round(s))")
    head = f"{'size':>6} {'count':>9}"
    for n in counts:
        head += f" | {'gpucoll ' + str(n) + 'p':>10} {'mpi ' + str(n) + 'p':>10} {'ratio':>6}"
    print(head)
    print("-" * len(head))
    for s in sizes(args.min, args.max):
        line = f"{human(s):>6} {max(1, s // 4):>9}"
        for n in counts:
            ours, theirs = best[("direct", n)][s], best[("mpi", n)][s]
            line += f" | {fmt_time(ours)} {fmt_time(theirs)} {ours / theirs:6.2f}"
        print(line)


if __name__ == "__main__":
    main()
