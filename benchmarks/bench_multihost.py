"""Allreduce across two hosts: gpucoll (gpurun) beside Open MPI (mpiexec), same hosts, same run.

The hosts are two network namespaces joined by a veth pair (tests/netns.py), each with its
own host name; the job starts on host a. gpurun starts its agents with
`--launcher local --launcher-cmd 'scripts/netns-exec.sh {host}'`; Open MPI's mpiexec
starts its daemons with `--prtemca plm_ssh_agent scripts/netns-rsh.sh`, both over eth0.
Layouts: 1 rank per host and 2 ranks per host; float32 SUM in place, 1 KiB to 256 MiB.
Needs root (namespaces) and mpi4py + Open MPI in this interpreter's environment.

    python benchmarks/bench_multihost.py [--min 1K] [--max 256M] [--json out.json]
"""
import argparse
import datetime
import json
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
    n = lo
    while n <= hi:
        x = np.ones(n // 4, np.float32)
        iters = max(3, min(50, (64 << 20) // n))
        for _ in range(2):
            comm.Allreduce(inplace, x)
        comm.Barrier()
        t0 = wtime()
        for _ in range(iters):
            comm.Allreduce(inplace, x)
        comm.Barrier()
        dt = (wtime() - t0) / iters
        # Every rank's result is checked: ones summed `2 + iters` times over `size` ranks.
        expect = float(size) ** (2 + iters)
        wrong = int(not np.all(x == np.float32(expect))) if expect < 2 ** 24 else 0
        if rank == 0:
            print("TIMING " + json.dumps({"bytes": n, "us": dt * 1e6, "wrong": wrong}), flush=True)
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
    ap.add_argument("--json")
    ap.add_argument("--rank-side", choices=("gpucoll", "mpi"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    lo, hi = _size(args.min), _size(args.max)
    if args.rank_side:
        return rank_side(args.rank_side, lo, hi)

    from netns import NSEXEC, TestHosts, missing_requirement

    why = missing_requirement()
    if why:
        sys.exit(f"bench_multihost: {why}")
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ.get('PATH', '')}", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONDONTWRITEBYTECODE="1")
    me = [sys.executable, os.path.abspath(__file__), "--min", args.min, "--max", args.max, "--rank-side"]
    rsh = os.path.join(ROOT, "scripts", "netns-rsh.sh")
    results = {}
    with TestHosts(2, tag="gcbench") as hosts:
        a, b = hosts.names
        for per in (1, 2):
            spec = f"{a}:{per},{b}:{per}"
            gpurun = [os.path.join(bindir, "gpurun"), "--hosts", spec, "--launcher", "local",
                      "--launcher-cmd", f"{NSEXEC} {{host}}", *me, "gpucoll"]
            mpiexec = [os.path.join(bindir, "mpiexec"), "--host", spec, "-n", str(2 * per),
                       "--prtemca", "plm_ssh_agent", rsh, "--prtemca", "oob_tcp_if_include", "eth0",
                       "--mca", "btl_tcp_if_include", "eth0", "--mca", "btl", "tcp,self,sm", *me, "mpi"]
            results[(per, "gpucoll")] = run(hosts.command(0, gpurun), env)
            results[(per, "mpi")] = run(hosts.command(0, mpiexec), env)

    print(f"# allreduce float32 SUM in place, 2 hosts (network namespaces + veth), "
          f"{datetime.date.today()}, {platform.node()} ({os.cpu_count()} cores, {platform.machine()})")
    print("# time in us; busbw = 2(p-1)/p * size / time in GB/s; ratio = Open MPI time / gpucoll time")
    head = f"{'size':>6} |"
    for per in (1, 2):
        head += f" {'gpucoll ' + str(per) + 'x2':>12} {'busbw':>6} {'ompi ' + str(per) + 'x2':>12} {'busbw':>6} {'ratio':>5} |"
    print(head)
    n = lo
    records = []
    while n <= hi:
        line = f"{_human(n):>6} |"
        for per in (1, 2):
            p = 2 * per
            g, m = results[(per, "gpucoll")].get(n), results[(per, "mpi")].get(n)
            cells = []
            for rec in (g, m):
                if rec is None:
                    cells += [f"{'-':>12}", f"{'-':>6}"]
                else:
                    bw = 2 * (p - 1) / p * n / (rec["us"] * 1e-6) / 1e9
                    mark = "!" if rec.get("wrong") else ""
                    cells += [f"{rec['us']:>11.1f}{mark or ' '}", f"{bw:>6.2f}"]
            ratio = f"{m['us'] / g['us']:>5.2f}" if g and m else f"{'-':>5}"
            line += f" {' '.join(cells[:2])} {' '.join(cells[2:])} {ratio} |"
            records.append({"bytes": n, "ranks_per_host": per, "gpucoll_us": g and g["us"], "ompi_us": m and m["us"]})
        print(line)
        n *= 4
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
