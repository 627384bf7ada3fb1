"""How long MPI's Spawn takes to return: gpucoll.MPI under gpurun beside mpi4py under mpiexec.

    python benchmarks/bench_spawn.py                  # 1 and 4 children, 5 rounds of 5 spawns each
    python benchmarks/bench_spawn.py --children 1 8 --reps 3

One parent process runs the same mpi4py program under each launcher: `COMM_SELF.Spawn` of N
Python children (each imports mpi4py with NumPy, gets its parent, joins a Barrier across the
intercommunicator and disconnects), timed from the call to the return of the Barrier, six times
in a row, the first untimed. Under gpurun, `mpi4py.MPI` is gpucoll.MPI through
gpucoll.mpi4py_alias (the children forked from gpurun's warmed interpreter); under `gpurun
--no-preload` they start as new interpreters; under `mpiexec -n 1` (Open MPI) it is mpi4py, with
Open MPI's default transport selection and with the one mpi4py's suite runs here
(OMPI_MCA_btl=self,vader,tcp, no UCX).
The launchers take turns, one job each per round; the table gives the median time per spawn of
every timed spawn with its range, and the peer's median / gpurun's. A launcher that is missing
or fails is left out with the reason, and the exit status is then 1.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from gpucoll.bench import context
from gpucoll.bench.launchers import beside_python

PARENT = """import sys, time
import numpy
from mpi4py import MPI
n, child = int(sys.argv[1]), sys.argv[2]
times = []
for i in range(6):
    t = time.perf_counter()
    inter = MPI.COMM_SELF.Spawn(sys.executable, [child], n)
    inter.Barrier()
    times.append(time.perf_counter() - t)
    inter.Disconnect()
print("TIMES", MPI.Get_library_version().split()[0], *times[1:])
"""
CHILD = """import numpy
from mpi4py import MPI
parent = MPI.Comm.Get_parent()
parent.Barrier()
parent.Disconnect()
"""


def launchers():
    """{name: (argv prefix, extra env) or the reason it is skipped}."""
    gpurun = beside_python("gpurun")
    gpurun = [gpurun] if gpurun else [sys.executable, "-m", "gpucoll.launcher"]
    alias = subprocess.run([sys.executable, "-m", "gpucoll.mpi4py_alias"], capture_output=True, text=True,
                           check=True).stdout.strip()
    path = os.pathsep.join(p for p in (alias, os.environ.get("PYTHONPATH")) if p)
    out = {"gpurun": ([*gpurun, "-np", "1"], {"PYTHONPATH": path}),
           "gpurun --no-preload": ([*gpurun, "--no-preload", "-np", "1"], {"PYTHONPATH": path})}
    mpiexec = beside_python("mpiexec")
    try:
        import mpi4py  # noqa: F401 - the package only: its MPI module loads in the job
    except ImportError:
        mpiexec = None
    if mpiexec is None:
        out["mpiexec"] = out["mpiexec (shm+tcp)"] = "mpiexec or mpi4py is not installed"
    else:
        env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}
        out["mpiexec"] = ([mpiexec, "-n", "1", "--oversubscribe"], env)
        # The transports mpi4py's suite runs Open MPI with here: its default selection spends about
        # a second of every spawn on this VM.
        out["mpiexec (shm+tcp)"] = ([mpiexec, "-n", "1", "--oversubscribe"],
                                    dict(env, OMPI_MCA_btl="self,vader,tcp", OMPI_MCA_pml="^ucx",
                                         OMPI_MCA_osc="^ucx"))
    return out


def run_once(prefix, env, parent, child, n, timeout):
    """The timed spawns of one job (seconds), and the MPI library's name it printed."""
    proc = subprocess.run([*prefix, sys.executable, parent, str(n), child], env=dict(os.environ, **env),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if "TIMES" in line]
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-6:] or ["(no output)"]
        raise RuntimeError(f"exit code {proc.returncode}:\n    " + "\n    ".join(t[:200] for t in tail))
    fields = lines[-1].split("TIMES", 1)[1].split()
    return [float(x) for x in fields[1:]], fields[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, nargs="+", default=[1, 4], help="children per spawn (1 4)")
    parser.add_argument("--reps", type=int, default=5, help="rounds: jobs of each launcher (5)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one job may take (300)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    jobs, missing, results = launchers(), [], {}
    with tempfile.TemporaryDirectory(prefix="bench-spawn-") as tmp:
        parent, child = os.path.join(tmp, "parent.py"), os.path.join(tmp, "child.py")
        for path, text in ((parent, PARENT), (child, CHILD)):
            with open(path, "w") as f:
                f.write(text)
        for name, job in list(jobs.items()):
            if isinstance(job, str):
                missing.append(f"{name}: {job}")
                del jobs[name]
        for n in args.children:
            times = {name: [] for name in jobs}
            for _ in range(args.reps):
                for name in [x for x in jobs if x in times]:
                    try:
                        got, library = run_once(*jobs[name], parent, child, n, args.timeout)
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:
                        missing.append(f"{name}, {n} children: {exc}")
                        del times[name]
                        continue
                    if name.startswith("mpiexec") == library.lower().startswith("gpucoll"):  # the MPI each must run
                        missing.append(f"{name} ran the wrong MPI module ({library})")
                        del times[name]
                        continue
                    times[name].extend(got)
            results[n] = times
    print(f"# MPI Spawn to return, 1 parent ({context.cpu_model()}, {os.cpu_count()} CPUs)")
    print(f"{'children':>8}  {'launcher':<20} {'median ms':>9}  {'range ms':>15}  {'/ gpurun':>8}  spawns")
    for n, times in results.items():
        base = statistics.median(times["gpurun"]) if times.get("gpurun") else None
        for name, got in times.items():
            if not got:
                continue
            med = statistics.median(got)
            ratio = f"{med / base:.2f}x" if base else "-"
            print(f"{n:>8}  {name:<20} {med * 1e3:>9.1f}  {min(got) * 1e3:>6.1f}-{max(got) * 1e3:<8.1f}  "
                  f"{ratio:>8}  {len(got)}")
    for line in missing:
        print(f"left out: {line}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"context": context.describe(), "results": {str(n): t for n, t in results.items()},
                       "missing": missing}, f, indent=1)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
