"""Mutation check: each mutant switches one feature off, and the tests that claim the feature
must then fail. `make test-mutants` runs it; it exits non-zero when a mutant survives.

    python tests/mutants/run.py                 # every mutant of tests/mutants/mutants.ini
    python tests/mutants/run.py --only group-noop --keep

The repository (with its built extensions) is copied to a scratch folder once, and every
test runs there with that copy first on PYTHONPATH (checked before anything runs). The
claimed tests must pass on the unchanged copy first (the baseline: a test that already fails
proves nothing). Then, per mutant: its one replacement is made in the copy, the extensions
are rebuilt when the change is native (cython_src/, compiled at -O0 to keep it quick), the
claimed tests run (stopping at the first failure), and the copy is restored. A mutant is
caught when a claimed test fails (or its run times out); it survives when they all pass.
A mutant whose text is not found exactly once, or that does not compile, is an error: the
mutant list has to follow the code it mutates.
"""
import argparse
import configparser
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MUTANTS = os.path.join(HERE, "mutants.ini")
FIELDS = ("what", "file", "find", "replace", "tests")
# Not copied: version control, environments, caches, build trees.
SKIP = shutil.ignore_patterns(".git", ".venv", ".venv-*", "build", "__pycache__", ".pytest_cache", ".hypothesis",
                              "*.egg-info", ".whl", "bench-results", ".gl")
BUILT = ("gpucoll/_native/*.so", "cython_src/*.c")  # what a native mutant's rebuild overwrites


class Mutant:
    def __init__(self, name, section):
        missing = [f for f in FIELDS if not section.get(f, "").strip()]
        if missing:
            raise SystemExit(f"{MUTANTS}: mutant [{name}] lacks {', '.join(missing)}")
        self.name = name
        self.what = section["what"].strip()
        self.file = section["file"].strip()
        self.find = section["find"].strip()
        self.replace = section["replace"].strip()
        self.tests = shlex.split(section["tests"])
        self.native = self.file.startswith("cython_src/")


def load(path=MUTANTS):
    parser = configparser.ConfigParser(interpolation=None, comment_prefixes=("#",), inline_comment_prefixes=None)
    parser.optionxform = str
    with open(path) as f:
        parser.read_file(f)
    return [Mutant(name, parser[name]) for name in parser.sections()]


def copy_repo(scratch):
    """The working tree (built extensions included, modification times kept) in `scratch`."""
    shutil.copytree(ROOT, scratch, ignore=SKIP, symlinks=True, dirs_exist_ok=True)
    # gpucoll.launcher is the launcher/ folder, mapped by the installed package: map it here too.
    os.symlink(os.path.join("..", "launcher"), os.path.join(scratch, "gpucoll", "launcher"))
    # Native mutants rebuild at -O0: the same code, compiled in seconds rather than a minute.
    setup = os.path.join(scratch, "setup.py")
    with open(setup) as f:
        text = f.read()
    with open(setup, "w") as f:
        f.write(text.replace('"-O3"', '"-O0"'))


def environment(scratch):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([scratch] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_imports(scratch, env):
    """Every test must import the scratch copy, not the installed package."""
    code = ("import gpucoll, gpucoll.launcher, gpucoll._native.core, gpucoll._native.direct\n"
            "for m in (gpucoll, gpucoll.launcher, gpucoll._native.core, gpucoll._native.direct): print(m.__file__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=scratch, env=env, capture_output=True, text=True)
    paths = out.stdout.split()
    real = os.path.realpath(scratch)
    if out.returncode or len(paths) != 4 or not all(os.path.realpath(p).startswith(real + os.sep) for p in paths):
        raise SystemExit(f"the scratch copy is not what Python imports:\n{out.stdout}{out.stderr}")


def run_tests(scratch, env, tests, timeout, show=False):
    """(outcome, detail): 'passed', 'failed' with the first failing test and its first error
    line, 'timeout', or 'error'."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--tb=short", "-rfEs", *tests]
    try:
        out = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", f"no result within {timeout} s"
    text = out.stdout + out.stderr
    if show:
        print(text[-6000:], flush=True)
    if out.returncode == 0:
        skipped = re.search(r"(\d+) skipped", text)
        return "passed", f"{skipped.group(1)} skipped" if skipped else ""
    if out.returncode == 1:
        failed = re.search(r"^(?:FAILED|ERROR) (\S+)", text, re.M)
        where = failed.group(1).split("::")[-1] if failed else "a claimed test"
        return "failed", f"{where}: {_why(text)}"[:240]
    return "error", f"pytest exit code {out.returncode}: {text.strip()[-600:]}"


def _why(text):
    """The line that says why the first failing test failed: a rank's exception when the job
    failed (the assertion then only shows the command line), else the assertion."""
    lines = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    for line in lines:
        if re.match(r"\[\d+\] [\w.]*(Error|Exception|Interrupt)\b", line):
            return line
    for line in lines:
        if line.startswith(("exit code", "gpurun: ")) and not line.startswith("exit code 0 "):
            return line
    return lines[0] if lines else "failed"


def build(scratch, env):
    out = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=scratch, env=env,
                         capture_output=True, text=True)
    return out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


def try_mutant(m, scratch, env, timeout, show=False):
    """(result, detail) for one mutant; the scratch copy is as it was afterwards."""
    path = os.path.join(scratch, m.file)
    if not os.path.isfile(path):
        return "error", f"{m.file} does not exist"
    with open(path) as f:
        original = f.read()
    found = original.count(m.find)
    if found != 1:
        return "error", f"the text to replace occurs {found} times in {m.file} (must be once): {m.find!r}"
    stat = os.stat(path)
    saved = tempfile.mkdtemp(prefix="saved-", dir=os.path.dirname(scratch))
    built = [p for pattern in BUILT for p in glob.glob(os.path.join(scratch, pattern))] if m.native else []
    for p in built:
        shutil.copy2(p, os.path.join(saved, os.path.relpath(p, scratch).replace(os.sep, "__")))
    try:
        mutated = original.replace(m.find, m.replace)
        with open(path, "w") as f:
            f.write(mutated)
        if path.endswith(".py"):
            try:
                compile(mutated, path, "exec")
            except SyntaxError as exc:
                return "error", f"the mutant does not compile: {exc}"
        if m.native:
            ok, log = build(scratch, env)
            if not ok:
                return "error", f"the mutant does not build:\n{log}"
        outcome, detail = run_tests(scratch, env, m.tests, timeout, show)
    finally:
        with open(path, "w") as f:
            f.write(original)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        for p in built:
            shutil.copy2(os.path.join(saved, os.path.relpath(p, scratch).replace(os.sep, "__")), p)
        shutil.rmtree(saved, ignore_errors=True)
    if outcome in ("failed", "timeout"):
        return "caught", detail
    if outcome == "passed":
        return "SURVIVED", f"every claimed test passed{' (' + detail + ')' if detail else ''}"
    return "error", detail


def table(rows):
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for i, (name, result, detail) in enumerate(rows):
        lines.append(f"{name:<{widths[0]}}  {result:<{widths[1]}}  {detail}")
        if i == 0:
            lines.append(f"{'-' * widths[0]}  {'-' * widths[1]}  {'-' * min(widths[2], 60)}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run these mutants only")
    ap.add_argument("--list", action="store_true", help="print the mutants and the tests that claim them")
    ap.add_argument("--keep", action="store_true", help="keep the scratch copy (its path is printed)")
    ap.add_argument("--no-baseline", action="store_true", help="skip running the claimed tests unchanged first")
    ap.add_argument("--show", action="store_true", help="print the end of each mutant's test output")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for one mutant's tests (default 300)")
    args = ap.parse_args(argv)
    mutants = load()
    if args.only:
        unknown = set(args.only) - {m.name for m in mutants}
        if unknown:
            raise SystemExit(f"no such mutant: {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.name in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.name}: {m.what}\n    {m.file}\n    tests: {' '.join(m.tests)}")
        return 0
    start = time.monotonic()
    scratch = tempfile.mkdtemp(prefix="gpucoll-mutants-")
    try:
        copy_repo(scratch)
        env = environment(scratch)
        check_imports(scratch, env)
        if not args.no_baseline:
            # One run of every claimed test; a claim with options (-k EXPR) runs on its own, since
            # pytest applies such an option to every path of its command line
            optioned = lambda m: any(t.startswith("-") for t in m.tests)  # noqa: E731
            plain = list(dict.fromkeys(t for m in mutants if not optioned(m) for t in m.tests))
            runs = ([plain] if plain else []) + [list(t) for t in dict.fromkeys(tuple(m.tests) for m in mutants
                                                                               if optioned(m))]
            for claimed in runs:
                outcome, detail = run_tests(scratch, env, claimed, args.timeout * 3)
                if outcome != "passed":
                    print(f"the claimed tests do not pass without a mutant ({outcome}): {detail}", file=sys.stderr)
                    return 1
            print(f"baseline: the claimed tests pass unchanged ({time.monotonic() - start:.0f} s)", flush=True)
        rows = [("mutant", "result", "the failure that caught it")]
        for m in mutants:
            t0 = time.monotonic()
            result, detail = try_mutant(m, scratch, env, args.timeout, args.show)
            rows.append((m.name, result, detail))
            print(f"{m.name}: {result} in {time.monotonic() - t0:.0f} s", flush=True)
        print()
        print(table(rows))
        bad = [name for name, result, _ in rows[1:] if result != "caught"]
        print(f"\n{len(rows) - 1 - len(bad)} of {len(rows) - 1} mutants caught in {time.monotonic() - start:.0f} s"
              + (f"; not caught: {', '.join(bad)}" if bad else ""))
        return 1 if bad else 0
    finally:
        if args.keep:
            print(f"scratch copy kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
