"""Schedules and the selector, checked through the in-process reference executor.

Every collective x algorithm x size x count x op runs on all ranks at once (simulate.collective)
and must equal NumPy exactly for integers; float results must be bitwise identical on every rank.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulate
from gpucoll.base import config
from gpucoll.algorithms import (COPY, GENERATORS, RECV, REDUCE, ROOTED, SEND, Schedule, ScheduleError,
                                schedule, select, selector)
from gpucoll.algorithms.steps import NCOLS, StepBuilder
from gpucoll.base.errors import ConfigError, InvalidUsageError

SIZES = (1, 2, 3, 4, 5, 7, 8, 16)
REDUCTIONS = ("allreduce", "reduce_scatter_block", "reduce")
INT_OPS = ("sum", "prod", "max", "min", "band", "bor", "bxor", "avg")
CASES = [(c, a) for c, algos in GENERATORS.items() for a in algos]


def counts(p):
    return sorted({0, 1, max(p - 1, 0), p + 1, 1000, 4097})


def roots(coll, p):
    return sorted({0, p // 2, p - 1}) if coll in ROOTED else [0]


def input_len(coll, p, count):
    return count * p if coll in ("reduce_scatter_block", "alltoall", "scatter") else count


def make_inputs(coll, p, count, dtype, seed):
    if coll == "barrier":
        return [None] * p
    rng = np.random.default_rng(seed)
    n = input_len(coll, p, count)
    if np.dtype(dtype).kind == "f":
        return [rng.standard_normal(n).astype(dtype) for _ in range(p)]
    info = np.iinfo(dtype)
    return [rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True) for _ in range(p)]


def exact_float_inputs(coll, p, count, dtype, op, seed):
    """Float inputs whose reductions round nowhere, in any order: multiples of 1/2 up to 8 for
    sums (p <= 20 keeps every partial sum within float16's 11 bits), +-1/2 and +-1 for products
    (powers of two down to 2**-20, which float16 still holds). Every algorithm must then give
    NumPy's result bit for bit, however it associates."""
    rng = np.random.default_rng(seed)
    n = input_len(coll, p, count)
    if op == "prod":
        return [rng.choice([-1.0, -0.5, 0.5, 1.0], n).astype(dtype) for _ in range(p)]
    return [(rng.integers(-16, 17, n) / 2).astype(dtype) for _ in range(p)]


def assert_matches(coll, algo, inputs, op, root, inplace, mode="rendezvous"):
    outs = simulate.collective(coll, algo, inputs, op, root=root, inplace=inplace, mode=mode)
    want = simulate.reference(coll, inputs, op, root=root)
    for r, (got, ref) in enumerate(zip(outs, want)):
        if ref is None:
            assert got is None, (coll, algo, r)
        else:
            assert got.dtype == ref.dtype and np.array_equal(got, ref), (
                f"{coll}.{algo} p={len(inputs)} op={op} root={root} inplace={inplace} rank {r}")
    return outs


# --- correctness through the simulator ----------------------------------------------------------

@pytest.mark.parametrize("coll,algo", CASES)
@pytest.mark.parametrize("p", SIZES)
def test_integer_results_are_exact(coll, algo, p):
    ops = INT_OPS if coll in REDUCTIONS else ("sum",)
    for count in counts(p):
        for root in roots(coll, p):
            for i, op in enumerate(ops):
                dtype = (np.int64, np.uint8, np.int32)[i % 3]
                inputs = make_inputs(coll, p, count, dtype, seed=p * 7919 + count + i)
                assert_matches(coll, algo, inputs, op, root, inplace=False)
                assert_matches(coll, algo, inputs, op, root, inplace=True)


@pytest.mark.parametrize("coll,algo", [c for c in CASES if c[0] in REDUCTIONS])
@pytest.mark.parametrize("p", (2, 3, 5, 8, 16))
@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_float_results_are_bitwise_identical_on_every_rank(coll, algo, p, dtype):
    count = 1001
    for root in roots(coll, p):
        inputs = make_inputs(coll, p, count, dtype, seed=p)
        outs = simulate.collective(coll, algo, inputs, "sum", root=root)
        again = simulate.collective(coll, algo, inputs, "sum", root=root, inplace=True)
        want = simulate.reference(coll, inputs, "sum", root=root)
        bits = np.dtype(dtype).str.replace("f", "u")
        for got, same, ref in zip(outs, again, want):
            if ref is None:
                continue
            np.testing.assert_allclose(got, ref, rtol=1e-4 if dtype == np.float32 else 1e-12, atol=1e-4)
            assert np.array_equal(got.view(bits), same.view(bits))
        if coll == "allreduce":
            first = outs[0].view(bits)
            assert all(np.array_equal(first, o.view(bits)) for o in outs)
        if coll == "reduce_scatter_block":
            # Each block is combined once; the blocks together equal the allreduce of the same
            # algorithm family only approximately, but must not depend on in-place or not.
            assert np.array_equal(np.concatenate(outs).view(bits), np.concatenate(again).view(bits))


@pytest.mark.parametrize("coll,algo", CASES)
def test_eager_buffering_gives_the_same_results(coll, algo):
    for p in (3, 8):
        for root in roots(coll, p):
            inputs = make_inputs(coll, p, 37, np.int64, seed=p)
            assert_matches(coll, algo, inputs, "sum", root, inplace=False, mode="eager")


_DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
           np.float16, np.float32, np.float64]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), p=st.integers(1, 20), count=st.integers(0, 300),
       dtype=st.sampled_from(_DTYPES), op=st.sampled_from(INT_OPS), inplace=st.booleans(),
       data=st.data())
def test_random_calls(case, p, count, dtype, op, inplace, data):
    coll, algo = case
    root = data.draw(st.integers(0, p - 1))
    is_float = np.dtype(dtype).kind == "f"
    if is_float and op in ("band", "bor", "bxor"):
        op = "max"
    if not is_float or coll not in REDUCTIONS:
        assert_matches(coll, algo, make_inputs(coll, p, count, dtype, seed=count), op, root, inplace)
        return
    # float reductions: exact against NumPy on inputs that never round ...
    assert_matches(coll, algo, exact_float_inputs(coll, p, count, dtype, op, seed=count), op, root, inplace)
    if coll == "allreduce":  # ... and on any inputs, bitwise the same on every rank
        with np.errstate(all="ignore"):
            outs = simulate.collective(coll, algo, make_inputs(coll, p, count, dtype, seed=count), op, root=root,
                                       inplace=inplace)
        bits = np.dtype(dtype).str.replace("f", "u")
        assert all(np.array_equal(outs[0].view(bits), o.view(bits)) for o in outs)


# --- schedules as data ------------------------------------------------------------------------------

@pytest.mark.parametrize("coll,algo", CASES)
def test_schedules_keep_the_contract(coll, algo):
    for p in SIZES:
        for count in counts(p):
            for root in roots(coll, p):
                for r in range(p):
                    s = schedule(coll, algo, r, p, count, root=root)
                    assert isinstance(s, Schedule) and s.name == f"{coll}.{algo}"
                    assert s.steps.dtype == np.int64 and s.steps.shape[1:] == (NCOLS,)
                    assert not s.steps.flags.writeable
                    s.check()
                    if count == 0 and coll != "barrier":
                        assert s.nsteps == 0         # MPI: a zero count is a no-op
                    if p == 1:
                        assert s.sent == s.received == 0
                    assert schedule(coll, algo, r, p, count, root=root) is s   # cached


def test_schedule_steps_are_readable():
    s = schedule("allreduce", "ring", 0, 4, 10)
    text = s.format()
    assert "copy send[0:10] -> recv[0:10]" in text
    assert "send->1" in text and "recv<-3 +recv" in text
    assert (s.sent, s.received) == (3 + 2 + 2 + 3 + 3 + 2, 2 + 2 + 3 + 3 + 2 + 2)   # blocks 3,3,2,2
    assert s.nbytes_moved(4) == 4 * s.sent


def test_ring_allreduce_steps_are_sendrecvs_with_neighbours():
    s = schedule("allreduce", "ring", 2, 5, 100)
    rows = s.steps
    assert rows[0, 0] == COPY
    assert (rows[1:5, 0] == SEND | RECV | REDUCE).all() and (rows[5:, 0] == SEND | RECV).all()
    assert (rows[1:, 1] == 3).all() and (rows[1:, 5] == 1).all()


def test_barrier_exchanges_zero_length_messages_and_synchronises():
    for p in SIZES:
        for r in range(p):
            s = schedule("barrier", "dissemination", r, p)
            assert s.nsteps == (p - 1).bit_length()
            assert (s.steps[:, 0] == SEND | RECV).all() and (s.steps[:, [4, 8]] == 0).all()
        simulate.collective("barrier", "dissemination", [None] * p)
    # A rank that does not arrive holds everyone else: the barrier really synchronises.
    scheds = [schedule("barrier", "dissemination", r, 4) for r in range(4)]
    scheds[3] = StepBuilder(3, 4).build("barrier", "dissemination", 0)
    with pytest.raises(simulate.DeadlockError, match="rank 0"):
        simulate.run(scheds, [None] * 4, [None] * 4, mode="eager")


def test_alltoall_without_staging_is_only_for_distinct_buffers():
    p, count = 5, 3
    inputs = make_inputs("alltoall", p, count, np.int64, seed=1)
    want = simulate.reference("alltoall", inputs)
    fast = [schedule("alltoall", "pairwise", r, p, count, inplace=False) for r in range(p)]
    assert all(s.scratch_count == 0 for s in fast)
    bufs = [x.copy() for x in inputs]
    simulate.run(fast, bufs, bufs)          # aliased: blocks are overwritten before being sent
    assert not all(np.array_equal(b, w) for b, w in zip(bufs, want))
    recvs = [np.zeros_like(x) for x in inputs]
    simulate.run(fast, [x.copy() for x in inputs], recvs)
    assert all(np.array_equal(b, w) for b, w in zip(recvs, want))


def test_every_element_is_combined_once_and_copied():
    """Reduction results travel from the one rank that combined them: across the ranks, the
    elements received with REDUCE add up to (p - 1) combinations per element."""
    for algo in GENERATORS["allreduce"]:
        for p in (3, 4, 7):
            count = 50
            reduced = sum(int(s.steps[s.steps[:, 0] & REDUCE != 0, 8].sum())
                          for s in (schedule("allreduce", algo, r, p, count) for r in range(p)))
            if algo == "rd":
                # recursive doubling combines on every rank of the power of two (the same
                # expression on each: test_float_results_are_bitwise_identical_on_every_rank),
                # plus once per folded pair
                q = 1 << (p.bit_length() - 1)
                assert reduced == (q * (q.bit_length() - 1) + p - q) * count, algo
            else:
                assert reduced == (p - 1) * count, algo


# --- the simulator catches broken schedules ---------------------------------------------------------

def _two_rank(steps0, steps1, count=4):
    return [Schedule(np.array(s, np.int64).reshape(-1, NCOLS), "test", "x", r, 2, count,
                     send_count=count, recv_count=count) for r, s in enumerate((steps0, steps1))]


def test_simulator_reports_deadlock_and_mismatch():
    send_then_recv = [[SEND, 1, 0, 0, 4, -1, -1, 0, 0], [RECV, -1, -1, 0, 0, 1, 1, 0, 4]]
    other = [[SEND, 0, 0, 0, 4, -1, -1, 0, 0], [RECV, -1, -1, 0, 0, 0, 1, 0, 4]]
    with pytest.raises(simulate.DeadlockError, match="send pending"):
        simulate.run(_two_rank(send_then_recv, other), [np.ones(4)] * 2, [np.zeros(4), np.zeros(4)])
    # With unlimited buffering the same pair completes.
    simulate.run(_two_rank(send_then_recv, other), [np.ones(4)] * 2, [np.zeros(4), np.zeros(4)],
                 mode="eager")
    short = [[RECV, -1, -1, 0, 0, 0, 1, 0, 3]]
    with pytest.raises(simulate.MessageMismatchError, match="expects 3"):
        simulate.run(_two_rank([[SEND, 1, 0, 0, 4, -1, -1, 0, 0]], short), [np.ones(4)] * 2,
                     [np.zeros(4), np.zeros(4)])
    with pytest.raises(simulate.MessageMismatchError, match="never received"):
        simulate.run(_two_rank([[SEND, 1, 0, 0, 4, -1, -1, 0, 0]], []), [np.ones(4)] * 2,
                     [np.zeros(4), np.zeros(4)], mode="eager")


@pytest.mark.parametrize("row,problem", [
    ([RECV, -1, -1, 0, 0, 1, 0, 0, 4], "read-only"),
    ([SEND, 1, 1, 2, 4, -1, -1, 0, 0], "overruns"),
    ([SEND, 0, 1, 0, 4, -1, -1, 0, 0], "not another rank"),
    ([SEND | RECV, 1, 1, 0, 3, 1, 1, 2, 2], "overlap"),
    ([COPY, -1, 0, 0, 4, -1, 1, 0, 3], "equal"),
    ([REDUCE, -1, -1, 0, 0, -1, 1, 0, 4], "flags"),
    ([COPY | SEND, 1, 0, 0, 4, -1, 1, 0, 4], "flags"),
    ([SEND, 1, -1, 0, 0, -1, -1, 0, 0], "buffer -1 does not exist"),
    ([RECV, 1, -1, 0, 0, 1, 1, 0, 4], "unused send"),
])
def test_check_rejects_steps_that_break_the_contract(row, problem):
    s = Schedule(np.array([row], np.int64), "test", "x", 0, 2, 4, send_count=4, recv_count=4)
    with pytest.raises(ScheduleError, match=problem):
        s.check()


def test_local_reduce_step_combines_into_the_destination():
    rows = [[COPY | REDUCE, -1, 0, 0, 4, -1, 1, 0, 4], [COPY | REDUCE, -1, 0, 0, 4, -1, 1, 0, 4]]
    sched = Schedule(np.array(rows, np.int64), "test", "x", 0, 1, 4, send_count=4, recv_count=4)
    recv = np.array([1, 2, 3, 4])
    simulate.run([sched.check()], [np.array([10, 20, 30, 40])], [recv])
    assert recv.tolist() == [21, 42, 63, 84]
    assert "reduce send[0:4] -> recv[0:4]" in sched.format()


def test_reduce_scatter_is_another_name_for_reduce_scatter_block(auto):
    assert schedule("reduce_scatter", "ring", 1, 4, 8) is schedule("reduce_scatter_block", "ring", 1, 4, 8)
    assert select("reduce_scatter", 1 << 20, 8, "tcp") == select("reduce_scatter_block", 1 << 20, 8, "tcp")
    inputs = make_inputs("reduce_scatter_block", 3, 5, np.int64, seed=3)
    assert_matches("reduce_scatter", "rhd", inputs, "sum", 0, inplace=True)


def test_simulator_argument_errors():
    s = [schedule("allreduce", "ring", r, 2, 4) for r in range(2)]
    with pytest.raises(InvalidUsageError, match="holds 3 elements"):
        simulate.run(s, [np.ones(3), np.ones(4)], [np.zeros(4), np.zeros(4)])
    with pytest.raises(InvalidUsageError, match="unknown op"):
        simulate.run(s, [np.ones(4)] * 2, [np.zeros(4), np.zeros(4)], op="mean")
    with pytest.raises(InvalidUsageError, match="does not apply"):
        simulate.run(s, [np.ones(4)] * 2, [np.zeros(4), np.zeros(4)], op="bxor")
    assert simulate.op_name(2) == "max" and simulate.op_name("BXOR") == "bxor"


def test_invalid_schedule_requests_are_clear_errors():
    with pytest.raises(InvalidUsageError, match="unknown collective 'allreduse'"):
        schedule("allreduse", "ring", 0, 2, 4)
    with pytest.raises(InvalidUsageError, match="no algorithm 'bruck'.*ring, rhd"):
        schedule("allgather", "bruck", 0, 2, 4)
    with pytest.raises(InvalidUsageError, match="rank 2 is not in"):
        schedule("allreduce", "ring", 2, 2, 4)
    with pytest.raises(InvalidUsageError, match="root 5"):
        schedule("bcast", "tree", 0, 4, 4, root=5)
    with pytest.raises(InvalidUsageError, match="count must be >= 0"):
        schedule("allreduce", "tree", 0, 4, -1)
    with pytest.raises(InvalidUsageError, match="size must be >= 1"):
        schedule("allreduce", "tree", 0, 0, 4)


# --- the selector -----------------------------------------------------------------------------------

@pytest.fixture
def auto(monkeypatch):
    monkeypatch.delenv("GPUCOLL_ALGO", raising=False)
    selector._warned.clear()


def test_table_and_generators_agree():
    for e in selector.TABLE:
        assert e.native == (e.algorithm not in GENERATORS[e.collective]), e
    listed = {(e.collective, e.algorithm) for e in selector.TABLE}
    assert set(CASES) <= listed


@pytest.mark.parametrize("transport", sorted(selector.LINKS))
def test_select_picks_the_cheapest_row(auto, transport):
    for coll in GENERATORS:
        for p in (1, 2, 3, 8, 16, 64):
            for nbytes in (0, 8, 4096, 1 << 20, 1 << 28):
                # Links the schedule executor does not run over offer their native rows only.
                native = set() if selector.LINKS[transport].schedules else selector.NATIVE
                if not selector.candidates(coll, transport, native):
                    with pytest.raises(InvalidUsageError, match=f"no {coll} algorithm runs over {transport}"):
                        select(coll, nbytes, p, transport, available=native)
                    continue
                algo = select(coll, nbytes, p, transport, available=native)
                costs = {a: selector.cost(coll, a, nbytes, p, transport)
                         for a in selector.candidates(coll, transport, native)}
                assert costs[algo] == min(costs.values())
                assert algo == next(a for a, c in costs.items() if c == min(costs.values()))


def test_select_follows_the_model_from_latency_to_bandwidth(auto):
    assert select("allreduce", 1 << 28, 3, "tcp") == "ring"
    assert select("allreduce", 1 << 28, 16, "tcp") == "rhd"
    assert select("bcast", 64, 16, "tcp") == "tree"
    assert select("bcast", 1 << 28, 16, "tcp") == "ring"
    assert select("reduce", 64, 16, "ofi") == "tree"
    assert select("reduce", 1 << 28, 16, "ofi") == "ring"
    # 'direct' (the host engine's shared segment) only over shared memory, and only when the
    # caller can run it; GPU buffers' own rows are 'registered' and the staged ones.
    assert select("allreduce", 1024, 4, "shm") != "direct"
    assert select("allreduce", 1024, 4, "shm", available={"direct"}) == "direct"
    assert select("allreduce", 1024, 4, "tcp", available={"direct"}) != "direct"
    assert select("allreduce", 1 << 30, 2, "nvlink", available={"direct", "two-shot"}) == "two-shot"
    assert select("allreduce", 1 << 30, 2, "shm", available={"registered", "direct"}) == "direct"
    assert select("allreduce", 1024, 8, "nvlink", available={"one-shot", "two-shot"}) == "one-shot"
    assert select("allreduce", 1 << 28, 8, "nvlink", available={"one-shot", "two-shot"}) == "two-shot"


def test_gpu_choice_is_the_nvlink_rows_of_the_table(auto):
    gpu = {"one-shot", "two-shot", "registered", "staged"}
    # 2 ranks: one-shot wherever it can run (the same bytes on the link as two-shot, one
    # synchronisation fewer), two-shot above a slot, registered buffers from 64 MiB.
    assert select("allreduce", 8, 2, "nvlink", available=gpu) == "one-shot"
    assert select("allreduce", 1 << 20, 2, "nvlink", available=gpu) == "one-shot"
    assert select("allreduce", 16 << 20, 2, "nvlink", available=gpu) == "one-shot"
    assert select("allreduce", 48 << 20, 2, "nvlink", available=gpu - {"one-shot"}) == "two-shot"
    assert select("allreduce", 256 << 20, 2, "nvlink", available=gpu) == "registered"
    # More ranks: one-shot pushes to p-1 peers, so two-shot and registered take over sooner.
    steps = {p: dict((a, b) for b, a in selector.crossovers("allreduce", p, "nvlink", gpu)) for p in (2, 4, 8)}
    assert "two-shot" not in steps[2] and steps[4]["two-shot"] > steps[8]["two-shot"]
    assert 512 << 10 < steps[4]["two-shot"] < 2 << 20 and 128 << 10 < steps[8]["two-shot"] < 512 << 10
    assert steps[2]["registered"] > steps[4]["registered"] > steps[8]["registered"]
    assert select("bcast", 1 << 30, 8, "nvlink", available=gpu) == "registered"
    assert select("gather", 1 << 30, 8, "nvlink", available=gpu) == "staged"
    # The schedules (ring, tree, ...) run over host channels only: never a GPU choice.
    for nbytes in (8, 1 << 20, 1 << 30):
        for p in (2, 3, 8):
            assert select("allreduce", nbytes, p, "nvlink", available={"one-shot"}) == "one-shot"
    assert select("allreduce", 1 << 20, 2, "nvlink", forced="one-shot", available=gpu) == "one-shot"
    assert any("allreduce" in line and "8 ranks" in line for line in selector.describe())


def test_crossovers_are_where_the_choice_changes(auto):
    gpu = {"one-shot", "two-shot", "registered"}
    points = selector.crossovers("allreduce", 4, "nvlink", gpu)
    assert [a for _, a in points] == ["one-shot", "two-shot", "registered"] and points[0][0] == 0
    for (start, algo), (nxt, _) in zip(points, points[1:] + [(1 << 32, None)]):
        assert select("allreduce", start, 4, "nvlink", available=gpu) == algo
        assert select("allreduce", nxt - 1, 4, "nvlink", available=gpu) == algo


def test_forced_algorithm_is_honoured_where_it_exists(auto, monkeypatch):
    assert select("allreduce", 1 << 28, 16, "tcp", forced="tree") == "tree"
    monkeypatch.setenv("GPUCOLL_ALGO", "tree")
    assert select("allreduce", 1 << 28, 16, "tcp") == "tree"
    assert select("bcast", 1 << 28, 16, "tcp") == "tree"
    monkeypatch.setenv("GPUCOLL_ALGO", "direct")
    assert select("allreduce", 1 << 28, 4, "shm", available={"direct"}) == "direct"
    monkeypatch.setenv("GPUCOLL_ALGO", "auto")
    assert select("allreduce", 1 << 28, 16, "tcp") == "rhd"


def test_forced_algorithm_that_does_not_apply_falls_back_with_a_warning(auto, monkeypatch):
    warnings = []
    monkeypatch.setattr(selector.log, "warn", lambda sub, msg, *a: warnings.append((sub, msg % a)))
    monkeypatch.setenv("GPUCOLL_ALGO", "ring")
    assert select("barrier", 0, 8, "tcp") == "dissemination"
    assert select("barrier", 0, 8, "tcp") == "dissemination"
    assert len(warnings) == 1 and warnings[0][0] == "TUNING"
    assert "GPUCOLL_ALGO=ring" in warnings[0][1] and "barrier" in warnings[0][1]
    # 'direct' forced but not available: the model decides among the rest.
    assert select("allreduce", 1024, 4, "shm", forced="direct") in ("ring", "rhd", "tree", "rd")
    assert len(warnings) == 2


def test_selector_errors_are_clear(auto, monkeypatch):
    with pytest.raises(InvalidUsageError, match="unknown algorithm 'fastest'"):
        select("allreduce", 8, 4, "tcp", forced="fastest")
    with pytest.raises(InvalidUsageError, match="unknown collective"):
        select("allreduse", 8, 4, "tcp")
    with pytest.raises(InvalidUsageError, match="unknown transport 'carrier-pigeon'"):
        select("allreduce", 8, 4, "carrier-pigeon")
    with pytest.raises(InvalidUsageError, match="nbytes must be >= 0"):
        select("allreduce", -1, 4, "tcp")
    with pytest.raises(InvalidUsageError, match="size must be an integer"):
        select("allreduce", 8, 2.5, "tcp")
    with pytest.raises(InvalidUsageError, match="only, not tcp"):
        selector.cost("allreduce", "direct", 8, 4, "tcp")
    monkeypatch.setenv("GPUCOLL_ALGO", "fastest")
    with pytest.raises(ConfigError, match="GPUCOLL_ALGO"):
        select("allreduce", 8, 4, "tcp")


def test_describe_lists_links_and_every_row():
    lines = selector.describe()
    assert isinstance(lines, list) and all(isinstance(line, str) for line in lines)
    for name in selector.LINKS:
        assert any(line.startswith(name) for line in lines)
    for e in selector.TABLE:
        assert any(e.collective in line and e.algorithm in line and e.steps in line for line in lines)


def test_tune_changes_the_choice(auto):
    saved = {k: (v.alpha, v.beta) for k, v in selector.LINKS.items()}
    try:
        assert select("bcast", 1 << 16, 16, "tcp") == "tree"
        selector.tune("tcp", alpha=1e-9)            # start-ups become free: bandwidth wins
        assert select("bcast", 1 << 16, 16, "tcp") == "ring"
        selector.tune("lab", alpha=1e-6, beta=1e-9)
        assert select("bcast", 8, 2, "lab") == "tree"
        with pytest.raises(InvalidUsageError, match="needs both"):
            selector.tune("other", alpha=1e-6)
    finally:
        selector.LINKS.pop("lab", None)
        for k, (a, b) in saved.items():
            selector.tune(k, a, b)


def test_config_declares_the_forced_names():
    assert {"auto", "direct", "ring", "tree", "rhd", "rd", "one-shot", "two-shot", "staged", "registered"} == \
        set(config.ALGO.choices)


@pytest.mark.parametrize("p", (2, 3, 4, 5, 8))
@pytest.mark.parametrize("op", ("max", "min"))
def test_recursive_doubling_keeps_the_operand_order_on_every_rank(p, op):
    """rd combines on every rank: each must put the lower partial first, or NaN payloads and
    signed zeros (the first operand wins) would differ from rank to rank."""
    rng = np.random.default_rng(p)
    inputs = []
    for r in range(p):
        x = rng.choice(np.array([0.0, -0.0, 1.0], np.float32), 64)
        bits = x.view(np.uint32)
        nan = rng.random(64) < 0.3
        bits[nan] = 0x7FC00000 | (r + 1)        # a NaN whose payload names its rank
        inputs.append(x)
    outs = simulate.collective("allreduce", "rd", inputs, op)
    first = outs[0].view(np.uint32)
    assert all(np.array_equal(o.view(np.uint32), first) for o in outs), op
    if p & (p - 1) == 0:    # no fold: rank order itself, (x0 OP x1) OP (x2 OP x3) ...
        assert np.array_equal(first, simulate.reference("allreduce", inputs, op)[0].view(np.uint32)), op
