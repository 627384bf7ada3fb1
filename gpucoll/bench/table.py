"""nccl-tests' table: the columns, their widths and the bus-bandwidth factors.

One row per size: size (B), count (elements), type, redop, root, time (us), algbw
(GB/s), busbw (GB/s), #wrong, and with a peer its time, busbw, #wrong and the ratio
peer time / our time (above 1: gpucoll is faster). algbw is size / time; busbw scales
it by the traffic a link carries in the ring algorithm, so that it can be compared
across rank counts and against a link's bandwidth (nccl-tests' doc/PERFORMANCE.md).
"""

# The collectives, in the order -o all runs them.
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "bcast", "alltoall")
REDUCING = frozenset({"allreduce", "reduce_scatter"})
ROOTED = frozenset({"bcast"})
# Collectives whose buffer is split into one block per rank (size must divide by ranks).
BLOCKED = frozenset({"allgather", "reduce_scatter", "alltoall"})

# nccl-tests prints these names for the element types.
_TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "half"}


def bus_factor(collective, nranks):
    """busbw / algbw for a collective on nranks ranks (nccl-tests' factors)."""
    if collective == "allreduce":
        return 2.0 * (nranks - 1) / nranks
    if collective in ("allgather", "reduce_scatter", "alltoall"):
        return (nranks - 1) / nranks
    return 1.0


def type_name(dtype):
    return _TYPE_NAMES.get(dtype, dtype)


def _time(us):
    # nccl-tests keeps the column 7 wide: fewer decimals as the time grows.
    if us >= 10000.0:
        return f"{us:7.0f}"
    if us >= 100.0:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


def _wrong(n):
    return f"{n:5d}" if n >= 0 else f"{'N/A':>5}"


def header(peer=None):
    """The three '#' lines above the rows (with a peer: its columns and the ratio)."""
    ours = "gpucoll" if peer else ""
    top = f"#{'':>52}{ours:>34}"
    names = (f"#{'size':>11}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}"
             f"  {'time':>7}  {'algbw':>6}  {'busbw':>6} {'#wrong':>6}")
    units = (f"#{'(B)':>11}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}"
             f"  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6} {'':>6}")
    if peer:
        top += f"  {peer:>33}"
        names += f"  {'time':>7}  {'busbw':>6} {'#wrong':>6}  {'ratio':>6}"
        units += f"  {'(us)':>7}  {'(GB/s)':>6} {'':>6}  {'(x)':>6}"
    return "\n".join(line.rstrip() for line in (top, names, units)) if peer else "\n".join((names, units))


def row(r):
    """One row from a record (see runner.Record.as_dict); peer columns when it has them."""
    text = f"{r['size']:12d}  {r['count']:12d}  {type_name(r['type']):>8}  {r['redop']:>6}  {r['root']:6d}"
    if r.get("time_us") is None:
        text += f"  {'n/a':>7}  {'':>6}  {'':>6}  {_wrong(r['wrong'])}"
    else:
        text += f"  {_time(r['time_us'])}  {r['algbw']:6.2f}  {r['busbw']:6.2f}  {_wrong(r['wrong'])}"
    if r.get("peer"):
        if r.get("peer_time_us") is None:
            text += f"  {'n/a':>7}  {'':>6}  {'':>5}  {'':>6}"
        else:
            text += (f"  {_time(r['peer_time_us'])}  {r['peer_busbw']:6.2f}  {_wrong(r['peer_wrong'])}"
                     f"  {r['ratio']:6.2f}")
    return text.rstrip()


def preamble(opts, nranks, ranks_info, peer_label=None):
    """nccl-tests' lines above the table: the parameters and where each rank runs."""
    lines = [
        f"# gpucoll-bench: {', '.join(opts['collectives'])}  nranks {nranks}  minBytes {opts['min_bytes']}"
        f"  maxBytes {opts['max_bytes']}  step: {opts['factor']}(factor)  warmup iters: {opts['warmup']}"
        f"  iters: {opts['iters']}  validation: {opts['check']}  graph: {opts.get('graphs', 0)}",
        "#",
        "# Using devices",
    ]
    for info in ranks_info:
        where = (f"device {info['device']:2d} [{info['bus']}] {info['gpu']}" if "gpu" in info
                 else "device host [CPU]")
        lines.append(f"#  Rank {info['rank']:2d} Pid {info['pid']:7d} on {info['host']:>10s} {where}")
    if opts.get("gpu"):
        lines.append(f"# GPU buffers (CuPy), CUDA-event timing, "
                     + (f"CUDA graphs of {opts['graphs']} calls" if opts.get("graphs") else "eager launches from Python"))
    if peer_label:
        lines.append(f"# Peer: {peer_label}, the same sizes measured in this run; ratio = peer time / gpucoll time")
    return "\n".join(lines)


def footer(records):
    """nccl-tests' closing lines: wrong elements and the mean bus bandwidth."""
    wrong = sum(max(r["wrong"], 0) for r in records)
    timed = [r for r in records if r.get("busbw") is not None]
    avg = sum(r["busbw"] for r in timed) / len(timed) if timed else 0.0
    lines = [f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}",
             f"# Avg bus bandwidth    : {avg:g}"]
    ratios = [r["ratio"] for r in records if r.get("ratio")]
    if ratios:
        import statistics

        lines.append(f"# Median ratio (peer time / gpucoll time) : {statistics.median(ratios):.2f}")
    return "\n".join(lines)
