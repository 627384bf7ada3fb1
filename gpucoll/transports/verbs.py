"""RDMA devices the kernel exposes under /sys/class/infiniband (name, ports and their state):
what `gpucoll info` and the reason for the transport between hosts (net.py) say about the
hardware. The data path over them is libfabric's (ofi.py)::

    from gpucoll.transports import verbs
    verbs.devices()                  # [] on a machine without RDMA hardware
"""
import os
from typing import List, NamedTuple


SYSFS = "/sys/class/infiniband"


class Device(NamedTuple):
    name: str
    ports: tuple      # (port number, state text such as "4: ACTIVE", link layer)

    def describe(self):
        ports = ", ".join(f"port {n} {state} {layer}".strip() for n, state, layer in self.ports) or "no ports"
        return f"{self.name} ({ports})"


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def devices(root=SYSFS) -> List[Device]:
    """The RDMA devices the kernel exposes (empty when there are none or no sysfs)."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    found = []
    for name in names:
        ports_dir = os.path.join(root, name, "ports")
        ports = []
        for port in sorted(os.listdir(ports_dir)) if os.path.isdir(ports_dir) else []:
            base = os.path.join(ports_dir, port)
            ports.append((port, _read(os.path.join(base, "state")), _read(os.path.join(base, "link_layer"))))
        found.append(Device(name, tuple(ports)))
    return found
