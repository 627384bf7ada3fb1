"""Every GPUCOLL_* variable, declared once: name, type, default and meaning.

There is no other way to read gpucoll's settings from the environment. A value that
does not parse raises ConfigError naming the variable and what it accepts::

    from gpucoll.base import config
    timeout = config.TIMEOUT.get()      # float seconds
    for var in config.ALL: print(var.name, var.get(), var.help)

The variables that gpurun sets for each rank are declared here too (`launcher=True`), and so is
the test suite's own. docs/environment.md is made from these declarations (`gpucoll environment`).
"""
import os
import re

from .errors import ConfigError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text):
    """'4M', '512KiB', '1048576' -> bytes (binary units)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(text)
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


class Var:
    """One GPUCOLL_* setting. `kind` is bool, int, float, size, str, choice or choices."""

    def __init__(self, name, kind, default, help, choices=None, minimum=None, secret=False, launcher=False):
        self.name = name
        self.kind = kind
        self.default = default
        self.help = help
        self.choices = tuple(choices) if choices else None
        self.minimum = minimum
        self.secret = secret   # never shown: `gpucoll info` and errors say only that it is set
        self.launcher = launcher  # gpurun sets it for each rank (launcher/env.py)

    def shown(self, value):
        """How a value of this variable may be printed: its repr, or a mask if secret."""
        return f"<set, {len(str(value))} chars>" if self.secret else repr(value)

    def allowed(self):
        """A short human description of what the variable accepts."""
        if self.kind == "bool":
            return "0 or 1"
        if self.kind in ("choice", "choices"):
            joined = ", ".join(self.choices)
            return joined if self.kind == "choice" else f"a comma-separated list of {joined}"
        if self.kind == "size":
            return "a byte count such as 4194304, 512K or 4M"
        if self.kind in ("int", "float"):
            low = "" if self.minimum is None else f" >= {self.minimum}"
            return f"{'an integer' if self.kind == 'int' else 'a number'}{low}"
        return "any text"

    def is_set(self, environ=None):
        env = os.environ if environ is None else environ
        return self.name in env

    def raw(self, environ=None):
        env = os.environ if environ is None else environ
        return env.get(self.name)

    def get(self, environ=None):
        """The parsed value, or the default when the variable is unset."""
        text = self.raw(environ)
        if text is None:
            return self.default
        try:
            value = self._parse(text.strip())
        except ValueError:
            raise ConfigError(
                f"{self.name}={self.shown(text)} is not valid: expected {self.allowed()}. "
                f"Unset it or fix the value. ({self.help})"
            ) from None
        return value

    def _parse(self, text):
        kind = self.kind
        if kind == "bool":
            low = text.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(text)
        if kind == "int" or kind == "float" or kind == "size":
            value = {"int": int, "float": float, "size": parse_size}[kind](text)
            if self.minimum is not None and value < self.minimum:
                raise ValueError(text)
            return value
        if kind == "choice":
            low = text.lower()
            if low not in self.choices:
                raise ValueError(text)
            return low
        if kind == "choices":
            spelled = {c.lower(): c for c in self.choices}  # any case in, the declared spelling out
            items = [t.strip().lower() for t in text.split(",") if t.strip()]
            if any(item not in spelled for item in items):
                raise ValueError(text)
            return tuple(spelled[item] for item in items)
        return text


ALL = []


def declare(name, kind, default, help, **kw):
    var = Var(name, kind, default, help, **kw)
    ALL.append(var)
    return var


def by_name(name):
    for var in ALL:
        if var.name == name:
            return var
    raise KeyError(name)


def undeclared(environ=None):
    """The GPUCOLL_* names of the environment that nothing declares (usually a typo), sorted."""
    env = os.environ if environ is None else environ
    known = {var.name for var in ALL}
    return sorted(k for k in env if k.startswith("GPUCOLL_") and k not in known)


def check_all(environ=None):
    """Parse every declared variable; raise on the first invalid one. Returns undeclared(environ)."""
    for var in ALL:
        var.get(environ)
    return undeclared(environ)


# --- logging ---------------------------------------------------------------------
SUBSYSTEMS = ("INIT", "BOOTSTRAP", "COLL", "P2P", "NET", "SHM", "TUNING", "ENV", "ALL")
DEBUG = declare("GPUCOLL_DEBUG", "choice", "warn",
                "Log level: NONE, WARN, INFO or TRACE.", choices=("none", "warn", "info", "trace"))
DEBUG_SUBSYS = declare("GPUCOLL_DEBUG_SUBSYS", "choices", ("ALL",),
                       "Subsystems to log at INFO/TRACE, e.g. INIT,COLL.", choices=SUBSYSTEMS)
DEBUG_FILE = declare("GPUCOLL_DEBUG_FILE", "str", None,
                     "Write logs to this file instead of stderr; %h is the host, %p the pid, %r the rank.")
DEBUG_CHECKS = declare("GPUCOLL_DEBUG_CHECKS", "bool", False,
                       "Cross-check op, dtype, count and root of every collective across ranks.")

# --- bootstrap -------------------------------------------------------------------
BOOTSTRAP = declare("GPUCOLL_BOOTSTRAP", "choice", "auto",
                    "Force how ranks find each other: auto, gpurun, mpi, slurm, torchrun or singleton.",
                    choices=("auto", "gpurun", "mpi", "slurm", "torchrun", "singleton"))
RANK = declare("GPUCOLL_RANK", "int", None, "This process's rank.", minimum=0, launcher=True)
SIZE = declare("GPUCOLL_SIZE", "int", None, "Number of ranks in the job.", minimum=1, launcher=True)
LOCAL_RANK = declare("GPUCOLL_LOCAL_RANK", "int", None, "Rank among the ranks of this host.", minimum=0,
                     launcher=True)
LOCAL_SIZE = declare("GPUCOLL_LOCAL_SIZE", "int", None, "Number of ranks on this host.", minimum=1,
                     launcher=True)
STORE = declare("GPUCOLL_STORE", "str", None,
                "host:port of the rendezvous store (set it for srun and torchrun jobs to choose the port).",
                launcher=True)
STORE_SECRET = declare("GPUCOLL_STORE_SECRET", "str", None,
                       "Per-job secret (hex) that authenticates clients to the store. Jobs that gpurun does "
                       "not start alone (srun, torchrun, gpurun --nnodes) derive one from the job's identity "
                       "unless it is set, which keeps other jobs out by accident only.", secret=True,
                       launcher=True)
INIT_TIMEOUT = declare("GPUCOLL_INIT_TIMEOUT", "float", 120.0,
                       "Seconds to wait for every rank to join at start-up (not the set-up in a communicator's "
                       "first collective, which waits GPUCOLL_TIMEOUT).", minimum=0.001)
SPAWN = declare("GPUCOLL_SPAWN", "str", None,
                "Set by gpurun in the processes that MPI's Spawn started: the spawn's number and the "
                "first world rank of its processes (k:base).", launcher=True)
JOB_ID = declare("GPUCOLL_JOB_ID", "str", None, "Identifier of the job, used in names.", launcher=True)
REPLACES = declare("GPUCOLL_REPLACES", "str", None,
                   "Set by gpurun --respawn in a replacement process: the world rank of the failed rank it "
                   "replaces and its own (dead:new).", launcher=True)
STACKS_SIGNAL = declare("GPUCOLL_STACKS_SIGNAL", "int", None,
                        "Set by gpurun: the signal on which a rank writes every thread's Python stack to "
                        "its stderr; gpurun sends it to the ranks still running when --timeout expires.",
                        launcher=True)
ON_FAILURE = declare("GPUCOLL_ON_FAILURE", "choice", "end",
                     "Set by gpurun --on-failure: end (a failed rank ends the job) or continue (the job goes on; "
                     "each rank watches for revoked communicators from the start, docs/fault-tolerance.md).",
                     choices=("end", "continue"), launcher=True)

# --- collectives -----------------------------------------------------------------
TIMEOUT = declare("GPUCOLL_TIMEOUT", "float", 300.0,
                  "Seconds any blocking wait in a collective may last before it raises, the set-up of a "
                  "communicator's first collective included.", minimum=0.001)
ALGO = declare("GPUCOLL_ALGO", "choice", "auto",
               "Force an algorithm where it applies: auto; on host buffers direct (one shared segment, one "
               "host), ring, tree, rhd (recursive halving/doubling) or rd (recursive doubling, all-reduce); "
               "on GPU buffers one-shot, two-shot or staged (through the IPC staging buffers), or registered (between the callers' buffers, "
               "registered with CUDA IPC).",
               choices=("auto", "direct", "ring", "tree", "rhd", "rd", "one-shot", "two-shot", "staged", "registered"))
BUFFSIZE = declare("GPUCOLL_BUFFSIZE", "size", 4 << 20,
                   "Bytes of staging buffer per peer and channel (shared memory, sockets).", minimum=4096)

# --- transports ------------------------------------------------------------------
SHM_DISABLE = declare("GPUCOLL_SHM_DISABLE", "bool", False,
                      "Do not use shared memory between ranks of one host (use sockets).")
P2P_DISABLE = declare("GPUCOLL_P2P_DISABLE", "bool", False,
                      "Do not use direct GPU peer access / CUDA IPC; stage through host memory.")
RMA_DIRECT = declare("GPUCOLL_RMA_DIRECT", "bool", True,
                     "One-sided operations (MPI.Win) between processes of one host read and write the target's "
                     "memory directly (process_vm_readv/writev, record locks); 0: through the target's "
                     "service thread, as between hosts.")
P2P_SHARED_COPY = declare("GPUCOLL_P2P_SHARED_COPY", "bool", True,
                          "Within a host, the sender of a large point-to-point message writes chunks of it "
                          "into the receiver's memory (process_vm_writev) while the receiver reads the others; "
                          "0: the receiver copies alone.")
IB_DISABLE = declare("GPUCOLL_IB_DISABLE", "bool", False,
                     "Do not use RDMA between hosts (GPUCOLL_NET=auto then picks sockets).")
NET = declare("GPUCOLL_NET", "choice", "auto",
              "Transport between hosts: ofi (libfabric: RDMA, or its tcp provider), tcp (gpucoll's sockets), "
              "auto (ofi when libfabric has a hardware provider such as verbs, efa, cxi or psm3, else tcp).",
              choices=("auto", "ofi", "tcp"))
OFI_PROVIDER = declare("GPUCOLL_OFI_PROVIDER", "str", None,
                       "libfabric provider between hosts, e.g. verbs;ofi_rxm, efa, cxi, tcp;ofi_rxm. Unset: the "
                       "first hardware provider, or tcp;ofi_rxm under GPUCOLL_NET=ofi when there is none.")
OFI_RMA_MIN = declare("GPUCOLL_OFI_RMA_MIN", "size", 256 << 10,
                      "Over OFI, a stretch of at least this many bytes is read by the receiver from the sender's "
                      "registered memory (one-sided, no copy) instead of sent through bounce buffers.",
                      minimum=1024)
SOCKET_IFNAME = declare("GPUCOLL_SOCKET_IFNAME", "str", None,
                        "Interfaces for sockets: prefixes separated by commas, ^ to exclude, = for an exact name. "
                        "Unset: loopback for a one-host job, else the interface that reaches the store.")
NSOCKS = declare("GPUCOLL_NSOCKS", "int", 2, "TCP sockets per peer between hosts.", minimum=1)
DEVICE = declare("GPUCOLL_DEVICE", "int", None,
                 "Pins this rank's GPU collectives to this GPU: a buffer on another GPU is refused. Unset: "
                 "each communicator uses the GPU of its first GPU buffer.", minimum=0)
CACHE_DIR = declare("GPUCOLL_CACHE_DIR", "str", None,
                    "Folder for compiled kernels; default ~/.cache/gpucoll.")

# --- GPU collectives (within a host) ----------------------------------------------
HOST_ONESHOT_MAX = declare("GPUCOLL_HOST_ONESHOT_MAX", "size", None,
                           "Host all-reduce and reduce within a host (direct engine): one-shot (every rank "
                           "reads every rank's input) up to this many bytes, two-shot above; unset: 64 KiB "
                           "up to 4 ranks, 256 KiB divided by the square of the ranks above (8 ranks: 4 KiB, 16: 1 KiB). "
                           "The same on every rank.")
HOST_SINGLE_COPY_MIN = declare("GPUCOLL_HOST_SINGLE_COPY_MIN", "size", None,
                               "Host all-to-all within a host (direct engine): send buffers of at least this "
                               "many bytes (all blocks together) are read straight from each peer "
                               "(process_vm_readv, one copy) when every rank may read every other's memory; "
                               "smaller ones, in-place calls and ranks without that permission go through the "
                               "shared segment. Unset: 4 MiB; 0: never. The same on every rank.")
GPU_ONESHOT_MAX = declare("GPUCOLL_GPU_ONESHOT_MAX", "size", None,
                          "GPU all-reduce: one-shot kernel up to this many bytes and never above; unset: the "
                          "cost table decides (gpucoll info shows its crossovers).")
GPU_STAGE_MAX = declare("GPUCOLL_GPU_STAGE_MAX", "size", 64 << 20,
                        "GPU collectives up to this many bytes go through the IPC staging buffers; larger "
                        "ones register the caller's buffers with CUDA IPC and move data directly.",
                        minimum=4096)
GPU_BLOCKS = declare("GPUCOLL_GPU_BLOCKS", "int", 0,
                     "Most thread blocks per GPU collective kernel; 0 picks by size (8 KiB per block, up to 64, "
                     "through staging; on registered buffers up to one per SM).",
                     minimum=0)
GPU_SHARED_IPC = declare("GPUCOLL_GPU_SHARED_IPC", "bool", False,
                         "Ranks that share a GPU still use CUDA IPC and gpucoll's kernels instead of staging "
                         "through host memory. Kernels of different processes on one GPU take turns (about 2 ms "
                         "per synchronisation on an H200): for testing the IPC path on a one-GPU machine.")
GPU_HOST_CHUNK = declare("GPUCOLL_GPU_HOST_CHUNK", "size", 4 << 20,
                         "GPU collectives that go through host memory (no P2P between the GPUs, ranks sharing a "
                         "GPU, ranks on other hosts): all-reduce, broadcast and reduce move in chunks of this many "
                         "bytes through pinned buffers, the copies overlapped with the host collectives; 0: the "
                         "whole buffer at once through pageable memory.", minimum=0)
GPU_COPY = declare("GPUCOLL_GPU_COPY", "choice", "ce",
                   "How large GPU broadcasts and all-gathers move registered data: ce (copy engines, "
                   "cuMemcpyAsync between mapped buffers) or sm (copy kernels).", choices=("ce", "sm"))

# --- testing --------------------------------------------------------------------------
TEST_HOST = declare("GPUCOLL_TEST_HOST", "str", None,
                    "Testing only: the host name gpucoll uses for this rank instead of the machine's (%r: the "
                    "rank), so that ranks of one machine act as ranks of different hosts: no shared memory or "
                    "CUDA IPC between them, TCP, GPU data through host memory. Never set it for real work.")

# --- the test suite (read by tests/conftest.py, never by gpucoll) ------------------
TEST_REQUIRE = declare("GPUCOLL_TEST_REQUIRE", "choices", (),
                       "Tests only: the pieces of the machine whose absence fails the tests that need them "
                       "instead of skipping them (netns is multihost).",
                       choices=("gpu", "mpi4py", "mpich", "slurm", "pmix", "multihost", "netns", "sshd", "torch", "ofi"))
