"""The peers gpucoll is compared with, each measured by the same loop (runner.measure).

    mpi    Open MPI through mpi4py (started with mpiexec -n N)
    gloo   torch.distributed's gloo backend (started with gpurun -np N)
    nccl   NCCL through CuPy, and torch: torch.distributed's nccl backend (GPU buffers only)

`python -m gpucoll.bench.peers mpi|gloo --plan JSON [--rows-out FILE]` is the job each rank
runs: rank 0 writes {"library": the library's own version string, "records": [...]} as JSON
to FILE, or prints the records one per line to stdout. `run_peer` starts that job from
gpucoll-bench and returns the records and the version string.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile

import numpy as np

from . import torch_peer
from .runner import MpiStyleBackend, Plan, Unsupported, measure

HOST_PEERS = ("mpi", "gloo")
GPU_PEERS = ("nccl", "torch")
ALL = HOST_PEERS + GPU_PEERS


class PeerError(Exception):
    """A peer could not be measured: not installed, or its job failed (the message says which)."""


# --- backends (run inside the peer's ranks) --------------------------------------------------------
class MpiBackend(MpiStyleBackend):
    """mpi4py's buffer methods on COMM_WORLD (Open MPI has no half-precision type or AVG)."""

    name = "mpi"

    def __init__(self):
        from mpi4py import MPI

        self.MPI = MPI
        super().__init__(MPI, MPI.COMM_WORLD, {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN})

    def prepare(self, collective, send, recv, redop, root):
        if send.dtype == np.float16:
            raise Unsupported("MPI has no half-precision type")
        return super().prepare(collective, send, recv, redop, root)

    def library(self):
        """'Open MPI v5.0.11' (the library's own words, up to its first comma)."""
        return self.MPI.Get_library_version().replace("\x00", "").strip().split(",")[0].splitlines()[0]


class GlooBackend:
    """torch.distributed with the gloo backend on CPU tensors that share the NumPy buffers
    (torch_peer.py)."""

    name = "gloo"

    def __init__(self):
        self.peer = torch_peer.TorchPeer("gloo", init_method="env://")
        self.rank, self.size = self.peer.rank, self.peer.size
        torch = self.peer.torch
        self._f64 = torch.zeros(1, dtype=torch.float64)
        self._i64 = torch.zeros(1, dtype=torch.int64)

    def barrier(self):
        self.peer.dist.barrier()

    def reduce_max(self, value):
        self._f64[0] = value
        self.peer.dist.all_reduce(self._f64, op=self.peer.ops["max"])
        return float(self._f64[0])

    def reduce_sum(self, value):
        self._i64[0] = value
        self.peer.dist.all_reduce(self._i64, op=self.peer.ops["sum"])
        return int(self._i64[0])

    def prepare(self, collective, send, recv, redop, root):
        return self.peer.prepare(collective, send, recv, redop, root)

    def library(self):
        return self.peer.library()

    def close(self):
        self.peer.close()


BACKENDS = {"mpi": MpiBackend, "gloo": GlooBackend}


# --- starting a peer job (from gpucoll-bench) ------------------------------------------------------
def _mpiexec():
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    from shutil import which

    return which("mpiexec")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env():
    """This environment without gpucoll's rank variables (the peer job is a new job)."""
    drop = ("GPUCOLL_RANK", "GPUCOLL_SIZE", "GPUCOLL_LOCAL_RANK", "GPUCOLL_LOCAL_SIZE", "GPUCOLL_STORE",
            "GPUCOLL_STORE_SECRET", "GPUCOLL_JOB_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT")
    return {k: v for k, v in os.environ.items() if k not in drop}


def check_available(peer):
    """Raise PeerError, saying what to install, when the peer cannot run here."""
    import importlib.util

    if peer in GPU_PEERS:
        raise PeerError(f"--vs {peer} needs a GPU: it compares with NCCL on GPU buffers, and gpucoll-bench "
                        "measures host buffers on this machine (use --vs mpi or --vs gloo)")
    if peer == "mpi":
        if importlib.util.find_spec("mpi4py") is None:
            raise PeerError("--vs mpi needs mpi4py and an MPI library: pip install 'gpucoll[mpi]'")
        if _mpiexec() is None:
            raise PeerError("--vs mpi needs mpiexec (Open MPI) on PATH or beside the Python interpreter")
    elif peer == "gloo":
        if importlib.util.find_spec("torch") is None:
            raise PeerError("--vs gloo needs torch (a CPU build is enough); skipping the gloo comparison")


def label(peer):
    """What the peer is, with versions, for the table's preamble."""
    from importlib import metadata

    def version(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "?"

    if peer == "mpi":
        return f"Open MPI {version('openmpi')} through mpi4py {version('mpi4py')}"
    if peer == "gloo":
        return torch_peer.label("gloo")
    return peer


def run_peer(peer, nranks, plan, timeout=None):
    """Run the plan as a peer job of nranks ranks: (rank 0's records, the library's version)."""
    check_available(peer)
    env = _clean_env()
    fd, rows = tempfile.mkstemp(prefix=f"gpucoll-bench-{peer}-", suffix=".json")
    os.close(fd)
    job = [sys.executable, "-m", "gpucoll.bench.peers", peer, "--plan", json.dumps(plan.as_dict()),
           "--rows-out", rows]
    if peer == "mpi":
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        # Open MPI refuses more ranks than cores unless told; beyond the cores it yields when idle.
        over = ["--oversubscribe"] if nranks > (os.cpu_count() or 1) else []
        argv = [_mpiexec(), "-n", str(nranks)] + over + job
    else:
        # gpurun's MASTER_ADDR/PORT point at gpucoll's store; torch needs its own TCPStore port.
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        argv = [sys.executable, "-m", "gpucoll.launcher", "-np", str(nranks),
                "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={_free_port()}"] + job[1:]
    try:
        proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)
        if proc.returncode != 0:
            tail = "\n".join(proc.stdout.strip().splitlines()[-20:])
            raise PeerError(f"the {peer} job ({' '.join(argv[:4])} ...) exited with {proc.returncode}:\n{tail}")
        with open(rows) as f:
            out = json.load(f)
        return out["records"], out["library"]
    finally:
        os.unlink(rows)


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gpucoll.bench.peers",
                                     description="Run a gpucoll-bench plan on a peer library (one rank).")
    parser.add_argument("peer", choices=sorted(BACKENDS))
    parser.add_argument("--plan", required=True, help="the plan as JSON (runner.Plan.as_dict)")
    parser.add_argument("--rows-out", help="rank 0 writes the records here (default: JSON lines on stdout)")
    args = parser.parse_args(argv)
    backend = BACKENDS[args.peer]()
    records = measure(backend, Plan.from_dict(json.loads(args.plan)))
    if backend.rank == 0:
        if args.rows_out:
            with open(args.rows_out, "w") as f:
                json.dump({"library": backend.library(), "records": records}, f)
        else:
            for r in records:
                print(json.dumps(r), flush=True)
    backend.barrier()
    if hasattr(backend, "close"):
        backend.close()


if __name__ == "__main__":
    main()
