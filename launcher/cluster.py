"""The head of a multi-host job: one agent per host, one store, one report.

The head gpurun hosts the job's rendezvous store and a control listener on the address of
the interface that GPUCOLL_SOCKET_IFNAME selects (`--master ADDR:PORT` when started by
hand), starts an agent on every host (launcher.agent, through ssh, srun or a local
command), waits for each to connect and prove the job's secret, then tells each its ranks
(host order, then local rank). It relays the agents' output (already tagged `[rank]`),
forwards signals, and ends the job when a rank fails, when a host is lost (its agent's
connection drops), on --timeout, or on SIGINT/SIGTERM/SIGHUP, naming the cause.

One thread, one selector: signals, the agents that passed the handshake, the agents'
control connections and their stdout/stderr pipes. The handshakes themselves (the job's,
gpucoll/transports/handshake.py) run concurrently on the listener's own thread, so no
client that stays silent or fails them delays an agent.
"""
import collections
import os
import secrets
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import time

from gpucoll.base.ranks import ranges
from gpucoll.transports import handshake

from . import report, wire
from .output import RankStream, Sink
from .signals import ENDING, FORWARDED, SignalInbox
from .spawn import LaunchError, program_argv

EXIT_LOST_HOST = report.EXIT_SETUP
AGENT_MODULE = "gpucoll.launcher.agent"
SSH_TEMPLATE = "ssh -T -o BatchMode=yes {host}"
# After a stop, how long agents get beyond --grace to report before the head gives up on them.
STOP_SLACK_S = 5.0
DRAIN_S = 1.0


class Node:
    """One host of the job: its agent process (if the head started one) and connection."""

    def __init__(self, index, host, slots):
        self.index, self.host, self.slots = index, host, slots
        self.ranks = []
        self.proc = None
        self.conn = None          # wire.Reader once connected
        self.connected = False
        self.done = None          # the agent's exit code once it said "done"
        self.lost = False
        self.running = set()      # ranks started and not yet reported ended


class HostsOptions:
    """What the command line said about hosts and agents."""

    def __init__(self, hosts, launcher="ssh", launcher_cmd=None, master=None, nnodes=None,
                 node_rank=0):
        self.hosts = hosts            # [hosts.Host] (None with --nnodes: agents say their slots)
        self.launcher = launcher      # "ssh", "local", "srun" or "manual"
        self.launcher_cmd = launcher_cmd
        self.master = master          # "addr:port" for --nnodes
        self.nnodes = nnodes
        self.node_rank = node_rank


def _bind_address(master):
    """(address to bind, address to advertise, port) for the listener and the store."""
    from gpucoll.transports import ifaces

    if master:
        host, port = wire.split_address(master)
        return ifaces.server_address(host, single_host=False), host, port

    addr = ifaces.select_interface().address
    return addr, addr, 0


def agent_argv(template, host, master, node, python=None, slots=None):
    """The command that starts node `node`'s agent: the launcher template with {host}
    replaced (nothing for a plain local agent), then this interpreter and the agent."""
    prefix = shlex.split(template.replace("{host}", host)) if template else []
    return prefix + [python or sys.executable, "-m", AGENT_MODULE, "--master", master,
                     "--node-rank", str(node), "--secret-stdin"] + (["--slots", str(slots)] if slots else [])


def launch_hosts(opts, hopts):
    """Run the job across hosts; return gpurun's exit code."""
    from .job import open_store

    err = Sink(2)
    try:
        program_argv(opts.command, opts.module)   # fail early on this host as well
    except LaunchError as exc:
        err.write(f"gpurun: {exc}\n".encode())
        return exc.exit_code
    if hopts.launcher == "manual":
        secret_hex = wire.job_secret(hopts.master).hex()
    else:
        secret_hex = secrets.token_hex(16)
    secret = bytes.fromhex(secret_hex)
    bind, advertise, port = _bind_address(hopts.master)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((bind, port))
    except OSError as exc:
        listener.close()
        err.write(f"gpurun: cannot listen on {bind}:{port} for the agents: {exc.strerror}\n".encode())
        return report.EXIT_SETUP
    listener.listen(64)
    master = f"{advertise}:{listener.getsockname()[1]}"
    try:
        store = open_store(bind, secret).start()
    except LaunchError as exc:
        listener.close()
        err.write(f"gpurun: {exc}\n".encode())
        return exc.exit_code
    inbox = SignalInbox()
    head = Head(opts, hopts, inbox, listener, secret_hex, f"{advertise}:{store.port}", master)
    if opts.on_failure == "continue":
        from gpucoll.bootstrap import failures

        head.failures = failures.FailureBoard(store)
    try:
        head.start_agents()
        return head.run()
    finally:
        head.close()
        store.close()
        inbox.close()
        listener.close()


NO_RESPAWN = "gpurun --respawn runs on one host; a job across hosts goes on without replacements"


class Head:
    def __init__(self, opts, hopts, inbox, listener, secret_hex, store_address, master):
        self.opts, self.hopts, self.inbox = opts, hopts, inbox
        self.secret = bytes.fromhex(secret_hex)
        self.secret_hex = secret_hex
        self.store_address = store_address
        self.master = master
        self.job_id = secrets.token_hex(6)
        self.stdout, self.stderr = Sink(1), Sink(2)
        self.selector = selectors.DefaultSelector()
        self.selector.register(inbox.fileno(), selectors.EVENT_READ, "signals")
        self.arrived = collections.deque()   # (socket, claim) of agents that proved the secret
        self.arrived_r, self.arrived_w = os.pipe()
        self.selector.register(self.arrived_r, selectors.EVENT_READ, "listener")
        self.listener = handshake.PeerListener(listener, self.secret, handshake.Purpose.AGENT, -1,
                                               self._authenticated, f"gpurun's agent listener at {master}")
        if hopts.hosts is not None:
            self.nodes = [Node(i, h.name, h.slots) for i, h in enumerate(hopts.hosts)]
        else:
            self.nodes = [Node(i, None, None) for i in range(hopts.nnodes)]
        self.streams = []
        self.procs = []            # agent processes the head started (ssh/local/srun)
        self.started = False
        self.stop_reason = None    # "failure", "lost", "timeout", "signal", "startup"
        self.stop_signal = None
        self.stop_at = None
        self.first_failure = None  # exit message of the rank that failed first
        self.failures = None       # the FailureBoard, under --on-failure=continue
        self.tolerated = []        # exit messages of the ranks that failed while the job went on
        self.lost_node = None
        self.startup_error = None
        self.still_running_at_stop = []
        self.finished_at = None

    # --- starting agents ----------------------------------------------------------------
    def _spawn(self, argv, label, env=None, feed_secret=True):
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE if feed_secret else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                    start_new_session=True, close_fds=True)
        except OSError as exc:
            raise LaunchError(f"cannot start the agent for {label} ({argv[0]}): {exc.strerror}", 127) from None
        if feed_secret:
            try:
                proc.stdin.write(self.secret_hex.encode() + b"\n")
                proc.stdin.close()
            except OSError:
                pass
        self.procs.append((proc, label))
        for name, pipe, sink in (("out", proc.stdout, self.stdout), ("err", proc.stderr, self.stderr)):
            stream = RankStream(label, name, pipe, sink)
            self.streams.append(stream)
            self.selector.register(stream.fd, selectors.EVENT_READ, stream)
        return proc

    def start_agents(self):
        kind = self.hopts.launcher
        try:
            if kind == "srun":
                env = dict(os.environ, GPUCOLL_STORE_SECRET=self.secret_hex)
                n = len(self.nodes)
                argv = ["srun", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1",
                        f"--nodelist={','.join(nd.host for nd in self.nodes)}", "--kill-on-bad-exit=1",
                        "--unbuffered", sys.executable, "-m", AGENT_MODULE, "--master", self.master,
                        "--node-rank", "slurm"]
                if self.hopts.launcher_cmd:
                    argv = shlex.split(self.hopts.launcher_cmd) + argv[1:]
                self._spawn(argv, "srun", env=env, feed_secret=False)
            elif kind == "manual":
                # This host is node 0: its agent runs here; the others join by themselves.
                self._spawn(agent_argv(None, "", self.master, 0, slots=self.opts.nprocs or 1), "node 0")
            else:
                template = self.hopts.launcher_cmd
                if template is None and kind == "ssh":
                    template = SSH_TEMPLATE
                for node in self.nodes:
                    node.proc = self._spawn(agent_argv(template, node.host, self.master, node.index), node.host)
        except LaunchError as exc:
            self.startup_error = (str(exc), exc.exit_code)
            self._stop("startup")

    # --- the loop -------------------------------------------------------------------------
    def run(self):
        from gpucoll.base import config

        now = time.monotonic()
        self.connect_deadline = now + config.INIT_TIMEOUT.get()
        self.deadline = None
        while not self._over(time.monotonic()):
            events = self.selector.select(self._wait(time.monotonic()))
            for key, _ in events:
                data = key.data
                if data == "signals":
                    self._on_signals(self.inbox.take())
                elif data == "listener":
                    self._accept()
                elif isinstance(data, Node):
                    self._on_control(data)
                elif not data.pump():
                    self.selector.unregister(key.fd)
            self._reap_agents()
            self._deadlines(time.monotonic())
        return self._finish()

    def _wait(self, now):
        due = [now + 1.0]
        if not self.started and self.stop_reason is None:
            due.append(self.connect_deadline)
        if self.deadline is not None and self.stop_reason is None:
            due.append(self.deadline)
        if self.stop_at is not None:
            due.append(self.stop_at + self.opts.grace + STOP_SLACK_S)
        return max(0.0, min(due) - now)

    def _on_signals(self, signums):
        for signum in signums:
            if signum in ENDING:
                if self.stop_reason is None:
                    self.stop_signal = signum
                    self._stop("signal", signum)
                else:
                    self._broadcast({"type": "stop", "signal": int(signal.SIGKILL)})
            elif signum in FORWARDED:
                self._broadcast({"type": "signal", "signal": int(signum)})

    def _authenticated(self, sock, claim):
        """An agent proved the job's secret (called on the listener's thread)."""
        self.arrived.append((sock, claim))
        os.write(self.arrived_w, b"a")

    def _accept(self):
        os.read(self.arrived_r, 4096)
        while self.arrived:
            self._join(*self.arrived.popleft())

    def _join(self, sock, claim):
        try:
            addr = sock.getpeername()
            sock.settimeout(10.0)
            hello = wire.recv(sock)
            sock.settimeout(None)
        except (wire.WireError, OSError, ValueError) as exc:
            self.stderr.write(f"gpurun: dropped the agent of node {claim.sender}: {exc}\n".encode())
            sock.close()
            return
        index = hello.get("node")
        if (index != claim.sender or not isinstance(index, int) or not 0 <= index < len(self.nodes)
                or self.nodes[index].connected):
            self.stderr.write(f"gpurun: refused an agent from {addr[0]} claiming node {index!r} "
                              f"(the job has {len(self.nodes)} nodes)\n".encode())
            sock.close()
            return
        node = self.nodes[index]
        node.connected = True
        if node.host is None or self.hopts.launcher == "local":
            node.host = hello.get("host") or addr[0]
        elif node.host != hello.get("host"):
            node.host = f"{node.host} ({hello.get('host')})"
        if node.slots is None:
            node.slots = int(hello.get("slots") or 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        node.conn = wire.Reader(sock)
        self.selector.register(node.conn.fd, selectors.EVENT_READ, node)
        if self.stop_reason is not None:
            node.conn.send({"type": "stop", "signal": int(signal.SIGTERM)})
        elif all(n.connected for n in self.nodes):
            self._start_job()

    def _start_job(self):
        from .hosts import Host, assign

        try:
            total = None if self.hopts.launcher == "manual" else self.opts.nprocs  # -np is per host there
            plan = assign([Host(n.host, n.slots) for n in self.nodes], total)
        except ValueError as exc:
            self.startup_error = (str(exc), 2)
            self._stop("startup")
            return
        size = sum(len(r) for _, r in plan)
        for node in self.nodes:
            node.ranks = plan[node.index][1] if node.index < len(plan) else []
        self.started = True
        if self.opts.timeout:
            self.deadline = time.monotonic() + self.opts.timeout
        # Agents of --launcher local share this machine, and each would bind its ranks from the
        # first core: by default they leave their ranks unbound.
        bind_to = self.opts.bind_to or ("none" if self.hopts.launcher == "local" else None)
        for node in self.nodes:
            node.running = set(node.ranks)
            node.conn.send({
                "type": "start", "job_id": self.job_id, "size": size, "ranks": node.ranks,
                "store": self.store_address, "command": self.opts.command, "module": self.opts.module,
                "exports": self.opts.exports, "tag_output": self.opts.tag_output,
                "output_dir": self.opts.output_dir, "grace": self.opts.grace, "cwd": os.getcwd(),
                "bind_to": bind_to, "verbose": self.opts.verbose, "preload": self.opts.preload,
                "on_failure": self.opts.on_failure,
            })

    def _on_control(self, node):
        msgs = node.conn.feed()
        if msgs is None:
            self.selector.unregister(node.conn.fd)
            node.conn.sock.close()
            node.conn = None
            if node.done is None:
                node.lost = True
                if self.stop_reason is None and self.failures is not None:
                    self._lose_host(node)
                elif self.stop_reason is None:
                    self.lost_node = node
                    self._stop("lost")
            return
        for msg in msgs:
            kind = msg.get("type")
            if kind == "exit":
                node.running.discard(msg["rank"])
                if self.failures is not None and self.stop_reason is None:
                    self._tolerate(msg, node)
                elif msg["returncode"] != 0 and self.first_failure is None and self.stop_reason in (None, "lost"):
                    msg["host"] = node.host
                    self.first_failure = msg
                    if self.stop_reason is None:
                        self._stop("failure")
            elif kind == "done":
                node.done = msg.get("code", 0)
            elif kind == "launch-error":
                node.done = msg.get("code", 126)
                if self.stop_reason is None:
                    self.startup_error = (f"on {node.host}: {msg.get('message')}", msg.get("code", 126))
                    self._stop("startup")

    # --- --on-failure=continue ------------------------------------------------------------
    def _tolerate(self, msg, node):
        """Record a rank's end in the store for the survivors (a failure, or an end in good
        health) and say so: the job goes on."""
        rank = msg["rank"]
        if msg["returncode"] == 0:
            self.failures.ended_well(rank)
            return
        msg["host"] = node.host
        self.tolerated.append(msg)
        self.failures.record(rank)
        self.failures.replaced(rank, None, NO_RESPAWN)   # what the survivors' grow() reads
        self.stderr.write(f"gpurun: rank {rank} (pid {msg['pid']}) on {node.host} ended with "
                          f"{report.how_it_ended(msg['returncode'])}; the job goes on without it "
                          "(--on-failure=continue)\n".encode())

    def _lose_host(self, node):
        """A host's agent is gone (the host, or the connection to it): its ranks count as failed."""
        lost = sorted(node.running)
        node.running.clear()
        for rank in lost:
            self.tolerated.append({"rank": rank, "pid": 0, "returncode": -signal.SIGKILL, "host": node.host})
            self.failures.record(rank)
            self.failures.replaced(rank, None, NO_RESPAWN)
        self.stderr.write(f"gpurun: lost host {node.host} (node {node.index}): its agent's connection dropped; "
                          f"the job goes on without its rank(s) {ranges(lost) or 'none'} "
                          "(--on-failure=continue)\n".encode())

    def _reap_agents(self):
        for proc, label in self.procs:
            if proc.poll() is None:
                continue
            for node in self.nodes:
                if node.proc is proc and not node.connected and not node.lost:
                    node.lost = True
                    if self.stop_reason is None:
                        self.startup_error = (f"the agent for host {label} exited "
                                              f"({report.how_it_ended(proc.returncode)}) before it "
                                              "connected; see its messages above", EXIT_LOST_HOST)
                        self._stop("startup")

    def _stop(self, reason, signum=signal.SIGTERM):
        self.stop_reason = reason
        self.stop_at = time.monotonic()
        self.still_running_at_stop = sorted(r for n in self.nodes for r in n.running)
        self._broadcast({"type": "stop", "signal": int(signum)})

    def _broadcast(self, msg):
        for node in self.nodes:
            if node.conn is not None:
                node.conn.send(msg)

    def _deadlines(self, now):
        if self.stop_reason is None and not self.started and now >= self.connect_deadline:
            missing = [n for n in self.nodes if not n.connected]
            names = ", ".join(n.host or f"node {n.index}" for n in missing)
            self.startup_error = (f"the agent(s) of {names} did not connect within the start-up "
                                  "timeout (GPUCOLL_INIT_TIMEOUT)", EXIT_LOST_HOST)
            self._stop("startup")
        if self.deadline is not None and self.stop_reason is None and now >= self.deadline:
            self._stop("timeout")

    def _over(self, now):
        agents_done = all(n.done is not None or n.lost or (not n.connected and self.stop_reason is not None)
                          for n in self.nodes)
        procs_done = all(p.poll() is not None for p, _ in self.procs)
        if agents_done and (procs_done or self.hopts.launcher == "manual"):
            if self.finished_at is None:
                self.finished_at = now
            return all(s.closed for s in self.streams) or now >= self.finished_at + DRAIN_S
        if self.stop_at is not None and now >= self.stop_at + self.opts.grace + STOP_SLACK_S:
            return True   # agents that do not answer: their processes are killed in close()
        return False

    # --- the end ----------------------------------------------------------------------------
    def _finish(self):
        self._kill_agents()
        for stream in self.streams:
            stream.close()
        if self.stop_reason == "startup":
            message, code = self.startup_error
            lines = [f"gpurun: {message}", f"gpurun: exiting with {code}"]
        elif self.stop_reason == "lost":
            node = self.lost_node
            code = EXIT_LOST_HOST
            lines = [f"gpurun: lost host {node.host} (node {node.index}, ranks {ranges(node.ranks)}): its "
                     "agent's connection dropped while the job ran"]
            stopped = [r for r in self.still_running_at_stop if r not in node.ranks]
            if stopped:
                lines.append(f"gpurun: stopped {len(stopped)} other rank(s): {report.ranks_text(stopped)}")
            lines.append(f"gpurun: exiting with {code}")
        else:
            if self.tolerated and self.first_failure is None and \
                    len(self.tolerated) == sum(len(n.ranks) for n in self.nodes):
                self.first_failure = self.tolerated[0]   # no rank survived: the job failed after all
            f = self.first_failure
            ended = report.end_of_job(self.stop_reason, self.stop_signal, self.opts.timeout,
                                      self.still_running_at_stop,
                                      None if f is None else (f["rank"], f["host"], f["pid"], f["returncode"],
                                                              f.get("tail")))
            if ended is None:
                if self.tolerated:   # survivors ended well: the failures were the job's to survive
                    return 0
                codes = [n.done for n in self.nodes if n.done]
                return codes[0] if codes else 0
            code, lines = ended
        self.stderr.write(("\n".join(lines) + "\n").encode())
        return code

    def _kill_agents(self):
        for proc, _ in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
        for proc, _ in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def close(self):
        self._kill_agents()
        self.listener.close()
        while self.arrived:
            self.arrived.popleft()[0].close()
        os.close(self.arrived_r)
        os.close(self.arrived_w)
        for node in self.nodes:
            if node.conn is not None:
                node.conn.sock.close()
        for stream in self.streams:
            stream.close()
        self.selector.close()

