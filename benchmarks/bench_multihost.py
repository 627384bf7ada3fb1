"""Allreduce across two hosts: gpucoll (gpurun) beside Open MPI (mpiexec), same hosts, same run.

The hosts are two network namespaces joined by a veth pair (tests/netns.py), each with its
own host name; the job starts on host a. gpurun starts its agents with
`--launcher local --launcher-cmd 'scripts/netns-exec.sh {host}'`; Open MPI's mpiexec
starts its daemons with `--prtemca plm_ssh_agent scripts/netns-rsh.sh`, both over eth0.
Layouts: 1 rank per host and 2 ranks per host; float32 SUM in place, 1 KiB to 256 MiB.
--repeats runs (3) alternate the two libraries; each cell is the median over the runs with
its range, the ratio is taken run by run. Every rank checks every size: the buffer is set
to ones after the warm-up, so after k timed calls each element must be exactly nranks**k
(the number of calls is kept below float32's overflow). A wrong size shows no ratio, and
the exit status is 1 when anything was wrong or a run failed. Needs root (namespaces) and
mpi4py + Open MPI in this interpreter's environment.

    python benchmarks/bench_multihost.py [--min 1K] [--max 256M] [--repeats 3] [--json out.json]
"""
import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))


def _size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.upper().rstrip("B").rstrip("I")
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def _human(n):
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n // scale}{unit}"
    return str(n)


def rank_side(lib, lo, hi):
    """Runs in every rank: time each size, rank 0 prints one JSON line per size."""
    import numpy as np

    if lib == "mpi":
        from mpi4py import MPI
        comm, inplace = MPI.COMM_WORLD, MPI.IN_PLACE
        rank, size = comm.Get_rank(), comm.Get_size()
        wtime = MPI.Wtime
    else:
        import gpucoll
        comm, inplace = gpucoll.COMM_WORLD, gpucoll.IN_PLACE
        rank, size = comm.rank, comm.size
        wtime = time.perf_counter
    # ones summed in place k times over `size` ranks: size**k, kept well inside float32
    most = int(100 / math.log2(size)) if size > 1 else 50
    n = lo
    while n <= hi:
        x = np.ones(n // 4, np.float32)
        iters = max(3, min(50, most, (64 << 20) // n))
        for _ in range(2):
            comm.Allreduce(inplace, x)
        x[:] = 1
        comm.Barrier()
        t0 = wtime()
        for _ in range(iters):
            comm.Allreduce(inplace, x)
        comm.Barrier()
        dt = (wtime() - t0) / iters
        # Every rank checks every element of the timed calls' output; the wrong ones are summed.
        expect = np.float32(float(size) ** iters)
        mine = np.array([np.count_nonzero(~np.isclose(x, expect, rtol=1e-6 * iters, atol=0))], np.int64)
        wrong = np.zeros(1, np.int64)
        comm.Allreduce(mine, wrong)
        if rank == 0:
            print("TIMING " + json.dumps({"bytes": n, "us": dt * 1e6, "wrong": int(wrong[0])}), flush=True)
        n *= 4


def run(cmd, env, timeout=900):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)
    rows = {}
    for line in proc.stdout.splitlines():
        if "TIMING " in line:
            rec = json.loads(line.split("TIMING ", 1)[1])
            rows[rec["bytes"]] = rec
    if proc.returncode != 0 or not rows:
        sys.stderr.write(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}\n")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min", default="1K")
    ap.add_argument("--max", default="256M")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each library and layout, alternating (3)")
    ap.add_argument("--json")
    ap.add_argument("--rank-side", choices=("gpucoll", "mpi"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    lo, hi = _size(args.min), _size(args.max)
    if args.rank_side:
        return rank_side(args.rank_side, lo, hi)

    from netns import NSEXEC, TestHosts, missing_requirement

    from gpucoll.bench import context, summary

    why = missing_requirement()
    if why:
        sys.exit(f"bench_multihost: {why}")
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ.get('PATH', '')}", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONDONTWRITEBYTECODE="1")
    me = [sys.executable, os.path.abspath(__file__), "--min", args.min, "--max", args.max, "--rank-side"]
    rsh = os.path.join(ROOT, "scripts", "netns-rsh.sh")
    runs = []  # per repeat: {(per, lib): {bytes: record}}
    with TestHosts(2, tag="gcbench") as hosts:
        a, b = hosts.names
        for i in range(args.repeats):
            print(f"# run {i + 1}/{args.repeats} ...", file=sys.stderr)
            results = {}
            for per in (1, 2):
                spec = f"{a}:{per},{b}:{per}"
                gpurun = [os.path.join(bindir, "gpurun"), "--hosts", spec, "--launcher", "local",
                          "--launcher-cmd", f"{NSEXEC} {{host}}", *me, "gpucoll"]
                mpiexec = [os.path.join(bindir, "mpiexec"), "--host", spec, "-n", str(2 * per),
                           "--prtemca", "plm_ssh_agent", rsh, "--prtemca", "oob_tcp_if_include", "eth0",
                           "--mca", "btl_tcp_if_include", "eth0", "--mca", "btl", "tcp,self,sm", *me, "mpi"]
                results[(per, "gpucoll")] = run(hosts.command(0, gpurun), env)
                results[(per, "mpi")] = run(hosts.command(0, mpiexec), env)
            runs.append(results)

    print(f"# allreduce float32 SUM in place, 2 hosts (network namespaces + veth), "
          f"{datetime.date.today()}, {platform.node()} ({os.cpu_count()} cores, {platform.machine()})")
    print(f"# time in us, median [min-max] of {args.repeats} runs; #wrong: elements wrong over ranks and runs; "
          "ratio = Open MPI time / gpucoll time, run by run (none on a wrong or missing row)")
    records, bad = [], False
    for per in (1, 2):
        print(f"# {per} rank(s) per host x 2 hosts")
        print(f"{'size':>6} {'gpucoll (us)':>30} {'#wrong':>6} {'Open MPI (us)':>30} {'#wrong':>6} {'ratio':>20}")
        n = lo
        while n <= hi:
            g = [r[(per, "gpucoll")].get(n) for r in runs]
            m = [r[(per, "mpi")].get(n) for r in runs]
            complete = all(g) and all(m)
            gw = sum(x["wrong"] for x in g if x)
            mw = sum(x["wrong"] for x in m if x)
            bad = bad or gw > 0 or mw > 0 or not complete
            gt = [x["us"] for x in g if x]
            mt = [x["us"] for x in m if x]
            ratios = [y["us"] / x["us"] for x, y in zip(g, m)] if complete and not gw and not mw else []
            fmt = "{:.1f}"
            print(f"{_human(n):>6} {summary.spread_text(gt, fmt) if gt else '-':>30} {gw:6d} "
                  f"{summary.spread_text(mt, fmt) if mt else '-':>30} {mw:6d} "
                  f"{summary.spread_text(ratios) if ratios else '-':>20}")
            records.append(dict(bytes=n, ranks_per_host=per, gpucoll_us=summary.spread(gt) if gt else None,
                                gpucoll_wrong=gw, ompi_us=summary.spread(mt) if mt else None, ompi_wrong=mw,
                                ratio=summary.spread(ratios) if ratios else None))
            n *= 4
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(settings=context.describe(command=" ".join(sys.argv), min=lo, max=hi, repeats=args.repeats),
                           rows=records), f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
