"""The rendezvous store's server: one asyncio event loop in a daemon thread (gpucoll/bootstrap/store.py
has the client; the wire format is in store_protocol.py).

A get or wait for a key that does not exist yet parks that connection (no thread, no loop
iteration is spent on it) and is answered when the key is set or its deadline passes. Frames are
checked before anything is buffered for them; a connection that breaks the protocol is dropped
alone. Connections that have not authenticated are capped and turned away in one summary log line
(store_gate.py). A module of its own so that ranks, which only connect, never import asyncio.
"""
import asyncio
import errno
import math
import socket
import threading

from ..base import config, log
from ..base.errors import ConfigError, StoreError
from . import store_protocol as wire
from .store import DEFAULT_MAX_VALUE_SIZE, as_secret, format_address
from .store_gate import Gate

__all__ = ["StoreServer"]

WANTED_BACKLOG = 4096
# A client that has connected but not authenticated is closed after this long,
# so idle junk connections cannot hold file descriptors forever.
HANDSHAKE_TIMEOUT = 10.0
# At most this many missing keys are named in a timeout message.
MAX_KEYS_NAMED = 20


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
        self._watchers = []        # (key prefix, callback(key)) called on the loop when such a key is set
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
        for prefix, callback in self._watchers:
            if key.startswith(prefix):
                callback(key.decode(errors="replace"))

    def watch(self, prefix, callback):
        """Call callback(key), on the store's thread, whenever a key starting with `prefix` (str)
        is set (the launcher's service for MPI's Spawn); it must not block."""
        self._watchers.append((prefix.encode(), callback))

    def value(self, key):
        """The value of `key` (str), or None (from any thread: one dict read)."""
        return self.data.get(key.encode())

    def put_threadsafe(self, key, value):
        """put() of a str key from another thread than the store's (before start(): at once)."""
        if self._loop is None:
            self.put(key.encode(), value)
        else:
            self._loop.call_soon_threadsafe(self.put, key.encode(), value)

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

    def _gather(self, fields):
        prefix, count, timeout = fields.key(), fields.u32(), fields.f64()
        fields.end()
        if count * 4 > self.server.max_value_size:  # could never fit an answer: refuse before listing keys
            return self._error(f"a gather of {count} values under {_show(prefix)} cannot fit the store's limit "
                               f"of {self.server.max_value_size} bytes")
        data = self.server.data
        keys = [prefix + str(i).encode() for i in range(count)]

        def answer():
            try:
                packed = wire.pack_parts([data[k] for k in keys])
            except KeyError as gone:
                return wire.frame(wire.ERROR, f"key {_show(gone.args[0])} was deleted during the gather".encode())
            if len(packed) > self.server.max_value_size:
                return wire.frame(wire.ERROR, f"the {count} values under {_show(prefix)} take {len(packed)} bytes, "
                                  f"over the store's limit of {self.server.max_value_size}".encode())
            return wire.frame(wire.VALUE, wire.value(packed))
        missing = [k for k in keys if k not in data]
        if not missing:
            self._reply(answer())
        else:
            self._park(missing, timeout, answer)

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
    wire.GATHER: _Connection._gather,
}


# ======================================================================================
# python -m gpucoll.bootstrap.store_server
# ======================================================================================

def main(argv=None):
    """Serve a store in the foreground until interrupted."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gpucoll.bootstrap.store_server",
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
