"""Shared helpers for the tests that start real jobs with gpurun.

    def test_something(gpurun_job):
        job = gpurun_job(4, "coll_cases.py", "--cases", path, env={"GPUCOLL_ALGO": "ring"})
        job.check()                       # exit code 0, else fail showing the job's output
        assert "SUMMARY" in job.stdout

Rank scripts live in tests/scripts/; a bare file name is looked up there. Every job runs
with a wall-clock limit (the subprocess timeout, and gpurun's own --timeout a little
earlier, so a hung job still ends with gpurun's report of which ranks were running).

A test that needs a piece of the machine (a GPU, Slurm, MPICH, ...) skips through one helper,
so that GPUCOLL_TEST_REQUIRE can turn the skip into a failure where the piece must be there:

    @requires("gpu", None if have_gpu else "needs a CUDA GPU and CuPy")   # a mark
    def test_x(): ...
    unavailable("slurm", "no Slurm node is up")      # inside a test or fixture: skip, or fail

    GPUCOLL_TEST_REQUIRE=slurm,mpich,multihost make test     # those skips now fail
"""
import glob
import json
import os
import subprocess
import sys
import time

import pytest

from gpucoll.base import config
from gpucoll.base.errors import ConfigError

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")
_CONSOLE = os.path.join(os.path.dirname(sys.executable), "gpurun")
# The installed console script when there is one (what users run), else the same code.
GPURUN = [_CONSOLE] if os.access(_CONSOLE, os.X_OK) else [sys.executable, "-m", "gpucoll.launcher"]

# Variables of the test runner's own environment that would change what a job does.
_SCRUB = ("GPUCOLL_ALGO", "GPUCOLL_SHM_DISABLE", "GPUCOLL_DEBUG", "GPUCOLL_DEBUG_SUBSYS", "GPUCOLL_DEBUG_FILE",
          "GPUCOLL_DEBUG_CHECKS", "GPUCOLL_TIMEOUT", "GPUCOLL_BUFFSIZE", "GPUCOLL_RANK", "GPUCOLL_SIZE",
          "GPUCOLL_STORE", "GPUCOLL_BOOTSTRAP", "GPUCOLL_NET", "GPUCOLL_OFI_PROVIDER", "GPUCOLL_OFI_RMA_MIN")


class Job:
    """The outcome of one gpurun run."""

    def __init__(self, args, returncode, stdout, stderr, seconds):
        self.args, self.returncode, self.stdout, self.stderr, self.seconds = args, returncode, stdout, stderr, seconds

    def lines(self, rank=None, stream="stdout"):
        """Output lines without their "[rank] " tag; only rank's when rank is given."""
        out = []
        for line in getattr(self, stream).splitlines():
            if line.startswith("[") and "] " in line:
                tag, rest = line.split("] ", 1)
                if rank is None or tag[1:] == str(rank):
                    out.append(rest)
            elif rank is None:
                out.append(line)
        return out

    def tagged(self, prefix, stream="stdout"):
        """{rank: [rest of line]} for the lines that start with `prefix` after the tag."""
        found = {}
        for line in getattr(self, stream).splitlines():
            if line.startswith("[") and "] " in line:
                tag, rest = line.split("] ", 1)
                if rest.startswith(prefix) and tag[1:].isdigit():
                    found.setdefault(int(tag[1:]), []).append(rest[len(prefix):].strip())
        return found

    def json_lines(self, prefix="RESULT "):
        """{rank: parsed JSON} of each rank's single `prefix{json}` line."""
        return {r: json.loads(v[-1]) for r, v in self.tagged(prefix).items()}

    def describe(self, limit=6000):
        return (f"gpurun {' '.join(self.args)}\nexit code {self.returncode} after {self.seconds:.1f} s\n"
                f"--- stdout (tail) ---\n{self.stdout[-limit:]}\n--- stderr (tail) ---\n{self.stderr[-limit:]}")

    def check(self):
        assert self.returncode == 0, self.describe()
        return self


def run_job(np_, script, *args, env=None, timeout=60, launcher_args=()):
    """Run `gpurun -np np_ [launcher_args] python SCRIPT ARGS` to its end and return a Job.

    `env` adds variables to the job's environment (every rank inherits them). `timeout`
    bounds the whole job: gpurun's --timeout ends it a little before the subprocess limit."""
    path = script if os.path.isabs(script) else os.path.join(SCRIPTS, script)
    full_env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    full_env["PYTHONDONTWRITEBYTECODE"] = "1"
    full_env.update({k: str(v) for k, v in (env or {}).items()})
    cmd = [str(a) for a in (*GPURUN, "-np", np_, "--timeout", max(1, timeout - 5), *launcher_args,
                            sys.executable, path, *args)]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"gpurun did not end within {timeout} s: {' '.join(cmd)}\n"
                    f"stdout: {exc.stdout!r:.3000}\nstderr: {exc.stderr!r:.3000}")
    return Job(cmd, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


@pytest.fixture
def no_leftover_segments():
    """Fails the test if it leaves a gpucoll segment in /dev/shm."""
    before = set(glob.glob("/dev/shm/gpucoll-*"))
    yield
    left = set(glob.glob("/dev/shm/gpucoll-*")) - before
    assert not left, f"shared-memory segments left behind: {sorted(left)}"


@pytest.fixture
def gpurun_job():
    """run_job, as a fixture: gpurun_job(np, script, *args, env=..., timeout=...) -> Job."""
    return run_job


# --- skips that GPUCOLL_TEST_REQUIRE turns into failures ------------------------------------------
# The pieces a test may find missing, and what provides them.
PIECES = {
    "gpu": "a CUDA GPU and CuPy (make test-gpu on a GPU machine)",
    "mpi4py": "mpi4py and Open MPI's mpiexec in this Python (pip install '.[test]'), and mpi4py's release "
              "(its test suite and demos) from PyPI",
    "mpich": "MPICH and mpi4py in .venv-mpich (scripts/setup-test-system.sh)",
    "slurm": "a running single-node Slurm (scripts/setup-test-system.sh, as root)",
    "pmix": "Slurm's pmix plugin and libpmix (scripts/setup-test-system.sh, as root)",
    "multihost": "network namespaces: root, iproute2 (scripts/setup-test-system.sh)",
    "sshd": "openssh-server and openssh-client (scripts/setup-test-system.sh, as root)",
    "torch": "torch (a CPU build is enough), for the gloo comparisons",
    "ofi": "libfabric: gpucoll built with its headers and libfabric.so.1 loadable (make install adds Debian's "
           "libfabric-dev as root where apt exists)",
}
_ALIASES = {"netns": "multihost"}
REQUIRE_VAR = config.TEST_REQUIRE.name
# The variable's declaration lists the names it accepts; each must be a piece or an alias of one.
assert set(config.TEST_REQUIRE.choices) == set(PIECES) | set(_ALIASES)


def required_pieces(environ=None):
    """The pieces GPUCOLL_TEST_REQUIRE names (a comma list); a name it does not declare is an error."""
    try:
        names = config.TEST_REQUIRE.get(environ)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    return frozenset(_ALIASES.get(name, name) for name in names)


def unavailable(piece, reason):
    """Skip the calling test because `piece` is missing, or fail it when GPUCOLL_TEST_REQUIRE
    names that piece (the machine was meant to have it: a skip would hide a broken set-up)."""
    if piece not in PIECES:
        raise ValueError(f"unknown piece {piece!r}; add it to conftest.PIECES")
    if piece in required_pieces():
        pytest.fail(f"{reason}\n{REQUIRE_VAR} requires {piece} ({PIECES[piece]}), so this is a failure, "
                    "not a skip", pytrace=False)
    pytest.skip(reason)


def requires(piece, reason, broken=None):
    """A mark: the test runs when `reason` is None, else unavailable(piece, reason) at set-up.
    `broken` (a message) fails the test whatever GPUCOLL_TEST_REQUIRE says: the piece is
    there but does not work, which no skip may hide."""
    return pytest.mark.requires(piece, reason, broken)


def pytest_configure(config):
    config.addinivalue_line("markers", "requires(piece, reason, broken): skip (or fail, when GPUCOLL_TEST_REQUIRE "
                                       "names the piece) with the reason unless it is None")
    required_pieces()  # a typo in the variable stops the run at once


def pytest_runtest_setup(item):
    for mark in item.iter_markers("requires"):
        piece, reason, broken = mark.args
        if broken:
            pytest.fail(f"{broken} ({PIECES[piece]})", pytrace=False)
        if reason is not None:
            unavailable(piece, reason)


def ofi_missing():
    """None when the OFI transport can run here, else why not."""
    try:
        from gpucoll.transports.net import ofi_module

        ofi_module()
    except Exception as exc:  # ImportError (built without the headers), OfiUnavailable (no library)
        return str(exc)
    return None


# --- mpi4py's release (its test suite and demos), fetched from PyPI once --------------------------
@pytest.fixture(scope="session")
def mpi4py_release():
    """The folder holding test/, demo/ and src/mpi4py of the mpi4py release that
    tests/mpi4py_suite/fetch.py downloads (once, checked by its SHA-256); unavailable("mpi4py")
    when it cannot be fetched."""
    import importlib.util

    path = os.path.join(HERE, "mpi4py_suite", "fetch.py")
    spec = importlib.util.spec_from_file_location("mpi4py_suite_fetch", path)
    fetch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch)
    try:
        return fetch.fetch()
    except (OSError, SystemExit) as exc:
        unavailable("mpi4py", f"cannot fetch mpi4py's release (test suite and demos) from PyPI: {exc}")
