"""Spawned processes forked from gpurun's warmed interpreter, without forking gpurun itself.

When MPI's Spawn asks for processes, gpurun's store thread is running, and a fork of a process
with threads may deadlock in the child. So gpurun forks a helper before that thread starts (and
after NumPy and gpucoll are imported): the zygote, one thread, which waits for requests on a
socket pair. For each spawned process gpurun sends the program, its environment and working
directory, and the write ends of its stdout and stderr pipes (SCM_RIGHTS); the zygote forks a
short-lived middle process, which forks the rank and exits, so that the rank becomes gpurun's
own child (gpurun is the subreaper of its descendants) and gpurun reaps it as any rank. The
rank waits until it is gpurun's child, then sets its parent-death signal against gpurun and
becomes the program as a warmed rank does (warm_child.py).
"""
import json
import os
import signal
import socket
import struct
import time

from .spawn import Rank, parent_death_arm
from .warm import ForkedProcess, program_of, startup_mismatch
from .warm_child import become_program

_PID = struct.Struct("=i")
_MAX_REQUEST = 1 << 20


class Zygote:
    """Fork it while gpurun has one thread: `ready` is the job's warm.WarmInterpreter."""

    def __init__(self, ready, inbox):
        self._ready = ready
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        gpurun = os.getpid()
        arm = parent_death_arm()
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                inbox.reset_in_child()
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # gpurun's terminal group: gpurun decides
                if arm is not None:
                    arm()
                _serve(theirs, ready, gpurun)
            finally:
                os._exit(0)
        theirs.close()
        self.pid = pid
        self._sock = ours

    def start(self, rank, argv, env, cwd=None):
        """Rank `rank` running argv, forked from the zygote; None when argv cannot start so (not a
        Python program of this interpreter, or an environment a fork would not honour)."""
        program = program_of(argv)
        if program is None or startup_mismatch(env) or (cwd and not os.path.isabs(argv[1])):
            return None
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            request = json.dumps({"program": [program.kind, program.target, program.args], "env": env,
                                  "cwd": cwd}).encode()
            socket.send_fds(self._sock, [request], [out_w, err_w])
            reply = self._sock.recv(64)
        finally:
            os.close(out_w)
            os.close(err_w)
        if len(reply) != _PID.size or _PID.unpack(reply)[0] <= 0:
            os.close(out_r)
            os.close(err_r)
            return None
        pid = _PID.unpack(reply)[0]
        return Rank(rank, ForkedProcess(pid, os.fdopen(out_r, "rb", buffering=0), os.fdopen(err_r, "rb", buffering=0)))

    def close(self):
        self._sock.close()  # the zygote's recv ends: it exits
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _serve(sock, ready, gpurun):
    from .warm_child import Program

    while True:
        try:
            request, fds, _, _ = socket.recv_fds(sock, _MAX_REQUEST, 2)
        except OSError:
            return
        if not request:
            return
        req = json.loads(request)
        kind, target, args = req["program"]
        pid = _fork_rank(ready, Program(kind, target, args), req["env"], req["cwd"], fds, gpurun)
        for fd in fds:
            os.close(fd)
        sock.send(_PID.pack(pid))


def _fork_rank(ready, program, env, cwd, fds, gpurun):
    """Fork the rank through a middle process; its pid (0 when that failed)."""
    rfd, wfd = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(rfd)
        try:
            pid = os.fork()
            if pid == 0:
                os.close(wfd)
                _become(ready, program, env, cwd, fds, gpurun)
            os.write(wfd, _PID.pack(pid))
        finally:
            os._exit(0)
    os.close(wfd)
    os.waitpid(middle, 0)
    got = os.read(rfd, _PID.size)
    os.close(rfd)
    return _PID.unpack(got)[0] if len(got) == _PID.size else 0


def _become(ready, program, env, cwd, fds, gpurun):
    deadline = time.monotonic() + 5.0
    while os.getppid() != gpurun:  # the middle process has exited: gpurun, the subreaper, adopts us
        if time.monotonic() > deadline:
            os._exit(127)
        time.sleep(0.0005)
    arm = parent_death_arm(gpurun)  # gpurun is the parent now

    def setup():
        os.setsid()
        if arm is not None:
            arm()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if cwd:
            os.chdir(cwd)

    become_program(program, env, (None, fds[0], fds[1]), setup, ready.blas_for(env, None))
