"""gpucoll/base/call.py: one table of collective kinds, numbers that every rank agrees on, and
one definition of a call's bytes."""
import os
import re

import pytest

from gpucoll.base.call import BY_ID, KINDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def test_kind_numbers_are_the_c_enum():
    enum = dict(re.findall(r"GC_KIND_(\w+)\s*=\s*(\d+)", _read("cython_src/include/gc_direct.h")))
    assert {name.lower(): int(num) for name, num in enum.items()} == {k.name: k.id for k in KINDS.values()}
    assert sorted(BY_ID) == sorted(k.id for k in KINDS.values())


def test_kind_flags_match_the_native_methods():
    """rooted: the DirectGroup method takes a root; reducing: an op; per_rank: its count is per rank."""
    text = _read("cython_src/direct.pyx")
    body = text[text.index("cdef class DirectGroup"):text.index("cdef class HostFast")]
    methods = dict(re.findall(r"\n    def (\w+)\(self,([^)]*)\)", body))
    names = {"reduce_scatter": "reduce_scatter_block"}
    for kind in KINDS.values():
        params = methods[names.get(kind.name, kind.name)]
        assert kind.rooted == ("int root" in params), kind
        assert kind.reducing == ("op_code" in params), kind
        assert kind.per_rank == ("count_per_rank" in params), kind


def test_native_describes_signatures_by_the_table():
    from gpucoll.base import dtypes
    from gpucoll._native.direct import describe_signature

    for kind in KINDS.values():
        sig = kind.id << 60 | dtypes.FLOAT32 << 56 | 15 << 52 | 0xffff << 36 | 3
        assert describe_signature(sig).split()[0] == kind.name


def test_bad_stream_on_host_buffers_leaves_the_numbering_alone(gpurun_job):
    job = gpurun_job(2, "call_numbering.py", env={"GPUCOLL_DEBUG": "INFO", "GPUCOLL_DEBUG_SUBSYS": "COLL"}).check()
    res = job.json_lines()
    assert [name for name, _ in res[0]["refused"]] == ["Allreduce", "Ibcast"], res[0]
    for _, message in res[0]["refused"]:
        assert message == "stream= applies to GPU buffers only; these buffers are in host memory"
    assert res[0]["allgather"] == res[1]["allgather"] == [0, 0, 1, 1]
    calls = {}
    for rank in (0, 1):
        text = "\n".join(job.lines(rank, "stderr"))
        calls[rank] = re.findall(r"\[COLL\] (\w+ #\d+ \d+ B \w+)", text)
    assert calls[0] == calls[1] == ["allreduce #0 16 B float32", "allreduce #1 16 B float32",
                                    "allgather #2 8 B int32"], calls


@pytest.mark.parametrize("kind,count,per_rank_bytes,table_bytes", [
    ("allreduce", 10, 40, 40), ("allgather", 10, 40, 160), ("alltoall", 3, 12, 48), ("bcast", 5, 20, 20)])
def test_nbytes_is_per_rank_on_every_path(kind, count, per_rank_bytes, table_bytes):
    from gpucoll.base import dtypes
    from gpucoll.base.call import Call

    class Buf:  # a buffer as both paths see it: only where it lives differs
        def __init__(self, gpu):
            self.is_gpu, self.addr = gpu, 0

    for gpu in (False, True):
        call = Call(kind, Buf(gpu), Buf(gpu), count, dtypes.FLOAT32)
        assert call.gpu is gpu
        assert call.nbytes == per_rank_bytes
        assert call.table_bytes(4) == table_bytes


def test_allreduce_reaches_the_native_call_through_four_modules_at_most(gpurun_job):
    res = gpurun_job(2, "call_path.py").check().json_lines()
    for rank in (0, 1):
        walk = res[rank]["walk"]
        assert walk == ["gpucoll/api/comm.py", "gpucoll/dispatch/dispatcher.py", "gpucoll/engines/direct.py",
                        "cython_src/direct.pyx"], walk
        assert len(set(walk)) == len(walk) <= 4
        assert res[rank]["result"] == [4.0] * 4
        assert res[rank]["fast_calls"] == 1  # the second call: comm.py -> HostFast (direct.pyx)
