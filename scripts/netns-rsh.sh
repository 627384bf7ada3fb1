#!/bin/sh
# netns-rsh.sh HOST COMMAND...: ssh's semantics on a test host (tests/netns.py): the words
# of COMMAND are joined and run by a shell, as sshd would. For Open MPI's rsh agent:
#   mpiexec --host a:2,b:2 --prtemca plm_ssh_agent scripts/netns-rsh.sh ...
host=$1
shift
exec "$(dirname "$0")/netns-exec.sh" "$host" sh -c "$*"
