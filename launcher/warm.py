"""Warmed start: ranks forked from an interpreter that has imported NumPy and gpucoll once.

A rank of a Python program spends most of its start importing: the interpreter, NumPy,
gpucoll. gpurun (and each host's agent) does that once, in its own interpreter, while it
has one thread and no CUDA, and forks every rank from it; the child then becomes the
program exactly as `python PROGRAM` would start it (warm_child.py). Under srun or mpiexec
nothing changes, and anything that is not a Python program run by gpurun's own
interpreter is exec'd as before.

A job starts plain (exec) instead, and --verbose says why, when a fork could not be
told apart from a fresh start: the interpreter was given options, the ranks' environment
changes a variable Python reads at start-up (PYTHON*, LANG, LC_*), or a module imported
here started a thread or initialised CUDA (a fork after either can deadlock or corrupt).
"""
import gc
import os
import shutil
import signal
import sys

from .report import EXIT_CANNOT_RUN, EXIT_PRELOAD
from .spawn import LaunchError, Rank, bind, parent_death_arm
from .warm_child import Program, become_program

#: What every gpucoll rank imports on its way to COMM_WORLD and its first calls.
DEFAULT_PRELOAD = ("numpy", "gpucoll", "gpucoll.api.comm", "gpucoll.bootstrap.store", "gpucoll.transports.tcp",
                   "gpucoll.transports.shm_direct", "gpucoll.engines.p2p.host", "gpucoll.MPI")
#: Read when they are used, not at start-up (PYTHONUNBUFFERED shapes the new stdio).
_READ_LATER = ("PYTHONUNBUFFERED", "PYTHONBREAKPOINT")
_BLAS_ENV = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def program_of(argv):
    """The Program that `argv` runs when gpurun's own interpreter runs it with no options of
    its own (`python script.py`, `-m module`, `-c code`); else None."""
    if len(argv) < 2 or not _is_this_python(argv[0]):
        return None
    flag, rest = argv[1], argv[2:]
    if flag in ("-m", "-c"):
        return Program("module" if flag == "-m" else "code", rest[0], rest[1:]) if rest else None
    if flag.startswith("-") or not _plain_source(flag):
        return None
    return Program("file", flag, rest)


def _plain_source(path):
    """A script a fork can run: a regular file of source (a zip application, a directory with
    __main__.py or a missing file is left to the interpreter's own start)."""
    if not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as f:
            return f.read(4) != b"PK\x03\x04"
    except OSError:
        return False


def _is_this_python(exe):
    """Whether `exe` is the interpreter running gpurun: the same file, in the same directory
    (a virtual environment's python and the one it links to are different interpreters)."""
    path = exe if os.sep in exe else shutil.which(exe)
    if path is None:
        return False
    here = os.path.dirname(os.path.abspath(sys.executable))
    return os.path.dirname(os.path.abspath(path)) == here and os.path.realpath(path) == os.path.realpath(sys.executable)


def startup_mismatch(env):
    """The first variable Python reads at start-up whose value for the ranks differs from
    gpurun's own (a fork would start with gpurun's), or None."""
    for name in sorted(set(env) | set(os.environ)):
        if name.startswith(("PYTHON", "LC_")) or name == "LANG":
            if name not in _READ_LATER and env.get(name) != os.environ.get(name):
                return name
    return None


def own_options():
    """The options gpurun's interpreter was started with (`python -X importtime -m ...`), which
    a fresh rank would not have; [] for the console script or a plain `python -m`."""
    argv = list(getattr(sys, "orig_argv", []))[1:]
    opts = []
    for arg in argv:
        if not arg.startswith("-") or arg in ("-m", "-c"):
            break
        opts.append(arg)
    return opts


class WarmInterpreter:
    """This interpreter, with the preloaded modules, ready to fork ranks of `program`."""

    def __init__(self, program, modules, blas):
        self.program = program
        self.modules = modules
        self._blas = blas

    def blas_for(self, env, cpus):
        """What sizes the BLAS pool of a rank with `env` on `cpus` as a fresh import would (or None)."""
        return None if self._blas is None else (lambda: self._blas(env, cpus))

    def start(self, rank, env, stdin_inherit=False, die_with_parent=True, cpus=None, inbox=None):
        """Fork rank `rank` (as spawn.start_rank would start it) and return its Rank."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        arm = parent_death_arm() if die_with_parent else None
        blas = self.blas_for(env, cpus)

        def setup():
            os.setsid()
            if arm is not None:
                arm()
            bind(cpus)
            if inbox is not None:
                inbox.reset_in_child()
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

        sys.stdout.flush()
        sys.stderr.flush()
        # Signals wait until the child has put back its handlers: gpurun's would write into
        # gpurun's own wakeup pipe.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            pid = os.fork()
        except OSError as exc:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            raise LaunchError(f"cannot start rank {rank}: fork failed: {exc.strerror}", EXIT_CANNOT_RUN) from None
        if pid == 0:
            become_program(self.program, env, (None if not stdin_inherit else 0, out_w, err_w), setup, blas)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(out_w)
        os.close(err_w)
        return Rank(rank, ForkedProcess(pid, os.fdopen(out_r, "rb", buffering=0), os.fdopen(err_r, "rb", buffering=0)))


class ForkedProcess:
    """The part of subprocess.Popen that a Rank uses, for a forked child."""

    def __init__(self, pid, stdout, stderr):
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self):
        while self.returncode is None:
            self._reap(0)
        return self.returncode

    def _reap(self, flags):
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped already: nothing more can be known
            self.returncode = 255
            return
        if pid:
            self.returncode = os.waitstatus_to_exitcode(status)


def prepare(argv, preload=None, env=None, note=None):
    """A WarmInterpreter for `argv`, or None when the ranks must start plain.

    preload: modules to import besides DEFAULT_PRELOAD (the --preload option); False for
    none at all (--no-preload). env: one rank's environment (they differ only in gpucoll's
    rank variables). note(text) hears why a job starts plain. A --preload module that
    cannot be imported is a LaunchError: the job would fail in every rank."""
    def plain(why):
        if note is not None:
            note(f"ranks start as new processes: {why}")
        return None

    if preload is False:
        return plain("--no-preload")
    program = program_of(argv)
    if program is None:
        return None  # not a Python program of this interpreter: exec'd, nothing to say
    if not sys.platform.startswith("linux"):
        return plain("forking ranks is done on Linux only")
    if own_options():
        return plain(f"gpurun's interpreter was started with {' '.join(own_options())}")
    changed = startup_mismatch(env or {})
    if changed:
        return plain(f"the ranks' {changed} differs from gpurun's (Python reads it at start-up)")
    loaded, why = _preload(list(preload or ()))
    if why:
        return plain(why)
    gc.freeze()  # objects made so far are never collected in a rank: their pages stay shared
    return WarmInterpreter(program, loaded, _blas_sizer())


def _preload(extra):
    """Import DEFAULT_PRELOAD and `extra`; (modules, None), or (modules, why not to fork)."""
    loaded = []
    for name in DEFAULT_PRELOAD + tuple(extra):
        try:
            if name == "numpy" and "numpy" not in sys.modules:
                _import_numpy_without_blas_threads()
            else:
                __import__(name)
        except Exception as exc:
            if name in extra:
                raise LaunchError(f"--preload {name}: cannot import it ({type(exc).__name__}: {exc}); "
                                  "leave it out or install it", EXIT_PRELOAD) from None
            return loaded, f"{name} could not be imported here ({type(exc).__name__}: {exc})"
        loaded.append(name)
        unsafe = _unsafe_to_fork()
        if unsafe:
            return loaded, f"importing {name} {unsafe}, after which a fork is unsafe"
    return loaded, None


def _import_numpy_without_blas_threads():
    """Import NumPy with a BLAS pool of one thread, so that gpurun stays single-threaded;
    each rank grows its pool to what its own import would have made (_blas_sizer)."""
    before = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        if before is None:
            del os.environ["OPENBLAS_NUM_THREADS"]
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = before


def _unsafe_to_fork():
    """Why this process cannot fork safely now (a thread runs, CUDA is initialised), or None."""
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:
        return f"started {threads - 1} thread(s)"
    if _cuda_initialised():
        return "initialised CUDA"
    return None


def _mapped(fragment):
    """Paths of the shared libraries mapped into this process whose name holds `fragment`."""
    found = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(" ", 5)[-1].strip()
                if fragment in os.path.basename(path) and path not in found:
                    found.append(path)
    except OSError:
        pass
    return found


def _cuda_initialised():
    """Whether the CUDA driver is loaded and initialised (cuDeviceGetCount answers
    CUDA_ERROR_NOT_INITIALIZED, 3, before cuInit, and initialises nothing)."""
    libs = _mapped("libcuda.so")
    if not libs:
        return False
    import ctypes

    try:
        count = ctypes.c_int()
        return ctypes.CDLL(libs[0]).cuDeviceGetCount(ctypes.byref(count)) != 3
    except (OSError, AttributeError):
        return False


def _blas_sizer():
    """A function(env, cpus) that sets the BLAS pool of a forked rank to the size its own
    import of NumPy would choose (OpenBLAS: OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or
    OMP_NUM_THREADS, at most the CPUs the rank may use); None without OpenBLAS."""
    libs = _mapped("openblas")
    if not libs:
        return None
    import ctypes

    try:
        lib = ctypes.CDLL(libs[0])
    except OSError:
        return None
    for symbol in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                   "openblas_set_num_threads64_", "openblas_set_num_threads"):
        setter = getattr(lib, symbol, None)
        if setter is not None:
            break
    else:
        return None

    def size_pool(env, cpus):
        usable = len(cpus) if cpus is not None else len(os.sched_getaffinity(0))
        asked = next((n for n in (_leading_int(env.get(v)) for v in _BLAS_ENV) if n > 0), usable)
        setter(ctypes.c_int(min(asked, usable)))
    return size_pool


def _leading_int(text):
    """OpenBLAS reads its variables with atoi: '4,2' is 4, '' and 'x' are 0."""
    digits = ""
    for ch in (text or "").strip():
        if not ch.isdigit():
            break
        digits += ch
    return int(digits) if digits else 0
