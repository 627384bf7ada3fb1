"""An attacker on the job's host who does not hold the job's secret (tests/test_trust_net.py).
It prints one `ATTACK {json}` line with what it saw.

    python trust_attacker.py tcp ADDR NSOCKS
        connect NSOCKS sockets to a rank's TCP listener, each with the hello gpucoll once
        took without a secret (rank 0 -> rank 1, communicator "world/coll", stripe i of
        NSOCKS), then answer every message that comes with the same header and 1000.0s.
    python trust_attacker.py replay ADDR CAPTURE (pickle MARKER | huge)
        replay CAPTURE (the bytes a real rank sent on its point-to-point channel) to a
        rank's listener, then one more frame from "rank 0" with tag 7: a pickle that creates
        MARKER when loaded, or a header announcing 2^62 bytes.
"""
import json
import pickle
import selectors
import socket
import struct
import sys
import time

from gpucoll.engines.p2p.host import EAGER, FRAME, comm_key


def host_port(text):
    host, _, port = text.rpartition(":")
    return host, int(port)


def closed_by_peer(sock, seconds):
    """True when the rank closed (or reset) the connection within `seconds`, reading and
    counting whatever it sent first."""
    sock.settimeout(seconds)
    got = 0
    try:
        while True:
            data = sock.recv(1 << 16)
            if not data:
                return True, got
            got += len(data)
    except socket.timeout:
        return False, got
    except OSError:
        return True, got


def tcp(address, nsocks):
    ident = b"world/coll"
    socks = []
    for index in range(nsocks):
        s = socket.create_connection(host_port(address))
        s.sendall(struct.pack("!4sHHHIIH", b"GCTC", 1, index, nsocks, 0, 1, len(ident)) + ident)
        socks.append(s)
    print("CONNECTED", flush=True)
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    received = answered = 0
    pending = {s: b"" for s in socks}
    open_socks = set(socks)
    deadline = time.monotonic() + 20
    while open_socks and time.monotonic() < deadline:
        for key, _ in sel.select(0.5):
            s = key.fileobj
            try:
                data = s.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                sel.unregister(s)
                open_socks.discard(s)
                continue
            received += len(data)
            pending[s] += data
            while len(pending[s]) >= 16:   # header: u64 payload bytes, magic, dtype, op, root
                nbytes = struct.unpack_from("=Q", pending[s])[0]
                total = 16 + -(-nbytes // 16) * 16
                if len(pending[s]) < total:
                    break
                header, pending[s] = pending[s][:16], pending[s][total:]
                body = struct.pack(f"={nbytes // 8}d", *([1000.0] * (nbytes // 8)))
                s.setblocking(True)
                s.sendall(header + body + bytes(total - 16 - len(body)))
                s.setblocking(False)
                answered += 1
    print("ATTACK " + json.dumps({"received": received, "answered": answered,
                                  "closed_by_peer": not open_socks}), flush=True)


def frame(tag, nbytes):
    """An eager frame header on COMM_WORLD (the source is the channel's)."""
    return FRAME.pack(comm_key("world"), tag, EAGER, nbytes, 0, 0, 0)


class Marker:
    """Loading this pickle opens (creates) the marker file: code run by the receiver."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def replay(address, capture, what, marker=None):
    with open(capture, "rb") as f:
        recorded = f.read()
    s = socket.create_connection(host_port(address))
    if what == "pickle":
        payload = pickle.dumps(Marker(marker))
        extra = frame(7, len(payload)) + payload
    else:
        extra = frame(7, 1 << 62)
    try:
        s.sendall(recorded + extra)
    except OSError:
        pass
    closed, got = closed_by_peer(s, 3.0)
    print("ATTACK " + json.dumps({"replayed": len(recorded), "closed_by_peer": closed, "received": got}),
          flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "tcp":
        tcp(sys.argv[2], int(sys.argv[3]))
    else:
        replay(sys.argv[2], sys.argv[3], sys.argv[4], *sys.argv[5:])
