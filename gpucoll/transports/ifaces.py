"""Network interfaces and the choice of the one sockets bind to (GPUCOLL_SOCKET_IFNAME).

The rules follow NCCL_SOCKET_IFNAME: a comma-separated list of name prefixes (``eth,ens``);
a leading ``^`` excludes the listed ones instead (``^docker,lo``); a leading ``=`` (after
the ``^`` if any) makes the names exact (``=eth0``, ``^=docker0``). Unset, the first
interface that is up, has an IPv4 address and is neither loopback nor docker wins, else
loopback. Only interfaces with an IPv4 address are candidates::

    from gpucoll.transports import ifaces
    iface = ifaces.select_interface()             # reads GPUCOLL_SOCKET_IFNAME
    iface = ifaces.select_interface("=eth0")      # or an explicit spec
    ifaces.match("^docker,lo", ifaces.list_interfaces())   # pure: testable on any list
    iface = ifaces.listen_interface(single_host=True)       # where a rank's listeners bind

The functions that take the list of interfaces are pure, so the rules can be tested on
synthetic lists; `list_interfaces` is the only one that asks the kernel.
"""
import fcntl
import socket
import struct
from typing import List, NamedTuple, Optional

from ..base import config
from ..base.errors import ConfigError

_SIOCGIFFLAGS = 0x8913
_SIOCGIFADDR = 0x8915
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
# Never picked by default: container bridges carry no traffic between hosts.
_DEFAULT_EXCLUDED = ("docker",)


class Interface(NamedTuple):
    """One network interface: name, index, IPv4 address (None without one), flags."""
    name: str
    index: int
    address: Optional[str]
    up: bool
    loopback: bool

    def describe(self):
        state = "up" if self.up else "down"
        return f"{self.name} ({self.address or 'no IPv4'}, {state})"


def _ifreq(sock, request, name):
    buf = struct.pack("256s", name.encode()[:15])
    return fcntl.ioctl(sock.fileno(), request, buf)


def list_interfaces() -> List[Interface]:
    """This host's interfaces in index order, from socket.if_nameindex and ioctl
    (SIOCGIFFLAGS, SIOCGIFADDR): no external command, no extra package."""
    result = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for index, name in socket.if_nameindex():
            try:
                flags = struct.unpack_from("H", _ifreq(s, _SIOCGIFFLAGS, name), 16)[0]
            except OSError:
                continue        # vanished since the listing
            try:
                # struct ifreq: 16-byte name, then a sockaddr_in whose address is at +4.
                address = socket.inet_ntoa(_ifreq(s, _SIOCGIFADDR, name)[20:24])
            except OSError:
                address = None  # no IPv4 address (EADDRNOTAVAIL)
            result.append(Interface(name, index, address, bool(flags & _IFF_UP),
                                    bool(flags & _IFF_LOOPBACK)))
    return result


def parse_spec(spec):
    """'^=docker0,lo' -> (exclude=True, exact=True, names=('docker0', 'lo'))."""
    text = spec.strip()
    exclude = text.startswith("^")
    if exclude:
        text = text[1:]
    exact = text.startswith("=")
    if exact:
        text = text[1:]
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    return exclude, exact, names


def _matches(name, names, exact):
    return any(name == n if exact else name.startswith(n) for n in names)


def match(spec, interfaces) -> List[Interface]:
    """The interfaces that spec selects, in the given order, among those that are up and
    have an IPv4 address. spec None is the default policy (all but loopback and docker,
    falling back to loopback)."""
    usable = [i for i in interfaces if i.up and i.address]
    if spec is None or not spec.strip():
        picked = [i for i in usable if not i.loopback and not i.name.startswith(_DEFAULT_EXCLUDED)]
        return picked or [i for i in usable if i.loopback]
    exclude, exact, names = parse_spec(spec)
    return [i for i in usable if _matches(i.name, names, exact) != exclude]


def select_interface(spec=None, interfaces=None, source=None) -> Interface:
    """The interface sockets bind to: the first that `spec` selects.

    spec defaults to GPUCOLL_SOCKET_IFNAME; interfaces to this host's. Raises ConfigError
    naming the variable (or `source`), its value and the interfaces that exist when
    nothing matches.
    """
    if spec is None:
        spec = config.SOCKET_IFNAME.get()
        source = source or config.SOCKET_IFNAME.name
    if interfaces is None:
        interfaces = list_interfaces()
    picked = match(spec, interfaces)
    if picked:
        return picked[0]
    existing = ", ".join(i.describe() for i in interfaces) or "none"
    if spec is None or not spec.strip():
        raise ConfigError(f"no network interface is up with an IPv4 address; interfaces: {existing}")
    name = source or config.SOCKET_IFNAME.name
    raise ConfigError(
        f"{name}={spec!r} matches no interface that is up with an IPv4 address; "
        f"interfaces on this host: {existing}. Use prefixes (eth,ens), ^ to exclude "
        f"(^docker,lo) or = for exact names (=eth0)."
    )


def listen_interface(single_host, reach=None, interfaces=None) -> Interface:
    """The interface a rank's listeners bind to (never a wildcard address).

    GPUCOLL_SOCKET_IFNAME, when set, decides. Otherwise a job whose ranks all run on this
    host listens on loopback, where no other host can reach it; a job across hosts on
    the interface that this host's routes use to reach `reach` (the store's host), so
    that the ranks listen where they can reach each other, else on the default choice.
    """
    spec = config.SOCKET_IFNAME.get()
    if spec is not None and spec.strip():
        return select_interface(spec)
    if interfaces is None:
        interfaces = list_interfaces()
    usable = [i for i in interfaces if i.up and i.address]
    if single_host:
        loopback = [i for i in usable if i.loopback]
        if loopback:
            return loopback[0]
    elif reach:
        source = route_source(reach)
        found = [i for i in usable if i.address == source and not i.loopback]
        if found:
            return found[0]
    return select_interface(interfaces=interfaces)


def server_address(host, single_host, interfaces=None):
    """Where a server that clients reach by the name `host` listens: rank 0's store under
    Slurm or torchrun-style starts, the head of `gpurun --master`.

    GPUCOLL_SOCKET_IFNAME, when set, decides. Otherwise the address `host` resolves to when
    it is one of this host's (loopback only for a one-host job). A name that resolves to
    loopback here although other hosts join (a Debian-style `127.0.1.1 node` line) or to no
    address of this host gives the wildcard: the ranks of other hosts reach it by an
    address this host cannot know. Every connection is authenticated either way."""
    spec = config.SOCKET_IFNAME.get()
    if spec is not None and spec.strip():
        return select_interface(spec).address
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return "0.0.0.0"
    if address.startswith("127."):
        return address if single_host else "0.0.0.0"
    if interfaces is None:
        interfaces = list_interfaces()
    if any(i.up and i.address == address for i in interfaces):
        return address
    return "0.0.0.0"


def route_source(host):
    """The local IPv4 address this host's routes use to reach `host`, or None (asks the
    kernel with an unsent UDP connect: no packet leaves)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0]
    except OSError:
        return None
