"""Run a job: host the store, start the ranks, watch them, stop them, report.

One thread does everything: a selector waits on every rank's stdout and stderr pipe and
on the signal wakeup pipe (SIGCHLD included), with a timeout set by the next deadline
(--timeout, the end of the --grace period, the end of draining). Nothing polls, so 32
idle ranks cost gpurun no CPU, and a failure is seen the moment its SIGCHLD arrives.

Stopping (after the first failure, --timeout, a leftover process or SIGINT/SIGTERM/SIGHUP)
sends SIGTERM to each rank's process group (the forwarded signal itself when gpurun got
one), SIGKILL to those still alive --grace seconds later, reaps everything, and returns
gpurun's exit code (policy in report.py).
"""
import os
import secrets
import selectors
import signal
import socket
import time

from gpucoll.base import stacks

from . import binding
from . import env as envmod
from . import report, warm
from .output import RankStream, Sink, make_output_dir, open_output_file
from .signals import ENDING, FORWARDED, STACKS, SignalInbox
from .spawn import LaunchError, become_subreaper, kill_orphans, program_argv, reap_orphans, start_rank
from .spawn_service import SpawnService
from .spawn_zygote import Zygote

# After the ranks are gone, how long a pipe that some escaped process holds open may
# delay the end of the job.
DRAIN_S = 1.0
# Longest sleep of the loop: a safety net in case a wakeup is ever missed.
MAX_WAIT_S = 1.0
# When --timeout expires: how long the ranks have to write their stacks before they are stopped.
STACKS_S = 0.5


class Options:
    """What the command line asked for."""

    def __init__(self, nprocs, command, module=None, tag_output=True, output_dir=None,
                 timeout=None, grace=3.0, exports=(), bind_to=None, verbose=False, preload=None,
                 universe_size=None, on_failure="end", respawn=0):
        self.nprocs = nprocs
        self.command = list(command)
        self.module = module
        self.tag_output = tag_output
        self.output_dir = output_dir
        self.timeout = timeout or None
        self.grace = grace
        self.exports = dict(exports)
        self.bind_to = bind_to      # binding.CHOICES, or None: gpurun's default
        self.verbose = verbose
        self.preload = preload      # modules to preload besides the default; False: fork nothing (warm.py)
        # processes that may run at once, spawned ones included (MPI's Spawn: spawn_service.py)
        self.universe_size = universe_size or default_universe_size(nprocs)
        self.universe_size_given = universe_size  # MPI.UNIVERSE_SIZE where given, else COMM_WORLD's size
        self.on_failure = on_failure  # "end": a failed rank ends the job; "continue": the others go on
        self.respawn = respawn        # replacements gpurun may start for failed ranks (with "continue")


def default_universe_size(nprocs):
    """--universe-size's default: the ranks, or 8 processes a CPU (at least 64)."""
    return max(nprocs or 0, 8 * (os.cpu_count() or 1), 64)


def launch(opts):
    """Run the job that `opts` describes; return gpurun's exit code."""
    try:
        argv = program_argv(opts.command, opts.module)
        make_output_dir(opts.output_dir)
    except LaunchError as exc:
        Sink(2).write(f"gpurun: {exc}\n".encode())
        return exc.exit_code
    become_subreaper()
    inbox = SignalInbox()  # before any rank exists, so no signal or exit goes unseen
    store = None
    job = None
    job_id = None
    try:
        store, host, secret_hex = _open_store()
        job_id = secrets.token_hex(6)
        common = envmod.common_environ(
            os.environ, opts.nprocs, opts.nprocs, host, store.port, secret_hex, job_id, opts.on_failure)
        job = Job(opts, inbox)
        if opts.on_failure == "continue":
            from gpucoll.bootstrap import failures  # only under --on-failure=continue: gpurun starts sooner

            job.failures = failures.FailureBoard(store)
        cpus = rank_cpus(opts, opts.nprocs, "gpurun")
        envs = [envmod.rank_environ(common, r, r, opts.exports, binding.threads_per_rank(cpus[r], opts.nprocs))
                for r in range(opts.nprocs)]
        ready = warm_interpreter(opts, argv, envs[0], "gpurun")
        # Spawned processes are forked by a helper made now, while gpurun has one thread (spawn_zygote.py).
        job.serve_spawns(SpawnService(store, opts, common, Zygote(ready, inbox) if ready is not None else None))
        start = rank_starter(opts, argv, ready, inbox)
        # The ranks start while gpurun has one thread (see start_rank); the store serves
        # from its own thread once they are all started, answering those that came early.
        for r in range(opts.nprocs):
            job.add(start(r, envs[r], stdin_inherit=(r == 0), cpus=cpus[r]))
        store.start()
        return job.run()
    except LaunchError as exc:
        if job is not None:
            job.abort()
        Sink(2).write(f"gpurun: {exc}\n".encode())
        return exc.exit_code
    finally:
        if job is not None:
            job.close()
        if store is not None:
            store.close()
        inbox.close()
        if job_id is not None:
            remove_shared_memory(job_id, secret_hex)


def warm_interpreter(opts, argv, sample_env, who):
    """This interpreter warmed up to fork the ranks of argv (warm.WarmInterpreter), or None where
    a fork could be told from a fresh start. Under --verbose (or with --preload) `who` says which,
    and why."""
    say = (lambda text: Sink(2).write(f"{who}: {text}\n".encode())) if opts.verbose or opts.preload else None
    ready = warm.prepare(argv, opts.preload, sample_env, note=say)
    if ready is not None and opts.verbose:
        say(f"ranks forked from this interpreter, with {', '.join(ready.modules)} imported")
    return ready


def rank_starter(opts, argv, ready, inbox):
    """start(rank, env, stdin_inherit, cpus) -> Rank for this host's ranks: forked from `ready`
    (warm_interpreter's), else started anew."""
    if ready is None:
        return lambda r, env, stdin_inherit, cpus: start_rank(r, argv, env, stdin_inherit=stdin_inherit, cpus=cpus)
    return lambda r, env, stdin_inherit, cpus: ready.start(r, env, stdin_inherit=stdin_inherit, cpus=cpus, inbox=inbox)


def rank_cpus(opts, nlocal, who):
    """The CPUs of each of this host's `nlocal` ranks (binding.plan); under --verbose, `who`
    says in one line what was bound, or why not."""
    cpus, note = binding.plan(opts.bind_to, nlocal)
    if opts.verbose:
        if note is None and cpus and cpus[0] is not None:
            note = "local rank -> CPUs: " + ", ".join(f"{r} -> {binding.cpulist(c)}" for r, c in enumerate(cpus))
        Sink(2).write(f"{who}: {note or 'ranks not bound (--bind-to none)'}\n".encode())
    return cpus


def remove_shared_memory(job_id, secret_hex):
    """Shared-memory segments are unlinked as soon as every rank mapped them; a rank that
    died before that leaves a name under /dev/shm, which the end of the job removes (the
    names derive from the job's secret: gpucoll/transports/shm_segment.py)."""
    try:
        from gpucoll.transports.shm_segment import JobSegments
    except ImportError:  # the native extension is not built: no segment can exist either
        return
    JobSegments(job_id, bytes.fromhex(secret_hex)).unlink_all()


def _open_store():
    """Our rendezvous store on a free port of the loopback interface (all ranks are local),
    guarded by a fresh secret, listening but not serving yet (start() it). It lives in
    gpurun, so it outlives any rank."""
    secret_hex = secrets.token_hex(16)
    host = "127.0.0.1"
    return open_store(host, bytes.fromhex(secret_hex)), host, secret_hex


def open_store(host, secret):
    """A StoreServer listening on a free port of `host` (start() serves it). No port to be
    had is a LaunchError (exit 125) that says so, not a traceback."""
    from gpucoll.bootstrap.store_server import StoreServer  # lazily: keep `gpurun --help` quick
    from gpucoll.base.errors import StoreError

    try:
        return StoreServer(host=host, port=0, secret=secret).listen()
    except StoreError as exc:
        raise LaunchError(str(exc), report.EXIT_SETUP) from None


class Job:
    """The running ranks, their output streams and the stop/kill state machine."""

    def __init__(self, opts, inbox):
        self.opts = opts
        self.inbox = inbox
        self.host = socket.gethostname()
        self.ranks = []
        self.streams = []
        self.stdout = Sink(1)
        self.stderr = Sink(2)
        self.selector = selectors.DefaultSelector()
        self.selector.register(inbox.fileno(), selectors.EVENT_READ, None)
        self.first_failure = None      # the Rank that failed first
        self.stop_reason = None        # "failure", "timeout", "signal", "leftovers"
        self.stacks_at = None          # when --timeout asked the ranks for their stacks
        self.running_at_timeout = []   # the ranks still running then
        self.stop_signal = None        # the ending signal gpurun got
        self.still_running_at_stop = []
        self.term_at = None
        self.kill_at = None
        self.all_ended_at = None
        self.spawner = None            # the SpawnService, where processes may be spawned
        self.failures = None           # the FailureBoard, under --on-failure=continue
        self.tolerated = []            # the Ranks that failed while the job went on
        self.respawns_left = opts.respawn

    # --- starting -------------------------------------------------------------------
    def add(self, rank):
        """Take charge of a started rank and its two pipes."""
        self.ranks.append(rank)
        r = rank.rank
        prefix = f"[{r}] ".encode() if self.opts.tag_output else b""
        for name, pipe, sink, tail in (("out", rank.proc.stdout, self.stdout, 0),
                                       ("err", rank.proc.stderr, self.stderr, report.KEPT_LINES)):
            tee = None
            if self.opts.output_dir:
                tee = open_output_file(self.opts.output_dir, f"rank.{r}.{name}")
            stream = RankStream(r, name, pipe, sink, prefix, tee, keep_tail=tail)
            self.streams.append(stream)
            self.selector.register(stream.fd, selectors.EVENT_READ, stream)

    def serve_spawns(self, spawner):
        """Start the processes that MPI's Spawn asks `spawner` for, from this loop."""
        self.spawner = spawner
        self.selector.register(spawner.fileno(), selectors.EVENT_READ, spawner)

    def abort(self):
        """Kill what was started when starting the rest failed."""
        for rank in self.ranks:
            rank.signal_group(signal.SIGKILL)
        for rank in self.ranks:
            rank.proc.wait()
            rank.poll()

    # --- the loop -------------------------------------------------------------------
    def run(self):
        """Forward output and signals until every rank has ended; return the exit code."""
        start = time.monotonic()
        self.deadline = start + self.opts.timeout if self.opts.timeout else None
        while True:
            now = time.monotonic()
            events = self.selector.select(self._wait(now))
            child_event = not events
            for key, _ in events:
                if key.data is None:
                    child_event |= self._on_signals(self.inbox.take())
                elif key.data is self.spawner:
                    if self.stop_reason is None:
                        self.spawner.serve(self)
                elif not key.data.pump():
                    self.selector.unregister(key.fd)
            if child_event:
                self._reap()
            if self._advance(time.monotonic()):
                break
        return self._finish()

    def _wait(self, now):
        """Seconds until the next thing the loop must do by itself."""
        due = [now + MAX_WAIT_S]
        if self.deadline is not None and self.stop_reason is None:
            due.append(self.deadline if self.stacks_at is None else self.stacks_at + STACKS_S)
        if self.term_at is not None and self.kill_at is None:
            due.append(self.term_at + self.opts.grace)
        if self.all_ended_at is not None:
            due.append(self._drain_until())
        return max(0.0, min(due) - now)

    def _on_signals(self, signums):
        """Handle caught signals; True if a child may have ended."""
        child = False
        for signum in signums:
            if signum == signal.SIGCHLD:
                child = True
            elif signum in ENDING:
                if self.stop_reason is None:
                    self.stop_signal = signum
                    self._stop("signal", signum)
                else:
                    self._kill_all()  # already ending and asked again: no more waiting
            elif signum in STACKS:
                self._send_stacks_request()
            elif signum in FORWARDED:
                for rank in self.ranks:
                    if rank.running:
                        rank.signal_group(signum)
        return child

    def _reap(self):
        # Reap all first, so that ranks which ended together are not reported as stopped.
        ended = [rank for rank in self.ranks if rank.poll()]
        failed = [rank for rank in ended if rank.returncode != 0
                  and not (self.spawner is not None and self.spawner.ended_early(rank))
                  and not self._ended_by_stacks_request(rank)]
        if self.continues():
            self._record_ended_well([rank for rank in ended if rank not in failed])
        if failed and self.stop_reason is None and self.continues():
            self._tolerate(failed)
        elif failed and self.stop_reason is None:
            self.first_failure = failed[0]
            self._stop("failure")
        if self.all_ended_at is None and not any(r.running for r in self.ranks):
            self.all_ended_at = time.monotonic()
        if self.all_ended_at is not None:
            reap_orphans()

    def continues(self):
        """Whether the job goes on when a rank fails (--on-failure=continue)."""
        return self.failures is not None

    def _ended_by_stacks_request(self, rank):
        """A rank with no handler for the stacks signal (not Python, or not yet joined) ends by it:
        that is --timeout stopping it, not a failure."""
        signum = stacks.signal_number()
        return self.stacks_at is not None and signum is not None and rank.returncode == -signum

    def _record_ended_well(self, ended):
        """--on-failure=continue: a survivor that saw a process go reads whether it failed or ended
        well (a receive from ANY_SOURCE fails only for the first)."""
        for rank in ended:
            if rank.returncode == 0 and rank.rank not in self.failures.ended:
                self.failures.ended_well(rank.rank)

    def _tolerate(self, failed):
        """--on-failure=continue: record each failure in the store for the survivors, say so."""
        for rank in failed:
            if rank in self.tolerated:
                continue
            self.tolerated.append(rank)
            self.failures.record(rank.rank)
            self.stderr.write(f"gpurun: rank {rank.rank} (pid {rank.pid}) ended with {report.how_it_ended(rank.returncode)}; "
                              "the job goes on without it (--on-failure=continue)\n".encode())
            self._replace(rank)

    def _replace(self, rank):
        """Start a replacement for failed `rank` if --respawn allows one more; the survivors'
        grow() reads the answer either way. A process MPI's Spawn started is not replaced (the
        replacement runs the job's program)."""
        failed = rank.rank
        if self.spawner is not None and self.spawner.spawned(rank):
            self.failures.replaced(failed, None, "a process that MPI's Spawn started is not replaced")
            return
        if self.respawns_left <= 0 or self.spawner is None:
            self.failures.replaced(failed, None, f"gpurun --respawn {self.opts.respawn}: no replacement left"
                                   if self.opts.respawn else "gpurun was not given --respawn")
            return
        self.respawns_left -= 1
        try:
            w = self.spawner.replace(self, failed)
        except LaunchError as exc:
            self.failures.replaced(failed, None, f"the replacement could not start: {exc}")
            return
        self.failures.replaced(failed, w)
        self.stderr.write(f"gpurun: started rank {w} to replace rank {failed} (--respawn: {self.respawns_left} "
                          "left)\n".encode())

    def _stop(self, reason, signum=signal.SIGTERM):
        """Begin ending the job: `signum` to every group now, SIGKILL after --grace."""
        self.stop_reason = reason
        self.still_running_at_stop = [r.rank for r in self.ranks if r.running]
        self.term_at = time.monotonic()
        for rank in self.ranks:
            rank.signal_group(signum)

    def _kill_all(self):
        self.kill_at = time.monotonic()
        for rank in self.ranks:
            rank.signal_group(signal.SIGKILL)

    def _ask_for_stacks(self, now):
        """--timeout expired: the ranks still running write their threads' stacks (STACKS_S to do
        it) before they are stopped, so that the hang says where each rank was."""
        self.stacks_at = now
        running = [r for r in self.ranks if r.running]
        self.running_at_timeout = [r.rank for r in running]
        self.stderr.write(f"gpurun: timeout: the job ran longer than {self.opts.timeout:g} s; the stacks of the "
                          f"ranks still running ({', '.join(str(r.rank) for r in running)}) follow\n".encode())
        self._send_stacks_request()

    def _send_stacks_request(self):
        """The stacks signal to each running rank's own process (its children, which may have no
        handler, are left alone)."""
        for rank in self.ranks:
            if rank.running:
                try:
                    os.kill(rank.pid, stacks.signal_number())
                except (ProcessLookupError, PermissionError):
                    pass

    def _advance(self, now):
        """Act on deadlines; True once the job is over."""
        if self.deadline is not None and self.stop_reason is None and now >= self.deadline:
            if self.stacks_at is None and stacks.signal_number() is None:
                self.running_at_timeout = [r.rank for r in self.ranks if r.running]
                self.stacks_at = now - STACKS_S   # no real-time signals here: no stacks to wait for
            if self.stacks_at is None:
                self._ask_for_stacks(now)
            elif now >= self.stacks_at + STACKS_S or not any(r.running for r in self.ranks):
                running = self.running_at_timeout
                self._stop("timeout")
                self.still_running_at_stop = running  # the stacks request may have ended some
        if self.term_at is not None and self.kill_at is None and now >= self.term_at + self.opts.grace:
            self._kill_all()
        if self.all_ended_at is None:
            return False
        if self.kill_at is None and any(r.group_alive() for r in self.ranks):
            if self.stop_reason is None:
                # Every rank is done but something it started is still there: end it too.
                self._stop("leftovers")
            return False  # until they go, or --grace runs out
        if all(s.closed for s in self.streams):
            return True
        return now >= self._drain_until()

    def _drain_until(self):
        if self.term_at is not None and self.kill_at is None:
            return self.term_at + self.opts.grace + DRAIN_S
        return max(self.all_ended_at, self.kill_at or 0.0) + DRAIN_S

    # --- the end --------------------------------------------------------------------
    def _finish(self):
        """Kill what is left, flush the streams, print the report; the exit code."""
        for rank in self.ranks:
            rank.signal_group(signal.SIGKILL)
        kill_orphans()
        # SIGKILL is delivered asynchronously: wait (briefly) until the groups are really
        # empty, reaping the orphans among them, so that none outlives gpurun as a zombie.
        give_up = time.monotonic() + 1.0
        while any(r.group_alive() for r in self.ranks) and time.monotonic() < give_up:
            reap_orphans()
            time.sleep(0.005)
        reap_orphans()
        for stream in self.streams:
            stream.close()
        if self.tolerated and self.first_failure is None and all(r in self.tolerated for r in self.ranks):
            self.first_failure = self.tolerated[0]   # no rank survived: the job failed after all
        failed = self.first_failure
        ended = report.end_of_job(self.stop_reason, self.stop_signal, self.opts.timeout, self.still_running_at_stop,
                                  None if failed is None else (failed.rank, self.host, failed.pid, failed.returncode,
                                                               self.stderr_tail(failed.rank)))
        if ended is None:
            return 0
        code, lines = ended
        self.report(lines)
        return code

    def report(self, lines):
        """Print the closing report (an agent sends it to the head gpurun instead)."""
        self.stderr.write(("\n".join(lines) + "\n").encode())

    def stderr_tail(self, rank):
        """The last lines of rank `rank`'s stderr."""
        for stream in self.streams:
            if stream.rank == rank and stream.name == "err":
                return stream.tail_text()
        return []

    def close(self):
        """Release the pipes and files even when the loop did not finish."""
        for stream in self.streams:
            stream.close()
        self.selector.close()
        if self.spawner is not None:
            self.spawner.close()
