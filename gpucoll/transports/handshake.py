"""The handshake every gpucoll listener runs before it takes a peer, and its primitives.

Whoever connects (the connector) must prove it holds the job's secret, and so must the
process it reached (the acceptor); neither proof can be replayed, because each covers a
nonce the other side has just drawn, and each names what the connector claims to be::

    connector                                               acceptor
    HELLO   magic, purpose, nonce_c, claim             -->
                                                       <--  CHALLENGE nonce_a,
                                                                MAC(secret, "accept", HELLO, nonce_a)
    PROOF   MAC(secret, "connect", HELLO, nonce_a)     -->  (checked: the peer is taken)

The claim is (sender rank, target rank, stripe, stripe count, communicator id); the MACs
cover the whole HELLO, so a proof holds only for the claim it came with. The acceptor
checks the magic, the purpose and the target before it answers, reads exactly the
handshake's bytes (whatever follows belongs to the caller) and gives each connection
HANDSHAKE_TIMEOUT seconds. `PeerListener` runs the acceptor's side of every connection at
once on one thread, so no number of silent clients delays a real peer::

    listener = PeerListener(sock, secret, Purpose.TCP, rank, on_peer, "TCP listener of rank 1")
    # on_peer(sock, claim) is called for each authenticated peer (a blocking socket)
    claim = Claim(Purpose.TCP, sender=0, target=1, comm_id="world/coll", stripe=0, nsocks=2)
    connect(sock, secret, claim, timeout=10)        # the connector's side; raises HandshakeError

The MAC primitives (`new_nonce`, `mac`, `proofs_match`) are also those of the rendezvous
store's own handshake (bootstrap/store_protocol.py). Nothing here hides the bytes that
follow the handshake: peers are authenticated, the traffic is not encrypted.
"""
import collections
import enum
import hashlib
import hmac
import itertools
import os
import selectors
import socket
import struct
import threading
import time
from typing import NamedTuple

from ..base import log

NONCE_SIZE = 32
MAC_SIZE = 32
MAGIC = b"GCPEER01"
MAX_COMM_ID = 1024
# A connection that has not completed the handshake by then is closed.
HANDSHAKE_TIMEOUT = 10.0
# Connections that may be in the handshake at once; past this the oldest is closed, so
# junk connections cannot use up the process's file descriptors (a real peer completes
# its handshake in one round trip, long before it would be the oldest).
MAX_PENDING = 256

_HELLO = struct.Struct("!8sB32siiHHH")  # magic, purpose, nonce, sender, target, stripe, nsocks, id length
_CHALLENGE_SIZE = NONCE_SIZE + MAC_SIZE


class Purpose(enum.IntEnum):
    """What a connection is for; an acceptor takes one purpose only."""

    TCP = 1    # a stripe of a TCP channel (transports/tcp.py)
    P2P = 2    # a point-to-point channel is built or asked for (transports/links.py)
    AGENT = 3  # a host agent's control connection to the head gpurun (launcher/)
    OFI = 4    # the control socket of an OFI channel (transports/ofi.py)


def _purposes(purpose):
    """A listener's purposes as a tuple of Purpose."""
    return tuple(Purpose(p) for p in purpose) if isinstance(purpose, (tuple, list, set)) else (Purpose(purpose),)


class Claim(NamedTuple):
    """Who the connector says it is, and what for. Ranks are world ranks (-1: not a rank,
    e.g. the head gpurun); stripe and nsocks only mean something for TCP channels."""

    purpose: Purpose
    sender: int
    target: int
    comm_id: str = ""
    stripe: int = 0
    nsocks: int = 1


class HandshakeError(Exception):
    """The other side did not complete the handshake: it broke the format, named the
    wrong purpose or target, could not prove the secret, or went silent."""


# --- primitives ---------------------------------------------------------------------------

def new_nonce():
    return os.urandom(NONCE_SIZE)


def mac(secret, label, *parts):
    """HMAC-SHA256 keyed by the job's secret over a label and the parts, concatenated."""
    return hmac.new(secret, b"".join((label,) + parts), hashlib.sha256).digest()


def proofs_match(a, b):
    return hmac.compare_digest(a, b)


def _hello(claim, nonce):
    ident = claim.comm_id.encode()
    if len(ident) > MAX_COMM_ID:
        raise ValueError(f"communicator id of {len(ident)} bytes exceeds {MAX_COMM_ID}")
    return _HELLO.pack(MAGIC, int(claim.purpose), nonce, claim.sender, claim.target, claim.stripe,
                       claim.nsocks, len(ident)) + ident


def _accept_proof(secret, hello, nonce):
    return mac(secret, b"gpucoll-peer-accept\0", hello, nonce)


def _connect_proof(secret, hello, nonce):
    return mac(secret, b"gpucoll-peer-connect\0", hello, nonce)


# --- the connector's side -----------------------------------------------------------------

def connect(sock, secret, claim, timeout):
    """Run the connector's side on a connected blocking socket within `timeout` seconds.
    Raises HandshakeError (the peer is not one of this job's processes, refused the claim,
    or did not answer) or OSError; the socket is left blocking without a timeout."""
    hello = _hello(claim, new_nonce())
    sock.settimeout(timeout)
    try:
        sock.sendall(hello)
        answer = recv_exact(sock, _CHALLENGE_SIZE)
    except socket.timeout:
        raise HandshakeError(f"no answer to the handshake within {timeout:g} s") from None
    except (ConnectionError, EOFError):
        raise HandshakeError("the peer closed the connection during the handshake (it refused "
                             "the claim, or it is not a gpucoll process)") from None
    nonce = answer[:NONCE_SIZE]
    if not proofs_match(answer[NONCE_SIZE:], _accept_proof(secret, hello, nonce)):
        raise HandshakeError("the peer could not prove it holds this job's secret (it is not a "
                             "process of this job)")
    sock.sendall(_connect_proof(secret, hello, nonce))
    sock.settimeout(None)


def recv_exact(sock, n):
    """Exactly n bytes from a blocking socket (its timeout applies), as a bytearray: the one
    reader of fixed-size pieces (handshakes, store frames, gpurun's wire). Raises EOFError when
    the peer closes the connection first (callers map it to their own error), socket.timeout
    and OSError as the socket does."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        chunk = sock.recv_into(view[got:])
        if chunk == 0:
            raise EOFError(f"the peer closed the connection after {got} of {n} bytes")
        got += chunk
    return buf


# --- the acceptor's side ------------------------------------------------------------------

class Accepting:
    """One accepted connection in the handshake, driven without blocking: call `pump()`
    when its socket is readable; it returns the Claim once the peer has proved the secret,
    None while more bytes are due, and raises HandshakeError when the peer fails."""

    def __init__(self, sock, secret, purpose, rank, deadline):
        sock.setblocking(False)
        self.sock, self.secret, self.rank, self.deadline = sock, secret, rank, deadline
        self.purposes = _purposes(purpose)
        self.claim = None
        self._hello = None
        self._nonce = None
        self._buf = b""
        self._want = _HELLO.size

    def pump(self):
        while True:
            try:
                part = self.sock.recv(self._want - len(self._buf))  # never past the handshake
            except (BlockingIOError, InterruptedError):
                return None
            except OSError as exc:
                raise HandshakeError(f"connection error: {exc}") from None
            if not part:
                raise HandshakeError("closed the connection during the handshake")
            self._buf += part
            if self._hello is None and not MAGIC.startswith(self._buf[:len(MAGIC)]):
                raise HandshakeError("not a gpucoll handshake (wrong magic)")
            if len(self._buf) < self._want:
                continue
            if self._hello is None:
                if self._got_hello():
                    continue
            else:
                return self._got_proof()

    def _got_hello(self):
        """True when the fixed part came in and the communicator id is still due."""
        if self.claim is None:
            _, purpose, _, sender, target, stripe, nsocks, idlen = _HELLO.unpack(self._buf[:_HELLO.size])
            if purpose not in self.purposes:
                raise HandshakeError(f"asked for purpose {purpose}, this listener serves "
                                     f"{'/'.join(p.name for p in self.purposes)} connections")
            if self.rank is not None and target != self.rank:
                raise HandshakeError(f"the hello names rank {target}, this is rank {self.rank}")
            if idlen > MAX_COMM_ID:
                raise HandshakeError(f"communicator id of {idlen} bytes (at most {MAX_COMM_ID})")
            self.claim = Claim(Purpose(purpose), sender, target, "", stripe, nsocks)
            if idlen:
                self._want += idlen
                return True
        try:
            comm_id = self._buf[_HELLO.size:].decode()
        except UnicodeDecodeError:
            raise HandshakeError("the communicator id is not UTF-8") from None
        self.claim = self.claim._replace(comm_id=comm_id)
        self._hello, self._buf, self._want = self._buf, b"", MAC_SIZE
        self._nonce = new_nonce()
        answer = self._nonce + _accept_proof(self.secret, self._hello, self._nonce)
        try:
            sent = self.sock.send(answer)
        except OSError as exc:
            raise HandshakeError(f"could not answer the hello: {exc}") from None
        if sent != len(answer):  # 64 bytes into an empty send buffer: only a dying socket
            raise HandshakeError("could not answer the hello in one write")
        return False

    def _got_proof(self):
        if not proofs_match(self._buf, _connect_proof(self.secret, self._hello, self._nonce)):
            raise HandshakeError(f"claimed to be rank {self.claim.sender} but could not prove it holds "
                                 "the job's secret")
        self.sock.setblocking(True)
        return self.claim


class PeerListener:
    """Accepts connections on a bound, listening socket and runs the acceptor's side of the
    handshake for all of them at once, on one thread, each within HANDSHAKE_TIMEOUT.

    Each peer that proves the secret and names `purpose` (or one of a tuple of purposes) and target `rank` (None: any
    target) is passed to `on_peer(sock, claim)` on that thread, as a blocking socket that
    the callee owns; an exception from `on_peer` closes that socket and is logged. Failed
    handshakes are closed and counted in a rate-limited warning that names `what`.
    """

    def __init__(self, sock, secret, purpose, rank, on_peer, what, timeout=HANDSHAKE_TIMEOUT):
        if not secret:
            raise ValueError("a listener needs the job's secret")
        self.sock, self.secret, self.purpose, self.rank = sock, bytes(secret), _purposes(purpose), rank
        self.on_peer, self.what, self.timeout = on_peer, what, float(timeout)
        host, port = sock.getsockname()[:2]
        self.address = f"{host}:{port}"
        self.refusals = log.Summary("NET", f"{what} refused connections that did not complete the handshake")
        self._pending = collections.OrderedDict()   # Accepting -> peer address text, oldest first
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        sock.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(sock, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"gpucoll-accept-{port}")
        self._thread.start()

    def _loop(self):
        try:
            while not self._closed:
                for key, _ in self._sel.select(self._wait()):
                    if key.data is None:
                        self._accept()
                    elif key.data == "wake":
                        return
                    elif key.data in self._pending:  # not closed earlier in this round
                        self._advance(key.data)
                now = time.monotonic()
                while self._pending and next(iter(self._pending)).deadline <= now:
                    self._refuse(next(iter(self._pending)), f"no complete handshake within {self.timeout:g} s", now)
                self.refusals.flush(now)
        finally:
            for pending in list(self._pending):
                self._drop(pending)
            self.refusals.flush(force=True)
            self._sel.close()
            os.close(self._wake_r)

    def _wait(self):
        due = [p.deadline for p in itertools.islice(self._pending, 1)]  # oldest first: the earliest
        if self.refusals.due() is not None:
            due.append(self.refusals.due())
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _accept(self):
        while True:
            try:
                conn, addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors and the like: drop the oldest pending one
                if self._pending:
                    self._refuse(next(iter(self._pending)), f"closed to make room ({exc})", time.monotonic())
                else:
                    self.refusals.note(f"the backlog: {exc}")
                    time.sleep(0.05)  # the connection stays queued: do not spin on it
                return
            if len(self._pending) >= MAX_PENDING:
                self._refuse(next(iter(self._pending)), f"closed: over {MAX_PENDING} handshakes pending",
                             time.monotonic())
            pending = Accepting(conn, self.secret, self.purpose, self.rank, time.monotonic() + self.timeout)
            self._pending[pending] = f"{addr[0]}:{addr[1]}"
            self._sel.register(conn, selectors.EVENT_READ, pending)

    def _advance(self, pending):
        try:
            claim = pending.pump()
        except HandshakeError as exc:
            self._refuse(pending, str(exc), time.monotonic())
            return
        if claim is None:
            return
        self._sel.unregister(pending.sock)
        del self._pending[pending]
        try:
            self.on_peer(pending.sock, claim)
        except Exception as exc:  # a bad claim (say, a rank out of range) must not stop the listener
            log.warn("NET", "%s dropped rank %d's connection: %s", self.what, claim.sender, exc)
            pending.sock.close()

    def _refuse(self, pending, why, now):
        self.refusals.note(f"{self._pending.get(pending, '?')}: {why}", now)
        self._drop(pending)

    def _drop(self, pending):
        self._pending.pop(pending, None)
        try:
            self._sel.unregister(pending.sock)
        except (KeyError, ValueError):
            pass
        pending.sock.close()

    def close(self):
        """Stop accepting, close the listening socket and the connections still pending."""
        if self._closed:
            return
        self._closed = True
        try:
            os.write(self._wake_w, b"x")
        except BrokenPipeError:  # the accept loop has already ended (its read end is closed)
            pass
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        os.close(self._wake_w)
        self.sock.close()
