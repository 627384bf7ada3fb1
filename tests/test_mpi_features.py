"""gpucoll.MPI's mpi4py features, exact results on 3 ranks (tests/scripts/mpi_features.py):
the Status and Request APIs, buffer specifications, logical and pair reductions, user ops,
Scan/Exscan, communicator management, Ssend and probes, error classes, DLPack buffers, vector
collectives, derived datatypes, and NotImplementedError for what gpucoll lacks."""
import pytest

N = 3
UNDEFINED, PROC_NULL, ANY_TAG = -32766, -2, -1
IDENT, CONGRUENT = 0, 1
ERR_TRUNCATE = 15


def digits(values):
    """The user op of the script: concatenation of decimal digits, in rank order."""
    return int("".join(str(v) for v in values))


@pytest.fixture(scope="module")
def results():
    from conftest import run_job

    job = run_job(N, "mpi_features.py", timeout=90).check()
    res = job.json_lines()
    assert sorted(res) == list(range(N)), job.describe()
    return res


def test_status(results):
    for r, got in results.items():
        left = (r - 1) % N
        assert got["status"] == [left, 7, 0, 5, 20, 5, UNDEFINED, False, 3, [left, 7, 0], left]


def test_requests(results):
    for r, got in results.items():
        left = (r - 1) % N
        first, done, bufs, nulled, flag, null_source, waitany_nulls, testsome_nulls = got["requests"]
        assert first == [UNDEFINED, False]          # Testany before anything was sent
        assert done == [0, 1, 2]                    # Waitsome until all are done; REQUEST_NULL ignored
        assert bufs == [[left, k] for k in range(3)]
        assert nulled is True and flag is True and null_source == -1
        assert waitany_nulls == UNDEFINED and testsome_nulls is None
        assert got["persistent"] == [[100 * k + left for k in range(3)], True, UNDEFINED]
        # Waitall over a window: every message in order, every handle nulled, the error of the
        # receive that was too small raised after the others completed
        assert got["window0"] == [[[left, 0, k] for k in range(8)], [False] * 16, None]
        wins, handles, error = got["window1"]
        assert wins[:2] + wins[3:] == [[left, 1, k] for k in (0, 1, 3, 4, 5, 6, 7)]
        assert handles == [False] * 16 and error == ERR_TRUNCATE


def test_buffer_specifications(results):
    for r, got in results.items():
        total = [float(sum(10 * k + i for k in range(N))) for i in range(6)]
        bcast = [-1, -1, -1, 3, 4, -1] if r else [-1] * 6   # [buf, (2, 3), INT]: 2 elements from the 4th
        assert got["specs"] == [total, bcast, PROC_NULL, 0]


def test_logical_pair_and_long_double_reductions(results):
    for r, got in results.items():
        land, lor, lxor, maxloc, minloc, fmax, ld = got["reductions"]
        x = [[k == 0, k > 0, k == 1, 0] for k in range(N)]
        assert land == [int(all(col)) for col in zip(*x)]
        assert lor == [int(any(col)) for col in zip(*x)]
        assert lxor == [sum(map(bool, col)) % 2 for col in zip(*x)]
        values = [[k % 2, -k, 5.0] for k in range(N)]
        for j in range(3):
            column = [values[k][j] for k in range(N)]
            assert maxloc[j] == [max(column), column.index(max(column))]  # ties: the lowest rank
            assert minloc[j] == [min(column), column.index(min(column))]
        assert fmax == ([float((N - 1) ** 2), N - 1] if r == N - 1 else None)
        assert ld == [sum(k + 0.5 for k in range(N))] * 2


def test_user_ops_scan_exscan(results):
    for r, got in results.items():
        allcat, scancat, ex, local, prod, exscan, scan = got["userops"]
        firsts, seconds = [k + 1 for k in range(N)], [9 - k for k in range(N)]
        assert allcat == [digits(firsts), digits(seconds)]  # non-commutative: rank order kept
        assert scancat == [digits(firsts[:r + 1]), digits(seconds[:r + 1])]
        assert ex == ([-7, -7] if r == 0 else [sum(firsts[:r]), sum(seconds[:r])])
        assert local == [13, 24]
        assert prod == 6 and exscan == (None if r == 0 else sum(range(1, r + 1))) and scan == list(range(r + 1))


def test_communicators(results):
    evens = list(range(0, N, 2))
    for r, got in results.items():
        (name, world, null, cmp_clone, cmp_self, cmp_dup, inter, intra, created, grouped, split_rank, split_null,
         shared, type_null, translated, clone_ranks) = got["comms"]
        assert [name, world, null] == ["mine", "MPI_COMM_WORLD", "MPI_COMM_NULL"]
        assert [cmp_clone, cmp_self, cmp_dup, inter, intra] == [CONGRUENT, IDENT, CONGRUENT, False, True]
        assert created == (len(evens) if r in evens else None)
        assert grouped == (evens.index(r) if r in evens else None)
        assert split_rank == (sorted(evens, reverse=True).index(r) if r in evens else None)  # keys -rank
        assert split_null is (r not in evens)
        assert shared == N and type_null is True
        assert translated == [0, evens[-1]] and clone_ranks == list(range(N))


def test_point_to_point_beyond_send_recv(results):
    for r, got in results.items():
        left = (r - 1) % N
        replaced, isendrecv, early, probe, mrecv, iprobe_after, empty_object = got["p2p"]
        assert replaced == [left, left * 10] and isendrecv == [left, -left]
        assert early == (False if r == 0 else None)  # an Issend waits for the receiver's match
        assert probe == [left, 3] and mrecv == [0.0, 1.0, 2.0] and iprobe_after is False
        assert empty_object is None


def test_point_to_point_of_plain_arrays_and_of_the_arrays_it_refuses(results):
    # C-contiguous arrays of basic dtypes (the native short paths; their speed is make
    # bench-p2p-mpi's): ANY_SOURCE / ANY_TAG, statuses, Waitall; a Fortran-ordered array travels
    # in memory order; read-only receive buffers, strided and byte-swapped arrays get the general
    # path's BufferError; a short receive buffer raises MPI's truncation error (ERR_TRUNCATE).
    for r, got in results.items():
        left = (r - 1) % N
        into, st, packed, rst, refused = got["plain"]
        assert into == [[10.0 * left + k for k in range(3)], [10.0 * left + k for k in range(3, 6)]]
        assert st == [left, 21, 6] and rst == [left, 23, 6]
        assert packed == [10 * left + k for k in (0, 3, 1, 4, 2, 5)]
        assert refused["readonly"][0] == "BufferError" and "read-only" in refused["readonly"][2]
        for case in ("strided recv", "strided send"):
            assert refused[case][0] == "BufferError" and "not contiguous" in refused[case][2], refused[case]
        assert "byte order" in refused["byte-swapped"][2]
        name, error_class, text = refused["truncated"]
        assert error_class == ERR_TRUNCATE and "sent 20 bytes" in text and "holds 8" in text, refused["truncated"]


def test_error_classes(results):
    for got in results.values():
        classes, exc = got["errors"]
        assert classes == {"root": [True, True], "type": [True, True], "op": [True, True], "comm": [True, True]}
        assert exc == [13, True, "MPI.Exception(13)", 13]


def test_dlpack_cpu_buffers(results):
    for got in results.values():
        assert got["dlpack"] == [[float(N)] * 3, [v for k in range(N) for v in (k, k * k)]]


def test_vector_collectives(results):
    counts = [k + 1 for k in range(N)]
    displs = [sum(counts[:k]) + k for k in range(N)]
    layout = [-1] * (displs[-1] + counts[-1] + 1)
    gathered, rooted = list(layout), list(layout)
    for k in range(N):
        gathered[displs[k]:displs[k] + counts[k]] = [k] * counts[k]
        rooted[displs[k]:displs[k] + counts[k]] = [10 + k] * counts[k]
    for r, got in results.items():
        allgatherv, gatherv, scatterv, alltoallv, reduce_scatter, alltoallw = got["vector"]
        assert allgatherv == gathered
        assert gatherv == (rooted if r == 0 else None)
        assert scatterv == list(range(displs[r], displs[r] + counts[r]))
        assert alltoallv == [100 * k + r for k in range(N) for _ in range((k + r) % 3)]
        start = sum(counts[:r])
        assert reduce_scatter == [i * sum(range(1, N + 1)) for i in range(start, start + counts[r])]
        assert alltoallw == [k + 0.5 for k in range(N)]


def test_derived_datatypes(results):
    for r, got in results.items():
        matrix, records, packed_end, extent, roundtrip = got["datatypes"]
        full = [[3 * i + j for j in range(3)] for i in range(4)]
        assert matrix == (full if r == 0 else [[3 * i, -1, -1] for i in range(4)])  # column 0 only
        assert records == [[1, 0.5], [2, 1.5]]
        assert packed_end == 2 * 12 and extent == [0, 16] and roundtrip is True


def test_name_service_publishes_job_wide(results):
    for got in results.values():
        assert got["names"] == {"found": True, "twice": True, "wrong_port": True, "gone": True}


def test_unsupported_features_raise_not_implemented_naming_them(results):
    for got in results.values():
        missing = got["missing"]
        assert "hardware resource information" in missing["Get_hw_resource_info"]
        assert "external32 packing" in missing["Pack_external_size"]
        assert "user-defined data representations" in missing["Register_datarep"]
        assert all(m.startswith("gpucoll.MPI.") and "not supported by gpucoll" in m for m in missing.values())
