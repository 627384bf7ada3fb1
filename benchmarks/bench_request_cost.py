"""What one nonblocking message costs the CPU: Isend + Irecv + Waitall per message, in ns, through
gpucoll's own API and through gpucoll.MPI (under gpurun), beside mpi4py (under mpiexec).

    python benchmarks/bench_request_cost.py                  # 8 B messages, 5 runs of each
    python benchmarks/bench_request_cost.py --bytes 4096 --repeats 7 --json cost.json
    python benchmarks/bench_request_cost.py --spec alloc     # [MPI.Alloc_mem(n), n, MPI.BYTE] messages

Two ranks of one host, bound a core each. Rank 0 posts a window of 64 Isends, rank 1 as many
Irecvs; each then calls Waitall and drops its list of requests; a barrier separates the windows.
Each rank times its own three steps with perf_counter, and each cell is the median over the
windows (500 per run) divided by 64: where the time goes on each side, per message:

  post   the Isend (rank 0) or Irecv (rank 1) call: reading the message, the request object,
         the native start (a small send is written into the channel here)
  wait   Waitall's share: waiting for the bytes (rank 1), settling each request
  free   dropping the request objects

`message` is the slower rank's post + wait + free: what a window of small messages costs per
message, the inverse of its message rate. gpucoll's two APIs run in one job, window after window
in turn (a shared VM's cores drift by up to 2x between jobs: so both meet the same speeds), mpi4py
in its own; each job runs --repeats times, alternating; a cell is the median of the runs with its
range; ratio = mpi4py's message time / gpucoll's, run by run (above 1: gpucoll costs less); vs
gpucoll = gpucoll.MPI's message time / gpucoll's own API's in the same job (1.10: 10% more).
Messages are checked after each window (#wrong).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_p2p  # noqa: E402 - its launchers and runner
from gpucoll.bench import context, summary  # noqa: E402

RANK_PROGRAM = r'''
import json, sys, time
import numpy as np
libs, nbytes, windows, spec = sys.argv[1].split("+"), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if "mpi4py" in libs:
    from mpi4py import MPI
elif "gpucoll.MPI" in libs or spec != "array":  # MPI's datatypes and Alloc_mem for gpucoll's API too
    from gpucoll import MPI
if "gpucoll" in libs:
    import gpucoll


def api(lib):
    if lib == "gpucoll":
        return gpucoll.COMM_WORLD, gpucoll.Request.Waitall
    return MPI.COMM_WORLD, MPI.Request.Waitall


apis = [api(lib) for lib in libs]   # several: their windows alternate, in one job
rank = apis[0][0].Get_rank()
peer, W, pc = 1 - rank, 64, time.perf_counter
if spec == "alloc":  # as mpi4py's demos write messages: views a and b to stamp and check
    amem, bmem = MPI.Alloc_mem(nbytes), MPI.Alloc_mem(nbytes)
    a, b = np.frombuffer(amem, np.uint8), np.frombuffer(bmem, np.uint8)
    A, B = [amem, nbytes, MPI.BYTE], [bmem, nbytes, MPI.BYTE]
elif spec == "bytearray":
    amem, bmem = bytearray(nbytes), bytearray(nbytes)
    a, b = np.frombuffer(amem, np.uint8), np.frombuffer(bmem, np.uint8)
    A, B = amem, bmem
else:  # array, or pair: [array, MPI.BYTE]
    a, b = np.zeros(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    A, B = ([a, MPI.BYTE], [b, MPI.BYTE]) if spec == "pair" else (a, b)
a[:] = np.arange(nbytes) % 251
times = [([], [], []) for _ in apis]
wrong = [0 for _ in apis]
for i in range(windows + 20):
    for k, (comm, Waitall) in enumerate(apis):
        comm.Barrier()
        stamp = (i * len(apis) + k) % 256
        a[0] = stamp
        t0 = pc()
        if rank == 0:
            reqs = [comm.Isend(A, peer, 2) for _ in range(W)]
        else:
            reqs = [comm.Irecv(B, peer, 2) for _ in range(W)]
        t1 = pc()
        Waitall(reqs)
        t2 = pc()
        del reqs
        t3 = pc()
        if i >= 20:
            post, wait, free = times[k]
            post.append(t1 - t0); wait.append(t2 - t1); free.append(t3 - t2)
            wrong[k] += rank == 1 and int(b[0]) != stamp
wrong[-1] += rank == 1 and not bool((a[1:] == b[1:]).all())
med = lambda x: sorted(x)[len(x) // 2] * 1e9 / W
mine = [{"post": med(p), "wait": med(w), "free": med(f), "wrong": int(n)} for (p, w, f), n in zip(times, wrong)]
both = apis[0][0].gather(mine, root=0)
if rank == 0:
    sys.stdout.write("RESULT " + json.dumps({str(k): [r[k] for r in both] for k in range(len(apis))}) + "\n")
'''

LIBS = ("gpucoll", "gpucoll.MPI", "mpi4py")
FORMS = {"array": "a NumPy array", "alloc": "[MPI.Alloc_mem(n), n, MPI.BYTE], as mpi4py's demos write it",
         "pair": "[array, MPI.BYTE]", "bytearray": "a bytearray"}
STEPS = ("post", "wait", "free")


def message_ns(ranks):
    """The slower rank's cost per message."""
    return max(sum(r[s] for s in STEPS) for r in ranks)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes", type=int, default=8, help="message size (8)")
    ap.add_argument("--windows", type=int, default=500, help="windows of 64 messages per run (500)")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each library, alternating (5)")
    ap.add_argument("--spec", choices=tuple(FORMS), default="array",
                    help="how a message is written: " + "; ".join(f"{k}: {v}" for k, v in FORMS.items()))
    ap.add_argument("--json", help="write the settings, every run and the rows here")
    args = ap.parse_args()

    import shutil
    import tempfile

    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = mpiexec if os.access(mpiexec, os.X_OK) else shutil.which("mpiexec")
    gpurun, mpirun, env = bench_p2p._launchers(None, mpiexec)
    runs = {lib: [] for lib in LIBS}
    with tempfile.TemporaryDirectory() as tmp:
        prog = os.path.join(tmp, "cost_rank.py")
        with open(prog, "w") as f:
            f.write(RANK_PROGRAM)
        spec = [str(args.bytes), str(args.windows), args.spec]
        # gpucoll's two APIs in one job, their windows alternating: both meet the same core speeds
        # (on a shared VM they drift by 2x between jobs), so their ratio is read run by run
        jobs = [("gpucoll", "gpucoll.MPI")]
        if mpirun is not None:
            jobs.append(("mpi4py",))
        for rep in range(args.repeats):
            print(f"# run {rep + 1}/{args.repeats} ...", flush=True)
            for job in jobs:
                launcher = mpirun if job == ("mpi4py",) else gpurun
                got = bench_p2p.run([*launcher, sys.executable, prog, "+".join(job), *spec], env=env)
                for k, lib in enumerate(job):
                    runs[lib].append(got[k])

    peer = runs["mpi4py"]
    print(f"\n# per message: Isend + Irecv + Waitall, {args.bytes}-byte messages, each {FORMS[args.spec]}, in "
          f"windows of 64, 2 ranks of one host; ns, median [min-max] of {args.repeats} runs; ratio: mpi4py's message time / this one's, run by run")
    print(f"{'API':>12} {'post (send)':>12} {'wait (send)':>12} {'free (send)':>12} {'post (recv)':>12} "
          f"{'wait (recv)':>12} {'free (recv)':>12} {'message':>18} {'#wrong':>6} {'ratio':>18} {'vs gpucoll':>18}")
    rows = []
    for lib in LIBS:
        mine = runs[lib]
        if not mine:
            continue
        cells = {f"{s}_{side}": summary.spread([r[i][s] for r in mine])
                 for i, side in ((0, "send"), (1, "recv")) for s in STEPS}
        message = [message_ns(r) for r in mine]
        wrong = sum(x["wrong"] for r in mine for x in r)
        ratios = [message_ns(p) / m for p, m in zip(peer, message)] if len(peer) == len(message) else []
        own = runs["gpucoll"]  # gpucoll.MPI's time over gpucoll's own, in the same job
        over = [m / message_ns(o) for o, m in zip(own, message)] if lib == "gpucoll.MPI" and own else []
        row = dict(api=lib, message=summary.spread(message), wrong=wrong,
                   ratio=summary.spread(ratios) if ratios else None,
                   over_own=summary.spread(over) if over else None, **cells)
        rows.append(row)
        parts = [f"{cells[f'{s}_{side}'][0]:12.0f}" for side in ("send", "recv") for s in STEPS]
        print(f"{lib:>12} {' '.join(parts)} {summary.spread_text(message, '{:.0f}'):>18} {wrong:6d} "
              f"{summary.spread_text(ratios) if ratios else '-':>18} {summary.spread_text(over) if over else '-':>18}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(settings=context.describe(command=" ".join(sys.argv), bytes=args.bytes, spec=args.spec,
                                                     windows=args.windows, repeats=args.repeats),
                           runs=runs, rows=rows), f, indent=1)
    return 1 if any(r["wrong"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
