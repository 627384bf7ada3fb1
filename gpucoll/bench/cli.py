"""`gpucoll-bench`: nccl-tests' tables for gpucoll's collectives, optionally beside a peer.

    gpucoll-bench -np 4 -o allreduce -b 8 -e 64M -f 2 --vs mpi --json out.json

Outside a job, `-np N` starts N ranks of this command under gpurun; inside a job
(GPUCOLL_RANK set by gpurun, or started by mpiexec/srun without -np) every rank measures
directly. Rank 0 prints the table; with --vs the peer runs the same plan, and the table
gains its time, busbw, #wrong and the ratio peer time / gpucoll time (above 1: gpucoll is
faster). Host peers (mpi, gloo) run in a job of their own after gpucoll's.

Where CuPy and a GPU are present the buffers are on the GPU (-g/--gpu, the default there;
--no-gpu measures host buffers): CUDA-event timing, -G N captures N calls in a CUDA graph,
and the GPU peers (nccl, torch) run in the same job right after gpucoll (gpucoll/bench/gpu.py).
"""
import json
import os
import subprocess
import sys
import tempfile

import click

from . import peers, runner, table
from .sizes import parse_size, sweep

_KINDS = table.COLLECTIVES + ("all",)


def _size(ctx, param, value):
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _dtype(ctx, param, value):
    name = runner.DTYPE_ALIASES.get(value.lower(), value.lower())
    if name not in runner.DTYPES:
        raise click.BadParameter(f"{value!r} is not a type gpucoll-bench measures; use one of "
                                 f"{', '.join(runner.DTYPES)} (or nccl-tests' float, double, half, int, char)")
    return name


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-np", "--np", "nranks", type=click.IntRange(min=1), default=None, metavar="N",
              help="Ranks to start under gpurun (outside a job); inside a job the job's size is used.")
@click.option("-o", "--collective", "collective", type=click.Choice(_KINDS), default="allreduce",
              show_default=True, help="The collective to measure, or all of them one after another.")
@click.option("-b", "--minbytes", "min_bytes", default="32M", show_default=True, callback=_size,
              help="Smallest size (bytes; K, M, G suffixes).")
@click.option("-e", "--maxbytes", "max_bytes", default="32M", show_default=True, callback=_size,
              help="Largest size.")
@click.option("-f", "--stepfactor", "factor", type=click.IntRange(min=1), default=2, show_default=True,
              help="Multiply the size by this from one row to the next.")
@click.option("-n", "--iters", "iters", type=click.IntRange(min=1), default=20, show_default=True,
              help="Timed calls per size.")
@click.option("-w", "--warmup_iters", "warmup", type=click.IntRange(min=0), default=5, show_default=True,
              help="Untimed calls before the timed ones.")
@click.option("-c", "--check", "check", type=click.IntRange(0, 1), default=1, show_default=True,
              help="1: check one more call's result on every rank and count the wrong elements.")
@click.option("-d", "--datatype", "dtype", default="float32", show_default=True, callback=_dtype,
              help=f"Element type: {', '.join(runner.DTYPES)}.")
@click.option("-r", "--root", "root", type=click.IntRange(min=0), default=0, show_default=True,
              help="Root rank of bcast.")
@click.option("--op", "redop", type=click.Choice(runner.REDOPS), default="sum", show_default=True,
              help="Reduction of allreduce and reduce_scatter.")
@click.option("--vs", "peer", type=click.Choice(peers.ALL), default=None,
              help="Also measure the same sizes with mpi (Open MPI via mpi4py) or gloo (torch); "
                   "nccl and torch need GPU buffers.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write one record per row (every column, the peer's too) to this file.")
@click.option("-G", "--cudagraph", "graphs", type=click.IntRange(min=0), default=0, show_default=True,
              help="Capture N calls in one CUDA graph and time its replays, for gpucoll and the peer "
                   "(GPU buffers only).")
@click.option("-g/-H", "--gpu/--no-gpu", "gpu", default=None,
              help="GPU buffers (CuPy arrays; the default where CuPy and a GPU are present) or host buffers.")
@click.option("--rows-out", "rows_out", default=None, hidden=True,
              help="Rank 0 writes the records here and prints nothing (used when gpucoll-bench starts itself).")
def main(nranks, collective, min_bytes, max_bytes, factor, iters, warmup, check, dtype, root, redop, peer,
         json_path, graphs, gpu, rows_out):
    """Measure gpucoll's collectives and print nccl-tests' table
    (size, count, type, redop, root, time, algbw, busbw, #wrong).

    \b
      gpucoll-bench -np 4 -b 8 -e 64M -f 2                 allreduce, 8 B to 64 MiB
      gpucoll-bench -np 2 -o all -b 1K -e 1M -f 4 -c 1    every collective, checked
      gpucoll-bench -np 4 -b 1M -e 64M --vs mpi            beside Open MPI, with the ratio
      gpurun -np 4 gpucoll-bench -b 8 -e 1M                inside a job: every rank measures
      gpucoll-bench -np 2 -b 8 -e 512M -f 4 --vs nccl      GPU buffers beside NCCL
      gpucoll-bench -np 2 -b 8 -e 64K -f 8 -G 100 --vs nccl   CUDA graphs of 100 calls
    """
    from . import gpu as _gpu

    if gpu is None:
        gpu = _gpu.available()
    elif gpu and not _gpu.available():
        raise click.UsageError("--gpu needs a GPU and CuPy; none is usable here (run with --no-gpu)")
    if not gpu and graphs:
        raise click.UsageError("-G (CUDA graph launches) needs a GPU: gpucoll-bench measures host buffers "
                               "here; run without -G")
    if not gpu and peer in peers.GPU_PEERS:
        raise click.UsageError(f"--vs {peer} needs a GPU: it compares with NCCL on GPU buffers, and "
                               "gpucoll-bench measures host buffers here; use --vs mpi or --vs gloo")
    if gpu and peer in peers.HOST_PEERS:
        raise click.UsageError(f"--vs {peer} compares host buffers; add --no-gpu (or use --vs nccl / --vs torch)")
    if redop == "avg" and not dtype.startswith("float"):
        raise click.UsageError(f"--op avg needs a floating-point type, not {dtype}")
    try:
        sizes = sweep(min_bytes, max_bytes, factor)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    collectives = list(table.COLLECTIVES) if collective == "all" else [collective]
    plan = runner.Plan(collectives, sizes, dtype, redop, root, iters, warmup, check)
    opts = dict(plan.as_dict(), min_bytes=min_bytes, max_bytes=max_bytes, factor=factor, check=check,
                gpu=bool(gpu), graphs=graphs)
    if json_path:
        json_path = os.path.abspath(json_path)
    if peer is not None and not gpu:
        try:
            peers.check_available(peer)
        except peers.PeerError as exc:
            click.echo(f"gpucoll-bench: {exc}", err=True)
            peer = None
    if nranks is not None and "GPUCOLL_RANK" not in os.environ:
        sys.exit(_launch(nranks, plan, opts, peer, json_path))
    sys.exit(_in_job(nranks, plan, opts, peer, json_path, rows_out))


# --- inside the job ------------------------------------------------------------------------------
def _in_job(nranks, plan, opts, peer, json_path, rows_out):
    if opts["gpu"]:
        from . import gpu as _gpu

        backend = _gpu.GpucollGpuBackend(graphs=opts["graphs"])
    else:
        backend = runner.GpucollBackend()
    if nranks is not None and nranks != backend.size:
        raise click.UsageError(f"-np {nranks} was given, but this job has {backend.size} ranks; "
                               "drop -np inside a job")
    if plan.root >= backend.size:
        raise click.UsageError(f"-r {plan.root} is not a rank of this {backend.size}-rank job")
    info = backend.ranks_info()
    stream = rows_out is None and peer is None
    printer = _Printer(opts, backend.size, info) if stream and backend.rank == 0 else None
    records = runner.measure(backend, plan, on_row=printer.row if printer else None)
    backend.barrier()
    if printer:
        printer.close(records)
    if peer in peers.GPU_PEERS:  # measured in this job, by every rank
        peer_records = _measure_gpu_peer(peer, plan, opts)
        if backend.rank == 0:
            _print_all(opts, backend.size, info, records, peer, peer_records, label=_gpu.peer_label(peer))
            _write_json(json_path, records, peer, peer_records)
        return _status(records)
    if backend.rank != 0:
        return _status(records)
    if rows_out:
        with open(rows_out, "w") as f:
            json.dump({"ranks": info, "records": records}, f)
        return _status(records)
    peer_records = _measure_peer(peer, backend.size, plan) if peer else None
    if peer:
        _print_all(opts, backend.size, info, records, peer, peer_records)
    _write_json(json_path, records, peer, peer_records)
    return _status(records)


class _Printer:
    """Rank 0's table, printed row by row as the rows complete."""

    def __init__(self, opts, nranks, info):
        self.multi = len(opts["collectives"]) > 1
        self.current = None
        click.echo(table.preamble(opts, nranks, info))

    def row(self, record):
        if record["collective"] != self.current:
            self.current = record["collective"]
            click.echo("#" + (f"\n# {self.current}" if self.multi else ""))
            click.echo(table.header())
        click.echo(table.row(record))
        sys.stdout.flush()

    def close(self, records):
        click.echo(table.footer(records))


# --- outside a job: start one ----------------------------------------------------------------
def _launch(nranks, plan, opts, peer, json_path):
    """Run this command as nranks ranks under gpurun; with a peer, collect both and print here."""
    argv = [sys.executable, "-m", "gpucoll.launcher", "-np", str(nranks), "--no-tag-output",
            "-m", "gpucoll.bench"] + _plan_args(plan, opts)
    if opts["gpu"]:  # GPU peers run inside the job; rank 0 prints everything
        argv += ["-G", str(opts["graphs"])] + (["--vs", peer] if peer else []) + (["--json", json_path] if json_path else [])
        return subprocess.call(argv)
    if peer is None:
        if json_path:
            argv += ["--json", json_path]
        return subprocess.call(argv)
    fd, rows = tempfile.mkstemp(prefix="gpucoll-bench-", suffix=".json")
    os.close(fd)
    try:
        click.echo(f"# measuring gpucoll on {nranks} ranks ...", err=True)
        code = subprocess.call(argv + ["--rows-out", rows])
        if code != 0:
            return code
        with open(rows) as f:
            ours = json.load(f)
    finally:
        os.unlink(rows)
    peer_records = _measure_peer(peer, nranks, plan)
    _print_all(opts, nranks, ours["ranks"], ours["records"], peer, peer_records)
    _write_json(json_path, ours["records"], peer, peer_records)
    return _status(ours["records"])


def _plan_args(plan, opts):
    return ["-o", plan.collectives[0] if len(plan.collectives) == 1 else "all",
            "-b", str(opts["min_bytes"]), "-e", str(opts["max_bytes"]), "-f", str(opts["factor"]),
            "-n", str(plan.iters), "-w", str(plan.warmup), "-c", str(int(plan.check)), "-d", plan.dtype,
            "-r", str(plan.root), "--op", plan.redop, "--gpu" if opts.get("gpu") else "--no-gpu"]


# --- the peer and the combined table -------------------------------------------------------------
def _measure_gpu_peer(peer, plan, opts):
    """Every rank: the GPU peer's records, measured in this job (empty when it cannot start)."""
    from . import gpu as _gpu

    try:
        backend = _gpu.PEERS[peer](graphs=opts["graphs"])
    except Exception as exc:  # not installed, or its set-up failed: gpucoll's table alone
        click.echo(f"gpucoll-bench: --vs {peer} could not start: {type(exc).__name__}: {exc}", err=True)
        return []
    records = runner.measure(backend, plan)
    backend.barrier()
    if hasattr(backend, "close"):
        backend.close()
    return records


def _measure_peer(peer, nranks, plan):
    click.echo(f"# measuring {peer} on {nranks} ranks ...", err=True)
    try:
        return peers.run_peer(peer, nranks, plan)
    except peers.PeerError as exc:
        click.echo(f"gpucoll-bench: {exc}", err=True)
        return []


def merge(records, peer, peer_records):
    """Our records with the peer's columns (None where the peer has no such row)."""
    by_key = {(p["collective"], p["size"]): p for p in peer_records or []}
    out = []
    for r in records:
        p = by_key.get((r["collective"], r["size"])) if peer else None
        t = p.get("time_us") if p else None
        out.append(dict(r, peer=peer, peer_time_us=t, peer_algbw=p.get("algbw") if p else None,
                        peer_busbw=p.get("busbw") if p else None, peer_wrong=p.get("wrong") if p else None,
                        ratio=(t / r["time_us"]) if t and r.get("time_us") else None))
    return out


def _print_all(opts, nranks, info, records, peer, peer_records, label=None):
    rows = merge(records, peer, peer_records)
    click.echo(table.preamble(opts, nranks, info, label or peers.label(peer)))
    multi = len(opts["collectives"]) > 1
    current = None
    for r in rows:
        if r["collective"] != current:
            current = r["collective"]
            click.echo("#" + (f"\n# {current}" if multi else ""))
            click.echo(table.header(peer))
        click.echo(table.row(r))
    click.echo(table.footer(rows))


def _write_json(path, records, peer, peer_records):
    if path:
        with open(path, "w") as f:
            json.dump(merge(records, peer, peer_records), f, indent=1)
            f.write("\n")


def _status(records):
    return 1 if any(r.get("wrong", 0) > 0 for r in records) else 0
