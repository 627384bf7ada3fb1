"""What this host's GPUs are and how they are linked, from nvidia-smi (no CUDA needed).

`gpus()` lists the GPUs; `links()` gives the link type of every pair (NVLink "NV<n>",
PCIe "PIX"/"PXB"/"PHB", across CPUs "SYS"/"NODE") as `nvidia-smi topo -m` reports it.
An empty list means no GPU (or no driver): gpucoll then runs on host buffers only.
"""
import re
import shutil
import subprocess

_GPU_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)")


def _smi(*args, timeout=10):
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def gpus():
    """[(index, name, uuid)] of this host's GPUs; [] without a GPU or driver."""
    text = _smi("-L")
    if not text:
        return []
    found = []
    for line in text.splitlines():
        m = _GPU_LINE.match(line.strip())
        if m:
            found.append((int(m.group(1)), m.group(2), m.group(3)))
    return found


def links():
    """{(i, j): link} for every ordered pair of GPUs, from `nvidia-smi topo -m`."""
    text = _smi("topo", "-m")
    if not text:
        return {}
    rows = [line.split() for line in text.splitlines() if line.startswith("GPU")]
    header = [c for c in (text.splitlines()[0].split()) if c.startswith("GPU")]
    table = {}
    for row in rows:
        if not row or not row[0].startswith("GPU") or not row[0][3:].isdigit():
            continue
        i = int(row[0][3:])
        for j, cell in enumerate(row[1:1 + len(header)]):
            if i != j:
                table[(i, j)] = cell
    return table


def describe():
    """Human-readable lines for `gpucoll info`."""
    found = gpus()
    if not found:
        return ["no GPU (nvidia-smi not found or no device): host buffers only"]
    lines = [f"GPU {i}: {name} ({uuid})" for i, name, uuid in found]
    table = links()
    for (i, j), link in sorted(table.items()):
        if i < j:
            kind = "NVLink" if link.startswith("NV") else "PCIe/host"
            lines.append(f"GPU {i} <-> GPU {j}: {link} ({kind})")
    return lines
