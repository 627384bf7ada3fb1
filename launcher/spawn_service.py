"""gpurun's side of MPI's Spawn: start the processes a parent asks for through the store.

The store (gpucoll/bootstrap/spawns.py says what each key holds) calls `_requested` on its own
thread when a request is set; that only queues the key and wakes gpurun's loop through a pipe,
which the loop watches with the ranks' pipes. The loop then starts the children (`serve`) and
answers. Python children are forked from the warmed interpreter by the zygote
(spawn_zygote.py), never by gpurun itself: by then the store's thread runs, and a fork of a
process with threads may deadlock; others start as new processes. Each child gets the next
world ranks, the job's store and secret, and GPUCOLL_SPAWN=k:base.

A child that ends before it joined (a command that fails at start) is told to its parents'
root, which raises it from Spawn, and does not end the job; once joined, a child that fails
ends the job as any rank does.
"""
import collections
import json
import os

from gpucoll.bootstrap import spawns

from . import env as envmod
from .spawn import LaunchError, program_argv, start_rank


class SpawnService:
    """opts: the job's Options; common: the environment every rank shares (env.common_environ)."""

    def __init__(self, store, opts, common, zygote=None):
        self._store = store
        self._zygote = zygote               # forks Python children from the warmed interpreter (or None)
        self._opts = opts
        self._common = common
        self.next_rank = opts.nprocs      # the next world rank to hand out
        self._queue = collections.deque()  # request keys, from the store's thread
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        self._children = {}               # pid -> (spawn number, index, world rank, argv)
        store.watch(spawns.PREFIX, self._requested)
        # Before the store serves: Spawn asks for it first, MPI.UNIVERSE_SIZE reads it.
        store.put_threadsafe(spawns.SERVICE, json.dumps({"universe_size": opts.universe_size_given}).encode())

    def fileno(self):
        """Readable when a request waits."""
        return self._rfd

    def _requested(self, key):
        if spawns.spawn_of(key) is not None:
            self._queue.append(key)
            try:
                os.write(self._wfd, b"!")
            except BlockingIOError:  # the loop has wakeups pending already
                pass

    def serve(self, job):
        """Start what the queued requests ask for (on gpurun's loop); the new ranks go to `job`."""
        try:
            while os.read(self._rfd, 512):
                pass
        except BlockingIOError:
            pass
        while self._queue:
            key = self._queue.popleft()
            k = spawns.spawn_of(key)
            try:
                answer = {"base": self._start(job, k, json.loads(self._store.value(key)))}
            except (LaunchError, ValueError, KeyError, TypeError) as exc:
                answer = {"error": str(exc)}
            self._store.put_threadsafe(spawns.key(k, "started"), json.dumps(answer).encode())

    def _start(self, job, k, req):
        commands, maxprocs, wdirs = req["commands"], req["maxprocs"], req["wdirs"]
        total = sum(maxprocs)
        running = sum(1 for r in job.ranks if r.running)
        limit = self._opts.universe_size
        if running + total > limit:
            raise LaunchError(f"cannot start {total} more process(es): {running} are running and gpurun "
                              f"--universe-size allows {limit} at once", 1)
        argvs = [program_argv(cmd) for cmd in commands]  # every command checked before any starts
        for wdir in wdirs:
            if wdir is not None and not os.path.isdir(wdir):
                raise LaunchError(f"the working directory {wdir!r} (info key wdir) is not a directory", 1)
        base = self.next_rank
        self.next_rank += total
        common = envmod.common_environ(self._common, total, total, *_store_parts(self._common))
        i = 0
        for argv, count, wdir in zip(argvs, maxprocs, wdirs):
            for _ in range(count):
                env = envmod.rank_environ(common, i, i, self._opts.exports, spawn=(k, base))
                rank = self._zygote.start(base + i, argv, env, cwd=wdir) if self._zygote else None
                if rank is None:
                    rank = start_rank(base + i, argv, env, cwd=wdir)
                self._children[rank.pid] = (k, i, base + i, " ".join(argv))
                job.add(rank)
                i += 1
        return base

    def replace(self, job, failed_world_rank):
        """Start the job's program again as a replacement for a failed rank (gpurun --respawn): the
        next world rank, alone in its own COMM_WORLD until the survivors grow a communicator with
        it (gpucoll/api/fault.py). Returns its world rank."""
        w = self.next_rank
        self.next_rank += 1
        argv = program_argv(self._opts.command, self._opts.module)
        common = envmod.common_environ(self._common, 1, 1, *_store_parts(self._common))
        env = envmod.rank_environ(common, 0, 0, self._opts.exports, replaces=(failed_world_rank, w))
        rank = self._zygote.start(w, argv, env) if self._zygote else None
        if rank is None:
            rank = start_rank(w, argv, env)
        job.add(rank)
        return w

    def spawned(self, rank):
        """Whether `rank` is a process that MPI's Spawn started."""
        return rank.pid in self._children

    def ended_early(self, rank):
        """Whether `rank`, which failed, is a spawned process that had not joined yet: then its
        parents' root hears of it (and raises it from Spawn) and the job goes on."""
        child = self._children.get(rank.pid)
        if child is None:
            return False
        k, index, world_rank, command = child
        if self._store.value(spawns.key(k, f"child/{index}")) is not None:
            return False
        code = rank.returncode
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        self._store.put_threadsafe(spawns.key(k, "failed"), json.dumps(
            {"index": index, "rank": world_rank, "command": command, "how": how}).encode())
        return True

    def close(self):
        os.close(self._rfd)
        os.close(self._wfd)
        if self._zygote is not None:
            self._zygote.close()


def _store_parts(common):
    """(store host, port, secret, job id) of the job, from the environment every rank shares."""
    host, _, port = common["GPUCOLL_STORE"].rpartition(":")
    return host, port, common["GPUCOLL_STORE_SECRET"], common["GPUCOLL_JOB_ID"]
