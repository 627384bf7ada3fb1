"""The rendezvous store: a small TCP key-value store's client and a prefix wrapper (the
server, and the command that serves one, are in store_server.py).

The launcher (or rank 0) serves it; every rank connects with the job's secret and
uses it to swap addresses and meet at barriers::

    server = StoreServer("0.0.0.0", 0, secret).start()      # in the launcher
    store = StoreClient.from_env()                           # in each rank
    store.set(f"addr/{rank}", my_address)
    peer = store.get(f"addr/{(rank + 1) % size}")            # blocks until it is set
    if store.add("arrived") == size:
        store.set("all-arrived", b"1")

The server (store_server.py) runs one asyncio event loop in a daemon thread; a get or wait
for a key that does not exist yet is answered when the key is set or its deadline passes. The
wire format is in store_protocol.py.

Run a server in the foreground (the secret comes from GPUCOLL_STORE_SECRET)::

    python -m gpucoll.bootstrap.store_server --host 0.0.0.0 --port 29500
"""
import math
import random
import socket
import threading
import time

from ..base import config, log
from ..base.errors import AuthenticationError, ConfigError, InvalidUsageError, StoreError
from ..base.errors import TimeoutError as GpucollTimeout
from ..transports.handshake import recv_exact
from . import store_protocol as wire

__all__ = ["StoreClient", "PrefixStore", "StoreUnreachableError", "DEFAULT_MAX_VALUE_SIZE"]

DEFAULT_MAX_VALUE_SIZE = 64 << 20
# How much longer than the server-side deadline a client waits for the answer to a
# get or wait before it decides the server is gone.
REPLY_GRACE = 30.0


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
        self.requests = 0  # sent so far: what joining a job costs the store (docs/launcher.md)
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
            self.requests += 1
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
        timeout) for someone to set it; gpucoll.base.errors.TimeoutError after that."""
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
        client's timeout); gpucoll.base.errors.TimeoutError names the missing ones."""
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

    def gather(self, prefix, count, timeout=None):
        """The values of the keys `prefix + "0"` to `prefix + str(count - 1)`, in order, once
        all exist: one request however many there are (an all-gather is a set and a gather
        on every rank). TimeoutError after `timeout` names the missing keys."""
        raw, timeout = self._key(prefix), self._deadline(timeout)
        if not 0 <= count < (1 << 32):
            raise InvalidUsageError(f"gather() of {count} keys: give a count from 0 to 2**32-1.")
        frame = wire.frame(wire.GATHER, wire.key(raw), wire.u32(count), wire.f64(timeout))
        result = self._request(frame, wire.VALUE, wire.Fields.value, wait=timeout)
        if isinstance(result, _Missing):
            self._raise_timeout(result, f"{result.total} of the {count} keys under {prefix!r} were", timeout)
        try:
            return wire.unpack_parts(result, count)
        except wire.ProtocolError as exc:
            raise StoreError(f"the store at {self.address} sent a malformed answer: {exc}") from None

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

    def gather(self, prefix, count, timeout=None):
        """See StoreClient.gather."""
        return self.store.gather(self._k(prefix), count, timeout=timeout)

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
