"""The rendezvous store: a small TCP key-value server, its client, and a prefix wrapper.

The launcher (or rank 0) serves it; every rank connects with the job's secret and
uses it to swap addresses and meet at barriers::

    server = StoreServer("0.0.0.0", 0, secret).start()      # in the launcher
    store = StoreClient.from_env()                           # in each rank
    store.set(f"addr/{rank}", my_address)
    peer = store.get(f"addr/{(rank + 1) % size}")            # blocks until it is set
    if store.add("arrived") == size:
        store.set("all-arrived", b"1")

The server runs one asyncio event loop in a daemon thread. A get or wait for a key
that does not exist yet parks that connection (no thread, no loop iteration is
spent on it) and is answered when the key is set or its deadline passes. Frames
are checked before anything is buffered for them; a connection that breaks the
protocol is dropped alone. Connections that have not authenticated are capped and
turned away in one summary log line (store_gate.py). The wire format is in
store_protocol.py.

Run a server in the foreground (the secret comes from GPUCOLL_STORE_SECRET)::

    python -m gpucoll.bootstrap.store --host 0.0.0.0 --port 29500
"""
import asyncio
import errno
import math
import random
import socket
import threading
import time

from .. import config, log
from ..errors import AuthenticationError, ConfigError, InvalidUsageError, StoreError
from ..errors import TimeoutError as GpucollTimeout
from ..transports.handshake import recv_exact
from . import store_protocol as wire
from .store_gate import Gate

__all__ = ["StoreServer", "StoreClient", "PrefixStore", "StoreUnreachableError",
           "DEFAULT_MAX_VALUE_SIZE"]

DEFAULT_MAX_VALUE_SIZE = 64 << 20
WANTED_BACKLOG = 4096
# A client that has connected but not authenticated is closed after this long,
# so idle junk connections cannot hold file descriptors forever.
HANDSHAKE_TIMEOUT = 10.0
# How much longer than the server-side deadline a client waits for the answer to a
# get or wait before it decides the server is gone.
REPLY_GRACE = 30.0
# At most this many missing keys are named in a timeout message.
MAX_KEYS_NAMED = 20


class StoreUnreachableError(StoreError, GpucollTimeout):
    """No store answered at host:port within connect_timeout. It is both a StoreError
    and a gpucoll TimeoutError, so either may be caught."""


def format_address(host, port):
    """'host:port', with brackets around IPv6 literals."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(text, var="GPUCOLL_STORE"):
    """'host:port' or '[v6]:port' -> (host, port)."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{var}={text!r} is not host:port (for example node01:29500).")
    return host, int(port)


def as_secret(secret):
    """The secret as bytes: bytes are used as they are, a str is read as hex (the form
    GPUCOLL_STORE_SECRET carries)."""
    if isinstance(secret, str):
        try:
            secret = bytes.fromhex(secret)
        except ValueError:
            raise ConfigError("a store secret given as text must be hex, as in GPUCOLL_STORE_SECRET "
                              "(e.g. secrets.token_hex(16)).") from None
    if not isinstance(secret, (bytes, bytearray)) or not secret:
        raise InvalidUsageError("the store needs the job's secret: non-empty bytes, or a hex string "
                                "as in GPUCOLL_STORE_SECRET.")
    return bytes(secret)


def _ephemeral_ports():
    """'32768-60999': the range the kernel picks free ports from."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = f.read().split()
        return f"{low}-{high}"
    except (OSError, ValueError):
        return "of ephemeral ports"


def _somaxconn():
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return int(f.read())
    except (OSError, ValueError):
        return WANTED_BACKLOG


# ======================================================================================
# Server
# ======================================================================================

class StoreServer:
    """A key-value store served over TCP from one event loop in a daemon thread.

    `port=0` picks a free port; `.port` and `.address` tell which. Values may be up to
    `max_value_size` bytes, keys up to 4 KiB. Use as a context manager or call close()::

        with StoreServer("127.0.0.1", 0, secret).start() as server:
            client = StoreClient("127.0.0.1", server.port, secret)
    """

    def __init__(self, host="0.0.0.0", port=0, secret=None, max_value_size=DEFAULT_MAX_VALUE_SIZE,
                 handshake_timeout=HANDSHAKE_TIMEOUT, max_pending=None):
        self.host = host
        self.port = int(port)
        self.secret = as_secret(secret)
        self.max_value_size = int(max_value_size)
        self.handshake_timeout = float(handshake_timeout)
        # Connections not yet authenticated that are kept at once (None: from the fd limit).
        self.max_pending = max_pending
        self.gate = None
        # CompareSet carries two values; anything larger than this is not a request.
        self.max_frame = 2 * self.max_value_size + wire.MAX_KEY_SIZE + 64
        self.data = {}
        self.waiting = {}          # key -> set of _Waiter parked on it
        self.connections = set()
        self._sock = None
        self._loop = None
        self._thread = None
        self._closed = threading.Event()

    @property
    def address(self):
        """'host:port' that clients can use; a wildcard host is replaced by this host's name."""
        host = socket.gethostname() if self.host in ("", "0.0.0.0", "::") else self.host
        return format_address(host, self.port)

    def listen(self):
        """Bind and listen, without serving yet: `.port` is known, and clients that connect
        wait in the backlog until start(). Returns self."""
        if self._sock is None:
            self._sock = self._listen()
            self.port = self._sock.getsockname()[1]
        return self

    def start(self):
        """Bind and listen (unless listen() did), and serve in a daemon thread; returns self."""
        if self._thread is not None:
            return self
        self.listen()
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure = []
        self._thread = threading.Thread(target=self._run, args=(ready, failure),
                                        name=f"gpucoll-store-{self.port}", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self.close()
            raise StoreError(f"the store on {self.address} could not start: {failure[0]}")
        log.info("BOOTSTRAP", "store serving on %s (max value %d B)", self.address, self.max_value_size)
        return self

    def _listen(self):
        where = format_address(self.host, self.port)
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(
                self.host or None, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            raise StoreError(f"cannot serve the store on {where}: {exc}") from None
        try:
            # Lets a restarted job reuse the port while old connections sit in TIME_WAIT;
            # on Linux it does not let two live servers share a port.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(self._backlog())
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE and self.port == 0:
                raise StoreError(
                    f"cannot serve the store on {self.host or 'any address'}: no free port is left "
                    f"(every port of the range {_ephemeral_ports()} is in use). End the programs "
                    f"that hold them, or widen net.ipv4.ip_local_port_range.") from None
            if exc.errno == errno.EADDRINUSE:
                raise StoreError(
                    f"cannot serve the store on {where}: port {self.port} is already in use. Pick "
                    f"another port (0 picks a free one), or unset the variable that fixed it "
                    f"(GPUCOLL_STORE, MASTER_PORT).") from None
            raise StoreError(f"cannot serve the store on {where}: {exc}") from None
        return sock

    @staticmethod
    def _backlog():
        # Every rank of a large job connects at once; the kernel caps it at somaxconn anyway.
        return max(1, min(WANTED_BACKLOG, _somaxconn()))

    def _run(self, ready, failure):
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            self.gate = Gate(loop, self._sock, lambda: _Connection(self), self.address, self.max_pending)
            self.gate.start()
        except Exception as exc:  # reported by start() in the caller's thread
            failure.append(exc)
            loop.close()
            ready.set()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            self.gate.close()
            for conn in list(self.connections):
                conn.transport.abort()
            # Let the transports finish closing (and cancelled accepts end) before the loop goes.
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()

    def close(self):
        """Stop serving and drop every connection; clients waiting on it raise StoreError."""
        thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            thread.join()
            log.info("BOOTSTRAP", "store on %s closed", self.address)
        if self._sock is not None:
            self._sock.close()
        self._closed.set()

    def join(self, timeout=None):
        """Block until the server stops (close() from another thread); True if it has."""
        return self._closed.wait(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- the store itself (runs on the loop) ------------------------------------------

    def put(self, key, value):
        """Store a value and answer everyone parked on its key."""
        self.data[key] = value
        for waiter in self.waiting.pop(key, ()):
            waiter.arrived(key)

    def park(self, waiter):
        """Register a waiter under each key it still misses."""
        for key in waiter.missing:
            self.waiting.setdefault(key, set()).add(waiter)

    def unpark(self, waiter):
        """Forget a waiter that finished, timed out or lost its connection."""
        for key in waiter.missing:
            parked = self.waiting.get(key)
            if parked is not None:
                parked.discard(waiter)
                if not parked:
                    del self.waiting[key]


def _show(key):
    return repr(key.decode("utf-8", "replace"))


class _Waiter:
    """A get or wait parked until its keys exist or its deadline passes."""

    def __init__(self, conn, keys, timeout, on_ready):
        self.conn = conn
        self.missing = set(keys)
        self.on_ready = on_ready
        self.timer = None if math.isinf(timeout) else conn.loop.call_later(timeout, self.expired)

    def arrived(self, key):
        # The server already took this waiter off `key`'s list.
        self.missing.discard(key)
        if not self.missing:
            self.finish(self.on_ready())

    def expired(self):
        self.timer = None
        named = sorted(self.missing)[:MAX_KEYS_NAMED]
        self.finish(wire.frame(wire.TIMED_OUT, wire.u32(len(self.missing)), wire.u32(len(named)),
                               *map(wire.key, named)))

    def cancel(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.conn.server.unpark(self)

    def finish(self, reply):
        self.cancel()
        self.conn.unpark(reply)


class _Connection(asyncio.Protocol):
    """One client: the handshake, then one request at a time."""

    def __init__(self, server):
        self.server = server
        self.loop = server._loop
        self.transport = None
        self.peer = "?"
        self.peer_host = "?"
        self.buffer = bytearray()
        self.authenticated = False
        self.nonce = wire.new_nonce()
        self.deadline = None
        self.parked = None
        self.closing = False

    # --- asyncio callbacks ------------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = format_address(*peer[:2]) if peer else "?"
        self.peer_host = peer[0] if peer else "?"
        self.server.connections.add(self)
        if not self.server.gate.admit(self):
            return
        transport.write(wire.hello(self.nonce, self.server.max_value_size))
        self.deadline = self.loop.call_later(self.server.handshake_timeout, self._handshake_expired)

    def data_received(self, data):
        self.buffer += data
        if self.parked is not None:
            # Reading on while a request is parked lets a hang-up free its waiter at
            # once; a client that sends more than a frame meanwhile is not ours.
            if len(self.buffer) > wire.HEADER_SIZE + self.server.max_frame:
                self._drop("sent too much while waiting for an answer")
            return
        self._process()

    def connection_lost(self, exc):
        self.closing = True
        self.server.connections.discard(self)
        self.server.gate.settled(self)
        if self.deadline is not None:
            self.deadline.cancel()
        if self.parked is not None:
            self.parked.cancel()
            self.parked = None

    # --- framing ----------------------------------------------------------------------

    def _process(self):
        limit = self.server.max_frame if self.authenticated else wire.HANDSHAKE_FRAME_LIMIT
        while self.parked is None and not self.closing and len(self.buffer) >= wire.HEADER_SIZE:
            try:
                size = wire.frame_size(self.buffer[:wire.HEADER_SIZE], limit)
                if len(self.buffer) < wire.HEADER_SIZE + size:
                    return
                end = wire.HEADER_SIZE + size
                body = bytes(self.buffer[wire.HEADER_SIZE:end])
                del self.buffer[:end]
                self._dispatch(wire.Fields(body))
            except wire.ProtocolError as exc:
                if self.authenticated:
                    self._drop(str(exc))
                else:
                    self.turn_away("broke the protocol before authenticating", str(exc))
                return
            limit = self.server.max_frame if self.authenticated else wire.HANDSHAKE_FRAME_LIMIT

    def _drop(self, reason, opcode=wire.CLOSING):
        """Tell an authenticated peer why, and hang up (logged: a rank misbehaved)."""
        if self.closing:
            return
        log.info("BOOTSTRAP", "store %s dropped the connection from %s: %s",
                 self.server.address, self.peer, reason)
        self._hang_up(reason, opcode)

    def turn_away(self, category, reason, opcode=wire.CLOSING):
        """Refuse a client that has not authenticated: tell it why (it may be a rank that
        retries, or not a gpucoll client at all), hang up, and count it under `category`
        in the gate's summary line instead of logging each one."""
        if self.closing:
            return
        self.server.gate.turned_away(category, self.peer_host)
        self.server.gate.settled(self)
        self._hang_up(reason, opcode)

    def _hang_up(self, reason, opcode):
        self.transport.write(wire.frame(opcode, reason.encode()))
        self.transport.close()
        self.closing = True

    def _handshake_expired(self):
        self.deadline = None
        if not self.authenticated:
            limit = f"no handshake within {self.server.handshake_timeout:g} s"
            self.turn_away(limit, limit)

    def _reply(self, data):
        self.transport.write(data)

    def unpark(self, reply):
        """Answer the parked request and read on; called by its _Waiter."""
        self.parked = None
        if self.closing:
            return
        self._reply(reply)
        # Frames that arrived meanwhile are handled on the next loop turn, not inside
        # the request that woke us (which may be another connection's set).
        self.loop.call_soon(self._process)

    def _park(self, keys, timeout, on_ready):
        if not (timeout >= 0):  # also rejects NaN
            raise wire.ProtocolError(f"invalid timeout {timeout}")
        self.parked = _Waiter(self, keys, timeout, on_ready)
        self.server.park(self.parked)

    # --- requests ---------------------------------------------------------------------

    def _dispatch(self, fields):
        if not self.authenticated:
            if fields.op != wire.AUTH:
                raise wire.ProtocolError(f"expected AUTH, got opcode {fields.op:#x}")
            return self._auth(fields)
        handler = _HANDLERS.get(fields.op)
        if handler is None:
            raise wire.ProtocolError(f"unknown opcode {fields.op:#x}")
        handler(self, fields)

    def _auth(self, fields):
        client_nonce = fields.raw(wire.NONCE_SIZE)
        proof = fields.raw(wire.MAC_SIZE)
        fields.end()
        secret = self.server.secret
        if not wire.proofs_match(proof, wire.client_proof(secret, self.nonce, client_nonce)):
            return self.turn_away("with the wrong secret", "the secret does not match", wire.AUTH_FAILED)
        self.authenticated = True
        self.server.gate.settled(self)
        self.deadline.cancel()
        self.deadline = None
        self._reply(wire.frame(wire.WELCOME, wire.server_proof(secret, self.nonce, client_nonce)))

    def _error(self, message):
        # A request that is well formed but cannot be done: the connection stays.
        self._reply(wire.frame(wire.ERROR, message.encode()))

    def _check_size(self, key, value):
        if len(value) > self.server.max_value_size:
            self._error(f"value of {len(value)} bytes for key {_show(key)} exceeds the store's "
                        f"limit of {self.server.max_value_size} bytes")
            return False
        return True

    def _set(self, fields):
        key, value = fields.key(), fields.value()
        fields.end()
        if self._check_size(key, value):
            self.server.put(key, value)
            self._reply(wire.frame(wire.OK))

    def _get(self, fields):
        key, timeout = fields.key(), fields.f64()
        fields.end()
        data = self.server.data
        if key in data:
            self._reply(wire.frame(wire.VALUE, wire.value(data[key])))
        else:
            self._park([key], timeout, lambda: wire.frame(wire.VALUE, wire.value(data[key])))

    def _add(self, fields):
        key, amount = fields.key(), fields.i64()
        fields.end()
        current = self.server.data.get(key, b"0")
        try:
            total = int(current) + amount
        except ValueError:
            return self._error(f"key {_show(key)} holds {current[:40]!r}, not an integer, so add() cannot "
                               "count on it")
        if not -(1 << 63) <= total < (1 << 63):
            return self._error(f"add() on key {_show(key)} overflows a 64-bit counter")
        self.server.put(key, str(total).encode())
        self._reply(wire.frame(wire.INT, wire.i64(total)))

    def _compare_set(self, fields):
        key, expected, desired = fields.key(), fields.value(), fields.value()
        fields.end()
        if not self._check_size(key, desired):
            return
        data = self.server.data
        current = data.get(key)
        # An empty `expected` means "only if the key is absent".
        if (current is None and not expected) or (current is not None and current == expected):
            self.server.put(key, desired)
            current = desired
        self._reply(wire.frame(wire.VALUE, wire.value(current if current is not None else b"")))

    def _wait(self, fields):
        timeout, count = fields.f64(), fields.u32()
        keys = [fields.key() for _ in range(count)]
        fields.end()
        missing = [k for k in keys if k not in self.server.data]
        if not missing:
            self._reply(wire.frame(wire.OK))
        else:
            self._park(missing, timeout, lambda: wire.frame(wire.OK))

    def _delete(self, fields):
        key = fields.key()
        fields.end()
        existed = self.server.data.pop(key, None) is not None
        self._reply(wire.frame(wire.INT, wire.i64(int(existed))))

    def _num_keys(self, fields):
        prefix = fields.key()
        fields.end()
        data = self.server.data
        count = len(data) if not prefix else sum(1 for k in data if k.startswith(prefix))
        self._reply(wire.frame(wire.INT, wire.i64(count)))

    def _ping(self, fields):
        fields.end()
        self._reply(wire.frame(wire.OK))


_HANDLERS = {
    wire.SET: _Connection._set,
    wire.GET: _Connection._get,
    wire.ADD: _Connection._add,
    wire.COMPARE_SET: _Connection._compare_set,
    wire.WAIT: _Connection._wait,
    wire.DELETE: _Connection._delete,
    wire.NUM_KEYS: _Connection._num_keys,
    wire.PING: _Connection._ping,
}


# ======================================================================================
# Client
# ======================================================================================

class _Retry(Exception):
    """The connection attempt failed in a way worth trying again."""


class _HungUp(StoreError):
    """The server closed the connection and said why (a CLOSING frame)."""


class _Refused(Exception):
    """The server answered ERROR: this request failed, the connection is fine."""


class _Missing:
    """A get or wait that timed out: how many keys were missing, and the first ones."""

    def __init__(self, total, keys):
        self.total = total
        self.keys = keys


def _nothing(fields):
    return None


class StoreClient:
    """A blocking client of the store; thread-safe (one request at a time per client).

    `timeout` bounds get() and wait() when they are given none; `connect_timeout`
    bounds the connection attempts, retried with exponential backoff and jitter.
    Keys are str, values bytes (a str value is sent as UTF-8)::

        store = StoreClient("node01", 29500, secret)
        store.set("answer", b"42")
        store.get("answer")            # b'42'
        store.add("ranks")             # 1, 2, ... atomically across clients

    A connection that breaks (server gone, interrupted request) stays closed: later
    calls raise StoreError.
    """

    def __init__(self, host, port, secret, timeout=300.0, connect_timeout=60.0):
        self.host = host
        self.port = int(port)
        self.address = format_address(host, self.port)
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self.max_value_size = None   # announced by the server
        self._secret = as_secret(secret)
        self._lock = threading.Lock()
        self._sock = None
        self._connect()

    @classmethod
    def from_env(cls, timeout=300.0, connect_timeout=60.0, environ=None):
        """Connect to the store named by GPUCOLL_STORE with the secret of GPUCOLL_STORE_SECRET."""
        where, secret = config.STORE.get(environ), config.STORE_SECRET.get(environ)
        if not where:
            raise ConfigError("GPUCOLL_STORE is not set: it must name the job's store as host:port "
                              "(gpurun sets it).")
        if not secret:
            raise ConfigError(f"GPUCOLL_STORE_SECRET is not set: the store at {where} needs the job's "
                              "secret (gpurun sets it).")
        host, port = parse_address(where)
        return cls(host, port, secret, timeout=timeout, connect_timeout=connect_timeout)

    # --- connecting -------------------------------------------------------------------

    def _connect(self):
        deadline = time.monotonic() + self.connect_timeout
        delay, attempts = 0.05, 0
        while True:
            attempts += 1
            try:
                self._sock = self._attempt(max(deadline - time.monotonic(), 0.05))
                log.info("BOOTSTRAP", "connected to the store at %s (attempt %d)", self.address, attempts)
                return
            except _Retry as exc:
                last = exc.__cause__ or exc
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreUnreachableError(
                    f"could not connect to the store at {self.address} within {self.connect_timeout:g} s "
                    f"({attempts} attempts; last error: {last}). Check that the launcher (gpurun) or rank 0 "
                    f"that serves the store is running, that no firewall blocks port {self.port}, and that "
                    f"GPUCOLL_STORE names the right host:port.")
            # Jitter spreads out a thousand ranks that all failed at the same moment.
            time.sleep(min(left, delay * random.uniform(0.5, 1.0)))
            delay = min(delay * 2, 2.0)

    def _attempt(self, budget):
        try:
            sock = socket.create_connection((self.host, self.port), timeout=min(budget, 30.0))
        except OSError as exc:
            raise _Retry() from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(min(budget, 30.0) + 5.0)
            self._handshake(sock)
            return sock
        except (OSError, EOFError, _HungUp) as exc:
            # _HungUp here: the server is busy (too many connections waiting to
            # authenticate) or found this attempt too slow; a new attempt may get in.
            sock.close()
            raise _Retry() from exc
        except BaseException:
            sock.close()
            raise

    def _handshake(self, sock):
        try:
            op, fields = self._read(sock, wire.HANDSHAKE_FRAME_LIMIT)
            if op != wire.HELLO or fields.raw(len(wire.MAGIC)) != wire.MAGIC:
                raise wire.ProtocolError("no HELLO")
            version = int.from_bytes(fields.raw(2), "big")
            if version != wire.VERSION:
                raise StoreError(f"the store at {self.address} speaks protocol version {version}, this "
                                 f"client version {wire.VERSION}: use the same gpucoll on every host.")
            self.max_value_size = fields.u64()
            server_nonce = fields.raw(wire.NONCE_SIZE)
            fields.end()
            nonce = wire.new_nonce()
            sock.sendall(wire.frame(wire.AUTH, nonce, wire.client_proof(self._secret, server_nonce, nonce)))
            op, fields = self._read(sock, wire.HANDSHAKE_FRAME_LIMIT)
            if op == wire.AUTH_FAILED:
                raise AuthenticationError(
                    f"store at {self.address} refused this client: the secret does not match "
                    "(GPUCOLL_STORE_SECRET must be the one of this job).")
            proof = fields.raw(wire.MAC_SIZE) if op == wire.WELCOME else b""
        except wire.ProtocolError:
            raise StoreError(f"{self.address} is not a gpucoll store (it answered something else): "
                             "check GPUCOLL_STORE.") from None
        if not wire.proofs_match(proof, wire.server_proof(self._secret, server_nonce, nonce)):
            raise AuthenticationError(
                f"the server at {self.address} could not prove it knows this job's secret: it is not "
                "this job's store (check GPUCOLL_STORE and GPUCOLL_STORE_SECRET).")

    def _read(self, sock, limit):
        """One frame -> (opcode, Fields). A CLOSING frame (the server hangs up and says
        why) becomes a StoreError."""
        size = wire.frame_size(recv_exact(sock, wire.HEADER_SIZE), limit)
        fields = wire.Fields(recv_exact(sock, size))
        if fields.op == wire.CLOSING:
            raise _HungUp(f"the store at {self.address} closed this connection: {fields.text()}")
        return fields.op, fields

    # --- requests ---------------------------------------------------------------------

    def _request(self, frame, expect, parse, wait=None):
        """Send one request and read its reply under the lock; returns parse(fields).
        `wait` is the server-side deadline of a get or wait: the socket timeout must
        outlast it. A timed-out get or wait returns (missing count, named keys)."""
        with self._lock:
            sock = self._sock
            if sock is None:
                raise StoreError(f"the connection to the store at {self.address} is closed.")
            patience = self.timeout if wait is None else wait + REPLY_GRACE
            try:
                sock.settimeout(None if math.isinf(patience) else patience)
                sock.sendall(frame)
                op, fields = self._read(sock, self.max_frame)
                if op == wire.ERROR:
                    raise _Refused(fields.text())
                if op == wire.TIMED_OUT:
                    result = _Missing(fields.u32(), [fields.key().decode(errors="replace")
                                                     for _ in range(fields.u32())])
                elif op == expect:
                    result = parse(fields)
                else:
                    raise wire.ProtocolError(f"answered {wire.NAMES.get(op, hex(op))} to a request that "
                                             f"expects {wire.NAMES[expect]}")
                fields.end()
                return result
            except _Refused as exc:
                # The request was well formed but could not be done; the connection is fine.
                raise StoreError(f"the store at {self.address} refused the request: {exc}") from None
            except socket.timeout:
                self._drop()
                raise StoreError(f"the store at {self.address} did not answer within {patience:g} s.") from None
            except (OSError, EOFError) as exc:
                self._drop()
                raise StoreError(
                    f"lost the connection to the store at {self.address} ({exc or type(exc).__name__}): "
                    "the launcher or rank 0 that serves it has probably exited.") from None
            except wire.ProtocolError as exc:
                self._drop()
                raise StoreError(f"the store at {self.address} sent a malformed answer: {exc}") from None
            except BaseException:
                # Interrupted mid-request (e.g. Ctrl-C), or the server hung up: a late reply
                # would be read by the next request, so this connection cannot be used again.
                self._drop()
                raise

    @property
    def max_frame(self):
        """The largest reply accepted: a value plus room for the framing."""
        return self.max_value_size + (1 << 20)

    def _drop(self):
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _key(self, key, allow_empty=False):
        raw = key.encode() if isinstance(key, str) else bytes(key)
        if len(raw) > wire.MAX_KEY_SIZE or not (raw or allow_empty):
            raise InvalidUsageError(f"store key {key!r} must have 1 to {wire.MAX_KEY_SIZE} bytes "
                                    f"(store {self.address}).")
        return raw

    def _value(self, key, value):
        if isinstance(value, str):
            value = value.encode()
        try:
            value = memoryview(value).cast("B")
        except TypeError:
            raise InvalidUsageError(f"the value for store key {key!r} must be bytes, not "
                                    f"{type(value).__name__} (store {self.address}).") from None
        if len(value) > self.max_value_size:
            raise InvalidUsageError(f"the value for store key {key!r} has {len(value)} bytes, over the "
                                    f"store's limit of {self.max_value_size} (store {self.address}).")
        return value

    def _deadline(self, timeout):
        timeout = self.timeout if timeout is None else float(timeout)
        if not timeout >= 0:
            raise InvalidUsageError(f"timeout must be >= 0 seconds, not {timeout} (store {self.address}).")
        return timeout

    def _raise_timeout(self, missing, what, timeout):
        more = f" and {missing.total - len(missing.keys)} more" if missing.total > len(missing.keys) else ""
        raise GpucollTimeout(f"{what} not set at the store {self.address} within {timeout:g} s "
                             f"(missing: {', '.join(map(repr, missing.keys))}{more}).")

    def set(self, key, value):
        """Store `value` (bytes) under `key`, replacing any previous value; wakes its waiters."""
        frame = wire.frame(wire.SET, wire.key(self._key(key)), wire.value(self._value(key, value)))
        self._request(frame, wire.OK, _nothing)

    def get(self, key, timeout=None):
        """The value of `key`, waiting up to `timeout` seconds (default: the client's
        timeout) for someone to set it; gpucoll.errors.TimeoutError after that."""
        raw, timeout = self._key(key), self._deadline(timeout)
        result = self._request(wire.frame(wire.GET, wire.key(raw), wire.f64(timeout)), wire.VALUE,
                               wire.Fields.value, wait=timeout)
        if isinstance(result, _Missing):
            self._raise_timeout(result, f"key {key!r} was", timeout)
        return result

    def add(self, key, amount=1):
        """Atomically add `amount` to the counter at `key` (absent counts as 0) and return the
        new total. The value is stored as decimal ASCII, so get() then reads b'3'."""
        raw, amount = self._key(key), int(amount)
        if not -(1 << 63) <= amount < (1 << 63):
            raise InvalidUsageError(f"add() amount {amount} does not fit 64 bits (store {self.address}).")
        return self._request(wire.frame(wire.ADD, wire.key(raw), wire.i64(amount)), wire.INT, wire.Fields.i64)

    def compare_set(self, key, expected, desired):
        """Set `key` to `desired` if it now holds `expected` (None or b'' means: only if
        `key` is absent). Returns the value stored afterwards (b'' if the key is absent):
        `desired` when the swap happened, else what was there."""
        raw = self._key(key)
        expected = b"" if expected is None else self._value(key, expected)
        frame = wire.frame(wire.COMPARE_SET, wire.key(raw), wire.value(expected),
                           wire.value(self._value(key, desired)))
        return self._request(frame, wire.VALUE, wire.Fields.value)

    def wait(self, keys, timeout=None):
        """Block until every key in `keys` exists, up to `timeout` seconds (default: the
        client's timeout); gpucoll.errors.TimeoutError names the missing ones."""
        if isinstance(keys, (str, bytes)):
            keys = [keys]
        raws, timeout = [self._key(k) for k in keys], self._deadline(timeout)
        frame = wire.frame(wire.WAIT, wire.f64(timeout), wire.u32(len(raws)), *map(wire.key, raws))
        if len(frame) > 2 * self.max_value_size:
            raise InvalidUsageError(f"wait() on {len(raws)} keys is too large a request for the store at "
                                    f"{self.address}; wait on fewer keys at a time.")
        result = self._request(frame, wire.OK, _nothing, wait=timeout)
        if isinstance(result, _Missing):
            self._raise_timeout(result, f"{result.total} of the {len(raws)} keys waited for were", timeout)

    def delete(self, key):
        """Remove `key`; True if it existed."""
        return bool(self._request(wire.frame(wire.DELETE, wire.key(self._key(key))), wire.INT, wire.Fields.i64))

    def num_keys(self, prefix=""):
        """How many keys the store holds (only those starting with `prefix`, if given)."""
        frame = wire.frame(wire.NUM_KEYS, wire.key(self._key(prefix, allow_empty=True)))
        return self._request(frame, wire.INT, wire.Fields.i64)

    def ping(self):
        """Round-trip time to the server, in seconds."""
        start = time.perf_counter()
        self._request(wire.frame(wire.PING), wire.OK, _nothing)
        return time.perf_counter() - start

    def close(self):
        """Close the connection (the store and its keys stay)."""
        with self._lock:
            self._drop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"StoreClient({self.address!r})"


# ======================================================================================
# Prefix wrapper
# ======================================================================================

class PrefixStore:
    """A view of a store where every key is `prefix/key`, so that independent users
    (communicators, say) cannot collide::

        comm_store = PrefixStore(store, "comm/3")
        comm_store.set("root", b"...")     # stored as "comm/3/root"

    close() does nothing: the wrapped store belongs to whoever made it.
    """

    def __init__(self, store, prefix):
        self.store = store
        self.prefix = prefix
        self.address = getattr(store, "address", "?")

    def _k(self, key):
        return f"{self.prefix}/{key}"

    def set(self, key, value):
        """See StoreClient.set."""
        self.store.set(self._k(key), value)

    def get(self, key, timeout=None):
        """See StoreClient.get."""
        return self.store.get(self._k(key), timeout=timeout)

    def add(self, key, amount=1):
        """See StoreClient.add."""
        return self.store.add(self._k(key), amount)

    def compare_set(self, key, expected, desired):
        """See StoreClient.compare_set."""
        return self.store.compare_set(self._k(key), expected, desired)

    def wait(self, keys, timeout=None):
        """See StoreClient.wait."""
        if isinstance(keys, (str, bytes)):
            keys = [keys]
        self.store.wait([self._k(k) for k in keys], timeout=timeout)

    def delete(self, key):
        """See StoreClient.delete."""
        return self.store.delete(self._k(key))

    def num_keys(self, prefix=""):
        """Keys under this prefix (and under `prefix` inside it, if given)."""
        return self.store.num_keys(self._k(prefix))

    def ping(self):
        """See StoreClient.ping."""
        return self.store.ping()

    def close(self):
        """Nothing to do: the wrapped store is not ours to close."""

    def __repr__(self):
        return f"PrefixStore({self.store!r}, {self.prefix!r})"


# ======================================================================================
# python -m gpucoll.bootstrap.store
# ======================================================================================

def main(argv=None):
    """Serve a store in the foreground until interrupted."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gpucoll.bootstrap.store",
                                     description="Serve a gpucoll rendezvous store. The secret is read "
                                                 "from GPUCOLL_STORE_SECRET (hex).")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=0, help="port (default 0: a free one)")
    parser.add_argument("--max-value-size", type=config.parse_size, default=DEFAULT_MAX_VALUE_SIZE,
                        help="largest value accepted, e.g. 64M")
    args = parser.parse_args(argv)
    secret = config.STORE_SECRET.get()
    if not secret:
        parser.error("GPUCOLL_STORE_SECRET is not set: export the job's secret as hex, e.g. "
                     "GPUCOLL_STORE_SECRET=$(python -c 'import secrets; print(secrets.token_hex(16))')")
    try:
        server = StoreServer(args.host, args.port, secret, max_value_size=args.max_value_size).start()
    except (StoreError, ConfigError) as exc:
        parser.exit(1, f"error: {exc}\n")
    print(f"gpucoll store serving on {server.address}", flush=True)
    try:
        server.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


if __name__ == "__main__":
    main()
