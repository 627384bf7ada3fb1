"""Byte sizes as nccl-tests takes them: '8', '1K', '64M', '1G' (binary units), and the
geometric sweep -b MIN -e MAX -f FACTOR.

    >>> parse_size("64M"), sweep(8, 1024, 4)
    (67108864, [8, 32, 128, 512])
"""
import re

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text):
    """'8', '1K', '4KiB', '64M', '1G' -> bytes; ValueError with the reason otherwise."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size: use a byte count with an optional K, M or G suffix, such as 8, 1K or 64M")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def sweep(min_bytes, max_bytes, factor):
    """min, min*factor, ... up to max (inclusive); a factor of 1 measures min only."""
    if min_bytes > max_bytes:
        raise ValueError(f"the minimum size ({min_bytes} B) is larger than the maximum ({max_bytes} B)")
    if factor < 1:
        raise ValueError(f"the factor must be at least 1, not {factor}")
    if factor == 1 or min_bytes == 0:
        return [min_bytes]
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= factor
    return out


def element_count(nbytes, itemsize, multiple):
    """Elements for a buffer of about nbytes: a whole number of items, rounded down to a
    multiple of `multiple` (the rank count for the collectives that split the buffer into
    one block per rank), and never fewer than `multiple`."""
    count = nbytes // itemsize
    return max(multiple, count - count % multiple)


def human(nbytes):
    """64 MiB -> '64M' (for messages and JSON labels)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)
