"""Rank lists in words, the one format of every message that names ranks."""


def ranges(ranks):
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'; [] -> 'none'."""
    ranks = sorted(ranks)
    if not ranks:
        return "none"
    parts, start = [], ranks[0]
    for prev, cur in zip(ranks, ranks[1:] + [None]):
        if cur is None or cur != prev + 1:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ", ".join(parts)
