#!/usr/bin/env bash
# Installs Debian packages as root without starting their services: their daemons run
# only inside `hvdtrain cluster` (sshd; with --slurm munged, slurmctld and slurmd).
#
#   bash launch/install-packages.sh PACKAGE...     (as root; does nothing for a package
#                                                   already installed)
#
# Debian's maintainer scripts ask /usr/sbin/policy-rc.d before starting a service; exit
# 101 means "do not start". It is put there only while we install, and only if there
# was none. (munge's own scripts also make /etc/munge/munge.key; the cluster never reads
# it: each run makes its key on its private tmpfs.)
set -euo pipefail

missing=()
for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' \
        || missing+=("$package")
done
[ "${#missing[@]}" -gt 0 ] || exit 0
if [ "$(id -u)" != 0 ]; then
    printf 'install-packages: error: %s not installed and not root: run sudo apt-get install -y %s\n' \
        "${missing[*]}" "${missing[*]}" >&2
    exit 1
fi
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && made_policy=1
fi
trap '[ "$made_policy" = 0 ] || rm -f "$policy"' EXIT
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
