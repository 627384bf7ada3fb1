"""gpucoll.MPI point to point on messages written as mpi4py programs write them
(tests/scripts/mpi_spec_forms.py, 2 ranks): `[MPI.Alloc_mem(n), n, MPI.BYTE]`, bytearray,
memoryview, array.array, `[array, MPI.DOUBLE]`, `(array, count, MPI.INT)`. Every byte arrives,
statuses count right, a count smaller than the buffer sends and receives only that many
elements (a longer message is ERR_TRUNCATE), and every one of these calls is read by the native
short paths (cython_src/p2p.pyx `_message`), not the general path's message reading; a Waitall
of a window settles it in one native call."""
import pytest

ERR_TRUNCATE = 15
FORMS = ("alloc", "bytearray", "memoryview", "array", "list-type", "tuple-count")
LISTS = ("alloc", "list-type", "tuple-count")


@pytest.fixture(scope="module")
def results():
    from conftest import run_job

    job = run_job(2, "mpi_spec_forms.py", timeout=60).check()
    res = job.json_lines()
    assert sorted(res) == [0, 1], job.describe()
    return res


@pytest.mark.parametrize("form", FORMS)
def test_every_form_arrives_exactly_through_the_short_paths(results, form):
    for r, got in results.items():
        for nbytes, (blocking, nonblocking, count, source, specs, forms) in got[form].items():
            assert (blocking, nonblocking) == (True, True), (r, form, nbytes)
            assert (count, source) == (int(nbytes), 1 - r), (r, form, nbytes)
            # the 4 calls (Send, Recv, Isend, Irecv) read in C: lists as lists, the rest as they are
            want = (4, 0) if form in LISTS else (0, 4)
            assert (specs, forms) == want, f"rank {r}, {form} of {nbytes} B: (lists, objects) read in C {specs, forms}"


def test_a_count_sends_and_receives_that_many_elements(results):
    for r, got in results.items():
        peer = 1 - r
        values, count, truncated = got["count"]
        assert values == [100 * peer + i for i in range(4)] + [-1] * 6
        assert count == 4
        assert truncated == (ERR_TRUNCATE if r == 1 else None)


def test_forms_that_do_not_hold_the_message_are_refused_as_before(results):
    for got in results.values():
        assert got["bad"] == ["ValueError", "ValueError"]


def test_a_bare_array_of_no_basic_datatype_takes_the_general_path(results):
    """ShortPaths.mpi_* take a bare array only when its buffer's format is a basic datatype's."""
    for got in results.values():
        assert got["declined"] == ["BufferError", "KeyError"]


def test_a_window_is_waited_for_and_settled_in_one_native_call(results):
    """Waitall without statuses settles a window of point-to-point requests in native code (and
    gpucoll.MPI nulls the handles there); with statuses each request takes its own Wait. Each of
    the window's small Isends was taken whole by the channel at its start: born complete."""
    for r, got in results.items():
        w = got["windows"]
        assert w["gpucoll.MPI"] == [True, True, 32, 16], (r, w)
        assert w["gpucoll"] == [True, None, 32, 16], (r, w)
        assert w["gpucoll.MPI statuses"] == [True, True, 0, 16], (r, w)
        assert w["gpucoll statuses"] == [True, None, 0, 16], (r, w)



def test_a_short_path_request_is_its_own_mpi_request(results):
    """gpucoll.MPI's Isend and Irecv of a plain buffer return the engine's request itself, an
    MPI.Request and a gpucoll.Request at once (no handle object over it); Waitall nulls it."""
    for r, got in results.items():
        assert got["one_object"] == [[True, True, True], [True, True, True], [False, False, True]], (r, got["one_object"])
