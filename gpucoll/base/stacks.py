"""Every thread's Python stack on request: gpurun asks the ranks still running for theirs when its
--timeout expires, before it stops them, so that a hang says where each rank was.

gpurun names the signal in the ranks' environment (GPUCOLL_STACKS_SIGNAL, a real-time signal that
nothing else of the job uses); a rank installs Python's faulthandler for it as it starts (a rank
forked from gpurun's warmed interpreter) or as it joins the job (one started anew), and the
handler writes to the rank's stderr, which gpurun tags with its rank.
"""
import faulthandler
import signal
import sys

from . import config

VARIABLE = config.STACKS_SIGNAL.name


def signal_number():
    """The signal gpurun sends for the stacks (SIGRTMIN + 4); None where there are no real-time
    signals (then gpurun asks for no stacks)."""
    first = getattr(signal, "SIGRTMIN", None)
    return None if first is None else first + 4


def install(environ=None):
    """Dump every thread's stack to stderr on the signal gpurun named, where it named one."""
    signum = config.STACKS_SIGNAL.get(environ)
    if signum is None:
        return
    try:
        faulthandler.register(signum, file=sys.stderr, all_threads=True, chain=False)
    except (ValueError, OSError, RuntimeError, AttributeError):  # no usable stderr, or a signal Python refuses
        pass
