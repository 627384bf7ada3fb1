"""Which CPUs each rank of this host runs on: gpurun --bind-to {share,core,numa,none}.

A rank that the kernel moves between CPUs, or that shares one with another rank while a CPU
is idle, waits for a context switch on every message of a collective; mpirun binds its ranks
for that reason, and gpurun does the same.

- share: an equal share of the whole physical cores each (all their hardware threads),
  disjoint, so no two ranks meet on a core and a rank's own threads (a data loader, BLAS)
  keep the rest of its share;
- core: one CPU each, as mpirun binds two ranks, spread over physical cores first (the first
  hardware thread of every core, then the second ones), in the order of the CPUs gpurun may use;
- numa: the allowed CPUs of one NUMA node each, ranks dealt over the nodes in turn;
- none: the mask gpurun got, unchanged.

Everything stays inside gpurun's own mask (os.sched_getaffinity: Slurm, taskset, a container's
cpuset), so binding never widens what the job may use. Without --bind-to, gpurun binds to
shares when the ranks of this host are no more than its physical cores, to one CPU each when
they are no more than its CPUs, and not at all when they are more (then two ranks would
share a CPU while others stay free of ranks) or when srun or mpirun started gpurun (they
place processes themselves).
"""
import os

CHOICES = ("share", "core", "numa", "none")

_CPU_SYSFS = "/sys/devices/system/cpu"
_NODE_SYSFS = "/sys/devices/system/node"
# Variables that srun (a job step) or an MPI launcher set in the processes they start.
_PLACED_BY = (("SLURM_STEP_ID", "srun"), ("OMPI_COMM_WORLD_SIZE", "mpirun"), ("PMI_RANK", "mpirun"),
              ("PMIX_RANK", "mpirun"))


def parse_cpulist(text):
    """'0-3,8,10-11' (the kernel's list format) -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def physical_cores(allowed, sysfs=_CPU_SYSFS):
    """The allowed CPUs grouped by physical core (package, core id), cores in CPU order, each
    core's threads in CPU order. A CPU whose topology cannot be read counts as a core of its own."""
    cores = {}
    for cpu in sorted(allowed):
        top = os.path.join(sysfs, f"cpu{cpu}", "topology")
        package, core = _read(os.path.join(top, "physical_package_id")), _read(os.path.join(top, "core_id"))
        key = (package, core) if package is not None and core is not None else ("cpu", cpu)
        cores.setdefault(key, []).append(cpu)
    return list(cores.values())


def core_order(allowed, sysfs=_CPU_SYSFS):
    """The allowed CPUs in the order ranks get them with --bind-to core: the first allowed
    hardware thread of each physical core, cores in CPU order, then the second threads, and so on."""
    threads = physical_cores(allowed, sysfs)
    order = []
    for i in range(max(map(len, threads), default=0)):
        order.extend(t[i] for t in threads if i < len(t))
    return order


def shares(allowed, nlocal, sysfs=_CPU_SYSFS):
    """nlocal disjoint sets of whole physical cores, as many cores in each (the cores left
    over stay unused), or None when there are fewer cores than ranks."""
    cores = physical_cores(allowed, sysfs)
    if not 0 < nlocal <= len(cores):
        return None
    k = len(cores) // nlocal
    return [{cpu for core in cores[i * k:(i + 1) * k] for cpu in core} for i in range(nlocal)]


def numa_nodes(allowed, sysfs=_NODE_SYSFS):
    """The allowed CPUs of each NUMA node that has some, in node order; one node holding all
    of them when the machine says nothing about nodes."""
    nodes = []
    try:
        names = sorted((n for n in os.listdir(sysfs) if n.startswith("node") and n[4:].isdigit()),
                       key=lambda n: int(n[4:]))
    except OSError:
        names = []
    for name in names:
        text = _read(os.path.join(sysfs, name, "cpulist"))
        cpus = parse_cpulist(text) & set(allowed) if text else set()
        if cpus:
            nodes.append(cpus)
    return nodes or [set(allowed)]


def placed_by(environ):
    """'srun' or 'mpirun' when that launcher started this gpurun (and placed it), else None."""
    for var, launcher in _PLACED_BY:
        if environ.get(var) is not None:
            return launcher
    return None


def plan(mode, nlocal, allowed=None, environ=None, cpu_sysfs=_CPU_SYSFS, node_sysfs=_NODE_SYSFS):
    """(cpus, note): cpus[i] is the set of CPUs local rank i is bound to, or None (not bound);
    note says why the default did not bind (None otherwise). `mode` is one of CHOICES, or
    None for the default."""
    allowed = set(os.sched_getaffinity(0) if allowed is None else allowed)
    environ = os.environ if environ is None else environ
    note = None
    if mode is None:
        launcher = placed_by(environ)
        if launcher is not None:
            mode, note = "none", f"not binding ranks: {launcher} started gpurun and placed it"
        elif nlocal > len(allowed):
            mode, note = "none", (f"not binding ranks: {nlocal} ranks on this host, {len(allowed)} "
                                  f"CPU(s) allowed ({cpulist(allowed)})")
        else:
            mode = "share"
    if mode == "none":
        return [None] * nlocal, note
    if mode == "share":
        got = shares(allowed, nlocal, cpu_sysfs)
        if got is not None:
            return got, note
        mode = "core"  # more ranks than cores: a hardware thread each
    if mode == "core":
        order = core_order(allowed, cpu_sysfs)
        return [{order[i % len(order)]} for i in range(nlocal)], note
    if mode == "numa":
        nodes = numa_nodes(allowed, node_sysfs)
        return [nodes[i % len(nodes)] for i in range(nlocal)], note
    raise ValueError(f"--bind-to {mode!r}: use one of {', '.join(CHOICES)}")


def cpulist(cpus):
    """{0, 1, 2, 5} -> '0-2,5'."""
    out, run = [], []
    for cpu in sorted(cpus):
        if run and cpu != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(cpu)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def threads_per_rank(cpus, nlocal, allowed=None):
    """OMP_NUM_THREADS for a rank bound to `cpus` (None: unbound) among `nlocal` on this host:
    its part of the CPUs gpurun may use, at most the CPUs it is bound to, at least 1. Without
    it, every rank's OpenMP and BLAS pools would take every CPU of the host (torchrun, for the
    same reason, sets 1)."""
    allowed = os.sched_getaffinity(0) if allowed is None else allowed
    share = max(1, len(allowed) // max(1, nlocal))
    return share if cpus is None else max(1, min(len(cpus), share))
