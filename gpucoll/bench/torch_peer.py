"""torch.distributed as a peer of gpucoll-bench, written once for both of its backends: gloo on
CPU tensors that share the NumPy buffers (peers.py, `--vs gloo`) and nccl on torch views of the
CuPy buffers (gpu.py, `--vs torch`)::

    peer = TorchPeer("gloo", init_method="env://")      # joins the process group
    call = peer.prepare("allreduce", send, recv, "sum", 0)
    peer.close()
"""
import functools

import numpy as np

from .runner import Unsupported

# The benchmark's reductions by torch.distributed's names; gloo has no AVG.
_OPS = {"sum": "SUM", "prod": "PRODUCT", "max": "MAX", "min": "MIN", "avg": "AVG"}
_LACKS = {"gloo": {"avg"}}
# Of the unsigned types, torch.distributed moves uint8 only.
_UNMOVED = (np.uint16, np.uint32, np.uint64)
# The collectives that only move data, by torch.distributed's names: fn(output, input).
_MOVES = {"allgather": "all_gather_into_tensor", "alltoall": "all_to_all_single"}


def version():
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "?"


def label(backend):
    """What the peer is, with torch's version, for the table's preamble."""
    return f"torch {version()} torch.distributed {backend} (in-place all_reduce)"


class Primed:
    """A call with a `prime` step the checked call needs first (the runner runs it after refilling)."""

    __slots__ = ("call", "prime")

    def __init__(self, call, prime):
        self.call, self.prime = call, prime

    def __call__(self):
        self.call()


class TorchPeer:
    """This rank in a torch.distributed process group of `backend`; `device` is where the
    benchmark's buffers are (None: host memory). `init` goes to init_process_group."""

    def __init__(self, backend, device=None, **init):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.backend = torch, dist, backend
        dist.init_process_group(backend, **init)
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.ops = {name: getattr(dist.ReduceOp, op) for name, op in _OPS.items()
                    if name not in _LACKS.get(backend, ())}
        # Views of the benchmark's arrays, never copies: the runner fills and checks the arrays.
        self._view = torch.from_numpy if device is None else functools.partial(torch.as_tensor, device=device)

    def prepare(self, collective, send, recv, redop, root):
        """The call that runs `collective` from `send` into `recv` (the benchmark's arrays)."""
        dist = self.dist
        if send.dtype in _UNMOVED:
            raise Unsupported(f"torch.distributed does not reduce or move {send.dtype}")
        if collective in ("allreduce", "reduce_scatter") and redop not in self.ops:
            raise Unsupported(f"torch.distributed's {self.backend} has no {redop} reduction")
        st, rt = self._view(send), self._view(recv)
        if collective == "allreduce":
            # all_reduce is in place only: the timed calls reduce recv, after the runner's prime
            # step copied the input in (the check counts the calls).
            return Primed(functools.partial(dist.all_reduce, rt, self.ops[redop]), functools.partial(rt.copy_, st))
        if collective == "reduce_scatter":
            return functools.partial(dist.reduce_scatter_tensor, rt, st, self.ops[redop])
        if collective in _MOVES:
            return functools.partial(getattr(dist, _MOVES[collective]), rt, st)
        if collective == "bcast":
            return functools.partial(dist.broadcast, st, root)
        raise Unsupported(collective)

    def library(self):
        return f"torch {self.torch.__version__} {self.backend}"

    def close(self):
        self.dist.destroy_process_group()
