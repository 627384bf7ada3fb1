"""Rank program of tests/test_fault_tolerance.py: ranks that die for real (SIGKILL, or SIGALRM at a
random moment) and survivors that revoke, shrink and agree. Each survivor prints one RESULT line (JSON).

    loop VICTIMS STEP [SEED]   1,000 all-reduces; the world ranks in VICTIMS (comma-separated) kill
                               themselves at STEP (-1: each at a step and then a delay of up to 2 ms
                               drawn from SEED, wherever it is then); survivors check every sum
    lose-host RANK STEP        (across hosts) RANK kills its host's gpurun agent at STEP: the
                               host's ranks die with it; the others go on as in loop
    shrink-death VICTIM OTHER  VICTIM dies at step 200; OTHER dies at a random moment while the
                               others shrink (a timer started as it enters its recovery)
    respawn VICTIM STEP [HOW]  under gpurun --respawn: VICTIM dies at STEP; the survivors shrink and
                               grow with its replacement, which rejoins at the step they reached;
                               every sum is that of the full world. HOW: "dies" (the first
                               replacement dies as it starts), "and N" (world rank N dies too, at a
                               random moment of the recovery: in the shrink or the grow)
    revoke KIND                rank 1 revokes a Dup while the others wait in it: recv | barrier | send
                               | recv-after-garbage (a revocation value naming no communicator first)
    revoke-then-offer          rank 1 revokes a Dup that rank 0 has not heard of (no watcher: no
                               fault-tolerance call there), then rank 0 offers it a rendezvous send
    agree VICTIM               VICTIM dies; the survivors agree, list and acknowledge the failure
    failed-split VICTIMS       on a Split of the world in reverse order (rank r is n-1-r), the world
                               ranks in VICTIMS die; the survivors list and acknowledge them in part
    misuse                     revoke and shrink on a freed communicator; shrink, grow and agree
                               without a failure; rejoin outside a replacement
    impostor                   rank 0 starts a would-be replacement with a wrong secret
    nostore                    (under mpiexec or alone) revoke, then shrink and agree without a store
"""
import json
import os
import random
import signal
import sys
import time

import numpy as np

import gpucoll

STEPS = 1000


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def die_within(seconds, rng):
    # SIGALRM's default action ends the process wherever it is, native code included, and
    # needs no thread that a busy main thread could starve of the GIL.
    signal.setitimer(signal.ITIMER_REAL, max(1e-6, rng.uniform(0, seconds)))


def report(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def recover(comm, errors, step=0):
    """Revoke and shrink until a shrunk communicator runs an all-reduce (a rank may die meanwhile).
    Returns it and the step to go on from, the furthest any survivor reached: a collective may
    complete on some ranks and fail on others (ULFM's failures are not uniform; across hosts a
    rank that received its result can be done while its host's leader still waits on the dead)."""
    while True:
        comm.revoke()
        comm = comm.shrink()
        probe = np.ones(1)
        try:
            comm.Allreduce(gpucoll.IN_PLACE, probe)
            step = comm.allreduce(step, op=gpucoll.MAX)
        except (gpucoll.ProcFailedError, gpucoll.RevokedError) as exc:
            errors.append(type(exc).__name__)
            continue
        assert probe[0] == comm.size, (probe[0], comm.size)
        return comm, step


def kill_agent():
    """The whole host is lost: its gpurun agent dies, and its ranks with it (PR_SET_PDEATHSIG)."""
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)


def loop(comm, victims, at, seed, on_recovery=None, end=die):
    me = comm.world_ranks[comm.rank]
    rng = random.Random(seed * 1000 + me)
    timer_at = rng.randrange(50, 900) if me in victims and at < 0 else -1
    x = np.empty(1024, np.int64)
    errors, sizes, step = [], [], 0
    while step < STEPS:
        if me in victims and (step == at or (at < 0 and step == STEPS - 1)):
            end()   # a timed victim still alive at the last step dies there, before the others end
        if step == timer_at:   # the death lands inside an all-reduce, between two, or in a recovery
            die_within(0.002, rng)
            timer_at = -1
        x[:] = me + step
        try:
            comm.Allreduce(gpucoll.IN_PLACE, x)
        except (gpucoll.ProcFailedError, gpucoll.RevokedError) as exc:
            errors.append(type(exc).__name__)
            if on_recovery is not None:
                on_recovery(me)
            comm, step = recover(comm, errors, step)
            sizes.append(comm.size)
            continue
        want = sum(comm.world_ranks) + step * comm.size
        assert (x == want).all(), (step, int(x[0]), want, comm.world_ranks)
        step += 1
    return comm, errors, sizes


def regroup(comm, step, errors, failed=True):
    """Agree on the step to go on from; after a failure (or when agreeing fails) first revoke,
    shrink and grow until the new communicator works."""
    while True:
        try:
            if failed:
                comm = recover(comm, errors)[0].grow()
            return comm, comm.allreduce(step, op=gpucoll.MAX)
        except (gpucoll.ProcFailedError, gpucoll.RevokedError) as exc:   # a rank died meanwhile
            errors.append(type(exc).__name__)
            failed = True


def respawn(victim, at, how):
    """The loop of a job that keeps its size: a replacement takes the failed rank's place."""
    world = gpucoll.COMM_WORLD
    me = world.world_ranks[world.rank]
    if how == ["dies"] and gpucoll.replaces() == victim:   # its own replacement then lives
        die()
    also = int(how[1]) if how[:1] == ["and"] else None
    errors, sizes = [], []
    if gpucoll.replaces() is not None:
        comm, step = regroup(gpucoll.rejoin(), -1, errors, failed=False)   # the step the survivors reached
        started = step
    else:
        comm, step, started = world.Dup(), 0, None
    x = np.empty(1024, np.int64)
    while step < STEPS:
        if me == victim and step == at:
            die()
        x[:] = comm.rank + step
        try:
            comm.Allreduce(gpucoll.IN_PLACE, x)
        except (gpucoll.ProcFailedError, gpucoll.RevokedError) as exc:
            errors.append(type(exc).__name__)
            if me == also:
                die_within(0.01, random.Random(step))
            comm, step = regroup(comm, step, errors)
            sizes.append(comm.size)
            continue
        want = comm.size * (comm.size - 1) // 2 + step * comm.size
        assert (x == want).all(), (step, int(x[0]), want, comm.world_ranks)
        step += 1
    report(world=list(comm.world_ranks), rank=comm.rank, errors=errors, sizes=sizes, started=started,
           replaces=gpucoll.replaces())


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    world = gpucoll.COMM_WORLD
    if mode == "respawn":
        return respawn(int(args[0]), int(args[1]), args[2:])
    comm = world.Dup()
    if mode == "loop":
        victims = {int(v) for v in args[0].split(",")}
        comm, errors, sizes = loop(comm, victims, int(args[1]), int(args[2]) if len(args) > 2 else 0)
        report(world=list(comm.world_ranks), errors=errors, sizes=sizes)
    elif mode == "lose-host":
        comm, errors, sizes = loop(comm, {int(args[0])}, int(args[1]), 0, end=kill_agent)
        report(world=list(comm.world_ranks), errors=errors, sizes=sizes)
    elif mode == "shrink-death":
        victim, other = int(args[0]), int(args[1])
        rng = random.Random(world.rank)

        def maybe_die(me):
            if me == other:
                die_within(0.005, rng)
        comm, errors, sizes = loop(comm, {victim}, 200, 0, on_recovery=maybe_die)
        report(world=list(comm.world_ranks), errors=errors, sizes=sizes)
    elif mode == "revoke":
        kind = args[0]
        comm.Barrier()
        started = time.monotonic()
        got = None
        if world.rank == 1:
            if kind == "recv-after-garbage":  # a revocation key that names no communicator comes first
                from gpucoll.bootstrap import failures

                store, n = comm.seam.context.boot.store, 1
                while store.compare_set(failures.revoke_key(n), None, b"\xff\xfe") != b"\xff\xfe":
                    n += 1
            time.sleep(0.3)
            comm.revoke()
        else:
            try:
                if kind.startswith("recv"):
                    comm.Recv(np.empty(4), source=1)
                elif kind == "barrier":
                    comm.Barrier()
                else:
                    comm.Send(np.ones(1 << 20), dest=1)   # a rendezvous: rank 1 never receives it
                got = "no error"
            except gpucoll.RevokedError as exc:
                got = type(exc).__name__
        waited = time.monotonic() - started
        try:
            comm.Allreduce(gpucoll.IN_PLACE, np.ones(2))
            later = "no error"
        except gpucoll.RevokedError:
            later = "RevokedError"
        new = comm.shrink()
        total = np.ones(3)
        new.Allreduce(gpucoll.IN_PLACE, total)
        comm.Free()
        report(got=got, waited=waited, later=later, revoked=comm.is_revoked(), size=new.size, total=float(total[0]))
    elif mode == "agree":
        victim = int(args[0])
        if world.rank == victim:
            die()
        x = np.ones(8)
        try:
            comm.Allreduce(gpucoll.IN_PLACE, x)
            raised = None
        except gpucoll.ProcFailedError as exc:
            raised = [type(exc).__name__, list(exc.ranks)]
        flag = comm.agree(0b1111 if world.rank % 2 else 0b0111)
        report(raised=raised, flag=flag, failed=comm.failed(), acked=comm.ack_failed(), acked0=comm.ack_failed(0))
    elif mode == "revoke-then-offer":
        comm.Barrier()
        if world.rank == 1:
            comm.revoke()
            world.Barrier()
            got = world.recv(source=0, tag=9)   # rank 1's engine answers the offer meanwhile
        else:
            world.Barrier()
            try:
                comm.Send(np.ones(1 << 20), dest=1)   # a rendezvous offer, to a rank that revoked comm
                got = "no error"
            except gpucoll.RevokedError as exc:
                got = type(exc).__name__ + ": " + str(exc)
            world.send(got, dest=1, tag=9)
        report(got=got)
    elif mode == "failed-split":
        victims = {int(v) for v in args[0].split(",")}
        comm = world.Split(0, world.size - 1 - world.rank)
        if world.rank in victims:
            die()
        deadline = time.monotonic() + 20
        while len(comm.failed()) < len(victims) and time.monotonic() < deadline:
            time.sleep(0.01)
        report(failed=comm.failed(), acked1=comm.ack_failed(1), acked=comm.ack_failed(), acked9=comm.ack_failed(9))
    elif mode == "misuse":
        same = comm.shrink()
        grown = same.grow()
        flag = comm.agree(6 - world.rank)
        done = {"shrunk": [same.rank, same.size], "grown": [grown.rank, grown.size], "flag": flag,
                "failed": comm.failed()}
        try:
            gpucoll.rejoin()
            done["rejoin"] = "no error"
        except gpucoll.InvalidUsageError as exc:
            done["rejoin"] = str(exc)
        comm.Free()
        for name in ("revoke", "shrink"):
            try:
                getattr(comm, name)()
                done[name] = "no error"
            except gpucoll.InvalidUsageError as exc:
                done[name] = str(exc)
        report(**done)
    elif mode == "nostore":
        comm.revoke()
        same = comm.shrink()
        x = np.ones(2)
        same.Allreduce(gpucoll.IN_PLACE, x)
        report(shrunk=[same.rank, same.size], flag=comm.agree(5 + world.rank), total=float(x[0]),
               revoked=comm.is_revoked())
    elif mode == "impostor":
        import subprocess

        if world.rank == 0:
            env = dict(os.environ, GPUCOLL_STORE_SECRET="00" * 16, GPUCOLL_REPLACES="1:9", GPUCOLL_RANK="0",
                       GPUCOLL_SIZE="1", GPUCOLL_INIT_TIMEOUT="10")
            proc = subprocess.run([sys.executable, "-c", "import gpucoll; gpucoll.init(); print('JOINED')"],
                                  env=env, capture_output=True, text=True, timeout=60)
            got = {"code": proc.returncode, "joined": "JOINED" in proc.stdout, "stderr": proc.stderr[-600:]}
        else:
            got = {}
        x = np.ones(4)
        world.Allreduce(gpucoll.IN_PLACE, x)   # the job itself goes on
        report(total=float(x[0]), **got)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
