"""mpi4py's own test suite under gpurun, with `mpi4py.MPI` mapped to `gpucoll.MPI`.

    python tests/mpi4py_suite/run.py                    # gpurun -np 2, 3 and 4, every module
    python tests/mpi4py_suite/run.py --np 2 --mpi       # the reference: real mpi4py under mpiexec
    python tests/mpi4py_suite/run.py --np 2 -m test_status test_request -v
    python tests/mpi4py_suite/run.py --np 2 --json ours.json --diff ref.json   # what the reference passes and we do not
    python tests/mpi4py_suite/run.py --np 2 --cupy      # GPU buffers too (the suite's CuPy back-end)
    python tests/mpi4py_suite/run.py --np 2 --jobs 6    # six modules at a time (a host with many cores)

The release's test/ folder runs unmodified (tests/mpi4py_suite/fetch.py fetches it). Each
module runs as its own job (a hang or crash costs one module, not the run); the shim in
tests/mpi4py_suite/shim does nothing but make `mpi4py.MPI` be `gpucoll.MPI`. Per rank it
counts the modules that imported and the tests that passed, failed (an assertion), raised
NotImplementedError, raised anything else, were skipped, or are not applicable ("n/a": the four
tests of the compiled mpi4py's own files, rank.py's NOT_APPLICABLE); a module whose job did not
end in time is a hang. `--check` exits 1 on any import failure, failure, other error or hang.
`--diff REF` (a --json of an earlier run, e.g. the reference's) lists, per module, the tests
that passed there and did not pass here, with what they did here.
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fetch  # noqa: E402

OUTCOMES = ("pass", "fail", "notimpl", "error", "skip", "xfail", "xpass", "n/a")


def modules_of(testdir):
    return sorted(f[:-3] for f in os.listdir(testdir) if f.startswith("test_") and f.endswith(".py"))


def module_timeout(args, np_):
    """Seconds a module's job may run: --timeout, stretched by the ranks per core when there are
    more ranks than cores (4 ranks on 2 cores take each core in turns: a slow module is not a hang)."""
    return round(args.timeout * max(1.0, np_ / (os.cpu_count() or 1)))


def _command(args, np_, outdir, module):
    runner = [sys.executable, os.path.join(HERE, "rank.py"), outdir, module]
    if args.mpi:
        mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
        return [mpiexec, "--oversubscribe", "-n", str(np_), *runner]
    gpurun = os.path.join(os.path.dirname(sys.executable), "gpurun")
    launcher = [gpurun] if os.access(gpurun, os.X_OK) else [sys.executable, "-m", "gpucoll.launcher"]
    return [*launcher, "-np", str(np_), "--timeout", str(module_timeout(args, np_)), *runner]


def _environment(args, top, np_):
    # every rank prints its threads' stacks 10 s before the job's time limit (where a hang is)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
               MPI4PY_SUITE_STACKS_AFTER=str(max(5, module_timeout(args, np_) - 10)))
    if args.cupy:  # rank.py lets the suite's CuPy array back-end load (its main.py's --cupy)
        env["MPI4PY_SUITE_CUPY"] = "1"
    if args.mpi:  # the installed mpi4py on Open MPI (run as root in containers: allowed explicitly)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl="self,vader,tcp",
                   OMPI_MCA_osc="^ucx", OMPI_MCA_pml="^ucx")
        return env
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(HERE, "shim"), env.get("PYTHONPATH")) if p)
    env["MPI4PY_SUITE_SRC"] = os.path.join(top, "src", "mpi4py")
    env.setdefault("GPUCOLL_TIMEOUT", str(args.op_timeout))
    return env


def run_module(args, top, np_, module):
    """{rank: record} of one module's job; a rank without a finished record is marked."""
    outdir = tempfile.mkdtemp(prefix="mpi4py-suite-")
    start = time.monotonic()
    try:
        proc = subprocess.run(_command(args, np_, outdir, module), cwd=os.path.join(top, "test"),
                              env=_environment(args, top, np_), capture_output=True, text=True,
                              timeout=module_timeout(args, np_) + 30, stdin=subprocess.DEVNULL)
        code, tail = proc.returncode, (proc.stdout + proc.stderr)[-12000:]
    except subprocess.TimeoutExpired as exc:
        code, tail = "timeout", str(exc.stdout or "")[-12000:]
    records = {}
    for rank in range(np_):
        path = os.path.join(outdir, f"{module}.{rank}.json")
        rec = json.load(open(path)) if os.path.exists(path) else {"module": module, "rank": rank, "run": 0,
                                                                    "counts": {}, "imported": False,
                                                                    "import_error": "no record (did not start)"}
        if not rec.get("finished"):
            rec["hang"] = rec.get("current") or "(before its first test)"
        records[rank] = rec
    shutil.rmtree(outdir, ignore_errors=True)
    bad = any(r.get("hang") for r in records.values())
    return {"module": module, "np": np_, "exit": code, "seconds": round(time.monotonic() - start, 1),
            "ranks": records, "tail": tail if bad else ""}


def totals(results, rank):
    out = {"modules": 0, "imported": 0, "run": 0, "hangs": 0, **{k: 0 for k in OUTCOMES}}
    for res in results:
        rec = res["ranks"].get(rank)
        if rec is None:
            continue
        out["modules"] += 1
        out["imported"] += bool(rec.get("imported"))
        out["hangs"] += bool(rec.get("hang"))
        out["run"] += rec.get("run", 0)
        for k, v in rec.get("counts", {}).items():
            out[k] += v
    return out


def report(results, np_, label, verbose):
    print(f"\n== {label}, {np_} ranks ==")
    header = f"{'rank':>4} {'modules':>8} {'imported':>8} {'tests':>6} " + " ".join(f"{k:>7}" for k in OUTCOMES)
    print(header + f" {'hangs':>5}")
    for rank in range(np_):
        t = totals(results, rank)
        print(f"{rank:>4} {t['modules']:>8} {t['imported']:>8} {t['run']:>6} "
              + " ".join(f"{t[k]:>7}" for k in OUTCOMES) + f" {t['hangs']:>5}")
    for res in results:
        for rank, rec in sorted(res["ranks"].items()):
            problems = []
            if not rec.get("imported"):
                problems.append(f"import: {str(rec.get('import_error')).splitlines()[-1:]}")
            if rec.get("hang"):
                problems.append(f"did not finish (in {rec['hang']})")
            for tid, outcome in sorted(rec.get("outcomes", {}).items()):
                if outcome in ("fail", "error", "xpass") or (verbose and outcome == "notimpl"):
                    why = rec.get("details", {}).get(tid, [""])[-1:]
                    problems.append(f"{outcome}: {tid}: {why[0] if why else ''}")
            if problems and (verbose or rank == 0):
                print(f"-- {res['module']} [rank {rank}]")
                for p in problems:
                    print(f"   {p[:300]}")
        if res["tail"] and verbose:
            print(f"-- {res['module']}: job output (tail)\n{res['tail']}")


def outcomes_of(results, rank=0):
    """{(module, test id): outcome} of one rank of a run's records."""
    out = {}
    for res in results:
        rec = res["ranks"].get(rank, res["ranks"].get(str(rank), {}))
        for tid, outcome in rec.get("outcomes", {}).items():
            out[(res["module"], tid)] = outcome
        if not rec.get("imported", True):
            out[(res["module"], "(import)")] = "error"
    return out


def diff(results, reference_path):
    """Print the tests the reference passed that this run did not pass, grouped by module and by
    what they did here (rank 0 of each run; the reference's own rank count)."""
    with open(reference_path) as f:
        reference = json.load(f)
    np_ref = reference[0]["np"] if reference else None
    ref = outcomes_of([r for r in reference if r["np"] == np_ref])
    nps = sorted({r["np"] for r in results})
    ours = outcomes_of([r for r in results if r["np"] == (np_ref if np_ref in nps else nps[0])])
    ran = {r["module"] for r in results}
    by_module = {}
    for key, outcome in ref.items():
        if key[0] in ran and outcome == "pass" and ours.get(key) != "pass":
            by_module.setdefault(key[0], []).append((key[1], ours.get(key, "not run")))
    print(f"\n== passed in {reference_path} ({sum(o == 'pass' for k, o in ref.items() if k[0] in ran)} in the "
          "modules run here), not here: "
          f"{sum(len(v) for v in by_module.values())} ==")
    for module, tests in sorted(by_module.items(), key=lambda kv: -len(kv[1])):
        kinds = {}
        for _, outcome in tests:
            kinds[outcome] = kinds.get(outcome, 0) + 1
        print(f"{len(tests):>5} {module}: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))


def import_only(args, top):
    ok = True
    for np_ in args.np:
        res = run_module(args, top, np_, "*")
        for rank, rec in sorted(res["ranks"].items()):
            failed = rec.get("failed", {})
            print(f"{np_} ranks, rank {rank}: {rec.get('imported', 0)} of {rec.get('modules', '?')} modules import"
                  + "".join(f"\n   {m}: {why.splitlines()[-1]}" for m, why in sorted(failed.items())))
            ok = ok and rec.get("finished") and not failed
    return 0 if ok or not args.check else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("-m", "--modules", nargs="+", help="only these modules (default: all)")
    ap.add_argument("--mpi", action="store_true", help="real mpi4py under mpiexec (the reference)")
    ap.add_argument("--cupy", action="store_true",
                    help="with the suite's CuPy array back-end (GPU buffers; its main.py's --cupy); Numba's stays off")
    ap.add_argument("--timeout", type=int, default=300,
                    help="seconds per module job (times ranks per core where ranks outnumber cores)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="modules run at once (each its own job of --np ranks; on a host with cores to spare)")
    ap.add_argument("--op-timeout", type=int, default=60, help="GPUCOLL_TIMEOUT of the jobs")
    ap.add_argument("--json", help="write every record here")
    ap.add_argument("--import-only", action="store_true",
                    help="one job per rank count that imports every test module and runs nothing")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 on an import failure, a failure, an error other than NotImplementedError or a hang")
    ap.add_argument("--diff", metavar="REF", help="list what passed in REF (a --json file) and not here")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    top = fetch.fetch()
    modules = args.modules or modules_of(os.path.join(top, "test"))
    label = "mpi4py on MPI (mpiexec)" if args.mpi else "gpucoll.MPI (gpurun)"
    if args.import_only:
        return import_only(args, top)
    everything, ok = [], True
    for np_ in args.np:
        results = []
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            running = [pool.submit(run_module, args, top, np_, module) for module in modules]
            for done in concurrent.futures.as_completed(running):
                res = done.result()
                results.append(res)
                if args.json:  # after every module: a run stopped early still leaves its records
                    with open(args.json, "w") as f:
                        json.dump(everything + results, f, indent=1)
                if args.verbose:
                    t = totals([res], 0)
                    print(f"  {res['module']} np={np_}: {res['seconds']} s, rank 0 {t}", flush=True)
        results.sort(key=lambda res: modules.index(res["module"]))
        report(results, np_, label, args.verbose)
        everything.extend(results)
        for rank in range(np_):
            t = totals(results, rank)
            ok = ok and t["imported"] == t["modules"] and not (t["fail"] or t["error"] or t["xpass"] or t["hangs"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)
    if args.diff:
        diff(everything, args.diff)
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
