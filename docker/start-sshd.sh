#!/usr/bin/env bash
# The main process of a worker container: sshd in the foreground, so that horovodrun
# on the launcher can start this node's workers over ssh.
#
#   docker run -d --gpus all --network=host -v /shared/ssh:/root/.ssh:ro \
#       hvdtrain:gpu /opt/hvdtrain/docker/start-sshd.sh
set -euo pipefail

mkdir -p /run/sshd
ssh-keygen -A >/dev/null  # this container's own host keys
exec /usr/sbin/sshd -D -e "$@"
