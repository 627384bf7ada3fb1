"""Wire format of the rendezvous store, shared by its server and its client.

Every message is one frame::

    u32 length (big-endian, counts what follows) | u8 opcode | fields

Fields are fixed-size numbers or length-prefixed byte strings:

    key      u16 length + bytes (at most MAX_KEY_SIZE)
    value    u32 length + bytes (at most the server's max_value_size)
    f64      timeout in seconds, i64 for counters, u32 for counts

A connection starts with a handshake. The server sends HELLO (magic, version,
max_value_size, a random nonce); the client answers AUTH (its own nonce and an
HMAC-SHA256 over both nonces keyed by the job's secret); the server checks it
and answers WELCOME carrying its own proof, or AUTH_FAILED and closes. The
secret itself never crosses the wire. After that the client sends one request
at a time and reads one reply.

Instead of HELLO, a server that is busy (too many connections waiting to
authenticate) sends CLOSING with its reason and hangs up; a CLOSING frame during
the handshake means "try again", and the client does, until its connect timeout.

Anything that does not parse is a ProtocolError: the side that sees it drops
that connection and nothing else.
"""
import struct

# The MAC primitives are the ones every gpucoll handshake uses (re-exported here).
from ..transports.handshake import MAC_SIZE, NONCE_SIZE, mac, new_nonce, proofs_match  # noqa: F401

MAGIC = b"GCSTORE"
VERSION = 1
MAX_KEY_SIZE = 4096
# HELLO and AUTH are tiny; before a peer has authenticated it may not make the
# other side buffer more than this.
HANDSHAKE_FRAME_LIMIT = 256

# Requests (client -> server).
AUTH = 0x01
SET = 0x10
GET = 0x11
ADD = 0x12
COMPARE_SET = 0x13
WAIT = 0x14
DELETE = 0x15
NUM_KEYS = 0x16
PING = 0x17
GATHER = 0x18     # the values of prefix+"0" .. prefix+"N-1", waiting for them: one VALUE of packed parts

# Replies (server -> client).
HELLO = 0x80
WELCOME = 0x81
AUTH_FAILED = 0x82
OK = 0x83
VALUE = 0x84
INT = 0x85
TIMED_OUT = 0x86
ERROR = 0x87      # this request failed; the connection stays
CLOSING = 0x88    # the server drops this connection, and says why

NAMES = {AUTH: "AUTH", SET: "SET", GET: "GET", ADD: "ADD", COMPARE_SET: "COMPARE_SET",
         WAIT: "WAIT", DELETE: "DELETE", NUM_KEYS: "NUM_KEYS", PING: "PING", GATHER: "GATHER",
         HELLO: "HELLO", WELCOME: "WELCOME", AUTH_FAILED: "AUTH_FAILED", OK: "OK",
         VALUE: "VALUE", INT: "INT", TIMED_OUT: "TIMED_OUT", ERROR: "ERROR",
         CLOSING: "CLOSING"}

_HEADER = struct.Struct(">IB")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
HEADER_SIZE = 4


class ProtocolError(Exception):
    """A frame that breaks the wire format; the connection it came on is dropped."""


# --- building frames ------------------------------------------------------------------

def frame(op, *fields):
    """One frame: the length header, the opcode, then the already-encoded fields."""
    body_size = sum(len(f) for f in fields)
    return b"".join((_HEADER.pack(1 + body_size, op),) + fields)


def key(k):
    """Encode a key (bytes) as a field."""
    return _U16.pack(len(k)) + k


def value(v):
    """Encode a value (bytes-like) as a field."""
    return _U32.pack(len(v)) + bytes(v)


def u32(n):
    return _U32.pack(n)


def u64(n):
    return _U64.pack(n)


def i64(n):
    return _I64.pack(n)


def f64(x):
    return _F64.pack(x)


def hello(nonce, max_value_size):
    return frame(HELLO, MAGIC, _U16.pack(VERSION), u64(max_value_size), nonce)


def pack_parts(parts):
    """Values as one GATHER answer: each a u32 length and its bytes, in order."""
    return b"".join(_U32.pack(len(p)) + p for p in parts)


def unpack_parts(blob, count):
    """The `count` values of a GATHER answer."""
    view, parts, pos = memoryview(blob), [], 0
    for _ in range(count):
        if pos + 4 > len(view):
            raise ProtocolError("GATHER answer is truncated")
        (n,) = _U32.unpack_from(view, pos)
        if pos + 4 + n > len(view):
            raise ProtocolError("GATHER answer is truncated")
        parts.append(bytes(view[pos + 4:pos + 4 + n]))
        pos += 4 + n
    if pos != len(view):
        raise ProtocolError("GATHER answer has stray bytes")
    return parts


# --- reading frames -------------------------------------------------------------------

def frame_size(header, limit):
    """The body size announced by a 4-byte header, checked against `limit` before
    anyone allocates or waits for it."""
    (size,) = _U32.unpack(header)
    if size == 0:
        raise ProtocolError("empty frame (no opcode)")
    if size > limit:
        raise ProtocolError(f"frame of {size} bytes exceeds the limit of {limit} bytes")
    return size


class Fields:
    """Reads the fields of one frame body in order; any overrun or leftover byte is a
    ProtocolError. `Fields(body).op` is the opcode."""

    def __init__(self, body):
        self._buf = memoryview(body)
        self._pos = 1
        self.op = body[0]

    def _take(self, n):
        end = self._pos + n
        if end > len(self._buf):
            raise ProtocolError(f"{NAMES.get(self.op, hex(self.op))} frame is truncated")
        chunk = self._buf[self._pos:end]
        self._pos = end
        return chunk

    def _number(self, fmt):
        return fmt.unpack(self._take(fmt.size))[0]

    def u32(self):
        return self._number(_U32)

    def u64(self):
        return self._number(_U64)

    def i64(self):
        return self._number(_I64)

    def f64(self):
        return self._number(_F64)

    def raw(self, n):
        return bytes(self._take(n))

    def key(self):
        size = self._number(_U16)
        if size > MAX_KEY_SIZE:
            raise ProtocolError(f"key of {size} bytes exceeds the limit of {MAX_KEY_SIZE} bytes")
        return self.raw(size)

    def value(self):
        return self.raw(self._number(_U32))

    def text(self):
        """The rest of the frame as text (error messages)."""
        return self.raw(len(self._buf) - self._pos).decode("utf-8", "replace")

    def end(self):
        """Check that nothing is left over."""
        if self._pos != len(self._buf):
            extra = len(self._buf) - self._pos
            raise ProtocolError(f"{NAMES.get(self.op, hex(self.op))} frame has {extra} stray bytes")


# --- authentication -------------------------------------------------------------------

def client_proof(secret, server_nonce, client_nonce):
    """What the client sends to show it knows the secret."""
    return mac(secret, b"client", server_nonce, client_nonce)


def server_proof(secret, server_nonce, client_nonce):
    """What the server sends back; a different label, so neither proof can be replayed
    as the other."""
    return mac(secret, b"server", server_nonce, client_nonce)
