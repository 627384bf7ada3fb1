"""Print what a program can observe about how it was started, as one JSON line per rank
(for tests/test_warm_start.py, which compares a forked rank with one started anew).

    gpurun -np 2 python rank_state.py ARGS...     prints "STATE {json}"
    gpurun -np 2 python -m rank_state ARGS...     the same, as a module

Pids are reported as how they relate (the rank leads its own session), except the parent's,
which the test compares with gpurun's.
"""
import ctypes
import json
import os
import resource
import signal
import sys

import __main__

PR_GET_PDEATHSIG = 2


def stream(s):
    return {"name": s.name, "fileno": s.fileno(), "encoding": s.encoding, "errors": s.errors, "line_buffering": s.line_buffering,
            "write_through": s.write_through, "buffer": type(s.buffer).__name__, "mode": s.mode,
            "isatty": s.isatty(), "raw": type(getattr(s.buffer, "raw", s.buffer)).__name__}


def handler(h):
    if h in (signal.SIG_DFL, signal.SIG_IGN):
        return signal.Handlers(h).name
    return getattr(h, "__name__", repr(h))


def pdeathsig():
    sig = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(PR_GET_PDEATHSIG, ctypes.byref(sig), 0, 0, 0)
    return sig.value


def open_fds():
    """The fds open now (the one that listed the directory is closed again by then)."""
    def is_open(fd):
        try:
            os.fstat(fd)
            return True
        except OSError:
            return False
    return sorted(fd for fd in map(int, os.listdir("/proc/self/fd")) if is_open(fd))


def main_module():
    return {"names": sorted(k for k in vars(__main__) if k.startswith("__")),
            "name": __main__.__name__, "file": getattr(__main__, "__file__", None),
            "cached": getattr(__main__, "__cached__", "unset"), "package": __main__.__package__,
            "spec": None if __main__.__spec__ is None else __main__.__spec__.name,
            "loader": type(__main__.__loader__).__name__ if not isinstance(__main__.__loader__, type)
            else __main__.__loader__.__name__, "builtins": type(__main__.__builtins__).__name__}


def state():
    import numpy as np  # after it, both kinds of rank have NumPy's thread pool

    return {
        "argv": sys.argv, "orig_argv": sys.orig_argv, "path": sys.path, "cwd": os.getcwd(),
        "environ": dict(os.environ), "main": main_module(), "flags": list(sys.flags),
        "stdin": stream(sys.stdin), "stdout": stream(sys.stdout), "stderr": stream(sys.stderr),
        "stdin_text": sys.stdin.read(), "same_std_objects": [sys.stdout is sys.__stdout__, sys.stderr is sys.__stderr__],
        "session_leader": os.getsid(0) == os.getpid() == os.getpgid(0),
        "parent": os.getppid(),
        "pdeathsig": pdeathsig(), "affinity": sorted(os.sched_getaffinity(0)),
        "signals": {signal.Signals(s).name: handler(signal.getsignal(s)) for s in sorted(signal.valid_signals())
                    if s in signal.Signals.__members__.values() and s not in (signal.SIGKILL, signal.SIGSTOP)},
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "umask": os.umask(os.umask(0)), "fds": open_fds(),
        "threads": len(os.listdir("/proc/self/task")),
        "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
        "numpy_draw": float(np.random.random()), "random_draw": __import__("random").random(),
    }


print("STATE " + json.dumps(state()), flush=True)
