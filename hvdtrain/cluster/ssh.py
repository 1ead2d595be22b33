"""sshd on every emulated host, and an ssh client that reaches them, with keys made for the run.

The run's folder (on a tmpfs private to the run) is bind-mounted over /etc/ssh inside
the private mount namespace, so `ssh` as horovodrun calls it (no options of ours) reads
our ssh_config: our key, no host-key checks, nothing written to known_hosts. The
user's own ~/.ssh is hidden behind an empty folder for the same reason. Outside the
namespace nothing changes, and nothing of it outlives the run.
"""

from __future__ import annotations

import os
import subprocess

HOST_KEY = "ssh_host_ed25519_key"
CLIENT_KEY = "id_ed25519"

SSHD_CONFIG = """\
# Made by hvdtrain cluster for one run; listens only inside an emulated host.
HostKey {folder}/{host_key}
AuthorizedKeysFile {folder}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# The keys live on a tmpfs of the run; its modes are not the home folder's.
StrictModes no
PidFile none
# horovodrun and the fault tests open many sessions at once.
MaxStartups 100
MaxSessions 100
# A client that left the network ends its sessions (and their commands' input) within
# 15 s, as it does on a cluster whose sshd is set up for long jobs.
ClientAliveInterval 5
ClientAliveCountMax 3
"""

SSH_CONFIG = """\
# Made by hvdtrain cluster for one run: the emulated hosts' keys change every run.
Host *
    IdentityFile {folder}/{client_key}
    IdentitiesOnly yes
    BatchMode yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
    ConnectTimeout 10
    # A host that leaves the network ends ssh within 15 s (exit 255), so horovodrun's
    # elastic driver sees its worker fail; without it, ssh would wait for TCP to give up
    # (many minutes) and the driver for that worker. Set the same on a real cluster.
    ServerAliveInterval 5
    ServerAliveCountMax 3
"""


def sshd_config(folder: str) -> str:
    return SSHD_CONFIG.format(folder=folder, host_key=HOST_KEY)


def ssh_config(folder: str) -> str:
    return SSH_CONFIG.format(folder=folder, client_key=CLIENT_KEY)


def sshd_command(sshd: str, address: str) -> list[str]:
    """sshd in the foreground (-D), logging to stderr (-e), listening on one address only."""
    return [sshd, "-D", "-e", "-f", "/etc/ssh/sshd_config", "-o", f"ListenAddress={address}"]


def _write(path: str, text: str, mode: int = 0o644) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(path, mode)


def make_ssh_folder(folder: str) -> None:
    """A host key, a client key authorised on every host, sshd_config and ssh_config.

    One host key for all hosts: they share the file system, as a cluster's nodes
    share a home, and host keys are not checked.
    """
    os.makedirs(folder, mode=0o700, exist_ok=True)
    for name in (HOST_KEY, CLIENT_KEY):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hvdtrain-cluster",
                        "-f", os.path.join(folder, name)], check=True, capture_output=True)
    with open(os.path.join(folder, CLIENT_KEY + ".pub"), encoding="utf-8") as fh:
        _write(os.path.join(folder, "authorized_keys"), fh.read(), 0o600)
    # Written for their final place: the folder is mounted over /etc/ssh.
    _write(os.path.join(folder, "sshd_config"), sshd_config("/etc/ssh"))
    _write(os.path.join(folder, "ssh_config"), ssh_config("/etc/ssh"))
