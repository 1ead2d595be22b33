#!/usr/bin/env bash
# Configures ssh in an image for multi-node horovodrun; run once at build time, as root.
#
#   bash docker/ssh-setup.sh PORT
#
# Both the client and the server use PORT, so containers started with --network=host
# do not collide with the host's own sshd on 22, and horovodrun inside a container
# reaches the other containers without being told the port.
set -euo pipefail

port=${1:?usage: ssh-setup.sh PORT}
mkdir -p /run/sshd /etc/ssh/ssh_config.d /etc/ssh/sshd_config.d

# Containers come and go, so their host keys can never be known in advance, and a
# ~/.ssh mounted read-only (a Kubernetes secret) cannot take a known_hosts file.
cat > /etc/ssh/ssh_config.d/hvdtrain.conf <<CONF
Host *
    Port $port
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
CONF

# Keys only. StrictModes is off because mounted secrets do not have the file modes
# sshd insists on.
cat > /etc/ssh/sshd_config.d/hvdtrain.conf <<CONF
Port $port
PasswordAuthentication no
PermitRootLogin prohibit-password
StrictModes no
CONF

# Both distributions' main config files read the *.d folders; prove it, and that sshd
# accepts the result, with throw-away host keys.
grep -q '^Include /etc/ssh/ssh_config.d/' /etc/ssh/ssh_config
grep -q '^Include /etc/ssh/sshd_config.d/' /etc/ssh/sshd_config
ssh-keygen -A >/dev/null
/usr/sbin/sshd -t
[ "$(ssh -G some-worker | awk '$1 == "port" {print $2}')" = "$port" ]
# Every container makes its own host keys when it starts (start-sshd.sh): none are
# baked into the image for all containers to share.
rm -f /etc/ssh/ssh_host_*
