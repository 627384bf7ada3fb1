"""Every name of mpi4py.MPI exists in gpucoll.MPI, as mpi4py has it: the module's names, each
class's members, the integer constants' values (mpi4py's on Open MPI), the kinds of the predefined
objects. What gpucoll does not provide is a stub raising NotImplementedError that names the
feature when called: never an AttributeError.

mpi4py's names are read from the installed mpi4py (the [test] extra) without initialising MPI."""
import inspect
import json
import os
import subprocess
import sys

import pytest

from gpucoll import MPI
from gpucoll.mpi import unsupported

_DUMP = r"""
import json, mpi4py
mpi4py.rc.initialize = mpi4py.rc.finalize = False
from mpi4py import MPI
out = {"version": mpi4py.__version__, "ints": {}, "objects": {}, "classes": {}, "functions": []}
for name in dir(MPI):
    if name.startswith("__"):
        continue
    value = getattr(MPI, name)
    if isinstance(value, type):
        out["classes"][name] = sorted(m for m in dir(value) if not m.startswith("__"))
    elif type(value) is int:
        out["ints"][name] = value
    elif callable(value) and not hasattr(value, "Get_size") and type(value).__name__.endswith("function_or_method"):
        out["functions"].append(name)
    else:
        out["objects"][name] = type(value).__name__
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def mpi4py_names():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("needs mpi4py (pip install '.[test]')")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run([sys.executable, "-c", _DUMP], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_every_module_name_exists(mpi4py_names):
    names = {*mpi4py_names["ints"], *mpi4py_names["objects"], *mpi4py_names["classes"], *mpi4py_names["functions"]}
    # COMM_WORLD and COMM_SELF join the job when first used: dir() lists them, access is not tried here
    missing = sorted(n for n in names if n not in dir(MPI) or n not in ("COMM_WORLD", "COMM_SELF")
                     and not _has(MPI, n))
    assert missing == []


def _has(obj, name):
    try:
        getattr(obj, name)
        return True
    except AttributeError:
        return False


def test_integer_constants_have_mpi4pys_values(mpi4py_names):
    wrong = {n: (getattr(MPI, n), v) for n, v in mpi4py_names["ints"].items() if getattr(MPI, n) != v}
    assert wrong == {}


def test_predefined_objects_are_of_mpi4pys_classes(mpi4py_names):
    differ = {}
    for name, kind in mpi4py_names["objects"].items():
        if name in ("COMM_WORLD", "COMM_SELF") or kind in ("BottomType", "InPlaceType", "BufferAutomaticType"):
            continue
        mine = type(getattr(MPI, name)).__name__
        if mine != kind and not (kind == "dict" and isinstance(getattr(MPI, name), dict)):
            differ[name] = (mine, kind)
    assert differ == {}


def test_every_class_has_every_member(mpi4py_names):
    missing = {}
    for cls, members in mpi4py_names["classes"].items():
        gone = [m for m in members if not hasattr(getattr(MPI, cls), m)]
        if gone:
            missing[cls] = gone
    assert missing == {}


def test_unsupported_names_raise_not_implemented_naming_the_feature_when_called():
    checked = 0
    for feature, names in unsupported.unsupported_names():
        for name in names:
            owner, _, member = name.rpartition(".")
            holder = getattr(MPI, owner) if owner else MPI
            stub = inspect.getattr_static(holder, member)
            marked = stub.fget if isinstance(stub, property) else stub
            assert getattr(marked, "unsupported_feature", None) == feature, name  # installed, not shadowed
            call = (lambda s=stub: s.fget(None)) if isinstance(stub, property) else stub
            with pytest.raises(NotImplementedError) as info:
                call()
            assert feature in str(info.value) and f"gpucoll.MPI.{name}" in str(info.value)
            checked += 1
    assert checked >= 15  # spawn, Revoke, Intercomm's reduce-scatter, ...


def test_attribute_access_never_refuses_an_mpi4py_name():
    # classes and methods of missing features exist: only calling them raises
    assert MPI.Win and MPI.File and MPI.Session and MPI.Cartcomm and MPI.Intercomm
    assert callable(MPI.Intracomm.Create_cart) and callable(MPI.Win.Allocate) and callable(MPI.Open_port)
    with pytest.raises(AttributeError, match="not an mpi4py.MPI name"):
        MPI.NO_SUCH_NAME


def test_address_constants_are_int_like_empty_buffers_as_mpi4pys():
    import pickle

    import gpucoll

    assert MPI.IN_PLACE is gpucoll.IN_PLACE  # one object for both APIs: every layer tests it with `is`
    for name, address in (("BOTTOM", 0), ("IN_PLACE", -1), ("BUFFER_AUTOMATIC", -2)):
        constant = getattr(MPI, name)
        assert constant == address and not constant != address and constant != None  # noqa: E711
        assert int(constant) == address and hash(constant) == hash(address) and bool(constant) == bool(address)
        assert type(constant)() == constant and repr(constant) == name
        view = memoryview(constant)
        assert view.nbytes == 0 and view.obj is None
        assert MPI.Get_address(constant) == address
        assert pickle.loads(pickle.dumps(constant)) is constant
        with pytest.raises(TypeError):
            constant + 1
    assert [1, 2][MPI.BOTTOM] == 1  # BOTTOM alone is an index, as in mpi4py


def test_contiguous_type_beyond_int_max_is_built_as_on_mpi_3_without_typemap():
    int_max = 2**31 - 1
    count = int_max + 5
    t = MPI.BYTE.Create_contiguous(count)
    assert (t.size, t.extent) == (count, count)
    base, combiner, params = t.decode()
    assert (base, combiner, params["blocklengths"], params["displacements"]) == (MPI.DATATYPE_NULL, "STRUCT",
                                                                                 [1, 1], [0, int_max])
    whole, rest = params["datatypes"]
    assert whole.decode()[1:] == ("VECTOR", {"count": 1, "blocklength": int_max, "stride": int_max})
    assert (whole.size, rest.size) == (int_max, 5)
    small = MPI.BYTE.Create_contiguous(int_max)  # up to INT_MAX: one contiguous type
    assert small.decode()[1:] == ("CONTIGUOUS", {"count": int_max})
    for x in (t, whole, rest, small):
        x.Free()
