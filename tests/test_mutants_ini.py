"""tests/mutants/mutants.ini stays in step with the code: each mutant's text occurs exactly once
in its file and each test it names exists, so a change that moves the text is caught here in
seconds rather than by `make test-mutants` (where such a mutant is an error)."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "mutants"))
import run as mutants  # noqa: E402

MUTANTS = mutants.load()


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_each_mutant_finds_its_text_once_and_names_tests_that_exist(mutant):
    with open(os.path.join(ROOT, mutant.file)) as f:
        found = f.read().count(mutant.find)
    assert found == 1, f"[{mutant.name}]: {mutant.find!r} occurs {found} times in {mutant.file}"
    paths = [arg.split("::")[0] for arg in mutant.tests if arg.split("::")[0].endswith(".py")]
    assert paths, f"[{mutant.name}] names no test file: {mutant.tests}"
    for path in paths:
        assert os.path.exists(os.path.join(ROOT, path)), f"[{mutant.name}]: {path} does not exist"
