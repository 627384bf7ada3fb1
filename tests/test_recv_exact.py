"""The one reader of fixed-size pieces from a socket (transports/handshake.recv_exact), used by
the handshake, the store client and gpurun's wire: it assembles pieces that arrive in bits,
and a peer that closes early gives EOFError, which each caller maps to its own error.
Real TCP sockets on 127.0.0.1; the peer is a thread."""
import socket
import struct
import threading
import time

import pytest

from gpucoll.transports import handshake
from launcher import wire


def _pair():
    with socket.create_server(("127.0.0.1", 0)) as server:
        here = socket.create_connection(server.getsockname())
        there, _ = server.accept()
    here.settimeout(10)
    return here, there


def _peer(sock, pieces, then_read=0):
    """In a thread: read `then_read` bytes, write `pieces` one by one with a pause, close."""
    def run():
        if then_read:
            handshake.recv_exact(sock, then_read)
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(0.02)
        sock.close()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_pieces_that_arrive_in_bits_are_assembled():
    here, there = _pair()
    data = bytes(range(200))
    _peer(there, [data[i:i + 7] for i in range(0, len(data), 7)])
    with here:
        assert handshake.recv_exact(here, 150) == data[:150]
        assert handshake.recv_exact(here, 50) == data[150:]
        assert handshake.recv_exact(here, 0) == b""


def test_a_peer_that_closes_early_gives_eof_saying_how_far_it_got():
    here, there = _pair()
    _peer(there, [b"abc"])
    with here, pytest.raises(EOFError, match="closed the connection after 3 of 8 bytes"):
        handshake.recv_exact(here, 8)


def test_gpurun_wire_maps_a_short_message_to_wire_error():
    here, there = _pair()
    _peer(there, [struct.pack("!I", 100), b'{"half":'])
    with here, pytest.raises(wire.WireError, match=r"connection closed \(.*after 8 of 100 bytes\)"):
        wire.recv(here)


def test_the_handshake_maps_a_short_challenge_to_handshake_error():
    here, there = _pair()
    # the acceptor reads the hello, answers half a challenge and hangs up
    hello_size = handshake._HELLO.size + len("c")
    _peer(there, [b"x" * (handshake._CHALLENGE_SIZE // 2)], then_read=hello_size)
    claim = handshake.Claim(handshake.Purpose.AGENT, 0, -1, "c")
    with here, pytest.raises(handshake.HandshakeError, match="closed the connection during the handshake"):
        handshake.connect(here, b"secret", claim, timeout=10)
