"""Which ranks share a host: the host name, and what shared memory and loopback really share.

Two processes are on one host for gpucoll when shared memory, loopback and CUDA IPC work
between them. A host name alone does not say so: two network namespaces of one kernel, two
containers, or two machines cloned from one image may carry the same name. So, as NCCL
hashes more than the name, a rank's host is its name plus a machine key: the kernel's boot
id, the network namespace (loopback) and the tmpfs behind /dev/shm (shared memory). Ranks
with one name and different keys get distinct labels (``node7``, ``node7#2``), which is
what every "same host" test in gpucoll compares::

    labels = host_labels([("a", "k1"), ("a", "k2"), ("b", "k1")])   # ['a', 'a#2', 'b']

Different names always mean different hosts: GPUCOLL_TEST_HOST relies on it to make ranks
of one machine act as ranks of several.
"""
import os


def machine_key():
    """This process's boot id, network namespace and shared-memory file system, as one string
    (each part empty where the system does not say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{boot}/{_inode('/proc/self/ns/net')}/{_device('/dev/shm')}"


def _inode(path):
    try:
        return os.stat(path).st_ino
    except OSError:
        return ""


def _device(path):
    try:
        return os.stat(path).st_dev
    except OSError:
        return ""


def host_labels(identities):
    """[(name, key)] in rank order -> each rank's host label: the name, with ``#2``, ``#3``...
    for the second, third... machine key met under one name (in rank order)."""
    keys_of_name = {}
    labels = []
    for name, key in identities:
        keys = keys_of_name.setdefault(name, [])
        if key not in keys:
            keys.append(key)
        n = keys.index(key) + 1
        labels.append(name if n == 1 else f"{name}#{n}")
    return labels
