"""The control connection between the head gpurun and its agents (one per host).

Messages are JSON objects, each framed by a 4-byte big-endian length. The connection
opens with the job's handshake (gpucoll/transports/handshake.py: both sides prove the
job's secret over fresh nonces, and the agent's node index is bound to its proof), so
neither a stray client nor a stray head can join a job; after that:

    agent -> head   hello {node, host, pid, slots}       once, after the handshake
    head -> agent   start {job_id, size, ranks, store, command, module, exports, ...}
    agent -> head   exit  {rank, pid, returncode, tail}  each rank as it ends
    agent -> head   done  {code}                         all local ranks have ended
    head -> agent   stop  {signal}                       end the local ranks (then SIGKILL after grace)
    head -> agent   signal {signal}                      forward a signal (USR1, USR2)

Output does not travel here: an agent's ranks write to the agent's stdout and stderr,
which reach the head through whatever started the agent (ssh, srun, a local pipe).
"""
import hashlib
import json
import socket
import struct

from gpucoll.base import config
from gpucoll.transports import handshake

_LEN = struct.Struct("!I")
MAX_MESSAGE = 16 << 20


class WireError(Exception):
    """The peer broke the protocol, failed the handshake or went away."""


def send(sock, msg):
    data = json.dumps(msg, separators=(",", ":")).encode()
    sock.sendall(_LEN.pack(len(data)) + data)


def recv(sock):
    """One message, blocking (the socket's timeout applies)."""
    try:
        (n,) = _LEN.unpack(handshake.recv_exact(sock, _LEN.size))
        if n > MAX_MESSAGE:
            raise WireError(f"message of {n} bytes is too large")
        return json.loads(handshake.recv_exact(sock, n))
    except EOFError as exc:
        raise WireError(f"connection closed ({exc})") from None


def agent_handshake(sock, secret, node, timeout=handshake.HANDSHAKE_TIMEOUT):
    """Prove that this agent (of node `node`) holds the job's secret, and check that the
    head does; raises WireError when the head fails or refuses. The head's side is a
    handshake.PeerListener (launcher/cluster.py)."""
    claim = handshake.Claim(handshake.Purpose.AGENT, node, -1)
    try:
        handshake.connect(sock, secret, claim, timeout)
    except (handshake.HandshakeError, OSError) as exc:
        raise WireError(f"handshake with the head failed: {exc}") from None


class Reader:
    """Non-blocking side of a connection for a selector loop: `feed()` after the socket
    is readable returns the complete messages that arrived, or None once it closed."""

    def __init__(self, sock):
        self.sock = sock
        self.fd = sock.fileno()
        self._buf = bytearray()

    def feed(self):
        try:
            data = self.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            return None
        if not data:
            return None
        self._buf += data
        out = []
        while len(self._buf) >= _LEN.size:
            (n,) = _LEN.unpack_from(self._buf)
            if len(self._buf) < _LEN.size + n:
                break
            out.append(json.loads(bytes(self._buf[_LEN.size:_LEN.size + n])))
            del self._buf[:_LEN.size + n]
        return out

    def send(self, msg):
        """Best effort: False when the peer is gone."""
        try:
            self.sock.setblocking(True)
            send(self.sock, msg)
            return True
        except OSError:
            return False
        finally:
            try:
                self.sock.setblocking(False)
            except OSError:
                pass


def split_address(text):
    """'host:port' -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def derived_secret(master):
    """The secret of a job whose gpurun processes were started by hand with no
    GPUCOLL_STORE_SECRET: every node computes the same one from the master address. It
    keeps other jobs out by accident only; set GPUCOLL_STORE_SECRET for protection."""
    return hashlib.sha256(f"gpucoll-agents:{master}".encode()).digest()[:16]


def job_secret(master, text=None):
    """The secret of a job whose gpurun processes were started by hand: `text` (hex), else
    GPUCOLL_STORE_SECRET's, else derived_secret(master). Raises ValueError when it is not hex,
    without quoting it (it is a secret)."""
    if text is None:
        text = config.STORE_SECRET.get()
    if not text:
        return derived_secret(master)
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"the job's secret ({config.STORE_SECRET.name}) must be hex") from None


def connect(address, deadline_s, clock):
    """Connect to host:port, retrying until `deadline_s` (the head may start later)."""
    import time

    host, port = split_address(address)
    last = None
    while True:
        try:
            return socket.create_connection((host, port), timeout=5.0)
        except OSError as exc:
            last = exc
        if clock() >= deadline_s:
            raise WireError(f"cannot reach the head gpurun at {address}: {last}")
        time.sleep(0.2)
