"""Separate hosts on one machine, for tests: Linux network namespaces joined by veth pairs.

Each test host is a network namespace named after the host, with its own loopback and one
interface per network; each network is a bridge in a "switch" namespace of its own, so that
no address ever exists outside the namespaces made here. Commands run on a host through
`scripts/netns-exec.sh HOST ...`, which also gives them a UTS namespace whose host name is
HOST: gpucoll groups ranks by host name, so two namespaces count as two hosts::

    with TestHosts(2, networks=("eth", "data")) as hosts:     # needs root and iproute2
        hosts.names                  # ['gc4711a', 'gc4711b']
        hosts.address(1, "data")     # '10.78.1.2' inside host 1's namespace only
        hosts.run(0, ["hostname"])   # CompletedProcess, stdout 'gc4711a'

`python tests/netns.py up 2` / `down` do the same by hand (names printed on stdout).
"""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NSEXEC = os.path.join(ROOT, "scripts", "netns-exec.sh")


def missing_requirement():
    """Why namespaces cannot be made here (a skip reason), or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run the multi-host tests as root)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing (apt-get install iproute2 util-linux)"
    probe = f"gcprobe{os.getpid()}"
    ok = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if ok.returncode != 0:
        return f"cannot create a network namespace: {ok.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args, ns=None):
    cmd = ["ip"] + (["-n", ns] if ns else []) + [str(a) for a in args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc.stdout


class TestHosts:
    """`count` hosts, each attached to every network in `networks` (interface names inside
    the hosts: `<network>0`). Network k uses 10.<base+k>.<k>.0/24, host i the address .i+1."""

    __test__ = False  # not a pytest class

    def __init__(self, count=2, networks=("eth",), tag=None, base=77):
        self.tag = tag or f"gc{os.getpid() % 100000}"
        self.names = [f"{self.tag}{chr(ord('a') + i)}" for i in range(count)]
        self.networks = tuple(networks)
        self.base = base
        self.switch = f"{self.tag}sw"
        self.up = False

    def address(self, host, network=None):
        k = self.networks.index(network or self.networks[0])
        return f"10.{self.base + k}.{k}.{host + 1}"

    def ifname(self, network=None):
        return f"{network or self.networks[0]}0"

    def create(self):
        self.destroy()  # leftovers of a run that was killed
        self.up = True
        _ip("netns", "add", self.switch)
        _ip("link", "set", "lo", "up", ns=self.switch)
        for k, net in enumerate(self.networks):
            bridge = f"br{k}"
            _ip("link", "add", bridge, "type", "bridge", ns=self.switch)
            _ip("link", "set", bridge, "up", ns=self.switch)
        for i, name in enumerate(self.names):
            _ip("netns", "add", name)
            _ip("link", "set", "lo", "up", ns=name)
            for k, net in enumerate(self.networks):
                inside, port = f"{net}0", f"p{i}n{k}"
                # Made in the host's namespace, then one end moves to the switch.
                _ip("link", "add", inside, "type", "veth", "peer", "name", port, ns=name)
                _ip("link", "set", port, "netns", self.switch, ns=name)
                _ip("link", "set", port, "master", f"br{k}", ns=self.switch)
                _ip("link", "set", port, "up", ns=self.switch)
                _ip("addr", "add", f"{self.address(i, net)}/24", "dev", inside, ns=name)
                _ip("link", "set", inside, "up", ns=name)
        return self

    def destroy(self):
        for name in self.names + [self.switch]:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.up = False

    def command(self, host, argv):
        """argv run on host `host` (index or name), as a list for subprocess."""
        name = self.names[host] if isinstance(host, int) else host
        return [NSEXEC, name, *[str(a) for a in argv]]

    def run(self, host, argv, **kw):
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.command(host, argv), **kw)

    def popen(self, host, argv, **kw):
        return subprocess.Popen(self.command(host, argv), **kw)

    def counters(self, host, network=None):
        """(rx_bytes, tx_bytes) of a host's interface on `network`."""
        out = self.run(host, ["cat", f"/sys/class/net/{self.ifname(network)}/statistics/rx_bytes",
                              f"/sys/class/net/{self.ifname(network)}/statistics/tx_bytes"]).stdout.split()
        return int(out[0]), int(out[1])

    def __enter__(self):
        return self.create()

    def __exit__(self, *exc):
        self.destroy()


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "up"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    hosts = TestHosts(n, tag="gcman")
    if what == "up":
        hosts.create()
        print(" ".join(hosts.names))
    else:
        hosts.destroy()
