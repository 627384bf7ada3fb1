"""`gpurun`: the command line. Parsing only; the work is in job.py."""
import click

from gpucoll import __version__

from .binding import CHOICES as BIND_CHOICES

DEFAULT_GRACE_S = 3.0

HELP = """Run PROGRAM as N ranks of one gpucoll job on this host, or across hosts.

\b
PROGRAM is a Python script (run with the interpreter that runs gpurun),
`-m MODULE`, or any executable (`python -c ...`, `hostname`, ...).
Options go before PROGRAM; everything after it is PROGRAM's own. A file
without the execute bit runs with Python only if it is Python; a shell
script without it is refused (exit 126: chmod +x, or `gpurun ... bash X`).

\b
  gpurun -np 4 train.py --epochs 3
  gpurun -np 8 -m mypkg.bench
  gpurun -np 2 --output-dir logs -x OMP_NUM_THREADS=1 hostname

\b
Across hosts: one agent per host starts that host's ranks (host order, then
local rank) and relays their tagged output; a host whose agent is lost ends
the job (exit 125, naming the host).
  gpurun --hosts node1:4,node2:4 train.py          (agents over ssh)
  gpurun --hostfile hosts.txt --launcher-cmd 'ssh -p 2222 {host}' train.py
  gpurun -np 16 train.py                           (inside salloc/sbatch: srun)
  gpurun --nnodes 2 --node-rank K --master node1:29400 -np 4 train.py
                                                   (by hand, on every host)

\b
Each rank runs in its own process group. gpurun hosts the job's rendezvous
store (free port, per-job secret) and gives each rank:
  GPUCOLL_RANK, GPUCOLL_SIZE, GPUCOLL_LOCAL_RANK, GPUCOLL_LOCAL_SIZE,
  GPUCOLL_STORE (host:port), GPUCOLL_STORE_SECRET (hex), GPUCOLL_JOB_ID,
  PYTHONUNBUFFERED=1 (no GPU is assigned: collectives run on the GPU of the
  rank's buffers; CUDA_VISIBLE_DEVICES is not changed, so CUDA IPC works),
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
at once). If gpurun is killed outright (SIGKILL), the kernel kills its ranks.

\b
Fail-fast: when a rank exits non-zero or is killed by a signal, gpurun sends
SIGTERM to every rank's process group, SIGKILL after --grace seconds, and
reports the rank that failed first: host, exit code or signal, and its
traceback without the frames inside gpucoll (else the last 20 lines of its
stderr). Ranks that exit 0 early are fine.
Processes that ranks leave behind are ended when the job ends.

\b
Exit code:
  0       every rank exited 0
  N       the first rank to fail exited with code N
  128+S   the first rank to fail was killed by signal S (SIGKILL: 137)
  124     --timeout expired (the ranks still running are named)
  125     gpurun could not set the job up (no free port for its store),
          a host was lost (its agent's connection dropped), or its agent
          could not start
  130/143/129  gpurun got SIGINT / SIGTERM / SIGHUP
  126/127 PROGRAM could not be run / was not found (nor its #! interpreter)
  2       bad command line (also an --output-dir that cannot be created)
"""


class RankCount(click.ParamType):
    """A number of ranks, >= 1. Written `-np4`, it reaches click as -n with "p4": read as 4."""

    name = "N"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        text = str(value).strip()
        digits = text[1:] if text.startswith("p") else text
        if not digits.isdigit() or int(digits) < 1:
            shown = f"-n{text}" if text.startswith("p") else repr(value)
            self.fail(f"{shown} is not a number of ranks: give a whole number >= 1, as in -np 4", param, ctx)
        return int(digits)


RANK_COUNT = RankCount()


@click.command(help=HELP, context_settings={
    "allow_interspersed_args": False,
    "help_option_names": ["-h", "--help"],
    "max_content_width": 100,
})
@click.option("-np", "-n", "--np", "nprocs", type=RANK_COUNT, metavar="N",
              help="Number of ranks to start, also written -np4 (with --hosts/--hostfile: default every slot; "
                   "with --nnodes: ranks on this host).")
@click.option("--hosts", metavar="H1:N,H2:N", help="Run across these hosts, N ranks on each (host order, "
              "then local rank); one agent per host.")
@click.option("--hostfile", type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="Hosts one a line: HOST, HOST:N or 'HOST slots=N'.")
@click.option("--launcher", type=click.Choice(["ssh", "local", "srun"]), metavar="ssh|local|srun",
              help="How the agents start: ssh (default with --hosts), srun (default inside a Slurm "
                   "allocation), local (on this machine, through --launcher-cmd if given).")
@click.option("--launcher-cmd", metavar="TEMPLATE", help="Command that runs an agent on {host}, e.g. "
              "'ssh -p 2222 {host}' or 'ip netns exec {host}'.")
@click.option("--nnodes", type=click.IntRange(min=1), metavar="N",
              help="Started by hand on each of N hosts (with --node-rank and --master).")
@click.option("--node-rank", type=click.IntRange(min=0), default=0, show_default=True, metavar="K",
              help="This host's index with --nnodes; node 0 is the head.")
@click.option("--master", metavar="ADDR:PORT", help="With --nnodes: where node 0 listens for the others.")
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
@click.option("--bind-to", "bind_to", type=click.Choice(BIND_CHOICES), metavar="|".join(BIND_CHOICES),
              help="Bind each rank of a host to an equal share of whole physical cores (share), to one CPU "
                   "(core: physical cores first), to a NUMA node's CPUs (numa), or not at all (none), within "
                   "gpurun's own CPU mask. Default: share when the host's ranks are no more than its cores, "
                   "core when no more than its CPUs, else none; none when srun or mpirun started gpurun.")
@click.option("--preload", "preload", multiple=True, metavar="MOD[,MOD]",
              help="Also import these modules in gpurun before forking the ranks of a Python program "
                   "(NumPy and gpucoll always are). Repeatable. A module that starts a thread or "
                   "initialises CUDA at import makes the job start its ranks anew.")
@click.option("--no-preload", is_flag=True, help="Start every rank as a new interpreter instead of forking "
              "it from gpurun's, which has NumPy and gpucoll imported.")
@click.option("--universe-size", type=click.IntRange(min=1), metavar="N",
              help="Processes that may run at once, those MPI's Spawn starts included; when given, also "
                   "MPI.UNIVERSE_SIZE (else the number of ranks). Default: -np, or 8 a CPU (at least 64) when "
                   "that is more.")
@click.option("--on-failure", "on_failure", type=click.Choice(["end", "continue"]), default="end",
              show_default=True, metavar="end|continue",
              help="What a rank that fails does to the job: end it (stop every rank, report the failure), or "
                   "continue: the others go on, can revoke, shrink and agree (docs/fault-tolerance.md); gpurun then "
                   "exits 0 if any rank ended well. One host only.")
@click.option("--respawn", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="Start a replacement for a failed rank, at most N in all (implies --on-failure=continue): it "
                   "runs the program again and joins the survivors' grow() (docs/fault-tolerance.md).")
@click.option("-v", "--verbose", is_flag=True, help="Say on stderr how the ranks were bound and started, or why "
              "not.")
@click.version_option(__version__, "-V", "--version", prog_name="gpurun")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="PROGRAM [ARGS]...")
def gpurun(nprocs, module, tag_output, output_dir, timeout, grace, exports, command, hosts, hostfile,
           launcher, launcher_cmd, nnodes, node_rank, master, bind_to, preload, no_preload, universe_size,
           on_failure, respawn, verbose):
    import os

    from .env import parse_exports
    from .job import Options, launch

    if not command:
        raise click.UsageError("PROGRAM is missing")
    multi = _multihost(nprocs, hosts, hostfile, launcher, launcher_cmd, nnodes, node_rank, master, os.environ)
    try:
        exported = parse_exports(exports, os.environ)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="-x") from None
    if no_preload and preload:
        raise click.UsageError("--preload and --no-preload exclude each other")
    preload = False if no_preload else [m.strip() for item in preload for m in item.split(",") if m.strip()]
    if module:
        # `-m` is a flag, so that the module's own options are never parsed as gpurun's.
        module, command = command[0], command[1:]
    opts = Options(nprocs, command, module=module or None, tag_output=tag_output, output_dir=output_dir,
                   timeout=timeout, grace=grace, exports=exported, bind_to=bind_to, verbose=verbose,
                   preload=preload, universe_size=universe_size,
                   on_failure="continue" if respawn else on_failure, respawn=respawn)
    if multi is None:
        raise SystemExit(launch(opts))
    if opts.respawn:
        raise click.UsageError("--respawn runs on one host (leave out --hosts, --hostfile and --nnodes); "
                               "--on-failure=continue works across hosts")
    if multi.launcher == "agent":
        from .agent import run_agent
        from .wire import job_secret

        try:
            secret = job_secret(master)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        raise SystemExit(run_agent(master, node_rank, secret, slots=nprocs or 1))
    from .cluster import launch_hosts

    raise SystemExit(launch_hosts(opts, multi))


def _multihost(nprocs, hosts, hostfile, launcher, launcher_cmd, nnodes, node_rank, master, environ):
    """The HostsOptions of a multi-host job, or None for a job on this host alone."""
    from . import hosts as hostsmod
    from .cluster import HostsOptions

    if nnodes is not None:
        if hosts or hostfile:
            raise click.UsageError("--nnodes starts gpurun by hand on each host: leave out --hosts/--hostfile")
        if not master:
            raise click.UsageError("--nnodes needs --master ADDR:PORT (where node 0 listens)")
        if node_rank >= nnodes:
            raise click.BadParameter(f"{node_rank} is not below --nnodes {nnodes}", param_hint="--node-rank")
        kind = "manual" if node_rank == 0 else "agent"
        return HostsOptions(None, kind, master=master, nnodes=nnodes, node_rank=node_rank)
    if hosts and hostfile:
        raise click.UsageError("give --hosts or --hostfile, not both")
    try:
        if hosts:
            plan = hostsmod.parse_hosts(hosts)
        elif hostfile:
            plan = hostsmod.parse_hostfile(hostfile)
        elif launcher == "srun" or (launcher is None and hostsmod.in_slurm_allocation(environ)):
            plan = hostsmod.from_slurm(environ, nprocs)
            launcher = "srun"
        else:
            if launcher is not None:
                raise click.UsageError(f"--launcher {launcher} needs --hosts or --hostfile")
            if nprocs is None:
                raise click.UsageError("Missing option '-np' (or --hosts / --hostfile)")
            return None
        hostsmod.assign(plan, nprocs)
    except (ValueError, OSError) as exc:
        raise click.UsageError(str(exc)) from None
    return HostsOptions(plan, launcher or "ssh", launcher_cmd)


def main(argv=None):
    """Console-script entry point."""
    return gpurun.main(args=argv, prog_name="gpurun")
