"""The environment each rank starts with: who it is, where the store is, which GPU is its.

gpucoll reads the GPUCOLL_* variables; RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT are set too, with torchrun's meaning, for code that reads them.
MASTER_ADDR:MASTER_PORT is gpucoll's store, which does not speak torch's TCPStore
protocol: `torch.distributed.init_process_group("gloo")` with `env://` cannot rendezvous
through it.
"""
import os
import subprocess
import sys

_PROC_GPUS = "/proc/driver/nvidia/gpus"


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


def count_gpus(environ):
    """Number of GPUs the ranks will see, found cheaply (no CUDA initialisation).

    CUDA_VISIBLE_DEVICES when set; else the driver's /proc entries; else `nvidia-smi -L`
    when the driver exposes no /proc entries; else 0.
    """
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        items = [v for v in visible.split(",") if v.strip()]
        # CUDA stops at the first invalid entry; "-1" is the usual way to say "none".
        count = 0
        for item in items:
            if item.strip().startswith("-"):
                break
            count += 1
        return count
    try:
        return len(os.listdir(_PROC_GPUS))
    except OSError:
        pass
    if os.path.exists("/proc/driver/nvidia"):
        return _count_with_nvidia_smi()
    return 0


def _count_with_nvidia_smi():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def common_environ(base, size, local_size, store_host, store_port, secret_hex, job_id):
    """The variables every rank shares, on top of `base` (gpurun's own environment)."""
    env = dict(base)
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


def rank_environ(common, rank, local_rank, ngpus, exports):
    """One rank's environment. Local rank k gets GPU k (modulo the GPU count) through
    GPUCOLL_DEVICE; CUDA_VISIBLE_DEVICES is left alone so every rank sees every GPU and
    CUDA IPC between them works. -x values come last and win."""
    env = dict(common)
    env["GPUCOLL_RANK"] = env["RANK"] = str(rank)
    env["GPUCOLL_LOCAL_RANK"] = env["LOCAL_RANK"] = str(local_rank)
    if ngpus > 0:
        env["GPUCOLL_DEVICE"] = str(local_rank % ngpus)
    env.update(exports)
    return env
