"""Slurm hostlist expressions: `node[01-04,07],gpu-a` -> node01 node02 node03 node04 node07 gpu-a.

Supports several bracket groups in one name (`rack[1-2]-n[1-3]`), zero padding
kept from the range's lower bound, and commas both between names and inside brackets.
"""
import itertools
import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top_level(expr):
    """Split at commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {expr!r}")
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in hostlist {expr!r}")
    parts.append(expr[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_ranges(body, expr):
    values = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise ValueError(f"bad range {item!r} in hostlist {expr!r}")
        low, high = m.group(1), m.group(2) or m.group(1)
        if int(high) < int(low):
            raise ValueError(f"descending range {item!r} in hostlist {expr!r}")
        width = len(low)
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


def _expand_one(name, expr):
    # Pieces alternate literal text and bracket bodies: "rack", "1-2", "-n", "1-3", "".
    pieces = re.split(r"\[([^\]]*)\]", name)
    choices = []
    for i, piece in enumerate(pieces):
        choices.append(_expand_ranges(piece, expr) if i % 2 else [piece])
    return ["".join(combo) for combo in itertools.product(*choices)]


def expand(expr):
    """All host names of a Slurm hostlist expression, in order."""
    hosts = []
    for name in _split_top_level(expr or ""):
        hosts.extend(_expand_one(name, expr))
    return hosts


def expand_tasks_per_node(expr):
    """SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE: `2(x3),1` -> [2, 2, 2, 1]."""
    counts = []
    for item in (expr or "").split(","):
        item = item.strip()
        if not item:
            continue
        m = re.match(r"^(\d+)(?:\(x(\d+)\))?$", item)
        if not m:
            raise ValueError(f"bad tasks-per-node expression {expr!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts
