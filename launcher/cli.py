"""`gpurun`: the command line. Parsing only; the work is in job.py."""
import click

from gpucoll import __version__

DEFAULT_GRACE_S = 3.0

HELP = """Run PROGRAM as N ranks of one gpucoll job on this host.

\b
PROGRAM is a Python script (run with the interpreter that runs gpurun),
`-m MODULE`, or any executable (`python -c ...`, `hostname`, ...).
Options go before PROGRAM; everything after it is PROGRAM's own.

\b
  gpurun -np 4 train.py --epochs 3
  gpurun -np 8 -m mypkg.bench
  gpurun -np 2 --output-dir logs -x OMP_NUM_THREADS=1 hostname

\b
Each rank runs in its own process group. gpurun hosts the job's rendezvous
store (free port, per-job secret) and gives each rank:
  GPUCOLL_RANK, GPUCOLL_SIZE, GPUCOLL_LOCAL_RANK, GPUCOLL_LOCAL_SIZE,
  GPUCOLL_STORE (host:port), GPUCOLL_STORE_SECRET (hex), GPUCOLL_JOB_ID,
  GPUCOLL_DEVICE=k for local rank k when GPUs exist (modulo their count;
  CUDA_VISIBLE_DEVICES is not changed, so CUDA IPC works), PYTHONUNBUFFERED=1,
  and torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
  MASTER_PORT. MASTER_ADDR:MASTER_PORT is gpucoll's store, not a torch
  TCPStore: torch.distributed's env:// rendezvous cannot use it.

\b
Output: every line of a rank's stdout (stderr) goes to gpurun's stdout
(stderr) as one whole line, prefixed with "[rank] ". Rank 0 reads gpurun's
stdin; the other ranks read /dev/null.

\b
Signals: SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 are forwarded to every
rank's process group. After SIGINT, SIGTERM or SIGHUP gpurun ends the job:
ranks still alive --grace seconds later get SIGKILL (a second signal kills
at once).

\b
Fail-fast: when a rank exits non-zero or is killed by a signal, gpurun sends
SIGTERM to every rank's process group, SIGKILL after --grace seconds, and
reports the rank that failed first: host, exit code or signal, and the last
20 lines of its stderr (the traceback). Ranks that exit 0 early are fine.
Processes that ranks leave behind are ended when the job ends.

\b
Exit code:
  0       every rank exited 0
  N       the first rank to fail exited with code N
  128+S   the first rank to fail was killed by signal S (SIGKILL: 137)
  124     --timeout expired (the ranks still running are named)
  130/143/129  gpurun got SIGINT / SIGTERM / SIGHUP
  126/127 PROGRAM could not be run / was not found
  2       bad command line
"""


@click.command(help=HELP, context_settings={
    "allow_interspersed_args": False,
    "help_option_names": ["-h", "--help"],
    "max_content_width": 100,
})
@click.option("-np", "-n", "--np", "nprocs", type=click.IntRange(min=1), required=True,
              metavar="N", help="Number of ranks to start.")
@click.option("-m", "--module", "module", is_flag=True,
              help="PROGRAM is a Python module, run as `python -m PROGRAM` (as with python, "
                   "everything after it is the module's).")
@click.option("--tag-output/--no-tag-output", default=True, show_default=True,
              help="Prefix each line with \"[rank] \".")
@click.option("--output-dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Also write each rank's raw output to DIR/rank.N.out and DIR/rank.N.err.")
@click.option("--timeout", type=click.FloatRange(min=0), metavar="S",
              help="End the job after S seconds (exit code 124); 0 or unset: no limit.")
@click.option("--grace", type=click.FloatRange(min=0), default=DEFAULT_GRACE_S, show_default=True,
              metavar="S", help="Seconds between SIGTERM (or a forwarded SIGINT) and SIGKILL.")
@click.option("-x", "exports", multiple=True, metavar="VAR[=VAL]",
              help="-x VAR passes gpurun's VAR on; -x VAR=VAL sets it. Repeatable; wins over "
                   "the variables above.")
@click.version_option(__version__, "-V", "--version", prog_name="gpurun")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="PROGRAM [ARGS]...")
def gpurun(nprocs, module, tag_output, output_dir, timeout, grace, exports, command):
    import os

    from .env import parse_exports
    from .job import Options, launch

    if not command:
        raise click.UsageError("PROGRAM is missing")
    try:
        exported = parse_exports(exports, os.environ)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="-x") from None
    if module:
        # `-m` is a flag, so that the module's own options are never parsed as gpurun's.
        module, command = command[0], command[1:]
    opts = Options(nprocs, command, module=module or None, tag_output=tag_output, output_dir=output_dir,
                   timeout=timeout, grace=grace, exports=exported)
    raise SystemExit(launch(opts))


def main(argv=None):
    """Console-script entry point."""
    return gpurun.main(args=argv, prog_name="gpurun")
