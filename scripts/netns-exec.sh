#!/bin/sh
# netns-exec.sh HOST COMMAND [ARGS]...
# Run COMMAND inside the network namespace named HOST (made by tests/netns.py), in its own
# UTS namespace whose host name is HOST, so that it counts as a separate host. Used as
# gpurun's agent command (`--launcher local --launcher-cmd 'scripts/netns-exec.sh {host}'`)
# and as Open MPI's rsh agent. NETNS_HOST_NAME, when set, is the host name instead: two
# namespaces then share one name, as two cloned machines do.
host=$1
shift
exec ip netns exec "$host" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "${NETNS_HOST_NAME:-$host}" "$@"
