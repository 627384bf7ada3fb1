"""RDMA verbs devices: detection, and the choice of the transport between hosts.

gpucoll has no verbs data path yet, so traffic between hosts always runs over TCP; what
this module settles is what the logs and `gpucoll info` say: the devices found under
/sys/class/infiniband (name, ports and their state), and why TCP carries the traffic
(no device, GPUCOLL_IB_DISABLE=1, or a device without a verbs transport in this build)::

    from gpucoll.transports import verbs
    verbs.devices()                  # [] on a machine without RDMA hardware
    verbs.inter_host_transport()     # "tcp", logged once at INFO (subsystem NET)
"""
import os
from typing import List, NamedTuple

from ..base import config, log

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


_choice = None


def inter_host_transport(root=SYSFS):
    """The transport for traffic between hosts ("tcp"), with the reason logged once."""
    global _choice
    if _choice is None:
        found = devices(root)
        if config.IB_DISABLE.get():
            why = "GPUCOLL_IB_DISABLE=1"
        elif not found:
            why = f"no RDMA device ({root} is empty or absent)"
        else:
            why = (f"RDMA device(s) {', '.join(d.describe() for d in found)} found, but this build has no "
                   "verbs transport")
        log.info("NET", "between hosts: TCP sockets (%s)", why)
        _choice = "tcp"
    return _choice
