"""The host agent of a multi-host job: starts this host's ranks for the head gpurun.

The head starts one agent per host (over ssh, srun, or a local command) or, with
`gpurun --nnodes N --node-rank K --master ADDR:PORT`, each host's own gpurun becomes its
agent. The agent connects back to the head (control protocol in wire.py), says who it
is, receives the job (program, size, its ranks, the store), and then runs its ranks
exactly as a single-host gpurun does (job.Job: output tagged `[rank]` on the agent's
stdout/stderr, signals, fail-fast inside the host, leftovers cleaned up), reporting each
rank's end to the head and obeying its `stop`. The ranks die with the agent (the kernel's
parent-death signal), and the agent stops them when it loses the head.

    python -m gpucoll.launcher.agent --master 10.0.0.1:29400 --node-rank 1 --secret-stdin
"""
import argparse
import os
import selectors
import signal
import socket
import sys
import time

from . import binding
from . import env as envmod
from . import wire
from .job import Job, Options, rank_cpus, rank_starter, remove_shared_memory, warm_interpreter
from .output import Sink, make_output_dir
from .signals import SignalInbox
from .spawn import LaunchError, become_subreaper, program_argv

CONNECT_TIMEOUT_S = 120.0


class _Control:
    """The head's connection as one more source in the Job's selector loop."""

    def __init__(self, sock, job):
        sock.setblocking(False)
        self.reader = wire.Reader(sock)
        self.fd = self.reader.fd
        self.job = job

    def pump(self):
        msgs = self.reader.feed()
        if msgs is None:
            self.job.lost_head()
            return False
        for msg in msgs:
            self.job.on_message(msg)
        return True


class AgentJob(Job):
    """A Job whose ranks are part of a larger one: exits go to the head as they happen,
    and the closing report is the head's to print."""

    def __init__(self, opts, inbox, control_sock, host):
        super().__init__(opts, inbox)
        self.host = host
        self.control = _Control(control_sock, self)
        self.selector.register(self.control.fd, selectors.EVENT_READ, self.control)
        self.reported = set()

    def on_message(self, msg):
        kind = msg.get("type")
        sig = int(msg.get("signal", signal.SIGTERM))
        if kind == "stop":
            if self.stop_reason is None:
                self._stop("head", sig)
            else:
                self._kill_all()
        elif kind == "signal":
            for rank in self.ranks:
                if rank.running:
                    rank.signal_group(sig)

    def lost_head(self):
        if self.stop_reason is None:
            self.stderr.write(f"gpurun agent on {self.host}: lost the head gpurun; stopping this host's "
                              "ranks\n".encode())
            self._stop("head")

    def _reap(self):
        super()._reap()
        for rank in self.ranks:
            if not rank.running and rank.rank not in self.reported:
                self.reported.add(rank.rank)
                tail = self.stderr_tail(rank.rank) if rank.returncode != 0 else []
                self.control.reader.send({"type": "exit", "rank": rank.rank, "pid": rank.pid,
                                          "returncode": rank.returncode, "tail": tail})

    def report(self, lines):
        pass  # the head reports for the whole job

    # --on-failure=continue: this host's ranks go on when one fails; the head, which hears of
    # every exit (_reap above), records each in the job's store and reports it.
    def continues(self):
        return self.opts.on_failure == "continue"

    def _tolerate(self, failed):
        self.tolerated.extend(rank for rank in failed if rank not in self.tolerated)

    def _record_ended_well(self, ended):
        pass


def _read_secret(args):
    text = sys.stdin.readline().strip() if args.secret_stdin else None
    try:
        return wire.job_secret(args.master, text)
    except ValueError as exc:
        raise SystemExit(f"gpurun agent: {exc}") from None


def _node_rank(text):
    if text == "slurm":  # one agent per node through srun: the task id is the node's index
        return int(os.environ["SLURM_PROCID"])
    return int(text)


def run_agent(master, node, secret, slots=None, host=None):
    """Join the head at `master`, run this host's ranks, return the exit code."""
    host = host or socket.gethostname()
    err = Sink(2)
    try:
        sock = wire.connect(master, time.monotonic() + CONNECT_TIMEOUT_S, time.monotonic)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        wire.agent_handshake(sock, secret, node)
        wire.send(sock, {"type": "hello", "node": node, "host": host, "pid": os.getpid(), "slots": slots})
        start = wire.recv(sock)
    except (wire.WireError, OSError) as exc:
        err.write(f"gpurun agent (node {node}, {host}): {exc}\n".encode())
        return 1
    if start.get("type") != "start":
        return 0  # the head gave up before starting anything
    if start.get("cwd") and os.path.isdir(start["cwd"]):
        os.chdir(start["cwd"])
    opts = Options(len(start["ranks"]) or 1, start["command"], module=start.get("module"),
                   tag_output=start.get("tag_output", True), output_dir=start.get("output_dir"),
                   grace=start.get("grace", 3.0), exports=start.get("exports", {}),
                   bind_to=start.get("bind_to"), verbose=start.get("verbose", False),
                   preload=start.get("preload"), on_failure=start.get("on_failure", "end"))
    try:
        argv = program_argv(opts.command, opts.module)
        make_output_dir(opts.output_dir)
    except LaunchError as exc:
        wire.send(sock, {"type": "launch-error", "message": str(exc), "code": exc.exit_code})
        return exc.exit_code
    store_host, _, store_port = start["store"].rpartition(":")
    common = envmod.common_environ(os.environ, start["size"], len(start["ranks"]), store_host,
                                   int(store_port), secret.hex(), start["job_id"], opts.on_failure)
    become_subreaper()
    inbox = SignalInbox()
    job = AgentJob(opts, inbox, sock, host)
    try:
        try:
            who = f"gpurun agent (node {node}, {host})"
            cpus = rank_cpus(opts, len(start["ranks"]), who)
            nlocal = len(start["ranks"])
            envs = [envmod.rank_environ(common, r, local, opts.exports, binding.threads_per_rank(cpus[local], nlocal))
                    for local, r in enumerate(start["ranks"])]
            begin = rank_starter(opts, argv, warm_interpreter(opts, argv, envs[0] if envs else common, who), inbox)
            for local, r in enumerate(start["ranks"]):
                job.add(begin(r, envs[local], stdin_inherit=False, cpus=cpus[local]))
        except LaunchError as exc:
            job.abort()
            wire.send(sock, {"type": "launch-error", "message": str(exc), "code": exc.exit_code})
            return exc.exit_code
        code = job.run()
        job.control.reader.send({"type": "done", "code": code})
        return code
    finally:
        job.close()
        inbox.close()
        sock.close()
        remove_shared_memory(start["job_id"], secret.hex())


def main(argv=None):
    parser = argparse.ArgumentParser(prog="gpucoll.launcher.agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--master", required=True, metavar="HOST:PORT", help="the head gpurun's address")
    parser.add_argument("--node-rank", required=True, metavar="K|slurm", help="this host's index in the job")
    parser.add_argument("--slots", type=int, help="ranks this host offers (hosts started by hand)")
    parser.add_argument("--secret-stdin", action="store_true", help="read the job's secret (hex) from stdin")
    args = parser.parse_args(argv)
    return run_agent(args.master, _node_rank(args.node_rank), _read_secret(args), slots=args.slots)


if __name__ == "__main__":
    sys.exit(main())
