"""The documentation holds together: every relative link in README.md and docs/*.md reaches a
file, every #anchor a heading of it (GitHub's rules); the README stays short (400 lines at
most); and every public name the README shows (`gpucoll.X`, `from gpucoll import X`,
`from gpucoll.MPI import X`, `MPI.X`, `comm.X(...)`) exists. Each checker is also run on a
planted mistake, so that a checker that finds nothing cannot pass."""
import glob
import importlib
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
README_MAX_LINES = 400

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFDEF = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_HTML_ID = re.compile(r"<a\s+[^>]*(?:name|id)=\"([^\"]+)\"")


def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def code_blocks(text, languages=("python", "py")):
    """The bodies of the fenced blocks whose info string names one of `languages`."""
    blocks, body, lang = [], None, None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if m and body is None:
            lang = line.strip()[3:].strip().split(" ")[0].lower()
            body = []
        elif m:
            if lang in languages:
                blocks.append("\n".join(body))
            body = None
        elif body is not None:
            body.append(line)
    return blocks


def slug(heading):
    """GitHub's anchor of a heading: inline markup dropped, lowercase, every character but
    letters, digits, '-', '_' and spaces removed, spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link counts by its text
    text = re.sub(r"<[^>]+>", "", text)                          # inline HTML tags
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text):
    """Every anchor of a Markdown text: its headings' slugs (repeats numbered -1, -2, ... as
    GitHub does) and explicit <a name=...>/<a id=...> targets."""
    seen, out = {}, set()
    for _, line in prose_lines(text):
        out.update(_HTML_ID.findall(line))
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text):
    """(line number, target) of every link outside code: inline links, images, reference
    definitions."""
    for n, line in prose_lines(text):
        line = _CODE_SPAN.sub("", line)
        for target in _LINK.findall(line):
            yield n, target
        m = _REFDEF.match(line)
        if m:
            yield n, m.group(1)


def broken_links(path):
    """The links of the Markdown file `path` that do not resolve: 'path:line: target (why)'."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    here = os.path.dirname(path)
    found = []
    for n, target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
            continue  # http:, https:, mailto:, ... are not checked here
        file_part, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(here, file_part)) if file_part else path
        where = f"{os.path.relpath(path, ROOT)}:{n}: {target}"
        if not os.path.exists(dest):
            found.append(f"{where} (no file {os.path.relpath(dest, ROOT)})")
            continue
        if anchor and os.path.isfile(dest) and dest.endswith(".md"):
            with open(dest, encoding="utf-8") as f:
                if anchor not in anchors(f.read()):
                    found.append(f"{where} (no heading #{anchor} in {os.path.relpath(dest, ROOT)})")
        elif anchor and not os.path.isfile(dest):
            found.append(f"{where} (an anchor into a folder)")
    return found


def documents():
    return [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


# --- the names the README shows ---------------------------------------------------------------
# COMM_WORLD joins a job when it is read: these are looked up in the module's dir(), never read.
NOT_READ = {("gpucoll", "COMM_WORLD"), ("gpucoll.MPI", "COMM_WORLD")}


def shown_names(text):
    """(where, name) pairs the README shows: `where` is a module ('gpucoll', 'gpucoll.MPI') or a
    class path ('gpucoll.Communicator', 'gpucoll.MPI.Intracomm') for `comm.X(...)` calls."""
    found = set()
    for block in code_blocks(text):
        for m in re.finditer(r"^[ \t]*from[ \t]+(gpucoll(?:\.MPI)?)[ \t]+import[ \t]+(?:\(([^)]*)\)|([\w \t,]+))",
                             block, re.M):
            for item in (m.group(2) or m.group(3)).split(","):
                name = item.split(" as ")[0].strip()
                if name:
                    found.add((m.group(1), name))
        found.update(("gpucoll", name) for name in re.findall(r"\bgpucoll\.(\w+)", block))
        found.update(("gpucoll.MPI", name) for name in re.findall(r"(?<![\w.])MPI\.(\w+)", block))
        origin = re.search(r"\bcomm\s*=\s*(gpucoll|MPI)\.COMM_WORLD\b", block)
        if origin:
            cls = "gpucoll.Communicator" if origin.group(1) == "gpucoll" else "gpucoll.MPI.Intracomm"
            found.update((cls, name) for name in re.findall(r"\bcomm\.(\w+)\s*\(", block))
    for _, line in prose_lines(text):
        for _, span in _CODE_SPAN.findall(line):
            found.update(("gpucoll", name) for name in re.findall(r"(?<![\w.])gpucoll\.(\w+)", span))
            found.update(("gpucoll.MPI", name) for name in re.findall(r"(?<![\w.])MPI\.(\w+)", span))
    return sorted(found)


def _resolve(dotted):
    """The object a dotted path names: modules imported, then attributes read."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[:i + 1]))
    return obj


def unresolved(pairs):
    """The pairs of shown_names() that do not exist, as 'where.name'."""
    missing = []
    for where, name in pairs:
        try:
            if (where, name) in NOT_READ:
                if name not in dir(_resolve(where)):
                    raise AttributeError(name)
                continue
            _resolve(f"{where}.{name}")
        except (ImportError, AttributeError):
            missing.append(f"{where}.{name}")
    return missing


# --- the tests --------------------------------------------------------------------------------
@pytest.mark.parametrize("doc", documents(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_and_anchor_resolves(doc):
    assert broken_links(doc) == []


def test_readme_is_at_most_400_lines():
    with open(README, encoding="utf-8") as f:
        n = len(f.read().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move detail into docs/"


def test_every_name_the_readme_shows_exists():
    with open(README, encoding="utf-8") as f:
        shown = shown_names(f.read())
    assert {("gpucoll", "COMM_WORLD"), ("gpucoll", "IN_PLACE"), ("gpucoll.MPI", "Wtime")} <= set(shown), shown
    assert unresolved(shown) == []


def test_slugs_follow_githubs_rules():
    assert slug("The launcher: gpurun") == "the-launcher-gpurun"
    assert slug("gpucoll.MPI (`gpucoll/mpi/`)") == "gpucollmpi-gpucollmpi"
    assert slug("Segment files (`transports/shm_segment.py`)") == "segment-files-transportsshm_segmentpy"
    assert slug("Start-to-exit time of a hello + barrier job") == "start-to-exit-time-of-a-hello--barrier-job"
    assert slug("See [the API](api.md), *now*") == "see-the-api-now"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1", "a-2"}


def test_the_link_checker_finds_planted_broken_links(tmp_path):
    (tmp_path / "b.md").write_text("# Title\n\n## Present heading\n")
    (tmp_path / "a.md").write_text("\n".join([
        "# Here",
        "[fine](b.md) [fine too](b.md#present-heading) [self](#here) [web](https://example.org/x)",
        "[no file](missing.md) [no heading](b.md#absent-heading) [no self heading](#nowhere)",
        "`[in code](ignored.md)`",
        "```",
        "[in a block](ignored-too.md)",
        "```",
        "[ref]: gone/away.md",
    ]) + "\n")
    found = broken_links(str(tmp_path / "a.md"))
    assert [f.split(": ", 1)[1].split(" (")[0] for f in found] == [
        "missing.md", "b.md#absent-heading", "#nowhere", "gone/away.md"], found
    assert all(":3: " in f for f in found[:3]) and ":8: " in found[3], found


def test_the_name_check_finds_planted_missing_names():
    fake = "\n".join([
        "Shown in prose: `gpucoll.IN_PLACE`, `gpucoll.NoSuchName`, `[buf, MPI.DOUBLE]`, `MPI.NOT_A_TYPE`.",
        "```python",
        "import gpucoll",
        "from gpucoll import SUM, Bogus as B",
        "from gpucoll.MPI import Intracomm, Nope",
        "comm = gpucoll.COMM_WORLD",
        "comm.Allreduce(gpucoll.IN_PLACE, x, op=gpucoll.NOT_AN_OP)",
        "comm.Allreducee(x)",
        "```",
        "```python",
        "from gpucoll import MPI",
        "comm = MPI.COMM_WORLD",
        "comm.Allreduce(MPI.IN_PLACE, [buf, MPI.DOUBLE], op=MPI.SUMM)",
        "```",
    ])
    shown = shown_names(fake)
    assert ("gpucoll", "COMM_WORLD") in shown and ("gpucoll.MPI", "COMM_WORLD") in shown  # shown, not read
    assert sorted(unresolved(shown)) == sorted([
        "gpucoll.NoSuchName", "gpucoll.MPI.NOT_A_TYPE", "gpucoll.Bogus", "gpucoll.MPI.Nope",
        "gpucoll.NOT_AN_OP", "gpucoll.Communicator.Allreducee", "gpucoll.MPI.SUMM"]), shown
