"""The transport between hosts, chosen once per process: libfabric (OFI) or gpucoll's TCP sockets.

GPUCOLL_NET=auto takes OFI when libfabric has a hardware provider (verbs, efa, cxi, psm3, ...)
and TCP otherwise; =ofi takes OFI whatever it runs on (libfabric's tcp provider where there is no
hardware: the tested path); =tcp never loads libfabric. The choice and its reason are logged
once (subsystem NET) and shown by `gpucoll info`::

    from gpucoll.transports import net
    net.between_hosts()      # Choice(name='tcp', provider=None, why='no hardware provider ...')
    chan, how = net.channel(ctx, peer, "world/coll", timeout=60)
"""
import os
import threading
from typing import NamedTuple, Optional

from ..base import config, log
from ..base.errors import ConfigError, InvalidUsageError

# providers that are software over IP (or only within a host): never picked by GPUCOLL_NET=auto
SOFTWARE = frozenset({"tcp", "udp", "sockets", "shm", "net", "sm2"})
FALLBACK_PROVIDER = "tcp;ofi_rxm"
CXI_SYSFS = "/sys/class/cxi"


class Choice(NamedTuple):
    name: str                 # "ofi" or "tcp"
    provider: Optional[str]   # the libfabric provider (OFI only)
    why: str

    @property
    def hardware(self):
        return self.name == "ofi" and not is_software(self.provider)

    @property
    def link(self):
        """The cost table's link (algorithms/selector.py): RDMA figures only on hardware."""
        return "ofi" if self.hardware else "tcp"

    @property
    def label(self):
        return self.name.upper()


def is_software(provider):
    return (provider or "").split(";")[0] in SOFTWARE


def ofi_module():
    """gpucoll._native.ofi with libfabric loaded, or raise ImportError / OfiUnavailable saying why."""
    try:
        from .._native import ofi
    except ImportError:
        raise ImportError("this build of gpucoll has no OFI transport: libfabric's headers were absent when it "
                          "was built (install libfabric-dev, then reinstall gpucoll)") from None
    ofi.load()
    return ofi


def _choose():
    mode = config.NET.get()
    if mode == "tcp":
        return Choice("tcp", None, "GPUCOLL_NET=tcp")
    if mode == "auto" and config.IB_DISABLE.get():
        return Choice("tcp", None, "GPUCOLL_IB_DISABLE=1")
    if not config.OFI_PROVIDER.get() and not _rdma_hardware():
        # loading libfabric costs a few tenths of a second: not for nothing (the endpoint loads it
        # when a first channel needs it, and says then if it cannot)
        if mode == "auto":
            return Choice("tcp", None, _no_ofi_reason(""))
        return Choice("ofi", FALLBACK_PROVIDER, f"GPUCOLL_NET=ofi and no RDMA device: libfabric's {FALLBACK_PROVIDER}")
    try:
        ofi = ofi_module()
    except Exception as exc:  # ImportError, OfiUnavailable
        if mode == "ofi":
            raise ConfigError(f"GPUCOLL_NET=ofi: {exc}. Set GPUCOLL_NET=tcp or auto to use sockets.") from None
        return Choice("tcp", None, _no_ofi_reason(str(exc)))
    try:
        found = ofi.interfaces()
    except ofi.OfiUnavailable:
        found = []
    names = sorted({f[0] for f in found})
    provider = config.OFI_PROVIDER.get()
    if provider:
        try:
            mine = ofi.interfaces(provider)
        except ofi.OfiUnavailable:
            mine = []
        if not mine:
            raise InvalidUsageError(f"{config.OFI_PROVIDER.name}={provider!r}: libfabric offers no such provider "
                                    f"with tagged messages and RMA reads here; it offers {', '.join(names) or 'none'}. "
                                    "Name one of those, or unset it.")
        choice = Choice("ofi", provider, f"{config.OFI_PROVIDER.name}={provider}")
    else:
        hardware = [f for f in found if not is_software(f[0])]
        if hardware:
            prov, _, domain, _ = hardware[0]
            choice = Choice("ofi", prov, f"hardware provider {prov} on {domain}")
        elif mode == "ofi":
            choice = Choice("ofi", FALLBACK_PROVIDER,
                            f"GPUCOLL_NET=ofi and no hardware provider: libfabric's {FALLBACK_PROVIDER}")
        else:
            return Choice("tcp", None, _no_ofi_reason(f"libfabric has no hardware provider (found: "
                                                       f"{', '.join(names) or 'none'})"))
    try:  # a provider can be listed and still fail to open (a port down, no permission on the device)
        ofi.OfiDomain(choice.provider, None, ofi.MR_VERBS).close()
    except ofi.OfiUnavailable as exc:
        if mode == "ofi":
            raise ConfigError(f"GPUCOLL_NET=ofi: libfabric's {choice.provider} does not open: {exc}. Set "
                              "GPUCOLL_NET=tcp or auto to use sockets.") from None
        return Choice("tcp", None, f"libfabric's {choice.provider} did not open ({exc})")
    return choice


def _rdma_hardware():
    """Whether the kernel shows a device an RDMA provider could drive (verbs, efa, psm3 and opx under
    /sys/class/infiniband; HPE Slingshot's cxi under /sys/class/cxi)."""
    from .verbs import devices

    return bool(devices()) or os.path.isdir(CXI_SYSFS)


def _no_ofi_reason(why):
    from .verbs import SYSFS, devices

    found = devices()
    if not found:
        return f"no RDMA device ({SYSFS} is empty or absent)"
    return f"RDMA device(s) {', '.join(d.describe() for d in found)} found, but {why}"


_choice = None
_lock = threading.Lock()


def between_hosts():
    """The Choice for traffic between hosts, made and logged once per process."""
    global _choice
    with _lock:
        if _choice is None:
            choice = _choose()
            if choice.name == "tcp":
                log.info("NET", "between hosts: TCP sockets (%s)", choice.why)
            else:
                log.info("NET", "between hosts: OFI provider %s (%s)", choice.provider, choice.why)
            _choice = choice
        return _choice


def channel(ctx, world_peer, comm_id, timeout, check=None, nsocks=None):
    """(channel, how) to `world_peer` on another host, for communicator `comm_id`."""
    choice = between_hosts()
    address = ctx.tcp_addresses[world_peer]
    if choice.name == "ofi":
        return ctx.ofi().channel(world_peer, address, comm_id, timeout=timeout, check=check), f"OFI {choice.provider}"
    chan = ctx.tcp().channel(world_peer, address, comm_id=comm_id, nsocks=nsocks, timeout=timeout, check=check)
    return chan, f"TCP x{chan.nsocks}"
