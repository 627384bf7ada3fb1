"""Collective algorithms as plain data, and the cost model that picks one.

    from gpucoll.algorithms import schedule, select
    algo = select("allreduce", nbytes=4 << 20, size=8, transport="tcp")     # "rhd"
    s = schedule("allreduce", algo, rank=3, size=8, count=1 << 20)
    s.steps           # (nsteps, 9) int64: the contract of docs/internals.md, "Schedules"

Modules: steps (the Schedule type, step layout, checks), ring, tree, rhd, pairwise, linear,
dissemination (the generators), registry (which generator implements what), selector (cost
model), simulate (in-process reference executor, the oracle for tests).
"""
from .steps import (COPY, NOBUF, RECV, RECVBUF, REDUCE, SCRATCH, SEND, SENDBUF, Schedule,
                    ScheduleError)
from .registry import COLLECTIVES, GENERATORS, ROOTED, algorithms, canonical, schedule
from .selector import cost, describe, select

__all__ = ["COLLECTIVES", "GENERATORS", "ROOTED", "algorithms", "canonical", "schedule", "Schedule",
           "ScheduleError", "SEND", "RECV", "REDUCE", "COPY", "SENDBUF", "RECVBUF", "SCRATCH",
           "NOBUF", "select", "cost", "describe"]
