"""Host point to point between two ranks of one host: gpucoll beside Open MPI (mpi4py), the OSU set.

    python benchmarks/bench_p2p.py                       # 8 B to 256 MiB, factor 8, 3 runs each
    python benchmarks/bench_p2p.py --repeats 5 --json p2p.json --max 16M
    python benchmarks/bench_p2p.py --gpu                 # also GPU rows (CuPy and 2 GPUs), NCCL beside
    python benchmarks/bench_p2p.py --hosts               # two hosts (network namespaces, root), TCP
    python benchmarks/bench_p2p.py --api mpi             # gpucoll's side through gpucoll.MPI (mpi4py's API)
    python benchmarks/bench_p2p.py --api mpi --spec alloc    # messages [MPI.Alloc_mem(n), n, MPI.BYTE]

Each run starts the same rank program under `gpurun -np 2` with gpucoll, then under
`mpiexec -n 2` with mpi4py; --repeats runs alternate the two. Three tests, as OSU's:

  latency  blocking Send then Recv ping-pong; one-way time = median round trip / 2
  bw       rank 0 starts a window of Isends (64, fewer for large messages), rank 1 as many
           Irecvs; Waitall; rank 1 answers with a 4-byte message; bandwidth = window bytes / time
  bibw     both ranks do both at once (Irecvs, Isends, Waitall): bytes both ways / time
  barrier  a window as in bw (up to 64 KiB), rank 1's answer, then Barrier: its time on the slower rank;
           beside it (row `step`) the whole step, window to the end of the Barrier, on the slower rank

Both libraries' ranks are bound to a core each: gpucoll's by gpurun, Open MPI's by `mpiexec
--bind-to core` (which --oversubscribe alone would turn off). Unbound, a busy machine may put both
ranks on one core, and then every message waits for a context switch; --no-bind starts both
unbound (`--bind-to none`).

--hosts puts one rank on each of two hosts made of network namespaces joined by a veth pair
(tests/netns.py, as benchmarks/bench_multihost.py): gpurun starts its agents with `--launcher
local --launcher-cmd 'scripts/netns-exec.sh {host}'` (gpucoll's TCP channel), mpiexec its daemons
through scripts/netns-rsh.sh with `--mca btl tcp,self` over eth0 (Open MPI's TCP). Both hosts
share this machine's cores, so the rank program binds both libraries' ranks, one core each
(mpiexec would bind each host's rank to the same first core).

Every message is checked outside the timed part (the first and last bytes carry the iteration's
number; the whole buffer after the last iteration); #wrong counts the messages that came back
wrong. Each cell is the median over the runs with its range; ratio = Open MPI time / gpucoll time
(latency) or gpucoll bandwidth / Open MPI's (bw, bibw), taken run by run: above 1 gpucoll is
faster (none on a wrong row). The exit status is 1 when a run was wrong or a library could not run.
"""
import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

from gpucoll.bench import context, summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RANK_PROGRAM = r'''
import json, sys, time
import numpy as np
lib, sizes, iters, tests = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3]), sys.argv[4]
gpu = lib.endswith("-gpu")
if lib.startswith("mpi"):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    Waitall = MPI.Request.Waitall
elif lib == "gpucoll.MPI":  # the mpi4py-compatible module: what a script written for mpi4py runs on
    from gpucoll import MPI
    comm = MPI.COMM_WORLD
    Waitall = MPI.Request.Waitall
else:
    import gpucoll
    comm = gpucoll.COMM_WORLD
    Waitall = gpucoll.Request.Waitall
rank = comm.Get_rank()
# --spec=alloc: messages written as mpi4py's demos write them, [MPI.Alloc_mem(n), n, MPI.BYTE]
alloc = "--spec=alloc" in sys.argv
if "--bind-all" in sys.argv:  # two hosts on one machine: one core each, whatever the launchers do
    import os
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
peer = 1 - rank
xp = np
if gpu:
    import cupy as cp
    cp.cuda.Device(rank).use()
    xp = cp
    if lib.startswith("mpi"):  # NCCL send/recv through CuPy is the peer on GPUs
        from cupy.cuda import nccl
        uid = comm.bcast(nccl.get_unique_id() if rank == 0 else None, root=0)
        nc = nccl.NcclCommunicator(2, uid, rank)
        stream = cp.cuda.Stream.null
        def Send(a, dest, tag):
            nc.send(a.data.ptr, a.nbytes, nccl.NCCL_CHAR, dest, stream.ptr)
        def Recv(b, src, tag):
            nc.recv(b.data.ptr, b.nbytes, nccl.NCCL_CHAR, src, stream.ptr)
            stream.synchronize()
if not (gpu and lib.startswith("mpi")):
    def Send(a, dest, tag):
        comm.Send(a, dest, tag)
    def Recv(b, src, tag):
        comm.Recv(b, src, tag)
        if gpu:
            cp.cuda.Stream.null.synchronize()

def stamp(a, i):
    a[0] = a[-1] = i % 256

def stamped(b, i):
    return int(b[0]) == i % 256 and int(b[-1]) == i % 256

def window(nbytes):
    return max(1, min(64, (64 << 20) // nbytes))

out = {}
for nbytes in sizes:
    if alloc:
        amem, bmem = MPI.Alloc_mem(nbytes), MPI.Alloc_mem(nbytes)
        a, b = np.frombuffer(amem, np.uint8), np.frombuffer(bmem, np.uint8)  # views, to stamp and check
        a[:] = np.arange(nbytes) % 251
        A, B = [amem, nbytes, MPI.BYTE], [bmem, nbytes, MPI.BYTE]
    else:
        a = (xp.arange(nbytes) % 251).astype(xp.uint8)
        b = xp.empty(nbytes, xp.uint8)
        A, B = a, b
    small = nbytes <= (64 << 10)
    n = iters if small else max(10, iters // 20 if nbytes <= (16 << 20) else 4)
    res = {}
    if "latency" in tests:
        times, wrong = [], 0
        for i in range(n + 10):
            comm.Barrier() if i % 50 == 0 else None
            stamp(a, i)
            t0 = time.perf_counter()
            if rank == 0:
                Send(A, peer, 1)
                Recv(B, peer, 1)
            else:
                Recv(B, peer, 1)
                Send(B, peer, 1)
            if i >= 10:
                times.append(time.perf_counter() - t0)
                wrong += int(not stamped(b, i))  # outside the timed part
        wrong += int(not bool((a == b).all()))  # the last round trip, every byte
        times.sort()
        res["latency"] = {"t": times[len(times) // 2] / 2, "wrong": wrong}
    if not gpu and ("bw" in tests or "bibw" in tests):
        w = window(nbytes)
        ack = np.zeros(4, np.uint8)
        reps = max(3, n // w)
        for test in ("bw", "bibw"):
            if test not in tests:
                continue
            times, wrong = [], 0
            for i in range(reps + 2):
                comm.Barrier()
                stamp(a, i)
                t0 = time.perf_counter()
                reqs = []
                if rank == 1 or test == "bibw":
                    reqs += [comm.Irecv(B, peer, 2) for _ in range(w)]
                if rank == 0 or test == "bibw":
                    reqs += [comm.Isend(A, peer, 2) for _ in range(w)]
                Waitall(reqs)
                if rank == 1:
                    comm.Send(ack, peer, 3)
                else:
                    comm.Recv(ack, peer, 3)
                if i >= 2:
                    times.append(time.perf_counter() - t0)
                    if rank == 1 or test == "bibw":
                        wrong += int(not stamped(b, i))
            if rank == 1 or test == "bibw":
                wrong += int(not bool((a == b).all()))
            times.sort()
            moved = w * nbytes * (2 if test == "bibw" else 1)
            res[test] = {"t": times[len(times) // 2], "gbps": moved / times[len(times) // 2] / 1e9, "wrong": wrong}
    if not gpu and "barrier" in tests and small:
        # a 2-rank Barrier right after a window (rank 0 Isends, rank 1 Irecvs, Waitall, rank 1's
        # 4-byte answer): the slower rank's median, as a user's timing of the step would see it;
        # one sample per window, so at least 200 of them (the spread is wide on both sides)
        w = window(nbytes)
        ack = np.zeros(4, np.uint8)
        times, steps = [], []
        for i in range(max(200, n // w) + 2):
            t_step = time.perf_counter()  # the previous barrier lined both ranks up here
            if rank == 1:
                Waitall([comm.Irecv(B, peer, 2) for _ in range(w)])
            else:
                Waitall([comm.Isend(A, peer, 2) for _ in range(w)])
            comm.Send(ack, peer, 3) if rank == 1 else comm.Recv(ack, peer, 3)
            t0 = time.perf_counter()
            comm.Barrier()
            if i >= 2:
                t1 = time.perf_counter()
                times.append(t1 - t0)
                steps.append(t1 - t_step)
        times.sort()
        steps.sort()
        res["barrier"] = {"t": times[len(times) // 2], "wrong": 0}
        res["step"] = {"t": steps[len(steps) // 2], "wrong": 0}
    out[nbytes] = res
everything = comm.gather(out, root=0)
if rank == 0:
    merged = {}
    for nbytes in sizes:  # the wrong counts of both ranks
        r0, r1 = everything[0][nbytes], everything[1][nbytes]
        merged[nbytes] = {k: dict(v, wrong=v["wrong"] + r1[k]["wrong"]) for k, v in r0.items()}
        for timed in ("barrier", "step"):  # the slower rank's
            if timed in merged[nbytes]:
                merged[nbytes][timed]["t"] = max(r0[timed]["t"], r1[timed]["t"])
    sys.stdout.write("RESULT " + json.dumps(merged) + "\n")
'''


def run(argv, env=None):
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200, env=env, stdin=subprocess.DEVNULL)
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


def size(text):
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * mult


def table(title, runs, sizes, test, ours, peer, peer_name, repeats):
    """Print and return the rows of one test."""
    latency = test in ("latency", "barrier", "step")
    unit = "us" if latency else "GB/s"
    print(f"\n# {title}; each cell: median [min-max] of {repeats} runs; ratio: "
          + ("peer time / gpucoll time" if latency else "gpucoll bandwidth / peer bandwidth") + ", run by run")
    print(f"{'size':>10} {'gpucoll (' + unit + ')':>24} {'#wrong':>6} {peer_name + ' (' + unit + ')':>24} "
          f"{'#wrong':>6} {'ratio':>20}")
    rows = []
    for nbytes in sizes:
        mine = [r[ours][nbytes][test] for r in runs if test in r[ours].get(nbytes, {})]
        theirs = [r[peer][nbytes][test] for r in runs if peer in r and test in r[peer].get(nbytes, {})]
        if not mine:
            continue
        value = (lambda o: o["t"] * 1e6) if latency else (lambda o: o["gbps"])
        t, p = [value(o) for o in mine], [value(o) for o in theirs]
        wrong, peer_wrong = sum(o["wrong"] for o in mine), sum(o["wrong"] for o in theirs)
        ratios = ([(b / a if latency else a / b) for a, b in zip(t, p)]
                  if len(p) == len(t) and not wrong and not peer_wrong else [])
        row = dict(size=nbytes, test=test, gpucoll=summary.spread(t), gpucoll_wrong=wrong,
                   peer=summary.spread(p) if p else None, peer_wrong=peer_wrong if theirs else None,
                   ratio=summary.spread(ratios) if ratios else None)
        rows.append(row)
        print(f"{human(nbytes):>10} {summary.spread_text(t):>24} {wrong:6d} "
              + (f"{summary.spread_text(p):>24} {peer_wrong:6d}" if p else f"{'-':>24} {'-':>6}")
              + f" {summary.spread_text(ratios) if ratios else '-':>20}")
    return rows


def _gpus():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, no device
        return 0


@contextlib.contextmanager
def _place(two_hosts):
    """The two network-namespace hosts of --hosts (tests/netns.py), or None: one host."""
    if not two_hosts:
        yield None
        return
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from netns import TestHosts, missing_requirement

    why = missing_requirement()
    if why:
        sys.exit(f"bench_p2p --hosts: {why}")
    with TestHosts(2, tag="gcp2p") as hosts:
        yield hosts


def _launchers(hosts, mpiexec, bind=True):
    """(gpurun's argv, mpiexec's argv, environment): two ranks of this host, or one on each of hosts."""
    bindir = os.path.dirname(sys.executable)
    gpurun = os.path.join(bindir, "gpurun")
    gpurun = [gpurun] if os.access(gpurun, os.X_OK) else [sys.executable, "-m", "gpucoll.launcher"]
    if hosts is None:
        return ([*gpurun, "-np", "2", "--no-tag-output", *([] if bind else ["--bind-to", "none"])],
                [mpiexec, "--allow-run-as-root", "--oversubscribe", "--bind-to", "core" if bind else "none", "-n", "2"],
                None)
    from netns import NSEXEC

    a, b = hosts.names
    env = dict(os.environ, PATH=f"{bindir}:{os.environ.get('PATH', '')}", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("GPUCOLL_SOCKET_IFNAME", None)
    ours = [*gpurun, "--hosts", f"{a},{b}", "--launcher", "local", "--launcher-cmd", f"{NSEXEC} {{host}}",
            "--no-tag-output"]
    peer = [mpiexec, "--host", f"{a}:1,{b}:1", "-n", "2", "--prtemca", "plm_ssh_agent",
            os.path.join(ROOT, "scripts", "netns-rsh.sh"), "--prtemca", "oob_tcp_if_include", "eth0",
            "--mca", "btl_tcp_if_include", "eth0", "--mca", "btl", "tcp,self", "--bind-to", "none"]
    return hosts.command(0, ours), hosts.command(0, peer) if mpiexec else None, env


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000, help="round trips per size up to 64 KiB")
    ap.add_argument("--min", type=size, default=8, help="smallest message (8)")
    ap.add_argument("--max", type=size, default=256 << 20, help="largest message (256M)")
    ap.add_argument("--step", type=int, default=8, help="each size this many times the one before (8)")
    ap.add_argument("--tests", default="latency,bw,bibw,barrier", help="which of latency,bw,bibw,barrier (all)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each library, alternating (3)")
    ap.add_argument("--gpu", action="store_true", help="also GPU rows (latency; CuPy and 2 GPUs), NCCL beside")
    ap.add_argument("--no-bind", action="store_true", help="leave both libraries' ranks unbound (--bind-to none)")
    ap.add_argument("--hosts", action="store_true", help="one rank on each of two network-namespace hosts (root): "
                    "gpucoll's TCP channel beside Open MPI's TCP")
    ap.add_argument("--api", choices=("native", "mpi"), default="native",
                    help="gpucoll's side through its own API (native) or through gpucoll.MPI (mpi)")
    ap.add_argument("--spec", choices=("array", "alloc"), default="array",
                    help="messages as NumPy arrays, or as mpi4py's demos write them: [MPI.Alloc_mem(n), n, "
                         "MPI.BYTE] (both libraries; needs --api mpi)")
    ap.add_argument("--json", help="write the settings, every run and the rows here")
    args = ap.parse_args()
    sizes, s = [], args.min
    while s <= args.max:
        sizes.append(s)
        s *= max(2, args.step)
    if sizes[-1] != args.max and args.max > args.min:
        sizes.append(args.max)
    spec = [",".join(map(str, sizes)), str(args.iters), args.tests]
    spec += ["--bind-all"] if args.hosts else []
    if args.spec == "alloc":
        if args.api != "mpi" or args.gpu:
            ap.error("--spec alloc is mpi4py's API on host memory: use it with --api mpi, without --gpu")
        spec.append("--spec=alloc")
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = mpiexec if os.access(mpiexec, os.X_OK) else shutil.which("mpiexec")
    if args.gpu and (args.hosts or _gpus() < 2):
        print("# --gpu: no GPU rows: they need CuPy and 2 GPUs of one host", file=sys.stderr)
        args.gpu = False
    mine = "gpucoll.MPI" if args.api == "mpi" else "gpucoll"
    libs = [(mine, "mpi")] + ([("gpucoll-gpu", "mpi-gpu")] if args.gpu else [])
    runs, errors = [], []
    with tempfile.TemporaryDirectory() as tmp, _place(args.hosts) as hosts:
        prog = os.path.join(tmp, "osu.py")
        with open(prog, "w") as f:
            f.write(RANK_PROGRAM)
        ours_cmd, peer_cmd, env = _launchers(hosts, mpiexec, bind=not args.no_bind)
        for i in range(args.repeats):
            print(f"# run {i + 1}/{args.repeats} ...", file=sys.stderr)
            run_ = {}
            for ours, peer in libs:
                run_[ours] = run([*ours_cmd, sys.executable, prog, ours, *spec], env)
                try:
                    if mpiexec is None:
                        raise RuntimeError("no mpiexec (pip install '.[test]')")
                    run_[peer] = run([*peer_cmd, sys.executable, prog, peer, *spec], env)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    errors.append(f"{peer}: {exc}")
            runs.append(run_)

    rows = []
    names = {"latency": "one-way time (blocking Send + Recv ping-pong / 2)",
             "bw": "bandwidth (a window of Isends, one way)", "bibw": "bidirectional bandwidth (windows both ways)",
             "barrier": "a 2-rank Barrier right after a window of this size (the slower rank's time)",
             "step": "the whole step of the barrier test: window, answer and Barrier (the slower rank's time)"}
    where = ("point to point between 2 hosts (network namespaces + veth, TCP)" if args.hosts
             else "host point to point, 2 ranks of one host")
    tests = args.tests.split(",")
    tests += ["step"] if "barrier" in tests else []
    for test in tests:
        how = " through gpucoll.MPI" if args.api == "mpi" else ""
        how += ", messages [MPI.Alloc_mem(n), n, MPI.BYTE]" if args.spec == "alloc" else ""
        rows += table(f"{where}{how}: {names[test]}", runs, sizes,
                      test, mine, "mpi",
                      "Open MPI TCP" if args.hosts else "Open MPI", args.repeats)
    if args.gpu:
        rows += table("GPU point to point, 2 GPUs: one-way time", runs, sizes, "latency", "gpucoll-gpu", "mpi-gpu",
                      "NCCL", args.repeats)
    for e in errors:
        print(f"# {e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(settings=context.describe(command=" ".join(sys.argv), iters=args.iters, sizes=sizes,
                                                     tests=args.tests, repeats=args.repeats, bind=not args.no_bind,
                                                     api=args.api, spec=args.spec,
                                                     hosts=2 if args.hosts else 1),
                           rows=rows, runs=[{k: {str(s): v for s, v in r.items()} for k, r in run_.items()}
                                            for run_ in runs]), f, indent=1)
    bad = any(r["gpucoll_wrong"] or r["peer_wrong"] for r in rows)
    return 1 if bad or errors else 0


if __name__ == "__main__":
    sys.exit(main())
