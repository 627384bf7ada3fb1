"""Find out how this process was started, from its environment alone.

Order of precedence (GPUCOLL_BOOTSTRAP forces one):
  gpurun     GPUCOLL_RANK, GPUCOLL_SIZE, GPUCOLL_STORE, GPUCOLL_STORE_SECRET
  mpi        OMPI_COMM_WORLD_*, PMI_*, PMIX_RANK (mpi4py does the exchange)
  slurm      SLURM_PROCID, SLURM_NTASKS, SLURM_STEP_NODELIST inside an srun step
  torchrun   RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
  singleton  none of the above: one rank, for interactive use

An environment that is half there (RANK without WORLD_SIZE, RANK >= WORLD_SIZE, an MPI
launcher without mpi4py) raises BootstrapError instead of silently making N singletons.
"""
import hashlib
import importlib.util
import os
from dataclasses import dataclass
from typing import Optional

from ..base import config
from ..base.errors import BootstrapError
from . import hostlist

_MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")
_MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


@dataclass
class LaunchInfo:
    """What the environment says about this rank. Fields that only the exchange can
    tell (local rank under MPI, say) are None until the bootstrap fills them."""

    method: str
    rank: int
    size: int
    local_rank: Optional[int] = None
    local_size: Optional[int] = None
    store_host: Optional[str] = None
    store_port: Optional[int] = None
    secret: Optional[bytes] = None
    host_store: bool = False  # this process (rank 0) must serve the store itself
    one_host: bool = False    # the launcher says every rank runs on this host
    job_id: str = "local"
    spawn: Optional[tuple] = None  # (spawn number, first world rank) in a process MPI's Spawn started
    replaces: Optional[tuple] = None  # (failed world rank, own world rank) in a replacement (gpurun --respawn)


def _int(environ, name, what):
    text = environ.get(name)
    try:
        return int(text)
    except (TypeError, ValueError):
        raise BootstrapError(f"{name}={text!r} is not an integer ({what}).") from None


def _check_rank(rank, size, rank_name, size_name):
    if size < 1:
        raise BootstrapError(f"{size_name}={size}: the job must have at least one rank.")
    if not 0 <= rank < size:
        raise BootstrapError(
            f"{rank_name}={rank} is out of range for {size_name}={size}: ranks go from 0 to {size - 1}. "
            "Check the launcher's settings; every rank must see the same size.")


def _split_address(text, var):
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise BootstrapError(f"{var}={text!r} is not host:port.")
    return host.strip("[]"), int(port)


def _derived_secret(identity):
    # Launchers that hand out no secret: derive one from the job's identity. It keeps
    # other jobs from joining by accident; set GPUCOLL_STORE_SECRET for real protection.
    return hashlib.sha256(f"gpucoll-store:{identity}".encode()).digest()[:16]


def _secret(environ, identity):
    text = config.STORE_SECRET.get(environ)
    if text:
        try:
            return bytes.fromhex(text)
        except ValueError:
            raise BootstrapError("GPUCOLL_STORE_SECRET must be a hex string (as gpurun sets it).") from None
    return _derived_secret(identity)


def _from_gpurun(environ):
    missing = [var.name for var in (config.RANK, config.SIZE, config.STORE, config.STORE_SECRET)
               if not var.is_set(environ)]
    if missing:
        raise BootstrapError(
            f"incomplete gpurun environment: {', '.join(missing)} not set. Start the script with "
            "gpurun, or unset the GPUCOLL_* launch variables to run it alone.")
    rank, size = config.RANK.get(environ), config.SIZE.get(environ)
    _check_rank(rank, size, "GPUCOLL_RANK", "GPUCOLL_SIZE")
    host, port = _split_address(config.STORE.get(environ), "GPUCOLL_STORE")
    return LaunchInfo("gpurun", rank, size, config.LOCAL_RANK.get(environ), config.LOCAL_SIZE.get(environ),
                      host, port, bytes.fromhex(config.STORE_SECRET.get(environ)), host_store=False,
                      job_id=config.JOB_ID.get(environ) or f"{host}-{port}", spawn=_spawn(environ),
                      replaces=_pair(config.REPLACES.name, config.REPLACES.get(environ)))


def _spawn(environ):
    return _pair(config.SPAWN.name, config.SPAWN.get(environ))


def _pair(name, text):
    """(a, b) of variable `name`'s value `text`, which gpurun sets to a:b (GPUCOLL_SPAWN,
    GPUCOLL_REPLACES), or None when unset."""
    if text is None:
        return None
    a, _, b = text.partition(":")
    if not (a.isdigit() and b.isdigit()):
        raise BootstrapError(f"{name}={text!r} is not two integers a:b (gpurun sets it in the processes "
                             "it starts during a job).")
    return int(a), int(b)


def _mpi_present(environ):
    return any(v in environ for v in _MPI_RANK_VARS + _MPI_SIZE_VARS)


def _from_mpi(environ):
    if importlib.util.find_spec("mpi4py") is None:
        var = next(v for v in _MPI_RANK_VARS + _MPI_SIZE_VARS if v in environ)
        raise BootstrapError(
            f"this process was started by an MPI launcher ({var} is set) but mpi4py is not installed: "
            "pip install 'gpucoll[mpi]', or start the job with gpurun instead.")
    # Rank and size come from MPI itself once mpi4py initialises it (connect.py).
    return LaunchInfo("mpi", -1, -1, job_id=environ.get("OMPI_MCA_ess_base_jobid")
                      or environ.get("PMIX_NAMESPACE") or "mpi")


def _slurm_present(environ):
    return "SLURM_PROCID" in environ and "SLURM_STEP_ID" in environ


def slurm_store_port(job_id, step_id):
    """The store port of an srun step when neither GPUCOLL_STORE nor MASTER_PORT says:
    a function of job and step id, so every rank computes the same one."""
    return 30000 + (int(job_id) * 64 + int(step_id)) % 20000


def _from_slurm(environ):
    rank = _int(environ, "SLURM_PROCID", "rank of this task")
    size = _int(environ, "SLURM_NTASKS", "tasks in the step")
    _check_rank(rank, size, "SLURM_PROCID", "SLURM_NTASKS")
    job_id = environ.get("SLURM_JOB_ID", "0")
    step_id = environ.get("SLURM_STEP_ID", "0")
    nodes = hostlist.expand(environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", ""))
    if not nodes:
        raise BootstrapError("SLURM_STEP_NODELIST is empty: cannot tell which node hosts the store.")
    if config.STORE.is_set(environ):
        host, port = _split_address(config.STORE.get(environ), "GPUCOLL_STORE")
        host_store = False
    else:
        host = nodes[0]
        port = int(environ["MASTER_PORT"]) if environ.get("MASTER_PORT") else slurm_store_port(job_id, step_id)
        host_store = True
    local_rank = int(environ["SLURM_LOCALID"]) if "SLURM_LOCALID" in environ else None
    local_size = None
    node_id = environ.get("SLURM_NODEID")
    counts = hostlist.expand_tasks_per_node(environ.get("SLURM_STEP_TASKS_PER_NODE", ""))
    if node_id is not None and counts and int(node_id) < len(counts):
        local_size = counts[int(node_id)]
    identity = f"slurm:{job_id}.{step_id}"
    return LaunchInfo("slurm", rank, size, local_rank, local_size, host, port,
                      _secret(environ, identity), host_store=host_store, job_id=f"{job_id}.{step_id}",
                      one_host=len(set(nodes)) == 1)


def _torchrun_present(environ):
    return "RANK" in environ or "WORLD_SIZE" in environ


def _from_torchrun(environ):
    for var in ("RANK", "WORLD_SIZE"):
        if var not in environ:
            raise BootstrapError(f"RANK and WORLD_SIZE must be set together; {var} is missing.")
    rank = _int(environ, "RANK", "rank of this process")
    size = _int(environ, "WORLD_SIZE", "number of processes")
    _check_rank(rank, size, "RANK", "WORLD_SIZE")
    if config.STORE.is_set(environ):
        host, port = _split_address(config.STORE.get(environ), "GPUCOLL_STORE")
        host_store = False
    else:
        if size > 1 and not (environ.get("MASTER_ADDR") and environ.get("MASTER_PORT")):
            raise BootstrapError(f"WORLD_SIZE={size} needs MASTER_ADDR and MASTER_PORT (or GPUCOLL_STORE).")
        if not environ.get("MASTER_PORT"):  # one rank and no address: nothing to exchange
            return _singleton(environ)
        host = environ.get("MASTER_ADDR", "127.0.0.1")
        port = int(environ.get("MASTER_PORT", "0") or 0)
        # torchrun's own agent already serves torch's store on MASTER_PORT: take the next port.
        if "TORCHELASTIC_RUN_ID" in environ:
            port += 1
        host_store = True
    local_rank = int(environ["LOCAL_RANK"]) if "LOCAL_RANK" in environ else None
    local_size = int(environ["LOCAL_WORLD_SIZE"]) if "LOCAL_WORLD_SIZE" in environ else None
    identity = f"torchrun:{host}:{port}:{environ.get('TORCHELASTIC_RUN_ID', '')}"
    return LaunchInfo("torchrun", rank, size, local_rank, local_size, host, port,
                      _secret(environ, identity), host_store=host_store, job_id=f"{host}-{port}",
                      one_host=local_size == size)


def _singleton(environ):
    return LaunchInfo("singleton", 0, 1, 0, 1, job_id=f"single-{os.getpid()}")


_BUILDERS = {"gpurun": _from_gpurun, "mpi": _from_mpi, "slurm": _from_slurm,
             "torchrun": _from_torchrun, "singleton": _singleton}


def detect(environ=None):
    """The LaunchInfo of this process (environ defaults to os.environ)."""
    env = os.environ if environ is None else environ
    forced = config.BOOTSTRAP.get(env)
    if forced != "auto":
        return _BUILDERS[forced](env)
    if config.RANK.is_set(env) or config.STORE_SECRET.is_set(env) and config.SIZE.is_set(env):
        return _from_gpurun(env)
    if _mpi_present(env) and (importlib.util.find_spec("mpi4py") is not None or not _slurm_present(env)):
        return _from_mpi(env)
    if _slurm_present(env):
        return _from_slurm(env)
    if _torchrun_present(env):
        return _from_torchrun(env)
    return _singleton(env)
