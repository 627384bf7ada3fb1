"""Turn the signals gpurun receives into events of its event loop.

The handlers do nothing themselves: Python writes the number of every caught signal to a
wakeup pipe (`signal.set_wakeup_fd`), and the loop reads the numbers from that pipe with
the ranks' output pipes. So a signal is never lost between two checks, the loop never
polls, and no work happens inside a handler.
"""
import os
import signal

from gpucoll.base import stacks

#: Forwarded to every rank's process group.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
#: Of those, the ones after which gpurun ends the job.
ENDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: The request for the ranks' stacks (gpucoll.base.stacks): passed on to each rank's own process
#: (a gpurun that is itself a rank of another, whose --timeout expired).
STACKS = tuple(s for s in (stacks.signal_number(),) if s is not None)


def _ignore(signum, frame):
    """The byte in the wakeup pipe is the event; nothing to do here."""


class SignalInbox:
    """Catches FORWARDED, STACKS and SIGCHLD until `close()`; `take()` returns what arrived."""

    def __init__(self):
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        self._old_wakeup = signal.set_wakeup_fd(self._wfd, warn_on_full_buffer=False)
        self._old = {}
        for sig in FORWARDED + (signal.SIGCHLD,) + STACKS:
            self._old[sig] = signal.signal(sig, _ignore)

    def fileno(self):
        """Readable when a signal arrived."""
        return self._rfd

    def take(self):
        """The signal numbers received since the last call, oldest first."""
        got = bytearray()
        while True:
            try:
                chunk = os.read(self._rfd, 512)
            except (BlockingIOError, InterruptedError):
                break
            if not chunk:
                break
            got += chunk
        return list(got)

    def reset_in_child(self):
        """In a rank forked from gpurun: the handlers a rank started anew has, and no wakeup
        pipe (its fds are closed with every other fd of gpurun's). exec resets the signals
        gpurun catches to their default, and Python then installs its KeyboardInterrupt
        handler for SIGINT: even where gpurun itself was started with SIGINT ignored."""
        signal.set_wakeup_fd(-1)
        for sig in self._old:
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def close(self):
        """Put back the handlers that were there before."""
        self._put_back()
        signal.set_wakeup_fd(self._old_wakeup)
        os.close(self._rfd)
        os.close(self._wfd)

    def _put_back(self):
        for sig, old in self._old.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


def name(signum):
    """'SIGKILL' for 9; 'signal 77' for numbers without a name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
