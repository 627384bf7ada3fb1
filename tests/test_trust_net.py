"""Who may talk to a rank: every connection a listener accepts must pass the job's handshake.

The attacks are real: a job of real ranks started with gpurun, and an attacker process on
the same host that does not hold the job's secret (tests/scripts/trust_attacker.py) going
after the ranks' real listeners. Below them, the handshake itself (transports/handshake.py)
on real sockets: wrong secrets, replays, wrong claims, silent clients.
"""
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import GPURUN, SCRIPTS, _SCRUB
from gpucoll.base import log
from gpucoll.transports import handshake
from gpucoll.transports.handshake import Claim, HandshakeError, PeerListener, Purpose

VICTIM = os.path.join(SCRIPTS, "trust_victim.py")
ATTACKER = os.path.join(SCRIPTS, "trust_attacker.py")
SECRET = b"the-job-secret-0123456789abcdef"


def _clean_env(extra=None):
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith("GPUCOLL_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


class LiveJob:
    """`gpurun -np N trust_victim.py MODE DIR` in the background, its output read as it comes."""

    def __init__(self, mode, where, env=None, np_=2, timeout=60):
        self.where = str(where)
        cmd = [*GPURUN, "-np", str(np_), "--timeout", str(timeout), sys.executable, VICTIM, mode, self.where]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     stdin=subprocess.DEVNULL, env=_clean_env(env))
        self.out, self.err = [], []
        self._arrived = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True)]
        for t in self._readers:
            t.start()

    def _read(self, pipe, into):
        for line in pipe:
            with self._arrived:
                into.append(line)
                self._arrived.notify_all()

    def wait_line(self, prefix, rank, timeout=60):
        """The rest of rank's first stdout line that starts with `prefix` (after its tag)."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                for line in self.out:
                    if line.startswith(f"[{rank}] {prefix}"):
                        return line.split(prefix, 1)[1].strip()
                left = deadline - time.monotonic()
                if left <= 0 or not any(t.is_alive() for t in self._readers):  # ended, all read
                    break
                self._arrived.wait(min(left, 0.5))
        self.proc.kill()
        pytest.fail(f"no {prefix!r} line from rank {rank}:\n{''.join(self.out)}\n{''.join(self.err)}")

    def put(self, name, text=""):
        path = os.path.join(self.where, name)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.rename(path + ".tmp", path)

    def finish(self, timeout=60):
        """(returncode, stdout, stderr) once gpurun has ended."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for t in self._readers:
            t.join(5)
        return self.proc.returncode, "".join(self.out), "".join(self.err)

    def results(self):
        return {int(line[1]): json.loads(line.split("RESULT ", 1)[1]) for line in self.out if "] RESULT " in line}


def attack(*args, timeout=40):
    """Run the attacker to its end; its ATTACK {json}."""
    proc = subprocess.run([sys.executable, ATTACKER, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=_clean_env())
    found = [line for line in proc.stdout.splitlines() if line.startswith("ATTACK ")]
    assert found, f"the attacker printed no result:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(found[-1][len("ATTACK "):])


# --- the TCP data channel ---------------------------------------------------------------------

def test_an_impostor_of_rank_0_on_the_tcp_channel_is_refused_and_the_result_stays_exact(tmp_path):
    """The attacker connects to rank 1 first, as rank 0 of world/coll, and would answer
    every message with 1000.0s; rank 1 must refuse it and reduce with the real rank 0."""
    job = LiveJob("tcp", tmp_path, env={"GPUCOLL_SHM_DISABLE": 1, "GPUCOLL_TIMEOUT": 20,
                                        "GPUCOLL_INIT_TIMEOUT": 20})
    address = json.loads(job.wait_line("ADDR ", 1))["tcp"]
    attacker = subprocess.Popen([sys.executable, ATTACKER, "tcp", address, "2"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=_clean_env())
    assert attacker.stdout.readline().strip() == "CONNECTED", attacker.stderr.read()
    time.sleep(0.5)  # the rank has dealt with the attacker's hellos by now
    job.put("go")
    code, out, err = job.finish()
    # Read through the same text stream as the readline above: it may already hold the report
    # (communicate() would read the pipe underneath and miss what the stream buffered).
    seen, attacker_err = attacker.stdout.read(), attacker.stderr.read()
    attacker.wait(timeout=30)
    assert code == 0, out + err
    res = job.results()
    assert sorted(res) == [0, 1] and all(r["values"] == [3.0] * 4 for r in res.values()), res
    assert "ATTACK " in seen, f"the attacker printed no report (exit {attacker.returncode}):\n{seen}\n{attacker_err}"
    report = json.loads(seen.split("ATTACK ", 1)[1])
    assert report == {"received": 0, "answered": 0, "closed_by_peer": True}, report
    assert "TCP listener of rank 1" in err and "refused connections that did not complete the handshake" in err, err


def test_six_silent_connections_do_not_stall_the_tcp_collective(tmp_path):
    job = LiveJob("tcp", tmp_path, env={"GPUCOLL_SHM_DISABLE": 1, "GPUCOLL_TIMEOUT": 20,
                                        "GPUCOLL_INIT_TIMEOUT": 20})
    host, _, port = json.loads(job.wait_line("ADDR ", 1))["tcp"].rpartition(":")
    silent = [socket.create_connection((host, int(port))) for _ in range(6)]
    try:
        job.put("go")
        code, out, err = job.finish()
    finally:
        for s in silent:
            s.close()
    assert code == 0, out + err
    res = job.results()
    assert sorted(res) == [0, 1] and all(r["values"] == [3.0] * 4 for r in res.values()), res
    # Rank 0 starts a second late; the rest is the connection itself.
    assert all(r["seconds"] < 5 for r in res.values()), res


# --- point-to-point channels ------------------------------------------------------------------

class Recorder:
    """A TCP relay to `target` that records what its first client sends: how an attacker on
    the path captures a rank's point-to-point channel."""

    def __init__(self, target):
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.server.getsockname()[1]
        self.sent = bytearray()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        record = self.sent  # the first connection only; later ones are relayed as they are
        while True:
            client, _ = self.server.accept()
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(upstream, client, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(client, upstream, record), daemon=True).start()
            record = None

    @staticmethod
    def _pump(src, dst, record):
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            if record is not None:
                record += data
            dst.sendall(data)


def _replay(tmp_path, payload, *extra):
    job = LiveJob("p2p", tmp_path, env={"GPUCOLL_TIMEOUT": 15, "GPUCOLL_SHM_DISABLE": 1, "GPUCOLL_NSOCKS": 1})
    address = json.loads(job.wait_line("ADDR ", 1))["p2p"]
    recorder = Recorder(address)
    job.put("proxy", recorder.address)
    job.wait_line("WARM", 1)
    capture = tmp_path / "captured"
    capture.write_bytes(bytes(recorder.sent))  # the hello and the warm-up message, as sent
    seen = attack("replay", address, capture, payload, *extra)
    job.put("go")
    code, out, err = job.finish()
    return code, out, err, job.results(), seen


def test_a_replayed_p2p_hello_followed_by_a_pickle_runs_no_code(tmp_path):
    marker = tmp_path / "code-ran"
    code, out, err, res, seen = _replay(tmp_path, "pickle", marker)
    assert not marker.exists(), "the receiving rank unpickled the attacker's object"
    assert code == 0, out + err
    assert res[1]["got"] == "'real'", res
    assert seen["closed_by_peer"] and seen["replayed"] > 0, seen
    assert "TCP listener of rank 1" in err and "could not prove" in err, err


def test_a_frame_announcing_2_to_the_62_bytes_does_not_stop_delivery(tmp_path):
    code, out, err, res, seen = _replay(tmp_path, "huge")
    assert code == 0, out + err
    assert res[1]["got"] == "'real'" and res[1]["seconds"] < 5, res
    assert seen["closed_by_peer"], seen


def test_an_authenticated_peer_announcing_too_much_is_dropped_alone(gpurun_job):
    """A rank of the job (it holds the secret) writes a frame header announcing 2^62 bytes:
    the receiver drops that rank's connection with a logged reason, its receive from that
    rank fails saying why, and messages from the other rank still arrive."""
    job = gpurun_job(3, "p2p_faults.py", "huge", env={"GPUCOLL_TIMEOUT": 15}, timeout=60).check()
    res = job.json_lines()
    assert res[1]["from_2"] == "fine", res
    assert res[1]["from_0"]["type"] == "LostPeerError", res
    assert f"announcing {1 << 62} bytes" in res[1]["from_0"]["message"], res
    assert "dropped its connection" in job.stderr and f"announcing {1 << 62} bytes" in job.stderr


# --- where the ranks listen ---------------------------------------------------------------------

def _listening(pid):
    """[(ip, port)] of the TCP sockets that process `pid` has listening (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state != "0A" or inode not in inodes:  # 0A: LISTEN
                    continue
                hexip, hexport = local.split(":")
                raw = bytes.fromhex(hexip)
                if v6:
                    ip = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
                else:
                    ip = socket.inet_ntoa(raw[::-1])
                found.append((ip, int(hexport, 16)))
    return found


def test_the_listeners_of_a_one_host_job_bind_loopback_only(tmp_path):
    job = LiveJob("listen", tmp_path)
    pids = {rank: int(job.wait_line("PID ", rank)) for rank in (0, 1)}
    listening = {rank: _listening(pid) for rank, pid in pids.items()}
    job.put("go")
    code, out, err = job.finish()
    assert code == 0, out + err
    for rank, socks in listening.items():
        assert len(socks) == 1, f"rank {rank} listens on {socks}: expected its one listener"
        assert all(ip == "127.0.0.1" for ip, _ in socks), f"rank {rank} listens on {socks}"


# --- the handshake on real sockets ----------------------------------------------------------------

class Accepted:
    """A PeerListener on loopback whose authenticated peers land in a queue."""

    def __init__(self, secret=SECRET, purpose=Purpose.TCP, rank=1, timeout=handshake.HANDSHAKE_TIMEOUT):
        self.peers = queue.Queue()
        sock = socket.create_server(("127.0.0.1", 0))
        self.listener = PeerListener(sock, secret, purpose, rank, lambda s, c: self.peers.put((s, c)),
                                     "the test listener", timeout=timeout)
        self.address = ("127.0.0.1", sock.getsockname()[1])

    def connect(self, claim, secret=SECRET):
        s = socket.create_connection(self.address)
        handshake.connect(s, secret, claim, 5)
        return s

    def close(self):
        self.listener.close()


@pytest.fixture(autouse=True)
def fresh_log():
    """Log lines go to the stderr of the running test (capfd sees them)."""
    log.reload()
    yield
    log.reload()


@pytest.fixture
def accepted():
    acc = Accepted()
    yield acc
    acc.close()


CLAIM = Claim(Purpose.TCP, 0, 1, "world/coll", 1, 2)


def test_a_peer_with_the_secret_is_taken_with_exactly_what_it_claimed(accepted):
    with accepted.connect(CLAIM) as s:
        peer, claim = accepted.peers.get(timeout=5)
        assert claim == CLAIM
        s.sendall(b"after the handshake")          # the acceptor read nothing past it
        assert peer.recv(100) == b"after the handshake"
        peer.close()


def test_a_connector_without_the_secret_finds_out_and_is_never_taken(accepted, capfd):
    with pytest.raises(HandshakeError, match="could not prove"):
        accepted.connect(CLAIM, secret=b"a guess")
    time.sleep(0.3)
    assert accepted.peers.empty()
    assert "refused connections that did not complete the handshake" in capfd.readouterr().err


def test_an_acceptor_without_the_secret_is_found_out_by_the_connector():
    fake = Accepted(secret=b"not the job's")
    try:
        with pytest.raises(HandshakeError, match="could not prove it holds this job's secret"):
            fake.connect(CLAIM)
    finally:
        fake.close()


def test_a_recorded_handshake_cannot_be_replayed(accepted):
    recorder = Recorder("%s:%d" % accepted.address)
    host, _, port = recorder.address.rpartition(":")
    with socket.create_connection((host, int(port))) as s:
        handshake.connect(s, SECRET, CLAIM, 5)
        accepted.peers.get(timeout=5)[0].close()
    time.sleep(0.2)
    with socket.create_connection(accepted.address) as s:
        s.sendall(bytes(recorder.sent))
        s.settimeout(5)
        s.recv(64)                                 # a fresh challenge, which the replay cannot answer
        assert s.recv(64) == b"", "the listener kept a replayed connection"
    assert accepted.peers.empty()


@pytest.mark.parametrize("claim, why", [
    (Claim(Purpose.TCP, 0, 2, "world/coll", 0, 2), "this is rank 1"),   # meant for another rank
    (Claim(Purpose.P2P, 0, 1), "serves TCP connections"),              # another listener's purpose
])
def test_a_claim_for_another_rank_or_purpose_is_refused_before_any_answer(accepted, capfd, claim, why):
    with pytest.raises(HandshakeError, match="closed the connection"):
        accepted.connect(claim)
    time.sleep(0.3)
    assert accepted.peers.empty()
    assert why in capfd.readouterr().err


def test_silent_clients_are_closed_at_the_deadline_without_delaying_a_real_peer(capfd):
    acc = Accepted(timeout=1.0)
    try:
        silent = [socket.create_connection(acc.address) for _ in range(50)]
        start = time.monotonic()
        with acc.connect(CLAIM):
            acc.peers.get(timeout=5)[0].close()
        assert time.monotonic() - start < 1.0
        for s in silent:
            s.settimeout(5)
            assert s.recv(1) == b"", "a silent client outlived its handshake deadline"
            s.close()
    finally:
        acc.close()
    refusals = [line for line in capfd.readouterr().err.splitlines() if "did not complete the handshake" in line]
    # Rate limited: the first refusal at once, the rest in one summary line.
    assert 1 <= len(refusals) <= 3 and "(50 in all)" in refusals[-1], refusals


# --- gpurun's agents -----------------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gpurun_takes_agents_that_prove_the_secret_and_no_silent_client_delays_them():
    """Two hosts started by hand (both on this machine): before node 1 joins, six clients
    connect to the head and say nothing, and one sends junk. Node 1's agent must still join
    at once, and the head must refuse the others."""
    master = f"127.0.0.1:{_free_port()}"
    env = _clean_env({"GPUCOLL_STORE_SECRET": SECRET.hex(), "GPUCOLL_INIT_TIMEOUT": 30})
    program = "import gpucoll; c = gpucoll.COMM_WORLD; c.Barrier(); print('JOINED', c.rank, c.size)"
    args = ["--nnodes", "2", "--master", master, "--timeout", "50", "-np", "1", sys.executable, "-c", program]
    head = subprocess.Popen([*GPURUN, "--node-rank", "0", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, stdin=subprocess.DEVNULL)
    clients = []
    try:
        deadline = time.monotonic() + 30
        while not clients:
            try:
                clients.append(socket.create_connection(("127.0.0.1", int(master.rpartition(":")[2]))))
            except ConnectionRefusedError:
                assert time.monotonic() < deadline, "the head never listened"
                time.sleep(0.05)
        clients += [socket.create_connection(clients[0].getpeername()) for _ in range(5)]
        junk = socket.create_connection(clients[0].getpeername())
        junk.sendall(b"GET / HTTP/1.0\r\n\r\n")
        clients.append(junk)
        start = time.monotonic()
        node1 = subprocess.run([*GPURUN, "--node-rank", "1", *args], capture_output=True, text=True, env=env,
                               stdin=subprocess.DEVNULL, timeout=60)
        out, err = head.communicate(timeout=60)
        elapsed = time.monotonic() - start
    finally:
        head.kill()
        for c in clients:
            c.close()
    assert head.returncode == 0 and node1.returncode == 0, out + err + node1.stdout + node1.stderr
    assert "JOINED 0 2" in out and "JOINED 1 2" in node1.stdout
    assert elapsed < 15, f"node 1 took {elapsed:.1f} s to join and finish"
    assert "agent listener" in err and "did not complete the handshake" in err and "wrong magic" in err, err


_HOLD = ("import os, sys, gpucoll; c = gpucoll.COMM_WORLD; c.Barrier(); print('PID', os.getpid(), flush=True); "
         "sys.stdin.readline(); c.Barrier()")


def _listeners_of_rank_started_job(envs):
    """Start one process per environment (no gpurun: rank 0 serves the store itself), and
    return each one's listening sockets once the job is up."""
    procs = [subprocess.Popen([sys.executable, "-c", _HOLD], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for env in envs]
    try:
        pids = []
        for p in procs:
            line = p.stdout.readline()
            assert line.startswith("PID "), line + p.stderr.read()
            pids.append(int(line.split()[1]))
        listening = [_listening(pid) for pid in pids]
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
        for p in procs:
            assert p.wait(timeout=30) == 0, p.stderr.read()
        return listening
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_one_host_torchrun_style_job_serves_its_store_on_loopback():
    port = _free_port()
    envs = [_clean_env(dict(RANK=r, WORLD_SIZE=2, LOCAL_RANK=r, LOCAL_WORLD_SIZE=2, MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=port, GPUCOLL_STORE_SECRET=SECRET.hex())) for r in range(2)]
    listening = _listeners_of_rank_started_job(envs)
    assert ("127.0.0.1", port) in listening[0], listening[0]  # rank 0's store
    for rank, socks in enumerate(listening):
        assert socks and all(ip == "127.0.0.1" for ip, _ in socks), f"rank {rank} listens on {socks}"


def test_a_one_node_slurm_step_serves_its_store_on_the_nodes_address_not_everywhere():
    host = socket.gethostname()
    port = _free_port()
    envs = [_clean_env(dict(SLURM_PROCID=r, SLURM_NTASKS=2, SLURM_LOCALID=r, SLURM_NODEID=0, SLURM_JOB_ID=77,
                            SLURM_STEP_ID=0, SLURM_STEP_NODELIST=host, SLURM_STEP_TASKS_PER_NODE="2",
                            MASTER_PORT=port, GPUCOLL_STORE_SECRET=SECRET.hex())) for r in range(2)]
    listening = _listeners_of_rank_started_job(envs)
    store = [ip for ip, p in listening[0] if p == port]
    assert store == [socket.gethostbyname(host)], listening[0]
    for rank, socks in enumerate(listening):
        assert all(ip not in ("0.0.0.0", "::") for ip, _ in socks), f"rank {rank} listens on {socks}"
