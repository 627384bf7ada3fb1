"""The forked side of a warmed start: turn a fork of gpurun into the user's program.

A fresh `python script.py` begins with its own session, process group and stdio, the
environment it was given, `sys.argv`, `sys.path[0]` and a new `__main__`; it ends by
printing an uncaught exception, joining its non-daemon threads, running `atexit` and
flushing its streams, with Python's exit status. `become_program` does each of these in
the child of a fork and never returns: gpurun's own frames below it (its store, its event
loop, its `finally` clauses) must never run in a rank, so the child leaves with `os._exit`.

What a fork cannot give a rank is a new hash seed: strings hash alike on every rank, as
under PYTHONHASHSEED (docs/launcher.md says so).
"""
import atexit
import builtins
import gc
import importlib
import importlib.machinery
import io
import os
import signal
import sys
import threading
import traceback
import types

from gpucoll.base import stacks

# Python's own statuses: an uncaught exception, and stdout that could not be flushed at exit.
EXIT_EXCEPTION = 1
EXIT_FLUSH_FAILED = 120


class Program:
    """What the rank runs, as `python` would be told: a script, `-m module` or `-c code`."""

    def __init__(self, kind, target, args):
        self.kind = kind        # "file", "module" or "code"
        self.target = target    # the script's path, the module's name, the code
        self.args = list(args)

    def argv(self):
        """sys.argv as Python sets it before the program runs (runpy fixes a module's argv[0])."""
        first = {"file": self.target, "module": "-m", "code": "-c"}[self.kind]
        return [first, *self.args]

    def orig_argv(self):
        head = [self.target] if self.kind == "file" else [f"-{self.kind[0]}", self.target]
        return [sys.executable, *head, *self.args]

    def path0(self):
        """sys.path[0] of a fresh interpreter: the script's real directory, the working
        directory for -m, '' for -c."""
        if self.kind == "file":
            return os.path.dirname(os.path.realpath(self.target))
        return os.getcwd() if self.kind == "module" else ""


def become_program(program, env, stdio, setup, blas_threads):
    """In a forked child: set up as a fresh interpreter would be, run `program`, exit.

    stdio: (stdin fd or None for /dev/null, stdout fd, stderr fd); setup: a callable that
    does the launcher's own part (session, parent-death signal, binding, signals);
    blas_threads: a callable that sizes the BLAS pool as a fresh import would, or None."""
    try:
        setup()
        _rebind_stdio(*stdio, unbuffered=bool(env.get("PYTHONUNBUFFERED")))
        os.environ.clear()
        os.environ.update(env)
        stacks.install(env)
        if blas_threads is not None:
            blas_threads()
        _reseed_numpy()
        sys.argv = program.argv()
        sys.orig_argv = program.orig_argv()
        if not sys.flags.safe_path:
            sys.path[0] = program.path0()
        importlib.invalidate_caches()  # files made since gpurun listed the directories
    except BaseException as exc:  # nothing of the program ran: say why, as exec's failure would
        os.write(2, f"gpurun: could not start the rank: {exc!r}\n".encode())
        os._exit(127)
    status = _run(program)
    try:
        code = _finalize(status)
    except BaseException as exc:  # never fall back into gpurun's frames below this one
        os.write(2, f"gpurun: the rank's program ended, but ending its interpreter failed: {exc!r}\n".encode())
        code = EXIT_EXCEPTION
    os._exit(code)


def _rebind_stdio(stdin_fd, stdout_fd, stderr_fd, unbuffered):
    """Put the rank's pipes on fds 0-2, close every other fd gpurun had, and make new
    sys.std* objects shaped as Python makes them at start-up."""
    if stdin_fd is None:
        stdin_fd = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((stdin_fd, 0), (stdout_fd, 1), (stderr_fd, 2)):
        if fd != target:
            os.dup2(fd, target)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.close(fd)
            except OSError:  # the fd of the listing itself, already gone
                pass
    old = sys.__stdout__, sys.__stderr__, sys.__stdin__
    encoding = getattr(old[0], "encoding", None) or "utf-8"
    sys.stdin = sys.__stdin__ = _stream(0, "r", encoding, getattr(old[2], "errors", "strict"), unbuffered)
    sys.stdout = sys.__stdout__ = _stream(1, "w", encoding, getattr(old[0], "errors", "strict"), unbuffered)
    sys.stderr = sys.__stderr__ = _stream(2, "w", encoding, "backslashreplace", unbuffered)


def _stream(fd, mode, encoding, errors, unbuffered):
    """A std stream as CPython's create_stdio builds it: unbuffered output goes straight to
    the fd (stdin stays buffered for read1) and is written through; buffered streams are
    line-buffered on a terminal, and stderr always."""
    raw = io.FileIO(fd, mode + "b", closefd=False)
    raw.name = ("<stdin>", "<stdout>", "<stderr>")[fd]
    if unbuffered and mode == "w":
        buf = raw
    else:
        buf = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
    line = not unbuffered and (raw.isatty() or fd == 2)
    stream = io.TextIOWrapper(buf, encoding=encoding, errors=errors, newline="\n", line_buffering=line,
                              write_through=unbuffered)
    stream.mode = mode
    return stream


def _reseed_numpy():
    """NumPy's global generator was seeded once in gpurun: give each rank fresh entropy,
    as its own import would (Python's `random` reseeds itself at a fork)."""
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()


def _run(program):
    """Run the program in a new __main__; its exit status, or the exception that ended it."""
    main = types.ModuleType("__main__")
    # As CPython's add_main_module makes it; a script or -m then sets the rest.
    main.__builtins__, main.__annotations__ = builtins, {}
    main.__loader__, main.__spec__, main.__package__ = importlib.machinery.BuiltinImporter, None, None
    sys.modules["__main__"] = main
    try:
        if program.kind == "module":
            import runpy

            # What `python -m` itself calls: it runs the module in the existing __main__.
            runpy._run_module_as_main(program.target, alter_argv=True)
        elif program.kind == "code":
            exec(compile(program.target, "<string>", "exec"), main.__dict__)
        else:
            path = os.path.abspath(program.target)
            with open(path, "rb") as f:
                source = f.read()
            main.__file__, main.__cached__ = path, None
            main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
            exec(compile(source, path, "exec"), main.__dict__)
    except SystemExit as exc:
        return exc
    except BaseException as exc:
        return exc
    return 0


def _user_traceback(exc):
    """The traceback from the program's first frame on: this module's frames are gpurun's."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return exc.with_traceback(tb)


def _flush_quietly():
    """What CPython does right after the program's code (pythonrun.c's flush_io)."""
    for stream in (sys.stderr, sys.stdout):
        try:
            stream.flush()
        except Exception:
            pass


def _report(status):
    """Python's exit status for what ended the program (0, a SystemExit or an exception),
    printing what Python prints."""
    if status == 0:
        return 0
    if isinstance(status, SystemExit):
        code = status.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF
        try:
            print(code, file=sys.stderr)
        except Exception:
            pass
        return EXIT_EXCEPTION
    exc = _user_traceback(status)
    try:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    except BaseException as hook_failed:  # as CPython: say so, then the original the default way
        print("Error in sys.excepthook:", file=sys.__stderr__)
        traceback.print_exception(_user_traceback(hook_failed), file=sys.__stderr__)
        print("\nOriginal exception was:", file=sys.__stderr__)
        traceback.print_exception(exc, file=sys.__stderr__)
    return EXIT_EXCEPTION


def _flush_std_files():
    """Py_FinalizeEx's last flush: streams that are gone or closed are skipped; a failure is
    reported and makes the exit status 120 whatever it was."""
    ok = True
    for stream in (sys.stdout, sys.stderr):
        if stream is None or getattr(stream, "closed", False):
            continue
        try:
            stream.flush()
        except Exception:
            ok = False
    return ok


def _flush_open_files():
    """Files the program left open, flushed as their deallocation at CPython's exit would, so
    that no buffered data is lost. (Their __del__ runs there; here it does not, nor do other
    objects' __del__ methods: os._exit keeps gpurun's frames below from running.)"""
    files = (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)
    for obj in gc.get_objects():
        # type(), not isinstance(): that reads obj.__class__, which a program's lazy proxies
        # (CuPy's and torch's among them) may make raise
        if issubclass(type(obj), files):
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except Exception:
                pass


def _finalize(status):
    """End as CPython does: flush what the program wrote, report how it ended, then as
    Py_FinalizeEx: join threads, atexit, flush the files left open, flush the std streams; the
    exit status."""
    _flush_quietly()
    code = _report(status)
    interrupted = isinstance(status, KeyboardInterrupt)
    del status
    try:
        threading._shutdown()  # what the interpreter calls: wait for non-daemon threads
    except KeyboardInterrupt:
        pass
    atexit._run_exitfuncs()
    _flush_open_files()
    if not _flush_std_files():
        code = EXIT_FLUSH_FAILED
    if interrupted:
        # Python ends an uncaught KeyboardInterrupt by SIGINT itself, so the parent sees -SIGINT.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code
