"""Start rank processes, signal their process groups, and clean up what they leave behind.

Each rank starts in a new session, so it leads its own process group: a signal sent to
that group reaches the rank and everything it started (shells, data loaders, `sleep`).
gpurun also makes itself the "child subreaper" of its descendants (Linux), so a
grandchild whose parent died is re-parented to gpurun instead of init; gpurun then
reaps it, and at the end kills any that escaped their group with `setsid`.
"""
import os
import shutil
import signal
import subprocess
import sys

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1


class LaunchError(Exception):
    """The program could not be started; `exit_code` follows the shell's 126/127."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


def program_argv(command, module=None):
    """The argv that runs the user's program in each rank.

    `-m MODULE` and `*.py` / `*.pyz` files (and other files without the execute bit) run
    with the interpreter that runs gpurun; anything else is an executable found on PATH.
    """
    if module:
        return [sys.executable, "-m", module, *command]
    prog, *args = command
    if prog.endswith((".py", ".pyz")):
        if not os.path.exists(prog):
            raise LaunchError(f"no such Python script: {prog}", 127)
        return [sys.executable, prog, *args]
    if os.sep in prog:
        if not os.path.exists(prog):
            raise LaunchError(f"no such file: {prog}", 127)
        if os.path.isfile(prog) and not os.access(prog, os.X_OK):
            return [sys.executable, prog, *args]
    elif shutil.which(prog) is None:
        raise LaunchError(f"command not found: {prog}", 127)
    return [prog, *args]


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


def start_rank(rank, argv, env, stdin_inherit=False, die_with_parent=False):
    """Start one rank with piped stdout and stderr in its own session.

    Rank 0 may inherit gpurun's stdin (as with mpiexec); the others read /dev/null.
    die_with_parent (Linux): the kernel kills the rank when its parent dies, so that the
    ranks of a host agent that was killed outright do not run on alone.
    """
    try:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=None if stdin_inherit else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            preexec_fn=_die_with_parent() if die_with_parent else None,
        )
    except FileNotFoundError:
        raise LaunchError(f"command not found: {argv[0]}", 127) from None
    except OSError as exc:
        raise LaunchError(f"cannot run {argv[0]}: {exc.strerror}", 126) from None
    return Rank(rank, proc)


def _die_with_parent():
    """A preexec_fn that sets PR_SET_PDEATHSIG to SIGKILL (Linux; else None)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm():
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
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
