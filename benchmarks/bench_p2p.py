"""Host point to point between two ranks of one host: gpucoll beside Open MPI (mpi4py).

    python benchmarks/bench_p2p.py                   # 8 B to 16 MiB, factor 8, 3 runs each
    python benchmarks/bench_p2p.py --repeats 5 --json p2p.json

Each run starts the same ping-pong under `gpurun -np 2` with gpucoll, then under
`mpiexec -n 2` with mpi4py; --repeats runs alternate the two. Rank 0 sends NumPy bytes and
waits for them back (blocking Send, then Recv); a run's one-way time is half the median
round trip, after a warm-up. Every round trip is checked outside the timed part (the first
and last bytes carry the iteration's number, and the whole buffer is compared after the
last one); #wrong counts the round trips that came back wrong. The table gives each time's
median over the runs with its range, gpucoll's bandwidth, and the ratio peer time / gpucoll
time taken run by run (above 1: gpucoll is faster; none on a wrong row). The exit status is
1 when a run was wrong or a library could not run.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from gpucoll.bench import context, summary

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
    a = (np.arange(nbytes) % 251).astype(np.uint8)
    b = np.empty(nbytes, np.uint8)
    n = iters if nbytes <= (64 << 10) else max(10, iters // 20)
    times, wrong = [], 0
    for i in range(n + 10):
        comm.Barrier() if i % 50 == 0 else None
        a[0] = a[-1] = i % 256  # this round trip's stamp
        t0 = time.perf_counter()
        if rank == 0:
            comm.Send(a, peer, 1)
            comm.Recv(b, peer, 1)
        else:
            comm.Recv(b, peer, 1)
            comm.Send(b, peer, 1)
        if i >= 10:
            times.append(time.perf_counter() - t0)
            wrong += int(b[0] != i % 256 or b[-1] != i % 256)  # outside the timed part
    wrong += int(not np.array_equal(a, b))  # the last round trip, every byte
    times.sort()
    out[nbytes] = {"one_way": times[len(times) // 2] / 2, "wrong": wrong}
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
    ap.add_argument("--repeats", type=int, default=3, help="runs of each library, alternating (3)")
    ap.add_argument("--json", help="write the settings, every run and the rows here")
    args = ap.parse_args()
    sizes, s = [], 8
    while s <= args.max:
        sizes.append(s)
        s *= 8
    spec = [",".join(map(str, sizes)), str(args.iters)]
    gpurun = os.path.join(os.path.dirname(sys.executable), "gpurun")
    gpurun = [gpurun] if os.access(gpurun, os.X_OK) else [sys.executable, "-m", "gpucoll.launcher"]
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = mpiexec if os.access(mpiexec, os.X_OK) else shutil.which("mpiexec")
    runs, errors = [], []
    with tempfile.TemporaryDirectory() as tmp:
        prog = os.path.join(tmp, "pingpong.py")
        with open(prog, "w") as f:
            f.write(RANK_PROGRAM)
        for i in range(args.repeats):
            print(f"# run {i + 1}/{args.repeats} ...", file=sys.stderr)
            run_ = {"gpucoll": run([*gpurun, "-np", "2", "--no-tag-output", sys.executable, prog, "gpucoll", *spec])}
            try:
                if mpiexec is None:
                    raise RuntimeError("no mpiexec (pip install '.[test]')")
                run_["mpi"] = run([mpiexec, "--allow-run-as-root", "--oversubscribe", "-n", "2", sys.executable,
                                   prog, "mpi", *spec])
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                errors.append(f"Open MPI: {exc}")
            runs.append(run_)

    print(f"# host point to point, 2 ranks, blocking Send + Recv ping-pong; one-way time = median round trip / 2;"
          f" each time: median [min-max] of {args.repeats} runs; ratio = Open MPI time / gpucoll time, run by run")
    print(f"{'size':>10} {'gpucoll (us)':>24} {'GB/s':>7} {'#wrong':>6} {'Open MPI (us)':>24} {'#wrong':>6}"
          f" {'ratio':>20}")
    rows = []
    for nbytes in sizes:
        ours = [r["gpucoll"][nbytes] for r in runs]
        theirs = [r["mpi"][nbytes] for r in runs if "mpi" in r]
        t = [o["one_way"] * 1e6 for o in ours]
        p = [o["one_way"] * 1e6 for o in theirs]
        wrong, peer_wrong = sum(o["wrong"] for o in ours), sum(o["wrong"] for o in theirs)
        ratios = ([b["one_way"] / a["one_way"] for a, b in zip(ours, theirs)]
                  if len(theirs) == len(ours) and not wrong and not peer_wrong else [])
        row = dict(size=nbytes, gpucoll_us=summary.spread(t), gpucoll_wrong=wrong,
                   mpi_us=summary.spread(p) if p else None, mpi_wrong=peer_wrong if theirs else None,
                   ratio=summary.spread(ratios) if ratios else None)
        rows.append(row)
        mid = row["gpucoll_us"][0]
        print(f"{human(nbytes):>10} {summary.spread_text(t):>24} {nbytes / mid / 1e3:7.3f} {wrong:6d} "
              + (f"{summary.spread_text(p):>24} {peer_wrong:6d}" if p else f"{'-':>24} {'-':>6}")
              + f" {summary.spread_text(ratios) if ratios else '-':>20}")
    for e in errors:
        print(f"# {e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(settings=context.describe(command=" ".join(sys.argv), iters=args.iters, sizes=sizes,
                                                     repeats=args.repeats),
                           rows=rows, runs=[{k: {str(s): v for s, v in r.items()} for k, r in run_.items()}
                                            for run_ in runs]), f, indent=1)
    bad = any(r["gpucoll_wrong"] or r["mpi_wrong"] for r in rows)
    return 1 if bad or errors else 0


if __name__ == "__main__":
    sys.exit(main())
