"""Allgatherv, Alltoallv, Gatherv and Scatterv as mpi4py programs write them: gpucoll.MPI under gpurun beside mpi4py on
Open MPI under mpiexec, N ranks of one host.

    python benchmarks/bench_vector.py --np 2 --repeats 3 --json bench-results/vector-np2.json

Each run starts the same rank program under `gpurun -np N` (`from gpucoll import MPI`) and then under
`mpiexec -n N --bind-to core` (`from mpi4py import MPI`); --repeats alternates them. Messages are
float64 NumPy arrays in vector specs, `[array, counts, displs, MPI.DOUBLE]`, with equal blocks;
a size is N blocks (what each rank receives in Allgatherv and Alltoallv, what the root gathers or
scatters; root 0). Each cell: the slowest rank's mean time per
call, median [min-max] over the runs; ratio: Open MPI's time / gpucoll's, run by run (above 1:
gpucoll is faster). Every run checks the last call's output on every rank (#wrong: elements that
differ, summed over ranks and runs); a wrong element makes the exit status 1.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from gpucoll.bench import context  # noqa: E402
from gpucoll.bench.sizes import human, parse_size  # noqa: E402

KINDS = ("allgatherv", "alltoallv", "gatherv", "scatterv")

RANK_PROGRAM = r'''
import json, sys, time
import numpy as np
if sys.argv[1] == "gpucoll":
    from gpucoll import MPI
else:
    from mpi4py import MPI
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
sizes, iters = [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
out = {}
for nbytes in sizes:
    k = max(1, nbytes // 8 // n)                      # elements per block
    counts, displs = [k] * n, [j * k for j in range(n)]
    send = (r * n + np.arange(n * k) // k).astype(np.float64)   # block j: r * n + j
    recv = np.empty(n * k, np.float64)
    mine = np.full(k, float(r))                                   # allgatherv: rank r's block is r
    part = np.empty(k, np.float64)
    want = {"allgatherv": np.repeat(np.arange(n) + 0.0, k), "alltoallv": np.repeat(np.arange(n) * n + r + 0.0, k),
            "gatherv": np.repeat(np.arange(n) + 0.0, k) if r == 0 else None, "scatterv": np.full(k, r + 0.0)}
    calls = {"allgatherv": lambda: comm.Allgatherv(mine, [recv, counts, displs, MPI.DOUBLE]),
             "alltoallv": lambda: comm.Alltoallv([send, counts, displs, MPI.DOUBLE], [recv, counts, displs, MPI.DOUBLE]),
             "gatherv": lambda: comm.Gatherv(mine, [recv, counts, displs, MPI.DOUBLE] if r == 0 else None, root=0),
             "scatterv": lambda: comm.Scatterv([mine_all, counts, displs, MPI.DOUBLE] if r == 0 else None, part,
                                               root=0)}
    mine_all = np.repeat(np.arange(n) + 0.0, k)     # scatterv: the root's block j is j
    row = {}
    reps = max(5, min(iters, (iters * 65536) // max(nbytes, 1)))
    for kind in sys.argv[4].split(","):
        fn = calls[kind]
        for _ in range(3):
            fn()
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        dt = comm.allreduce((time.perf_counter() - t0) / reps, op=MPI.MAX)
        recv.fill(-1.0)  # one more call into a wiped buffer, checked: the timed ones ran the same way
        part.fill(-1.0)
        fn()
        got = part if kind == "scatterv" else recv
        wrong = comm.allreduce(0 if want[kind] is None else int((got != want[kind]).sum()), op=MPI.SUM)
        row[kind] = {"t": dt, "wrong": wrong}
    out[nbytes] = row
if r == 0:
    print("RESULT " + json.dumps(out), flush=True)
'''


def _label(nbytes):
    text = human(nbytes)
    return f"{text[:-1]} {text[-1]}iB" if text[-1] in "KMG" else f"{text} B"


def _median(values):
    s = sorted(values)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def _run(cmd, env):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {proc.returncode}: {proc.stderr[-2000:]}")
    return {int(k): v for k, v in json.loads(line[len("RESULT "):]).items()}


def table(kind, runs, sizes, nranks, peer="Open MPI", where="of one host, [array, counts, displs, MPI.DOUBLE]"):
    """Printed lines and JSON rows of one collective; runs without a "peer" entry leave its
    columns empty (a peer that cannot run here)."""
    print(f"\n# {kind}, {nranks} ranks {where}: time per call (us), median [min-max] of the runs; ratio: "
          f"{peer} time / gpucoll time, run by run")
    print(f"{'size':>10} {'gpucoll (us)':>24} {'#wrong':>6} {peer + ' (us)':>24} {'#wrong':>6} {'ratio':>20}")
    rows = []
    span = lambda v, f: f"{f(_median(v))} [{f(min(v))}-{f(max(v))}]" if v else "-"  # noqa: E731
    us = lambda x: f"{x * 1e6:.2f}" if x < 1e-4 else f"{x * 1e6:.0f}"  # noqa: E731
    for s in sizes:
        ours = [run["gpucoll"][s][kind] for run in runs]
        theirs = [run["peer"][s][kind] for run in runs if "peer" in run]
        ratios = [b["t"] / a["t"] for a, b in zip(ours, theirs)]
        wrong = (sum(a["wrong"] for a in ours), sum(b["wrong"] for b in theirs))
        print(f"{_label(s):>10} {span([a['t'] for a in ours], us):>24} {wrong[0]:>6} "
              f"{span([b['t'] for b in theirs], us):>24} {wrong[1] if theirs else '-':>6} "
              f"{span(ratios, lambda x: f'{x:.2f}'):>20}")
        rows.append(dict(test=kind, size=s, gpucoll=[a["t"] for a in ours], peer=[b["t"] for b in theirs],
                         ratio=ratios, gpucoll_wrong=wrong[0], peer_wrong=wrong[1]))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=2, help="ranks (2)")
    ap.add_argument("--min", type=parse_size, default=64, help="smallest size: bytes each rank receives (64)")
    ap.add_argument("--max", type=parse_size, default=16 << 20, help="largest size (16M)")
    ap.add_argument("--iters", type=int, default=1000, help="calls per size up to 64 KiB, fewer above (1000)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each library, alternating (3)")
    ap.add_argument("--json", help="write the settings, every run and the rows here")
    args = ap.parse_args()
    sizes, s = [], max(args.min, 8 * args.np)  # at least one float64 per block
    while s <= args.max:
        sizes.append(s)
        s *= 8
    bindir = os.path.dirname(sys.executable)
    gpurun = os.path.join(bindir, "gpurun")
    gpurun = [gpurun] if os.access(gpurun, os.X_OK) else [sys.executable, "-m", "gpucoll.launcher"]
    mpiexec = os.path.join(bindir, "mpiexec")
    mpiexec = mpiexec if os.access(mpiexec, os.X_OK) else shutil.which("mpiexec")
    if mpiexec is None:
        sys.exit("bench_vector.py: no mpiexec (pip install '.[test]')")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        prog = os.path.join(tmp, "vector.py")
        with open(prog, "w") as f:
            f.write(RANK_PROGRAM)
        spec = [",".join(map(str, sizes)), str(args.iters), ",".join(KINDS)]
        for i in range(args.repeats):
            print(f"# run {i + 1}/{args.repeats} ...", file=sys.stderr)
            runs.append({
                "gpucoll": _run([*gpurun, "-np", str(args.np), "--no-tag-output", sys.executable, prog, "gpucoll", *spec],
                                env),
                "peer": _run([mpiexec, "--oversubscribe", "--bind-to", "core", "-n", str(args.np), sys.executable, prog,
                             "mpi", *spec], env)})
    rows = [row for kind in KINDS for row in table(kind, runs, sizes, args.np)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(settings=context.describe(command=" ".join(sys.argv), np=args.np, sizes=sizes,
                                                     iters=args.iters, repeats=args.repeats),
                           rows=rows), f, indent=1)
    return 1 if any(r["gpucoll_wrong"] or r["peer_wrong"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
