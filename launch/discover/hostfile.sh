#!/usr/bin/env bash
# Horovod elastic host discovery from a static hostfile: prints one 'host:slots' line for
# every host of HVDTRAIN_HOSTFILE (lines 'host', 'host:N' or 'host slots=N') whose sshd
# answers, so a host that left is dropped and one that came back is taken again.
#
#   HVDTRAIN_HOSTFILE=hosts.txt horovodrun -np 4 --min-np 2 \
#       --host-discovery-script launch/discover/hostfile.sh --gloo hvdtrain train --elastic ...
#
# HVDTRAIN_HOST_CHECK (tcp, ssh or none; default tcp) and HVDTRAIN_SSH_PORT (default 22)
# choose the reachability check.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${HVDTRAIN_HOSTFILE:?set HVDTRAIN_HOSTFILE to the hostfile to discover hosts from}"
exec python3 "$here/../hostfile.py" list --file "$HVDTRAIN_HOSTFILE" --format discovery \
    --answering --check "${HVDTRAIN_HOST_CHECK:-tcp}" --port "${HVDTRAIN_SSH_PORT:-22}" --timeout 2
