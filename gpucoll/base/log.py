"""Debug logs shaped `host:pid:rank gpucoll LEVEL [SUBSYS] message`.

GPUCOLL_DEBUG sets the level (NONE, WARN, INFO, TRACE), GPUCOLL_DEBUG_SUBSYS the
subsystems shown at INFO and TRACE (warnings always show), GPUCOLL_DEBUG_FILE the file::

    from gpucoll.base import log
    log.info("COLL", "allreduce %d B %s via %s", nbytes, algo, transport)
"""
import os
import socket
import sys
import threading
import time

from . import config

_LEVELS = {"none": 0, "warn": 1, "info": 2, "trace": 3}
_SECRET_VARS = [var for var in config.ALL if var.secret]
_state = threading.local()
_lock = threading.Lock()


class _Settings:
    def __init__(self):
        self.reload()

    def reload(self):
        self.level = _LEVELS[config.DEBUG.get()]
        subsys = config.DEBUG_SUBSYS.get()
        self.subsys = None if "ALL" in subsys else frozenset(subsys)
        self.file_pattern = config.DEBUG_FILE.get()
        self.stream = None
        # Unparsed: a log line must not raise, whatever the variable holds (torchrun sets RANK).
        self.rank = config.RANK.raw() or os.environ.get("RANK") or "?"
        self.host = socket.gethostname()


_settings = None


def settings():
    global _settings
    if _settings is None:
        _settings = _Settings()
    return _settings


def reload():
    """Re-read GPUCOLL_DEBUG* (after the environment changed)."""
    global _settings
    _settings = None


def set_rank(rank):
    settings().rank = str(rank)


def enabled(level, subsys):
    s = settings()
    want = _LEVELS[level]
    if s.level < want:
        return False
    return want <= 1 or s.subsys is None or subsys in s.subsys


def _stream(s):
    if s.stream is None:
        if s.file_pattern:
            path = (s.file_pattern.replace("%h", s.host).replace("%p", str(os.getpid()))
                    .replace("%r", s.rank))
            s.stream = open(path, "a", buffering=1)
        else:
            s.stream = sys.stderr
    return s.stream


def _emit(level, subsys, msg, args):
    if not enabled(level, subsys):
        return
    s = settings()
    text = _without_secrets(msg % args if args else msg)
    line = f"{s.host}:{os.getpid()}:{s.rank} gpucoll {level.upper()} [{subsys}] {text}\n"
    with _lock:
        stream = _stream(s)
        try:
            stream.write(line)
            stream.flush()
        except (OSError, ValueError):  # stderr closed or gone: a log line is not worth a thread
            pass


def _without_secrets(text):
    """The text with the job's secret masked, whatever the message was built from (an
    environment, an error that quoted a value): logs end up in job outputs and tickets."""
    for var in _SECRET_VARS:
        value = var.raw()
        if value and len(value) >= 8 and value in text:
            text = text.replace(value, f"<{var.name}>")
    return text


def warn(subsys, msg, *args):
    _emit("warn", subsys, msg, args)


def info(subsys, msg, *args):
    _emit("info", subsys, msg, args)


def trace(subsys, msg, *args):
    _emit("trace", subsys, msg, args)


class Summary:
    """A warning that may repeat fast (refused connections, say): the first occurrence is
    logged at once, later ones are counted into at most one line per `interval` seconds,
    so that a flood of events cannot flood the log::

        refused = log.Summary("NET", "rank 1's TCP listener refused connections")
        refused.note("10.0.0.9:4242: wrong magic")   # WARN ...: 1 (1 in all); last from 10.0.0.9:4242: ...
        refused.flush()                              # the count not yet logged, if due (force=True: now)
    """

    def __init__(self, subsys, what, interval=10.0):
        self.subsys, self.what, self.interval = subsys, what, float(interval)
        self.total = 0
        self.unreported = 0
        self.last = None
        self.next_report = 0.0

    def note(self, detail, now=None):
        self.total += 1
        self.unreported += 1
        self.last = detail
        self.flush(now)

    def flush(self, now=None, force=False):
        now = time.monotonic() if now is None else now
        if self.unreported and (force or now >= self.next_report):
            warn(self.subsys, "%s: %d (%d in all); last from %s", self.what, self.unreported, self.total, self.last)
            self.unreported = 0
            self.next_report = now + self.interval

    def due(self):
        """When flush() would next log the events counted so far (a monotonic time), or None."""
        return self.next_report if self.unreported else None
