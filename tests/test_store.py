"""The rendezvous store: a real server and real clients on 127.0.0.1."""
import json
import os
import re
import resource
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucoll.base import errors
from gpucoll.bootstrap import store_protocol as wire
from gpucoll.bootstrap.store import PrefixStore, StoreClient, StoreUnreachableError
from gpucoll.bootstrap.store_server import StoreServer

HOST = "127.0.0.1"
SECRET = secrets.token_bytes(16)


@pytest.fixture
def server():
    with StoreServer(HOST, 0, SECRET).start() as srv:
        yield srv


@pytest.fixture
def client(server):
    with StoreClient(HOST, server.port, SECRET, timeout=10, connect_timeout=5) as c:
        yield c


def connect(server, **kw):
    kw.setdefault("connect_timeout", 5)
    return StoreClient(HOST, server.port, SECRET, **kw)


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def in_thread(fn, *args):
    """Run fn in a thread; returns a list that holds its result (or exception) once done."""
    box = []

    def run():
        try:
            box.append(fn(*args))
        except BaseException as exc:  # handed to the test to assert on
            box.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


# --- raw sockets that speak (or break) the wire format -------------------------------

def raw_connect(server):
    """A plain socket that has read the server's HELLO; returns (sock, server nonce)."""
    sock = socket.create_connection((HOST, server.port), timeout=5)
    op, fields = read_frame(sock)
    assert op == wire.HELLO
    assert fields.raw(len(wire.MAGIC)) == wire.MAGIC
    fields.raw(2 + 8)
    return sock, fields.raw(wire.NONCE_SIZE)


def raw_authenticated(server):
    sock, server_nonce = raw_connect(server)
    nonce = wire.new_nonce()
    sock.sendall(wire.frame(wire.AUTH, nonce, wire.client_proof(SECRET, server_nonce, nonce)))
    op, fields = read_frame(sock)
    assert op == wire.WELCOME
    assert fields.raw(wire.MAC_SIZE) == wire.server_proof(SECRET, server_nonce, nonce)
    return sock


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "connection closed"
        data += chunk
    return data


def read_frame(sock):
    size = struct.unpack(">I", recv_exact(sock, 4))[0]
    fields = wire.Fields(recv_exact(sock, size))
    return fields.op, fields


def dropped_because(sock):
    """The reason in the CLOSING frame the server sends before it hangs up (which it
    must do within 5 s); closes our end."""
    data = b""
    with sock:
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except ConnectionResetError:  # we left unread bytes: the server's close resets
            pass
    size, op = struct.unpack(">IB", data[:5])
    assert op == wire.CLOSING
    assert len(data) == 4 + size
    return data[5:].decode()


# --- the operations ------------------------------------------------------------------

def test_set_get_add_compare_set_delete_num_keys_ping(client):
    client.set("alpha", b"one")
    assert client.get("alpha") == b"one"
    client.set("alpha", b"two")                      # overwrite
    assert client.get("alpha") == b"two"
    client.set("text", "héllo")                      # str values travel as UTF-8
    assert client.get("text") == "héllo".encode()

    assert client.add("counter") == 1
    assert client.add("counter", 41) == 42
    assert client.add("counter", -50) == -8
    assert client.get("counter") == b"-8"

    assert client.compare_set("cas", None, b"first") == b"first"      # absent -> set
    assert client.compare_set("cas", None, b"second") == b"first"     # present -> unchanged
    assert client.compare_set("cas", b"wrong", b"third") == b"first"
    assert client.compare_set("cas", b"first", b"third") == b"third"
    assert client.compare_set("absent", b"x", b"y") == b""            # nothing stored
    assert client.compare_set("absent2", b"", b"z") == b"z"            # b"" means absent too

    assert client.num_keys() == 5                    # alpha text counter cas absent2
    assert client.num_keys("a") == 2                 # alpha absent2
    assert client.delete("alpha") is True
    assert client.delete("alpha") is False
    assert client.num_keys() == 4

    client.wait(["text", "counter"], timeout=1)     # all present: returns at once
    rtt = client.ping()
    assert 0 < rtt < 1


def test_binary_and_large_values(server, client):
    every_byte = bytes(range(256)) * 4
    client.set("bin", every_byte)
    assert client.get("bin") == every_byte
    big = secrets.token_bytes(8 << 20)
    client.set("big", bytearray(big))
    assert client.get("big") == big
    client.set("empty", b"")
    assert client.get("empty") == b""
    assert client.max_value_size == server.max_value_size == 64 << 20


def test_prefix_store(client):
    a = PrefixStore(client, "comm/1")
    b = PrefixStore(client, "comm/2")
    a.set("root", b"A")
    b.set("root", b"B")
    assert a.get("root") == b"A"
    assert b.get("root") == b"B"
    assert client.get("comm/1/root") == b"A"
    assert a.add("n", 3) == 3
    assert b.add("n") == 1
    assert a.compare_set("once", None, b"x") == b"x"
    a.wait(["root", "n"], timeout=1)
    assert a.num_keys() == 3
    assert b.num_keys() == 2
    assert PrefixStore(a, "sub").add("deep") == 1
    assert client.get("comm/1/sub/deep") == b"1"
    assert a.num_keys() == 4
    assert a.delete("root") is True
    assert b.get("root") == b"B"
    assert client.num_keys() == 5
    assert a.ping() > 0
    a.close()                                        # does not close the wrapped client
    assert client.get("comm/2/n") == b"1"
    with pytest.raises(errors.TimeoutError, match="comm/1/root"):
        a.get("root", timeout=0.05)


def test_get_blocks_until_another_client_sets(server, client):
    t, box = in_thread(client.get, "late", 10)
    time.sleep(0.3)
    assert box == []                                 # still parked
    with connect(server) as other:
        other.set("late", b"here")
    t.join(5)
    assert box == [b"here"]


def test_wait_blocks_until_every_key_exists(server, client):
    t, box = in_thread(client.wait, ["k1", "k2", "k3"], 10)
    with connect(server) as other:
        other.set("k2", b"")
        other.add("k1")
        time.sleep(0.2)
        assert box == []
        other.compare_set("k3", None, b"3")
    t.join(5)
    assert box == [None]


def test_many_waiters_wake_together(server):
    clients = [connect(server) for _ in range(20)]
    waits = [in_thread(c.get, "go", 10) for c in clients]
    time.sleep(0.2)
    assert all(box == [] for _, box in waits)
    with connect(server) as setter:
        setter.set("go", b"now")
    for t, box in waits:
        t.join(5)
        assert box == [b"now"]
    for c in clients:
        c.close()


def test_gather_answers_once_every_key_exists(server, client):
    # An all-gather's second half: one request that returns prefix0..prefixN-1 in order,
    # parked until the last is set; values may be empty or binary.
    client.set("ag/1", b"")
    t, box = in_thread(client.gather, "ag/", 3, 10)
    with connect(server) as other:
        other.set("ag/2", b"\x00two")
        time.sleep(0.2)
        assert box == []                             # ag/0 is still missing
        other.set("ag/0", b"zero")
    t.join(5)
    assert box == [[b"zero", b"", b"\x00two"]]
    assert client.gather("ag/", 3) == [b"zero", b"", b"\x00two"]
    assert client.gather("nothing/", 0) == []
    with pytest.raises(errors.TimeoutError, match=r"2 of the 5 keys under 'ag/' were.*'ag/3', 'ag/4'"):
        client.gather("ag/", 5, timeout=0.1)
    prefixed = PrefixStore(client, "c7")
    for i in range(2):
        prefixed.set(f"v{i}", str(i).encode())
    assert prefixed.gather("v", 2) == [b"0", b"1"]


def test_gather_larger_than_a_value_is_refused(client):
    with StoreServer(HOST, 0, SECRET, max_value_size=1024).start() as small:
        with connect(small) as c:
            for i in range(3):
                c.set(f"big/{i}", b"x" * 500)
            with pytest.raises(errors.StoreError, match="3 values under 'big/' take 1512 bytes"):
                c.gather("big/", 3)
            assert c.gather("big/", 2) == [b"x" * 500] * 2   # the connection is still good


def test_get_timeout_names_key_and_address(server, client):
    start = time.monotonic()
    with pytest.raises(errors.TimeoutError) as info:
        client.get("missing/key", timeout=0.3)
    elapsed = time.monotonic() - start
    assert 0.3 <= elapsed < 2
    assert "'missing/key'" in str(info.value)
    assert f"127.0.0.1:{server.port}" in str(info.value)
    with pytest.raises(errors.TimeoutError, match=r"2 of the 3 keys.*'w1', 'w3'"):
        client.set("w2", b"")
        client.wait(["w1", "w2", "w3"], timeout=0.1)
    with pytest.raises(errors.TimeoutError):
        client.get("missing/key", timeout=0)         # 0: look once, do not wait
    client.set("missing/key", b"found")              # the connection is still good
    assert client.get("missing/key", timeout=0) == b"found"


def test_wrong_secret_is_refused(server, client):
    with pytest.raises(errors.AuthenticationError) as info:
        StoreClient(HOST, server.port, b"not the secret", connect_timeout=5)
    assert f"store at 127.0.0.1:{server.port} refused this client" in str(info.value)
    assert "GPUCOLL_STORE_SECRET" in str(info.value)
    assert client.ping() > 0                         # the job's clients are unaffected


def test_hex_secret_and_from_env(monkeypatch):
    hex_secret = secrets.token_hex(16)
    with StoreServer(HOST, 0, hex_secret).start() as srv:
        monkeypatch.setenv("GPUCOLL_STORE", f"127.0.0.1:{srv.port}")
        monkeypatch.setenv("GPUCOLL_STORE_SECRET", hex_secret)
        with StoreClient.from_env() as c:
            c.set("k", b"v")
        with StoreClient(HOST, srv.port, bytes.fromhex(hex_secret)) as c:
            assert c.get("k") == b"v"
        monkeypatch.delenv("GPUCOLL_STORE_SECRET")
        with pytest.raises(errors.ConfigError, match="GPUCOLL_STORE_SECRET is not set"):
            StoreClient.from_env()


def test_value_limits(client):
    with StoreServer(HOST, 0, SECRET, max_value_size=1024).start() as small:
        with connect(small) as c:
            c.set("fits", b"x" * 1024)
            with pytest.raises(errors.InvalidUsageError, match="1025 bytes"):
                c.set("too-big", b"x" * 1025)
            # A client that skips the check is refused by the server; its connection stays.
            sock = raw_authenticated(small)
            sock.sendall(wire.frame(wire.SET, wire.key(b"too-big"), wire.value(b"x" * 1025)))
            op, fields = read_frame(sock)
            assert op == wire.ERROR
            assert "1025 bytes" in fields.text()
            sock.sendall(wire.frame(wire.PING))
            assert read_frame(sock)[0] == wire.OK
            sock.close()
            assert c.num_keys() == 1
    with pytest.raises(errors.InvalidUsageError, match="4096"):
        client.set("k" * 4097, b"")
    with pytest.raises(errors.InvalidUsageError):
        client.set("", b"")


def test_add_on_a_non_integer_is_refused(client):
    client.set("word", b"hello")
    with pytest.raises(errors.StoreError, match="not an integer"):
        client.add("word")
    assert client.get("word") == b"hello"            # unchanged, connection still good


def test_one_client_shared_by_threads(client):
    threads = [threading.Thread(target=lambda: [client.add("shared") for _ in range(50)])
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert client.get("shared") == b"400"


# --- robustness ----------------------------------------------------------------------

def test_bad_frames_drop_only_their_connection(server, client):
    client.set("before", b"1")

    sock, _ = raw_connect(server)                    # unknown opcode before the handshake
    sock.sendall(struct.pack(">IB", 1, 0x7F))
    assert "expected AUTH" in dropped_because(sock)

    sock, _ = raw_connect(server)                    # a bogus, huge length
    sock.sendall(b"\xff\xff\xff\xff")
    assert "4294967295 bytes exceeds" in dropped_because(sock)

    sock, _ = raw_connect(server)                    # hangs up in the middle of a frame
    sock.sendall(struct.pack(">I", 100) + b"\x01" * 10)
    sock.close()

    sock = raw_authenticated(server)                 # authenticated, then an unknown opcode
    sock.sendall(struct.pack(">IB", 1, 0x7F))
    assert "unknown opcode 0x7f" in dropped_because(sock)

    sock = raw_authenticated(server)                 # a SET whose key runs past the frame
    sock.sendall(struct.pack(">IBH", 4, wire.SET, 500) + b"k")
    assert "truncated" in dropped_because(sock)

    sock = raw_authenticated(server)                 # oversized length after authenticating
    sock.sendall(b"\xff\xff\xff\xff")
    assert "exceeds the limit" in dropped_because(sock)

    sock = raw_authenticated(server)                 # hangs up while its get is parked
    sock.sendall(wire.frame(wire.GET, wire.key(b"never"), wire.f64(60.0)))
    deadline = time.monotonic() + 5
    while b"never" not in server.waiting and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b"never" in server.waiting
    sock.close()
    while b"never" in server.waiting and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b"never" not in server.waiting            # its waiter went with it, not after 60 s

    assert client.get("before") == b"1"              # the connected client is untouched
    with connect(server) as fresh:                   # and newcomers are served
        fresh.set("after", b"2")
        assert fresh.get("before") == b"1"
    assert client.num_keys() == 2


def test_idle_unauthenticated_connection_is_closed():
    with StoreServer(HOST, 0, SECRET, handshake_timeout=0.3).start() as srv:
        sock, _ = raw_connect(srv)
        start = time.monotonic()
        assert "no handshake within 0.3 s" in dropped_because(sock)
        assert time.monotonic() - start < 3
        with connect(srv) as c:                      # authenticated clients are not timed out
            time.sleep(0.5)
            assert c.add("x") == 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.binary(min_size=1, max_size=64))
def test_random_bytes_after_handshake_never_hurt_the_server(server, client, junk):
    sock = raw_authenticated(server)
    sock.sendall(junk)
    sock.close()
    assert client.add("survived") >= 1


def test_server_gone_while_waiting_raises_store_error():
    srv = StoreServer(HOST, 0, SECRET).start()
    c = connect(srv)
    t, box = in_thread(c.get, "never", 60)
    time.sleep(0.2)
    start = time.monotonic()
    srv.close()
    t.join(5)
    assert time.monotonic() - start < 5
    assert len(box) == 1 and type(box[0]) is errors.StoreError
    assert f"127.0.0.1:{srv.port}" in str(box[0])
    with pytest.raises(errors.StoreError, match="closed"):
        c.ping()                                     # later calls fail at once too


def test_connect_gives_up_naming_the_address():
    port = free_port()
    start = time.monotonic()
    with pytest.raises(StoreUnreachableError) as info:
        StoreClient(HOST, port, SECRET, connect_timeout=0.5)
    assert 0.5 <= time.monotonic() - start < 3
    text = str(info.value)
    assert f"127.0.0.1:{port}" in text
    assert "GPUCOLL_STORE" in text and "firewall" in text
    assert isinstance(info.value, errors.StoreError)
    assert isinstance(info.value, errors.TimeoutError)


def test_connect_retries_until_the_server_starts():
    port = free_port()
    servers = []
    timer = threading.Timer(0.5, lambda: servers.append(StoreServer(HOST, port, SECRET).start()))
    timer.start()
    try:
        with StoreClient(HOST, port, SECRET, connect_timeout=10) as c:
            assert c.add("k") == 1
    finally:
        timer.join()
        for s in servers:
            s.close()


def test_port_in_use_names_the_port(server):
    with pytest.raises(errors.StoreError) as info:
        StoreServer(HOST, server.port, SECRET).start()
    assert f"port {server.port} is already in use" in str(info.value)
    assert "Pick another port" in str(info.value)


def test_not_a_store_is_reported():
    with socket.socket() as listener:
        listener.bind((HOST, 0))
        listener.listen()
        port = listener.getsockname()[1]

        def answer_http():
            conn, _ = listener.accept()
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

        t = threading.Thread(target=answer_http)
        t.start()
        with pytest.raises(errors.StoreError, match=f"127.0.0.1:{port} is not a gpucoll store"):
            StoreClient(HOST, port, SECRET, connect_timeout=5)
        t.join()


def test_module_runs_a_server_in_the_foreground():
    hex_secret = secrets.token_hex(16)
    env = dict(os.environ, GPUCOLL_STORE_SECRET=hex_secret)
    command = [sys.executable, "-m", "gpucoll.bootstrap.store_server", "--host", HOST, "--port", "0"]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) as proc:
        try:
            line = proc.stdout.readline()
            assert line.startswith("gpucoll store serving on 127.0.0.1:")
            port = int(line.rsplit(":", 1)[1])
            with StoreClient(HOST, port, hex_secret, connect_timeout=5) as c:
                c.set("k", b"v")
                assert c.get("k") == b"v"
        finally:
            proc.terminate()


# --- scale ---------------------------------------------------------------------------

# Each worker process opens its share of clients at once (so the server holds every
# connection together), then each client sets its key and bumps a shared counter; the
# client that brings it to the total announces "all-set"; then every client waits for
# that and reads its neighbour's key.
WORKER = r"""
import json, sys
from concurrent.futures import ThreadPoolExecutor
from gpucoll.bootstrap.store import StoreClient

port, secret, first, count, total = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
with ThreadPoolExecutor(32) as pool:
    clients = list(pool.map(lambda _: StoreClient("127.0.0.1", port, secret, timeout=60), range(count)))

    def join(i):
        c = clients[i - first]
        c.set(f"rank/{i}", str(i).encode())
        n = c.add("counter")
        if n == total:
            c.set("all-set", b"1")
        return n

    def read(i):
        c = clients[i - first]
        c.wait(["all-set"])
        return int(c.get(f"rank/{(i + 1) % total}"))

    counts = list(pool.map(join, range(first, first + count)))
    neighbours = list(pool.map(read, range(first, first + count)))
for c in clients:
    c.close()
print(json.dumps({"counts": counts, "neighbours": neighbours}))
"""


def test_thousand_concurrent_clients(server):
    total, procs = 1000, 4
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard != resource.RLIM_INFINITY and hard < total + 200:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below the {total + 200} descriptors needed")
    share = total // procs
    start = time.monotonic()
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(server.port), SECRET.hex(),
                                 str(p * share), str(share), str(total)],
                                stdout=subprocess.PIPE, text=True) for p in range(procs)]
    results = [json.loads(w.communicate(timeout=60)[0]) for w in workers]
    elapsed = time.monotonic() - start
    assert [w.returncode for w in workers] == [0] * procs
    counts = sorted(n for r in results for n in r["counts"])
    assert counts == list(range(1, total + 1))      # every add counted exactly once
    neighbours = [n for r in results for n in r["neighbours"]]
    assert neighbours == [(i + 1) % total for i in range(total)]
    with connect(server) as c:
        assert c.get("counter") == b"1000"
        assert c.num_keys() == total + 2            # rank/*, counter, all-set
    assert elapsed < 20


# --- strangers: connections that never authenticate -------------------------------------

# A server with few file descriptors and no cap of its own on pending connections, so that a
# flood makes accept() fail with EMFILE; it prints its port, serves until stdin closes.
CRAMPED_SERVER = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from gpucoll.bootstrap.store_server import StoreServer
with StoreServer("127.0.0.1", 0, bytes.fromhex(sys.argv[2]), max_pending=1 << 20) as srv:
    srv.start()
    print(srv.port, flush=True)
    sys.stdin.read()
"""


def flood(port, count):
    """`count` connections to the store that never say a word (the caller closes them)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = count + 100
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below the {need} descriptors needed")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((HOST, port))
        socks.append(s)
    return socks


def test_idle_strangers_are_capped_and_ranks_still_get_in():
    with StoreServer(HOST, 0, SECRET, max_pending=64).start() as srv:
        strangers = flood(srv.port, 1000)
        try:
            start = time.monotonic()
            with connect(srv, connect_timeout=10) as c:   # retried while the store is busy
                c.set("in", b"1")
            assert time.monotonic() - start < 5
            deadline = time.monotonic() + 5
            while len(srv.gate.pending) > 64 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(srv.gate.pending) <= 64
            assert srv.gate.refused.total >= 1000 - 64 - 1
        finally:
            for s in strangers:
                s.close()


def test_out_of_file_descriptors_is_one_summary_line_not_tracebacks():
    server = subprocess.Popen([sys.executable, "-c", CRAMPED_SERVER, "128", SECRET.hex()], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        strangers = flood(port, 600)
        try:
            start = time.monotonic()
            with StoreClient(HOST, port, SECRET, connect_timeout=10) as c:   # room is made for it
                c.set("in", b"1")
                assert c.get("in") == b"1"
            assert time.monotonic() - start < 5
        finally:
            for s in strangers:
                s.close()
        _, err = server.communicate("", timeout=10)
    finally:
        server.kill()
    assert server.returncode == 0, err
    assert "Traceback" not in err and "Invalid file descriptor" not in err, err[:3000]
    lines = err.splitlines()
    assert 1 <= len(lines) <= 3, err[:3000]
    for line in lines:
        assert re.search(r"gpucoll WARN \[BOOTSTRAP\] store 127\.0\.0\.1:\d+ turned away \d+ connection\(s\) "
                         r"that had not authenticated: ", line), line
    assert "Too many open files" in err and "closed to free file descriptors" in err, err
