"""The import graph of gpucoll/ and launcher/, built from the source: no cycle, no import that
runs up the layers (docs/internals.md, "Layers"). Imports inside functions count as well.

LAYERS is the one place the order is written: top to bottom, a module may import modules of
its own layer and of the layers below it. A module belongs to the layer of the longest prefix
that names it ("=name": that module alone, not its submodules); a module that no prefix names
fails the test (place it first).
"""
import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LAYERS = [
    ("launcher", ["launcher"]),
    ("tools", ["gpucoll.bench", "gpucoll.tools", "gpucoll.mpi4py_alias"]),
    # gpucoll.MPI is the mpi4py drop-in's entry; its body is gpucoll/mpi/.
    ("API", ["gpucoll.api", "gpucoll.mpi", "=gpucoll.MPI"]),
    ("calls", ["gpucoll.calls"]),
    ("dispatch", ["gpucoll.dispatch"]),
    ("engines", ["gpucoll.engines"]),
    ("algorithms/transports/bootstrap/kernels", ["gpucoll.algorithms", "gpucoll.transports", "gpucoll.bootstrap",
                                                 "gpucoll.kernels"]),
    ("native", ["gpucoll._native"]),
    # Leaves that every layer uses (data, settings, errors), the buffer exporter that IN_PLACE derives
    # from, and `gpucoll` itself, which resolves its public names lazily through importlib.
    ("base", ["gpucoll.base", "=gpucoll._native.exporter", "=gpucoll"]),
]

_PYX_IMPORT = re.compile(r"^\s*(?:from\s+(gpucoll[\w.]*)\s+import\s+([\w, ()]+)|import\s+(gpucoll[\w.]*))", re.M)


def modules(root, packages=("gpucoll", "launcher")):
    """{module name: (path, is a package)} of the .py files, and the .pyx files as gpucoll._native.*."""
    found = {}
    for pkg in packages:
        for dirpath, _, files in os.walk(os.path.join(root, pkg)):
            for f in files:
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                if f == "__init__.py":
                    found[rel[:-len(".__init__")]] = (path, True)
                elif f.endswith(".py"):
                    found[rel] = (path, False)
    pyx = os.path.join(root, "cython_src")
    if os.path.isdir(pyx):
        for f in os.listdir(pyx):
            if f.endswith(".pyx"):
                found[f"gpucoll._native.{f[:-4]}"] = (os.path.join(pyx, f), False)
    return found


def _target(base, names, known):
    """What `from base import names` imports: the submodules among names, else base itself."""
    out = [f"{base}.{n}" for n in names if f"{base}.{n}" in known]
    return out if len(out) == len(names) else out + [base]


def imports(name, path, is_pkg, known):
    """The project modules that module `name` imports, anywhere in its source."""
    with open(path) as f:
        text = f.read()
    found = set()
    if path.endswith(".pyx"):
        for frm, names, plain in _PYX_IMPORT.findall(text):
            if plain:
                found.add(plain)
            else:
                found.update(_target(frm, [n.strip(" ()") for n in names.split(",") if n.strip(" ()")], known))
        return {m for m in found if m in known}
    package = name if is_pkg else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(text, path)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module
            found.update(_target(base, [a.name for a in node.names], known))
    return {m for m in found if m in known and m != name}


def layer_of(module):
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            exact = p.startswith("=")
            p = p.lstrip("=")
            named = module == p or (not exact and module.startswith(p + "."))
            if named and (best is None or len(p) > len(best[1])):
                best = (index, p)
    return None if best is None else best[0]


def graph(root):
    known = modules(root)
    return {name: imports(name, path, is_pkg, known) for name, (path, is_pkg) in known.items()}


def cycles(edges):
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def problems(root):
    """(modules no layer names, upward imports as 'a (layer) -> b (layer)', disallowed cycles)."""
    edges = graph(root)
    unplaced = sorted(m for m in edges if layer_of(m) is None)
    upward = sorted(f"{a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})"
                    for a, targets in edges.items() for b in targets
                    if layer_of(a) is not None and layer_of(b) is not None and layer_of(b) < layer_of(a))
    loops = [sorted(c) for c in cycles(edges)]
    return unplaced, upward, loops


def test_no_cycle_and_no_upward_import():
    unplaced, upward, loops = problems(ROOT)
    assert unplaced == [], f"modules that no layer names (add them to LAYERS): {unplaced}"
    assert upward == [], "imports that run up the layers:\n" + "\n".join(upward)
    assert loops == [], f"import cycles: {loops}"


def test_the_checker_finds_a_cycle_a_lazy_upward_import_and_an_unplaced_module(tmp_path):
    pkg = tmp_path / "gpucoll"
    (pkg / "engines").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "engines" / "__init__.py").write_text("")
    (pkg / "dispatch.py").write_text("from .engines import direct\n")
    (pkg / "engines" / "direct.py").write_text("def f():\n    from .. import dispatch\n")  # lazy, upward
    (pkg / "base").mkdir()
    (pkg / "base" / "__init__.py").write_text("")
    (pkg / "base" / "config.py").write_text("from . import log\n")
    (pkg / "base" / "log.py").write_text("from .config import X\n")  # a cycle within one layer
    (pkg / "newthing.py").write_text("")
    unplaced, upward, loops = problems(str(tmp_path))
    assert unplaced == ["gpucoll.newthing"]
    assert upward == ["gpucoll.engines.direct (engines) -> gpucoll.dispatch (dispatch)"]
    assert sorted(map(sorted, loops)) == [["gpucoll.base.config", "gpucoll.base.log"],
                                         ["gpucoll.dispatch", "gpucoll.engines.direct"]]
