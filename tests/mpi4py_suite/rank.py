"""One rank's run of one module of mpi4py's test suite, recorded as JSON.

    cd <suite>/test && python rank.py OUTDIR MODULE
    cd <suite>/test && python rank.py OUTDIR '*'      (import every test module; run nothing)

Loads MODULE with unittest (as the suite's own main.py does: CuPy and Numba arrays off) and
runs it, writing OUTDIR/MODULE.<rank>.json after every test, so that a job stopped by its
time limit still says which test it was in (and, with MPI4PY_SUITE_STACKS_AFTER=S, prints every
thread's stack after S seconds: where a job that is about to hit its limit is). The outcome of a test with subtests is its worst
subtest's. Errors are split by cause: NotImplementedError (a feature the MPI module says it
lacks) or anything else.

Under the shim, the few tests in NOT_APPLICABLE do not run and are recorded as "n/a": they test
the files of mpi4py's compiled build (its C headers, its extension module as a shared library
that links an MPI library), which a pure-Python `mpi4py.MPI` does not have; they test no MPI API.
"""
import faulthandler
import importlib
import json
import os
import sys
import time
import traceback
import unittest


def _world_rank():
    for name in ("GPUCOLL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


NOT_APPLICABLE = {
    "test_package.TestDataFiles.testHeaders": "the C headers Cython generates for the compiled mpi4py.MPI",
    "test_package.TestMPIABI.testFinder": "the compiled mpi4py.MPI extension module file",
    "test_package.TestMPIABI.testGetFromLibMPI": "mpi4py.MPI's file dlopen'ed as the MPI library",
    "test_package.TestMPIABI.testLibMPI": "mpi4py.MPI's file dlopen'ed as the MPI library",
}

_WORSE = {"pass": 0, "n/a": 1, "skip": 1, "xfail": 1, "xpass": 2, "fail": 3, "notimpl": 4, "error": 5}


class Recorder(unittest.TestResult):
    """Outcome per test id, written out after every test."""

    def __init__(self, path, module):
        super().__init__()
        self.path, self.module = path, module
        self.outcomes = {}   # test id -> outcome
        self.details = {}    # test id -> first lines of the failure
        self.current = None
        self.started = time.monotonic()
        self.seconds = {}    # test id -> seconds it ran
        self.import_error = None

    def _set(self, test, outcome, err=None):
        tid = test.id()
        if _WORSE[outcome] >= _WORSE.get(self.outcomes.get(tid), -1):
            self.outcomes[tid] = outcome
            if err is not None:
                self.details[tid] = "".join(traceback.format_exception(*err)).strip().splitlines()[-12:]

    def _error_kind(self, err):
        return "notimpl" if issubclass(err[0], NotImplementedError) else "error"

    def startTest(self, test):
        super().startTest(test)
        self.current = test.id()
        self.outcomes.setdefault(test.id(), "pass")
        self.test_started = time.monotonic()
        self.write()

    def stopTest(self, test):
        super().stopTest(test)
        self.seconds[test.id()] = round(time.monotonic() - self.test_started, 3)
        self.current = None
        self.write()

    def addError(self, test, err):
        super().addError(test, err)
        self._set(test, self._error_kind(err), err)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._set(test, "fail", err)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._set(test, "skip")
        self.details[test.id()] = [f"skipped: {reason}"]

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._set(test, "xfail")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._set(test, "xpass")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            kind = "fail" if issubclass(err[0], test.failureException) else self._error_kind(err)
            self._set(test, kind, err)

    def not_applicable(self, tid, reason):
        self.outcomes[tid] = "n/a"
        self.details[tid] = [f"not applicable under the shim: tests {reason}"]

    def write(self, finished=False):
        counts = {}
        for outcome in self.outcomes.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        data = {"module": self.module, "rank": _world_rank(), "finished": finished,
                "imported": self.import_error is None, "import_error": self.import_error,
                "current": self.current, "seconds": round(time.monotonic() - self.started, 2),
                "run": len(self.outcomes), "counts": counts, "outcomes": self.outcomes,
                "details": self.details, "test_seconds": self.seconds}
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.path)


def import_all(outdir):
    """Import every test module in one process; record which failed and why."""
    failed = {}
    modules = sorted(f[:-3] for f in os.listdir(".") if f.startswith("test_") and f.endswith(".py"))
    for module in modules:
        try:
            importlib.import_module(module)
        except BaseException as exc:  # noqa: BLE001 - recorded
            failed[module] = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-500:]
    with open(os.path.join(outdir, f"*.{_world_rank()}.json"), "w") as f:
        json.dump({"module": "*", "rank": _world_rank(), "finished": True, "modules": len(modules),
                   "imported": len(modules) - len(failed), "failed": failed}, f)


def _tests(suite):
    for item in suite:
        yield from _tests(item) if isinstance(item, unittest.TestSuite) else [item]


def _without_not_applicable(suite, result):
    kept = unittest.TestSuite()
    for test in _tests(suite):
        if test.id() in NOT_APPLICABLE:
            result.not_applicable(test.id(), NOT_APPLICABLE[test.id()])
        else:
            kept.addTest(test)
    return kept


def _cupy_casts_as_numpy():
    """The suite's CuPy back-end fills its arrays with the Python value as given, which CuPy 14
    under NumPy 2 refuses when it does not fit the type (`OverflowError`: the suite fills unsigned
    receive buffers with -1); its NumPy back-end casts through NumPy first. Give the CuPy back-end
    the NumPy back-end's cast, so that GPU cases test MPI, not that incompatibility. Applied by
    this runner on both sides (gpurun and mpiexec) alike."""
    import numpy
    import arrayimpl
    cls = getattr(arrayimpl, "GPUArrayCuPy", None)
    if cls is None:
        return
    made = cls.__init__

    def cast_then_made(self, arg, typecode, shape=None, *rest, **kw):
        if isinstance(arg, (int, float, complex)):
            made(self, 0, typecode, shape, *rest, **kw)
            self.array.fill(numpy.asarray(arg).astype(typecode))
        else:
            if isinstance(arg, (list, tuple, range)):
                arg = numpy.asarray(arg).astype(typecode)
            made(self, arg, typecode, shape, *rest, **kw)
    cls.__init__ = cast_then_made


def main():
    outdir, module = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.getcwd())
    if not os.environ.get("MPI4PY_SUITE_CUPY"):  # the suite's main.py default: no GPU array backends
        sys.modules["cupy"] = None
    sys.modules["numba"] = None
    if module == "*":
        import_all(outdir)
        return
    result = Recorder(os.path.join(outdir, f"{module}.{_world_rank()}.json"), module)
    if os.environ.get("MPI4PY_SUITE_STACKS_AFTER"):  # a job about to hit its time limit shows where it is
        faulthandler.dump_traceback_later(float(os.environ["MPI4PY_SUITE_STACKS_AFTER"]))
    try:
        __import__("mpi4py.MPI")
        if os.environ.get("MPI4PY_SUITE_CUPY"):
            _cupy_casts_as_numpy()
        suite = unittest.defaultTestLoader.loadTestsFromModule(importlib.import_module(module))
        if os.environ.get("MPI4PY_SUITE_SRC"):  # under the shim, not the real mpi4py
            suite = _without_not_applicable(suite, result)
    except BaseException as exc:  # noqa: BLE001 - recorded, as the suite's own discovery does
        result.import_error = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]
        result.write(finished=True)
        return
    suite.run(result)
    result.write(finished=True)


if __name__ == "__main__":
    main()
