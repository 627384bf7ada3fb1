"""Start rank processes, signal their process groups, and clean up what they leave behind.

Each rank starts in a new session, so it leads its own process group: a signal sent to
that group reaches the rank and everything it started (shells, data loaders, `sleep`).
gpurun also makes itself the "child subreaper" of its descendants (Linux), so a
grandchild whose parent died is re-parented to gpurun instead of init; gpurun then
reaps it, and at the end kills any that escaped their group with `setsid`.

A rank dies with the process that started it (gpurun or a host agent), even when that
one is killed outright (SIGKILL gives it no chance to stop anything): the kernel's
parent-death signal is set in the child before exec. The signal follows the *thread*
that forked, so ranks are started from the main thread, which lives as long as gpurun.
"""
import os
import shutil
import signal
import subprocess
import sys

from .report import EXIT_CANNOT_RUN, EXIT_NOT_FOUND

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1


class LaunchError(Exception):
    """The job could not be started; `exit_code` is one of report.py's EXIT_* codes."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


def program_argv(command, module=None):
    """The argv that runs the user's program in each rank.

    `-m MODULE` and `*.py` / `*.pyz` files run with the interpreter that runs gpurun, and
    so does a file without the execute bit that is Python (a `#!...python` line, or no #!
    line and Python source). Anything else is an executable, looked up on PATH when its
    name has no `/`. What cannot run is a LaunchError that says why, with the shell's
    codes: 127 when the program, or the interpreter its #! line names, does not exist; 126
    when it exists but cannot be run (a shell script without the execute bit, a directory).
    """
    if module:
        return [sys.executable, "-m", module, *command]
    prog, *args = command
    if prog.endswith((".py", ".pyz")):
        if not os.path.exists(prog):
            raise LaunchError(f"no such Python script: {prog}", EXIT_NOT_FOUND)
        return [sys.executable, prog, *args]
    if os.sep not in prog:
        found = shutil.which(prog)
        if found is None:
            here = f" (there is a file {prog} here: to run it, give its path, ./{prog})" \
                if os.path.isfile(prog) else ""
            raise LaunchError(f"command not found: {prog}{here}", EXIT_NOT_FOUND)
        _check_interpreter(found, prog)
        return [prog, *args]
    if not os.path.exists(prog):
        raise LaunchError(f"no such file: {prog}", EXIT_NOT_FOUND)
    if os.path.isdir(prog):
        raise LaunchError(f"{prog} is a directory, not a program", EXIT_CANNOT_RUN)
    if not os.access(prog, os.X_OK):
        if _is_python(prog):
            return [sys.executable, prog, *args]
        raise LaunchError(_not_executable(prog), EXIT_CANNOT_RUN)
    _check_interpreter(prog, prog)
    return [prog, *args]


def _head(path):
    """The first bytes of a file (b"" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read(512)
    except OSError:
        return b""


def _shebang(path):
    """The interpreter and its argument from the file's `#!` line: ["/bin/sh"],
    ["/usr/bin/env", "python3"]; None without one."""
    head = _head(path)
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    # The kernel reads one interpreter path and at most one argument (the rest of the line).
    interp, _, arg = line.partition(" ")
    return [interp] + ([arg.strip()] if arg.strip() else [])


def _interpreter_name(shebang):
    """'bash' for #!/bin/bash, 'python3' for #!/usr/bin/env python3."""
    name = os.path.basename(shebang[0])
    if name == "env" and len(shebang) > 1 and not shebang[1].startswith("-"):
        return shebang[1].split()[0]
    return name


def _is_python(path):
    """Whether a file is a Python program: its #! line names Python, or it has none and
    compiles as Python."""
    shebang = _shebang(path)
    if shebang is not None:
        return "python" in _interpreter_name(shebang)
    if b"\0" in _head(path):
        return False
    try:
        with open(path, "rb") as f:
            compile(f.read(), path, "exec", dont_inherit=True)
        return True
    except (SyntaxError, ValueError, OSError):
        return False


def _not_executable(prog):
    shebang = _shebang(prog)
    # Without a #! line, the shell would run the file with sh.
    how = f"{_interpreter_name(shebang) if shebang else 'sh'} {prog}"
    what = "" if shebang else " and is not Python"
    return f"{prog} is not executable{what}: chmod +x {prog}, or name its interpreter (gpurun ... {how})"


def _check_interpreter(path, prog):
    """A LaunchError (127) when the interpreter that the #! line of `path` names is missing:
    the kernel's ENOENT would otherwise read as if `prog` itself were missing."""
    shebang = _shebang(path)
    if shebang is None:
        return
    interp = shebang[0]
    if not os.path.exists(interp):
        raise LaunchError(f"{prog}: its interpreter {interp} (named by its #! line) is missing", EXIT_NOT_FOUND)
    if os.path.basename(interp) == "env" and len(shebang) > 1 and not shebang[1].startswith("-"):
        name = shebang[1].split()[0]
        if shutil.which(name) is None:
            raise LaunchError(f"{prog}: its interpreter {name} (named by its #! line, through env) is "
                              "missing: not found on PATH", EXIT_NOT_FOUND)


class Rank:
    """One rank's process; `returncode` is None while it runs (Popen's convention:
    negative numbers are the signal that ended it)."""

    def __init__(self, rank, proc):
        self.rank = rank
        self.proc = proc
        self.pid = proc.pid
        self.returncode = None

    @property
    def running(self):
        return self.returncode is None

    def poll(self):
        """Reap the process if it ended; True if it ended just now."""
        if self.returncode is not None:
            return False
        self.returncode = self.proc.poll()
        return self.returncode is not None

    def signal_group(self, sig):
        """Send `sig` to the rank's whole process group; False when nothing is left in it."""
        try:
            os.killpg(self.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def group_alive(self):
        """Whether any process of the rank's group still exists."""
        return self.signal_group(0)


def start_rank(rank, argv, env, stdin_inherit=False, die_with_parent=True, cpus=None, cwd=None):
    """Start one rank with piped stdout and stderr in its own session.

    Rank 0 may inherit gpurun's stdin (as with mpiexec); the others read /dev/null.
    die_with_parent (Linux): the kernel kills the rank when its parent dies, so that the
    ranks of a gpurun or a host agent that was killed outright do not run on alone.
    cpus: the CPUs the rank is bound to (binding.py), set before exec so that nothing of the
    rank ever runs elsewhere; None leaves gpurun's mask. cwd: its working directory (None: gpurun's).

    That needs code in the child between fork and exec (a preexec_fn), which is only safe
    in a process with one thread: a lock that another thread held at the fork stays locked
    in the child forever. Call this before starting any thread (gpurun starts the store's
    thread after its ranks). It costs a fork instead of a vfork: about a millisecond a rank.
    """
    try:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=None if stdin_inherit else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            preexec_fn=_in_child(parent_death_arm() if die_with_parent else None, cpus),
        )
    except FileNotFoundError:
        if os.path.exists(argv[0]):  # the file is there, so what is missing is its interpreter
            raise LaunchError(f"cannot run {argv[0]}: the interpreter its #! line names (or a library "
                              "it needs) was not found", EXIT_NOT_FOUND) from None
        raise LaunchError(f"command not found: {argv[0]}", EXIT_NOT_FOUND) from None
    except OSError as exc:
        raise LaunchError(f"cannot run {argv[0]}: {exc.strerror}", EXIT_CANNOT_RUN) from None
    return Rank(rank, proc)


def _in_child(arm, cpus):
    """The preexec_fn that runs `arm` (or nothing) and binds the child to `cpus` (or not)."""
    if cpus is None:
        return arm
    cpus = frozenset(cpus)

    def prepare():
        if arm is not None:
            arm()
        bind(cpus)
    return prepare


def bind(cpus):
    """Bind this process, in a rank about to start, to `cpus` (None: gpurun's mask)."""
    if cpus is not None:
        os.sched_setaffinity(0, cpus)


def parent_death_arm(parent=None):
    """A preexec_fn that sets PR_SET_PDEATHSIG to SIGKILL (Linux; else None): the child dies with
    `parent` (default: this process, which forks it)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid() if parent is None else parent

    def arm():
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died between the fork and the prctl: then the signal will
        # never come (the child already belongs to another process). Go as it would have.
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
    return arm


def become_subreaper():
    """Ask Linux to re-parent orphaned descendants to this process. Best effort."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes  # only here: it costs a few milliseconds of start-up

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_orphans():
    """Collect every ended child. Call only once all ranks are reaped, since waiting on
    any child would otherwise steal a rank's exit status from its Popen."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_orphans():
    """SIGKILL the live children of gpurun (descendants of ranks that left their group
    and lost their parent), then reap them. Returns their pids."""
    me = os.getpid()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces): state, ppid, ...
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == me and fields[0] != b"Z":
            found.append(int(entry))
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in found:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    return found
