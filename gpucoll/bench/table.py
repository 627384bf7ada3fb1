"""nccl-tests' table: the columns, their widths and the bus-bandwidth factors.

One row per size: size (B), count (elements), type, redop, root, time (us), algbw
(GB/s), busbw (GB/s), #wrong, and with a peer its time, busbw, #wrong and the ratio
peer time / our time (above 1: gpucoll is faster). algbw is size / time; busbw scales
it by the traffic a link carries in the ring algorithm, so that it can be compared
across rank counts and against a link's bandwidth (nccl-tests' doc/PERFORMANCE.md).
"""

# The collectives, in the order -o all runs them.
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "bcast", "alltoall", "reduce")
REDUCING = frozenset({"allreduce", "reduce_scatter", "reduce"})
ROOTED = frozenset({"bcast", "reduce"})
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


_RANGE = 17  # "min-max" of the times, e.g. "1234.5-2345.6"


def _range(lo, hi):
    return f"{_time(lo).strip()}-{_time(hi).strip()}"


def header(peer=None, ranged=False):
    """The '#' lines above the rows: with a peer its columns and the ratio; `ranged` (a table
    of repeated runs) adds each time's and the ratio's range (min-max over the runs)."""
    span = f"  {'range':>{_RANGE}}" if ranged else ""
    span_u = f"  {'(us)':>{_RANGE}}" if ranged else ""
    names = (f"#{'size':>11}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}"
             f"  {'time':>7}{span}  {'algbw':>6}  {'busbw':>6} {'#wrong':>6}")
    units = (f"#{'(B)':>11}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}"
             f"  {'(us)':>7}{span_u}  {'(GB/s)':>6}  {'(GB/s)':>6} {'':>6}")
    if not peer:
        return "\n".join((names, units))
    ours_w = len(names) - 52
    top = f"#{'':>51}{'gpucoll' + (' (median over runs)' if ranged else ''):>{ours_w}}"
    names += f"  {'time':>7}{span}  {'busbw':>6} {'#wrong':>6}  {'ratio':>6}"
    units += f"  {'(us)':>7}{span_u}  {'(GB/s)':>6} {'':>6}  {'(x)':>6}"
    if ranged:
        names += f"  {'range':>11}"
        units += f"  {'(x)':>11}"
    top += f"  {peer:>{len(names) - len(top) - 2}}"
    return "\n".join(line.rstrip() for line in (top, names, units))


def row(r, ranged=False):
    """One row from a record or a summary row (gpucoll.bench.summary); peer columns when it
    has a peer; `ranged`: the min-max columns. A wrong row (#wrong > 0 on either side) shows
    no ratio."""
    blank = f"  {'':>{_RANGE}}" if ranged else ""
    text = f"{r['size']:12d}  {r['count']:12d}  {type_name(r['type']):>8}  {r['redop']:>6}  {r['root']:6d}"
    if r.get("time_us") is None:
        text += f"  {'n/a':>7}{blank}  {'':>6}  {'':>6}  {_wrong(r['wrong'])}"
    else:
        span = f"  {_range(r['time_min_us'], r['time_max_us']):>{_RANGE}}" if ranged else ""
        text += f"  {_time(r['time_us'])}{span}  {r['algbw']:6.2f}  {r['busbw']:6.2f}  {_wrong(r['wrong'])}"
    if r.get("peer"):
        if r.get("peer_time_us") is None:
            text += f"  {'n/a':>7}{blank}  {'':>6}  {_wrong(r.get('peer_wrong', -1))}"
        else:
            span = f"  {_range(r['peer_time_min_us'], r['peer_time_max_us']):>{_RANGE}}" if ranged else ""
            text += f"  {_time(r['peer_time_us'])}{span}  {r['peer_busbw']:6.2f}  {_wrong(r['peer_wrong'])}"
        if r.get("ratio") is None:
            text += f"  {'-':>6}"
        else:
            text += f"  {r['ratio']:6.2f}"
            if ranged:
                text += f"  {r['ratio_min']:.2f}-{r['ratio_max']:.2f}".rjust(13)
    return text.rstrip()


def preamble(opts, nranks, ranks_info, peer_label=None, settings=None):
    """nccl-tests' lines above the table: the parameters, where each rank runs, and the
    settings that change what is measured (environment, repeats, the peer and its version)."""
    lines = [
        f"# gpucoll-bench: {', '.join(opts['collectives'])}  nranks {nranks}  minBytes {opts['min_bytes']}"
        f"  maxBytes {opts['max_bytes']}  step: {opts['factor']}(factor)  warmup iters: {opts['warmup']}"
        f"  iters: {opts['iters']}  validation: {opts['check']}  graph: {opts.get('graphs', 0)}"
        f"  repeats: {opts.get('repeats', 1)}",
        "#",
        "# Using devices",
    ]
    for info in ranks_info:
        where = (f"device {info['device']:2d} [{info['bus']}] {info['gpu']}" if "gpu" in info
                 else "device host [CPU]")
        lines.append(f"#  Rank {info['rank']:2d} Pid {info['pid']:7d} on {info['host']:>10s} {where}")
    if opts.get("gpu"):
        lines.append("# GPU buffers (CuPy), CUDA-event timing, "
                     + (f"CUDA graphs of {opts['graphs']} calls" if opts.get("graphs")
                        else f"groups of {opts['group']} calls (time per call)" if opts.get("group")
                        else "eager launches from Python"))
    if settings:
        lines.append("# Settings: " + " ".join(f"{k}={v}" for k, v in sorted(settings.items())))
    if opts.get("check"):
        lines.append("# #wrong: elements of the timed calls' own output that differ from the expected result, "
                     "summed over ranks" + (" and runs" if opts.get("repeats", 1) > 1 else ""))
    if opts.get("repeats", 1) > 1:
        lines.append(f"# Each row: the median of {opts['repeats']} runs of the whole sweep, range = min-max over "
                     "the runs" + ("; gpucoll and the peer alternate, the ratio is taken run by run" if peer_label else ""))
    if opts.get("call_redop", opts.get("redop")) != opts.get("redop"):
        lines.append(f"# TEST ONLY: the calls reduce with {opts['call_redop']}, the check expects {opts['redop']}")
    if peer_label:
        lines.append(f"# Peer: {peer_label}, the same sizes measured in this run; ratio = peer time / gpucoll time "
                     "(above 1: gpucoll is faster; none on a row where either result is wrong)")
    return "\n".join(lines)


def footer(rows, peer=None):
    """nccl-tests' closing lines: wrong elements (gpucoll's and the peer's) and the mean bus
    bandwidth; with a peer the median ratio over the rows that have one."""
    lines = []
    for name, prefix in (("", ""), (f" ({peer})", "peer_")) if peer else (("", ""),):
        wrong = sum(max(r.get(prefix + "wrong", -1), 0) for r in rows)
        lines.append(f"# Out of bounds values{name} : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    timed = [r for r in rows if r.get("busbw") is not None]
    avg = sum(r["busbw"] for r in timed) / len(timed) if timed else 0.0
    lines.append(f"# Avg bus bandwidth    : {avg:g}")
    ratios = [r["ratio"] for r in rows if r.get("ratio")]
    if peer:
        import statistics

        text = f"{statistics.median(ratios):.2f} over {len(ratios)} of {len(rows)} rows" if ratios else "none"
        lines.append(f"# Median ratio (peer time / gpucoll time) : {text}")
    return "\n".join(lines)
