"""The store's door: accepting connections, the cap on those not yet authenticated, and one
summary line for what was turned away (never a line, let alone a traceback, per connection).

Anyone who can reach the store's port can open connections faster than they time out.
A connection that has not proved the job's secret yet is *pending*; at most `max_pending`
are kept. When one more arrives at the cap, the oldest pending one is closed if it has
waited longer than a real client's handshake ever takes (EVICT_AFTER_S), else the new one
is refused (a real client retries). So idle connections held open by a stranger cannot lock
the ranks out, and a burst of real ranks connecting at once is not cut down by itself.

Running out of file descriptors in accept() (EMFILE, ENFILE) closes the oldest pending
connections to make room and, when there are none, pauses accepting for a moment. asyncio's
own accept loop, used before, logged a traceback per failed accept() and scheduled one
retry each: tens of thousands of tracebacks from one flood.
"""
import collections
import errno
import os
import traceback

from ..base import log

#: A real client answers the server's hello within a round trip; a pending connection
#: older than this may be closed to make room for a new one.
EVICT_AFTER_S = 0.5
#: Connections accepted per wake-up, so that the handshakes under way get their turn.
ACCEPT_BATCH = 64
#: How long accepting pauses when accept() fails and nothing can be closed to make room.
ACCEPT_PAUSE_S = 0.1
#: At most one summary line per this many seconds (the first event is told at once).
SUMMARY_EVERY_S = 10.0
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def default_max_pending():
    """A quarter of the file-descriptor limit, between 64 and 4096: room for the ranks'
    own connections stays however many strangers knock."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 1024
    if soft < 0 or soft == getattr(resource, "RLIM_INFINITY", -1):
        return 4096
    return max(64, min(4096, soft // 4))


class Summary:
    """Counts events by reason (and the first few hosts they came from) and logs them as
    one WARN line: the first at once, the rest at most every SUMMARY_EVERY_S seconds
    (flushed by a timer, and by close())."""

    HOSTS_NAMED = 3

    def __init__(self, loop, where, what):
        self.loop = loop
        self.where = where
        self.what = what            # e.g. "turned away {n} connection(s) that had not authenticated"
        self.counts = collections.Counter()
        self.hosts = {}             # reason -> the first few hosts it came from
        self.total = 0
        self._timer = None
        self._quiet_until = 0.0

    def note(self, reason, host=None):
        self.counts[reason] += 1
        self.total += 1
        if host is not None:
            hosts = self.hosts.setdefault(reason, [])
            if host not in hosts and len(hosts) <= self.HOSTS_NAMED:
                hosts.append(host)
        if self._timer is not None:
            return
        now = self.loop.time()
        if now >= self._quiet_until:
            self.flush()
        else:
            self._timer = self.loop.call_at(self._quiet_until, self.flush)

    def flush(self):
        self._timer = None
        if not self.counts:
            return
        n = sum(self.counts.values())
        reasons = "; ".join(f"{count} {reason}{self._from(reason)}" for reason, count in self.counts.most_common())
        later = f" (more are summed up every {SUMMARY_EVERY_S:g} s)" if self._quiet_until == 0.0 else ""
        log.warn("BOOTSTRAP", "store %s %s: %s%s", self.where, self.what.format(n=n), reasons, later)
        self.counts.clear()
        self.hosts.clear()
        self._quiet_until = self.loop.time() + SUMMARY_EVERY_S

    def _from(self, reason):
        hosts = self.hosts.get(reason)
        if not hosts:
            return ""
        more = ", ..." if len(hosts) > self.HOSTS_NAMED else ""
        return f" (from {', '.join(hosts[:self.HOSTS_NAMED])}{more})"

    def close(self):
        if self._timer is not None:
            self._timer.cancel()
        self.flush()


class Gate:
    """Accepts connections on the listening socket `sock` inside `loop` and hands each to
    `protocol_factory` (an asyncio Protocol). Protocols call admit() when they are made,
    settled() once they authenticated or closed, and turned_away() when they refuse a
    client that has not authenticated; a pending one must have `turn_away(reason)`."""

    def __init__(self, loop, sock, protocol_factory, where, max_pending=None):
        self.loop = loop
        self.sock = sock
        self.protocol_factory = protocol_factory
        self.max_pending = int(max_pending) if max_pending else default_max_pending()
        self.pending = {}           # protocol -> loop time it was admitted; oldest first
        self.refused = Summary(loop, where, "turned away {n} connection(s) that had not authenticated")
        self.errors = Summary(loop, where, "hit {n} error(s) in its event loop")
        self._opening = set()       # tasks that turn accepted sockets into transports
        self._reading = False
        self._resume = None

    # --- accepting ------------------------------------------------------------------------

    def start(self):
        self.sock.setblocking(False)
        self.loop.set_exception_handler(self._loop_error)
        self._read(True)

    def close(self):
        """Stop accepting; say what is still unsaid. Call from the loop's thread."""
        self._read(False)
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        for task in self._opening:
            task.cancel()
        self.refused.close()
        self.errors.close()

    def _read(self, on):
        if on and not self._reading:
            self.loop.add_reader(self.sock.fileno(), self._accept_ready)
        elif not on and self._reading:
            self.loop.remove_reader(self.sock.fileno())
        self._reading = on

    def _accept_ready(self):
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:  # the client gave up while queued
                    continue
                self.refused.note(f"not accepted: {os.strerror(exc.errno) if exc.errno else exc}")
                if exc.errno not in _OUT_OF_RESOURCES or not self._evict(max(1, len(self.pending) // 8)):
                    self._pause()
                return
            task = self.loop.create_task(self._open(conn))
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)

    async def _open(self, conn):
        try:
            await self.loop.connect_accepted_socket(self.protocol_factory, conn)
        except OSError as exc:  # the client went away before its transport was set up
            conn.close()
            self.refused.note(f"lost while being accepted ({exc.strerror or exc})")

    def _pause(self):
        self._read(False)
        if self._resume is None:
            self._resume = self.loop.call_later(ACCEPT_PAUSE_S, self._unpause)

    def _unpause(self):
        self._resume = None
        self._read(True)

    # --- the cap on pending connections --------------------------------------------------

    def admit(self, conn):
        """Count `conn` as pending; False (and `conn` already turned away) at the cap."""
        now = self.loop.time()
        if len(self.pending) >= self.max_pending:
            oldest = next(iter(self.pending))
            if now - self.pending[oldest] < EVICT_AFTER_S:
                conn.turn_away(self._over_cap(), "the store is busy: too many connections are waiting "
                                                 "to authenticate; try again")
                return False
            oldest.turn_away(self._over_cap(), "closed to make room for newer connections: this one "
                                               "did not authenticate in time")
        self.pending[conn] = now
        return True

    def settled(self, conn):
        """`conn` authenticated or closed: it no longer counts against the cap."""
        self.pending.pop(conn, None)

    def turned_away(self, reason, host=None):
        self.refused.note(reason, host)

    def _over_cap(self):
        return f"over the limit of {self.max_pending} waiting to authenticate"

    def _evict(self, count):
        """Close up to `count` of the oldest pending connections; how many were closed."""
        victims = list(self.pending)[:count]
        for conn in victims:
            conn.turn_away("closed to free file descriptors", "the store is out of file descriptors")
        return len(victims)

    # --- everything else that goes wrong in the loop -------------------------------------

    def _loop_error(self, loop, context):
        exc = context.get("exception")
        what = context.get("message") or "error"
        if exc is not None:
            what = f"{what}: {type(exc).__name__}: {exc}"
            if log.enabled("trace", "BOOTSTRAP"):
                log.trace("BOOTSTRAP", "%s", "".join(traceback.format_exception(exc)).rstrip())
        self.errors.note(what)
