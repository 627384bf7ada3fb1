"""No module but the communicator's own reads or writes a Communicator's underscored state.

gpucoll.MPI and everything else built on a communicator use its public API and its seam
(`comm.seam`, gpucoll/api/comm.py `CommSeam`: context, id, child_id, p2p, the short paths).
The check reads the source: the underscored attributes and methods that Communicator defines
are collected from gpucoll/api/comm.py, and any `x.<that name>` elsewhere (x not `self`) in the
package, the launcher, the examples and the benchmarks is a violation. Tests may look inside.
"""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OWN = os.path.join("gpucoll", "api", "comm.py")
SCANNED = ("gpucoll", "launcher", "examples", "benchmarks")


def private_names(path):
    """The underscored (not dunder) attributes and methods of the Communicator class at path."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Communicator")
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef):
            name = node.name
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            name = node.attr
        else:
            continue
        if name.startswith("_") and not name.startswith("__"):
            names.add(name)
    return names


def violations(root, names, own=OWN, scanned=SCANNED):
    """'path:line: .name' for every use of one of `names` on something other than self."""
    out = []
    for top in scanned:
        for dirpath, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for f in sorted(files):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                if not f.endswith(".py") or rel == own:
                    continue
                with open(path) as fh:
                    tree = ast.parse(fh.read(), path)
                for node in ast.walk(tree):
                    if (isinstance(node, ast.Attribute) and node.attr in names
                            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                        out.append(f"{rel}:{node.lineno}: .{node.attr}")
    return sorted(out)


def test_nothing_outside_the_communicator_reads_its_private_state():
    names = private_names(os.path.join(ROOT, OWN))
    assert {"_ctx", "_id", "_p2p", "_children", "_short", "_dispatch"} <= names
    found = violations(ROOT, names)
    assert found == [], ("these modules reach into a Communicator's private state; use its public API "
                         "or comm.seam (gpucoll/api/comm.py CommSeam):\n" + "\n".join(found))


def test_the_checker_finds_a_planted_reach(tmp_path):
    api = tmp_path / "gpucoll" / "api"
    api.mkdir(parents=True)
    (api / "comm.py").write_text("class Communicator:\n    def __init__(self):\n        self._ctx = 1\n"
                                 "    def _send_short(self):\n        return self._ctx\n")
    (tmp_path / "gpucoll" / "mpi").mkdir()
    (tmp_path / "gpucoll" / "mpi" / "comm.py").write_text(
        "def f(core):\n    core.seam.context\n    core._ctx\n    return core._send_short()\n")
    (tmp_path / "gpucoll" / "other.py").write_text("class A:\n    def g(self):\n        return self._ctx\n")
    names = private_names(str(api / "comm.py"))
    assert names == {"_ctx", "_send_short"}
    assert violations(str(tmp_path), names) == [os.path.join("gpucoll", "mpi", "comm.py") + ":3: ._ctx",
                                                os.path.join("gpucoll", "mpi", "comm.py") + ":4: ._send_short"]
