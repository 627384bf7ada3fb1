"""gpucoll.MPI's Allgatherv, Alltoallv, Gatherv and Scatterv within one host go through the
communicator's direct group (gc_direct_vexchange): NumPy arrays in mpi4py's vector specs by the native path
(HostFast.vector), every other form by the general path; blocks too large for the slots by
point to point on every rank. Exact every way (tests/scripts/vector_direct.py)."""
import pytest

NATIVE = {"fast": 1, "direct": 0, "p2p": 0}
GENERAL = {"fast": 0, "direct": 1, "p2p": 0}


def expected(name):
    kind, scale, form = name.split("/")
    native = form in ("list4", "pair", "in-place")
    if scale == "small":
        return NATIVE if native else GENERAL
    return {"fast": int(native), "direct": 0, "p2p": 1}  # too large: the native path finds so, then p2p


@pytest.mark.parametrize("np_", [2, 3])
def test_every_form_exact_and_the_way_it_took(np_):
    from conftest import run_job

    job = run_job(np_, "vector_direct.py", timeout=120).check()
    res = job.json_lines()
    assert sorted(res) == list(range(np_)), job.describe()
    for rank, got in res.items():
        for name, row in got.items():
            if name == "rank":
                continue
            assert row == {"exact": True, **expected(name)}, (rank, name, row)


def test_a_block_of_another_size_than_expected_is_a_mismatch_on_every_rank():
    from conftest import run_job

    job = run_job(3, "vector_direct.py", "mismatch", timeout=120).check()
    res = job.json_lines()
    # rank 1 finds that rank 0 sends 2 elements (16 B) where it expects 3 (24 B), before any data
    # moved; every other rank learns it at its next call, which cannot go on without rank 1
    assert res[1]["first"].startswith("MismatchError: allgatherv #"), res
    assert "rank 0 called allgatherv with 16 B, this rank with allgatherv with 24 B" in res[1]["first"], res
    for rank in (0, 2):
        assert res[rank]["first"] == "returned" and res[rank]["next"] == "MismatchError", res
    assert res[1]["next"] in ("MismatchError", "GpucollError"), res
