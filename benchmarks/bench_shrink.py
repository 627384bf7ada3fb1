"""Time from a rank's death to a working shrunk communicator: gpucoll.MPI under
`gpurun --on-failure=continue` beside mpi4py on Open MPI's ULFM (`mpiexec --with-ft ulfm`).

    python benchmarks/bench_shrink.py                 # 4 ranks, 5 jobs each
    python benchmarks/bench_shrink.py --np 8 --jobs 3

The same mpi4py program runs under both launchers (under gpurun, `mpi4py.MPI` is gpucoll.MPI
through gpucoll.mpi4py_alias): a loop of 1,000 all-reduces of 1,000 doubles with ERRORS_RETURN;
one rank writes the time and kills itself with SIGKILL at a step drawn per job; each survivor
catches the error, Revokes, Shrinks and runs one all-reduce on the shrunk communicator (its sum
checked), notes the time, and finishes the loop on it. A job's figure is the time from the kill
to the last survivor's first good all-reduce (one clock: every rank is on this host). The
launchers take turns; the table gives the median and range over the jobs that recovered, Open
MPI's median / gpucoll's, and the jobs that did not recover (a hang past --timeout, a crash),
each listed below the table with its reason. A launcher that is missing is left out with the
reason; the exit status is 1 when anything was left out or failed.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

from gpucoll.bench import context
from gpucoll.bench.launchers import alias_pythonpath, beside_python, gpurun_argv, open_mpi_env

PROGRAM = """import os, signal, sys, time
import numpy as np
from mpi4py import MPI
victim, at, stamp = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
comm = MPI.COMM_WORLD.Dup()
comm.Set_errhandler(MPI.ERRORS_RETURN)
me = MPI.COMM_WORLD.Get_rank()
x = np.empty(1000)
step = 0
while step < 1000:
    if me == victim and step == at:
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    x[:] = 1.0
    try:
        comm.Allreduce(MPI.IN_PLACE, x)
    except MPI.Exception as exc:
        comm.Revoke()
        comm = comm.Shrink()
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        x[:] = 1.0
        comm.Allreduce(MPI.IN_PLACE, x)
        assert (x == comm.Get_size()).all(), x[:4]
        print("RECOVERED", repr(time.time()), exc.Get_error_class(), comm.Get_size(), flush=True)
        continue
    assert (x == comm.Get_size()).all(), x[:4]
    step += 1
print("DONE", MPI.Get_library_version().split()[0], comm.Get_size(), flush=True)
"""


def launchers(nprocs):
    """{name: (argv prefix, extra env) or the reason it is skipped}."""
    out = {"gpucoll (gpurun)": ([*gpurun_argv(), "--on-failure=continue", "-np", str(nprocs)],
                                {"PYTHONPATH": alias_pythonpath()})}
    mpiexec = beside_python("mpiexec")
    try:
        import mpi4py  # noqa: F401 - the package only: its MPI module loads in the job
    except ImportError:
        mpiexec = None
    if mpiexec is None:
        out["Open MPI (ULFM)"] = "mpiexec or mpi4py is not installed"
    else:
        out["Open MPI (ULFM)"] = ([mpiexec, "--with-ft", "ulfm", "--oversubscribe", "-n", str(nprocs)],
                                  open_mpi_env())
    return out


def run_once(prefix, env, program, victim, at, stamp, survivors, timeout):
    """Seconds from the kill to the last survivor's first all-reduce on the shrunk communicator."""
    if os.path.exists(stamp):
        os.unlink(stamp)
    proc = subprocess.run([*prefix, sys.executable, program, str(victim), str(at), stamp],
                          env=dict(os.environ, **env), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)
    recovered = [line.split() for line in proc.stdout.splitlines() if "RECOVERED" in line]
    done = [line for line in proc.stdout.splitlines() if "DONE" in line]
    if len(recovered) != survivors or len(done) != survivors or not os.path.exists(stamp):
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-8:] or ["(no output)"]
        raise RuntimeError(f"exit code {proc.returncode}, {len(recovered)} of {survivors} survivors recovered, "
                           f"{len(done)} finished:\n    " + "\n    ".join(t[:200] for t in tail))
    with open(stamp) as f:
        killed = float(f.read())
    sizes = {int(fields[fields.index("RECOVERED") + 3]) for fields in recovered}
    if sizes != {survivors}:
        raise RuntimeError(f"shrunk communicators of sizes {sorted(sizes)}, not {survivors}")
    return max(float(fields[fields.index("RECOVERED") + 1]) for fields in recovered) - killed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=4, help="ranks (4)")
    parser.add_argument("--jobs", type=int, default=5, help="jobs of each launcher (5)")
    parser.add_argument("--seed", type=int, default=1, help="draws the victim and its step (1)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds one job may take (60)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    jobs, missing = launchers(args.np), []
    times, failed = {}, {}
    for name, job in list(jobs.items()):
        if isinstance(job, str):
            missing.append(f"{name}: {job}")
            del jobs[name]
        else:
            times[name], failed[name] = [], []
    with tempfile.TemporaryDirectory(prefix="bench-shrink-") as tmp:
        program, stamp = os.path.join(tmp, "loop.py"), os.path.join(tmp, "killed")
        with open(program, "w") as f:
            f.write(PROGRAM)
        for _ in range(args.jobs):
            victim, at = rng.randrange(args.np), rng.randrange(50, 950)
            for name in jobs:
                try:
                    times[name].append(run_once(*jobs[name], program, victim, at, stamp, args.np - 1, args.timeout))
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    failed[name].append(f"rank {victim} killed at step {at}: {exc}")
    print(f"# From a rank's SIGKILL to a working shrunk communicator, {args.np} ranks "
          f"({context.cpu_model()}, {os.cpu_count()} CPUs)")
    print(f"{'library':<18} {'median ms':>9}  {'range ms':>15}  {'/ gpucoll':>9}  {'recovered':>9}")
    base = statistics.median(times["gpucoll (gpurun)"]) if times.get("gpucoll (gpurun)") else None
    for name, got in times.items():
        runs = f"{len(got)} of {len(got) + len(failed[name])}"
        if not got:
            print(f"{name:<18} {'-':>9}  {'-':>15}  {'-':>9}  {runs:>9}")
            continue
        med = statistics.median(got)
        ratio = f"{med / base:.2f}x" if base else "-"
        print(f"{name:<18} {med * 1e3:>9.1f}  {min(got) * 1e3:>6.1f}-{max(got) * 1e3:<8.1f}  {ratio:>9}  {runs:>9}")
    for name, reasons in failed.items():
        for reason in reasons:
            print(f"did not recover, {name}: {reason}")
    for line in missing:
        print(f"left out: {line}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"context": context.describe(), "np": args.np, "seconds": times, "failed": failed,
                       "missing": missing}, f, indent=1)
    return 1 if missing or any(failed.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
