"""The TCP transport: real sockets on 127.0.0.1 between real processes, and the rules that
pick the network interface.

Rank 0 runs in the test process and rank 1 in a spawned child; the two meet through
TcpEndpoint exactly as ranks of a job do (rank 0 connects, rank 1 accepts), then move
bytes through the channel's function table with the GIL released.
"""
import multiprocessing
import os
import signal
import socket
import threading
import time
import traceback

import numpy as np
import pytest

from gpucoll.base.errors import ConfigError, InvalidUsageError, LostPeerError, TimeoutError
from gpucoll.transports import ifaces
from gpucoll.transports.ifaces import Interface
from gpucoll.transports.tcp import TcpEndpoint
from gpucoll._native.sock import TcpChannel, chan_recv_exact, chan_send_all, chan_sendrecv

SIZES = [0, 1, (1 << 20) + 3, 64 << 20]
SECRET = b"test-job-secret"
_ctx = multiprocessing.get_context("spawn")


def payload(rank, size, salt=0):
    """Bytes that rank sends: random, so a misplaced chunk cannot go unnoticed."""
    return np.random.default_rng([rank, size, salt]).integers(0, 256, size, dtype=np.uint8)


# --- the child process (rank 1) ----------------------------------------------------

def _exchange(ch, sizes, salt=0):
    for size in sizes:
        got = chan_sendrecv(ch.ptr, payload(1, size, salt), size, timeout=30)
        if bytes(got) != payload(0, size, salt).tobytes():
            return f"rank 1: {size} B from rank 0 differ"
    return None


def _one_way(ch, sizes):
    for size in sizes:
        got = chan_recv_exact(ch.ptr, size, timeout=30)
        if bytes(got) != payload(0, size).tobytes():
            return f"rank 1: {size} B from rank 0 differ"
        chan_send_all(ch.ptr, payload(1, size), timeout=30)
    return None


def _send_then_die(ch):
    chan_send_all(ch.ptr, payload(1, 8 << 20), timeout=30)
    os.kill(os.getpid(), signal.SIGKILL)


def _recv_then_die(ch):
    chan_recv_exact(ch.ptr, 1 << 20, timeout=30)
    os.kill(os.getpid(), signal.SIGKILL)


def _child(scenario, args, channel_kw, to_parent, to_child):
    try:
        with TcpEndpoint(1, SECRET, ifname="lo") as ep:
            to_parent.put(ep.address)
            ch = ep.channel(0, to_child.get(timeout=30), comm_id="test", timeout=30, **channel_kw)
            to_parent.put(("done", globals()[scenario](ch, *args)))
    except BaseException:
        to_parent.put(("raised", traceback.format_exc()))


class Pair:
    """Rank 0 here, rank 1 in a child process running `scenario`; both hold a channel."""

    def __init__(self, scenario, *args, **channel_kw):
        self.to_parent, self.to_child = _ctx.Queue(), _ctx.Queue()
        self.proc = _ctx.Process(target=_child, args=(scenario, args, channel_kw, self.to_parent,
                                                      self.to_child), daemon=True)
        self.proc.start()
        self.ep = TcpEndpoint(0, SECRET, ifname="lo")
        self.peer_address = self.to_parent.get(timeout=30)
        self.to_child.put(self.ep.address)
        self.ch = self.ep.channel(1, self.peer_address, comm_id="test", timeout=30, **channel_kw)

    def result(self):
        """What the child's scenario returned (None means it found no difference)."""
        kind, value = self.to_parent.get(timeout=60)
        assert kind == "done", value
        return value

    def close(self):
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
        self.ep.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --- data moves, exactly ---------------------------------------------------------

@pytest.mark.parametrize("nsocks", [1, 4])
def test_both_directions_at_once(nsocks):
    with Pair("_exchange", SIZES, nsocks=nsocks) as pair:
        assert pair.ch.nsocks == nsocks and pair.ch.ptr != 0 and pair.ch.peer == 1
        for size in SIZES:
            got = chan_sendrecv(pair.ch.ptr, payload(0, size), size, timeout=30)
            assert bytes(got) == payload(1, size).tobytes(), f"{size} B from rank 1 differ"
        assert pair.result() is None


def test_one_direction_at_a_time():
    sizes = [0, 1, 17, (1 << 20) + 3]
    with Pair("_one_way", sizes, nsocks=2) as pair:
        for size in sizes:
            chan_send_all(pair.ch, payload(0, size), timeout=30)
            out = np.empty(size, np.uint8)
            chan_recv_exact(pair.ch, size, timeout=30, out=out)
            assert np.array_equal(out, payload(1, size))
        assert pair.result() is None


def test_small_ring_wraps_at_every_offset():
    # A ring of 4112 B and 1000 B stripes over 3 sockets: chunks, ring wraps and message
    # ends fall at unrelated offsets, and sockets race each other into the window.
    sizes = [7, 4111, 4113, 1000, 3001, 100003, (2 << 20) + 5]
    kw = dict(nsocks=3, ring_bytes=4112, chunk_bytes=1000)
    with Pair("_exchange", sizes, 1, **kw) as pair:
        assert pair.ch.ring_bytes == 4112
        for size in sizes:
            got = chan_sendrecv(pair.ch.ptr, payload(0, size, 1), size, timeout=30)
            assert bytes(got) == payload(1, size, 1).tobytes(), f"{size} B from rank 1 differ"
        assert pair.result() is None


# --- a peer that dies is named, fast ---------------------------------------------

def test_peer_killed_while_we_receive():
    with Pair("_send_then_die", nsocks=4) as pair:
        out = np.empty(1 << 30, np.uint8)        # never fully touched: the peer dies first
        start = time.monotonic()
        with pytest.raises(LostPeerError) as info:
            chan_recv_exact(pair.ch, 1 << 30, timeout=30, out=out)
        assert time.monotonic() - start < 5
        message = str(info.value)
        assert "rank 1" in message and pair.peer_address in message, message
        assert info.value.ranks == (1,)
        assert np.array_equal(out[:8 << 20], payload(1, 8 << 20))
        pair.proc.join(10)
        assert pair.proc.exitcode == -signal.SIGKILL


def test_peer_killed_while_we_send():
    with Pair("_recv_then_die", nsocks=2) as pair:
        data = np.zeros(1 << 30, np.uint8)
        data[: 1 << 20] = payload(0, 1 << 20)
        start = time.monotonic()
        with pytest.raises(LostPeerError) as info:
            chan_send_all(pair.ch, data, timeout=30)
        assert time.monotonic() - start < 5
        assert "rank 1" in str(info.value) and pair.peer_address in str(info.value)


# --- connecting ------------------------------------------------------------------

def _both(fn0, fn1):
    """Run fn0 here and fn1 in a thread; return both results or exceptions."""
    box = {}

    def run1():
        try:
            box[1] = fn1()
        except BaseException as exc:
            box[1] = exc

    t = threading.Thread(target=run1)
    t.start()
    try:
        box[0] = fn0()
    except BaseException as exc:
        box[0] = exc
    t.join(30)
    return box[0], box[1]


def test_channels_are_cached_per_communicator_and_peer():
    with TcpEndpoint(0, SECRET, ifname="lo") as ep0, TcpEndpoint(1, SECRET, ifname="lo") as ep1:
        a0, a1 = _both(lambda: ep0.channel(1, ep1.address, "world", nsocks=2, timeout=10),
                       lambda: ep1.channel(0, ep0.address, "world", nsocks=2, timeout=10))
        assert ep0.channel(1, ep1.address, "world", nsocks=2) is a0
        b0, b1 = _both(lambda: ep0.channel(1, ep1.address, "split-1", nsocks=1, timeout=10),
                       lambda: ep1.channel(0, ep0.address, "split-1", nsocks=1, timeout=10))
        assert b0 is not a0 and b0.nsocks == 1
        # The two communicators' streams stay apart.
        _both(lambda: chan_send_all(b0, b"second", 10), lambda: chan_send_all(a1, b"first!", 10))
        assert bytes(chan_recv_exact(a0, 6, 10)) == b"first!"
        assert bytes(chan_recv_exact(b1, 6, 10)) == b"second"
        a0.close()
        assert a0.ptr == 0 and a0.closed
        with pytest.raises(InvalidUsageError):
            chan_send_all(a0, b"x", 1)


def test_nsocks_must_agree():
    with TcpEndpoint(0, SECRET, ifname="lo") as ep0, TcpEndpoint(1, SECRET, ifname="lo") as ep1:
        _, r1 = _both(lambda: ep0.channel(1, ep1.address, "c", nsocks=2, timeout=5),
                      lambda: ep1.channel(0, ep0.address, "c", nsocks=4, timeout=5))
        assert isinstance(r1, ConfigError), r1
        assert "GPUCOLL_NSOCKS" in str(r1) and "rank 0" in str(r1)


def test_connect_timeout_names_the_peer():
    with socket.socket() as hole:            # a bound port where nobody listens
        hole.bind(("127.0.0.1", 0))
        address = "127.0.0.1:%d" % hole.getsockname()[1]
        with TcpEndpoint(0, SECRET, ifname="lo") as ep:
            start = time.monotonic()
            with pytest.raises(TimeoutError) as info:
                ep.channel(3, address, "c", nsocks=2, timeout=0.5)
            assert time.monotonic() - start < 3
            assert "rank 3" in str(info.value) and address in str(info.value)


def test_accept_timeout_names_the_peer():
    with TcpEndpoint(5, SECRET, ifname="lo") as ep:
        with pytest.raises(TimeoutError) as info:
            ep.channel(2, "127.0.0.1:9", "c", nsocks=2, timeout=0.3)
        assert "rank 2 at 127.0.0.1:9" in str(info.value)


def test_channel_arguments_are_checked():
    with TcpEndpoint(0, SECRET, ifname="lo") as ep:
        with pytest.raises(InvalidUsageError):
            ep.channel(0, ep.address)
    with pytest.raises(InvalidUsageError):
        TcpChannel([], peer=1)
    with socket.create_server(("127.0.0.1", 0)) as srv:
        c = socket.create_connection(srv.getsockname())
        with pytest.raises(InvalidUsageError):
            TcpChannel([c.fileno()], ring_bytes=1000)       # not a multiple of 16
        c.close()


# --- interface selection -----------------------------------------------------------

SYNTHETIC = [
    Interface("lo", 1, "127.0.0.1", True, True),
    Interface("docker0", 2, "172.17.0.1", True, False),
    Interface("eth0", 3, "10.0.0.1", True, False),
    Interface("eth1", 4, "10.0.1.1", True, False),
    Interface("eth2", 5, "10.0.2.1", False, False),      # down
    Interface("ib0", 6, None, True, False),               # no IPv4 address
    Interface("ens3", 7, "192.168.1.2", True, False),
]


def names(spec, interfaces=SYNTHETIC):
    return [i.name for i in ifaces.match(spec, interfaces)]


def test_default_skips_loopback_and_docker():
    assert ifaces.select_interface("", SYNTHETIC).name == "eth0"
    assert names(None) == ["eth0", "eth1", "ens3"]
    assert ifaces.select_interface(None, SYNTHETIC[:2]).name == "lo"   # nothing else: loopback


def test_prefixes():
    assert names("eth") == ["eth0", "eth1"]
    assert names("ens,eth") == ["eth0", "eth1", "ens3"]
    assert ifaces.select_interface("ens,docker", SYNTHETIC).name == "docker0"


def test_exclusions():
    assert names("^docker,lo") == ["eth0", "eth1", "ens3"]
    assert names("^=eth0") == ["lo", "docker0", "eth1", "ens3"]


def test_exact_names():
    assert names("=eth1") == ["eth1"]
    assert names("=eth") == []
    assert names("=eth0,ens3") == ["eth0", "ens3"]


def test_no_match_names_the_variable_the_value_and_what_exists(monkeypatch):
    monkeypatch.setenv("GPUCOLL_SOCKET_IFNAME", "ib")
    with pytest.raises(ConfigError) as info:
        ifaces.select_interface(interfaces=SYNTHETIC)
    message = str(info.value)
    assert "GPUCOLL_SOCKET_IFNAME='ib'" in message
    for name in ("lo", "eth0", "ib0 (no IPv4", "eth2 (10.0.2.1, down)"):
        assert name in message


def test_this_hosts_interfaces(monkeypatch):
    real = ifaces.list_interfaces()
    lo = [i for i in real if i.loopback]
    assert lo and lo[0].address == "127.0.0.1" and lo[0].up
    assert ifaces.select_interface("lo", real).address == "127.0.0.1"
    default = ifaces.select_interface(None, real)
    assert default.up and default.address and not default.name.startswith("docker")
    monkeypatch.setenv("GPUCOLL_SOCKET_IFNAME", "=lo")
    assert ifaces.select_interface().name == lo[0].name
    with pytest.raises(ConfigError) as info:
        ifaces.select_interface("=no-such-if0")
    assert lo[0].name in str(info.value)
