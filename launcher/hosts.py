"""Which hosts a job runs on and how many ranks each gets.

Sources: `--hosts h1:4,h2:4` (a host without `:N` has one slot), `--hostfile FILE` (one
host a line: `h1`, `h1:4`, `h1 slots=4`; `#` starts a comment), or a Slurm allocation
(SLURM_JOB_NODELIST, with -np spread over the nodes). Ranks are numbered in host order,
then by local rank: with `h1:2,h2:2`, h1 runs ranks 0-1 and h2 runs 2-3::

    plan = parse_hosts("h1:2,h2:2")          # [Host('h1', 2), Host('h2', 2)]
    assign(plan, 3)                          # [('h1', [0, 1]), ('h2', [2])]
"""
import re
from typing import List, NamedTuple


class Host(NamedTuple):
    name: str
    slots: int


_ITEM = re.compile(r"^\s*([^\s:=,]+)\s*(?::\s*(\d+)|\s+slots\s*=\s*(\d+))?\s*$")


def _item(text, where):
    m = _ITEM.match(text)
    if not m:
        raise ValueError(f"{where}: expected HOST, HOST:N or 'HOST slots=N', got {text.strip()!r}")
    slots = int(m.group(2) or m.group(3) or 1)
    if slots < 1:
        raise ValueError(f"{where}: host {m.group(1)} has {slots} slots; at least 1 is needed")
    return Host(m.group(1), slots)


def _merge(hosts):
    """Repeated names add up their slots (as in MPI hostfiles); first appearance keeps its place."""
    order, slots = [], {}
    for h in hosts:
        if h.name not in slots:
            order.append(h.name)
            slots[h.name] = 0
        slots[h.name] += h.slots
    return [Host(name, slots[name]) for name in order]


def parse_hosts(spec) -> List[Host]:
    """'h1:2,h2:2' -> [Host('h1', 2), Host('h2', 2)]."""
    items = [t for t in spec.split(",") if t.strip()]
    if not items:
        raise ValueError("--hosts: no host given")
    return _merge(_item(t, "--hosts") for t in items)


def parse_hostfile(path) -> List[Host]:
    hosts = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.split("#", 1)[0]
            if line.strip():
                hosts.append(_item(line, f"{path}:{lineno}"))
    if not hosts:
        raise ValueError(f"{path}: no host listed")
    return _merge(hosts)


def from_slurm(environ, nprocs=None) -> List[Host]:
    """The nodes of the Slurm allocation this gpurun runs in, with -np (default: one rank
    per task of the allocation, SLURM_NTASKS, else one per node) spread in blocks."""
    from gpucoll.bootstrap import hostlist

    nodes = hostlist.expand(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST", ""))
    if not nodes:
        raise ValueError("SLURM_JOB_NODELIST is empty: not inside a Slurm allocation")
    if nprocs is None:
        nprocs = int(environ.get("SLURM_NTASKS") or len(nodes))
    base, extra = divmod(nprocs, len(nodes))
    hosts = [Host(n, base + (1 if i < extra else 0)) for i, n in enumerate(nodes)]
    return [h for h in hosts if h.slots > 0]


def in_slurm_allocation(environ):
    """Inside salloc/sbatch but not inside an srun step (where gpurun stays on its node)."""
    return bool(environ.get("SLURM_JOB_ID")) and not environ.get("SLURM_STEP_ID")


def assign(hosts, nprocs=None):
    """[(host, [ranks])] filling hosts in order; nprocs defaults to every slot."""
    total = sum(h.slots for h in hosts)
    if nprocs is None:
        nprocs = total
    if nprocs > total:
        raise ValueError(f"-np {nprocs} is more than the {total} slots of the hosts "
                         f"({', '.join(f'{h.name}:{h.slots}' for h in hosts)})")
    out, next_rank = [], 0
    for h in hosts:
        n = min(h.slots, nprocs - next_rank)
        if n <= 0:
            break
        out.append((h.name, list(range(next_rank, next_rank + n))))
        next_rank += n
    return out
