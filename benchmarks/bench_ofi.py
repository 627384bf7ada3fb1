"""Between two hosts on libfabric: gpucoll over OFI beside gpucoll over its own TCP sockets and
libfabric's own fi_pingpong on the same provider (the floor), same hosts, same run.

The hosts are two network namespaces joined by a veth pair (tests/netns.py), one rank on
each (bench_p2p.py's rank program, gpucoll's API); gpucoll runs once with GPUCOLL_NET=ofi and
once with GPUCOLL_NET=tcp, fi_pingpong (libfabric-bin) with `-e rdm -m tagged` on the same
provider, server on host b, client on host a. Tables:

  one-way time of a blocking ping-pong (fi_pingpong's usec/xfer), 8 B and up;
  ping-pong bandwidth from 1 MiB (bytes / one-way time: what fi_pingpong's MB/sec is);
  all-reduce, float32 SUM in place, 2 hosts x 2 ranks, OFI beside TCP (bench_multihost.py's ranks).

Each cell: median [min-max] of --repeats runs (the three alternate); ratios run by run. Every
gpucoll message and all-reduce result is checked (#wrong). Needs root (namespaces), libfabric's
headers at build time, and fi_pingpong for its column (without it the column stays empty and
the exit status is 1). Without RDMA hardware the provider is libfabric's tcp: the figures say
what the OFI path costs over the kernel's TCP, not what a fabric gives.

    python benchmarks/bench_ofi.py [--provider 'tcp;ofi_rxm'] [--min 8] [--max 16M] [--repeats 3] [--json f]
"""
import argparse
import datetime
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import bench_multihost  # noqa: E402
import bench_p2p  # noqa: E402


def fi_pingpong(hosts, provider, nbytes, iters):
    """One-way microseconds of fi_pingpong between host b (server) and host a, or None."""
    port = str(random.randrange(20000, 60000))
    common = ["fi_pingpong", "-p", provider, "-e", "rdm", "-m", "tagged", "-I", str(iters), "-S", str(nbytes)]
    server = hosts.popen(1, [*common, "-B", port], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(0.3)
        client = hosts.run(0, [*common, "-P", port, hosts.address(1)], timeout=300)
    finally:
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    for line in client.stdout.splitlines():
        cols = line.split()
        if len(cols) == 8 and re.match(r"^\d+[kmg]?$", cols[0]):
            return float(cols[6])
    sys.stderr.write(f"fi_pingpong {nbytes} B: no result ({client.returncode}): {client.stdout[-800:]}"
                     f"{client.stderr[-800:]}\n")
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--provider", default="tcp;ofi_rxm")
    ap.add_argument("--min", type=bench_p2p.size, default=8)
    ap.add_argument("--max", type=bench_p2p.size, default=16 << 20)
    ap.add_argument("--iters", type=int, default=1000, help="round trips per size up to 64 KiB")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    pingpong = shutil.which("fi_pingpong") is not None
    if not pingpong:
        print("bench_ofi: fi_pingpong not found (Debian: libfabric-bin): its column stays empty", file=sys.stderr)
    from netns import NSEXEC, TestHosts, missing_requirement

    from gpucoll.bench import context, summary

    why = missing_requirement()
    if why:
        sys.exit(f"bench_ofi: {why}")
    sizes, s = [], args.min
    while s <= args.max:
        sizes.append(s)
        s *= 8
    spec = [",".join(map(str, sizes)), str(args.iters), "latency", "--bind-all"]
    bindir = os.path.dirname(sys.executable)
    runs, reduce_runs = [], []
    with tempfile.TemporaryDirectory() as tmp, TestHosts(2, tag="gcofi") as hosts:
        prog = os.path.join(tmp, "osu.py")
        with open(prog, "w") as f:
            f.write(bench_p2p.RANK_PROGRAM)
        ours, _, env = bench_p2p._launchers(hosts, None)
        a, b = hosts.names
        me = [sys.executable, os.path.join(HERE, "bench_multihost.py"), "--min", "1K", "--max", "64M",
              "--rank-side", "gpucoll"]
        reduce_cmd = hosts.command(0, [os.path.join(bindir, "gpurun"), "--hosts", f"{a}:2,{b}:2", "--launcher",
                                       "local", "--launcher-cmd", f"{NSEXEC} {{host}}", *me])
        for i in range(args.repeats):
            print(f"# run {i + 1}/{args.repeats} ...", file=sys.stderr)
            run = {}
            for net in ("ofi", "tcp"):
                net_env = dict(env, GPUCOLL_NET=net, GPUCOLL_OFI_PROVIDER=args.provider)
                run[net] = bench_p2p.run([*ours, sys.executable, prog, "gpucoll", *spec], net_env)
            run["fi_pingpong"] = {n: fi_pingpong(hosts, args.provider, n, args.iters if n <= 64 << 10 else 50)
                                  if pingpong else None for n in sizes}
            runs.append(run)
            reduce_runs.append({net: bench_multihost.run(reduce_cmd, dict(env, GPUCOLL_NET=net,
                                                                            GPUCOLL_OFI_PROVIDER=args.provider))
                                for net in ("ofi", "tcp")})

    print(f"# 2 hosts (network namespaces + veth, one core each), provider {args.provider}, "
          f"{datetime.date.today()}, {platform.node()} ({os.cpu_count()} cores, {platform.machine()}); "
          f"median [min-max] of {args.repeats} runs; ratios run by run")
    rows, bad = [], False
    print(f"\n# one-way time (us) of a blocking ping-pong; ratio = other time / gpucoll-OFI time")
    print(f"{'size':>8} {'gpucoll OFI':>22} {'#wrong':>6} {'gpucoll TCP':>22} {'fi_pingpong':>22} "
          f"{'vs TCP':>18} {'vs fi_pingpong':>18}")
    for n in sizes:
        ofi = [r["ofi"][n]["latency"] for r in runs]
        tcp = [r["tcp"][n]["latency"] for r in runs]
        fpp = [r["fi_pingpong"][n] for r in runs]
        wrong = sum(o["wrong"] for o in ofi) + sum(o["wrong"] for o in tcp)
        bad = bad or wrong > 0 or None in fpp
        t_ofi, t_tcp = [o["t"] * 1e6 for o in ofi], [o["t"] * 1e6 for o in tcp]
        vs_tcp = [y / x for x, y in zip(t_ofi, t_tcp)]
        vs_fpp = [y / x for x, y in zip(t_ofi, fpp)] if None not in fpp else []
        row = dict(size=n, ofi_us=summary.spread(t_ofi), tcp_us=summary.spread(t_tcp), wrong=wrong,
                   fi_pingpong_us=summary.spread(fpp) if vs_fpp else None, tcp_over_ofi=summary.spread(vs_tcp),
                   fi_pingpong_over_ofi=summary.spread(vs_fpp) if vs_fpp else None)
        rows.append(row)
        print(f"{bench_p2p.human(n):>8} {summary.spread_text(t_ofi):>22} {wrong:6d} {summary.spread_text(t_tcp):>22} "
              f"{summary.spread_text(fpp) if vs_fpp else '-':>22} {summary.spread_text(vs_tcp):>18} "
              f"{summary.spread_text(vs_fpp) if vs_fpp else '-':>18}")
    print(f"\n# ping-pong bandwidth (GB/s, bytes / one-way time); ratio = gpucoll-OFI / other")
    print(f"{'size':>8} {'gpucoll OFI':>22} {'gpucoll TCP':>22} {'fi_pingpong':>22} {'vs TCP':>18} "
          f"{'vs fi_pingpong':>18}")
    for row in rows:
        n = row["size"]
        if n < 1 << 20:
            continue
        g = lambda us: n / (us * 1e-6) / 1e9  # noqa: E731
        b_ofi = [g(r["ofi"][n]["latency"]["t"] * 1e6) for r in runs]
        b_tcp = [g(r["tcp"][n]["latency"]["t"] * 1e6) for r in runs]
        fpp = [r["fi_pingpong"][n] for r in runs]
        b_fpp = [g(us) for us in fpp] if None not in fpp else []
        print(f"{bench_p2p.human(n):>8} {summary.spread_text(b_ofi):>22} {summary.spread_text(b_tcp):>22} "
              f"{summary.spread_text(b_fpp) if b_fpp else '-':>22} "
              f"{summary.spread_text([x / y for x, y in zip(b_ofi, b_tcp)]):>18} "
              f"{summary.spread_text([x / y for x, y in zip(b_ofi, b_fpp)]) if b_fpp else '-':>18}")
    print(f"\n# all-reduce, float32 SUM in place, 2 hosts x 2 ranks: time (us); ratio = TCP time / OFI time")
    print(f"{'size':>8} {'gpucoll OFI':>22} {'#wrong':>6} {'gpucoll TCP':>22} {'#wrong':>6} {'ratio':>18}")
    reduce_rows = []
    for n in sorted(reduce_runs[0]["ofi"]):
        o = [r["ofi"].get(n) for r in reduce_runs]
        t = [r["tcp"].get(n) for r in reduce_runs]
        if not all(o) or not all(t):
            bad = True
            continue
        ow, tw = sum(x["wrong"] for x in o), sum(x["wrong"] for x in t)
        bad = bad or ow > 0 or tw > 0
        ratio = [y["us"] / x["us"] for x, y in zip(o, t)]
        reduce_rows.append(dict(size=n, ofi_us=summary.spread([x["us"] for x in o]), ofi_wrong=ow,
                                tcp_us=summary.spread([x["us"] for x in t]), tcp_wrong=tw,
                                ratio=summary.spread(ratio)))
        print(f"{bench_p2p.human(n):>8} {summary.spread_text([x['us'] for x in o]):>22} {ow:6d} "
              f"{summary.spread_text([x['us'] for x in t]):>22} {tw:6d} {summary.spread_text(ratio):>18}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(settings=context.describe(command=" ".join(sys.argv), provider=args.provider, sizes=sizes,
                                                     iters=args.iters, repeats=args.repeats),
                           p2p=rows, allreduce=reduce_rows, runs=runs, allreduce_runs=reduce_runs), f, indent=1,
                      default=str)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
