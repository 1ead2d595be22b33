"""The emulated cluster's shape: hosts, their addresses and links, and the commands that build it.

Pure functions only: the plan is a list of `ip` / `tc` argument lists that the
supervisor runs inside the private namespaces, so tests can read it without root.

Why `ip` and `tc` rather than a netlink library (pyroute2): the cluster is built once
per run with a few commands per host, nothing here is on a hot path; the commands are
the ones a user would type to look at or debug the emulated network (`ip -n h2 addr`,
`tc -n h3 qdisc`), and iproute2 is on every Linux machine that can run the cluster at
all, whereas pyroute2 would be one more dependency in every venv for one subcommand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hvdtrain.errors import ConfigError
from hvdtrain.cluster.links import QUEUE_LATENCY, burst_bytes, parse_rate

# RFC 2544 sets 198.18.0.0/15 aside for benchmarking networks: nothing real lives there.
SUBNET = "198.18.0"
PREFIX = 24
MAX_HOSTS = 250
BRIDGE = "hvdbr0"
NIC = "eth0"
# Jumbo frames, as on data-centre links and as on the shaped loopback of --link-rate.
MTU = 9000


@dataclass(frozen=True)
class Host:
    name: str          # h1, h2, ...: also its name in /etc/hosts and its hostname
    address: str       # 198.18.0.K
    rate_bits: int     # each direction of its NIC; 0 for an unshaped link

    @property
    def bridge_port(self) -> str:
        """The far end of the host's cable, on the bridge (the switch port)."""
        return f"v{self.name}"


def host_names(count: int) -> list[str]:
    return [f"h{k}" for k in range(1, count + 1)]


def parse_host_rates(items: list[str], names: list[str]) -> dict[str, int]:
    """['h3=100mbit'] -> {'h3': 100_000_000}; each host must be one of `names`."""
    rates = {}
    for item in items:
        match = re.fullmatch(r"\s*(h\d+)\s*=\s*(\S+)\s*", item)
        if not match:
            raise ConfigError(f"--host-rate must look like h3=100mbit, got {item!r}")
        name, rate = match.groups()
        if name not in names:
            raise ConfigError(f"--host-rate names {name}, but the cluster has hosts "
                              f"h1..h{len(names)}")
        rates[name] = parse_rate(rate)
    return rates


def plan_hosts(count: int, link_rate: str | None = None,
               host_rates: list[str] = ()) -> list[Host]:
    """The hosts h1..hN, each with its address and link rate (--host-rate wins over --link-rate)."""
    if not 1 <= count <= MAX_HOSTS:
        raise ConfigError(f"--hosts must be between 1 and {MAX_HOSTS}, got {count}")
    names = host_names(count)
    default = parse_rate(link_rate) if link_rate else 0
    special = parse_host_rates(list(host_rates), names)
    return [Host(name, f"{SUBNET}.{k}", special.get(name, default))
            for k, name in enumerate(names, start=1)]


def shape_command(host: Host, rate_bits: int, verb: str = "add") -> list[list[str]]:
    """tbf on both ends of the host's cable: its sending (eth0) and its receiving (the
    bridge port's egress), so a host that many others send to is held to its rate too,
    as a real full-duplex NIC is."""
    tbf = ["root", "tbf", "rate", f"{rate_bits}bit", "burst", str(burst_bytes(rate_bits)),
           "latency", QUEUE_LATENCY]
    return [["tc", "-n", host.name, "qdisc", verb, "dev", NIC, *tbf],
            ["tc", "qdisc", verb, "dev", host.bridge_port, *tbf]]


def host_commands(host: Host) -> list[list[str]]:
    """A namespace, a veth cable from its eth0 to the bridge, an address, and the shaping."""
    name = host.name
    commands = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", host.bridge_port, "mtu", str(MTU), "type", "veth",
         "peer", "name", NIC, "netns", name],
        ["ip", "link", "set", host.bridge_port, "master", BRIDGE, "up"],
        ["ip", "-n", name, "link", "set", "lo", "up"],
        ["ip", "-n", name, "link", "set", NIC, "mtu", str(MTU), "up"],
        ["ip", "-n", name, "addr", "add", f"{host.address}/{PREFIX}", "dev", NIC],
    ]
    if host.rate_bits:
        commands += shape_command(host, host.rate_bits)
    return commands


def network_commands(hosts: list[Host]) -> list[list[str]]:
    """Everything that builds the network, in order: the bridge (the switch), then each host."""
    commands = [["ip", "link", "set", "lo", "up"],
                ["ip", "link", "add", BRIDGE, "mtu", str(MTU), "type", "bridge"],
                ["ip", "link", "set", BRIDGE, "up"]]
    for host in hosts:
        commands += host_commands(host)
    return commands


def hosts_file(hosts: list[Host]) -> str:
    """/etc/hosts as the cluster sees it: only loopback and the emulated hosts."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{host.address}\t{host.name}" for host in hosts]
    return "\n".join(lines) + "\n"


def describe(hosts: list[Host]) -> list[dict]:
    """The topology as plain data, for logs and bench.json."""
    return [{"name": h.name, "address": h.address, "nic": NIC, "rate_bits": h.rate_bits}
            for h in hosts]
