"""The environment each rank starts with: who it is and where the store is.

gpucoll reads the GPUCOLL_* variables; RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT are set too, with torchrun's meaning, for code that reads them.
MASTER_ADDR:MASTER_PORT is gpucoll's store, which does not speak torch's TCPStore
protocol: `torch.distributed.init_process_group("gloo")` with `env://` cannot rendezvous
through it.
"""
import sys

from gpucoll.base import stacks

def parse_exports(items, environ):
    """-x VAR[=VAL] options -> {VAR: VAL}. VAR alone takes the launcher's value; a VAR
    that the launcher does not have is skipped with a warning."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not name or not name.replace("_", "a").isalnum():
            raise ValueError(f"-x {item!r}: expected VAR or VAR=VALUE")
        if eq:
            out[name] = value
        elif name in environ:
            out[name] = environ[name]
        else:
            print(f"gpurun: warning: -x {name}: not set here; not passed on", file=sys.stderr)
    return out


def common_environ(base, size, local_size, store_host, store_port, secret_hex, job_id, on_failure=None):
    """The variables every rank shares, on top of `base` (gpurun's own environment, or the
    job's common variables for the processes started during the job: `on_failure` None keeps
    theirs)."""
    env = dict(base)
    env["GPUCOLL_ON_FAILURE"] = on_failure or base.get("GPUCOLL_ON_FAILURE") or "end"
    if stacks.signal_number() is not None:
        env[stacks.VARIABLE] = str(stacks.signal_number())
    env.update({
        "GPUCOLL_SIZE": str(size),
        "GPUCOLL_LOCAL_SIZE": str(local_size),
        "GPUCOLL_STORE": f"{store_host}:{store_port}",
        "GPUCOLL_STORE_SECRET": secret_hex,
        "GPUCOLL_JOB_ID": job_id,
        "WORLD_SIZE": str(size),
        "LOCAL_WORLD_SIZE": str(local_size),
        "MASTER_ADDR": store_host,
        "MASTER_PORT": str(store_port),
        # Ranks write into pipes; unbuffered Python keeps their lines timely and in order.
        "PYTHONUNBUFFERED": "1",
    })
    return env


def rank_environ(common, rank, local_rank, exports, threads=None, spawn=None, replaces=None):
    """One rank's environment; -x values come last and win. No GPU is assigned: a rank's
    collectives run on the GPU its buffers are on (docs/gpu.md, "Which GPU a rank uses"), and
    CUDA_VISIBLE_DEVICES is left alone so that every rank sees every GPU and CUDA IPC works.
    `threads` (binding.threads_per_rank) becomes OMP_NUM_THREADS unless gpurun's environment
    has it: OpenMP and OpenBLAS size their pools by it. `spawn` (a process that MPI's Spawn
    started): (the spawn's number, the first world rank of its processes). `replaces` (a process
    that gpurun --respawn started for a failed rank): (the failed rank's world rank, its own)."""
    env = dict(common)
    env["GPUCOLL_RANK"] = env["RANK"] = str(rank)
    if spawn is not None:
        env["GPUCOLL_SPAWN"] = f"{spawn[0]}:{spawn[1]}"
    if replaces is not None:
        env["GPUCOLL_REPLACES"] = f"{replaces[0]}:{replaces[1]}"
    env["GPUCOLL_LOCAL_RANK"] = env["LOCAL_RANK"] = str(local_rank)
    if threads is not None and "OMP_NUM_THREADS" not in common:
        env["OMP_NUM_THREADS"] = str(threads)
    env.update(exports)
    return env
