"""Start-to-exit time of a hello + barrier job: gpurun beside torchrun and mpiexec.

    python benchmarks/bench_launch.py                 # -np 4, 32 and 256, 5 runs each
    python benchmarks/bench_launch.py --np 4 --reps 9
    python benchmarks/bench_launch.py --bare        # the launchers alone: no library, no barrier

Each launcher runs N ranks of the same tiny program in its own library (import, join the
job, print the rank, barrier, exit): gpucoll under `gpurun -np N` (its ranks forked from an
interpreter that has imported NumPy and gpucoll) and `gpurun --no-preload` (each rank a new
interpreter, as other launchers start them), torch.distributed (gloo)
under `torchrun --standalone --nproc-per-node N`, mpi4py under `mpiexec -n N` (Open MPI), and
the same mpi4py program importing NumPy first ("mpiexec+numpy": gpucoll imports NumPy, mpi4py does not).
torchrun runs up to TORCHRUN_MAX ranks (each of its ranks imports torch: minutes on 2 cores beyond).
The launchers take turns: each round runs every one of them once (the first round is an untimed
warm-up), so a slow spell of a shared machine falls on all alike. The table gives the median of
the timed runs with their range (min-max), and how many times longer than gpurun each peer took,
taken round by round (its time / gpurun's time in the same round): median [min-max]. Each run
must print every rank. A launcher that is not installed, or whose run
fails, is left out with the reason, and the exit status is then 1. With --bare every launcher runs a Python
program that only prints its rank, which separates the launcher's own cost from the
library's start-up (imports, joining the job, the barrier).
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from gpucoll.bench import context, summary
from gpucoll.bench.launchers import beside_python

TORCHRUN_MAX = 32
PROGRAMS = {
    "gpurun": "import gpucoll\nc = gpucoll.COMM_WORLD\nprint(c.rank)\nc.Barrier()\n",
    # One write per line: torchrun and mpiexec hand all ranks one shared stdout pipe.
    "torchrun": ("import sys\nimport torch.distributed as dist\n"
                 "dist.init_process_group('gloo')\n"
                 "sys.stdout.write(f'{dist.get_rank()}\\n')\n"
                 "dist.barrier()\n"
                 "dist.destroy_process_group()\n"),
    "mpiexec": ("import sys\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
                "sys.stdout.write(f'{c.Get_rank()}\\n')\nc.Barrier()\n"),
}
# gpucoll imports NumPy (its buffers), mpi4py does not: the same mpi4py job with NumPy loaded
# first, as any mpi4py program with arrays has it, separates that import from the launchers.
PROGRAMS["mpiexec+numpy"] = "import numpy\n" + PROGRAMS["mpiexec"]
PROGRAMS["gpurun --no-preload"] = PROGRAMS["gpurun"]
BARE = ("import os, sys\n"
        "sys.stdout.write((os.environ.get('RANK') or os.environ['OMPI_COMM_WORLD_RANK']) + '\\n')\n")


def launchers(script_dir, bare=False):
    """{name: (argv builder, extra env) or the reason it is skipped}."""
    out = {}
    script = {name: os.path.join(script_dir, f"hello_{name.split()[0]}.py") for name in PROGRAMS}
    for name, text in PROGRAMS.items():
        with open(script[name], "w") as f:
            f.write(BARE if bare else text)

    gpurun = beside_python("gpurun")
    gpurun = [gpurun] if gpurun else [sys.executable, "-m", "gpucoll.launcher"]
    out["gpurun"] = (lambda n: [*gpurun, "-np", str(n), script["gpurun"]], {})
    out["gpurun --no-preload"] = (lambda n: [*gpurun, "--no-preload", "-np", str(n), script["gpurun"]], {})

    if importlib.util.find_spec("torch") is None:
        out["torchrun"] = "torch is not installed (pip install torch==2.13.0)"
    else:
        torchrun = beside_python("torchrun")
        torchrun = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
        out["torchrun"] = (lambda n: [*torchrun, "--standalone", f"--nproc-per-node={n}",
                                      script["torchrun"]], {})

    mpiexec = beside_python("mpiexec")
    if mpiexec is None:
        out["mpiexec"] = "mpiexec is not installed"
    elif importlib.util.find_spec("mpi4py") is None:
        out["mpiexec"] = "mpi4py is not installed"
    else:
        env = {}
        if os.geteuid() == 0:
            env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
        for name in ("mpiexec", "mpiexec+numpy"):
            out[name] = (lambda n, name=name: [mpiexec, "-n", str(n), "--oversubscribe", sys.executable,
                                               script[name]], env)
    if "mpiexec" not in out or isinstance(out["mpiexec"], str):
        out["mpiexec+numpy"] = out["mpiexec"]
    return out


def run_once(argv, env, nprocs, timeout):
    """Seconds from start to exit; raises RuntimeError when the job did not do its work."""
    start = time.perf_counter()
    proc = subprocess.run(argv, env=dict(os.environ, **env), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-6:] or ["(no output)"]
        raise RuntimeError(f"exit code {proc.returncode}:\n    " + "\n    ".join(t[:200] for t in tail))
    ranks = [line.rsplit(" ", 1)[-1] for line in proc.stdout.splitlines() if line.strip()]
    if sorted(ranks, key=lambda r: int(r) if r.isdigit() else -1) != [str(r) for r in range(nprocs)]:
        raise RuntimeError(f"expected ranks 0..{nprocs - 1} to print, got {len(ranks)} lines")
    return took


def measure(jobs, nprocs, reps, timeout, missing):
    """{launcher: [seconds of each timed run]}. Each round runs every launcher once, in turn, so a
    slow spell of a shared machine falls on all of them alike; the first round is a warm-up (page
    cache, .pyc files). A launcher whose run fails is dropped, with the reason added to missing."""
    times = {name: [] for name in jobs}
    for round_ in range(reps + 1):
        for name in [n for n in jobs if n in times]:
            argv, env = jobs[name]
            try:
                took = run_once(argv, env, nprocs, timeout)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                missing.append(f"{name} -np {nprocs}: {exc}")
                del times[name]
                continue
            if round_:
                times[name].append(took)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, nargs="+", default=[4, 32, 256], help="rank counts (4 32 256)")
    parser.add_argument("--reps", type=int, default=5, help="timed rounds per rank count: runs of each launcher (5)")
    parser.add_argument("--only", nargs="+", choices=sorted(PROGRAMS), help="launchers to run")
    parser.add_argument("--bare", action="store_true", help="programs that only print their rank")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one run may take (300)")
    parser.add_argument("--json", help="write the settings and the rows here")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_launch_") as tmp:
        table = launchers(tmp, args.bare)
        # --bare: every program is the same, mpiexec+numpy would be mpiexec again
        names = [n for n in PROGRAMS if (not args.only or n in args.only) and not (args.bare and n == "mpiexec+numpy")]
        missing = []
        for name in names:
            if isinstance(table[name], str):
                missing.append(f"{name}: {table[name]}")
        for nprocs in args.np:
            jobs = {name: (table[name][0](nprocs), table[name][1]) for name in names
                    if not isinstance(table[name], str) and not (name == "torchrun" and nprocs > TORCHRUN_MAX)}
            times = measure(jobs, nprocs, args.reps, args.timeout, missing)
            base = times.get("gpurun")
            for name, runs in times.items():
                # run by run: the peer's k-th run over gpurun's k-th run of the same round
                ratios = [t / b for t, b in zip(runs, base)] if base else None
                rows.append(dict(launcher=name, ranks=nprocs, seconds=summary.spread(runs), runs=runs,
                                 vs_gpurun_runs=ratios))
                print(f"  {name} -np {nprocs}: median {statistics.median(runs):.3f} s", file=sys.stderr)

    print(f"\n{'launcher':<20} {'ranks':>5} {'seconds: median [min-max]':>27} {'x gpurun: median [min-max]':>27}")
    for r in rows:
        ratio_text = summary.spread_text(r["vs_gpurun_runs"]) if r["vs_gpurun_runs"] else "-"
        print(f"{r['launcher']:<20} {r['ranks']:>5} {summary.spread_text(r['runs'], '{:.3f}'):>27} {ratio_text:>27}")
    print(f"\n{'bare programs (launcher cost only)' if args.bare else 'hello + barrier'}: "
          f"{args.reps} rounds after a warm-up round, each running every launcher once in turn; "
          f"'x gpurun' = a launcher's time / gpurun's in the same round (above 1: gpurun is faster). "
          f"{os.cpu_count()} CPUs; torchrun up to {TORCHRUN_MAX} ranks.")
    for m in missing:
        print(f"# left out: {m}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(settings=context.describe(command=" ".join(sys.argv), reps=args.reps, bare=args.bare),
                           rows=rows, left_out=missing), f, indent=1)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
