"""launch/discover/: the elastic host-discovery scripts (a static hostfile; a Slurm
allocation, whose real-scheduler test is in test_slurm_cluster.py)."""

from __future__ import annotations

import os
import socket
import subprocess

from hvdtrain.machine.hosts import Host, usable_slurm_hosts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DISCOVER = os.path.join(ROOT, "launch", "discover")


def test_slurm_nodes_down_drained_or_not_responding_are_not_usable():
    hosts = [Host(f"h{k}", 2) for k in range(1, 7)]
    sinfo = "h1 alloc\nh2 mix\nh3 alloc*\nh4 drng\nh5 down*\nh6 idle\n"
    assert usable_slurm_hosts(hosts, sinfo) == [Host("h1", 2), Host("h2", 2), Host("h6", 2)]


def test_the_hostfile_discovery_lists_the_hosts_whose_port_answers_with_their_slots(tmp_path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        hostfile = tmp_path / "hosts.txt"
        # 127.0.0.2 is this machine's loopback too, but nothing listens there on `port`
        hostfile.write_text("127.0.0.1 slots=3\n127.0.0.2:2\n")
        env = dict(os.environ, HVDTRAIN_HOSTFILE=str(hostfile), HVDTRAIN_SSH_PORT=str(port))
        result = subprocess.run(["bash", os.path.join(DISCOVER, "hostfile.sh")], env=env,
                                capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "127.0.0.1:3\n"


def test_the_hostfile_discovery_without_a_hostfile_says_which_variable_in_one_line():
    env = {k: v for k, v in os.environ.items() if k != "HVDTRAIN_HOSTFILE"}
    result = subprocess.run(["bash", os.path.join(DISCOVER, "hostfile.sh")], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.strip().endswith("HVDTRAIN_HOSTFILE: set HVDTRAIN_HOSTFILE to the "
                                          "hostfile to discover hosts from")
