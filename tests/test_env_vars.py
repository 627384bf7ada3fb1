"""Every GPUCOLL_* name the project uses is declared in gpucoll/base/config.py, documented in
docs/environment.md (made from the declarations, and compared with them whole), and read through
its declaration somewhere; the variables gpurun sets for its ranks are those declared as its own.
Each checker also runs on a planted mistake, so that a checker that finds nothing cannot pass."""
import os
import re

from gpucoll.base import config
from gpucoll.launcher import env as launcher_env
from gpucoll.tools import envdoc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where a GPUCOLL_* name may be written.
SCANNED = ("gpucoll", "launcher", "cython_src", "examples", "benchmarks", "scripts", "Makefile", "tests",
           "docs", "README.md")
# Where a setting is read: the package, the launcher, and the test suite (its own variable).
READERS = ("gpucoll", "launcher", os.path.join("tests", "conftest.py"))
# Names written on purpose without a declaration, and why.
UNDECLARED_ON_PURPOSE = {
    "GPUCOLL_TIMEOUTT": "the typo that the unknown-variable warning must catch (test_config, test_readme_claims)",
    "GPUCOLL_PLANTED_TYPO": "planted by this file's test of the checker",
}
_NAME = re.compile(r"\bGPUCOLL_[A-Z0-9_]*[A-Z0-9]")


def _files(root, paths):
    for path in paths:
        top = os.path.join(root, path)
        if os.path.isfile(top):
            yield top
        for dirpath, dirnames, files in os.walk(top):
            dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
            for f in files:
                yield os.path.join(dirpath, f)


def _text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:  # a built extension, an image
        return ""


def undeclared(root, declared, on_purpose=UNDECLARED_ON_PURPOSE):
    """{GPUCOLL_* name that no declaration names: [files that write it, relative to root]}."""
    found = {}
    for path in _files(root, SCANNED):
        for name in set(_NAME.findall(_text(path))) - set(declared) - set(on_purpose):
            found.setdefault(name, []).append(os.path.relpath(path, root))
    return {name: sorted(files) for name, files in found.items()}


def unread(root, attributes):
    """The names of the declared variables ({config attribute: name}) that no reader gets
    through its declaration (config.X.get(), .raw() or .is_set())."""
    text = "\n".join(_text(p) for p in _files(root, READERS) if p.endswith((".py", ".pyx")))
    return sorted(name for attr, name in attributes.items()
                  if not re.search(rf"\bconfig\.{attr}\.(get|raw|is_set)\(", text))


def declarations():
    """{config attribute: variable name} of every declaration."""
    return {attr: var.name for attr, var in vars(config).items() if isinstance(var, config.Var)}


def test_every_declaration_is_bound_to_one_name():
    assert sorted(declarations().values()) == sorted(var.name for var in config.ALL)


def test_every_name_written_is_declared():
    assert undeclared(ROOT, declarations().values()) == {}, \
        "declare these in gpucoll/base/config.py (then make docs-environment), or stop writing them"


def test_every_declared_variable_is_read():
    assert unread(ROOT, declarations()) == [], "read these through config, or remove their declarations"


def test_docs_environment_is_made_from_the_declarations():
    with open(os.path.join(ROOT, "docs", "environment.md")) as f:
        text = f.read()
    assert text == envdoc.page(), "docs/environment.md differs from the declarations: make docs-environment"
    assert all(f"`{var.name}`" in text for var in config.ALL)


def test_gpurun_sets_the_variables_declared_as_its_own():
    common = launcher_env.common_environ({}, 4, 2, "node1", 29500, "00" * 16, "job", "continue")
    spawned = launcher_env.rank_environ(common, 3, 1, {}, spawn=(2, 8))
    replacement = launcher_env.rank_environ(common, 0, 0, {}, replaces=(2, 9))
    assert {k for k in (*spawned, *replacement) if k.startswith("GPUCOLL_")} == \
        {var.name for var in config.ALL if var.launcher}


def test_the_checkers_find_a_planted_name_and_an_unread_declaration(tmp_path):
    (tmp_path / "gpucoll").mkdir()
    (tmp_path / "gpucoll" / "reader.py").write_text("import os\nos.environ.get('GPUCOLL_PLANTED_TYPO')\n"
                                                    "config.TIMEOUT.get()\n")
    (tmp_path / "Makefile").write_text("test:\n\tGPUCOLL_TIMEOUT=5 pytest\n")
    declared = {"TIMEOUT": "GPUCOLL_TIMEOUT", "NSOCKS": "GPUCOLL_NSOCKS"}
    assert undeclared(str(tmp_path), declared.values(), on_purpose={}) == {
        "GPUCOLL_PLANTED_TYPO": [os.path.join("gpucoll", "reader.py")]}
    assert unread(str(tmp_path), declared) == ["GPUCOLL_NSOCKS"]
