"""`gpucoll-bench`: nccl-tests' tables for gpucoll's collectives, optionally beside a peer.

    gpucoll-bench -np 4 -o allreduce -b 8 -e 64M -f 2 --vs mpi --repeats 3 --json out.json

Outside a job, `-np N` starts N ranks of this command under gpurun; inside a job
(GPUCOLL_RANK set by gpurun, or started by mpiexec/srun without -np) every rank measures
directly. Rank 0 prints the table; with --vs the peer runs the same plan, and the table
gains its time, busbw, #wrong and the ratio peer time / gpucoll time (above 1: gpucoll is
faster; none on a wrong row). Host peers (mpi, gloo) run in a job of their own after
gpucoll's. --repeats R runs the whole sweep R times (gpucoll and the peer alternating) and
prints each row's median with its range (gpucoll.bench.summary).

The exit status is 1 when any element came out wrong, gpucoll's or the peer's, or when the
peer asked for could not be measured. --json writes the settings (command, plan,
environment, versions, machine), every run's records and the summary rows.

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

from ..base import config
from . import context, peers, runner, summary, table
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
              help="1: check the output of the timed calls on every rank and count the wrong elements.")
@click.option("-d", "--datatype", "dtype", default="float32", show_default=True, callback=_dtype,
              help=f"Element type: {', '.join(runner.DTYPES)}.")
@click.option("-r", "--root", "root", type=click.IntRange(min=0), default=0, show_default=True,
              help="Root rank of bcast and reduce.")
@click.option("--op", "redop", type=click.Choice(runner.REDOPS), default="sum", show_default=True,
              help="Reduction of allreduce, reduce_scatter and reduce.")
@click.option("--vs", "peer", type=click.Choice(peers.ALL), default=None,
              help="Also measure the same sizes with mpi (Open MPI via mpi4py) or gloo (torch); "
                   "nccl and torch need GPU buffers.")
@click.option("--repeats", "repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run the whole sweep this many times (gpucoll and the peer alternating) and print each "
                   "row's median and range.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the settings, every run's records and the summary rows to this file.")
@click.option("-G", "--cudagraph", "graphs", type=click.IntRange(min=0), default=0, show_default=True,
              help="Capture N calls in one CUDA graph and time its replays, for gpucoll and the peer "
                   "(GPU buffers only).")
@click.option("--group", "group", type=click.IntRange(min=0), default=0, show_default=True,
              help="Issue K calls in one group (gpucoll's `with comm.group()`, NCCL's groupStart/groupEnd) "
                   "and report the time per call (GPU buffers only).")
@click.option("-g/-H", "--gpu/--no-gpu", "gpu", default=None,
              help="GPU buffers (CuPy arrays; the default where CuPy and a GPU are present) or host buffers.")
@click.option("--rows-out", "rows_out", default=None, hidden=True,
              help="Rank 0 writes the records here and prints nothing (used when gpucoll-bench starts itself).")
@click.option("--test-call-op", "call_redop", type=click.Choice(runner.REDOPS), default=None, hidden=True,
              help="Tests only: the calls reduce with this op while the check expects --op (every reduced "
                   "row must then be counted wrong, for gpucoll and the peer).")
@click.option("--command", "command", default=None, hidden=True,
              help="The command the user typed (passed on when gpucoll-bench starts itself), for the JSON.")
def main(nranks, collective, min_bytes, max_bytes, factor, iters, warmup, check, dtype, root, redop, peer,
         repeats, json_path, graphs, group, gpu, rows_out, call_redop, command):
    """Measure gpucoll's collectives and print nccl-tests' table
    (size, count, type, redop, root, time, algbw, busbw, #wrong).

    \b
      gpucoll-bench -np 4 -b 8 -e 64M -f 2                 allreduce, 8 B to 64 MiB
      gpucoll-bench -np 2 -o all -b 1K -e 1M -f 4 -c 1    every collective, checked
      gpucoll-bench -np 4 -b 1M -e 64M --vs mpi            beside Open MPI, with the ratio
      gpurun -np 4 gpucoll-bench -b 8 -e 1M                inside a job: every rank measures
      gpucoll-bench -np 2 -b 8 -e 512M -f 4 --vs nccl      GPU buffers beside NCCL
      gpucoll-bench -np 2 -b 8 -e 64K -f 8 -G 100 --vs nccl   CUDA graphs of 100 calls
      gpucoll-bench -np 2 -b 4K -e 64K -f 16 --group 100 --vs nccl   groups of 100 calls
    """
    from . import gpu as _gpu

    if gpu is None:
        gpu = _gpu.available()
    elif gpu and not _gpu.available():
        raise click.UsageError("--gpu needs a GPU and CuPy; none is usable here (run with --no-gpu)")
    if gpu:
        _gpu.multicast_off()
    if not gpu and graphs:
        raise click.UsageError("-G (CUDA graph launches) needs a GPU: gpucoll-bench measures host buffers "
                               "here; run without -G")
    if group and (not gpu or graphs):
        raise click.UsageError("--group measures groups of GPU calls: it needs GPU buffers and goes without -G")
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
    plan = runner.Plan(collectives, sizes, dtype, redop, root, iters, warmup, check, call_redop=call_redop)
    opts = dict(plan.as_dict(), min_bytes=min_bytes, max_bytes=max_bytes, factor=factor, check=check,
                gpu=bool(gpu), graphs=graphs, group=group, repeats=repeats,
                command=command or " ".join(["gpucoll-bench"] + sys.argv[1:]))
    if json_path:
        json_path = os.path.abspath(json_path)
    if peer is not None and not gpu:
        try:
            peers.check_available(peer)
        except peers.PeerError as exc:  # asked for, so not silently left out
            raise click.UsageError(str(exc)) from None
    if nranks is not None and not config.RANK.is_set():
        sys.exit(_launch(nranks, plan, opts, peer, json_path))
    sys.exit(_in_job(nranks, plan, opts, peer, json_path, rows_out))


# --- inside the job ------------------------------------------------------------------------------
def _in_job(nranks, plan, opts, peer, json_path, rows_out):
    if opts["gpu"]:
        from . import gpu as _gpu

        backend = _gpu.GpucollGpuBackend(graphs=opts["graphs"], group=opts["group"])
    else:
        backend = runner.GpucollBackend()
    if nranks is not None and nranks != backend.size:
        raise click.UsageError(f"-np {nranks} was given, but this job has {backend.size} ranks; "
                               "drop -np inside a job")
    if plan.root >= backend.size:
        raise click.UsageError(f"-r {plan.root} is not a rank of this {backend.size}-rank job")
    info = backend.ranks_info()
    repeats = opts["repeats"]
    if peer in peers.GPU_PEERS:  # measured in this job by every rank, alternating with gpucoll
        return _in_job_gpu_peer(backend, plan, opts, peer, json_path, info)
    stream = rows_out is None and peer is None and repeats == 1
    printer = _Printer(opts, backend.size, info) if stream and backend.rank == 0 else None
    runs = []
    for _ in range(repeats):
        runs.append({"gpucoll": runner.measure(backend, plan, on_row=printer.row if printer else None)})
        backend.barrier()
    if backend.rank != 0:
        return 0  # rank 0 reports and exits 1 on a wrong result (gpurun would stop it first)
    if rows_out:  # the launcher reports and decides the exit status
        with open(rows_out, "w") as f:
            json.dump({"ranks": info, "records": runs[0]["gpucoll"]}, f)
        return 0
    report = Report(opts, backend.size, info, peer)
    if peer:  # a host peer's job, started from rank 0 after gpucoll's runs
        for run in runs:
            run["peer"] = report.measure_host_peer(plan)
    if printer:
        printer.close(runs[0]["gpucoll"])
        return report.finish(runs, json_path, printed=True)
    return report.finish(runs, json_path)


def _in_job_gpu_peer(backend, plan, opts, peer, json_path, info):
    from . import gpu as _gpu

    report = Report(opts, backend.size, info, peer, label=_gpu.peer_label(peer))
    try:
        peer_backend = _gpu.PEERS[peer](graphs=opts["graphs"], group=opts["group"])
    except Exception as exc:  # not installed, or its set-up failed: gpucoll's table, and exit 1
        report.peer_error = f"--vs {peer} could not start: {type(exc).__name__}: {exc}"
        peer_backend = None
    runs = []
    for _ in range(opts["repeats"]):
        run = {"gpucoll": runner.measure(backend, plan)}
        backend.barrier()
        if peer_backend is not None:
            run["peer"] = runner.measure(peer_backend, plan)
            peer_backend.barrier()
        runs.append(run)
    if peer_backend is not None and hasattr(peer_backend, "close"):
        peer_backend.close()
    if backend.rank != 0:
        return 0
    return report.finish(runs, json_path)


class _Printer:
    """Rank 0's table of a single run without a peer, printed row by row as the rows complete."""

    def __init__(self, opts, nranks, info):
        self.multi = len(opts["collectives"]) > 1
        self.current = None
        click.echo(table.preamble(opts, nranks, info, settings=settings_shown(opts)))

    def row(self, record):
        if record["collective"] != self.current:
            self.current = record["collective"]
            click.echo("#" + (f"\n# {self.current}" if self.multi else ""))
            click.echo(table.header())
        click.echo(table.row(record))
        sys.stdout.flush()

    def close(self, records):
        click.echo(table.footer(records))


# --- outside a job: start one per run ------------------------------------------------------------
def _launch(nranks, plan, opts, peer, json_path):
    """Run this command as nranks ranks under gpurun; with a peer or repeats, run the gpucoll
    job and the peer's job in turn, and print the summary here."""
    argv = [sys.executable, "-m", "gpucoll.launcher", "-np", str(nranks), "--no-tag-output",
            "-m", "gpucoll.bench"] + _plan_args(plan, opts)
    if opts["gpu"]:  # GPU peers run inside the job; rank 0 prints everything
        argv += ["-G", str(opts["graphs"]), "--group", str(opts["group"]), "--repeats", str(opts["repeats"])]
        argv += (["--vs", peer] if peer else []) + (["--json", json_path] if json_path else [])
        return subprocess.call(argv)
    if peer is None and opts["repeats"] == 1:
        return subprocess.call(argv + (["--json", json_path] if json_path else []))
    report = Report(opts, nranks, None, peer)
    runs = []
    fd, rows = tempfile.mkstemp(prefix="gpucoll-bench-", suffix=".json")
    os.close(fd)
    try:
        for i in range(opts["repeats"]):
            click.echo(f"# run {i + 1}/{opts['repeats']}: gpucoll on {nranks} ranks ...", err=True)
            code = subprocess.call(argv + ["--rows-out", rows])
            if code != 0:
                click.echo(f"gpucoll-bench: the gpucoll job exited with {code}", err=True)
                return code
            with open(rows) as f:
                ours = json.load(f)
            report.info = ours["ranks"]
            run = {"gpucoll": ours["records"]}
            if peer:
                run["peer"] = report.measure_host_peer(plan)
            runs.append(run)
    finally:
        os.unlink(rows)
    return report.finish(runs, json_path)


def _plan_args(plan, opts):
    args = ["-o", plan.collectives[0] if len(plan.collectives) == 1 else "all",
            "-b", str(opts["min_bytes"]), "-e", str(opts["max_bytes"]), "-f", str(opts["factor"]),
            "-n", str(plan.iters), "-w", str(plan.warmup), "-c", str(int(plan.check)), "-d", plan.dtype,
            "-r", str(plan.root), "--op", plan.redop, "--gpu" if opts.get("gpu") else "--no-gpu"]
    if plan.call_redop != plan.redop:
        args += ["--test-call-op", plan.call_redop]
    return args + ["--command", opts["command"]]


# --- the summary, the JSON and the exit status ------------------------------------------------------
class Report:
    """Rank 0's (or the launcher's) end of a measurement: the peer's runs, the table of
    medians and ranges, the JSON, and the exit status."""

    def __init__(self, opts, nranks, info, peer, label=None):
        self.opts, self.nranks, self.info, self.peer = opts, nranks, info, peer
        self.label = label or (peers.label(peer) if peer else None)
        self.peer_error = None
        self.peer_library = None

    def measure_host_peer(self, plan):
        """One run of the host peer's job; [] (and peer_error set) when it fails."""
        click.echo(f"# measuring {self.peer} on {self.nranks} ranks ...", err=True)
        try:
            records, self.peer_library = peers.run_peer(self.peer, self.nranks, plan)
            return records
        except peers.PeerError as exc:
            self.peer_error = str(exc)
            click.echo(f"gpucoll-bench: {exc}", err=True)
            return []

    def finish(self, runs, json_path, printed=False):
        rows = summary.summarize(runs, self.peer)
        ranged = self.opts["repeats"] > 1
        if not printed:
            label = self.label + (f" (library: {self.peer_library})" if self.peer_library else "") if self.peer else None
            click.echo(table.preamble(self.opts, self.nranks, self.info or [], label, settings_shown(self.opts)))
            current = None
            for r in rows:
                if r["collective"] != current:
                    current = r["collective"]
                    click.echo("#" + (f"\n# {current}" if len(self.opts["collectives"]) > 1 else ""))
                    click.echo(table.header(self.peer, ranged))
                click.echo(table.row(r, ranged))
            click.echo(table.footer(rows, self.peer))
        if self.peer_error:
            click.echo(f"# {self.peer} could not be measured: {self.peer_error.splitlines()[0]}")
        if json_path:
            with open(json_path, "w") as f:
                json.dump(dict(settings=self.settings(), ranks=self.info, rows=rows, runs=runs), f, indent=1)
                f.write("\n")
        return 1 if self.peer_error else summary.status(runs)

    def settings(self):
        """Everything that decides what was measured, for the JSON."""
        return context.describe(command=self.opts["command"], nranks=self.nranks, opts=self.opts, peer=self.peer,
                                peer_label=self.label, peer_library=self.peer_library, peer_error=self.peer_error)


def settings_shown(opts):
    """The environment settings for the preamble: gpucoll's, and on GPU the peers' (NVLink
    multicast off: NCCL_NVLS_ENABLE=0 and its torch / NVSHMEM twins)."""
    env = context.environment()
    keep = ("GPUCOLL_",) + (("NCCL_", "TORCH_", "NVSHMEM_", "CUDA_") if opts.get("gpu") else ("OMPI_", "GLOO_"))
    return {k: v for k, v in env.items() if k.startswith(keep) and not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}

