#!/usr/bin/env bash
# System set-up for the multi-host, Slurm and MPICH tests (`make test-deps`).
#
#   - Debian packages: iproute2 (network namespaces), openssh (agents over ssh), slurm-wlm
#     and munge (a real single-node Slurm), started by hand as root, no systemd;
#   - .venv-mpich: MPICH and mpi4py from PyPI wheels, beside the Open MPI of .venv.
#
# Idempotent and quick once done. Without root or apt it does what it can and says what it
# skipped; the tests that need a missing piece skip with the reason. GPUCOLL_TEST_REQUIRE
# (a comma list, as for the tests: mpich, slurm, pmix, multihost or netns, sshd, mpi4py)
# names the pieces that must work here: the script checks each at the end and exits 1,
# saying why, when one does not (the tests would fail on it anyway, later and less clearly).
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
STATE=/run/gpucoll-test
say() { echo "setup-test-system: $*"; }
REQUIRE=",$(echo "${GPUCOLL_TEST_REQUIRE:-}" | tr 'A-Z' 'a-z' | tr -d ' ' | sed 's/netns/multihost/g'),"
# Slurm's clients retry for a long time when slurmctld is unreachable: bound every query.
node_state() { timeout 5 sinfo -h -N -o %t 2>/dev/null | head -1; }

# --- MPICH beside Open MPI (no root needed) -------------------------------------------------
if [ ! -x .venv-mpich/bin/mpiexec ] || ! .venv-mpich/bin/python -c "import mpi4py, numpy, click" 2>/dev/null; then
    say "making .venv-mpich (MPICH + mpi4py wheels)"
    "$PYTHON" -m venv .venv-mpich && .venv-mpich/bin/pip install -q mpich mpi4py numpy click \
        || say "could not make .venv-mpich; the MPICH tests will skip"
fi

if [ "$(id -u)" != 0 ]; then
    say "not root: skipping Debian packages, Slurm and munge (those tests will skip)"
else

# --- Debian packages ------------------------------------------------------------------------
need=""
command -v ip >/dev/null || need="$need iproute2"
command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || need="$need openssh-server"
command -v ssh >/dev/null || need="$need openssh-client"
[ -x /usr/sbin/slurmctld ] || need="$need slurm-wlm"
[ -x /usr/sbin/munged ] || need="$need munge"
ls /usr/lib/*/pmix2/lib/libpmix.so >/dev/null 2>&1 || need="$need libpmix-dev"  # srun --mpi=pmix
if [ -n "$need" ]; then
    if command -v apt-get >/dev/null; then
        say "installing$need"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q >/dev/null && apt-get install -y -q $need >/dev/null \
            || say "apt-get install$need failed; the tests that need them will skip"
    else
        say "no apt-get: cannot install$need"
    fi
fi

# --- munge ----------------------------------------------------------------------------------
if [ -x /usr/sbin/munged ]; then
    mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
    chmod 0755 /run/munge
    if [ ! -s /etc/munge/munge.key ]; then
        /usr/sbin/mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
            || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
    fi
    chown -R root:root /etc/munge /var/lib/munge /var/log/munge /run/munge
    chmod 0700 /etc/munge /var/lib/munge /var/log/munge
    chmod 0400 /etc/munge/munge.key
    if ! munge -n >/dev/null 2>&1; then
        /usr/sbin/munged --force --socket=/run/munge/munge.socket.2 || say "munged did not start"
        sleep 0.5
    fi
fi

# --- Slurm, one node, as root ---------------------------------------------------------------
if [ -x /usr/sbin/slurmctld ] && munge -n >/dev/null 2>&1; then
    node=$(hostname -s)
    mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm $STATE
    conf=/etc/slurm/slurm.conf
    cat > $conf.new <<EOF
# Written by gpucoll's scripts/setup-test-system.sh: a single-node cluster for tests.
ClusterName=gpucolltest
SlurmctldHost=$node
SlurmUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
InactiveLimit=0
KillWait=5
MinJobAge=30
NodeName=$node CPUs=8 Sockets=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
    if ! cmp -s $conf.new $conf; then
        mv $conf.new $conf
        pkill -F $STATE/slurmctld.pid 2>/dev/null; pkill -F $STATE/slurmd.pid 2>/dev/null; sleep 0.5
    else
        rm -f $conf.new
    fi
    if ! (timeout 5 sinfo -h >/dev/null 2>&1 && [ -f $STATE/slurmctld.pid ] && kill -0 "$(cat $STATE/slurmctld.pid)" 2>/dev/null); then
        /usr/sbin/slurmctld -i 2>/dev/null || /usr/sbin/slurmctld || say "slurmctld did not start"
    fi
    if ! ([ -f $STATE/slurmd.pid ] && kill -0 "$(cat $STATE/slurmd.pid)" 2>/dev/null); then
        /usr/sbin/slurmd || say "slurmd did not start"
    fi
    deadline=$((SECONDS + 15))
    while [ $SECONDS -lt $deadline ]; do
        state=$(node_state)
        case "$state" in idle*|mix*|alloc*) break ;; esac
        [ "$state" = "down" ] || [ "$state" = "drain" ] && timeout 5 scontrol update nodename="$node" state=resume 2>/dev/null
        sleep 0.25
    done
    say "slurm node $node: $(node_state)"
fi
fi  # root

# --- what GPUCOLL_TEST_REQUIRE asks for must work now ----------------------------------------
why_missing() {  # piece -> prints why it does not work here; nothing when it does
    case "$1" in
    mpich)
        [ -x .venv-mpich/bin/mpiexec ] && .venv-mpich/bin/python -c "import mpi4py, numpy, click" 2>/dev/null \
            || echo ".venv-mpich has no working MPICH + mpi4py" ;;
    mpi4py)
        [ -x .venv/bin/mpiexec ] && .venv/bin/python -c "import mpi4py" 2>/dev/null \
            || echo ".venv has no mpiexec + mpi4py (make install installs the [test] extras)" ;;
    slurm)
        case "$(node_state)" in
            idle*|mix*|alloc*) ;;
            *) echo "no Slurm node is up (see /var/log/slurm/slurmctld.log and slurmd.log)" ;;
        esac ;;
    pmix)
        timeout 10 srun --mpi=list 2>&1 | grep -q pmix || echo "Slurm has no pmix plugin"
        ls /usr/lib/*/pmix2/lib/libpmix.so >/dev/null 2>&1 || echo "libpmix is missing (libpmix-dev)" ;;
    multihost)
        if [ "$(id -u)" != 0 ]; then echo "network namespaces need root"
        elif ! command -v ip >/dev/null || ! command -v unshare >/dev/null; then echo "ip or unshare is missing"
        elif ! ip netns add "gcsetup$$" 2>/dev/null; then echo "cannot create a network namespace"
        else ip netns del "gcsetup$$"; fi ;;
    sshd)
        { command -v sshd >/dev/null || [ -x /usr/sbin/sshd ]; } && command -v ssh >/dev/null \
            && command -v ssh-keygen >/dev/null || echo "openssh-server or openssh-client is missing" ;;
    ofi)  # built by make install (scripts/setup-build-deps.sh installs libfabric-dev as root)
        .venv/bin/python -c "from gpucoll.transports.net import ofi_module; ofi_module()" 2>/dev/null \
            || echo "gpucoll's OFI transport does not load: $(.venv/bin/python -c 'from gpucoll.transports.net import ofi_module; ofi_module()' 2>&1 | tail -1)" ;;
    gpu|torch) ;;  # not this script's to provide; the tests check them
    *) echo "is not a piece this script knows (mpich, mpi4py, slurm, pmix, multihost, sshd, ofi)" ;;
    esac
}
failed=0
for piece in $(echo "$REQUIRE" | tr ',' ' '); do
    why=$(why_missing "$piece")
    if [ -n "$why" ]; then
        echo "setup-test-system: FAILED: GPUCOLL_TEST_REQUIRE asks for $piece, but $why" >&2
        failed=1
    else
        say "$piece: ready"
    fi
done
exit $failed
