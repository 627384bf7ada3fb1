"""The direct engine's choice between one-shot and two-shot all-reduce and reduce scales with the
ranks of a host (gc_direct.h, GC_DIRECT_ONESHOT_TRAFFIC): every one-shot rank reads every rank's
input, so above 4 ranks the limit is 256 KiB / ranks^2 (8 ranks: 4 KiB, 16: 1 KiB);
GPUCOLL_HOST_ONESHOT_MAX sets it.
Results are exact on both sides of the limit (tests/scripts/oneshot_scaling.py)."""
import pytest


def limits(np_, env=None):
    from conftest import run_job

    job = run_job(np_, "oneshot_scaling.py", env=env, timeout=120).check()
    res = job.json_lines()
    assert sorted(res) == list(range(np_)), job.describe()
    for r, got in res.items():
        assert all(got["exact"].values()), (r, got)
    return {got["oneshot_max"] for got in res.values()}


@pytest.mark.parametrize("np_, limit", [(2, 64 << 10), (4, 64 << 10), (8, 4 << 10), (16, 1 << 10)])
def test_the_one_shot_limit_shrinks_with_the_ranks(np_, limit):
    assert limits(np_) == {limit}


def test_the_variable_sets_the_limit():
    assert limits(8, env={"GPUCOLL_HOST_ONESHOT_MAX": "1M"}) == {1 << 20}
